"""The segment index: what a reader of the tier needs to find a queue's units, a key or a time
in one sealed CommitLog segment without reading the segment.

The layout (header, queue table, name area, units, keys) is described once, in
docs/tiering.md, section "The segment index"; the structs below follow it field for field.
:func:`build_segment_index` makes the object from the segment's own records at upload;
:class:`SegmentIndex` reads it back, either whole (:meth:`SegmentIndex.parse`, every check
including the body CRC) or from its head alone (:meth:`SegmentIndex.parse_head`, one ranged
read), the units and keys then fetched by byte range as a reader needs them (a key's entries in
one read, found through the head's key sample; version 1 objects, written before the sample,
are read too).

The records are walked by the native core's record walk (the one walk of recovery and
``verify``: magic, sizes, PHYSICALOFFSET, body CRC, no NUL in topic or properties), and the
units and keys follow the store's dispatch rules (:mod:`rocketstore.pipeline.engine.dispatch`):
PREPARED and ROLLBACK records get no unit; every record but a ROLLBACK gets a key entry for
its ``UNIQ_KEY`` and for each non-empty space-separated ``KEYS`` token, hashed as the IndexFile
hashes ``topic#key`` (:func:`rocketstore.pipeline.format.javahash.index_key_hash`). A key that
recurs in one record (a token twice, a token equal to the ``UNIQ_KEY``) gives one entry: an
entry says "this record may hold a key of this hash", and the reader checks the record.

Owns nothing (bytes in, bytes or arrays out). Thread-safety: pure functions and immutable
objects. Crash behaviour: writes nothing. Requires: a segment of at most 2 GiB
(``mappedFileSizeCommitLog`` is a Java int), records of one segment whose queue offsets run
without gaps per queue (the store and RocketMQ write them so).
"""

from __future__ import annotations

import bisect
import dataclasses
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.errors import CorruptIndexError, CorruptRecordError
from rocketstore.pipeline.format import native, record

MAGIC = b"RSIX"
VERSION = 2  # what the build writes; readers take VERSIONS
VERSIONS = (1, 2)  # 1: no key sample (objects uploaded before it); the look-up then guesses
# magic, version, base, data end, records, queues, keys, names length, min and max store
# timestamp, CRC of bytes 64.. (the rest of the object), CRC of the head (see _head_crc).
HEADER = struct.Struct(">4siqqiiiiqqII")
HEADER_SIZE = 64
# topic name offset, topic name length, queue id, units, first queue offset, units start.
QUEUE_ROW = struct.Struct(">iiiiqq")
ROW_SIZE = 32
# Version 2: the key sample follows the names: its stride, then ceil(keys / stride) hashes.
SAMPLE_HEAD = struct.Struct(">i")
# The first 20 bytes are a ConsumeQueue unit (rocketstore.pipeline.layout.UNIT_DTYPE).
UNIT_DTYPE = np.dtype(
    [("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8"), ("store_ts", ">i8")]
)
UNIT_SIZE = 28
KEY_DTYPE = np.dtype([("hash", ">i4"), ("offset", ">i8")])
KEY_SIZE = 12
assert HEADER.size == HEADER_SIZE and QUEUE_ROW.size == ROW_SIZE
assert UNIT_DTYPE.itemsize == UNIT_SIZE and KEY_DTYPE.itemsize == KEY_SIZE

# Key entries read per step of a version 1 object's ranged key look-up (48 KiB), where the
# entry a hash falls at is guessed as if hashes were spread evenly over [0, 2^31). Java's
# hashes of sequential keys are not, and the guess took about 7 windows a segment (bench tier).
KEY_WINDOW = 4096
# The key sample of version 2 (every stride-th entry's hash, in the head): at most this many
# hashes (16 KiB), the stride a power of two of at least KEY_STRIDE_MIN entries. A look-up
# then reads one stride of entries (12 KiB at 1,024) in one GET, wherever the hashes fall.
KEY_SAMPLE_MAX = 4096
KEY_STRIDE_MIN = 1024
_SEGMENT_LIMIT = 1 << 31  # a CommitLog segment's size is a Java int

