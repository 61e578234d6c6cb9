"""A full consistency scan of a store directory (``rocketstore verify STORE``).

:func:`verify` reads every byte of the CommitLog, the ConsumeQueues and the IndexFiles and checks
that each is well formed and that they agree with one another. It changes nothing and never
stops at the first problem: each one becomes a :class:`Problem` naming the file, the byte offset
(the physical offset for the CommitLog, the position inside the file for a ConsumeQueue or an
IndexFile) and what is wrong, and the scan carries on.

CommitLog
    Every segment is walked from its start. Each record must have the magic code, a TOTALSIZE
    that fits the segment and equals the sum of its field lengths, PHYSICALOFFSET equal to its
    position, a body CRC that matches and a UTF-8 topic; an END_OF_FILE blank moves on to the
    next segment and must cover exactly the rest of its segment. After a damaged record the
    walk resynchronises on the next record boundary: the next ConsumeQueue unit's offset that
    looks like a record start, or, before it or when there is none, the next position where a
    whole valid record starts (its PHYSICALOFFSET must equal that position, so a stray copy of
    the magic code inside a body is not taken for one). Zeros where a record was expected are
    the end of the log, unless data follows them (a hole); non-zero bytes after the end are
    reported as garbage.

ConsumeQueues
    Every unit between the first and the last valid one must point at a record that starts at
    that offset, with TOTALSIZE equal to the unit's size, the queue's topic and queue id, the
    unit's number as QUEUEOFFSET and the Java hash of its TAGS as tagsCode; units must follow
    the CommitLog order, and no invalid unit may come before the last valid one. Every record
    that belongs in a ConsumeQueue (not a PREPARED or ROLLBACK transaction) must have its unit.

IndexFiles
    The header must be sane and agree with the entries, every file but the last must be full,
    every used entry must point at a record
    whose ``topic#key`` hash (UNIQ_KEY or a KEYS token) is the entry's key hash and whose store
    time gives the entry's time difference; slot heads and ``prevIndex`` links must stay inside
    the used entries, go strictly down, stay in one slot, and reach every entry exactly once.
    Every key (UNIQ_KEY, KEYS tokens) of every record from the oldest one indexed on must have
    its entry.

A unit or entry that points at a damaged record is not checked further (the record is reported).

A consistent snapshot
    While another process writes the store (it holds the ``lock``), the scan stops at the
    durable point recorded when it starts (``config/rocketstore.json``: the flushed CommitLog
    offset and each queue's length then, all of whose units and index entries were on disk
    before the file was written). Records, units and index entries past it are the writer's
    work in progress and are not checked, so appends during the scan report nothing. Without
    a progress file the bound is the end of the log that the read-only open found.

After a crash
    A writer that stopped between appending and dispatching leaves its newest records without
    their ConsumeQueue units or index entries (``cq-missing-unit``, ``index-missing-entry``).
    When such a record lies past the durable point, the problem says so, and that
    ``rocketstore recover`` (or the next writable open) repairs it.
When a unit and the record it points at disagree, the problem is blamed on the side the rest of
the store contradicts: a unit pointing at a record that its own unit (the one at the record's
topic, queue id and queue offset) already claims is wrong itself, and so are units that point
at each other's records (swapped or shifted); a record that claims a place no unit backs, or
one that another record rightly holds, is wrong itself.

What cannot be checked: RocketMQ 4.x protects only the body with a CRC. FLAG, the timestamps,
the hosts, RECONSUMETIMES, the prepared-transaction offset, the transaction-type bits (beyond
ConsumeQueue membership) and properties other than TAGS, KEYS and UNIQ_KEY have no second copy
anywhere in the store, so damage to them cannot be detected, here or by RocketMQ. A changed TAGS
value and a changed unit tagsCode look the same, and are reported at the unit; likewise a changed
KEYS or UNIQ_KEY value is reported at the index entries that no longer match it.

Problem kinds (stable strings):

=================================== ==========================================================
commitlog-bad-magic                 neither the message magic nor a blank where one must start
commitlog-size                      TOTALSIZE out of range, or the field lengths do not add up
commitlog-physical-offset           PHYSICALOFFSET is not the record's position
commitlog-crc                       body CRC mismatch
commitlog-topic                     the topic is not valid UTF-8
commitlog-blank                     an END_OF_FILE blank that does not end its segment
commitlog-hole                      zeros where a record or blank was expected, data after
commitlog-garbage-after-end         non-zero bytes after the last record of the log
commitlog-garbage-after-blank       non-zero bytes after an END_OF_FILE blank
commitlog-record-mismatch           a record's topic, queue id, queue offset or transaction type
                                    contradicts the ConsumeQueue unit pointing at it
cq-unit-points-nowhere              no record starts at the unit's offset
cq-unit-wrong-queue                 the record belongs to another queue or queue offset
cq-unit-size-mismatch               unit size differs from the record's TOTALSIZE
cq-unit-tags-code                   unit tagsCode differs from the hash of the record's TAGS
cq-unit-not-dispatchable            the unit points at a PREPARED or ROLLBACK record
cq-not-ascending                    units out of CommitLog order
cq-hole                             an invalid unit before the last valid one
cq-garbage-after-end                non-zero bytes after the last valid unit
cq-missing-unit                     a record has no unit in its queue
index-header                        header field out of range or contradicting the entries
index-slot                          slot head out of range or in the wrong slot
index-chain                         bad prevIndex, or an entry unreachable or reached twice
index-entry-points-nowhere          no record starts at the entry's phyOffset
index-entry-hash                    the entry's key hash is none of the record's keys
index-entry-time                    the entry's time difference contradicts the record
index-unused-entry                  non-zero bytes in entry 0 (never used) or after indexCount
index-missing-entry                 a key of a record has no entry (reported at its slot)
=================================== ==========================================================

By default at most :data:`MAX_PROBLEMS_PER_KIND` problems of one kind are listed per file; the
rest are counted in :attr:`VerifyReport.suppressed`.

Performance: the CommitLog walk reads record headers in Python (a few hundred nanoseconds a
record) and does everything else with numpy over the mapped segments, a chunk at a time; the
ConsumeQueue and index checks are joins of numpy arrays. A million small messages verify in a
few seconds.

Thread-safety: reads only. Run it on a store opened read-only, or from the writer's thread
between puts.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import record
from pipeline.config import CQ_UNIT_SIZE
from pipeline.consumequeue import PRE_BLANK_SIZE, UNIT_DTYPE, ConsumeQueue
from pipeline.encode import index_keys
from pipeline.errors import CorruptRecordError
from pipeline.indexfile import (
    ENTRY_DTYPE,
    ENTRY_SIZE,
    HEADER,
    HEADER_SIZE,
    INT_MAX,
    SLOT_SIZE,
    IndexFile,
)
from pipeline.javahash import java_hash_array
from pipeline.lock import is_locked_elsewhere
from pipeline.mapped_file import MappedFile, segment_name
from pipeline.progress import FlushProgress
from pipeline.store import MessageStore

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Progress = Callable[[int, int], None]

MAX_PROBLEMS_PER_KIND = 100
CHUNK_BYTES = 8 << 20  # CommitLog bytes walked between two vectorised checks
SCAN_STEP = 4 << 20  # bytes searched at once for a magic code
ZERO_STEP = 1 << 20  # bytes tested at once for non-zero content
MAX_CQ_CANDIDATES = 256  # ConsumeQueue offsets tried as a resynchronisation point
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # its tagsCode is a delivery time, not a tag hash

_MAGIC_BYTES = record.INT.pack(record.MAGIC)
_BLANK_BYTES = record.INT.pack(record.BLANK_MAGIC)
_CRC_MASK = 0x7FFFFFFF
_TAGS = record.PROPERTY_TAGS.encode()
_KEYS = record.PROPERTY_KEYS.encode()
_UNIQ = record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
_HEADER_FIELDS = (
    ("beginTimestamp", 0),
    ("endTimestamp", 8),
    ("beginPhyOffset", 16),
    ("endPhyOffset", 24),
    ("hashSlotCount", 32),
    ("indexCount", 36),
)


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """One inconsistency: ``kind`` (see the module docstring), the file, the byte offset (the
    physical offset for the CommitLog, the position inside the file otherwise) and a text."""

    kind: str
    path: str
    offset: int
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "offset": self.offset, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.path} @ {self.offset}: {self.kind}: {self.detail}"


@dataclasses.dataclass
class VerifyReport:
    """What :func:`verify` found, and how much it checked."""

    store: str
    problems: list[Problem] = dataclasses.field(default_factory=list)
    suppressed: int = 0  # problems not listed (beyond the cap for their kind and file)
    segments: int = 0
    commitlog_bytes: int = 0  # CommitLog bytes scanned (whole segments)
    records: int = 0  # valid records
    record_bytes: int = 0
    blanks: int = 0
    damaged_records: int = 0
    damaged_bytes: int = 0  # CommitLog bytes skipped from damaged records to the next boundary
    queues: int = 0
    units: int = 0  # units checked against their record
    index_files: int = 0
    index_entries: int = 0  # entries checked against their record
    seconds: float = 0.0
    # CommitLog offset the scan stopped at because a writer was appending (None: the whole log)
    snapshot_end: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and not self.suppressed

    def counters(self) -> dict[str, int]:
        return {
            "segments": self.segments,
            "bytes": self.commitlog_bytes,
            "records": self.records,
            "recordBytes": self.record_bytes,
            "blanks": self.blanks,
            "damagedRecords": self.damaged_records,
            "damagedBytes": self.damaged_bytes,
            "queues": self.queues,
            "units": self.units,
            "indexFiles": self.index_files,
            "indexEntries": self.index_entries,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "ok": self.ok,
            "counters": self.counters(),
            "seconds": round(self.seconds, 3),
            "problemsSuppressed": self.suppressed,
            "snapshotEnd": self.snapshot_end,
            "problems": [p.to_json() for p in self.problems],
        }


def verify(
    store: MessageStore,
    *,
    progress: Progress | None = None,
    max_per_kind: int | None = MAX_PROBLEMS_PER_KIND,
) -> VerifyReport:
    """Check the whole store; see the module docstring. ``progress(done, total)`` is called
    with byte counts as the scan advances. At most ``max_per_kind`` problems of one kind are
    listed per file (None: all); the others are only counted."""
    verifier = _Verifier(store, progress, max_per_kind)
    try:
        return verifier.run()
    finally:
        # Views of the mapped segments must not outlive the scan: closing the store would
        # fail while one exists.
        verifier.release()


# -- helpers ---------------------------------------------------------------------------------


def _read_be(a: npt.NDArray[np.uint8], at: I64, width: int) -> I64:
    """Big-endian signed ints of ``width`` bytes at each offset of ``at`` (clipped into ``a``)."""
    if not len(at):
        return np.zeros(0, dtype=np.int64)
    at = np.clip(at, 0, len(a) - width)
    cols = a[at[:, None] + np.arange(width, dtype=np.int64)]
    return np.ascontiguousarray(cols).view(f">i{width}").reshape(-1).astype(np.int64)


def _resumed(target: int | None) -> str:
    return f"; next record at {target}" if target is not None else "; no valid record follows"


def _gather(a: npt.NDArray[np.uint8], starts: I64, lengths: I64) -> pa.BinaryArray:
    """The byte ranges ``a[starts[i] : starts[i] + lengths[i]]`` as one Arrow binary array."""
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        idx = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1] - starts, lengths)
        values = a[idx]
    else:
        values = np.zeros(0, dtype=np.uint8)
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(starts),
        [None, pa.py_buffer(offsets), pa.py_buffer(values)],
    )


def _property_columns(props: pa.Array) -> dict[str, pa.Array]:
    """TAGS, KEYS and UNIQ_KEY of each properties block (null when absent), read as
    :func:`record.decode_properties` reads them: items split on \\x02, the name ends at the
    first \\x01, the last of repeated names wins, invalid UTF-8 is replaced."""
    try:
        text = props.cast(pa.large_string())
    except pa.ArrowInvalid:
        text = pa.array(
            [b.decode("utf-8", "replace") for b in props.to_pylist()], pa.large_string()
        )
    items = pc.split_pattern(text, record.PROPERTY_SEPARATOR)
    flat = pc.list_flatten(items)
    parents = pc.list_parent_indices(items).to_numpy(zero_copy_only=False).astype(np.int64)
    out: dict[str, pa.Array] = {}
    for name in (
        record.PROPERTY_TAGS,
        record.PROPERTY_KEYS,
        record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    ):
        prefix = name + record.NAME_VALUE_SEPARATOR
        hit = np.flatnonzero(
            pc.starts_with(flat, prefix).to_numpy(zero_copy_only=False).astype(bool)
        )
        owner = parents[hit]
        # Items come in order within a block: the last hit of each block is the one kept.
        last = np.ones(len(hit), dtype=bool)
        last[:-1] = owner[1:] != owner[:-1]
        values = pc.utf8_slice_codeunits(flat.take(pa.array(hit[last])), len(prefix))
        where = np.full(len(props), -1, dtype=np.int64)
        where[owner[last]] = np.arange(int(np.count_nonzero(last)), dtype=np.int64)
        out[name] = values.take(pa.array(where, mask=where < 0))
    return out


@dataclasses.dataclass
class _Queue:
    cq: ConsumeQueue
    files: list[MappedFile]
    first: int  # queue offset of unit 0 of files[0]
    offsets: I64
    sizes: I64
    tags: I64
    checked: I64  # unit numbers (relative to `first`) to check against their records


@dataclasses.dataclass
class _Chunk:
    """The valid records of one walked chunk of a segment, column by column."""

    starts: I64
    sizes: I64
    queue_ids: I64
    queue_offsets: I64
    sys_flags: I64
    store_ts: I64
    topic_ids: I64
    props: pa.BinaryArray


class _Verifier:
    def __init__(
        self, store: MessageStore, progress: Progress | None, max_per_kind: int | None
    ) -> None:
        self.store = store
        self.max_per_kind = max_per_kind
        self.report = VerifyReport(str(store.path))
        self.progress = progress
        self.log = store.commitlog
        self.files = self.log.segments.files
        self.seg_size = self.log.segment_size
        self.base0 = self.files[0].base if self.files else 0
        self.log_end = self.files[-1].base + self.seg_size if self.files else 0
        flushed = FlushProgress.read(store.path / "config")
        self.durable_end = flushed.flushed_offset if flushed is not None else None
        self.crashed = (store.path / "abort").exists()
        # Queue lengths at the snapshot ("topic/queueId" -> length); None: no bound.
        self.queue_lengths: dict[str, int] | None = None
        if store.read_only and is_locked_elsewhere(store.path):
            if flushed is not None and flushed.flushed_offset >= self.base0:
                self.log_end = min(self.log_end, flushed.flushed_offset)
                self.queue_lengths = flushed.queues
            else:
                self.log_end = min(self.log_end, store.commitlog.max_offset)
            self.report.snapshot_end = self.log_end
        self._arrays: dict[int, npt.NDArray[np.uint8]] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self.topic_ids: dict[bytes, int] = {}
        self.topics: list[str] = []
        self.chunks: list[_Chunk] = []
        self.damaged: list[tuple[int, int]] = []  # [start, end) of each damaged stretch
        self.queues: list[_Queue] = []
        self.cq_starts: I64 = np.zeros(0, dtype=np.int64)
        self.cl_total = sum(mf.size for mf in self.files)
        self.done = 0
        self.total = self.cl_total
        index_files = store.index.files if store.index is not None else []
        for f in index_files:
            self.total += HEADER_SIZE + SLOT_SIZE * f.slot_num + ENTRY_SIZE * f.index_num
        for cq in store.queues.values():
            self.total += cq.file_size * len(cq.segments.files)

    # -- bookkeeping ----------------------------------------------------------------------------
    def problem(self, kind: str, path: str | Path, offset: int, detail: str) -> None:
        key = (kind, str(path))
        seen = self._counts.get(key, 0)
        self._counts[key] = seen + 1
        if self.max_per_kind is not None and seen >= self.max_per_kind:
            self.report.suppressed += 1
            return
        self.report.problems.append(Problem(kind, str(path), int(offset), detail))

    def tick(self, done: int) -> None:
        self.done = done
        if self.progress is not None:
            self.progress(min(done, self.total), self.total)

    def release(self) -> None:
        self._arrays.clear()
        self.queues.clear()
        self.chunks.clear()

    def array(self, i: int) -> npt.NDArray[np.uint8]:
        a = self._arrays.get(i)
        if a is None:
            a = np.frombuffer(self.files[i].buffer, dtype=np.uint8)
            self._arrays[i] = a
        return a

    def mark(self, phys: int, end: int | None) -> None:
        """Note a damaged record (or hole) at ``phys``, reaching to the next boundary ``end``."""
        stop = self.log_end if end is None else end
        self.damaged.append((phys, stop))
        self.report.damaged_bytes += stop - phys

    def repair_note(self, phys: int) -> str:
        """Why a record past the durable point lacks a unit or an entry, and what repairs it."""
        if self.durable_end is not None and phys >= self.durable_end:
            where = f"past the durable point {self.durable_end} (config/rocketstore.json)"
        elif self.durable_end is None and self.crashed:
            where = "after a writer stopped without closing the store (abort file present)"
        else:
            return ""
        return (
            f"; the record is {where}: the writer stopped before dispatching it, and "
            "`rocketstore recover` (or the next writable open) repairs it"
        )

    def seg_index(self, phys: int) -> int:
        return (phys - self.base0) // self.seg_size

    def topic_name(self, tid: int) -> str:
        return self.topics[tid] if 0 <= tid < len(self.topics) else "?"

    def topic_id(self, topic: str) -> int:
        raw = topic.encode("utf-8")
        tid = self.topic_ids.get(raw)
        if tid is None:
            tid = self.topic_ids[raw] = len(self.topics)
            self.topics.append(topic)
        return tid

    def run(self) -> VerifyReport:
        started = time.perf_counter()
        self.report.segments = len(self.files)
        self.report.commitlog_bytes = self.cl_total
        self.load_queues()
        walked_from = self.done
        self.walk_commitlog()
        self.tick(walked_from + self.cl_total)
        self.collect_records()
        self.check_queues()
        self.check_index()
        self.tick(self.total)
        self.report.damaged_records = len(self.damaged)
        self.report.seconds = time.perf_counter() - started
        return self.report

    # -- ConsumeQueue units (read before the walk: they guide resynchronisation) -------------
    def load_queues(self) -> None:
        for (_, _), cq in sorted(self.store.queues.items()):
            files = list(cq.segments.files)
            if not files:
                continue
            per_file = cq.units_per_file
            parts = [np.frombuffer(mf.buffer, dtype=UNIT_DTYPE, count=per_file) for mf in files]
            units = np.concatenate(parts) if len(parts) > 1 else parts[0]
            first = files[0].base // CQ_UNIT_SIZE
            if self.queue_lengths is not None:
                # A writer is appending: units past the snapshot's length are not checked.
                units = units[
                    : max(0, self.queue_lengths.get(f"{cq.topic}/{cq.queue_id}", 0) - first)
                ]
            offsets = units["offset"].astype(np.int64)
            sizes = units["size"].astype(np.int64)
            tags = units["tags_code"].astype(np.int64)
            q = _Queue(cq, files, files[0].base // CQ_UNIT_SIZE, offsets, sizes, tags, offsets[:0])
            valid = (offsets >= 0) & (sizes > 0)
            # RocketMQ's "pre-blank" units fill a queue's first file up to its first unit.
            real = np.flatnonzero(sizes != PRE_BLANK_SIZE)
            lead = int(real[0]) if len(real) else len(sizes)
            present = np.flatnonzero(valid[lead:]) + lead
            last = int(present[-1]) if len(present) else lead - 1
            for k in (np.flatnonzero(~valid[lead : last + 1]) + lead).tolist():
                self.unit_problem(
                    q,
                    k,
                    "cq-hole",
                    f"invalid unit (offset {int(offsets[k])}, size {int(sizes[k])}) before the "
                    f"queue's last unit {q.first + last}: consumers stop here",
                )
            tail = last + 1
            stray = np.flatnonzero((offsets[tail:] != 0) | (sizes[tail:] != 0) | (tags[tail:] != 0))
            if len(stray):
                k = tail + int(stray[0])
                self.unit_problem(
                    q,
                    k,
                    "cq-garbage-after-end",
                    f"{len(stray)} non-zero unit(s) after the queue's last valid unit",
                )
            keep = present[offsets[present] >= self.base0] if len(present) else present
            q.checked = keep.astype(np.int64)
            self.queues.append(q)
            self.report.queues += 1
            self.tick(self.done + cq.file_size * len(files))
        starts = [q.offsets[q.checked] for q in self.queues]
        if starts:
            self.cq_starts = np.sort(np.concatenate(starts))

    def unit_location(self, q: _Queue, k: int) -> tuple[Path, int]:
        per_file = q.cq.units_per_file
        return q.files[k // per_file].path, (k % per_file) * CQ_UNIT_SIZE

    def unit_problem(self, q: _Queue, k: int, kind: str, detail: str) -> None:
        path, pos = self.unit_location(q, k)
        self.problem(kind, path, pos, f"{q.cq.topic}/{q.cq.queue_id} unit {q.first + k}: {detail}")

    # -- the CommitLog walk ------------------------------------------------------------------
    def walk_commitlog(self) -> None:
        unpack = record.SIZE_MAGIC.unpack_from
        magic_ok = record.MAGIC
        min_size = record.FIXED_SIZE_V4
        pos: int | None = self.base0
        cq_done = self.done
        while pos is not None and pos < self.log_end:
            i = self.seg_index(pos)
            mf = self.files[i]
            buf = mf.buffer
            limit = min(mf.size, self.log_end - mf.base)
            rel = pos - mf.base
            chunk_end = min(limit, rel + CHUNK_BYTES)
            starts: list[int] = []
            r = rel
            while r < chunk_end and r + 8 <= limit:
                size, magic = unpack(buf, r)
                if magic != magic_ok or size < min_size or r + size > limit:
                    break
                starts.append(r)
                r += size
            if starts:
                target = self.check_chunk(i, starts)
                if target != mf.base + r:
                    pos = target
                    if pos is not None:
                        self.tick(cq_done + pos - self.base0)
                    continue
            pos = mf.base + r if chunk_end <= r < limit else self.boundary(i, r)
            if pos is not None:
                self.tick(cq_done + pos - self.base0)

    def boundary(self, i: int, r: int) -> int | None:
        """Where to go on from segment ``i`` position ``r``, where the quick walk stopped (the
        segment's end, a blank, zeros, or something that is not a record)."""
        mf = self.files[i]
        limit = mf.size
        phys = mf.base + r
        if phys >= self.log_end:
            return None  # the end of the snapshot
        if r >= limit:
            return mf.base + limit
        a = self.array(i)
        if r + 8 > limit:
            if a[r:limit].any():
                return self.damaged_at(
                    phys,
                    "commitlog-bad-magic",
                    f"the last {limit - r} bytes of the segment are neither a record nor zeros",
                )
            return mf.base + limit
        size, magic = record.SIZE_MAGIC.unpack_from(mf.buffer, r)
        if magic == record.BLANK_MAGIC:
            if size == limit - r:
                self.report.blanks += 1
                g = self.first_nonzero(phys + 8, mf.base + limit)
                if g is not None:
                    self.problem(
                        "commitlog-garbage-after-blank",
                        mf.path,
                        g,
                        f"non-zero bytes after the END_OF_FILE blank at {phys}",
                    )
                return mf.base + limit
            return self.damaged_at(
                phys,
                "commitlog-blank",
                f"END_OF_FILE blank says {size} bytes remain in the segment, {limit - r} do",
            )
        if size == 0 and magic == 0:
            return self.zeros_at(phys)
        if magic != record.MAGIC:
            return self.damaged_at(
                phys, "commitlog-bad-magic", f"bad magic code 0x{magic & 0xFFFFFFFF:08X}"
            )
        return self.damaged_at(
            phys, "commitlog-size", f"bad total size {size} ({limit - r} bytes left in segment)"
        )

    def damaged_at(self, phys: int, kind: str, detail: str) -> int | None:
        """Report the record at ``phys`` and return the next record boundary (None: none)."""
        target = self.resync(phys)
        if target is None and kind == "commitlog-bad-magic" and not self.looks_like_record(phys):
            g = self.first_nonzero(phys, self.log_end)
            self.problem(
                "commitlog-garbage-after-end",
                self.files[self.seg_index(phys)].path,
                phys,
                f"{detail}; no valid record follows (first non-zero byte at {g})",
            )
            return None
        self.mark(phys, target)
        self.problem(kind, self.record_path(phys), phys, detail + _resumed(target))
        return target

    def zeros_at(self, phys: int) -> int | None:
        """A zero header where a record or blank was expected: the end of the log, unless
        something follows."""
        q = self.next_cq_start(phys)
        stop = q if q is not None else self.log_end
        g = self.first_nonzero(phys, stop)
        path = self.record_path(phys)
        if g is None:
            if q is None:
                return None
            self.mark(phys, q)
            self.problem(
                "commitlog-hole",
                path,
                phys,
                f"zeros from {phys} to {q}, where a record the ConsumeQueues know starts: "
                "a reader (and RocketMQ's recovery) stops here",
            )
            return q
        s = self.scan_valid(max(phys + 1, g - 3), stop)
        target = s if s is not None else q
        if target is None:
            self.problem(
                "commitlog-garbage-after-end",
                self.record_path(g),
                g,
                f"non-zero bytes after the end of the log at {phys}, and no valid record",
            )
            return None
        self.mark(phys, target)
        if g >= target:
            self.problem(
                "commitlog-hole",
                path,
                phys,
                f"zeros from {phys} to {target}, where the next record starts: a reader (and "
                "RocketMQ's recovery) stops here",
            )
            return target
        self.problem(
            "commitlog-bad-magic",
            path,
            phys,
            f"zeroed header, then non-zero bytes from {g}; the next record starts at {target}",
        )
        return target

    def looks_like_record(self, phys: int) -> bool:
        i = self.seg_index(phys)
        mf = self.files[i]
        rel = phys - mf.base
        if rel + 36 > mf.size:
            return False
        magic = record.INT.unpack_from(mf.buffer, rel + 4)[0]
        return bool(
            magic == record.MAGIC
            or record.LONG.unpack_from(mf.buffer, rel + record.OFF_PHYSICALOFFSET)[0] == phys
        )

    def valid_at(self, phys: int) -> bool:
        """Whether a whole valid record, or a blank ending its segment, starts at ``phys``."""
        if not self.base0 <= phys < self.log_end:
            return False
        mf = self.files[self.seg_index(phys)]
        rel = phys - mf.base
        if rel + 8 > mf.size:
            return False
        size, magic = record.SIZE_MAGIC.unpack_from(mf.buffer, rel)
        if magic == record.BLANK_MAGIC:
            return bool(size == mf.size - rel)
        if magic != record.MAGIC:
            return False
        try:
            record.decode_record(
                mf.buffer, rel, phys=phys, limit=mf.size, check_crc=True, with_body=False
            )
        except CorruptRecordError:
            return False
        return True

    def next_cq_start(self, phys: int) -> int | None:
        """The first ConsumeQueue offset after ``phys`` that looks like a record start (a unit
        whose offset field was damaged points into the middle of a record: skipped)."""
        j = int(np.searchsorted(self.cq_starts, phys, side="right"))
        for q in self.cq_starts[j : j + MAX_CQ_CANDIDATES].tolist():
            if q < self.log_end and self.looks_like_record(q):
                return int(q)
        return None

    def resync(self, phys: int) -> int | None:
        """The next record boundary after a damaged record at ``phys``."""
        q = self.next_cq_start(phys)
        s = self.scan_valid(phys + 1, q if q is not None else self.log_end)
        return s if s is not None else q

    def scan_valid(self, lo: int, hi: int) -> int | None:
        """The first position in ``[lo, hi)`` where a record certainly starts: a whole valid
        record or blank, or a (damaged) record whose PHYSICALOFFSET field holds its position."""
        for c, placed in self.candidates(lo, hi):
            if placed or self.valid_at(c):
                return c
        return None

    def candidates(self, lo: int, hi: int) -> Iterator[tuple[int, bool]]:
        """Positions in ``[lo, hi)``, in order, that have a magic or blank code 4 bytes on, or
        their own offset 28 bytes on (then paired with True)."""
        lo = max(lo, self.base0)
        hi = min(hi, self.log_end)
        while lo < hi:
            i = self.seg_index(lo)
            mf = self.files[i]
            size = mf.size
            buf = mf.buffer
            x = lo - mf.base
            x_end = min(hi, mf.base + size) - mf.base
            while x < x_end:
                x2 = min(x_end, x + SCAN_STEP)
                found: dict[int, bool] = {}
                data = bytes(buf[x + 4 : min(x2 + 7, size)])
                for pattern in (_MAGIC_BYTES, _BLANK_BYTES):
                    k = data.find(pattern)
                    while k != -1 and x + k < x2:
                        found[x + k] = False
                        k = data.find(pattern, k + 1)
                top = min(x2, size - 35)  # PHYSICALOFFSET must fit in the segment
                for shift in range(8):
                    first = x + shift
                    count = (top - first + 7) // 8
                    if count <= 0:
                        continue
                    field = np.frombuffer(
                        buf, dtype=">i8", count=count, offset=first + record.OFF_PHYSICALOFFSET
                    )
                    where = mf.base + first + 8 * np.arange(count, dtype=np.int64)
                    for rel in (np.flatnonzero(field == where) * 8 + first).tolist():
                        found[rel] = True
                for rel in sorted(found):
                    yield mf.base + rel, found[rel]
                x = x2
            lo = mf.base + size

    def first_nonzero(self, lo: int, hi: int) -> int | None:
        lo = max(lo, self.base0)
        hi = min(hi, self.log_end)
        while lo < hi:
            i = self.seg_index(lo)
            mf = self.files[i]
            a = self.array(i)
            r = lo - mf.base
            r_end = min(hi, mf.base + mf.size) - mf.base
            while r < r_end:
                block = a[r : min(r_end, r + ZERO_STEP)]
                if block.any():
                    return mf.base + r + int(np.argmax(block != 0))
                r += len(block)
            lo = mf.base + mf.size
        return None

    def check_chunk(self, i: int, rel_starts: list[int]) -> int | None:
        """Check the records the quick walk found in segment ``i`` and keep the valid ones.

        Returns where the walk goes on: the end of the last record when all are valid, else
        the resynchronisation point after the first damaged record whose successor the quick
        walk did not already find (None when nothing valid follows)."""
        mf = self.files[i]
        base = mf.base
        a = self.array(i)
        buf = mf.buffer
        s = np.asarray(rel_starts, dtype=np.int64)
        n = len(s)
        size = _read_be(a, s, 4)
        crc = _read_be(a, s + record.OFF_BODYCRC, 4)
        queue_id = _read_be(a, s + record.OFF_QUEUEID, 4)
        queue_offset = _read_be(a, s + record.OFF_QUEUEOFFSET, 8)
        physical = _read_be(a, s + record.OFF_PHYSICALOFFSET, 8)
        sys_flag = _read_be(a, s + record.OFF_SYSFLAG, 4)
        born = np.where(sys_flag & record.BORNHOST_V6_FLAG, 20, 8)
        stored = np.where(sys_flag & record.STOREHOSTADDRESS_V6_FLAG, 20, 8)
        store_ts = _read_be(a, s + record.OFF_BORNHOST + born, 8)
        body_len_at = record.OFF_BORNHOST + born + 8 + stored + 12
        shaped = body_len_at + 4 <= size
        body_len = _read_be(a, s + body_len_at, 4)
        body_at = body_len_at + 4
        shaped &= (body_len >= 0) & (body_at + body_len + 3 <= size)
        topic_len_at = np.where(shaped, body_at + body_len, 0)
        topic_len = a[np.clip(s + topic_len_at, 0, len(a) - 1)].astype(np.int64)
        topic_at = topic_len_at + 1
        props_len_at = topic_at + topic_len
        shaped &= props_len_at + 2 <= size
        props_len = _read_be(a, s + np.where(shaped, props_len_at, 0), 2)
        props_at = props_len_at + 2
        shaped &= (props_len >= 0) & (props_at + props_len == size)
        placed = physical == base + s
        good = shaped & placed
        computed = np.zeros(n, dtype=np.int64)
        crc_bad = np.zeros(n, dtype=bool)
        rows = np.flatnonzero(good)
        b0s = (s + body_at)[rows].tolist()
        b1s = (s + body_at + body_len)[rows].tolist()
        crcs = crc[rows].tolist()
        crc32 = zlib.crc32
        for j, k in enumerate(rows.tolist()):
            c = crc32(buf[b0s[j] : b1s[j]]) & _CRC_MASK
            if c != crcs[j]:
                crc_bad[k] = True
                computed[k] = c
        topic_ids, topic_bad = self.topic_column(
            _gather(a, s + topic_at, np.where(good, topic_len, 0))
        )
        props = _gather(a, s + props_at, np.where(good, props_len, 0))
        bad = ~good | crc_bad | topic_bad
        lo = 0
        for f in np.flatnonzero(bad).tolist():
            if f < lo:
                continue
            cols = (size, queue_id, queue_offset, sys_flag, store_ts, topic_ids)
            self.keep(s, lo, f, base, cols, props)
            phys = base + int(s[f])
            if not shaped[f]:
                kind = "commitlog-size"
                detail = (
                    f"field lengths do not add up to TOTALSIZE {int(size[f])} (body length "
                    f"{int(body_len[f])}, sysflag 0x{int(sys_flag[f]) & 0xFFFFFFFF:X})"
                )
            elif not placed[f]:
                kind = "commitlog-physical-offset"
                detail = f"PHYSICALOFFSET field says {int(physical[f])}, record is at {phys}"
            elif crc_bad[f]:
                kind = "commitlog-crc"
                detail = f"body CRC mismatch: stored {int(crc[f])}, computed {int(computed[f])}"
            else:
                kind = "commitlog-topic"
                detail = "topic is not valid UTF-8"
            target = self.resync(phys)
            self.mark(phys, target)
            self.problem(kind, mf.path, phys, detail + _resumed(target))
            if target is None:
                return None
            if f + 1 < n and base + int(s[f + 1]) == target:
                lo = f + 1
                continue
            return target
        cols = (size, queue_id, queue_offset, sys_flag, store_ts, topic_ids)
        self.keep(s, lo, n, base, cols, props)
        return base + int(s[-1] + size[-1])

    def topic_column(self, topics: pa.BinaryArray) -> tuple[I64, Bools]:
        """Store-wide topic ids of raw topics (-1 for an empty range), and which are not UTF-8."""
        encoded = topics.dictionary_encode()
        names: list[bytes] = encoded.dictionary.to_pylist()
        ids = np.empty(len(names), dtype=np.int64)
        for j, raw in enumerate(names):
            tid = self.topic_ids.get(raw)
            if tid is None:
                try:
                    topic = raw.decode("utf-8")
                except UnicodeDecodeError:
                    tid = -2
                else:
                    tid = self.topic_ids[raw] = len(self.topics)
                    self.topics.append(topic)
            ids[j] = tid
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        column = ids[codes] if len(ids) else np.full(len(codes), -1, dtype=np.int64)
        return column, column == -2

    def keep(
        self,
        s: I64,
        lo: int,
        hi: int,
        base: int,
        cols: tuple[I64, I64, I64, I64, I64, I64],
        props: pa.BinaryArray,
    ) -> None:
        if hi <= lo:
            return
        size, queue_id, queue_offset, sys_flag, store_ts, topic_ids = cols
        self.chunks.append(
            _Chunk(
                starts=base + s[lo:hi],
                sizes=size[lo:hi],
                queue_ids=queue_id[lo:hi],
                queue_offsets=queue_offset[lo:hi],
                sys_flags=sys_flag[lo:hi],
                store_ts=store_ts[lo:hi],
                topic_ids=topic_ids[lo:hi],
                props=props[lo:hi],
            )
        )
        self.report.records += hi - lo
        self.report.record_bytes += int(size[lo:hi].sum())

    # -- the records, as columns -------------------------------------------------------------
    def collect_records(self) -> None:
        def cat(name: str) -> I64:
            parts = [getattr(c, name) for c in self.chunks]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

        self.starts = cat("starts")
        self.sizes = cat("sizes")
        self.queue_ids = cat("queue_ids")
        self.queue_offsets = cat("queue_offsets")
        self.sys_flags = cat("sys_flags")
        self.store_ts = cat("store_ts")
        self.rec_topic = cat("topic_ids")
        props = (
            pa.chunked_array([c.props for c in self.chunks], pa.large_binary()).combine_chunks()
            if self.chunks
            else pa.array([], pa.large_binary())
        )
        self.props = _property_columns(props)
        self.tags = self.props[record.PROPERTY_TAGS]
        tx = self.sys_flags & record.TRANSACTION_MASK
        self.dispatchable: Bools = (tx == record.TRANSACTION_NOT_TYPE) | (
            tx == record.TRANSACTION_COMMIT_TYPE
        )
        spans = np.asarray(sorted(self.damaged), dtype=np.int64).reshape(-1, 2)
        self.damaged_starts, self.damaged_ends = spans[:, 0].copy(), spans[:, 1].copy()

    def lookup(self, offsets: I64) -> tuple[I64, Bools, Bools]:
        """(record row, is a valid record start, lies in a damaged stretch) per offset."""
        n = len(self.starts)
        if n:
            rows = np.minimum(np.searchsorted(self.starts, offsets), n - 1)
            found = self.starts[rows] == offsets
        else:
            rows = np.zeros(len(offsets), dtype=np.int64)
            found = np.zeros(len(offsets), dtype=bool)
        # Inside a damaged stretch: what is there cannot be checked (the stretch is reported).
        if len(self.damaged_starts):
            span = np.searchsorted(self.damaged_starts, offsets, side="right") - 1
            damaged = (span >= 0) & (offsets < self.damaged_ends[np.maximum(span, 0)])
        else:
            damaged = np.zeros(len(offsets), dtype=bool)
        return rows.astype(np.int64), found, damaged

    def record_path(self, phys: int) -> Path:
        return self.files[self.seg_index(phys)].path

    # -- ConsumeQueues against the records ---------------------------------------------------
    def check_queues(self) -> None:
        n = len(self.starts)
        claimed = np.zeros(n, dtype=bool)
        pointed = np.zeros(n, dtype=bool)
        joined: list[tuple[_Queue, I64, I64, Bools, Bools, Bools]] = []
        # Per queue: which units are checked, and which of those match their record.
        slots: dict[tuple[int, int], tuple[_Queue, Bools, Bools]] = {}
        for q in self.queues:
            k = q.checked
            offsets = q.offsets[k]
            rows, found, damaged = self.lookup(offsets)
            tid = self.topic_id(q.cq.topic)
            matched = (
                found
                & (self.rec_topic[rows] == tid)
                & (self.queue_ids[rows] == q.cq.queue_id)
                & (self.queue_offsets[rows] == q.first + k)
            )
            claimed[rows[matched]] = True
            pointed[rows[found]] = True
            joined.append((q, k, rows, found, damaged, matched))
            self.report.units += int(np.count_nonzero(found))
            in_use = np.zeros(len(q.offsets), dtype=bool)
            in_use[k] = True
            good = np.zeros(len(q.offsets), dtype=bool)
            good[k[matched]] = True
            slots[(tid, q.cq.queue_id)] = (q, in_use, good)

        def slot_misused(r: int) -> bool:
            """Whether the unit at record ``r``'s own coordinates points at another record that
            does not claim it either (units swapped or shifted, not the record damaged)."""
            entry = slots.get((int(self.rec_topic[r]), int(self.queue_ids[r])))
            if entry is None:
                return False
            q, in_use, good = entry
            u = int(self.queue_offsets[r]) - q.first
            return bool(0 <= u < len(in_use) and in_use[u] and not good[u])

        blamed_records: set[int] = set()
        tags_codes = self.tags_codes()
        for q, k, rows, found, damaged, matched in joined:
            topic = q.cq.topic
            for j in np.flatnonzero(~found & ~damaged).tolist():
                u = int(k[j])
                self.unit_problem(
                    q,
                    u,
                    "cq-unit-points-nowhere",
                    f"no record starts at CommitLog offset {int(q.offsets[u])} "
                    f"(unit size {int(q.sizes[u])})",
                )
            for j in np.flatnonzero(found & ~matched).tolist():
                u, r = int(k[j]), int(rows[j])
                says = (
                    f"{self.topic_name(int(self.rec_topic[r]))}/{int(self.queue_ids[r])} "
                    f"offset {int(self.queue_offsets[r])}"
                )
                phys = int(self.starts[r])
                if claimed[r]:
                    self.unit_problem(
                        q,
                        u,
                        "cq-unit-wrong-queue",
                        f"points at the record at {phys}, which is {says} and has its own unit",
                    )
                elif slot_misused(r):
                    self.unit_problem(
                        q,
                        u,
                        "cq-unit-wrong-queue",
                        f"points at the record at {phys}, which is {says}, where the unit points "
                        "at yet another record (units swapped or shifted)",
                    )
                elif r not in blamed_records:
                    blamed_records.add(r)
                    path, pos = self.unit_location(q, u)
                    self.problem(
                        "commitlog-record-mismatch",
                        self.record_path(phys),
                        phys,
                        f"record says {says}, but it is unit {q.first + u} of "
                        f"{topic}/{q.cq.queue_id} ({path} @ {pos}) and no unit of its own "
                        "points at it",
                    )
            fine = np.flatnonzero(matched)
            u_good, r_good = k[fine], rows[fine]
            for j in np.flatnonzero(q.sizes[u_good] != self.sizes[r_good]).tolist():
                u, r = int(u_good[j]), int(r_good[j])
                self.unit_problem(
                    q,
                    u,
                    "cq-unit-size-mismatch",
                    f"size {int(q.sizes[u])}, but the record at {int(self.starts[r])} is "
                    f"{int(self.sizes[r])} bytes",
                )
            if topic != SCHEDULE_TOPIC:
                for j in np.flatnonzero(q.tags[u_good] != tags_codes[r_good]).tolist():
                    u, r = int(u_good[j]), int(r_good[j])
                    self.unit_problem(
                        q,
                        u,
                        "cq-unit-tags-code",
                        f"tagsCode {int(q.tags[u])}, but the record at {int(self.starts[r])} "
                        f"has TAGS {self.tags[r].as_py()!r} (hash {int(tags_codes[r])}): the unit or "
                        "the record's TAGS property is damaged",
                    )
            for j in np.flatnonzero(~self.dispatchable[r_good]).tolist():
                u, r = int(u_good[j]), int(r_good[j])
                self.unit_problem(
                    q,
                    u,
                    "cq-unit-not-dispatchable",
                    f"the record at {int(self.starts[r])} is a PREPARED or ROLLBACK "
                    f"transaction (sysflag 0x{int(self.sys_flags[r]) & 0xFFFFFFFF:X})",
                )
            offs = q.offsets[u_good]
            for j in (np.flatnonzero(np.diff(offs) <= 0) + 1).tolist():
                self.unit_problem(
                    q,
                    int(u_good[j]),
                    "cq-not-ascending",
                    f"offset {int(offs[j])} is not after the previous unit's {int(offs[j - 1])}",
                )
        self.check_missing_units(pointed)

    def tags_codes(self) -> I64:
        if not len(self.tags):
            return np.zeros(0, dtype=np.int64)
        return java_hash_array(self.tags).astype(np.int64)

    def check_missing_units(self, pointed: Bools) -> None:
        root = self.store.path / "consumequeue"
        file_size = self.store.config.mapped_file_size_consume_queue
        for r in np.flatnonzero(self.dispatchable & ~pointed).tolist():
            topic = self.topic_name(int(self.rec_topic[r]))
            qid, qoff = int(self.queue_ids[r]), int(self.queue_offsets[r])
            pos = qoff * CQ_UNIT_SIZE
            base = pos - pos % file_size
            where = root / topic / str(qid)
            self.problem(
                "cq-missing-unit",
                where / segment_name(base) if pos >= 0 else where,
                pos - base if pos >= 0 else pos,
                f"no unit points at the record at {int(self.starts[r])} ({topic}/{qid} "
                f"offset {qoff}){self.repair_note(int(self.starts[r]))}",
            )

    # -- IndexFiles -------------------------------------------------------------------------
    def check_index(self) -> None:
        index = self.store.index
        if index is None or not index.files:
            return
        if len(self.starts):
            rows, hashes = index_keys(
                self.topics,
                self.rec_topic.astype(np.int32),
                self.props[record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX],
                self.props[record.PROPERTY_KEYS],
                np.zeros(len(self.starts), dtype=np.int32),
            )
            # Sorted, for binary search (np.unique would hash millions of values: slower).
            self.key_pairs = np.sort(rows << 32 | (hashes.astype(np.int64) & 0xFFFFFFFF))
        else:
            self.key_pairs = np.zeros(0, dtype=np.int64)
        indexed: list[I64] = []
        begins: list[int] = []
        for n, f in enumerate(index.files):
            pairs, begin = self.check_index_file(f, last=n == len(index.files) - 1)
            indexed.append(pairs)
            begins.append(begin)
            self.report.index_files += 1
            self.tick(self.done + HEADER_SIZE + SLOT_SIZE * f.slot_num + ENTRY_SIZE * f.index_num)
        self.check_missing_entries(index.files, np.sort(np.concatenate(indexed)), begins)

    def check_missing_entries(
        self, files: list[IndexFile], indexed: I64, begins: list[int]
    ) -> None:
        """Every key of every record from the oldest one indexed on (older ones may have gone
        with deleted index files) must have its entry; ROLLBACK records have none."""
        if not len(indexed) or not len(self.starts):
            return
        uniq = self.props[record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
        # An empty UNIQ_KEY is not indexed by this store (RocketMQ would index it).
        uniq = pc.if_else(pc.equal(uniq, ""), pa.scalar(None, uniq.type), uniq)
        rows, hashes = index_keys(
            self.topics,
            self.rec_topic.astype(np.int32),
            uniq,
            self.props[record.PROPERTY_KEYS],
            self.sys_flags.astype(np.int32),
        )
        oldest = int(indexed.min() >> 32)
        keep = rows >= oldest
        rows, hashes = rows[keep], hashes[keep]
        wanted = rows << 32 | (hashes.astype(np.int64) & 0xFFFFFFFF)
        at = np.minimum(np.searchsorted(indexed, wanted), len(indexed) - 1)
        for j in np.flatnonzero(indexed[at] != wanted).tolist():
            r, h = int(rows[j]), int(hashes[j])
            phys = int(self.starts[r])
            # The file that should hold it: the last one that begins at or before it.
            n = max(0, int(np.searchsorted(np.asarray(begins), phys, side="right")) - 1)
            f = files[n]
            self.problem(
                "index-missing-entry",
                f.path,
                HEADER_SIZE + SLOT_SIZE * (h % f.slot_num),
                f"no entry for key hash {h} of the record at {phys} "
                f"({self.topic_name(int(self.rec_topic[r]))}); it belongs in this slot's chain"
                + self.repair_note(phys),
            )

    def check_index_file(self, f: IndexFile, *, last: bool) -> tuple[I64, int]:
        """Check one file; returns (record row << 32 | key hash) of its entries that point at
        records, and its beginPhyOffset."""
        mm = np.memmap(f.path, dtype=np.uint8, mode="r")
        try:
            return self._check_index_file(f, mm, last)
        finally:
            del mm

    def _index_snapshot(
        self, slots: I64, entries: npt.NDArray[np.void]
    ) -> tuple[int, I64, npt.NDArray[np.void]]:
        """The entries of the file being written that lie before the snapshot's end, and its
        slots as they were then: a slot head past them is followed down its chain. Entries are
        copied after the slots, and a writer sets a slot only after writing its entry, so every
        head read has its entry in the copy."""
        entries = entries.copy()
        phy = entries["phy_offset"][1:].astype(np.int64)
        used = np.flatnonzero(phy > 0)
        end = int(used[-1]) + 1 if len(used) else 0
        count = 1 + int(np.searchsorted(phy[:end], self.log_end))
        prev = entries["prev_index"].astype(np.int64)
        heads = slots.copy()
        for _ in range(len(entries)):
            over = np.flatnonzero(heads >= count)
            if not len(over):
                break
            heads[over] = prev[np.clip(heads[over], 0, len(prev) - 1)]
        entries[count:] = np.zeros(len(entries) - count, dtype=ENTRY_DTYPE)
        return count, heads, entries

    def _check_index_file(
        self, f: IndexFile, mm: npt.NDArray[np.uint8], last: bool
    ) -> tuple[I64, int]:
        path = f.path
        slot_num, index_num = f.slot_num, f.index_num
        entries_at = HEADER_SIZE + SLOT_SIZE * slot_num
        if len(mm) != entries_at + ENTRY_SIZE * index_num:
            self.problem("index-header", path, 0, f"file is {len(mm)} bytes, not as configured")
            return np.zeros(0, dtype=np.int64), 0
        header: tuple[int, int, int, int, int, int] = HEADER.unpack_from(bytes(mm[:HEADER_SIZE]), 0)
        begin_ts, end_ts, begin_phy, end_phy, slot_count, raw_count = header
        slots = np.frombuffer(mm, dtype=">i4", count=slot_num, offset=HEADER_SIZE).astype(np.int64)
        entries = np.frombuffer(mm, dtype=ENTRY_DTYPE, count=index_num, offset=entries_at)
        count = min(max(raw_count, 1), index_num)
        # In a file a writer is filling, the header, slots and tail move during the scan.
        moving = False
        if self.report.snapshot_end is not None:
            count, slots, entries = self._index_snapshot(slots, entries)
            moving = last or count < raw_count

        def head(field: int, detail: str) -> None:
            name, at = _HEADER_FIELDS[field]
            self.problem("index-header", path, at, f"{name} {header[field]}: {detail}")

        if not 0 <= raw_count <= index_num:
            head(5, f"outside [0, maxIndexNum={index_num}]")
        elif not last and raw_count != index_num:
            head(5, f"the file is not full (maxIndexNum={index_num}), yet a later one exists")
        used_slots = int(np.count_nonzero(slots))
        if not 0 <= slot_count <= slot_num:
            head(4, f"outside [0, maxHashSlotNum={slot_num}]")
        elif slot_count != used_slots and not moving:
            head(4, f"but {used_slots} slots are in use")
        if count > 1 and begin_ts > end_ts:
            head(0, f"after endTimestamp {end_ts}")
        if count > 1 and begin_phy > end_phy:
            head(2, f"after endPhyOffset {end_phy}")
        raw_entries = entries.view(np.uint8).reshape(-1, ENTRY_SIZE)
        if raw_entries[0].any():
            self.problem("index-unused-entry", path, entries_at, "entry 0 (never used) is not zero")
        tail = np.flatnonzero(raw_entries[count:].any(axis=1))
        if len(tail) and not moving:
            j = count + int(tail[0])
            self.problem(
                "index-unused-entry",
                path,
                entries_at + ENTRY_SIZE * j,
                f"{len(tail)} non-zero entries after indexCount {raw_count}",
            )
        used = entries[1:count]
        key_hash = used["key_hash"].astype(np.int64)
        phy = used["phy_offset"].astype(np.int64)
        time_diff = used["time_diff"].astype(np.int64)
        prev = used["prev_index"].astype(np.int64)
        numbers = np.arange(1, count, dtype=np.int64)

        def entry_at(number: int) -> int:
            return entries_at + ENTRY_SIZE * number

        # Slot heads and chains.
        slot_of = np.mod(key_hash, slot_num)
        bad_head = (slots < 0) | (slots >= count)
        for s in np.flatnonzero(bad_head).tolist():
            self.problem(
                "index-slot",
                path,
                HEADER_SIZE + SLOT_SIZE * s,
                f"slot {s} holds entry {int(slots[s])}, outside [0, indexCount={count})",
            )
        heads = np.flatnonzero(~bad_head & (slots > 0))
        for s in heads[slot_of[slots[heads] - 1] != heads].tolist():
            self.problem(
                "index-slot",
                path,
                HEADER_SIZE + SLOT_SIZE * s,
                f"slot {s} holds entry {int(slots[s])}, whose key hash belongs to slot "
                f"{int(slot_of[slots[s] - 1])}",
            )
        bad_prev = (prev < 0) | (prev >= numbers)
        for j in np.flatnonzero(bad_prev).tolist():
            self.problem(
                "index-chain",
                path,
                entry_at(j + 1),
                f"entry {j + 1}: prevIndex {int(prev[j])} does not go down (must be in [0, "
                f"{j + 1}))",
            )
        links = np.flatnonzero(~bad_prev & (prev > 0))
        for j in links[slot_of[prev[links] - 1] != slot_of[links]].tolist():
            self.problem(
                "index-chain",
                path,
                entry_at(j + 1),
                f"entry {j + 1} (slot {int(slot_of[j])}) links to entry {int(prev[j])} in slot "
                f"{int(slot_of[prev[j] - 1])}",
            )
        refs = np.bincount(prev[links], minlength=count) + np.bincount(
            slots[heads], minlength=count
        )
        for number in (np.flatnonzero(refs[1:count] != 1) + 1).tolist():
            many = int(refs[number])
            self.problem(
                "index-chain",
                path,
                entry_at(number),
                f"entry {number} is "
                + ("not reachable from its slot" if many == 0 else f"linked from {many} places"),
            )
        # Entries against the records.
        # Entries go in CommitLog order, so those of messages retention deleted (below the
        # CommitLog's first offset) come first; one below it after a live one is damaged.
        live = phy >= self.base0
        seen_live = np.cumsum(live) > 0
        expired = ~live & (phy >= 0) & ~seen_live
        rows, found, damaged = self.lookup(phy)
        for j in np.flatnonzero(~expired & ~found & ~damaged).tolist():
            self.problem(
                "index-entry-points-nowhere",
                path,
                entry_at(j + 1),
                f"entry {j + 1}: no record starts at phyOffset {int(phy[j])}",
            )
        ok = np.flatnonzero(live & found)
        self.report.index_entries += len(ok)
        pairs = rows[ok] << 32 | (key_hash[ok] & 0xFFFFFFFF)
        if len(ok):
            if len(self.key_pairs):
                at = np.minimum(np.searchsorted(self.key_pairs, pairs), len(self.key_pairs) - 1)
                known = self.key_pairs[at] == pairs
            else:
                known = np.zeros(len(ok), dtype=bool)
            for j in ok[~known].tolist():
                self.problem(
                    "index-entry-hash",
                    path,
                    entry_at(j + 1),
                    f"entry {j + 1}: key hash {int(key_hash[j])} is none of the keys of the "
                    f"record at {int(phy[j])}",
                )
        for j in np.flatnonzero(time_diff < 0).tolist():
            self.problem(
                "index-entry-time", path, entry_at(j + 1), f"negative timeDiff {int(time_diff[j])}"
            )
        # Header against the entries.
        if count > 1 and not moving:
            if begin_phy != phy[0]:
                head(2, f"but entry 1 is at {int(phy[0])}")
            if end_phy != phy[-1]:
                head(3, f"but the last entry is at {int(phy[-1])}")
            times_ok = True
            if found[0]:
                first_ts = int(self.store_ts[rows[0]])
                if begin_ts != first_ts:
                    head(0, f"but entry 1's message was stored at {first_ts}")
                    times_ok = False
            if found[-1] and end_ts != int(self.store_ts[rows[-1]]):
                head(1, f"but the last entry's message was stored at {self.store_ts[rows[-1]]}")
            if times_ok:
                # RocketMQ computes entry 1's timeDiff before it sets beginTimestamp; from entry
                # 2 on every difference is from entry 1's store time.
                later = ok[ok >= 1]
                if begin_ts <= 0:
                    expected = np.zeros(len(later), dtype=np.int64)
                else:
                    expected = np.clip((self.store_ts[rows[later]] - begin_ts) // 1000, 0, INT_MAX)
                for j in later[time_diff[later] != expected].tolist():
                    self.problem(
                        "index-entry-time",
                        path,
                        entry_at(j + 1),
                        f"entry {j + 1}: timeDiff {int(time_diff[j])}, but its message was "
                        f"stored {int(self.store_ts[rows[j]]) - begin_ts} ms after "
                        "beginTimestamp",
                    )
        return pairs, begin_phy
