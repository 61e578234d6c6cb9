//! Encoding a validated batch of messages straight into a mapped CommitLog segment.
//!
//! Python validates the batch and hands its columns over once as an [`EncodeBatch`]; the
//! per-message work then runs here with the GIL released: PROPERTIES lengths and record sizes,
//! ConsumeQueue tag codes, index key hashes in RocketMQ's order, and the records themselves,
//! body CRC included, written in place with no intermediate buffer.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffers::{disjoint, require_len, Bytes, Col, OutBytes, OutCol, Span, StrView, Strings};
use crate::guarded;
use crate::hash;
use crate::layout::{self, Writer};
use crate::owned::{Data, Owned};

const PROPERTY_SEPARATOR: u8 = 2;
const NAME_VALUE_SEPARATOR: u8 = 1;
const NAMED: [&[u8]; 3] = [b"KEYS", b"TAGS", b"UNIQ_KEY"];

/// The columns of one batch, borrowed from Python for the batch's lifetime.
///
/// Not thread-safe in Python terms: one batch belongs to the put that made it.
#[pyclass(module = "rocketstore.pipeline._native")]
pub struct EncodeBatch {
    n: usize,
    topics: Strings,
    topic_codes: Col<i32>,
    queue_ids: Col<i32>,
    // Columns a batch rarely carries are optional: absent means 0 for every row, so a batch
    // without them costs no per-row array at all.
    flags: Option<Col<i32>>,
    sys_flags: Col<i32>,
    reconsume: Option<Col<i32>>,
    prep_tx: Option<Col<i64>>,
    born_ts: Option<Col<i64>>,
    born_missing: Option<Bytes>,
    born_hosts: Strings,
    born_codes: Option<Col<i32>>,
    store_host: Vec<u8>,
    bodies: Strings,
    keys: Strings,
    tags: Strings,
    uniq: Strings,
    user_props: Option<Strings>,
}

/// The borrowed columns, `Send`, for the loops that run without the GIL.
#[derive(Clone, Copy)]
struct View<'a> {
    topics: StrView<'a>,
    topic_codes: &'a [i32],
    queue_ids: &'a [i32],
    flags: Option<&'a [i32]>,
    sys_flags: &'a [i32],
    reconsume: Option<&'a [i32]>,
    prep_tx: Option<&'a [i64]>,
    born_ts: Option<&'a [i64]>,
    born_missing: Option<&'a [u8]>,
    born_hosts: StrView<'a>,
    born_codes: Option<&'a [i32]>,
    store_host: &'a [u8],
    bodies: StrView<'a>,
    keys: StrView<'a>,
    tags: StrView<'a>,
    uniq: StrView<'a>,
    user_props: Option<StrView<'a>>,
}

impl View<'_> {
    fn topic(&self, i: usize) -> &[u8] {
        self.topics.get(self.topic_codes[i] as usize).unwrap_or(b"")
    }

    fn born_host(&self, i: usize) -> &[u8] {
        let code = self.born_codes.map_or(0, |c| c[i] as usize);
        self.born_hosts.get(code).unwrap_or(b"")
    }

    fn user(&self, i: usize) -> Option<&[u8]> {
        self.user_props
            .and_then(|u| u.get(i))
            .filter(|u| !u.is_empty())
    }

    /// The PROPERTIES field's parts in the order the store writes them: KEYS, TAGS, UNIQ_KEY,
    /// then the user's properties; absent parts are skipped and the rest joined by `\x02`.
    fn props_len(&self, i: usize) -> usize {
        let mut len = 0;
        let mut parts = 0;
        for (name, value) in NAMED.iter().zip([self.keys, self.tags, self.uniq]) {
            if let Some(v) = value.get(i) {
                len += name.len() + 1 + v.len();
                parts += 1;
            }
        }
        if let Some(u) = self.user(i) {
            len += u.len();
            parts += 1;
        }
        len + parts.max(1) - 1
    }

    fn write_props(&self, i: usize, w: &mut Writer<'_>) {
        let mut first = true;
        for (name, value) in NAMED.iter().zip([self.keys, self.tags, self.uniq]) {
            if let Some(v) = value.get(i) {
                if !first {
                    w.bytes(&[PROPERTY_SEPARATOR]);
                }
                first = false;
                w.bytes(name);
                w.bytes(&[NAME_VALUE_SEPARATOR]);
                w.bytes(v);
            }
        }
        if let Some(u) = self.user(i) {
            if !first {
                w.bytes(&[PROPERTY_SEPARATOR]);
            }
            w.bytes(u);
        }
    }

    fn record_size(&self, i: usize, props_len: usize) -> usize {
        layout::record_size(
            self.bodies.get(i).map_or(0, |b| b.len()),
            self.topic(i).len(),
            props_len,
            self.born_host(i).len(),
            self.store_host.len(),
        )
    }
}

