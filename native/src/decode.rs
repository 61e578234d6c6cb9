//! Decoding many records of one segment into Arrow-layout columns, with the GIL released.
//!
//! Every record is checked by [`scan_record`] (the one record parser, shared with the walk)
//! and against the size its ConsumeQueue unit claims; the columns are then filled from the
//! checked bytes: numbers as int32/int64 vectors, strings and binaries as Arrow's offsets,
//! data and validity bitmap, `keys` as a list and `properties` as a map. Python wraps each
//! vector with `pa.py_buffer` (see [`Owned`]), so nothing is copied on the way out.
//!
//! Text follows what RocketMQ's Java reader sees: PROPERTIES parsed by
//! [`hash::properties`], names and values decoded from UTF-8 leniently (malformed bytes
//! become U+FFFD, as `new String(bytes, UTF_8)` does), a later duplicate name replacing the
//! earlier one's value in place; hosts formatted as `ip:port` (IPv6 as `[addr]:port`,
//! compressed as Python's `ipaddress` prints it); msgIds as uppercase hex.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::{guarded, panic_text};
use pyo3::types::{PyBytes, PyDict};

use crate::buffers::{require_len, Bytes, Col};
use crate::hash;
use crate::layout::*;
use crate::owned::{Data, Owned, Recycled};
use crate::scan::{scan_record, Scanned};

/// Optional column groups (a bit mask); the fixed-width columns and `topic` always come.
pub const BODY: u32 = 1;
pub const PROPERTIES: u32 = 2;
pub const KEYS: u32 = 4;
pub const TAGS: u32 = 8;
pub const UNIQ_KEY: u32 = 16;
pub const HOSTS: u32 = 32;
pub const MSG_ID: u32 = 64;
const NEEDS_PROPERTIES: u32 = PROPERTIES | KEYS | TAGS | UNIQ_KEY;

/// A string or binary column: `rows + 1` offsets into `data`, and a validity bitmap (LSB
/// first, as Arrow's) when the column may hold nulls.
struct Strs {
    offsets: Vec<i32>,
    data: Vec<u8>,
    valid: Option<Vec<u8>>,
    rows: usize,
    nulls: usize,
}

impl Strs {
    fn new(rows: usize, bytes: usize, nullable: bool) -> Self {
        let mut offsets = Recycled::take(rows + 1);
        offsets.push(0);
        Strs {
            offsets,
            data: Recycled::take(bytes),
            valid: nullable.then(|| Recycled::take(rows.div_ceil(8))),
            rows: 0,
            nulls: 0,
        }
    }

    fn push(&mut self, v: &[u8]) {
        self.data.extend_from_slice(v);
        self.end_row(true);
    }

    fn push_null(&mut self) {
        self.end_row(false);
    }

    fn end_row(&mut self, present: bool) {
        // Wraps past 2 GiB; `fits` refuses such a column before Python sees it.
        self.offsets.push(self.data.len() as i32);
        if let Some(bits) = &mut self.valid {
            if self.rows % 8 == 0 {
                bits.push(0);
            }
            if present {
                if let Some(last) = bits.last_mut() {
                    *last |= 1 << (self.rows % 8);
                }
            } else {
                self.nulls += 1;
            }
        }
        self.rows += 1;
    }

    fn fits(&self) -> bool {
        self.data.len() <= i32::MAX as usize
    }

    /// `(offsets, data, validity or None, null count)`.
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let valid = match self.valid {
            Some(bits) if self.nulls > 0 => Some(Owned::new(Data::U8(bits))),
            _ => None,
        };
        Ok((
            Owned::new(Data::I32(self.offsets)),
            Owned::new(Data::U8(self.data)),
            valid,
            self.nulls,
        )
            .into_pyobject(py)?
            .into_any()
            .unbind())
    }
}

/// A list or map column: `rows + 1` offsets into its items, a validity bitmap, the items.
struct Nested {
    offsets: Vec<i32>,
    items: Strs,
    more: Option<Strs>, // a map's values, beside `items` (its names)
    bits: Strs,         // only its validity bitmap is used
}

impl Nested {
    fn new(rows: usize, map: bool) -> Self {
        let mut offsets = Recycled::take(rows + 1);
        offsets.push(0);
        Nested {
            offsets,
            items: Strs::new(rows, rows * 8, false),
            more: map.then(|| Strs::new(rows, rows * 8, false)),
            bits: Strs::new(0, 0, !map),
        }
    }

