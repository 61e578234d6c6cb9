//! Re-dispatch from the CommitLog in one pass: a segment's records walked once, each record's
//! ConsumeQueue unit appended to its queue's run of units (20 bytes, big-endian, as the file
//! holds them) and its index entries (hash, offset, store time) to three flat columns. Python
//! writes each run into its queue's files and the entries through `index_put`; no per-record
//! columns are built on the way.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::prelude::*;

use crate::guarded;
use pyo3::types::{PyBytes, PyDict};

use crate::buffers::Bytes;
use crate::hash;
use crate::layout::{self, in_consume_queue, indexed};
use crate::owned::{Data, Owned, Recycled};
use crate::scan::{walk_records, Topics};

/// Hashes a (topic code, queue id) key, already a well-mixed small integer, by one multiply.
#[derive(Default)]
struct QueueKeyHasher(u64);

impl Hasher for QueueKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// One queue's units from this segment: the first unit's queue offset, then the units in
/// record order (a queue's records follow each other in its offsets).
struct Run {
    topic: usize,
    queue_id: i32,
    first: i64,
    units: Vec<u8>,
}

#[derive(Default)]
struct Dispatched {
    runs: Vec<Run>,
    hashes: Vec<i32>,
    phys: Vec<i64>,
    times: Vec<i64>,
    count: usize,
    last_unit_ts: i64,
}

/// Walk the records of one segment's bytes `buf` from `start` (relative, a record boundary)
/// that lie before physical offset `end_phys`, as `walk` does (`limit` bytes trusted, `base`
/// the segment's offset, the body CRC checked when `check_crc`), and derive what dispatch
/// writes: RocketMQ's rules, so PREPARED and ROLLBACK records get no unit and ROLLBACK records
/// no index entries; index keys are the UNIQ_KEY, then each KEYS token. With `index` false no
/// entries are derived.
///
/// Returns a dict: `runs`, a list of `(topic bytes, queue id, first queue offset, units)` in
/// order of each queue's first record; `hashes` (int32), `phys` and `times` (int64), the index
/// entries in order; `count` records walked; `last_unit_ts`, the store time of the last record
/// that got a unit (-1 if none); and `end`, `stop`, `reason` as `walk` gives them.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn dispatch_walk<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    start: usize,
    limit: usize,
    base: i64,
    end_phys: i64,
    check_crc: bool,
    index: bool,
) -> PyResult<Bound<'py, PyDict>> {
    guarded("dispatch_walk", || {
        let buf = Bytes::new(buf, "buf")?;
        let data = buf.get();
        let limit = limit.min(data.len());
        let (d, topics, stop) = py.detach(|| {
            let mut d = Dispatched {
                last_unit_ts: -1,
                ..Default::default()
            };
            if index {
                let guess = (limit.saturating_sub(start) / 128).min(1 << 22);
                (d.hashes, d.phys, d.times) =
                    (i32::take(guess), i64::take(guess), i64::take(guess));
            }
            let mut topics = Topics::default();
            let mut queues: HashMap<u64, usize, BuildHasherDefault<QueueKeyHasher>> =
                HashMap::default();
            let stop = walk_records(
                data,
                start,
                limit,
                base,
                check_crc,
                usize::MAX,
                end_phys,
                |rel, r| {
                    let phys = base + rel as i64;
                    let (code, prefix) = topics.code(r.topic);
                    let reserved = hash::reserved(r.props);
                    if in_consume_queue(r.sys_flag) {
                        let key = (code as u64) << 32 | r.queue_id as u32 as u64;
                        let at = *queues.entry(key).or_insert_with(|| {
                            d.runs.push(Run {
                                topic: code,
                                queue_id: r.queue_id,
                                first: r.queue_offset,
                                units: u8::take(1 << 16),
                            });
                            d.runs.len() - 1
                        });
                        d.runs[at].units.extend_from_slice(&layout::unit(
                            phys,
                            r.size as i32,
                            hash::tags_code(reserved.tags),
                        ));
                        d.last_unit_ts = r.store_ts;
                    }
                    if index && indexed(r.sys_flag) {
                        hash::for_each_index_key(prefix, reserved.uniq, reserved.keys, |h| {
                            d.hashes.push(h);
                            d.phys.push(phys);
                            d.times.push(r.store_ts);
                        });
                    }
                    d.count += 1;
                },
            );
            (d, topics.names, stop)
        });
        let out = PyDict::new(py);
        let mut runs = Vec::with_capacity(d.runs.len());
        for run in d.runs {
            let units = Bound::new(py, Owned::new(Data::U8(run.units)))?;
            runs.push((
                PyBytes::new(py, topics[run.topic]),
                run.queue_id,
                run.first,
                units,
            ));
        }
        out.set_item("runs", runs)?;
        out.set_item("hashes", Owned::new(Data::I32(d.hashes)))?;
        out.set_item("phys", Owned::new(Data::I64(d.phys)))?;
        out.set_item("times", Owned::new(Data::I64(d.times)))?;
        out.set_item("count", d.count)?;
        out.set_item("last_unit_ts", d.last_unit_ts)?;
        stop.put_into(&out)?;
        Ok(out)
    })
}
