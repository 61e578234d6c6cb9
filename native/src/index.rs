//! Appending entries to an IndexFile's hash chains (layout in `pipeline/files/indexfile.py`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffers::{disjoint, require_len, Bytes, Col, OutBytes};
use crate::guarded;
use crate::layout::{be_i32, be_i64, Writer};

pub const HEADER_SIZE: usize = 40;
pub const SLOT_SIZE: usize = 4;
pub const ENTRY_SIZE: usize = 20;

/// An IndexFile's header fields, in their on-disk order.
pub struct Header {
    pub begin_ts: i64,
    pub end_ts: i64,
    pub begin_phy: i64,
    pub end_phy: i64,
    pub slot_count: i32,
    pub count: usize,
}

impl Header {
    pub fn write(&self, out: &mut [u8]) {
        let mut w = Writer { buf: out, pos: 0 };
        w.i64(self.begin_ts);
        w.i64(self.end_ts);
        w.i64(self.begin_phy);
        w.i64(self.end_phy);
        w.i32(self.slot_count);
        w.i32(self.count as i32);
    }
}

/// RocketMQ's `putKey` for entry number `count` of a file whose slot table is `slots` and
/// entry area `entries`: the entry gets `hash`, `phys`, its time difference to `begin_ts` in
/// whole seconds and the slot's previous head (0 if the head is out of range), and becomes the
/// slot's head. Returns whether the slot was empty. The caller keeps the header.
pub fn put_key(
    slots: &mut [u8],
    entries: &mut [u8],
    count: usize,
    begin_ts: i64,
    hash: i32,
    phys: i64,
    ts: i64,
) -> bool {
    let slot = (hash as usize % (slots.len() / SLOT_SIZE)) * SLOT_SIZE;
    let mut prev = be_i32(slots, slot);
    let empty = prev <= 0 || prev as usize > count;
    if empty {
        prev = 0;
    }
    // Java's long division truncates toward zero; out-of-range differences clamp.
    let diff = if begin_ts <= 0 {
        0
    } else {
        (ts.saturating_sub(begin_ts) / 1000).clamp(0, i32::MAX as i64) as i32
    };
    let mut w = Writer {
        buf: &mut entries[count * ENTRY_SIZE..(count + 1) * ENTRY_SIZE],
        pos: 0,
    };
    w.i32(hash);
    w.i64(phys);
    w.i32(diff);
    w.i32(prev);
    slots[slot..slot + SLOT_SIZE].copy_from_slice(&(count as i32).to_be_bytes());
    empty
}

/// RocketMQ's `IndexFile.putKey`, once per entry, in order: entry number `index_count + k`
/// gets `hashes[k]`, `phys[k]`, its time difference to the file's begin timestamp in whole
/// seconds, and the slot's previous head (0 if the head is out of range), and becomes the
/// slot's head. `begin_ts` is the header's begin timestamp before the call; a file's first
/// entry (number 1) is measured against it and then becomes the file's beginning.
///
/// `slots` and `entries` are the file's slot table and entry area (big-endian, mapped).
/// Returns how many slots went from empty to used. The caller keeps the header.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn index_put(
    py: Python<'_>,
    slots: &Bound<'_, PyAny>,
    entries: &Bound<'_, PyAny>,
    index_count: usize,
    begin_ts: i64,
    hashes: &Bound<'_, PyAny>,
    phys: &Bound<'_, PyAny>,
    times: &Bound<'_, PyAny>,
) -> PyResult<usize> {
    guarded("index_put", || {
        let (mut slots, mut entries) = (
            OutBytes::new(slots, "slots")?,
            OutBytes::new(entries, "entries")?,
        );
        let (h, p, t) = (
            Col::<i32>::new(hashes, "hashes")?,
            Col::<i64>::new(phys, "phys")?,
            Col::<i64>::new(times, "times")?,
        );
        disjoint(
            &[("slots", slots.span()), ("entries", entries.span())],
            &[
                ("hashes", h.span()),
                ("phys", p.span()),
                ("times", t.span()),
            ],
        )?;
        let (h, p, t) = (h.get(), p.get(), t.get());
        require_len("phys", p.len(), h.len())?;
        require_len("times", t.len(), h.len())?;
        let (slots, entries) = (slots.get(), entries.get());
        let slot_num = slots.len() / SLOT_SIZE;
        let fits = index_count
            .checked_add(h.len())
            .and_then(|n| n.checked_mul(ENTRY_SIZE))
            .is_some_and(|end| end <= entries.len());
        if slot_num == 0 || !fits || index_count + h.len() > i32::MAX as usize {
            return Err(PyValueError::new_err(format!(
                "{} entries from number {index_count} do not fit the index file",
                h.len()
            )));
        }
        if h.iter().any(|&k| k < 0) {
            return Err(PyValueError::new_err(
                "index key hashes must not be negative",
            ));
        }
        Ok(py.detach(|| {
            let mut begin_ts = begin_ts;
            let mut new_slots = 0;
            for (k, count) in (index_count..index_count + h.len()).enumerate() {
                if put_key(slots, entries, count, begin_ts, h[k], p[k], t[k]) {
                    new_slots += 1;
                }
                if count <= 1 {
                    begin_ts = t[k];
                }
            }
            new_slots
        }))
    })
}

