"""The read side of the tier: sealed CommitLog segments in an S3 bucket, read as one more
:class:`~rocketstore.pipeline.files.segmentread.SegmentDir`, and the queues, keys and times
their segment indexes find in them (the objects and the manifest: docs/tiering.md).

* :class:`RemoteSegments` is the seam over ``B/commitlog/<base>``: the listing is the
  manifest's segments (read again by :meth:`RemoteSegments.relist`), a segment is opened as a
  :class:`RemoteSegment`, whose reads are ranged GETs through a read-ahead window (8 MiB by
  default: a reader decoding records in order asks for the next few bytes many times, one GET
  serves thousands of them). Bytes past the object's end (the zeros after the END_OF_FILE
  blank, which the object leaves out) read as zeros, as a hole does. ``buffer`` fetches the
  whole object.
* Each segment's index head (``B/index/<base>``: header, queue table, names; see
  :mod:`rocketstore.pipeline.format.segmentindex`) is fetched once with one ranged GET and
  kept; units and key entries are fetched by range when asked for.
* :class:`RemoteQueue` is one (topic, queue id) across the tier's segments: its first and
  next offset, where an offset is, units ``[a, b)`` as an array, the offset for a store time.
* :meth:`RemoteSegments.query_key` finds a key's messages, newest first.

Errors. A segment below the tier's start (its own retention removed it) is
:class:`SegmentGoneError`, as a local segment retention deleted; one past the tier's end is
:class:`NotVisibleError` (not uploaded yet). An object missing from the bucket is told
apart by the manifest read again: below its ``deleted.below``, the tier's retention removed it
while it was read (:class:`SegmentGoneError`: retention commits that before it deletes);
otherwise, like an object of another length than the manifest says, it is damage:
:class:`CorruptRecordError` naming the key (and the byte, where there is one). Index objects that fail their checks raise
:class:`CorruptIndexError` naming the key and byte.

Owns: the manifest it read, the index heads and read-ahead windows it fetched (memory only).
Thread-safety: none; each reader keeps its own (the object store client may be shared).
:meth:`RemoteSegments.read_records` fetches ahead on two threads of its own while its caller
decodes: they call only the object store (thread-safe) and, for an object found missing, read
the manifest again.
Crash behaviour: reads only. Requires: the bucket's reads (:class:`ObjectReads`; on S3,
:class:`rocketstore.pipeline.tier.objects.ObjectStore`), and a manifest as
:mod:`rocketstore.pipeline.tier.manifest` writes it.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import (
    CorruptIndexError,
    CorruptRecordError,
    NotFoundError,
    NotVisibleError,
    SegmentGoneError,
)
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.format import native, record
from rocketstore.pipeline.format.javahash import index_key_hash
from rocketstore.pipeline.format.record import MessageExt
from rocketstore.pipeline.format.segmentindex import (
    UNIT_DTYPE,
    NeedMore,
    QueueRow,
    SegmentIndex,
    Units,
    unit_at_time,
)
from rocketstore.pipeline.tier import manifest
from rocketstore.pipeline.tier.manifest import (
    Manifest,
    TierSegment,
    index_key,
    manifest_key,
    segment_key,
    tier_prefix,
)
from rocketstore.pipeline.tier.objects import ObjectStore

READ_AHEAD = 8 << 20  # bytes a sequential read fetches at once
HEAD_GUESS = 64 << 10  # the first GET of an index: the whole head of up to ~1,500 queues
RECORD_GUESS = 4 << 10  # the first GET of one record (a key look-up's candidate)
# Records of a queue closer than this share a GET: ranged GETs of the loopback radosgw move
# about 300 MB/s (../shared/ceph/README.md), so 64 KiB more is ~0.2 ms, less than a request's
# round trip.
GAP = 64 << 10
PREFETCH = 2  # GETs of records in flight ahead of the one being decoded


class ObjectReads(Protocol):
    """The reads the read side makes of the bucket: the S3 face (``objects.ObjectStore``) has
    them, and so has any stand-in a test gives. A missing key raises a
    :class:`~rocketstore.pipeline.errors.NotFoundError` naming it."""

    def get(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and its ETag."""
        ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object (``end`` within it)."""
        ...

    def head(self, key: str) -> tuple[int, str] | None:
        """(length, ETag), or None for a missing key."""
        ...

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """(key, length) of every object under ``prefix``."""
        ...


def read_manifest(objects: ObjectReads, prefix: str) -> Manifest | None:
    """The manifest under ``prefix`` (``B/``), or None when the tier holds nothing yet."""
    key = manifest_key(prefix)
    try:
        raw, _ = objects.get(key)
    except NotFoundError:
        return None
    return manifest.decode(raw, key)


def open_tier(
    store: Path, config: StoreConfig, objects: ObjectReads | None = None
) -> RemoteSegments | None:
    """The tier of the store directory ``store`` as ``config`` sets it (the bucket, the
    prefix ``<objectStorePrefix><brokerName>/``), or None with the tier off. Without
    ``objects``, a client is made from the settings and the bucket asked for once, so wrong
    credentials or a missing bucket fail here naming the setting (:class:`ObjectStore`)."""
    if not config.tier_on:
        return None
    if objects is None:
        store_client = ObjectStore(config)
        objects, name = store_client, store_client.target.url()
    else:
        name = f"s3://{config.object_store_bucket}/"
    return RemoteSegments(objects, tier_prefix(store, config), name=name)


# -- segments -----------------------------------------------------------------------------------


class RemoteSegment:
    """One segment of the tier, opened (:class:`SegmentFile`): reads are ranged GETs of its
    object through a window of ``read_ahead`` bytes; ``buffer`` holds the whole object."""

    def __init__(
        self, tier: RemoteSegments, entry: TierSegment, size: int, read_ahead: int
    ) -> None:
        self.tier = tier
        self.base = entry.base
        self.size = size
        self.length = entry.length
        self.key = tier.commitlog_key(entry.base)
        self.read_ahead = read_ahead
        self._window = b""
        self._window_at = 0
        self._whole: bytes | None = None

    @property
    def where(self) -> str:
        return self.tier.where(self.base)

    def read(self, position: int, n: int) -> bytes:
        if n <= 0:
            return b""
        if position < 0 or position + n > self.size:
            raise ValueError(f"{self.where}: {n} bytes at {position} outside {self.size}")
        end = position + n
        have = min(end, self.length)
        if position >= have:
            return bytes(n)
        if self._whole is not None:
            data = self._whole[position:have]
        else:
            w0, w1 = self._window_at, self._window_at + len(self._window)
            if not (w0 <= position and have <= w1):
                fetch_end = min(self.length, max(have, position + self.read_ahead))
                self._window = self.tier.fetch(self.key, position, fetch_end, self.base)
                self._window_at = position
            rel = position - self._window_at
            data = self._window[rel : rel + have - position]
        return data if have == end else data + bytes(end - have)

    def read_into(self, position: int, out: memoryview) -> None:
        out[:] = self.read(position, len(out))

    @property
    def buffer(self) -> memoryview:
        if self._whole is None:
            self._whole = self.tier.fetch(self.key, 0, self.length, self.base)
            self._window = b""
        return memoryview(self._whole)

    def data_end(self) -> int:
        return self.length

    def pinned(self) -> contextlib.nullcontext[None]:
        # Nothing to hold: an object the tier's retention deletes mid-read fails its next GET,
        # which says so (SegmentGoneError).
        return contextlib.nullcontext()

    def close(self) -> None:
        self._window = b""
        self._whole = None


class RemoteSegments:
    """The tier's CommitLog segments under ``prefix`` (``<objectStorePrefix><brokerName>/``)
    of ``objects``, as a :class:`SegmentDir` (see the module docstring). ``name`` says where
    the bucket is in messages (``s3://bucket/``); ``read_ahead``: bytes a read fetches."""

    def __init__(
        self,
        objects: ObjectReads,
        prefix: str,
        *,
        name: str = "",
        read_ahead: int = READ_AHEAD,
        manifest: Manifest | None = None,
    ) -> None:
        self.objects = objects
        self.prefix = prefix
        self.location = f"{name}{prefix}commitlog"
        self._name = name
        self.read_ahead = read_ahead
        self._manifest = manifest
        self._by_base: dict[int, TierSegment] = {}
        self._heads: dict[int, SegmentIndex] = {}
        if manifest is not None:
            self._take(manifest)

    # -- the listing ------------------------------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            self.relist()
        assert self._manifest is not None
        return self._manifest

    def _take(self, manifest: Manifest) -> None:
        self._manifest = manifest
        self._by_base = {s.base: s for s in manifest.segments}
        # Heads of segments the tier no longer holds go; the others stay valid (an object is
        # written once and never changed).
        self._heads = {b: h for b, h in self._heads.items() if b in self._by_base}

    def relist(self) -> None:
        """Read the manifest again."""
        got = read_manifest(self.objects, self.prefix)
        self._take(got or Manifest(store_id="", broker="", segment_size=0))

    @property
    def entries(self) -> tuple[TierSegment, ...]:
        return self.manifest.segments

    def listed(self) -> list[int]:
        return [s.base for s in self.entries]

    def first(self) -> int | None:
        return self.entries[0].base if self.entries else None

    def end(self) -> int:
        """The CommitLog offset where the tier ends: past its last segment's data (0: none)."""
        return self.entries[-1].base + self.entries[-1].length if self.entries else 0

    def file_size(self) -> int:
        return self.manifest.segment_size

    def size_of(self, base: int) -> int:
        return self.manifest.segment_size if base in self._listing() else -1

    def _listing(self) -> dict[int, TierSegment]:
        self.manifest  # noqa: B018 - read on first use
        return self._by_base

    def has(self, base: int) -> bool:
        return base in self._listing()

    def where(self, base: int) -> str:
        return f"{self._name}{self.commitlog_key(base)}"

    def commitlog_key(self, base: int) -> str:
        return segment_key(self.prefix, base)

    def index_key(self, base: int) -> str:
        return index_key(self.prefix, base)

    def entry(self, base: int) -> TierSegment:
        """The manifest's entry of the segment at ``base``; raises :class:`SegmentGoneError`
        below the tier's start and :class:`NotVisibleError` past its end (after reading the
        manifest again: it may have moved)."""
        got = self._listing().get(base)
        if got is None:
            self.relist()
            got = self._by_base.get(base)
        if got is not None:
            return got
        entries = self.entries
        if not entries or base < entries[0].base or base < self.manifest.deleted_below:
            raise SegmentGoneError(
                f"{self.where(base)}: not in the tier (its retention removed segments below "
                f"{entries[0].base if entries else self.manifest.deleted_below})"
            )
        raise NotVisibleError(
            f"{self.where(base)}: past the tier's last segment "
            f"{segment_name(entries[-1].base)} (not uploaded yet)"
        )

    def open(
        self, base: int, *, whole: bool = False, read_ahead: int | None = None
    ) -> RemoteSegment:
        seg = RemoteSegment(
            self, self.entry(base), self.manifest.segment_size, read_ahead or self.read_ahead
        )
        if whole:
            seg.buffer  # noqa: B018 - fetched now, as a local file is mapped now
        return seg

    def read(self, base: int, position: int, n: int) -> bytes:
        seg = self.open(base, read_ahead=n)
        try:
            return seg.read(position, n)
        finally:
            seg.close()

    def forget_cached(self, base: int) -> None:
        self._heads.pop(base, None)

    # -- fetching ---------------------------------------------------------------------------
    def fetch(self, key: str, start: int, end: int, base: int) -> bytes:
        """Bytes [start, end) of the object ``key`` of the segment at ``base``, checked to be
        that long. A missing object is told apart by the manifest read again: below its
        ``deleted.below`` the tier's retention removed it (:class:`SegmentGoneError`: it
        commits that before it deletes); otherwise it is damage."""
        if end <= start:
            return b""
        try:
            data = self.objects.get_range(key, start, end)
        except NotFoundError:
            self.relist()
            now = self.manifest
            if base < now.deleted_below:
                raise SegmentGoneError(
                    f"{self._name}{key}: removed by the tier's retention while it was read "
                    f"(the manifest's deleted.below is now {now.deleted_below})"
                ) from None
            if base in self._by_base:
                said = f"named by the manifest (generation {now.generation})"
            else:
                said = (
                    f"neither named by the manifest (generation {now.generation}) nor below "
                    f"its deleted.below {now.deleted_below}"
                )
            raise CorruptRecordError(
                f"{self._name}{key}",
                start,
                f"{said} but not in the bucket: deleted or lost there",
            ) from None
        if len(data) != end - start:
            raise CorruptRecordError(
                f"{self._name}{key}",
                start + len(data),
                f"{end - start} bytes asked for, {len(data)} read: the object is shorter "
                "than its manifest says",
            )
        return data

    def index(self, base: int) -> SegmentIndex:
        """The head of the segment's index (fetched once, kept)."""
        head = self._heads.get(base)
        if head is not None:
            return head
        entry = self.entry(base)
        key = self.index_key(base)
        where = f"{self._name}{key}"
        raw = self.fetch(key, 0, min(HEAD_GUESS, entry.index.length), base)
        got = SegmentIndex.parse_head(raw, where=where, length=entry.index.length)
        # A head past the guess: up to its key sample's stride, then the whole head. Each ask
        # is longer than the last and within the object's length (parse_head checks it).
        while isinstance(got, NeedMore):
            if got.length <= len(raw):
                raise CorruptIndexError(where, len(raw), f"head longer than it said ({got.length})")
            raw = self.fetch(key, 0, got.length, base)
            got = SegmentIndex.parse_head(raw, where=where, length=entry.index.length)
        if got.base != base or got.data_end != entry.length:
            raise CorruptIndexError(
                where,
                8,
                f"indexes segment {got.base} of {got.data_end} bytes; the manifest names "
                f"{base} of {entry.length}",
            )
        self._heads[base] = got
        return got

    def units(self, base: int, row: QueueRow, lo: int, hi: int) -> Units:
        """The row's units of queue offsets [lo, hi) in the segment at ``base``."""
        index = self.index(base)
        start, end = index.unit_range(row, lo, hi)
        return index.units(row, self.fetch(self.index_key(base), start, end, base), start)

    def units_of(self, base: int, asks: list[tuple[QueueRow, int, int]]) -> list[Units]:
        """The units of several rows of the segment at ``base`` (each ``(row, lo, hi)`` as
        :meth:`units` takes it), in the order asked. Rows less than :data:`GAP` bytes apart
        share a GET (a segment's queues of one topic sit side by side, so reading all of them
        is one or a few GETs rather than one a queue), cut as :meth:`read_records` cuts
        records (:func:`_get_runs`), and several GETs go out at once."""
        index = self.index(base)
        key = self.index_key(base)
        spans = np.array(
            [index.unit_range(row, lo, hi) for row, lo, hi in asks], dtype=np.int64
        ).reshape(-1, 2)
        order = np.argsort(spans[:, 0], kind="stable")
        groups = [
            (start, end, order[idx])
            for start, end, idx in _get_runs(spans[order, 0], spans[order, 1], GAP, self.read_ahead)
        ]

        def fetch(group: tuple[int, int, npt.NDArray[np.int64]]) -> bytes:
            return self.fetch(key, group[0], group[1], base)

        if len(groups) == 1:
            got = [fetch(groups[0])]
        else:
            with ThreadPoolExecutor(PREFETCH, thread_name_prefix="tier-units") as pool:
                got = list(pool.map(fetch, groups))
        out: list[Units | None] = [None] * len(asks)
        for (start, _, members), raw in zip(groups, got, strict=True):
            view = memoryview(raw)
            for j in members.tolist():
                a, b = int(spans[j, 0]), int(spans[j, 1])
                out[j] = index.units(asks[j][0], view[a - start : b - start], a)
        done: list[Units] = []
        for u in out:
            assert u is not None  # every ask is in one group
            done.append(u)
        return done

    def read_records(
        self, base: int, rel: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64], gap: int = GAP
    ) -> Iterator[tuple[int, bytes, npt.NDArray[np.int64]]]:
        """The bytes of the records at positions ``rel`` (ascending) of ``sizes`` bytes in the
        segment at ``base``, with as few GETs as fetch little more than the records: records
        less than ``gap`` bytes apart share a GET (a gap costs less than a request), others
        get their own, and no GET starts more than ``read_ahead`` bytes of records. Yields (start, bytes from ``start``, the indexes into ``rel`` of the
        records in them)."""
        entry = self.entry(base)
        key = self.commitlog_key(base)
        if not len(rel):
            return
        ends = rel + sizes
        if int(rel[0]) < 0 or int(ends.max()) > entry.length:
            bad = int(np.flatnonzero((rel < 0) | (ends > entry.length))[0])
            raise CorruptRecordError(
                self.where(base),
                base + int(rel[bad]),
                f"a unit names {int(sizes[bad])} bytes at {int(rel[bad])}, past the "
                f"object's {entry.length}",
            )
        runs = _get_runs(rel, ends, gap, self.read_ahead)
        # The next GETs go out while the caller decodes this one's records: a cold read is
        # then bound by the slower of the two rather than by their sum. At most PREFETCH
        # bodies wait (2 x the read-ahead); errors come out in order, at their run.
        with ThreadPoolExecutor(PREFETCH, thread_name_prefix="tier-read") as pool:
            ahead: deque[tuple[int, npt.NDArray[np.int64], Future[bytes]]] = deque()
            todo = iter(runs)
            while True:
                while len(ahead) < PREFETCH and (run := next(todo, None)) is not None:
                    start, end, idx = run
                    ahead.append((start, idx, pool.submit(self.fetch, key, start, end, base)))
                if not ahead:
                    return
                start, idx, body = ahead.popleft()
                try:
                    data = body.result()
                except BaseException:
                    for *_, later in ahead:
                        later.cancel()
                    raise
                yield start, data, idx

    # -- keys -------------------------------------------------------------------------------
    def key_candidates(
        self,
        topic: str,
        key: str,
        *,
        begin: int = 0,
        end: int = 2**63 - 1,
        before: int | None = None,
    ) -> Iterator[tuple[TierSegment, int]]:
        """(segment, CommitLog offset) of the records that may have key ``key`` of ``topic``
        and a store time in [begin, end] ms, newest first: segments newest first whose times
        overlap, each's key entries of the hash (:meth:`SegmentIndex.key_offsets`, ranged).
        A hash collision is a candidate: the record must be read to tell. ``before``: only
        the segments that start below this CommitLog offset (a reader that has the local
        files' index for the rest)."""
        key_hash = index_key_hash(topic, key)
        for entry in reversed(self.entries):
            if before is not None and entry.base >= before:
                continue
            if entry.max_store_timestamp < begin or entry.min_store_timestamp > end:
                continue
            index = self.index(entry.base)
            ikey = self.index_key(entry.base)

            def ranged(a: int, b: int, ikey: str = ikey, base: int = entry.base) -> bytes:
                return self.fetch(ikey, a, b, base)

            for phys in index.key_offsets(key_hash, ranged)[::-1].tolist():
                yield entry, phys

    def query_key(
        self,
        topic: str,
        key: str,
        *,
        begin: int = 0,
        end: int = 2**63 - 1,
        limit: int = 64,
        before: int | None = None,
    ) -> list[MessageExt]:
        """The messages of ``topic`` with key ``key`` (a ``KEYS`` token or the ``UNIQ_KEY``)
        stored in [begin, end] ms, newest first, at most ``limit``: each candidate
        (:meth:`key_candidates`) read and checked, so a hash collision is never a hit."""
        found: list[MessageExt] = []
        for entry, phys in self.key_candidates(topic, key, begin=begin, end=end, before=before):
            msg = self._record(entry, phys)
            if (
                msg.topic == topic
                and begin <= msg.store_timestamp <= end
                and (key in msg.keys or msg.uniq_key == key)
            ):
                found.append(msg)
                if len(found) >= limit:
                    return found
        return found

    def record_bytes(self, entry: TierSegment, phys: int) -> bytes:
        """The bytes of the record at ``phys`` of the segment (as its size field says, within
        the object), read with one small GET (two for a record longer than the guess)."""
        return self._whole(entry, phys, self._first_bytes(entry, phys))

    def _record(self, entry: TierSegment, phys: int) -> MessageExt:
        """The record at ``phys`` of the segment, read as :meth:`record_bytes` reads it and
        decoded with every check."""
        return self._decode(entry, phys, self._first_bytes(entry, phys))

    def _first_bytes(self, entry: TierSegment, phys: int) -> bytes:
        rel = phys - entry.base
        key = self.commitlog_key(entry.base)
        return self.fetch(key, rel, min(entry.length, rel + RECORD_GUESS), entry.base)

    def _whole(self, entry: TierSegment, phys: int, raw: bytes) -> bytes:
        """The record at ``phys`` from its first bytes ``raw``: the rest fetched when the
        record is longer (as far as the object goes)."""
        rel = phys - entry.base
        size = int.from_bytes(raw[:4], "big", signed=True) if len(raw) >= 4 else 0
        if len(raw) < size <= entry.length - rel:
            raw = self.fetch(self.commitlog_key(entry.base), rel, rel + size, entry.base)
        return raw

    def _decode(self, entry: TierSegment, phys: int, raw: bytes) -> MessageExt:
        """The record at ``phys`` from its first bytes ``raw``, decoded with every check."""
        raw = self._whole(entry, phys, raw)
        return native.decode_one(raw, 0, phys, path=self.where(entry.base), limit=len(raw))

    def record_at(self, phys: int) -> MessageExt | None:
        """The message whose record starts at CommitLog offset ``phys`` of the tier, checked;
        None when no record starts there, intact or damaged (neither its magic code nor its
        PHYSICALOFFSET field is there, as :meth:`CommitLog.starts_record` tells: inside
        another record, or past the segment's data). Outside the tier:
        :class:`SegmentGoneError` below it, :class:`NotVisibleError` past it."""
        size = self.file_size()
        entry = self.entry(phys - phys % size if size else phys)
        if phys - entry.base + record.OFF_SYSFLAG > entry.length:
            return None
        raw = self._first_bytes(entry, phys)
        magic = record.INT.unpack_from(raw, record.OFF_MAGIC)[0]
        field = record.LONG.unpack_from(raw, record.OFF_PHYSICALOFFSET)[0]
        if magic != record.MAGIC and field != phys:
            return None
        return self._decode(entry, phys, raw)