impl EncodeBatch {
    fn view(&self) -> View<'_> {
        View {
            topics: self.topics.view(),
            topic_codes: self.topic_codes.get(),
            queue_ids: self.queue_ids.get(),
            flags: self.flags.as_ref().map(|c| c.get()),
            sys_flags: self.sys_flags.get(),
            reconsume: self.reconsume.as_ref().map(|c| c.get()),
            prep_tx: self.prep_tx.as_ref().map(|c| c.get()),
            born_ts: self.born_ts.as_ref().map(|c| c.get()),
            born_missing: self.born_missing.as_ref().map(|c| c.get()),
            born_hosts: self.born_hosts.view(),
            born_codes: self.born_codes.as_ref().map(|c| c.get()),
            store_host: &self.store_host,
            bodies: self.bodies.view(),
            keys: self.keys.view(),
            tags: self.tags.view(),
            uniq: self.uniq.view(),
            user_props: self.user_props.as_ref().map(|u| u.view()),
        }
    }
}

#[pymethods]
impl EncodeBatch {
    /// Borrow a validated batch's columns. Every per-row column has `n` rows; `topic_codes`
    /// and `born_codes` index the `topics` and `born_hosts` tables. `flags`, `reconsume`,
    /// `prep_tx` and `born_codes` may be None: 0 for every row; `born_ts` None: every message
    /// is born at the store time, as are rows `born_missing` marks. String columns are
    /// `(data, offsets, validity)` triples (see `rocketstore.pipeline.format.native.strings`).
    #[new]
    #[pyo3(signature = (
        *, n, topics, topic_codes, queue_ids, flags, sys_flags, reconsume, prep_tx, born_ts,
        born_missing, born_hosts, born_codes, store_host, bodies, keys, tags, uniq, user_props
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        n: usize,
        topics: &Bound<'_, PyAny>,
        topic_codes: &Bound<'_, PyAny>,
        queue_ids: &Bound<'_, PyAny>,
        flags: &Bound<'_, PyAny>,
        sys_flags: &Bound<'_, PyAny>,
        reconsume: &Bound<'_, PyAny>,
        prep_tx: &Bound<'_, PyAny>,
        born_ts: &Bound<'_, PyAny>,
        born_missing: &Bound<'_, PyAny>,
        born_hosts: &Bound<'_, PyAny>,
        born_codes: &Bound<'_, PyAny>,
        store_host: Vec<u8>,
        bodies: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        tags: &Bound<'_, PyAny>,
        uniq: &Bound<'_, PyAny>,
        user_props: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        guarded("EncodeBatch", || {
            let batch = EncodeBatch {
                n,
                topics: Strings::new(topics, "topics")?,
                topic_codes: Col::new(topic_codes, "topic_codes")?,
                queue_ids: Col::new(queue_ids, "queue_ids")?,
                flags: optional(flags, "flags")?,
                sys_flags: Col::new(sys_flags, "sys_flags")?,
                reconsume: optional(reconsume, "reconsume")?,
                prep_tx: optional(prep_tx, "prep_tx")?,
                born_ts: optional(born_ts, "born_ts")?,
                born_missing: if born_missing.is_none() {
                    None
                } else {
                    Some(Bytes::new(born_missing, "born_missing")?)
                },
                born_hosts: Strings::new(born_hosts, "born_hosts")?,
                born_codes: optional(born_codes, "born_codes")?,
                store_host,
                bodies: Strings::new(bodies, "bodies")?,
                keys: Strings::new(keys, "keys")?,
                tags: Strings::new(tags, "tags")?,
                uniq: Strings::new(uniq, "uniq")?,
                user_props: if user_props.is_none() {
                    None
                } else {
                    Some(Strings::new(user_props, "user_props")?)
                },
            };
            batch.check()?;
            Ok(batch)
        })
    }

    /// Fill `sizes` (int64, `n` rows) with each message's whole record size, and return how
    /// many messages have a PROPERTIES field longer than `max_props` bytes, and the first of
    /// them (-1 when none): such a record cannot be written, its length field is an int16.
    fn measure(
        &self,
        py: Python<'_>,
        sizes: &Bound<'_, PyAny>,
        max_props: usize,
    ) -> PyResult<(usize, i64)> {
        guarded("EncodeBatch.measure", || {
            self.measure_into(py, sizes, max_props)
        })
    }

    /// Fill `out` (int64, `n` rows) with each message's ConsumeQueue tagsCode.
    fn tags_codes(&self, py: Python<'_>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        guarded("EncodeBatch.tags_codes", || self.tags_codes_into(py, out))
    }

    /// Write records `lo..hi` back to back into `dest` from byte `dest_pos` (a segment's
    /// mapping). `phys`, `queue_offsets` and `sizes` are per-row int64 columns; the records
    /// must be contiguous in the log (`phys[i + 1] == phys[i] + sizes[i]`). Rows whose
    /// ``born_missing`` is set take ``store_ts`` as their born timestamp. Checks every bound
    /// (the batch's columns again, `dest` apart from every input, the rows, the sizes and
    /// offsets) before writing anything.
    #[allow(clippy::too_many_arguments)]
    fn encode(
        &self,
        py: Python<'_>,
        dest: &Bound<'_, PyAny>,
        dest_pos: usize,
        lo: usize,
        hi: usize,
        phys: &Bound<'_, PyAny>,
        queue_offsets: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        store_ts: i64,
    ) -> PyResult<()> {
        guarded("EncodeBatch.encode", || {
            let cols = (phys, queue_offsets, sizes);
            self.encode_into(py, dest, dest_pos, lo, hi, cols, store_ts)
        })
    }

    fn __len__(&self) -> usize {
        self.n
    }
}

