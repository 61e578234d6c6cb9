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
/// not a whole, valid record: magic, total size, field lengths, PHYSICALOFFSET, when asked the
/// body CRC, and no NUL byte in the topic or properties ([`torn_tail`]). Never reads outside
/// `buf[..limit]`.
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
    let props = &buf[p..end];
    if let Some(reason) = torn_tail(topic, props) {
        return Err(reason);
    }
    Ok(Scanned {
        size: size as usize,
        queue_id: be_i32(buf, pos + 12),
        queue_offset: be_i64(buf, pos + 20),
        sys_flag,
        store_ts,
        topic,
        props,
        body,
        body_crc_ok,
    })
}

/// Why a record's topic or properties cannot be a whole record's: the first NUL byte in them.
///
/// RocketMQ's only checksum covers the body. A write torn after the body (the disk kept the
/// record only up to a point inside its topic or properties, or lost a page of them) leaves
/// zeros there while every length still adds up, and the record would come back with its
/// properties cut short: a UNIQ_KEY ending in NULs, user properties gone. NUL is what gives it
/// away, because a whole record has none there:
///
/// - a topic satisfies RocketMQ's topic rule, `[%|a-zA-Z0-9_-]`, which the 4.9 client
///   (`Validators.checkTopic`), the broker (`TopicValidator.validateTopic`) and rocketstore's
///   puts all enforce;
/// - properties: rocketstore's puts refuse U+0000 in every name and value, as they refuse the
///   two separators. RocketMQ's client does not check for it (`putUserProperty` refuses only
///   blank values, `setKeys` and `setTags` nothing), so a RocketMQ application that put a NUL
///   into a property would see that record reported as damaged here. No rule can tell such a
///   record from a torn one: a tear writes exactly those bytes.
///
/// Only NUL is looked for: a tear writes nothing else, so checking the topic's whole character
/// set or the `name\x01value\x02…` grammar would catch no more tears, only refuse records that
/// other writers made. The cost is one vectorised pass over each field ([`has_nul`]): about
/// 4% more instructions on the walk for records of 100-byte bodies.
pub fn torn_tail(topic: &[u8], props: &[u8]) -> Option<String> {
    if !has_nul(topic) && !has_nul(props) {
        return None;
    }
    Some(nul_reason(topic, props))
}

/// The reason [`torn_tail`] gives: where the first NUL is. Off the walk's path.
#[cold]
fn nul_reason(topic: &[u8], props: &[u8]) -> String {
    let (what, field) = if has_nul(topic) {
        ("topic", topic)
    } else {
        ("properties", props)
    };
    let at = field.iter().position(|&b| b == 0).unwrap_or_default();
    format!(
        "NUL byte in the {what} at byte {at} of {}: a torn write's zeros",
        field.len()
    )
}

/// Whether `field` holds a zero byte. It takes the minimum of each byte position over 16-byte
/// chunks, the last chunk overlapping the one before it, which the compiler turns into one
/// vector instruction per chunk (SSE2 on x86-64, NEON on ARM) with no branch per byte: a
/// whole record's fields are read to the end anyway, and a search that stops at the first
/// zero cost twice as much on the walk. Shorter fields, most topics among them, go eight
/// bytes at a time ([`has_nul_short`]).
fn has_nul(field: &[u8]) -> bool {
    const LANES: usize = 16;
    if field.len() < LANES {
        return has_nul_short(field);
    }
    let mut low = [u8::MAX; LANES];
    let mut lower = |chunk: &[u8]| {
        let chunk: &[u8; LANES] = chunk.try_into().expect("a whole chunk");
        for (l, &b) in low.iter_mut().zip(chunk) {
            *l = (*l).min(b);
        }
    };
    field.chunks_exact(LANES).for_each(&mut lower);
    lower(&field[field.len() - LANES..]);
    low.iter().fold(u8::MAX, |a, &b| a.min(b)) == 0
}

