//! The put of one message: the record, its ConsumeQueue unit and its index entries written
//! straight into their mapped files in one call, with no Arrow table and no Python bookkeeping
//! per field.
//!
//! Only a *plain* message takes this path: fields of exactly the types `Message` declares, no
//! transaction bits, born host, reconsume count or prepared offset, no reserved property names,
//! no NUL or separator inside a property, and room in the current CommitLog segment,
//! ConsumeQueue file and IndexFile. For anything else [`SinglePut::put`] returns `None` before
//! writing a byte, and the caller puts the message as a batch of one, which validates it and
//! names what is wrong.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::buffers::{disjoint, OutBytes};
use crate::guarded;
use crate::hash;
use crate::index::{self, ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE};
use crate::layout::{self, UNIT_SIZE};

const BLANK_SIZE: u64 = 8;
const MAX_TOPIC: usize = 127;
const RESERVED: [&str; 3] = ["KEYS", "TAGS", "UNIQ_KEY"];

/// A message's fields, checked and borrowed from the Python objects.
struct Plain<'a> {
    topic: &'a [u8],
    body: &'a [u8],
    queue_id: i32,
    flag: i32,
    born_ts: i64,
    keys: Option<String>,
    tags: Option<&'a [u8]>,
    uniq: &'a [u8],
    props: Vec<u8>,
}

fn exact_str<'a>(v: &'a Bound<'_, PyAny>) -> Option<&'a str> {
    v.cast_exact::<PyString>().ok()?.to_str().ok()
}

fn exact_int<T: for<'a, 'py> FromPyObject<'a, 'py>>(v: &Bound<'_, PyAny>) -> Option<T> {
    v.cast_exact::<PyInt>().ok()?.extract().ok()
}

/// Whether a property name or value holds a byte a record's PROPERTIES cannot: the separators
/// `\x01` and `\x02`, or NUL, which reads as a torn write's zeros ([`crate::scan::torn_tail`]).
fn has_reserved_byte(s: &str) -> bool {
    s.bytes().any(|b| b <= 2)
}

/// RocketMQ's topic rule, `[%|a-zA-Z0-9_-]`, 1 to 127 bytes.
fn valid_topic(t: &[u8]) -> bool {
    (1..=MAX_TOPIC).contains(&t.len())
        && t.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'%' | b'|' | b'_' | b'-'))
}

/// The KEYS value: a string's non-empty space-separated tokens, or a list's or tuple's strings,
/// joined by spaces. `None` when the field is not one of those.
fn keys_text(keys: &Bound<'_, PyAny>) -> Option<Option<String>> {
    if keys.is_none() {
        return Some(None);
    }
    if let Some(s) = exact_str(keys) {
        let joined = s.split(' ').filter(|k| !k.is_empty()).collect::<Vec<_>>();
        return Some(Some(joined.join(" ")));
    }
    let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = keys.cast_exact::<PyList>() {
        l.iter().collect()
    } else if let Ok(t) = keys.cast_exact::<PyTuple>() {
        t.iter().collect()
    } else {
        return None;
    };
    let mut text = String::new();
    for (i, k) in items.iter().enumerate() {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(exact_str(k)?);
    }
    Some(Some(text))
}

fn push_property(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    if !out.is_empty() {
        out.push(2);
    }
    out.extend_from_slice(name);
    out.push(1);
    out.extend_from_slice(value);
}

/// The `Message` attributes [`plain`] reads, in its order.
const FIELDS: [&str; 12] = [
    "topic",
    "body",
    "queue_id",
    "keys",
    "tags",
    "properties",
    "flag",
    "sys_flag",
    "born_timestamp",
    "born_host",
    "reconsume_times",
    "prepared_transaction_offset",
];

/// The message's fields if it is plain (see the module's doc), else `None`. `fields` are the
/// message's attributes in [`FIELDS`] order; `uniq` is its UNIQ_KEY (given or generated).
fn plain<'a>(
    fields: &'a [Bound<'_, PyAny>; 12],
    uniq: &'a Bound<'_, PyAny>,
    max_body: usize,
    now: i64,
) -> Option<Plain<'a>> {
    let [topic, body, queue_id, keys, tags, properties, flag, sys_flag, born_ts, born_host, reconsume, prep_tx] =
        fields;
    let topic = exact_str(topic)
        .map(str::as_bytes)
        .filter(|t| valid_topic(t))?;
    let body = body.cast_exact::<PyBytes>().ok()?.as_bytes();
    let zero = |v: &Bound<'_, PyAny>| exact_int::<i64>(v) == Some(0);
    if body.len() > max_body || !zero(sys_flag) || !zero(reconsume) || !zero(prep_tx) {
        return None;
    }
    let queue_id = exact_int::<i32>(queue_id).filter(|&q| q >= 0)?;
    let flag = exact_int::<i32>(flag)?;
    if !born_host.is_none() {
        return None;
    }
    let born_ts = if born_ts.is_none() {
        now
    } else {
        exact_int::<i64>(born_ts)?
    };
    let keys = keys_text(keys)?.filter(|k| !k.is_empty());
    let tags = if tags.is_none() {
        None
    } else {
        Some(exact_str(tags)?).filter(|t| !t.is_empty())
    };
    let uniq = exact_str(uniq).filter(|u| !u.is_empty())?;
    let mut props = Vec::with_capacity(64);
    for (name, value) in [
        (RESERVED[0], keys.as_deref()),
        (RESERVED[1], tags),
        (RESERVED[2], Some(uniq)),
    ] {
        if let Some(v) = value {
            if has_reserved_byte(v) {
                return None;
            }
            push_property(&mut props, name.as_bytes(), v.as_bytes());
        }
    }
    if !properties.is_none() {
        for (name, value) in properties.cast_exact::<PyDict>().ok()?.iter() {
            let (name, value) = (exact_str(&name)?, exact_str(&value)?);
            if name.is_empty()
                || RESERVED.contains(&name)
                || has_reserved_byte(name)
                || has_reserved_byte(value)
            {
                return None;
            }
            push_property(&mut props, name.as_bytes(), value.as_bytes());
        }
    }
    Some(Plain {
        topic,
        body,
        queue_id,
        flag,
        born_ts,
        keys,
        tags: tags.map(str::as_bytes),
        uniq: uniq.as_bytes(),
        props,
    })
}

