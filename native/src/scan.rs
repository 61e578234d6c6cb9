//! The record walk: every whole, valid record of a segment from a record boundary, with the
//! columns dispatch needs (ConsumeQueue units, index entries) derived on the way.
//!
//! Recovery uses it to find the end of the log, re-dispatch and `verify` to read what the
//! derived files must say, and both get the same answer because there is one walk.

use std::collections::HashMap;

use pyo3::prelude::*;

use crate::guarded;
use pyo3::types::{PyBytes, PyDict};

use crate::buffers::{push_i32, push_i64, Bytes};
use crate::hash;
use crate::layout::*;

/// Why a walk stopped.
pub const STOP_END: i32 = 0; // fewer than 8 bytes left, or `max_records` reached
pub const STOP_BLANK: i32 = 1; // an END_OF_FILE blank that fills the rest of the segment
pub const STOP_INVALID: i32 = 2; // bytes that are not a whole, valid record

/// The fields of one record that dispatch and checks need.
pub struct Scanned<'a> {
    pub size: usize,
    pub queue_id: i32,
    pub queue_offset: i64,
    pub sys_flag: i32,
    pub store_ts: i64,
    pub topic: &'a [u8],
    pub props: &'a [u8],
    pub body: &'a [u8],
    pub body_crc_ok: bool,
}

/// Checks the record at `pos` (physical offset `phys`) and returns its fields, or why it is
/// not a whole, valid record: magic, total size, field lengths, PHYSICALOFFSET and, when
/// asked, the body CRC. Never reads outside `buf[..limit]`.
pub fn scan_record(
    buf: &[u8],
    pos: usize,
    limit: usize,
    phys: i64,
    check_crc: bool,
) -> Result<Scanned<'_>, String> {
    const HEAD: usize = 48;
    if pos + HEAD > limit {
        return Err(format!(
            "truncated header: {} bytes left",
            limit.saturating_sub(pos)
        ));
    }
    let size = be_i32(buf, pos);
    let magic = be_i32(buf, pos + 4);
    if magic != MAGIC {
        return Err(format!("bad magic code 0x{:08X}", magic as u32));
    }
    if size < FIXED_SIZE_V4 as i32 || pos + size as usize > limit {
        return Err(format!(
            "bad total size {size} ({} bytes left)",
            limit - pos
        ));
    }
    let end = pos + size as usize;
    let physical = be_i64(buf, pos + 28);
    if physical != phys {
        return Err(format!(
            "PHYSICALOFFSET field says {physical}, record is at {phys}"
        ));
    }
    let sys_flag = be_i32(buf, pos + OFF_SYSFLAG);
    let born_len = if sys_flag & BORNHOST_V6_FLAG != 0 {
        20
    } else {
        8
    };
    let store_len = if sys_flag & STOREHOST_V6_FLAG != 0 {
        20
    } else {
        8
    };
    let mut p = pos + OFF_BORNHOST + born_len;
    // Everything up to BODYLENGTH must lie inside the record.
    if p + 8 + store_len + 16 > end {
        return Err(format!("record runs past its total size {size}"));
    }
    let store_ts = be_i64(buf, p);
    p += 8 + store_len + 12;
    let body_len = be_i32(buf, p);
    p += 4;
    if body_len < 0 || p + body_len as usize + 3 > end {
        return Err(format!("body length {body_len} exceeds record size {size}"));
    }
    let body = &buf[p..p + body_len as usize];
    p += body_len as usize;
    let topic_len = buf[p] as usize;
    p += 1;
    if p + topic_len + 2 > end {
        return Err(format!("field lengths do not add up to total size {size}"));
    }
    let topic = &buf[p..p + topic_len];
    p += topic_len;
    let props_len = be_i16(buf, p);
    p += 2;
    if props_len < 0 || p + props_len as usize != end {
        return Err(format!("field lengths do not add up to total size {size}"));
    }
    let body_crc_ok = !check_crc || hash::body_crc(body) == be_i32(buf, pos + 8);
    if !body_crc_ok {
        return Err(format!(
            "body CRC mismatch: stored {}, computed {}",
            be_i32(buf, pos + 8),
            hash::body_crc(body)
        ));
    }
    Ok(Scanned {
        size: size as usize,
        queue_id: be_i32(buf, pos + 12),
        queue_offset: be_i64(buf, pos + 20),
        sys_flag,
        store_ts,
        topic,
        props: &buf[p..end],
        body,
        body_crc_ok,
    })
}

#[derive(Default)]
struct Columns {
    phys: Vec<u8>,
    sizes: Vec<u8>,
    queue_ids: Vec<u8>,
    queue_offsets: Vec<u8>,
    sys_flags: Vec<u8>,
    store_ts: Vec<u8>,
    tags_codes: Vec<u8>,
    topic_codes: Vec<u8>,
    key_rows: Vec<u8>,
    key_hashes: Vec<u8>,
    topics: Vec<Vec<u8>>,
    count: usize,
    stop: Stop,
}