    fn end_row(&mut self, present: bool) {
        self.offsets.push(self.items.rows as i32);
        self.bits.end_row(present);
    }

    fn fits(&self) -> bool {
        self.items.fits()
            && self.items.rows <= i32::MAX as usize
            && self.more.as_ref().is_none_or(Strs::fits)
    }

    /// `(offsets, validity or None, null count, items[, values])`, items as [`Strs::into_py`].
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let valid = match self.bits.valid {
            Some(bits) if self.bits.nulls > 0 => Some(Owned::new(Data::U8(bits))),
            _ => None,
        };
        let offsets = Owned::new(Data::I32(self.offsets));
        let items = self.items.into_py(py)?;
        let more = self.more.map(|m| m.into_py(py)).transpose()?;
        Ok((offsets, valid, self.bits.nulls, items, more)
            .into_pyobject(py)?
            .into_any()
            .unbind())
    }
}

struct Columns {
    phys: Vec<i64>,
    size: Vec<i32>,
    queue_id: Vec<i32>,
    queue_offset: Vec<i64>,
    sys_flag: Vec<i32>,
    flag: Vec<i32>,
    born_ts: Vec<i64>,
    store_ts: Vec<i64>,
    reconsume: Vec<i32>,
    prep_tx: Vec<i64>,
    body_crc: Vec<i32>,
    topic: Strs,
    body: Option<Strs>,
    properties: Option<Nested>,
    keys: Option<Nested>,
    tags: Option<Strs>,
    uniq_key: Option<Strs>,
    born_host: Option<Strs>,
    store_host: Option<Strs>,
    msg_id: Option<Strs>,
}

impl Columns {
    fn new(n: usize, groups: u32, body_bytes: usize) -> Self {
        let want = |g: u32| groups & g != 0;
        Columns {
            phys: Recycled::take(n),
            size: Recycled::take(n),
            queue_id: Recycled::take(n),
            queue_offset: Recycled::take(n),
            sys_flag: Recycled::take(n),
            flag: Recycled::take(n),
            born_ts: Recycled::take(n),
            store_ts: Recycled::take(n),
            reconsume: Recycled::take(n),
            prep_tx: Recycled::take(n),
            body_crc: Recycled::take(n),
            topic: Strs::new(n, n * 16, false),
            body: want(BODY).then(|| Strs::new(n, body_bytes, false)),
            properties: want(PROPERTIES).then(|| Nested::new(n, true)),
            keys: want(KEYS).then(|| Nested::new(n, false)),
            tags: want(TAGS).then(|| Strs::new(n, n * 8, true)),
            uniq_key: want(UNIQ_KEY).then(|| Strs::new(n, n * 32, true)),
            born_host: want(HOSTS).then(|| Strs::new(n, n * 20, false)),
            store_host: want(HOSTS).then(|| Strs::new(n, n * 20, false)),
            msg_id: want(MSG_ID).then(|| Strs::new(n, n * 32, false)),
        }
    }

    fn fits(&self) -> bool {
        [
            Some(&self.topic),
            self.body.as_ref(),
            self.tags.as_ref(),
            self.uniq_key.as_ref(),
            self.born_host.as_ref(),
            self.store_host.as_ref(),
            self.msg_id.as_ref(),
        ]
        .into_iter()
        .flatten()
        .all(Strs::fits)
            && [self.properties.as_ref(), self.keys.as_ref()]
                .into_iter()
                .flatten()
                .all(Nested::fits)
    }
}

/// The distinct names of one record's properties, each with its last value, in the order the
/// names first appear (a Python dict's order).
#[derive(Default)]
struct Pairs<'a> {
    pairs: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    index: HashMap<Cow<'a, str>, usize>,
}

impl<'a> Pairs<'a> {
    /// Up to this many names a linear search is cheaper than hashing.
    const LINEAR: usize = 8;

    fn parse(&mut self, raw: &'a [u8]) {
        self.pairs.clear();
        if !self.index.is_empty() {
            self.index.clear();
        }
        for (name, value) in hash::properties(raw) {
            self.add(text(name), text(value));
        }
    }

