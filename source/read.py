"""Reading a partition into Arrow record batches: a queue range, or a key look-up.

Runs on executors, inside ``read()`` of a pickled reader: everything here opens its own files
and closes them before returning (generators close them when exhausted or closed). A partition
reads:

1. the ConsumeQueue units ``[start, end)`` of its queue (``pread``, in chunks of
   :data:`CHUNK_UNITS`), checked non-empty;
2. drops units whose tagsCode is not a subscribed tag's hash (no CommitLog read for them);
3. decodes the records the rest point at, segment by segment (:mod:`source.decode`), checking
   each is the unit's (topic, queue, queue offset) and intact (CRC);
4. builds the columns (properties map, keys, tags) with Arrow compute, keeps the messages whose
   real tag is subscribed, decodes avro/json bodies if asked, and yields one
   ``pyarrow.RecordBatch`` per chunk, of exactly the schema Spark declared.

Files retention deleted after planning (a ConsumeQueue file or a CommitLog segment) are data
loss: :class:`~source.errors.DataLossError` with ``failOnDataLoss=true``, else the messages are
skipped and a warning logged.

Thread-safety: no shared state; each call works on its own files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import bodyformat, record
from pipeline.config import CQ_UNIT_SIZE, StoreConfig
from pipeline.consumequeue import PRE_BLANK_SIZE, UNIT_DTYPE
from pipeline.errors import ConfigError, CorruptRecordError, StoreError
from pipeline.index_service import IndexService
from pipeline.indexfile import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE
from pipeline.mapped_file import segment_name
from pipeline.root import StoreRoot
from pipeline.subscription import Subscription
from source.brokerview import list_segments
from source.decode import (
    Records,
    binary_offsets,
    constant_strings,
    decode_segment,
    record_starts,
    slices,
)
from source.errors import DataLossError
from source.planning import KeyRange, QueueRange

log = logging.getLogger("rocketstore.source")

CHUNK_UNITS = 1 << 16  # units per record batch: bounds memory, amortises the fixed costs
CHUNK_BYTES = 64 << 20
DEFAULT_INDEX_RATIO = 4  # RocketMQ's default maxIndexNum / maxHashSlotNum

PROP_KEYS = record.PROPERTY_KEYS
PROP_TAGS = record.PROPERTY_TAGS


@dataclasses.dataclass(frozen=True)
class ReadContext:
    """What every partition of a query reads with (picklable; built on the driver)."""

    schema: pa.Schema
    root: str
    sub_expression: str = "*"
    fail_on_data_loss: bool = True
    body_format: str = "binary"
    body_schema: bodyformat.BodySchema | None = None
    config: StoreConfig | None = None
    chunk_units: int = CHUNK_UNITS

    @property
    def subscription(self) -> Subscription:
        return Subscription.parse(self.sub_expression)


# -- files ----------------------------------------------------------------------------------------


class _Segment:
    """A CommitLog segment mapped read-only, as numpy and Arrow views of the same bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_RDONLY)
        try:
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)  # the mapping keeps the file; retention may unlink it meanwhile
        self.data: npt.NDArray[np.uint8] | None = np.frombuffer(self._mm, dtype=np.uint8)
        self.buffer: pa.Buffer | None = pa.py_buffer(self._mm)

    def close(self) -> None:
        self.data = None
        self.buffer = None
        # A view that escaped (it should not) keeps the mapping until it is collected.
        with contextlib.suppress(BufferError):
            self._mm.close()