/// The single-put path's constants, fixed for an open store.
#[pyclass(module = "rocketstore.pipeline._native", frozen)]
pub struct SinglePut {
    store_host: Vec<u8>,
    /// SYSFLAG of a plain record: the born host is the store host, so both v6 bits or neither.
    sys_flag: i32,
    max_body: usize,
    segment_size: u64,
    slot_num: usize,
    index_num: usize,
    /// [`FIELDS`] as interned Python strings, looked up on every put.
    field_names: Vec<Py<PyString>>,
}

/// Where a plain message goes, checked to fit before anything is written.
struct Placed<'a> {
    msg: Plain<'a>,
    size: usize,
    tags_code: i64,
    key_hashes: Vec<i32>,
}

#[pymethods]
impl SinglePut {
    /// `store_host` is the 8- or 20-byte host field; `max_body` the largest body
    /// (maxMessageSize); the sizes are the store's CommitLog segment and IndexFile geometry.
    #[new]
    fn new(
        py: Python<'_>,
        store_host: Vec<u8>,
        max_body: usize,
        segment_size: u64,
        slot_num: usize,
        index_num: usize,
    ) -> PyResult<Self> {
        guarded("SinglePut", || {
            let sys_flag = match store_host.len() {
                8 => 0,
                20 => layout::BORNHOST_V6_FLAG | layout::STOREHOST_V6_FLAG,
                _ => return Err(PyValueError::new_err("store_host must be 8 or 20 bytes")),
            };
            if slot_num == 0 || segment_size <= BLANK_SIZE {
                return Err(PyValueError::new_err("empty slot table or segment"));
            }
            Ok(SinglePut {
                store_host,
                sys_flag,
                max_body,
                segment_size,
                slot_num,
                index_num,
                field_names: FIELDS
                    .iter()
                    .map(|f| PyString::intern(py, f).unbind())
                    .collect(),
            })
        })
    }