    fn add(&mut self, name: Cow<'a, str>, value: Cow<'a, str>) {
        if self.pairs.len() >= Self::LINEAR && self.index.is_empty() {
            for (k, p) in self.pairs.iter().enumerate() {
                self.index.insert(p.0.clone(), k);
            }
        }
        let found = if self.index.is_empty() {
            self.pairs.iter().position(|p| p.0 == name)
        } else {
            self.index.get(&name).copied()
        };
        match found {
            Some(k) => self.pairs[k].1 = value,
            None => {
                if !self.index.is_empty() {
                    self.index.insert(name.clone(), self.pairs.len());
                }
                self.pairs.push((name, value));
            }
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|p| p.0 == name)
            .map(|p| p.1.as_ref())
    }
}

/// UTF-8 bytes as text, malformed sequences as U+FFFD (checking first: the lossy decoder is
/// several times slower on the valid text that is the rule).
fn text(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// Formats host fields (address bytes, then a big-endian int port), remembering the last
/// one: a segment's records come from few hosts, usually one.
#[derive(Default)]
struct HostCache {
    raw: Vec<u8>,
    text: Vec<u8>,
}

impl HostCache {
    fn format(&mut self, field: &[u8]) -> &[u8] {
        if self.raw != field {
            self.raw.clear();
            self.raw.extend_from_slice(field);
            self.text.clear();
            format_host(field, &mut self.text);
        }
        &self.text
    }
}

/// `a.b.c.d:port`, or `[v6]:port` with the IPv6 address as Python's `ipaddress` prints it:
/// lowercase hextets without leading zeros, the first longest run of two or more zero
/// hextets as `::` (no dotted IPv4 tail, not even for IPv4-mapped addresses).
fn format_host(field: &[u8], out: &mut Vec<u8>) {
    let (addr, port) = field.split_at(field.len() - 4);
    let port = be_i32(port, 0);
    if addr.len() == 4 {
        let _ = write!(
            out,
            "{}.{}.{}.{}:{port}",
            addr[0], addr[1], addr[2], addr[3]
        );
        return;
    }
    let hextets: Vec<u16> = addr
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    let (mut best, mut best_len, mut run, mut run_len) = (0, 0, 0, 0);
    for (i, &h) in hextets.iter().enumerate() {
        if h == 0 {
            if run_len == 0 {
                run = i;
            }
            run_len += 1;
            if run_len > best_len {
                (best, best_len) = (run, run_len);
            }
        } else {
            run_len = 0;
        }
    }
    let join = |out: &mut Vec<u8>, part: &[u16]| {
        for (k, h) in part.iter().enumerate() {
            let _ = write!(out, "{}{h:x}", if k > 0 { ":" } else { "" });
        }
    };
    out.push(b'[');
    if best_len > 1 {
        join(out, &hextets[..best]);
        out.extend_from_slice(b"::");
        join(out, &hextets[best + best_len..]);
    } else {
        join(out, &hextets);
    }
    let _ = write!(out, "]:{port}");
}

/// Uppercase hex of at most 28 bytes (an IPv6 msgId's), appended to `out` in one copy.
fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let mut text = [0u8; 56];
    for (pair, &b) in text.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[(b >> 4) as usize];
        pair[1] = DIGITS[(b & 15) as usize];
    }
    out.extend_from_slice(&text[..2 * bytes.len().min(28)]);
}

/// A record that failed its checks: its row in the call, its physical offset, and why.
type Bad = (usize, i64, String);

/// One checked record's fields, borrowed from the segment's bytes.
struct Rec<'a> {
    s: Scanned<'a>,
    topic: &'a str,
    flag: i32,
    born_ts: i64,
    reconsume: i32,
    prep_tx: i64,
    body_crc: i32,
    born_host: &'a [u8],
    store_host: &'a [u8],
}

impl Rec<'_> {
    /// The bytes a msgId is the hex of: the store host field, then the physical offset.
    fn msg_id_field<'b>(&self, phys: i64, buf: &'b mut [u8; 28]) -> &'b [u8] {
        let n = self.store_host.len();
        buf[..n].copy_from_slice(self.store_host);
        buf[n..n + 8].copy_from_slice(&phys.to_be_bytes());
        &buf[..n + 8]
    }
}