class _SegmentCache:
    """The segments one partition read touches, mapped once each, closed together."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        listed = list_segments(directory)
        self.segment_size = listed[0][1].stat().st_size if listed else 0
        self.min_offset = listed[0][0] if listed else 0
        self._open: dict[int, _Segment | None] = {}

    def get(self, base: int) -> _Segment | None:
        """The segment at ``base``, or None when it does not exist (deleted by retention)."""
        if base not in self._open:
            try:
                self._open[base] = _Segment(self.directory / segment_name(base))
            except FileNotFoundError:
                self._open[base] = None
        return self._open[base]

    def close(self) -> None:
        for seg in self._open.values():
            if seg is not None:
                seg.close()
        self._open.clear()


def _read_units(
    cq_dir: Path, start: int, end: int
) -> tuple[npt.NDArray[np.void], list[tuple[int, int]]]:
    """Units ``[start, end)`` of a ConsumeQueue and the sub-ranges whose files are gone."""
    listed = dict(list_segments(cq_dir))
    file_size = next(iter(listed.values())).stat().st_size if listed else 0
    out = np.zeros(end - start, dtype=UNIT_DTYPE)
    missing: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        if file_size <= 0:
            missing.append((pos, end))
            break
        per_file = file_size // CQ_UNIT_SIZE
        base = (pos * CQ_UNIT_SIZE // file_size) * file_size
        stop = min(end, base // CQ_UNIT_SIZE + per_file)
        path = listed.get(base)
        raw = b""
        if path is not None:
            try:
                with open(path, "rb") as f:
                    raw = os.pread(
                        f.fileno(), (stop - pos) * CQ_UNIT_SIZE, pos * CQ_UNIT_SIZE - base
                    )
            except FileNotFoundError:
                path = None
        if path is None:
            missing.append((pos, stop))
        else:
            got = np.frombuffer(raw, dtype=UNIT_DTYPE, count=len(raw) // CQ_UNIT_SIZE)
            out[pos - start : pos - start + len(got)] = got
        pos = stop
    return out, missing


def _unit_location(cq_dir: Path, queue_offset: int) -> tuple[str, int]:
    listed = list_segments(cq_dir)
    if not listed:
        return str(cq_dir), queue_offset * CQ_UNIT_SIZE
    size = listed[0][1].stat().st_size
    base = (queue_offset * CQ_UNIT_SIZE // size) * size
    return str(cq_dir / segment_name(base)), queue_offset * CQ_UNIT_SIZE - base


# -- columns --------------------------------------------------------------------------------------


def _utf8(arr: pa.Array) -> pa.Array:
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        # RocketMQ decodes property bytes leniently; so do we, for the (rare) batch that needs it.
        return pa.array(
            [None if v is None else v.decode("utf-8", errors="replace") for v in arr.to_pylist()],
            pa.string(),
        )


@dataclasses.dataclass
class Properties:
    """The parsed properties of ``n`` messages: names, values and each pair's message."""

    n: int
    names: pa.Array
    values: pa.Array
    parent: npt.NDArray[np.int64]

    @classmethod
    def parse(cls, raw: pa.Array) -> Properties:
        """Split ``name\x01value\x02...`` for every message; pairs without ``\x01`` are
        skipped, as RocketMQ's ``string2messageProperties`` skips them.

        Works on the concatenated bytes with numpy: the separators' positions give every
        pair's name and value range, which :func:`~source.decode.slices` copies out.
        """
        n = len(raw)
        offsets = binary_offsets(raw).astype(np.int64)
        data_buf = raw.buffers()[2] or pa.py_buffer(b"")
        data = np.frombuffer(data_buf, dtype=np.uint8, count=int(offsets[-1]))
        items = np.flatnonzero(data == ord(record.PROPERTY_SEPARATOR))
        pairs = np.flatnonzero(data == ord(record.NAME_VALUE_SEPARATOR))
        # Items run from a message's start or just after a \x02 to the next \x02 or the
        # message's end; both lists are merges of two sorted runs.
        nonempty = offsets[1:] > offsets[:-1]
        starts = np.sort(np.concatenate((offsets[:-1][nonempty], items + 1)), kind="stable")
        ends = np.sort(np.concatenate((offsets[1:][nonempty], items)), kind="stable")
        first = np.searchsorted(pairs, starts)
        sep = pairs[np.minimum(first, max(len(pairs) - 1, 0))] if len(pairs) else starts
        whole = (first < len(pairs)) & (sep < ends)
        starts, ends, sep = starts[whole], ends[whole], sep[whole]
        parent = np.searchsorted(offsets, starts, side="right") - 1
        names = _utf8(slices(data_buf, starts, sep))
        values = _utf8(slices(data_buf, sep + 1, ends))
        return cls(n, names, values, parent.astype(np.int64))

    def get(self, name: str) -> pa.Array:
        """The value of property ``name`` per message (null where absent; the last wins)."""
        mask = np.asarray(pc.equal(self.names, name))
        hits = np.flatnonzero(mask)
        pos = np.full(self.n, -1, dtype=np.int64)
        pos[self.parent[hits]] = hits
        return self.values.take(pa.array(pos, mask=pos < 0))

    def as_map(self, map_type: pa.DataType) -> pa.Array:
        counts = np.bincount(self.parent, minlength=self.n)
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
        return pa.MapArray.from_arrays(pa.array(offsets), self.names, self.values, type=map_type)