Units = npt.NDArray[np.void]  # UNIT_DTYPE
Read = Callable[[int, int], bytes]  # bytes [start, end) of the index object


def _where(base: int) -> str:
    return f"commitlog segment {base:020d}"


def _head_crc(head: bytes | memoryview, head_length: int) -> int:
    """The head's own CRC (header field 60): of header bytes 0..60 (field 56, the CRC of the
    rest, included) and of the queue table and names. A reader that fetched the head alone
    checks what it uses; the units and keys it reads by range are checked by their use (a
    unit against the record it names, a key against the message)."""
    return zlib.crc32(head[HEADER_SIZE:head_length], zlib.crc32(head[:60]))


# -- building ----------------------------------------------------------------------------------


def key_stride(keys: int) -> int:
    """The key sample's stride the build picks for ``keys`` entries (a reader takes the one the
    object states): KEY_STRIDE_MIN, doubled until the sample has at most KEY_SAMPLE_MAX."""
    stride = KEY_STRIDE_MIN
    while -(-keys // stride) > KEY_SAMPLE_MAX:
        stride *= 2
    return stride


def build_segment_index(
    segment: Any,
    base: int,
    data_end: int,
    *,
    where: str | None = None,
    stride: int | None = None,
    version: int = VERSION,
) -> bytes:
    """The segment index object of the segment whose bytes are ``segment`` (a buffer: a mapped
    file, a memoryview, bytes) and whose first byte is CommitLog offset ``base``, from its
    records in ``[0, data_end)``: the walk stops at an END_OF_FILE blank (then the index's data
    end is the blank's end, and ``data_end`` may be anything past it, the segment's size
    included) or at ``data_end``, which must then end a record. ``where`` names the segment in
    errors; ``stride``: the key sample's (default :func:`key_stride`; tests use small ones);
    ``version``: 1 writes no sample (``verify`` rebuilds an object in the form it was written).
    Raises :class:`CorruptRecordError` naming the segment and the CommitLog offset of the
    first bytes that are not a valid record or blank."""
    name = where or _where(base)
    view = memoryview(segment).cast("B")
    if not 0 <= data_end <= len(view) or data_end >= _SEGMENT_LIMIT:
        raise CorruptRecordError(
            name,
            base + min(data_end, len(view)),
            f"data end {data_end} outside the segment's {len(view)} bytes",
        )
    w = native.walk(view, 0, data_end, base, check_crc=True)
    end = _records_end(view, w, base, data_end, name)
    rows, units, names = _queue_runs(w, name)
    keys = _keys(w, base)
    names_area = b"".join(n.encode("utf-8") for n in names)
    if version not in VERSIONS:
        raise ValueError(f"segment index version {version}: one of {VERSIONS}")
    stride = key_stride(len(keys)) if stride is None else stride
    if stride <= 0:
        raise ValueError(f"key sample stride {stride}: must be > 0")
    sample = b""
    if version >= 2:
        sample = SAMPLE_HEAD.pack(stride) + keys["hash"][::stride].astype(">i4").tobytes()
    # The head ends with the sample: under the head's CRC, fetched by the head's one GET.
    head_length = HEADER_SIZE + ROW_SIZE * len(rows) + len(names_area) + len(sample)
    table = bytearray()
    name_at: dict[str, tuple[int, int]] = {}
    at = 0
    for n in names:
        size = len(n.encode("utf-8"))
        name_at[n] = (at, size)
        at += size
    start = head_length
    for topic, queue_id, count, first in rows:
        table += QUEUE_ROW.pack(*name_at[topic], queue_id, count, first, start)
        start += UNIT_SIZE * count
    body = b"".join((bytes(table), names_area, sample, units.tobytes(), keys.tobytes()))
    times = w.store_ts
    header = HEADER.pack(
        MAGIC,
        version,
        base,
        end,
        len(w),
        len(rows),
        len(keys),
        len(names_area),
        int(times.min()) if len(times) else 0,
        int(times.max()) if len(times) else 0,
        zlib.crc32(body),
        0,
    )
    head_crc = _head_crc(header + body[: head_length - HEADER_SIZE], head_length)
    return header[:60] + struct.pack(">I", head_crc) + body


def _records_end(view: memoryview, w: native.Walk, base: int, data_end: int, name: str) -> int:
    """Where the segment's data ends (relative): past the END_OF_FILE blank that ends it, or at
    ``data_end`` when the records reach it exactly; raises for anything else."""
    rel = w.end - base
    if w.stop == native.STOP_BLANK:
        return rel + record.BLANK_SIZE
    if w.stop == native.STOP_END and rel == data_end:
        return rel
    # The walk knows a blank only when it claims exactly the rest of its limit; an object that
    # ends with the blank's 8 bytes (or a data end short of the segment's) holds one that
    # claims the rest of the segment: at least up to the data end.
    if rel + record.BLANK_SIZE <= data_end:
        size, magic = record.SIZE_MAGIC.unpack_from(view, rel)
        if magic == record.BLANK_MAGIC and size >= record.BLANK_SIZE and rel + size >= data_end:
            return rel + record.BLANK_SIZE
    reason = w.reason or f"{data_end - rel} bytes before the data end are not a whole record"
    raise CorruptRecordError(name, w.end, reason)


def _queue_runs(
    w: native.Walk, name: str
) -> tuple[list[tuple[str, int, int, int]], npt.NDArray[np.void], list[str]]:
    """(topic, queue id, units, first queue offset) per queue sorted by (topic, queue id), the
    units of every queue back to back in that order, and the topic names they use, sorted."""
    rows = np.flatnonzero(record.consume_queue_mask(w.sys_flags))
    units = np.empty(len(rows), dtype=UNIT_DTYPE)
    if not len(rows):
        return [], units, []
    # Topics rank by name (Python orders str as UTF-8 orders bytes); codes of equal names
    # (invalid UTF-8 replaced) share a rank, so a queue is one row.
    names = sorted(set(w.topics))
    rank_of = {n: i for i, n in enumerate(names)}
    code_rank = np.array([rank_of[t] for t in w.topics], dtype=np.int64)
    key = (code_rank[w.topic_codes[rows]] << 32) + (w.queue_ids[rows].astype(np.int64) + 2**31)
    order = np.argsort(key, kind="stable")  # stable: each queue's units in log order
    rows = rows[order]
    key = key[order]
    starts = np.concatenate(([0], np.flatnonzero(key[1:] != key[:-1]) + 1))
    counts = np.diff(np.append(starts, len(rows)))
    offsets = w.queue_offsets[rows]
    firsts = offsets[starts]
    expected = np.repeat(firsts - starts, counts) + np.arange(len(rows))
    gaps = np.flatnonzero(offsets != expected)
    if len(gaps):
        at = int(rows[gaps[0]])
        raise CorruptRecordError(
            name,
            int(w.phys[at]),
            f"queue offset {int(offsets[gaps[0]])} breaks its queue's run "
            f"(expected {int(expected[gaps[0]])})",
        )
    units["offset"] = w.phys[rows]
    units["size"] = w.sizes[rows]
    units["tags_code"] = w.tags_codes[rows]
    units["store_ts"] = w.store_ts[rows]
    out = []
    for s, c, f in zip(starts.tolist(), counts.tolist(), firsts.tolist(), strict=True):
        r = int(rows[s])
        out.append((w.topics[int(w.topic_codes[r])], int(w.queue_ids[r]), c, f))
    used = sorted({t for t, _, _, _ in out})
    return out, units, used


def _keys(w: native.Walk, base: int) -> npt.NDArray[np.void]:
    """The key entries sorted by (hash, offset), each pair once. Hashes are >= 0 (the
    IndexFile's ``abs``) and offsets within a segment < 2^31, so one int64 orders both."""
    rel = w.phys[w.key_rows] - base
    packed = np.sort((w.key_hashes.astype(np.int64) << 32) | rel)
    # Duplicates dropped by hand: numpy 2's unique hashes first, 30x slower than the sort.
    packed = packed[np.concatenate(([True], packed[1:] != packed[:-1]))] if len(packed) else packed
    keys = np.empty(len(packed), dtype=KEY_DTYPE)
    keys["hash"] = packed >> 32
    keys["offset"] = (packed & 0xFFFFFFFF) + base
    return keys


# -- reading -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class QueueRow:
    """One queue's row of the queue table: its ``units`` units hold queue offsets
    ``[first, first + units)`` and start at byte ``start`` of the object."""

    topic: str
    queue_id: int
    units: int
    first: int
    start: int

    @property
    def end(self) -> int:
        """One past the last queue offset the segment holds of this queue."""
        return self.first + self.units


@dataclasses.dataclass(frozen=True)
class NeedMore:
    """:meth:`SegmentIndex.parse_head` needs the first ``length`` bytes of the object."""

    length: int


@dataclasses.dataclass(frozen=True)
class SegmentIndex:
    """A parsed segment index (see the module docstring): its header, its queue table, and
    where its units and keys are in the object; ``data`` the whole object when it was parsed
    whole (:meth:`parse`), else None and units and keys are read by byte range."""

    where: str
    base: int
    data_end: int
    records: int
    min_store_timestamp: int
    max_store_timestamp: int
    rows: tuple[QueueRow, ...]
    keys: int
    head_length: int
    length: int  # of the whole object
    body_crc: int
    key_stride: int = 0  # 0: a version 1 object, no key sample
    key_sample: bytes = b""  # big-endian int32 hashes of entries 0, stride, 2 stride, ...
    data: bytes | None = None

    @property
    def keys_start(self) -> int:
        return self.length - KEY_SIZE * self.keys

    # -- parsing ------------------------------------------------------------------------------
    @classmethod
    def parse_head(
        cls, head: bytes, *, where: str, length: int | None = None
    ) -> SegmentIndex | NeedMore:
        """The index from the object's first bytes ``head`` (header, queue table, names), or
        :class:`NeedMore` saying how many first bytes it needs when ``head`` is short.
        ``length``: the object's length when known (the manifest's), checked against the
        header's counts. Raises :class:`CorruptIndexError` naming ``where`` and the byte."""
        if len(head) < HEADER_SIZE:
            return NeedMore(HEADER_SIZE)
        (
            magic,
            version,
            base,
            data_end,
            records,
            queues,
            keys,
            names_length,
            min_ts,
            max_ts,
            body_crc,
            head_crc,
        ) = HEADER.unpack_from(head, 0)
        if magic != MAGIC:
            raise CorruptIndexError(where, 0, f"bad magic {magic!r} (a segment index has RSIX)")
        if version not in VERSIONS:
            raise CorruptIndexError(
                where, 4, f"version {version}, this reader knows {', '.join(map(str, VERSIONS))}"
            )
        for at, what, value in (
            (8, "segment base", base),
            (16, "data end", data_end),
            (24, "record count", records),
            (28, "queue count", queues),
            (32, "key count", keys),
            (36, "names length", names_length),
        ):
            if value < 0:
                raise CorruptIndexError(where, at, f"negative {what} {value}")
        if data_end >= _SEGMENT_LIMIT or queues > records:
            raise CorruptIndexError(
                where, 16, f"data end {data_end} or {queues} queues for {records} records"
            )
        names_end = HEADER_SIZE + ROW_SIZE * queues + names_length
        head_length, stride = names_end, 0
        if version >= 2:  # the key sample: its stride says how long it is
            short = _short(head, names_end + SAMPLE_HEAD.size, length, where)
            if short:
                return short
            (stride,) = SAMPLE_HEAD.unpack_from(head, names_end)
            if stride <= 0:
                raise CorruptIndexError(where, names_end, f"key sample stride {stride}")
            head_length = names_end + SAMPLE_HEAD.size + 4 * -(-keys // stride)
        short = _short(head, head_length, length, where)
        if short:
            return short
        if _head_crc(head, head_length) != head_crc:
            raise CorruptIndexError(
                where,
                60,
                f"head CRC mismatch: stored {head_crc}, computed {_head_crc(head, head_length)}",
            )
        rows = _rows(head, queues, head_length, names_length, where)
        sample = bytes(head[names_end + SAMPLE_HEAD.size : head_length]) if stride else b""
        total = sum(r.units for r in rows)
        if total > records:
            raise CorruptIndexError(where, HEADER_SIZE, f"{total} units for {records} records")
        object_length = head_length + UNIT_SIZE * total + KEY_SIZE * keys
        if length is not None and object_length != length:
            raise CorruptIndexError(
                where,
                min(length, object_length),
                f"counts say {object_length} bytes, the object has {length}",
            )
        return cls(
            where=where,
            base=base,
            data_end=data_end,
            records=records,
            min_store_timestamp=min_ts,
            max_store_timestamp=max_ts,
            rows=rows,
            keys=keys,
            head_length=head_length,
            length=object_length,
            body_crc=body_crc,
            key_stride=stride,
            key_sample=sample,
        )

    @classmethod
    def parse(cls, data: bytes, *, where: str) -> SegmentIndex:
        """The index from the whole object ``data``, every check made (the CRC of the whole
        object too); raises :class:`CorruptIndexError` naming ``where`` and the byte."""
        got = cls.parse_head(data, where=where, length=len(data))
        if isinstance(got, NeedMore):
            raise CorruptIndexError(
                where, len(data), f"truncated: {len(data)} bytes, the head alone is {got.length}"
            )
        crc = zlib.crc32(memoryview(data)[HEADER_SIZE:])
        if crc != got.body_crc:
            raise CorruptIndexError(
                where, 56, f"CRC mismatch: stored {got.body_crc}, computed {crc}"
            )
        index = dataclasses.replace(got, data=data)
        index._check_order()
        return index

    def _check_order(self) -> None:
        """Checks only a whole object can have: every row's units (as :meth:`units` checks
        them), the keys sorted and within the segment."""
        for row in self.rows:
            self.units(row)
        keys = self._key_array(self.read(self.keys_start, self.length))
        if self.key_stride and self.key_sample != keys["hash"][:: self.key_stride].tobytes():
            raise CorruptIndexError(
                self.where,
                self.head_length - len(self.key_sample),
                f"the key sample (every {self.key_stride}th hash) does not match the key entries",
            )
        packed = (keys["hash"].astype(np.int64) << 32) | (
            keys["offset"].astype(np.int64) - self.base
        )
        bad = np.flatnonzero(
            (keys["hash"] < 0)
            | (keys["offset"] < self.base)
            | (keys["offset"] >= self.base + self.data_end)
            | (np.diff(packed, prepend=-1) <= 0)
        )
        if len(bad):
            raise CorruptIndexError(
                self.where,
                self.keys_start + KEY_SIZE * int(bad[0]),
                f"key entry {int(bad[0])} is out of order or outside the segment",
            )

    # -- queues -------------------------------------------------------------------------------
    def row(self, topic: str, queue_id: int) -> QueueRow | None:
        """The queue's row, or None when the segment holds none of its units."""
        want = (topic.encode("utf-8"), queue_id)
        i = bisect.bisect_left(self.rows, want, key=_row_key)
        if i < len(self.rows) and _row_key(self.rows[i]) == want:
            return self.rows[i]
        return None

    def unit_range(self, row: QueueRow, lo: int, hi: int) -> tuple[int, int]:
        """Bytes [start, end) of the object holding the row's units of queue offsets
        ``[lo, hi)`` (clipped to the row's)."""
        lo = min(max(lo, row.first), row.end)
        hi = min(max(hi, lo), row.end)
        return row.start + UNIT_SIZE * (lo - row.first), row.start + UNIT_SIZE * (hi - row.first)

    def units(
        self, row: QueueRow, raw: bytes | memoryview | None = None, at: int | None = None
    ) -> Units:
        """The row's units as a read-only array (fields ``offset``, ``size``, ``tags_code``,
        ``store_ts``): from ``raw``, the bytes at byte ``at`` that :meth:`unit_range` named,
        or from the whole object. Checked: each record inside the segment, offsets rising (a
        unit read by range has no CRC; a damaged one must not send a reader to another
        segment); :class:`CorruptIndexError` names the unit's byte."""
        if raw is None:
            raw, at = self.read(row.start, row.start + UNIT_SIZE * row.units), row.start
        at = row.start if at is None else at
        if len(raw) % UNIT_SIZE:
            raise CorruptIndexError(
                self.where, at, f"{len(raw)} bytes of units, not whole 28-byte units"
            )
        units = np.frombuffer(raw, dtype=UNIT_DTYPE)
        offsets = units["offset"].astype(np.int64)
        bad = np.flatnonzero(
            (offsets < self.base)
            | (units["size"] <= 0)
            | (offsets + units["size"] > self.base + self.data_end)
            | (np.diff(offsets, prepend=self.base - 1) <= 0)
        )
        if len(bad):
            i = int(bad[0])
            raise CorruptIndexError(
                self.where,
                at + UNIT_SIZE * i,
                f"unit at byte {at + UNIT_SIZE * i} of {row.topic}:{row.queue_id} names "
                f"{int(units['size'][i])} bytes at CommitLog offset {int(offsets[i])}: out of "
                f"order or outside the segment [{self.base}, {self.base + self.data_end})",
            )
        return units

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the whole object (parsed whole only)."""
        if self.data is None:
            raise ValueError(f"{self.where}: parsed from its head; read its bytes by range")
        if end > len(self.data):
            raise CorruptIndexError(self.where, len(self.data), f"truncated before byte {end}")
        return self.data[start:end]

    # -- keys ---------------------------------------------------------------------------------
    def _key_array(self, raw: bytes) -> npt.NDArray[np.void]:
        if len(raw) % KEY_SIZE:
            raise CorruptIndexError(
                self.where, self.keys_start, f"{len(raw)} bytes of keys, not whole entries"
            )
        return np.frombuffer(raw, dtype=KEY_DTYPE)

    def key_offsets(
        self, key_hash: int, read: Read | None = None, *, window: int = KEY_WINDOW
    ) -> npt.NDArray[np.int64]:
        """CommitLog offsets of the records with a key of ``key_hash`` (collisions included:
        the caller checks each message), ascending. ``read(start, end)``: bytes of the object
        (ranged GETs); default, the whole object. With a key sample (version 2), one read of
        the span the sample gives (:meth:`key_span`). A version 1 object: each step reads
        ``window`` entries where the hash's entries would be if hashes were spread evenly,
        narrowing the range it searches until one window holds them; a run longer than a
        window is read in growing steps."""
        fetch = read or self.read
        if self.key_stride:
            a, b = self.key_span(key_hash)
            if b <= a:
                return np.empty(0, dtype=np.int64)
            keys = self._key_array(self._entries(fetch, a, b))
            i = int(np.searchsorted(keys["hash"], key_hash, "left"))
            j = int(np.searchsorted(keys["hash"], key_hash, "right"))
            return keys["offset"][i:j].astype(np.int64)
        lo, hi = 0, self.keys  # entries [0, lo) hash below, [hi, keys) above
        lo_hash, hi_hash = -1, 1 << 31
        bisecting = False
        while hi - lo > window:
            span = hi - lo
            if bisecting:
                guess = lo + span // 2
            else:
                guess = lo + (key_hash - lo_hash) * span // max(hi_hash - lo_hash, 1)
            start = min(max(guess - window // 2, lo), hi - window)
            raw = self._entries(fetch, start, start + window)
            hashes = self._key_array(raw)["hash"]
            first, last = int(hashes[0]), int(hashes[-1])
            if last < key_hash:
                lo, lo_hash = start + window, last
            elif first > key_hash:
                hi, hi_hash = start, first
            else:
                return self._run(fetch, key_hash, start, start + window, raw, lo, hi)
            bisecting = hi - lo > span // 2  # a poor guess: halve next time
        if hi <= lo:
            return np.empty(0, dtype=np.int64)
        return self._run(fetch, key_hash, lo, hi, self._entries(fetch, lo, hi), lo, hi)

    def key_span(self, key_hash: int) -> tuple[int, int]:
        """Key entries [a, b) that hold every entry of ``key_hash``, from the key sample
        (version 2): past the last sampled entry below the hash, up to the first sampled entry
        above it; one stride when no sampled entry has the hash. Raises ValueError without a
        sample (a version 1 object)."""
        if not self.key_stride:
            raise ValueError(f"{self.where}: a version 1 index has no key sample")
        sample = np.frombuffer(self.key_sample, dtype=">i4")
        below = int(np.searchsorted(sample, key_hash, "left"))  # sample[below - 1] < hash
        above = int(np.searchsorted(sample, key_hash, "right"))  # sample[above] > hash
        return max(below - 1, 0) * self.key_stride, min(above * self.key_stride, self.keys)

    def _entries(self, read: Read, a: int, b: int) -> bytes:
        start = self.keys_start + KEY_SIZE * a
        raw = read(start, self.keys_start + KEY_SIZE * b)
        if len(raw) != KEY_SIZE * (b - a):
            raise CorruptIndexError(self.where, start, f"key entries {a}..{b} read short")
        return raw

    def _run(
        self, read: Read, key_hash: int, a: int, b: int, raw: bytes, lo: int, hi: int
    ) -> npt.NDArray[np.int64]:
        """The offsets of the entries of ``key_hash`` in and around entries [a, b), whose bytes
        ``raw`` are read, within [lo, hi): the read widens (doubling) while the run reaches an
        edge of what was read."""
        step = max(b - a, 1)
        while True:
            keys = self._key_array(raw)
            hashes = keys["hash"]
            i = int(np.searchsorted(hashes, key_hash, "left"))
            j = int(np.searchsorted(hashes, key_hash, "right"))
            widen_left = i == 0 < j and a > lo
            widen_right = j == len(hashes) > i and b < hi
            if not (widen_left or widen_right):
                return keys["offset"][i:j].astype(np.int64)
            step *= 2
            if widen_left:
                a, raw = max(lo, a - step), self._entries(read, max(lo, a - step), a) + raw
            if widen_right:
                b, raw = min(hi, b + step), raw + self._entries(read, b, min(hi, b + step))


def _short(head: bytes, need: int, length: int | None, where: str) -> NeedMore | None:
    """NeedMore when ``head`` is shorter than the ``need`` bytes the head has so far been
    found to take; raises when the object (of ``length`` bytes, when known) cannot hold them."""
    if length is not None and need > length:
        raise CorruptIndexError(
            where, 28, f"truncated or bad counts: a head of {need} bytes in an object of {length}"
        )
    return NeedMore(need) if len(head) < need else None


def _row_key(row: QueueRow) -> tuple[bytes, int]:
    return row.topic.encode("utf-8"), row.queue_id


def _rows(
    head: bytes, queues: int, head_length: int, names_length: int, where: str
) -> tuple[QueueRow, ...]:
    """The queue table, checked: names inside the name area and UTF-8, rows strictly sorted,
    units back to back from the end of the head."""
    names_at = HEADER_SIZE + ROW_SIZE * queues
    names = bytes(head[names_at : names_at + names_length])
    rows: list[QueueRow] = []
    start = head_length
    previous: tuple[bytes, int] | None = None
    for i in range(queues):
        at = HEADER_SIZE + ROW_SIZE * i
        name_off, name_len, queue_id, units, first, units_start = QUEUE_ROW.unpack_from(head, at)
        if name_off < 0 or name_len <= 0 or name_off + name_len > names_length:
            raise CorruptIndexError(where, at, f"topic name {name_off}+{name_len} outside names")
        raw = names[name_off : name_off + name_len]
        try:
            topic = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptIndexError(where, names_at + name_off, "topic name not UTF-8") from None
        if units <= 0 or first < 0 or units_start != start:
            raise CorruptIndexError(
                where,
                at + 12,
                f"row {i}: {units} units from queue offset {first} at byte {units_start} "
                f"(expected at {start})",
            )
        if previous is not None and (raw, queue_id) <= previous:
            raise CorruptIndexError(where, at, f"row {i} out of (topic, queue id) order")
        previous = (raw, queue_id)
        rows.append(QueueRow(topic, queue_id, units, first, units_start))
        start += UNIT_SIZE * units
    return tuple(rows)


def unit_at_time(units: Units, timestamp: int) -> int:
    """The index of the first of ``units`` (one queue's, in queue order) stored at or after
    ``timestamp``; ``len(units)`` when none is. Store times of a queue rise with its offsets
    unless the writer's clock stepped back; then this is a unit at or after the time, not
    necessarily the first."""
    return int(np.searchsorted(units["store_ts"], timestamp, "left"))