/// Checks the record at relative position `r` (physical offset `phys`) as the walk does, and
/// against `want_size`, the size its ConsumeQueue unit claims, when there is one.
fn check_record(
    data: &[u8],
    r: i64,
    phys: i64,
    limit: usize,
    want_size: Option<i64>,
    check_crc: bool,
) -> Result<Rec<'_>, String> {
    if r < 0 || r as u64 > limit as u64 {
        return Err(format!(
            "position {r} is outside the segment's {limit} bytes"
        ));
    }
    let pos = r as usize;
    if pos + 8 <= limit && be_i32(data, pos + 4) == BLANK_MAGIC {
        return Err("END_OF_FILE blank where a message was expected".to_string());
    }
    let s = scan_record(data, pos, limit, phys, check_crc)?;
    if let Some(want) = want_size {
        if s.size as i64 != want {
            return Err(format!(
                "TOTALSIZE {} differs from the ConsumeQueue unit's size {want}",
                s.size
            ));
        }
    }
    let topic = std::str::from_utf8(s.topic).map_err(|_| "topic is not valid UTF-8".to_string())?;
    // scan_record checked that every field up to BODYLENGTH lies inside the record.
    let born_len = if s.sys_flag & BORNHOST_V6_FLAG != 0 {
        20
    } else {
        8
    };
    let store_len = if s.sys_flag & STOREHOST_V6_FLAG != 0 {
        20
    } else {
        8
    };
    let born_at = pos + OFF_BORNHOST;
    let store_at = born_at + born_len + 8;
    let tail = store_at + store_len;
    Ok(Rec {
        topic,
        flag: be_i32(data, pos + 16),
        born_ts: be_i64(data, pos + 40),
        reconsume: be_i32(data, tail),
        prep_tx: be_i64(data, tail + 4),
        body_crc: be_i32(data, pos + 8),
        born_host: &data[born_at..born_at + born_len],
        store_host: &data[store_at..store_at + store_len],
        s,
    })
}

#[allow(clippy::too_many_arguments)]
fn decode_columns(
    data: &[u8],
    rel: &[i64],
    base: i64,
    sizes: Option<&[i64]>,
    limit: usize,
    check_crc: bool,
    groups: u32,
    at: &mut usize,
) -> Result<Columns, Bad> {
    let n = rel.len();
    let body_bytes = match sizes {
        Some(s) => s.iter().map(|&v| v.max(0) as usize).sum(),
        None => n * 128,
    }
    .min(data.len());
    let mut c = Columns::new(n, groups, body_bytes);
    let mut pairs = Pairs::default();
    let (mut born_hosts, mut store_hosts) = (HostCache::default(), HostCache::default());
    let mut id_field = [0u8; 28];
    for (i, &r) in rel.iter().enumerate() {
        *at = i;
        if let Some(&ahead) = rel.get(i + PREFETCH_AHEAD) {
            prefetch_record(data, ahead, sizes.map_or(256, |s| s[i + PREFETCH_AHEAD]));
        }
        let phys = base.wrapping_add(r);
        let want = sizes.map(|s| s[i]);
        let rec = check_record(data, r, phys, limit, want, check_crc).map_err(|e| (i, phys, e))?;
        let s = &rec.s;
        c.phys.push(phys);
        c.size.push(s.size as i32);
        c.queue_id.push(s.queue_id);
        c.queue_offset.push(s.queue_offset);
        c.sys_flag.push(s.sys_flag);
        c.flag.push(rec.flag);
        c.born_ts.push(rec.born_ts);
        c.store_ts.push(s.store_ts);
        c.reconsume.push(rec.reconsume);
        c.prep_tx.push(rec.prep_tx);
        c.body_crc.push(rec.body_crc);
        c.topic.push(rec.topic.as_bytes());
        if let Some(col) = &mut c.body {
            col.push(s.body);
        }
        if c.properties.is_some() {
            pairs.parse(s.props);
            push_map(&mut c, &pairs);
            let get = |name| pairs.get(name).map(Cow::Borrowed);
            push_reserved(&mut c, get("KEYS"), get("TAGS"), get("UNIQ_KEY"));
        } else if groups & NEEDS_PROPERTIES != 0 {
            // Without the map only three names matter: one pass picking their last values
            // skips building the pairs, which was a fifth of the default row's decode.
            let r = hash::reserved(s.props);
            let (keys, tags, uniq) = (r.keys.map(text), r.tags.map(text), r.uniq.map(text));
            push_reserved(&mut c, keys, tags, uniq);
        }
        if let Some(col) = &mut c.born_host {
            col.push(born_hosts.format(rec.born_host));
        }
        if let Some(col) = &mut c.store_host {
            col.push(store_hosts.format(rec.store_host));
        }
        if let Some(col) = &mut c.msg_id {
            push_hex(&mut col.data, rec.msg_id_field(phys, &mut id_field));
            col.end_row(true);
        }
    }
    *at = n;
    Ok(c)
}