    /// Put `msg` (a `Message`) with UNIQ_KEY `uniq` and store time `now`, as record `phys` at
    /// byte `log_pos` of the CommitLog segment mapped as `log`, as unit `queue_offset` at byte
    /// `unit_pos` of the ConsumeQueue file mapped as `units`, and, when `index` (an IndexFile's
    /// whole mapping) is given, as index entries from number `index_count` of that file, whose
    /// header holds `begin_ts`, `begin_phy` and `slot_count`.
    ///
    /// Returns `None`, having written nothing, when the message is not plain or does not fit
    /// the segment (with its 8-byte blank), the ConsumeQueue file or the IndexFile. Otherwise
    /// writes, in this order: the record, sealed last (see `layout::seal`); the unit; each
    /// index entry with its slot and then the header, as `IndexFile.putKey` does. Returns
    /// `(record size, index entries, slots that were empty)`.
    ///
    /// `hook`, when given, is called with a step's name before each write step
    /// (`"commitlog-write"`, `"consumequeue-append"`, then `"index-put"` per entry) and with
    /// `"record-sealed"` after the record; an exception it raises stops the put there.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        msg, uniq, now, log, log_pos, phys, units, unit_pos, queue_offset, index, index_count,
        begin_ts, begin_phy, slot_count, hook
    ))]
    fn put(
        &self,
        py: Python<'_>,
        msg: &Bound<'_, PyAny>,
        uniq: &Bound<'_, PyAny>,
        now: i64,
        log: &Bound<'_, PyAny>,
        log_pos: usize,
        phys: i64,
        units: &Bound<'_, PyAny>,
        unit_pos: usize,
        queue_offset: i64,
        index: Option<&Bound<'_, PyAny>>,
        index_count: usize,
        begin_ts: i64,
        begin_phy: i64,
        slot_count: i32,
        hook: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<(usize, usize, usize)>> {
        guarded("SinglePut.put", || {
            let mut fields = Vec::with_capacity(FIELDS.len());
            for name in &self.field_names {
                fields.push(msg.getattr(name.bind(py))?);
            }
            let Ok(fields) = <[Bound<'_, PyAny>; 12]>::try_from(fields) else {
                unreachable!("one attribute per name of FIELDS")
            };
            let Some(msg) = plain(&fields, uniq, self.max_body, now) else {
                return Ok(None);
            };
            let (mut log, mut units) = (OutBytes::new(log, "log")?, OutBytes::new(units, "units")?);
            let mut index = index.map(|i| OutBytes::new(i, "index")).transpose()?;
            let mut outputs = vec![("log", log.span()), ("units", units.span())];
            outputs.extend(index.as_ref().map(|i| ("index", i.span())));
            disjoint(&outputs, &[])?;
            if phys < 0 || phys as u64 % self.segment_size != log_pos as u64 {
                return Err(PyValueError::new_err(format!(
                    "offset {phys} is not byte {log_pos} of a segment"
                )));
            }
            let index_size = HEADER_SIZE + SLOT_SIZE * self.slot_num + ENTRY_SIZE * self.index_num;
            if index.as_ref().is_some_and(|i| i.len() != index_size) {
                return Err(PyValueError::new_err(format!(
                    "index: expected a mapping of {index_size} bytes"
                )));
            }
            let Some(placed) = self.place(msg, log_pos, log.len(), index.is_some()) else {
                return Ok(None);
            };
            let entries = placed.key_hashes.len();
            let unit_end = unit_pos.checked_add(UNIT_SIZE);
            let index_end = index_count.checked_add(entries);
            if unit_end.is_none_or(|end| end > units.len())
                || index_end.is_none_or(|end| end > self.index_num)
            {
                return Ok(None);
            }
            let size = placed.size;
            let step = |name: &str| -> PyResult<()> {
                match hook {
                    Some(h) => h.call1((PyString::intern(py, name), size)).map(drop),
                    None => Ok(()),
                }
            };
            step("commitlog-write")?;
            self.record(&placed.msg, phys, queue_offset, now)
                .write(&mut log.get()[log_pos..log_pos + size], |w| {
                    w.bytes(&placed.msg.props)
                });
            step("record-sealed")?;
            step("consumequeue-append")?;
            units.get()[unit_pos..unit_pos + UNIT_SIZE].copy_from_slice(&layout::unit(
                phys,
                placed.size as i32,
                placed.tags_code,
            ));
            let mut new_slots = 0;
            if let Some(index) = &mut index {
                let mut header = index::Header {
                    begin_ts,
                    end_ts: now,
                    begin_phy,
                    end_phy: phys,
                    slot_count,
                    count: index_count,
                };
                for &h in &placed.key_hashes {
                    step("index-put")?;
                    let buf = index.get();
                    let (head, rest) = buf.split_at_mut(HEADER_SIZE);
                    let (slots, entries) = rest.split_at_mut(SLOT_SIZE * self.slot_num);
                    if index::put_key(slots, entries, header.count, header.begin_ts, h, phys, now) {
                        new_slots += 1;
                        header.slot_count += 1;
                    }
                    if header.count <= 1 {
                        header.begin_phy = phys;
                        header.begin_ts = now;
                    }
                    header.count += 1;
                    header.write(head);
                }
            }
            Ok(Some((placed.size, entries, new_slots)))
        })
    }
}

impl SinglePut {
    /// The record's size, tagsCode and index keys, if it fits the segment from `log_pos`.
    fn place<'a>(
        &self,
        msg: Plain<'a>,
        log_pos: usize,
        log_len: usize,
        indexed: bool,
    ) -> Option<Placed<'a>> {
        let host = self.store_host.len();
        let size =
            layout::record_size(msg.body.len(), msg.topic.len(), msg.props.len(), host, host);
        let end = log_pos as u64 + size as u64;
        if msg.props.len() > i16::MAX as usize
            || end + BLANK_SIZE > self.segment_size
            || end > log_len as u64
        {
            return None;
        }
        let mut key_hashes = Vec::new();
        if indexed {
            let prefix = hash::topic_prefix(msg.topic);
            let keys = msg.keys.as_deref().map(str::as_bytes);
            hash::for_each_index_key(prefix, Some(msg.uniq), keys, |h| key_hashes.push(h));
        }
        Some(Placed {
            tags_code: hash::tags_code(msg.tags),
            msg,
            size,
            key_hashes,
        })
    }

    /// The record of a plain message: born here (the born host is the store host), no
    /// transaction, reconsume count or prepared offset.
    fn record<'a>(
        &'a self,
        m: &'a Plain<'_>,
        phys: i64,
        queue_offset: i64,
        now: i64,
    ) -> layout::Record<'a> {
        layout::Record {
            queue_id: m.queue_id,
            flag: m.flag,
            queue_offset,
            phys,
            sys_flag: self.sys_flag,
            born_ts: m.born_ts,
            born_host: &self.store_host,
            store_ts: now,
            store_host: &self.store_host,
            reconsume: 0,
            prep_tx: 0,
            body: m.body,
            topic: m.topic,
            props_len: m.props.len(),
        }
    }
}