def split_keys(keys: pa.Array, list_type: pa.DataType) -> pa.Array:
    """KEYS values (space-separated) as lists without empty tokens; null stays null."""
    parts = pc.split_pattern(keys.fill_null(""), record.KEY_SEPARATOR)
    flat = parts.flatten()
    parent = np.asarray(pc.list_parent_indices(parts), dtype=np.int64)
    keep = np.asarray(pc.not_equal(flat, "")).astype(bool)
    counts = np.bincount(parent[keep], minlength=len(keys))
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    return pa.ListArray.from_arrays(
        pa.array(offsets), flat.filter(pa.array(keep)), type=list_type, mask=keys.is_null()
    )


def _timestamps(ms: npt.NDArray[np.int64], t: pa.DataType) -> pa.Array:
    return pa.array(ms * 1000, pa.int64()).view(t) if t.unit == "us" else pa.array(ms, t)


class BatchBuilder:
    """Turns decoded records into record batches of the context's schema."""

    def __init__(self, ctx: ReadContext, broker: str, where: Callable[[int], str]) -> None:
        self.ctx = ctx
        self.broker = broker
        self.where = where
        self.sub = ctx.subscription
        self._schemas: dict[str, bodyformat.BodySchema] = {}

    def _load_schema(self, fingerprint: str) -> bodyformat.BodySchema:
        got = self._schemas.get(fingerprint)
        if got is None:
            doc = StoreRoot(self.ctx.root).load_schema(fingerprint)
            got = self._schemas[fingerprint] = bodyformat.BodySchema.from_document(doc)
        return got

    def build(self, recs: Records, topic: str) -> pa.RecordBatch | None:
        props = Properties.parse(recs.props)
        tags = props.get(PROP_TAGS)
        if not self.sub.matches_all:
            assert self.sub.tags is not None
            wanted = pc.is_in(tags, value_set=pa.array(sorted(self.sub.tags), pa.string()))
            keep = np.asarray(wanted.fill_null(False))
            if not keep.all():
                recs = recs.take(keep)
                props = Properties.parse(recs.props)
                tags = props.get(PROP_TAGS)
        n = len(recs)
        if n == 0:
            return None
        schema = self.ctx.schema
        cols: dict[str, pa.Array] = {
            "topic": constant_strings(topic, n),
            "brokerName": constant_strings(self.broker, n),
            "queueId": pa.array(recs.queue_id, pa.int32()),
            "queueOffset": pa.array(recs.queue_offset, pa.int64()),
            "commitLogOffset": pa.array(recs.phys, pa.int64()),
            "msgId": recs.msg_id,
            "keys": split_keys(props.get(PROP_KEYS), schema.field("keys").type),
            "tags": tags,
            "properties": props.as_map(schema.field("properties").type),
            "bornTimestamp": _timestamps(recs.born_ts, schema.field("bornTimestamp").type),
            "storeTimestamp": _timestamps(recs.store_ts, schema.field("storeTimestamp").type),
            "bornHost": recs.born_host,
            "storeHost": recs.store_host,
            "flag": pa.array(recs.flag, pa.int32()),
            "sysFlag": pa.array(recs.sys_flag, pa.int32()),
            "reconsumeTimes": pa.array(recs.reconsume, pa.int32()),
        }
        if self.ctx.body_format == "binary" or self.ctx.body_schema is None:
            cols["body"] = recs.body
        else:
            cols.update(self._decode_bodies(recs, props))
        return pa.RecordBatch.from_arrays([cols[name] for name in schema.names], schema=schema)

    def _decode_bodies(self, recs: Records, props: Properties) -> dict[str, pa.Array]:
        reader = self.ctx.body_schema
        assert reader is not None
        fingerprints = props.get(bodyformat.SCHEMA_PROPERTY).to_pylist()
        phys = recs.phys

        def where(i: int) -> tuple[str, int]:
            return f"{self.where(int(phys[i]))} ({self.broker})", int(phys[i])

        table = bodyformat.decode_bodies(
            recs.body.to_pylist(),
            fingerprints,
            self.ctx.body_format,
            reader,
            self._load_schema,
            where,
        )
        out: dict[str, pa.Array] = {}
        for name in reader.arrow_schema.names:
            target = self.ctx.schema.field(name).type
            out[name] = table.column(name).combine_chunks().cast(target)
        return out