/// How many records ahead of the one being decoded [`prefetch_record`] asks for.
const PREFETCH_AHEAD: usize = 4;

/// Asks the CPU to start loading the cache lines of the record at `rel` (`size` bytes, as its
/// unit claims): a queue's records are spread between the other queues' in the CommitLog, so
/// the hardware's own prefetcher does not see them coming, and decoding otherwise waits on
/// memory at each record's first bytes. A hint only: out-of-range positions are skipped.
#[inline]
fn prefetch_record(data: &[u8], rel: i64, size: i64) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let Ok(start) = usize::try_from(rel) else {
            return;
        };
        let end = start
            .saturating_add(size.clamp(0, 1024) as usize)
            .min(data.len());
        let mut at = start;
        while at < end {
            // SAFETY: `at` is inside `data` (checked above), so the pointer is in bounds of
            // a live slice; PREFETCHT0 is SSE, part of every x86_64 CPU, and only a hint: it
            // reads nothing into the program and cannot fault.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(data.as_ptr().add(at).cast::<i8>()) };
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, rel, size);
}

fn push_map(c: &mut Columns, pairs: &Pairs<'_>) {
    if let Some(map) = &mut c.properties {
        for (name, value) in &pairs.pairs {
            map.items.push(name.as_bytes());
            if let Some(values) = &mut map.more {
                values.push(value.as_bytes());
            }
        }
        map.end_row(true);
    }
}

/// The KEYS (split on spaces), TAGS and UNIQ_KEY columns of one record, from the last value
/// of each name (already decoded as text).
fn push_reserved(
    c: &mut Columns,
    keys: Option<Cow<'_, str>>,
    tags: Option<Cow<'_, str>>,
    uniq: Option<Cow<'_, str>>,
) {
    if let Some(col) = &mut c.keys {
        match keys {
            Some(v) => {
                for token in v.split(' ').filter(|t| !t.is_empty()) {
                    col.items.push(token.as_bytes());
                }
                col.end_row(true);
            }
            None => col.end_row(false),
        }
    }
    for (col, value) in [(&mut c.tags, tags), (&mut c.uniq_key, uniq)] {
        if let Some(col) = col {
            match value {
                Some(v) => col.push(v.as_bytes()),
                None => col.push_null(),
            }
        }
    }
}