def _get_runs(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], gap: int, read_ahead: int
) -> list[tuple[int, int, npt.NDArray[np.int64]]]:
    """Byte ranges ``[starts, ends)`` of one object (``starts`` ascending) cut into GETs:
    ``(first byte, end, indexes of the ranges)`` each. A new GET where the gap to what came
    before is wider than ``gap`` (a gap costs less than a request), and at least every
    read-ahead's worth of bytes, so that ranges packed close together are not fetched as one
    object-sized body."""
    if not len(starts):
        return []
    reach = np.maximum.accumulate(ends)
    wide = starts[1:] - reach[:-1] > gap
    window = (starts - starts[0]) // max(read_ahead, 1)
    cuts = np.flatnonzero(wide | (window[1:] != window[:-1])) + 1
    return [
        (int(starts[idx[0]]), int(reach[idx[-1]]), idx)
        for idx in np.split(np.arange(len(starts), dtype=np.int64), cuts)
    ]


class RemoteQueue:
    """One queue (topic, queue id) across the tier's segments (see the module docstring).
    The segments that hold it are found through their index heads, fetched once each."""

    def __init__(self, tier: RemoteSegments, topic: str, queue_id: int) -> None:
        self.tier = tier
        self.topic = topic
        self.queue_id = queue_id

    def _row(self, base: int) -> QueueRow | None:
        return self.tier.index(base).row(self.topic, self.queue_id)

    def _rows(self) -> Iterator[tuple[int, QueueRow]]:
        for entry in self.tier.entries:
            row = self._row(entry.base)
            if row is not None:
                yield entry.base, row

    def min_offset(self) -> int | None:
        """The queue's first offset in the tier; None when the tier holds none of it."""
        return next((row.first for _, row in self._rows()), None)

    def max_offset(self) -> int | None:
        """One past the queue's last offset in the tier; None when it holds none."""
        for entry in reversed(self.tier.entries):
            row = self._row(entry.base)
            if row is not None:
                return row.end
        return None

    def locate(self, offset: int) -> tuple[int, QueueRow] | None:
        """(base, row) of the segment holding queue offset ``offset``; None when the tier
        does not. A binary search over the segments by their rows' offsets; a segment without
        the queue is passed over towards the next one that has it."""
        entries = self.tier.entries
        lo, hi = 0, len(entries)
        while lo < hi:
            mid = (lo + hi) // 2
            probe = mid
            row = None
            while probe < hi and (row := self._row(entries[probe].base)) is None:
                probe += 1
            if row is None:
                hi = mid  # nothing of the queue in [mid, hi)
            elif offset < row.first:
                hi = mid
            elif offset >= row.end:
                lo = probe + 1
            else:
                return entries[probe].base, row
        return None

    def units(self, a: int, b: int) -> Units:
        """Units of queue offsets ``[a, b)`` (clipped to what the tier holds) as one array of
        the index's units (``offset``, ``size``, ``tags_code``, ``store_ts``): one ranged GET
        per segment they span."""
        parts: list[Units] = []
        at = self.locate(a) if a < b else None
        if at is None:
            first = self.min_offset()
            if first is None or b <= first or a >= first:
                return np.empty(0, dtype=UNIT_DTYPE)
            a = first
            at = self.locate(a)
            assert at is not None
        bases = self.tier.listed()
        i = bases.index(at[0])
        at_offset, ended = a, None  # ended: where the last segment's run of the queue ended
        while i < len(bases) and at_offset < b:
            row = self._row(bases[i])
            if row is not None:
                if ended is not None and row.first != ended:
                    raise CorruptIndexError(
                        self.tier.index(bases[i]).where,
                        row.start,
                        f"{self.topic}:{self.queue_id} starts at queue offset {row.first} "
                        f"here; the segment before ended at {ended}",
                    )
                parts.append(self.tier.units(bases[i], row, at_offset, b))
                at_offset = ended = row.end
            i += 1
        return np.concatenate(parts) if parts else np.empty(0, dtype=UNIT_DTYPE)

    def offset_by_time(self, timestamp: int) -> int | None:
        """The first queue offset stored at or after ``timestamp`` (store time, ms): one past
        the tier's last when none is; None when the tier holds none of the queue."""
        last: int | None = None
        for entry in self.tier.entries:
            if entry.max_store_timestamp < timestamp:
                row = self._row(entry.base)
                last = row.end if row is not None else last
                continue
            row = self._row(entry.base)
            if row is None:
                continue
            units = self.tier.units(entry.base, row, row.first, row.end)
            i = unit_at_time(units, timestamp)
            if i < len(units):
                return row.first + i
            last = row.end
        return last