/// [`has_nul`] for fields of fewer than 16 bytes: from 8 bytes on, two words that may overlap,
/// each tested at once (`(w - 0x01…01) & !w & 0x80…80` is non-zero exactly when some byte of
/// `w` is zero).
fn has_nul_short(field: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const TOPS: u64 = 0x8080_8080_8080_8080;
    let zero_in = |word: &[u8]| {
        let w = u64::from_le_bytes(word.try_into().expect("a whole word"));
        w.wrapping_sub(ONES) & !w & TOPS != 0
    };
    match field.len() {
        0..8 => field.contains(&0),
        n => zero_in(&field[..8]) | zero_in(&field[n - 8..]),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const PHYS: i64 = 4096;

    /// One IPv4 record at physical offset [`PHYS`], as the puts write it.
    fn record(body: &[u8], topic: &[u8], props: &[u8]) -> Vec<u8> {
        let host = [127, 0, 0, 1, 0, 0, 0x2A, 0x9F];
        let r = Record {
            queue_id: 1,
            flag: 0,
            queue_offset: 7,
            phys: PHYS,
            sys_flag: 0,
            born_ts: 1,
            born_host: &host,
            store_ts: 2,
            store_host: &host,
            reconsume: 0,
            prep_tx: 0,
            body,
            topic,
            props_len: props.len(),
        };
        let mut out = vec![0; record_size(body.len(), topic.len(), props.len(), 8, 8)];
        r.write(&mut out, |w| w.bytes(props));
        out
    }

    fn scan(rec: &[u8]) -> Result<Scanned<'_>, String> {
        scan_record(rec, 0, rec.len(), PHYS, true)
    }

    const PROPS: &[u8] =
        b"KEYS\x01k1 k2\x02UNIQ_KEY\x01AC1400017F0000000000000000000001\x02seq\x0142";

    #[test]
    fn a_whole_record_passes() {
        let rec = record(b"body", b"%RETRY%group|a_b-1", PROPS);
        let r = scan(&rec).unwrap();
        assert_eq!(
            (r.topic, r.props, r.body),
            (&b"%RETRY%group|a_b-1"[..], PROPS, &b"body"[..])
        );
        // No properties at all: the record ends with its topic.
        let bare = record(b"", b"T", b"");
        assert_eq!(scan(&bare).unwrap().props, b"");
    }

    #[test]
    fn a_write_torn_anywhere_after_the_body_is_refused() {
        let rec = record(b"body", b"TopicA", PROPS);
        let props_at = rec.len() - PROPS.len();
        // The disk kept the bytes up to `cut`, zeros after. A cut before the properties also
        // zeroes PROPERTIESLENGTH, and the lengths no longer add up; inside the properties only
        // the zeros are left to tell.
        for cut in props_at - 2 - 6..rec.len() {
            let mut torn = rec.clone();
            torn[cut..].fill(0);
            let why = scan(&torn)
                .err()
                .unwrap_or_else(|| panic!("cut at {cut} accepted"));
            let want = if cut < props_at {
                "field lengths"
            } else {
                "NUL byte"
            };
            assert!(why.starts_with(want), "cut at {cut}: {why}");
        }
        let mut torn = rec.clone();
        torn[rec.len() - 3..].fill(0);
        let n = PROPS.len();
        assert_eq!(
            scan(&torn).err(),
            Some(format!(
                "NUL byte in the properties at byte {} of {n}: a torn write's zeros",
                n - 3
            ))
        );
        // With no properties the record ends with its topic and a zero PROPERTIESLENGTH.
        let bare = record(b"", b"TopicA", b"");
        let mut torn = bare.clone();
        torn[bare.len() - 4..].fill(0);
        assert_eq!(
            scan(&torn).err().as_deref(),
            Some("NUL byte in the topic at byte 4 of 6: a torn write's zeros")
        );
    }

    #[test]
    fn zeros_in_the_middle_of_the_properties_are_refused() {
        // A lost page inside a large PROPERTIES field, the record's end intact.
        let mut props = b"UNIQ_KEY\x01U\x02pad\x01".to_vec();
        props.resize(9000, b'p');
        let rec = record(b"b", b"T", &props);
        let mut holed = rec.clone();
        let from = rec.len() - 5000;
        holed[from..from + 4096].fill(0);
        let why = scan(&holed).err().unwrap_or_default();
        assert!(why.starts_with("NUL byte in the properties"), "{why}");
        // Without the CRC check too: the rule is not the CRC's.
        assert!(scan_record(&holed, 0, holed.len(), PHYS, false).is_err());
    }

    #[test]
    fn has_nul_finds_a_zero_at_every_place_of_every_length() {
        // Every length across the short, word and chunk paths, with a zero at each position
        // and none; the other bytes 0x80 and 0x01, the values closest to fooling a word test.
        for len in 0..80 {
            for fill in [0x01, 0x80, 0xFF] {
                let mut field = vec![fill; len];
                assert!(!has_nul(&field), "len {len} fill {fill:#x}");
                for at in 0..len {
                    field[at] = 0;
                    assert!(has_nul(&field), "len {len} fill {fill:#x} zero at {at}");
                    field[at] = fill;
                }
            }
        }
    }

    #[test]
    fn the_walk_stops_at_a_torn_record() {
        let mut log = record(b"one", b"T", PROPS);
        let first = log.len();
        let mut second = record(b"two", b"T", PROPS);
        // The second record at its own physical offset.
        second[OFF_PHYSICALOFFSET..OFF_PHYSICALOFFSET + 8]
            .copy_from_slice(&(PHYS + first as i64).to_be_bytes());
        let end = second.len();
        second[end - 8..].fill(0);
        log.extend_from_slice(&second);
        let mut seen = vec![];
        let stop = walk_records(
            &log,
            0,
            log.len(),
            PHYS,
            true,
            usize::MAX,
            i64::MAX,
            |rel, r| {
                seen.push((rel, r.props.to_vec()));
            },
        );
        assert_eq!(seen, vec![(0, PROPS.to_vec())]);
        assert_eq!((stop.end, stop.stop), (first, STOP_INVALID));
        assert!(
            stop.reason.starts_with("NUL byte in the properties"),
            "{}",
            stop.reason
        );
    }
}