/// Decode the records at relative positions `rel` of one segment's bytes `buf` (trusted up
/// to `limit`); `base` is the segment's physical offset, `sizes` (optional, one per record)
/// the sizes their ConsumeQueue units claim, `groups` the optional column groups wanted.
///
/// Returns a dict: `error` is None, or `(row, physical offset, reason)` of the first record
/// that fails a check (then no columns come). Otherwise the int64 columns `phys`, `born_ts`,
/// `store_ts`, `queue_offset`, `prep_tx` and int32 `size`, `queue_id`, `sys_flag`, `flag`,
/// `reconsume`, `body_crc` are buffers; the string columns `topic`, `body`, `tags`,
/// `uniq_key`, `born_host`, `store_host`, `msg_id` are `(offsets, data, validity, nulls)`;
/// `keys` is `(offsets, validity, nulls, tokens, None)` and `properties` `(offsets, None, 0,
/// names, values)`. Columns of groups not asked for are None.
#[pyfunction]
#[pyo3(signature = (buf, rel, base, limit, sizes, check_crc, groups))]
#[allow(clippy::too_many_arguments)]
pub fn decode<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    rel: &Bound<'py, PyAny>,
    base: i64,
    limit: usize,
    sizes: Option<&Bound<'py, PyAny>>,
    check_crc: bool,
    groups: u32,
) -> PyResult<Bound<'py, PyDict>> {
    guarded("decode", || {
        let buf = Bytes::new(buf, "buf")?;
        let data = buf.get();
        let limit = limit.min(data.len());
        let rel = Col::<i64>::new(rel, "rel")?;
        let rel = rel.get();
        let sizes = sizes.map(|s| Col::<i64>::new(s, "sizes")).transpose()?;
        let sizes = sizes.as_ref().map(|s| s.get());
        if let Some(s) = sizes {
            require_len("sizes", s.len(), rel.len())?;
        }
        let mut at = 0usize;
        let outcome = py.detach(|| {
            catch_unwind(AssertUnwindSafe(|| {
                decode_columns(data, rel, base, sizes, limit, check_crc, groups, &mut at)
            }))
        });
        let d = PyDict::new(py);
        let c = match outcome {
            Ok(Ok(c)) => c,
            Ok(Err(bad)) => {
                d.set_item("error", bad)?;
                return Ok(d);
            }
            Err(payload) => {
                let phys = rel.get(at).map_or(base, |&r| base.wrapping_add(r));
                let reason = format!("decoder failed: {}", panic_text(payload.as_ref()));
                d.set_item("error", (at, phys, reason))?;
                return Ok(d);
            }
        };
        if !c.fits() {
            return Err(PyValueError::new_err(format!(
                "{} records hold more than 2 GiB of one column: decode fewer per call",
                rel.len()
            )));
        }
        d.set_item("error", py.None())?;
        for (name, col) in [
            ("phys", Data::I64(c.phys)),
            ("size", Data::I32(c.size)),
            ("queue_id", Data::I32(c.queue_id)),
            ("queue_offset", Data::I64(c.queue_offset)),
            ("sys_flag", Data::I32(c.sys_flag)),
            ("flag", Data::I32(c.flag)),
            ("born_ts", Data::I64(c.born_ts)),
            ("store_ts", Data::I64(c.store_ts)),
            ("reconsume", Data::I32(c.reconsume)),
            ("prep_tx", Data::I64(c.prep_tx)),
            ("body_crc", Data::I32(c.body_crc)),
        ] {
            d.set_item(name, Owned::new(col))?;
        }
        d.set_item("topic", c.topic.into_py(py)?)?;
        for (name, col) in [
            ("body", c.body),
            ("tags", c.tags),
            ("uniq_key", c.uniq_key),
            ("born_host", c.born_host),
            ("store_host", c.store_host),
            ("msg_id", c.msg_id),
        ] {
            d.set_item(name, col.map(|s| s.into_py(py)).transpose()?)?;
        }
        for (name, col) in [("keys", c.keys), ("properties", c.properties)] {
            d.set_item(name, col.map(|s| s.into_py(py)).transpose()?)?;
        }
        Ok(d)
    })
}

/// What [`decode_one`] returns: the record's fields, or why it failed.
type OneRecord<'py> = (Option<(i64, String)>, Option<Bound<'py, PyAny>>);

/// Decode the one record at relative position `rel` of a segment's bytes `buf` (trusted up
/// to `limit`, physical offset `base` at its first byte), checked as [`decode`] checks each
/// record, straight into Python values: for single reads, where building Arrow columns for one
/// row costs several times what the record does. No loop, so the GIL stays held.
///
/// Returns `(None, fields)` or `((physical offset, reason), None)`. `fields` is `(phys, size,
/// queue_id, queue_offset, sys_flag, flag, born_ts, store_ts, reconsume, prep_tx, body_crc,
/// topic, body, properties, born_host, store_host, msg_id)`, with `body` as bytes,
/// `properties` a dict (names in first-seen order, each with its last value) and the rest as
/// [`decode`] gives them.
#[pyfunction]
pub fn decode_one<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    rel: i64,
    base: i64,
    limit: usize,
    check_crc: bool,
) -> PyResult<OneRecord<'py>> {
    guarded("decode_one", || {
        let buf = Bytes::new(buf, "buf")?;
        let data = buf.get();
        let limit = limit.min(data.len());
        let phys = base.wrapping_add(rel);
        let rec = match check_record(data, rel, phys, limit, None, check_crc) {
            Ok(rec) => rec,
            Err(reason) => return Ok((Some((phys, reason)), None)),
        };
        let mut pairs = Pairs::default();
        pairs.parse(rec.s.props);
        let properties = PyDict::new(py);
        for (name, value) in &pairs.pairs {
            properties.set_item(name.as_ref(), value.as_ref())?;
        }
        let mut born = Vec::with_capacity(48);
        format_host(rec.born_host, &mut born);
        let mut store = Vec::with_capacity(48);
        format_host(rec.store_host, &mut store);
        let mut id_field = [0u8; 28];
        let mut msg_id = Vec::with_capacity(56);
        push_hex(&mut msg_id, rec.msg_id_field(phys, &mut id_field));
        let s = &rec.s;
        let head = (
            phys,
            s.size as i32,
            s.queue_id,
            s.queue_offset,
            s.sys_flag,
            rec.flag,
            rec.born_ts,
            s.store_ts,
            rec.reconsume,
            rec.prep_tx,
            rec.body_crc,
        )
            .into_pyobject(py)?;
        let tail = (
            rec.topic,
            PyBytes::new(py, s.body),
            properties,
            text(&born),
            text(&store),
            text(&msg_id),
        )
            .into_pyobject(py)?;
        Ok((None, Some(head.add(tail)?)))
    })
}

