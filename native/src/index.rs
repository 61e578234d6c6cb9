//! Appending entries to an IndexFile's hash chains (layout in `pipeline/indexfile.py`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffers::{disjoint, require_len, Col, OutBytes};
use crate::guarded;
use crate::layout::{be_i32, Writer};

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
