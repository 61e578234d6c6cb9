"""Reading a partition into Arrow record batches: a queue range, or a key look-up.

Runs on executors, inside ``read()`` of a pickled reader: everything here opens its own files
and closes them before returning (generators close them when exhausted or closed). A partition
reads:

1. the ConsumeQueue units ``[start, end)`` of its queue (``pread``, in chunks of
   :data:`CHUNK_UNITS`), checked non-empty;
2. drops units whose tagsCode is not a subscribed tag's hash (no CommitLog read for them);
3. decodes the records the rest point at, segment by segment, with the native decoder
   (:func:`rocketstore.pipeline.format.native.decode`: every record checked, CRC included, and turned into Arrow
   columns in compiled code), checking each is the unit's (topic, queue, queue offset);
4. keeps the messages whose real tag is subscribed, decodes avro/json bodies if asked, and
   yields one ``pyarrow.RecordBatch`` per chunk, of exactly the schema Spark declared.

Files retention deleted after planning (a ConsumeQueue file or a CommitLog segment) are data
loss: :class:`~rocketstore.pipeline.errors.DataLossError` with ``failOnDataLoss=true``, else the messages are
skipped and a warning logged. On shared storage a file past the last one this host lists is
not lost but not visible here yet (a planner on another host saw it): it is looked for in the
directory listed again for up to ``visibilityWaitMs``
(:class:`rocketstore.pipeline.files.localsegments.LocalSegments`), then :class:`~rocketstore.pipeline.errors.NotVisibleError`.
Every file is reached through the read seam (:mod:`rocketstore.pipeline.files.segmentread`),
and where a unit sits is :func:`~rocketstore.pipeline.files.segmentread.unit_position`'s.

Thread-safety: no shared state; each call works on its own files.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.errors import (
    ConfigError,
    CorruptRecordError,
    DataLossError,
    SegmentGoneError,
    StoreError,
)
from rocketstore.pipeline.files import visibility
from rocketstore.pipeline.files.indexservice import IndexService, list_index_files
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.segmentread import locate, unit_index, unit_position
from rocketstore.pipeline.format import bodyformat, native, record
from rocketstore.pipeline.format.subscription import Subscription
from rocketstore.pipeline.layout import (
    CQ_UNIT_SIZE,
    DEFAULT_INDEX_RATIO,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_SLOT_SIZE,
    PRE_BLANK_SIZE,
    UNIT_DTYPE,
)
from rocketstore.source import schema
from rocketstore.source.options import ReadOptions
from rocketstore.source.planning import KeyRange, QueueRange
from rocketstore.source.segfiles import SegmentCache
from rocketstore.source.tiers import bucket_catalog, parse_bucket_path

log = logging.getLogger("rocketstore.source")

# A chunk's records, and the offset ranges [a, b) retention deleted, with why.
Chunk = tuple[list[pa.RecordBatch], list[tuple[int, int, str]]]

CHUNK_UNITS = 1 << 16  # units per record batch: bounds memory, amortises the fixed costs
CHUNK_BYTES = 64 << 20


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

    @property
    def columns(self) -> native.Columns:
        """The column groups the decoder must build for this schema, and no more: tags also
        for a subscription (it filters on them), properties also for avro/json (they name
        each body's schema)."""
        names = set(self.schema.names)
        want = native.Columns(0)
        if "tags" in names or not self.subscription.matches_all:
            want |= native.Columns.TAGS
        if "body" in names or self.body_schema is not None:
            want |= native.Columns.BODY
        if "properties" in names or self.body_schema is not None:
            want |= native.Columns.PROPERTIES
        if "keys" in names:
            want |= native.Columns.KEYS
        if names & {"bornHost", "storeHost"}:
            want |= native.Columns.HOSTS
        if "msgId" in names:
            want |= native.Columns.MSG_ID
        return want


def read_context(opts: ReadOptions, columns: pa.Schema | None = None) -> ReadContext:
    """What every partition of a read with ``opts`` reads with: ``columns`` (by default those
    the options ask for), the body decoding, the subscription and the store's settings."""
    fmt, body = schema.body_format_and_schema(opts)
    return ReadContext(
        schema=columns if columns is not None else schema.arrow_schema(body, opts.optional_columns),
        root=opts.catalog or opts.path,
        sub_expression=opts.sub_expression,
        fail_on_data_loss=opts.fail_on_data_loss,
        body_format=fmt,
        body_schema=body,
        config=opts.config,
    )


def _read_units(
    cq_dir: Path, start: int, end: int, wait_ms: int | None, direct: bool = False
) -> tuple[npt.NDArray[np.void], list[tuple[int, int]]]:
    """Units ``[start, end)`` of a ConsumeQueue (exactly those bytes are read; units past the
    end of a file read as zeros) and the sub-ranges whose files are gone. A file past this
    host's listing is waited for up to ``wait_ms`` (see :meth:`LocalSegments.has`);
    ``direct``: read past this host's page cache (units read again on shared storage)."""
    files = LocalSegments(cq_dir, wait_ms)
    first = files.first() if start < end else None  # lists again when none is listed
    file_size = files.file_size() if first is not None else 0
    pieces: list[tuple[int, npt.NDArray[np.void]]] = []
    missing: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        if file_size <= 0:
            missing.append((pos, end))
            break
        base, position = unit_position(pos, file_size)
        stop = min(end, unit_index(base, file_size))
        try:
            raw = files.read(base, position, (stop - pos) * CQ_UNIT_SIZE, direct=direct)
        except SegmentGoneError:
            missing.append((pos, stop))
        else:
            pieces.append((pos - start, np.frombuffer(raw, dtype=UNIT_DTYPE)))
        pos = stop
    if len(pieces) == 1 and len(pieces[0][1]) == end - start:
        return pieces[0][1], missing  # the usual case: one whole read, used as it is
    out = np.zeros(end - start, dtype=UNIT_DTYPE)
    for at, got in pieces:
        out[at : at + len(got)] = got
    return out, missing


def _unit_location(cq_dir: Path, queue_offset: int) -> tuple[str, int]:
    files = LocalSegments(cq_dir)
    size = files.file_size()
    if not size:
        return str(cq_dir), queue_offset * CQ_UNIT_SIZE
    base, position = unit_position(queue_offset, size)
    return files.where(base), position


# -- columns --------------------------------------------------------------------------------------


def _timestamps(ms: pa.Array, t: pa.DataType) -> pa.Array:
    values = np.asarray(ms, dtype=np.int64)
    return pa.array(values * 1000, pa.int64()).view(t) if t.unit == "us" else ms.view(t)


def constant_strings(value: str, n: int) -> pa.Array:
    """``n`` copies of ``value`` as a string array."""
    raw = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


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
            root = self.ctx.root
            catalog = (
                bucket_catalog(root, self.ctx.config or StoreConfig())
                if parse_bucket_path(root) is not None
                else StoreRoot(root)
            )
            doc = catalog.load_schema(fingerprint)
            got = self._schemas[fingerprint] = bodyformat.BodySchema.from_document(doc)
        return got

    def build(self, recs: pa.RecordBatch, topic: str) -> pa.RecordBatch | None:
        if not self.sub.matches_all:
            assert self.sub.tags is not None
            wanted = pc.is_in(
                recs.column("tags"), value_set=pa.array(sorted(self.sub.tags), pa.string())
            )
            recs = recs.filter(wanted.fill_null(False))
        n = recs.num_rows
        if n == 0:
            return None
        schema = self.ctx.schema
        # The decoder's columns already have the schema's names; the rest are made here.
        cols: dict[str, pa.Array] = {
            "topic": constant_strings(topic, n),
            "brokerName": constant_strings(self.broker, n),
        }
        for name in schema.names:
            if name in cols or name not in recs.schema.names:
                continue
            col = recs.column(name)
            target = schema.field(name).type
            if pa.types.is_timestamp(target):
                cols[name] = _timestamps(col, target)
            else:
                # Same layout, maybe other child field names (keys' "element").
                cols[name] = col if col.type == target else col.view(target)
        if self.ctx.body_format != "binary" and self.ctx.body_schema is not None:
            cols.update(self._decode_bodies(recs))
        return pa.RecordBatch.from_arrays([cols[name] for name in schema.names], schema=schema)

    def _decode_bodies(self, recs: pa.RecordBatch) -> dict[str, pa.Array]:
        reader = self.ctx.body_schema
        assert reader is not None
        fingerprints = pc.map_lookup(
            recs.column("properties"), bodyformat.SCHEMA_PROPERTY, "first"
        ).to_pylist()
        phys = np.asarray(recs.column("commitLogOffset"))

        def where(i: int) -> tuple[str, int]:
            return f"{self.where(int(phys[i]))} ({self.broker})", int(phys[i])

        table = bodyformat.decode_bodies(
            recs.column("body").to_pylist(),
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


LostReader = Callable[[QueueRange], Iterator[pa.RecordBatch]]


def read_queue_range(
    rng: QueueRange, ctx: ReadContext, lost: LostReader | None = None
) -> Iterator[pa.RecordBatch]:
    """The messages of one partition (see the module docstring), as record batches.

    On shared storage (:mod:`rocketstore.pipeline.files.visibility`) the range was planned, perhaps on another
    host, below what the writer published, so a unit or record that does not check out here
    has not reached this host yet: the chunk is read again, past this host's cached pages,
    for up to ``visibilityWaitMs``, before it is reported as damage.

    Offsets whose files retention deleted while the partition read (after planning) are
    data loss, reported as ``failOnDataLoss`` says; with ``lost``, they are read through it
    instead (from the tier, where every segment local retention deletes was uploaded first),
    before the rest of their chunk."""
    broker = Path(rng.broker_path)
    cq_dir = broker / "consumequeue" / rng.topic / str(rng.queue_id)
    config = ctx.config or StoreConfig()
    shared = visibility.is_shared(broker, config.shared_storage)
    wait_ms = config.visibility_wait_ms if shared else None
    segments = SegmentCache(broker / "commitlog", wait_ms)
    builder = BatchBuilder(ctx, rng.broker, segments.path_of)
    try:
        pos = rng.start
        while pos < rng.end:
            stop = min(rng.end, pos + ctx.chunk_units)

            again: list[bool] = []  # a chunk read again reads its units past the page cache

            def chunk(pos: int = pos, stop: int = stop, again: list[bool] = again) -> Chunk:
                return _read_chunk(rng, ctx, cq_dir, segments, pos, stop, bool(again))

            if shared:

                def refresh(pos: int = pos, stop: int = stop, again: list[bool] = again) -> None:
                    segments.drop()
                    _forget_units(cq_dir, pos, stop)
                    again.append(True)

                parts, gone = visibility.wait_until_valid(
                    chunk,
                    lambda exc: isinstance(exc, CorruptRecordError),
                    refresh,
                    config.visibility_wait_ms,
                )
            else:
                parts, gone = chunk()
            if lost is None:
                report_lost(ctx, rng, gone)
            else:
                for a, b, _ in gone:
                    yield from lost(dataclasses.replace(rng, start=a, end=b))
            if parts:
                batch = builder.build(one_batch(parts), rng.topic)
                if batch is not None:
                    yield batch
            pos = stop
    finally:
        segments.close()


def _read_chunk(
    rng: QueueRange,
    ctx: ReadContext,
    cq_dir: Path,
    segments: SegmentCache,
    pos: int,
    stop: int,
    direct: bool = False,
) -> Chunk:
    """The records of units ``[pos, stop)`` of the partition's queue, checked to be theirs,
    and the offset ranges retention deleted (with why), ascending. ConsumeQueue files past
    this host's listing are waited for as ``segments``' are; ``direct``: units and records read
    past the page cache."""
    units, missing = _read_units(cq_dir, pos, stop, segments.files.wait_ms, direct)
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
        ~gone
        & ~pre_blank
        & ~expired
        & ctx.subscription.hash_filter(units["tags_code"].astype(np.int64))
    )
    parts, lost = _decode_units(
        segments, phys[want], size[want], offsets[want], rng, cq_dir, ctx.columns, direct
    )
    deleted = [(a, b, "its ConsumeQueue file was deleted") for a, b in missing]
    deleted += [(a, b, "its CommitLog segment was deleted") for a, b in _runs(offsets[expired])]
    deleted += [(a, b, "its CommitLog segment was deleted") for a, b in _runs(lost)]
    return parts, sorted(deleted)


def _forget_units(cq_dir: Path, start: int, end: int) -> None:
    """Drop this host's cached pages of the ConsumeQueue files that hold units
    ``[start, end)`` (``start < end``)."""
    files = LocalSegments(cq_dir)
    size = files.file_size()
    if not size:
        return
    lo, hi = unit_position(start, size)[0], unit_position(end - 1, size)[0]
    for base in files.listed():
        if lo <= base <= hi:
            files.forget_cached(base)


def one_batch(parts: list[pa.RecordBatch]) -> pa.RecordBatch:
    # Concatenating copies every buffer, which a chunk within one segment does not need.
    return parts[0] if len(parts) == 1 else pa.concat_batches(parts)


def _runs(offsets: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted offsets as ``[a, b)`` ranges."""
    if len(offsets) == 0:
        return []
    breaks = np.flatnonzero(np.diff(offsets) != 1)
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks, [len(offsets) - 1]))
    return [(int(offsets[a]), int(offsets[b]) + 1) for a, b in zip(starts, ends, strict=True)]


def report_lost(ctx: ReadContext, rng: QueueRange, ranges: list[tuple[int, int, str]]) -> None:
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
    segments: SegmentCache,
    phys: npt.NDArray[np.int64],
    size: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    rng: QueueRange,
    cq_dir: Path,
    columns: native.Columns,
    direct: bool = False,
) -> tuple[list[pa.RecordBatch], npt.NDArray[np.int64]]:
    """pa.RecordBatch of the given units, checked to be theirs; and the offsets whose segment
    is gone. ``direct``: the records' bytes read past this host's page cache instead of
    through the segments' mappings (records read again on shared storage)."""
    parts: list[pa.RecordBatch] = []
    lost: list[npt.NDArray[np.int64]] = []
    if len(phys) == 0:
        return parts, offsets[:0]
    if segments.segment_size == 0:
        return parts, offsets  # the CommitLog has no segment left at all
    bases, _ = locate(phys, segments.segment_size)
    cuts = np.flatnonzero(np.diff(bases)) + 1
    for idx in np.split(np.arange(len(phys)), cuts):
        base = int(bases[idx[0]])
        if direct:
            # Only the span the records cover, from the offset of its first byte.
            lo, hi = int(phys[idx].min()), int((phys[idx] + size[idx]).max())
            try:
                raw = segments.files.read(base, lo - base, hi - lo, direct=True)
            except SegmentGoneError:
                lost.append(offsets[idx])
                continue
            where = segments.files.where(base)
            recs = native.decode(
                raw, phys[idx] - lo, lo, path=where, sizes=size[idx], columns=columns
            )
        else:
            seg = segments.get(base)
            if seg is None:
                lost.append(offsets[idx])
                continue
            recs = native.decode(
                seg.buffer, phys[idx] - base, base, path=seg.where, sizes=size[idx], columns=columns
            )
        check_owner(recs, rng, offsets[idx], lambda i: _unit_location(cq_dir, i))
        parts.append(recs)
    return parts, np.concatenate(lost) if lost else offsets[:0]


def check_owner(
    recs: pa.RecordBatch,
    rng: QueueRange,
    offsets: npt.NDArray[np.int64],
    unit_at: Callable[[int], tuple[str, int]],
) -> None:
    """Each record must be its unit's: a unit pointing elsewhere is the fault of the file
    that holds the unit (``unit_at``: its name and the byte of queue offset ``i``)."""
    queue_id = np.asarray(recs.column("queueId"))
    queue_offset = np.asarray(recs.column("queueOffset"))
    topic_ok = np.asarray(pc.equal(recs.column("topic"), rng.topic))
    wrong = (queue_id != rng.queue_id) | (queue_offset != offsets) | ~topic_ok
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        path, at = unit_at(int(offsets[i]))
        other = "" if topic_ok[i] else "another topic's "
        raise CorruptRecordError(
            path,
            at,
            f"unit {int(offsets[i])} of {rng.topic}/{rng.queue_id} points at CommitLog offset "
            f"{recs.column('commitLogOffset')[i]}, whose record is {other}queue "
            f"{int(queue_id[i])} offset {int(queue_offset[i])}",
        )


# -- key look-ups ---------------------------------------------------------------------------------


def index_geometry(index_dir: Path, config: StoreConfig | None) -> tuple[int, int] | None:
    """(maxHashSlotNum, maxIndexNum) of a broker's IndexFiles: the configuration's when its
    IndexFile size is the files' (the files are the truth for a reader), else from the file
    size, assuming RocketMQ's 1:4 ratio of slots to entries."""
    files = list_index_files(index_dir)
    if not files:
        return None
    size = files[0].stat().st_size
    if config is not None and config.index_file_size == size:
        return config.max_hash_slot_num, config.max_index_num
    per_slot = INDEX_SLOT_SIZE + DEFAULT_INDEX_RATIO * INDEX_ENTRY_SIZE
    if (size - INDEX_HEADER_SIZE) % per_slot:
        raise ConfigError(
            f"{files[0]}: IndexFile of {size} bytes fits neither the store settings (from "
            f"{config.origin if config else 'none given'}) nor RocketMQ's default 1:4 slots to "
            "entries; set option config to the store's configuration file (maxHashSlotNum, "
            "maxIndexNum)"
        )
    slots = (size - INDEX_HEADER_SIZE) // per_slot
    return slots, slots * DEFAULT_INDEX_RATIO


def read_key(kr: KeyRange, ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """Messages of ``kr.topic`` on one broker whose KEYS or UNIQ_KEY is ``kr.key``, stored in
    ``[kr.begin, kr.end]``, as a consumer would see them (not PREPARED or ROLLBACK
    transaction halves), in CommitLog order. Hash collisions are never returned."""
    broker = Path(kr.broker_path)
    geometry = index_geometry(broker / "index", ctx.config)
    if geometry is None:
        if LocalSegments(broker / "commitlog").listed():
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
    config = ctx.config or StoreConfig()
    point = None
    if visibility.is_shared(broker, config.shared_storage):
        # Shared storage: entries past the published point may name records not synced yet.
        point = visibility.published(broker)
        if point is not None:
            candidates = candidates[candidates < point.commitlog_end]
    segments = SegmentCache(
        broker / "commitlog", config.visibility_wait_ms if point is not None else None
    )
    builder = BatchBuilder(ctx, kr.broker, segments.path_of)
    try:
        live = (
            candidates[candidates >= segments.min_offset]
            if len(candidates) and segments.segment_size
            else candidates[:0]
        )

        def read(strict: bool) -> list[pa.RecordBatch]:
            return _read_key_records(segments, live, kr, ctx, strict)

        if point is None:
            parts = read(False)
        else:
            # A published entry whose record does not start here has not reached this host
            # yet: wait for it as for a queue's records; one that never does is skipped, as a
            # damaged entry is on one host.
            try:
                parts = visibility.wait_until_valid(
                    lambda: read(True),
                    lambda exc: isinstance(exc, CorruptRecordError),
                    segments.drop,
                    config.visibility_wait_ms,
                )
            except CorruptRecordError:
                parts = read(False)
        if parts:
            batch = builder.build(one_batch(parts), kr.topic)
            if batch is not None:
                yield batch
    finally:
        segments.close()


def _read_key_records(
    segments: SegmentCache,
    live: npt.NDArray[np.int64],
    kr: KeyRange,
    ctx: ReadContext,
    strict: bool,
) -> list[pa.RecordBatch]:
    """The records at CommitLog offsets ``live`` whose key is ``kr.key``. An offset where no
    record starts is skipped, or with ``strict`` raises :class:`CorruptRecordError`."""
    parts: list[pa.RecordBatch] = []
    bases, _ = locate(live, max(segments.segment_size, 1))
    columns = ctx.columns | native.Columns.KEYS | native.Columns.UNIQ_KEY
    for base in np.unique(bases).tolist():
        seg = segments.get(base)
        if seg is None:
            continue
        rel = live[bases == base] - base
        buffer = seg.buffer
        starts = native.record_starts(buffer, rel, base)
        if strict and not starts.all():
            at = int(rel[np.flatnonzero(~starts)[0]])
            raise CorruptRecordError(seg.where, at, "an index entry names no record here")
        rel = rel[starts]
        recs = native.decode(buffer, rel, base, path=seg.where, columns=columns)
        parts.append(recs.filter(key_matches(recs, kr)))
    return parts


def key_matches(recs: pa.RecordBatch, kr: KeyRange) -> npt.NDArray[np.bool_]:
    keys = recs.column("keys")
    has_key = np.zeros(recs.num_rows, dtype=bool)
    parent = np.asarray(pc.list_parent_indices(keys), dtype=np.int64)
    has_key[parent[np.asarray(pc.equal(keys.flatten(), kr.key)).astype(bool)]] = True
    has_key |= np.asarray(pc.equal(recs.column("uniqKey"), kr.key).fill_null(False)).astype(bool)
    tx = np.asarray(recs.column("sysFlag")) & record.TRANSACTION_MASK
    visible = (tx == record.TRANSACTION_NOT_TYPE) | (tx == record.TRANSACTION_COMMIT_TYPE)
    store_ts = np.asarray(recs.column("storeTimestamp"))
    in_time = (store_ts >= kr.begin) & (store_ts <= kr.end)
    topic_ok = np.asarray(pc.equal(recs.column("topic"), kr.topic))
    return np.asarray(has_key & visible & in_time & topic_ok)