/// Which positions `rel` of a segment's bytes hold the start of a record, intact or not: a
/// whole 48-byte header (within `limit`) with the magic code and a PHYSICALOFFSET field equal
/// to `base + rel`. For index look-ups, whose candidates may point anywhere.
#[pyfunction]
pub fn record_starts<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    rel: &Bound<'py, PyAny>,
    base: i64,
    limit: usize,
) -> PyResult<Owned> {
    guarded("record_starts", || {
        let buf = Bytes::new(buf, "buf")?;
        let data = buf.get();
        let limit = limit.min(data.len());
        let rel = Col::<i64>::new(rel, "rel")?;
        let rel = rel.get();
        let out = py.detach(|| {
            rel.iter()
                .map(|&r| {
                    let ok = r >= 0
                        && (r as u64) + 48 <= limit as u64
                        && be_i32(data, r as usize + 4) == MAGIC
                        && be_i64(data, r as usize + 28) == base.wrapping_add(r);
                    ok as u8
                })
                .collect()
        });
        Ok(Owned::new(Data::U8(out)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(field: &[u8]) -> String {
        let mut out = vec![];
        format_host(field, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn v6(hextets: [u16; 8], port: i32) -> Vec<u8> {
        let mut f: Vec<u8> = hextets.iter().flat_map(|h| h.to_be_bytes()).collect();
        f.extend_from_slice(&port.to_be_bytes());
        f
    }

    #[test]
    fn hosts_as_python_prints_them() {
        assert_eq!(host(&[10, 0, 0, 1, 0, 0, 0x27, 0x11]), "10.0.0.1:10001");
        assert_eq!(host(&[1, 2, 3, 4, 0xFF, 0xFF, 0xFF, 0xFF]), "1.2.3.4:-1");
        assert_eq!(host(&v6([0; 8], 1)), "[::]:1");
        assert_eq!(host(&v6([0, 0, 0, 0, 0, 0, 0, 1], 2)), "[::1]:2");
        assert_eq!(host(&v6([1, 0, 0, 0, 0, 0, 0, 0], 2)), "[1::]:2");
        // A single zero hextet stays; of two equal runs the first is compressed.
        assert_eq!(
            host(&v6([0x2001, 0xdb8, 0, 1, 1, 1, 1, 1], 9)),
            "[2001:db8:0:1:1:1:1:1]:9"
        );
        assert_eq!(host(&v6([1, 0, 0, 2, 0, 0, 3, 4], 9)), "[1::2:0:0:3:4]:9");
        assert_eq!(host(&v6([1, 0, 0, 2, 0, 0, 0, 4], 9)), "[1:0:0:2::4]:9");
        // IPv4-mapped addresses print in hex, as Python 3.11's ipaddress does.
        assert_eq!(
            host(&v6([0, 0, 0, 0, 0, 0xffff, 0x0102, 0x0304], 5)),
            "[::ffff:102:304]:5"
        );
    }

    #[test]
    fn duplicate_names_keep_first_place_and_last_value() {
        let mut p = Pairs::default();
        p.parse(b"a\x011\x02b\x012\x02a\x013");
        let got: Vec<(&str, &str)> = p.pairs.iter().map(|(k, v)| (&**k, &**v)).collect();
        assert_eq!(got, vec![("a", "3"), ("b", "2")]);
        let many: Vec<u8> = (0..40)
            .map(|i| format!("k{}\x01v{i}", i % 20))
            .collect::<Vec<_>>()
            .join("\x02")
            .into_bytes();
        p.parse(&many);
        assert_eq!(p.pairs.len(), 20);
        assert_eq!(p.get("k3"), Some("v23"));
        assert_eq!(&*p.pairs[3].0, "k3");
    }

    #[test]
    fn malformed_utf8_becomes_replacement_characters() {
        let mut p = Pairs::default();
        p.parse(b"k\x01a\xffb");
        assert_eq!(p.get("k"), Some("a\u{FFFD}b"));
    }
}