type Cols<'a, 'py> = (
    &'a Bound<'py, PyAny>,
    &'a Bound<'py, PyAny>,
    &'a Bound<'py, PyAny>,
);

impl EncodeBatch {
    fn measure_into(
        &self,
        py: Python<'_>,
        sizes: &Bound<'_, PyAny>,
        max_props: usize,
    ) -> PyResult<(usize, i64)> {
        self.check()?;
        let mut sz = OutCol::<i64>::new(sizes, "sizes")?;
        disjoint(&[("sizes", sz.span())], &self.spans())?;
        let sz = sz.get();
        require_len("sizes", sz.len(), self.n)?;
        let v = self.view();
        Ok(py.detach(|| {
            let (mut bad, mut first) = (0usize, -1i64);
            for (i, size) in sz.iter_mut().enumerate() {
                let p = v.props_len(i);
                if p > max_props {
                    if bad == 0 {
                        first = i as i64;
                    }
                    bad += 1;
                }
                *size = v.record_size(i, p) as i64;
            }
            (bad, first)
        }))
    }

    fn tags_codes_into(&self, py: Python<'_>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check()?;
        let mut out = OutCol::<i64>::new(out, "tags_codes")?;
        disjoint(&[("tags_codes", out.span())], &self.spans())?;
        let out = out.get();
        require_len("tags_codes", out.len(), self.n)?;
        let tags = self.tags.view();
        py.detach(|| {
            for (i, o) in out.iter_mut().enumerate() {
                *o = hash::tags_code(tags.get(i));
            }
        });
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn encode_into(
        &self,
        py: Python<'_>,
        dest: &Bound<'_, PyAny>,
        dest_pos: usize,
        lo: usize,
        hi: usize,
        (phys, queue_offsets, sizes): Cols<'_, '_>,
        store_ts: i64,
    ) -> PyResult<()> {
        self.check()?;
        let mut dest = OutBytes::new(dest, "dest")?;
        let (phys, qo, sz) = (
            Col::<i64>::new(phys, "phys")?,
            Col::<i64>::new(queue_offsets, "queue_offsets")?,
            Col::<i64>::new(sizes, "sizes")?,
        );
        let mut inputs = self.spans();
        inputs.extend([
            ("phys", phys.span()),
            ("queue_offsets", qo.span()),
            ("sizes", sz.span()),
        ]);
        disjoint(&[("dest", dest.span())], &inputs)?;
        let (phys, qo, sz) = (phys.get(), qo.get(), sz.get());
        for (what, len) in [
            ("phys", phys.len()),
            ("queue_offsets", qo.len()),
            ("sizes", sz.len()),
        ] {
            require_len(what, len, self.n)?;
        }
        if lo > hi || hi > self.n {
            return Err(PyValueError::new_err(format!(
                "rows {lo}..{hi} outside 0..{}",
                self.n
            )));
        }
        let out = dest.get();
        let total = sz[lo..hi]
            .iter()
            .try_fold(0usize, |acc, &x| acc.checked_add(usize::try_from(x).ok()?))
            .ok_or_else(|| PyValueError::new_err("sizes: a negative size, or too many bytes"))?;
        if dest_pos
            .checked_add(total)
            .is_none_or(|end| end > out.len())
        {
            return Err(PyValueError::new_err(format!(
                "{total} bytes at {dest_pos} run past the segment's {} bytes",
                out.len()
            )));
        }
        for i in lo..hi.saturating_sub(1) {
            if phys[i].checked_add(sz[i]) != Some(phys[i + 1]) {
                return Err(PyValueError::new_err(format!(
                    "rows {i} and {}: records are not contiguous",
                    i + 1
                )));
            }
        }
        let v = self.view();
        let region = &mut out[dest_pos..dest_pos + total];
        py.detach(|| encode_run(&v, region, lo, hi, phys, qo, sz, store_ts))
    }

    /// The memory of every column the batch borrows, for [`disjoint`].
    fn spans(&self) -> Vec<(&'static str, Span)> {
        let mut out = Vec::new();
        for (name, s) in self.strings() {
            out.extend(s.spans(name));
        }
        for (name, c) in [
            ("topic_codes", Some(&self.topic_codes)),
            ("queue_ids", Some(&self.queue_ids)),
            ("flags", self.flags.as_ref()),
            ("sys_flags", Some(&self.sys_flags)),
            ("reconsume", self.reconsume.as_ref()),
            ("born_codes", self.born_codes.as_ref()),
        ] {
            out.extend(c.map(|c| (name, c.span())));
        }
        for (name, c) in [("prep_tx", &self.prep_tx), ("born_ts", &self.born_ts)] {
            out.extend(c.as_ref().map(|c| (name, c.span())));
        }
        out.extend(
            self.born_missing
                .as_ref()
                .map(|m| ("born_missing", m.span())),
        );
        out
    }

    fn strings(&self) -> impl Iterator<Item = (&'static str, &Strings)> {
        [
            ("topics", Some(&self.topics)),
            ("born_hosts", Some(&self.born_hosts)),
            ("bodies", Some(&self.bodies)),
            ("keys", Some(&self.keys)),
            ("tags", Some(&self.tags)),
            ("uniq", Some(&self.uniq)),
            ("user_props", self.user_props.as_ref()),
        ]
        .into_iter()
        .filter_map(|(name, s)| s.map(|s| (name, s)))
    }
}

/// A column that may be None (then every row is 0).
fn optional<T: pyo3::buffer::Element>(
    obj: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<Option<Col<T>>> {
    if obj.is_none() {
        Ok(None)
    } else {
        Col::new(obj, what).map(Some)
    }
}

impl EncodeBatch {
    /// Every bound the row look-ups rely on. Run when the batch is made and again before
    /// each use: the columns are borrowed, and Python code may change them in between.
    fn check(&self) -> PyResult<()> {
        for (name, s) in self.strings() {
            s.recheck(name)?;
        }
        let n = self.n;
        let v = self.view();
        let rows = [
            ("topic_codes", Some(v.topic_codes.len())),
            ("queue_ids", Some(v.queue_ids.len())),
            ("flags", v.flags.map(<[i32]>::len)),
            ("sys_flags", Some(v.sys_flags.len())),
            ("reconsume", v.reconsume.map(<[i32]>::len)),
            ("prep_tx", v.prep_tx.map(<[i64]>::len)),
            ("born_ts", v.born_ts.map(<[i64]>::len)),
            ("born_codes", v.born_codes.map(<[i32]>::len)),
            ("born_missing", v.born_missing.map(<[u8]>::len)),
            ("user_props", v.user_props.map(|u| u.len())),
            ("bodies", Some(v.bodies.len())),
            ("keys", Some(v.keys.len())),
            ("tags", Some(v.tags.len())),
            ("uniq", Some(v.uniq.len())),
        ];
        for (what, len) in rows {
            if let Some(len) = len {
                require_len(what, len, n)?;
            }
        }
        let tables = [
            ("topic_codes", Some(v.topic_codes), v.topics.len()),
            ("born_codes", v.born_codes, v.born_hosts.len()),
        ];
        for (what, codes, len) in tables {
            let codes = codes.unwrap_or(&[0]);
            if codes.iter().any(|&c| c < 0 || c as usize >= len) {
                return Err(PyValueError::new_err(format!(
                    "{what}: a code outside 0..{len}"
                )));
            }
        }
        let hosts = self.born_hosts.view();
        for k in 0..hosts.len() {
            if !matches!(hosts.get(k).map(|h| h.len()), Some(8) | Some(20)) {
                return Err(PyValueError::new_err(
                    "born_hosts: each must be 8 or 20 bytes",
                ));
            }
        }
        if !matches!(self.store_host.len(), 8 | 20) {
            return Err(PyValueError::new_err("store_host must be 8 or 20 bytes"));
        }
        let topics = self.topics.view();
        for k in 0..topics.len() {
            if !matches!(topics.get(k).map(|t| t.len()), Some(1..=127)) {
                return Err(PyValueError::new_err("topics: each must be 1-127 bytes"));
            }
        }
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
fn encode_run(
    v: &View<'_>,
    region: &mut [u8],
    lo: usize,
    hi: usize,
    phys: &[i64],
    queue_offsets: &[i64],
    sizes: &[i64],
    store_ts: i64,
) -> PyResult<()> {
    let mut at = 0usize;
    for i in lo..hi {
        let size = sizes[i] as usize;
        let props_len = v.props_len(i);
        if v.record_size(i, props_len) != size || props_len > i16::MAX as usize {
            return Err(PyValueError::new_err(format!(
                "row {i}: size {size} does not match the record's fields"
            )));
        }
        let born_ts = match (v.born_ts, v.born_missing) {
            (Some(_), Some(m)) if m[i] != 0 => store_ts,
            (Some(c), _) => c[i],
            (None, _) => store_ts,
        };
        let record = layout::Record {
            queue_id: v.queue_ids[i],
            flag: v.flags.map_or(0, |c| c[i]),
            queue_offset: queue_offsets[i],
            phys: phys[i],
            sys_flag: v.sys_flags[i],
            born_ts,
            born_host: v.born_host(i),
            store_ts,
            store_host: v.store_host,
            reconsume: v.reconsume.map_or(0, |c| c[i]),
            prep_tx: v.prep_tx.map_or(0, |c| c[i]),
            body: v.bodies.get(i).unwrap_or(b""),
            topic: v.topic(i),
            props_len,
        };
        record.write(&mut region[at..at + size], |w| v.write_props(i, w));
        at += size;
    }
    Ok(())
}

/// BODYCRC of each body in `bodies` (a `(data, offsets, validity)` triple) into `out` (int32).
#[pyfunction]
pub fn body_crcs(
    py: Python<'_>,
    bodies: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    guarded("body_crcs", || {
        let bodies = Strings::new(bodies, "bodies")?;
        let mut out = OutCol::<i32>::new(out, "out")?;
        disjoint(&[("out", out.span())], &bodies.spans("bodies"))?;
        let (b, o) = (bodies.view(), out.get());
        require_len("out", o.len(), b.len())?;
        py.detach(|| {
            for (i, slot) in o.iter_mut().enumerate() {
                *slot = hash::body_crc(b.get(i).unwrap_or(b""));
            }
        });
        Ok(())
    })
}

/// Java `String.hashCode` of each string (0 for null) into `out` (int32).
#[pyfunction]
pub fn java_hashes(
    py: Python<'_>,
    strings: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    guarded("java_hashes", || {
        let strings = Strings::new(strings, "strings")?;
        let mut out = OutCol::<i32>::new(out, "out")?;
        disjoint(&[("out", out.span())], &strings.spans("strings"))?;
        let (s, o) = (strings.view(), out.get());
        require_len("out", o.len(), s.len())?;
        py.detach(|| {
            for (i, slot) in o.iter_mut().enumerate() {
                *slot = s.get(i).map_or(0, hash::java_hash);
            }
        });
        Ok(())
    })
}

/// Index entries in RocketMQ's order (per message: UNIQ_KEY, then each KEYS token; ROLLBACK
/// transactions get none), as two native-endian buffers handed over without a copy: each
/// entry's message row (int64) and key hash (int32). `topics` is a table that `topic_codes`
/// index; `uniq` and `keys` are string columns (KEYS space-separated).
#[pyfunction]
pub fn index_keys(
    py: Python<'_>,
    topics: &Bound<'_, PyAny>,
    topic_codes: &Bound<'_, PyAny>,
    uniq: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    sys_flags: &Bound<'_, PyAny>,
) -> PyResult<(Owned, Owned)> {
    guarded("index_keys", || {
        let (topics, uniq, keys) = (
            Strings::new(topics, "topics")?,
            Strings::new(uniq, "uniq")?,
            Strings::new(keys, "keys")?,
        );
        let (codes, flags) = (
            Col::<i32>::new(topic_codes, "topic_codes")?,
            Col::<i32>::new(sys_flags, "sys_flags")?,
        );
        let (t, u, k, c, f) = (
            topics.view(),
            uniq.view(),
            keys.view(),
            codes.get(),
            flags.get(),
        );
        for (what, len) in [("uniq", u.len()), ("keys", k.len()), ("sys_flags", f.len())] {
            require_len(what, len, c.len())?;
        }
        if c.iter().any(|&x| x < 0 || x as usize >= t.len()) {
            return Err(PyValueError::new_err(
                "topic_codes: a code outside the topic table",
            ));
        }
        let (rows, hashes) = py.detach(|| {
            let prefixes: Vec<i32> = (0..t.len())
                .map(|j| hash::topic_prefix(t.get(j).unwrap_or(b"")))
                .collect();
            // One entry per message (its UNIQ_KEY) is the usual lower bound; KEYS add more.
            let mut rows = Vec::with_capacity(c.len());
            let mut hashes = Vec::with_capacity(c.len());
            for i in 0..c.len() {
                if !layout::indexed(f[i]) {
                    continue;
                }
                hash::for_each_index_key(prefixes[c[i] as usize], u.get(i), k.get(i), |h| {
                    rows.push(i as i64);
                    hashes.push(h);
                });
            }
            (rows, hashes)
        });
        Ok((Owned::new(Data::I64(rows)), Owned::new(Data::I32(hashes))))
    })
}

/// Fill `out` with message ids in the layout of RocketMQ's `MessageClientIDSetter`, 32
/// uppercase hex digits each, back to back: the 10-byte `prefix`, then the low 48 bits of
/// `start + i` big-endian, for `i` in `0..out.len() / 32`.
#[pyfunction]
pub fn uniq_ids(py: Python<'_>, prefix: &[u8], start: u64, out: &Bound<'_, PyAny>) -> PyResult<()> {
    guarded("uniq_ids", || {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        if prefix.len() != 10 {
            return Err(PyValueError::new_err("prefix must be 10 bytes"));
        }
        let mut out = OutBytes::new(out, "out")?;
        let out = out.get();
        if out.len() % 32 != 0 {
            return Err(PyValueError::new_err("out must hold whole ids of 32 bytes"));
        }
        let mut head = [0u8; 20];
        for (pair, b) in head.chunks_exact_mut(2).zip(prefix) {
            pair[0] = HEX[(b >> 4) as usize];
            pair[1] = HEX[(b & 15) as usize];
        }
        py.detach(|| {
            for (i, id) in out.chunks_exact_mut(32).enumerate() {
                id[..20].copy_from_slice(&head);
                let seq = start.wrapping_add(i as u64) & ((1 << 48) - 1);
                for (j, digit) in id[20..].iter_mut().enumerate() {
                    *digit = HEX[((seq >> (44 - 4 * j)) & 15) as usize];
                }
            }
        });
        Ok(())
    })
}