/// What [`index_mend`] found: entries kept, slot heads rewritten, slots in use, and the last
/// entry past the kept ones that is not all zeros (or `None`).
type Mended = (usize, usize, usize, Option<usize>);

/// Replays `putKey` over entries `1..count` and stops at the first entry it would not have
/// written: a negative hash or time difference, a CommitLog offset at `phys_limit` or beyond
/// or below the previous entry's, or a `prevIndex` other than its slot's head at that point.
/// The entries before it are kept; every slot head in `slots` that differs from the replay's
/// is rewritten (so a slot naming a dropped, uncounted or missing entry points at its newest
/// kept entry). Entries are only read.
fn mend(slots: &mut [u8], entries: &[u8], count: usize, phys_limit: i64) -> Mended {
    let slot_num = slots.len() / SLOT_SIZE;
    let mut heads = vec![0i32; slot_num];
    let mut last_phy = i64::MIN;
    let mut keep = count.max(1);
    for j in 1..count {
        let at = j * ENTRY_SIZE;
        let (hash, phy) = (be_i32(entries, at), be_i64(entries, at + 4));
        let (diff, prev) = (be_i32(entries, at + 12), be_i32(entries, at + 16));
        let slot = if hash >= 0 {
            hash as usize % slot_num
        } else {
            0
        };
        if hash < 0 || diff < 0 || phy >= phys_limit || phy < last_phy || prev != heads[slot] {
            keep = j;
            break;
        }
        heads[slot] = j as i32;
        last_phy = phy;
    }
    let mut rewritten = 0;
    for (s, &head) in heads.iter().enumerate() {
        let at = s * SLOT_SIZE;
        if be_i32(slots, at) != head {
            slots[at..at + SLOT_SIZE].copy_from_slice(&head.to_be_bytes());
            rewritten += 1;
        }
    }
    let used = heads.iter().filter(|&&h| h != 0).count();
    let stale = entries
        .chunks_exact(ENTRY_SIZE)
        .enumerate()
        .skip(keep)
        .rev()
        .find(|(_, e)| e.iter().any(|&b| b != 0))
        .map(|(j, _)| j);
    (keep, rewritten, used, stale)
}

/// After a crash: the number of entries of an IndexFile to keep (counting the unused entry 0),
/// given `count` (the header's indexCount, an upper bound) and `phys_limit` (entries of
/// records from there on are dropped). Rewrites `slots` to the heads of the kept entries and
/// returns `(keep, slots rewritten, slots in use, last non-zero entry past keep or None)`;
/// the caller zeroes the entries past `keep` and writes the header. See `IndexFile.mend`.
#[pyfunction]
pub fn index_mend(
    py: Python<'_>,
    slots: &Bound<'_, PyAny>,
    entries: &Bound<'_, PyAny>,
    count: usize,
    phys_limit: i64,
) -> PyResult<Mended> {
    guarded("index_mend", || {
        let mut out = OutBytes::new(slots, "slots")?;
        let entries = Bytes::new(entries, "entries")?;
        disjoint(&[("slots", out.span())], &[("entries", entries.span())])?;
        let (slots, entries) = (out.get(), entries.get());
        if slots.len() < SLOT_SIZE || count.saturating_mul(ENTRY_SIZE) > entries.len() {
            return Err(PyValueError::new_err(format!(
                "{count} entries and {} slot bytes do not fit the index file",
                slots.len()
            )));
        }
        Ok(py.detach(|| mend(slots, entries, count, phys_limit)))
    })
}