/// Walk records of one segment's bytes from `start` (a record boundary, relative to the
/// segment) to the first that is not whole and valid, at most `max_records` of them. `base`
/// is the segment's physical offset, `limit` how many of its bytes to trust.
///
/// Returns a dict of native-endian column bytes (`phys`, `sizes` int64; `queue_ids`,
/// `sys_flags`, `topic_codes` int32; `queue_offsets`, `store_ts`, `tags_codes` int64; index
/// entries `key_rows` int64 and `key_hashes` int32), the distinct `topics` (bytes) the codes
/// index, `count`, `end` (relative offset where the walk stopped), `stop` (0 end of data, 1 an
/// END_OF_FILE blank, 2 an invalid record) and `reason` (why, for 2).
#[pyfunction]
#[pyo3(signature = (buf, start, limit, base, check_crc, max_records=usize::MAX))]
pub fn walk<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    start: usize,
    limit: usize,
    base: i64,
    check_crc: bool,
    max_records: usize,
) -> PyResult<Bound<'py, PyDict>> {
    guarded("walk", || {
        let buf = Bytes::new(buf, "buf")?;
        let data = buf.get();
        let limit = limit.min(data.len());
        let c = py.detach(|| walk_columns(data, start, limit, base, check_crc, max_records));
        let d = PyDict::new(py);
        for (name, col) in [
            ("phys", &c.phys),
            ("sizes", &c.sizes),
            ("queue_ids", &c.queue_ids),
            ("queue_offsets", &c.queue_offsets),
            ("sys_flags", &c.sys_flags),
            ("store_ts", &c.store_ts),
            ("tags_codes", &c.tags_codes),
            ("topic_codes", &c.topic_codes),
            ("key_rows", &c.key_rows),
            ("key_hashes", &c.key_hashes),
        ] {
            d.set_item(name, PyBytes::new(py, col))?;
        }
        let topics: Vec<Bound<'py, PyBytes>> =
            c.topics.iter().map(|t| PyBytes::new(py, t)).collect();
        d.set_item("topics", topics)?;
        d.set_item("count", c.count)?;
        c.stop.put_into(&d)?;
        Ok(d)
    })
}

/// Where and why a walk stopped: `end` is relative to the segment, `reason` says why for
/// [`STOP_INVALID`].
#[derive(Default)]
pub struct Stop {
    pub end: usize,
    pub stop: i32,
    pub reason: String,
}

impl Stop {
    /// Sets a result dict's `end`, `stop` and `reason`.
    pub fn put_into(self, d: &Bound<'_, PyDict>) -> PyResult<()> {
        d.set_item("end", self.end)?;
        d.set_item("stop", self.stop)?;
        d.set_item("reason", self.reason)
    }
}

/// Calls `visit(rel, record)` for each whole, valid record of `data` from `start` (relative,
/// a record boundary), up to `max_records` and up to physical offset `end_phys` (a record there
/// or later is not visited), and says where and why it stopped. `base` is the segment's
/// physical offset; nothing past `limit` is read.
#[allow(clippy::too_many_arguments)]
pub fn walk_records<'a>(
    data: &'a [u8],
    start: usize,
    limit: usize,
    base: i64,
    check_crc: bool,
    max_records: usize,
    end_phys: i64,
    mut visit: impl FnMut(usize, &Scanned<'a>),
) -> Stop {
    let mut rel = start;
    let mut count = 0;
    loop {
        if count >= max_records || rel + 8 > limit || base + rel as i64 >= end_phys {
            return Stop {
                end: rel,
                stop: STOP_END,
                reason: String::new(),
            };
        }
        let (size, magic) = (be_i32(data, rel), be_i32(data, rel + 4));
        if magic == BLANK_MAGIC && size as i64 == (limit - rel) as i64 {
            return Stop {
                end: rel,
                stop: STOP_BLANK,
                reason: String::new(),
            };
        }
        match scan_record(data, rel, limit, base + rel as i64, check_crc) {
            Ok(r) => {
                debug_assert!(r.body_crc_ok);
                visit(rel, &r);
                count += 1;
                rel += r.size;
            }
            Err(reason) => {
                return Stop {
                    end: rel,
                    stop: STOP_INVALID,
                    reason,
                }
            }
        }
    }
}

/// Distinct topics in order of first appearance, each with the hash state after `topic#`.
/// Records of one topic come in runs, so the last one is tried before the map.
#[derive(Default)]
pub struct Topics<'a> {
    codes: HashMap<&'a [u8], usize>,
    pub names: Vec<&'a [u8]>,
    prefixes: Vec<i32>,
    last: Option<usize>,
}

impl<'a> Topics<'a> {
    /// The topic's code and its index key hash prefix.
    pub fn code(&mut self, topic: &'a [u8]) -> (usize, i32) {
        let code = match self.last {
            Some(c) if self.names[c] == topic => c,
            _ => *self.codes.entry(topic).or_insert_with(|| {
                self.names.push(topic);
                self.prefixes.push(hash::topic_prefix(topic));
                self.names.len() - 1
            }),
        };
        self.last = Some(code);
        (code, self.prefixes[code])
    }
}

fn walk_columns(
    data: &[u8],
    start: usize,
    limit: usize,
    base: i64,
    check_crc: bool,
    max_records: usize,
) -> Columns {
    let mut c = Columns::default();
    let mut topics = Topics::default();
    let stop = walk_records(
        data,
        start,
        limit,
        base,
        check_crc,
        max_records,
        i64::MAX,
        |rel, r| {
            let row = c.count as i64;
            let (code, prefix) = topics.code(r.topic);
            let reserved = hash::reserved(r.props);
            push_i64(&mut c.phys, base + rel as i64);
            push_i64(&mut c.sizes, r.size as i64);
            push_i32(&mut c.queue_ids, r.queue_id);
            push_i64(&mut c.queue_offsets, r.queue_offset);
            push_i32(&mut c.sys_flags, r.sys_flag);
            push_i64(&mut c.store_ts, r.store_ts);
            push_i64(&mut c.tags_codes, hash::tags_code(reserved.tags));
            push_i32(&mut c.topic_codes, code as i32);
            if indexed(r.sys_flag) {
                hash::for_each_index_key(prefix, reserved.uniq, reserved.keys, |h| {
                    push_i64(&mut c.key_rows, row);
                    push_i32(&mut c.key_hashes, h);
                });
            }
            c.count += 1;
        },
    );
    c.topics = topics.names.iter().map(|t| t.to_vec()).collect();
    c.stop = stop;
    c
}