# -- queue ranges ---------------------------------------------------------------------------------


def read_queue_range(rng: QueueRange, ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """The messages of one partition (see the module docstring), as record batches."""
    broker = Path(rng.broker_path)
    cq_dir = broker / "consumequeue" / rng.topic / str(rng.queue_id)
    segments = _SegmentCache(broker / "commitlog")
    builder = BatchBuilder(ctx, rng.broker, lambda phys: str(_segment_path(segments, phys)))
    sub = ctx.subscription
    topic_bytes = rng.topic.encode("utf-8")
    try:
        pos = rng.start
        while pos < rng.end:
            stop = min(rng.end, pos + ctx.chunk_units)
            units, missing = _read_units(cq_dir, pos, stop)
            _lost(ctx, rng, [(a, b, "its ConsumeQueue file was deleted") for a, b in missing])
            offsets = np.arange(pos, stop, dtype=np.int64)
            size = units["size"].astype(np.int64)
            phys = units["offset"].astype(np.int64)
            gone = np.zeros(len(units), dtype=bool)
            for a, b in missing:
                gone[a - pos : b - pos] = True
            empty = ~gone & ((size <= 0) | (phys < 0))
            if empty.any():
                i = int(offsets[np.flatnonzero(empty)[0]])
                path, at = _unit_location(cq_dir, i)
                raise CorruptRecordError(
                    path, at, f"unit of queue offset {i} is empty, but the query was offered it"
                )
            pre_blank = size == PRE_BLANK_SIZE
            expired = ~gone & ~pre_blank & (phys < segments.min_offset)
            want = (
                ~gone & ~pre_blank & ~expired & sub.hash_filter(units["tags_code"].astype(np.int64))
            )
            parts, lost = _decode_units(
                segments, phys[want], size[want], offsets[want], rng, cq_dir, topic_bytes
            )
            lost_ranges = _runs(offsets[expired]) + _runs(lost)
            _lost(ctx, rng, [(a, b, "its CommitLog segment was deleted") for a, b in lost_ranges])
            if parts:
                batch = builder.build(Records.concat(parts), rng.topic)
                if batch is not None:
                    yield batch
            pos = stop
    finally:
        segments.close()


def _segment_path(segments: _SegmentCache, phys: int) -> Path:
    size = segments.segment_size or 1
    return segments.directory / segment_name(phys - phys % size)


def _runs(offsets: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted offsets as ``[a, b)`` ranges."""
    if len(offsets) == 0:
        return []
    breaks = np.flatnonzero(np.diff(offsets) != 1)
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks, [len(offsets) - 1]))
    return [(int(offsets[a]), int(offsets[b]) + 1) for a, b in zip(starts, ends, strict=True)]


def _lost(ctx: ReadContext, rng: QueueRange, ranges: list[tuple[int, int, str]]) -> None:
    if not ranges:
        return
    where = f"{rng.topic}/{rng.broker}/{rng.queue_id}"
    text = "; ".join(f"offsets [{a}, {b}) ({b - a} messages): {why}" for a, b, why in ranges)
    if ctx.fail_on_data_loss:
        raise DataLossError(
            f"{where}: messages the query had not read were deleted by retention while it read "
            f"them: {text}. Set failOnDataLoss=false to skip them"
        )
    log.warning("failOnDataLoss=false: %s: skipping %s", where, text)


def _decode_units(
    segments: _SegmentCache,
    phys: npt.NDArray[np.int64],
    size: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    rng: QueueRange,
    cq_dir: Path,
    topic: bytes,
) -> tuple[list[Records], npt.NDArray[np.int64]]:
    """Records of the given units, checked to be theirs; and the offsets whose segment is gone."""
    parts: list[Records] = []
    lost: list[npt.NDArray[np.int64]] = []
    if len(phys) == 0:
        return parts, offsets[:0]
    if segments.segment_size == 0:
        return parts, offsets  # the CommitLog has no segment left at all
    seg_size = segments.segment_size
    bases = phys - phys % seg_size
    cuts = np.flatnonzero(np.diff(bases)) + 1
    for idx in np.split(np.arange(len(phys)), cuts):
        base = int(bases[idx[0]])
        seg = segments.get(base)
        if seg is None or seg.data is None or seg.buffer is None:
            lost.append(offsets[idx])
            continue
        recs = decode_segment(
            seg.data,
            seg.buffer,
            phys[idx] - base,
            base=base,
            path=str(seg.path),
            topic=topic,
            sizes=size[idx],
        )
        _check_owner(recs, rng, offsets[idx], cq_dir)
        parts.append(recs)
    return parts, np.concatenate(lost) if lost else offsets[:0]


def _check_owner(
    recs: Records,
    rng: QueueRange,
    offsets: npt.NDArray[np.int64],
    cq_dir: Path,
) -> None:
    """Each record must be its unit's: a unit pointing elsewhere is the ConsumeQueue's fault."""
    wrong = (recs.queue_id != rng.queue_id) | (recs.queue_offset != offsets)
    wrong |= ~recs.topic_ok
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        path, at = _unit_location(cq_dir, int(offsets[i]))
        other = "" if recs.topic_ok[i] else "another topic's "
        raise CorruptRecordError(
            path,
            at,
            f"unit {int(offsets[i])} of {rng.topic}/{rng.queue_id} points at CommitLog offset "
            f"{int(recs.phys[i])}, whose record is {other}queue {int(recs.queue_id[i])} offset "
            f"{int(recs.queue_offset[i])}",
        )


# -- key look-ups ---------------------------------------------------------------------------------


def index_geometry(index_dir: Path, config: StoreConfig | None) -> tuple[int, int] | None:
    """(maxHashSlotNum, maxIndexNum) of a broker's IndexFiles: the configuration's when its
    IndexFile size is the files' (the files are the truth for a reader), else from the file
    size, assuming RocketMQ's 1:4 ratio of slots to entries."""
    files = (
        sorted(p for p in index_dir.iterdir() if p.is_file() and p.name.isdigit())
        if index_dir.is_dir()
        else []
    )
    if not files:
        return None
    size = files[0].stat().st_size
    if config is not None and config.index_file_size == size:
        return config.max_hash_slot_num, config.max_index_num
    per_slot = SLOT_SIZE + DEFAULT_INDEX_RATIO * ENTRY_SIZE
    if (size - HEADER_SIZE) % per_slot:
        raise ConfigError(
            f"{files[0]}: IndexFile of {size} bytes fits neither the store settings (from "
            f"{config.origin if config else 'none given'}) nor RocketMQ's default 1:4 slots to "
            "entries; set option config to the store's configuration file (maxHashSlotNum, "
            "maxIndexNum)"
        )
    slots = (size - HEADER_SIZE) // per_slot
    return slots, slots * DEFAULT_INDEX_RATIO


def read_key(kr: KeyRange, ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """Messages of ``kr.topic`` on one broker whose KEYS or UNIQ_KEY is ``kr.key``, stored in
    ``[kr.begin, kr.end]``, as a consumer would see them (not PREPARED or ROLLBACK
    transaction halves), in CommitLog order. Hash collisions are never returned."""
    broker = Path(kr.broker_path)
    geometry = index_geometry(broker / "index", ctx.config)
    if geometry is None:
        if list_segments(broker / "commitlog"):
            raise StoreError(
                f"{broker / 'index'}: no IndexFiles, so option key cannot be looked up on "
                f"broker {kr.broker} (was it written with messageIndexEnable=false?)"
            )
        return  # an empty broker
    index = IndexService(
        broker / "index", geometry[0], geometry[1], read_only=True, clock_ms=lambda: 0
    )
    try:
        index.load()
        candidates = np.unique(
            np.fromiter(index.candidates(kr.topic, kr.key, kr.begin, kr.end), dtype=np.int64)
        )
    except StoreError as exc:
        raise StoreError(f"{broker / 'index'}: cannot read the key index ({exc})") from exc
    finally:
        index.close()
    segments = _SegmentCache(broker / "commitlog")
    builder = BatchBuilder(ctx, kr.broker, lambda phys: str(_segment_path(segments, phys)))
    try:
        parts: list[Records] = []
        live = (
            candidates[candidates >= segments.min_offset]
            if segments.segment_size
            else candidates[:0]
        )
        bases = live - live % max(segments.segment_size, 1)
        for base in np.unique(bases).tolist():
            seg = segments.get(base)
            if seg is None or seg.data is None or seg.buffer is None:
                continue
            rel = live[bases == base] - base
            rel = rel[record_starts(seg.data, rel, base)]
            recs = decode_segment(
                seg.data, seg.buffer, rel, base=base, path=str(seg.path), topic=kr.topic.encode()
            )
            parts.append(recs.take(_key_matches(recs, kr)))
        if parts:
            batch = builder.build(Records.concat(parts), kr.topic)
            if batch is not None:
                yield batch
    finally:
        segments.close()


def _key_matches(recs: Records, kr: KeyRange) -> npt.NDArray[np.bool_]:
    props = Properties.parse(recs.props)
    keys = split_keys(props.get(PROP_KEYS), pa.list_(pa.string()))
    has_key = np.zeros(len(recs), dtype=bool)
    flat = keys.flatten()
    parent = np.asarray(pc.list_parent_indices(keys), dtype=np.int64)
    has_key[parent[np.asarray(pc.equal(flat, kr.key)).astype(bool)]] = True
    uniq = props.get(record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    has_key |= np.asarray(pc.equal(uniq, kr.key).fill_null(False)).astype(bool)
    tx = recs.sys_flag & record.TRANSACTION_MASK
    visible = (tx == record.TRANSACTION_NOT_TYPE) | (tx == record.TRANSACTION_COMMIT_TYPE)
    in_time = (recs.store_ts >= kr.begin) & (recs.store_ts <= kr.end)
    return np.asarray(has_key & visible & in_time & recs.topic_ok)
