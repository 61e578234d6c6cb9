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
commitlog-torn                      a NUL byte in the topic or properties: zeros a write torn
                                    after the body left (no whole record has one there)
commitlog-blank                     an END_OF_FILE blank that does not end its segment
commitlog-hole                      zeros where a record or blank was expected, data after
commitlog-garbage-after-end         non-zero bytes after the last record of the log
commitlog-garbage-after-blank       non-zero bytes after an END_OF_FILE blank
commitlog-fenced-writer             bytes in a dead region (rocketstore.pipeline.fencing): a writer that had
                                    lost the store wrote there; recovery restores the region
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

How the scan reads the log: with the one native record walk (:func:`rocketstore.pipeline.native.walk`)
that recovery and dispatch use, so it checks records exactly as they are read back, and the
tagsCode and index keys it expects are the ones dispatch writes (the walk lists the key hashes:
none for an empty UNIQ_KEY or KEYS token, none for a ROLLBACK record). :data:`CHUNK_RECORDS`
records at a time: once a stretch of the log is walked, the units and index entries that point
into it are checked against its records and the records are dropped, so memory does not grow
with the store. What stays for the whole scan is one byte per ConsumeQueue unit (whether it
matched its record) and the damaged stretches; each IndexFile's header, slots and chains are
checked on their own, one file at a time, before the walk. ConsumeQueue and IndexFile entries
are read from their mappings a file at a time, and bisected where their offsets ascend.

Thread-safety: reads only. Run it on a store opened read-only, or from the writer's thread
between puts.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline import fencing, native, record
from rocketstore.pipeline.config import CQ_UNIT_SIZE
from rocketstore.pipeline.consumequeue import PRE_BLANK_SIZE, UNIT_DTYPE, ConsumeQueue
from rocketstore.pipeline.indexfile import (
    ENTRY_DTYPE,
    ENTRY_SIZE,
    HEADER,
    HEADER_SIZE,
    INT_MAX,
    SLOT_SIZE,
    IndexFile,
)
from rocketstore.pipeline.lock import is_locked_elsewhere
from rocketstore.pipeline.mapped_file import MappedFile, segment_name
from rocketstore.pipeline.progress import FlushProgress
from rocketstore.pipeline.store import MessageStore
from rocketstore.pipeline.verify_report import Problem, VerifyReport

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Progress = Callable[[int, int], None]

__all__ = [
    "CHUNK_RECORDS",
    "MAX_PROBLEMS_PER_KIND",
    "Problem",
    "Progress",
    "VerifyReport",
    "verify",
]

MAX_PROBLEMS_PER_KIND = 100
CHUNK_RECORDS = 1 << 17  # records walked, then checked against units and entries, at once
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

# Segment arrays the scan keeps at once (see _Scan.array).
KEPT_ARRAYS = 4


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


def _resumed(target: int | None) -> str:
    return f"; next record at {target}" if target is not None else "; no valid record follows"


def _kind_of(reason: str) -> str:
    """The problem kind of a whole-looking record the walk rejected, from its reason."""
    if reason.startswith("PHYSICALOFFSET"):
        return "commitlog-physical-offset"
    if reason.startswith("body CRC"):
        return "commitlog-crc"
    if reason.startswith("NUL byte"):
        return "commitlog-torn"
    return "commitlog-size"


@dataclasses.dataclass
class _UnitFile:
    """One ConsumeQueue file of a queue: the units of it to check are ``[lo, hi)`` (relative to
    the file), whose offsets lie in ``[min_off, max_off]`` (``min_off > max_off``: none)."""

    mf: MappedFile
    k0: int  # unit number (relative to the queue's first) of the file's unit 0
    lo: int
    hi: int
    min_off: int
    max_off: int
    ascending: bool  # the offsets of units lo .. hi never go down: bisect them


@dataclasses.dataclass
class _Queue:
    cq: ConsumeQueue
    first: int  # queue offset of unit 0 of its first file
    length: int  # units in the files (up to the snapshot's length)
    lead: int  # first unit that is not a pre-blank
    last: int  # last valid unit
    parts: list[_UnitFile]
    good: Bools  # per unit: matches its record (filled in segment by segment)


@dataclasses.dataclass
class _Units:
    """Units of one file selected for checking, column by column (``k``: unit numbers)."""

    k: I64
    offsets: I64
    sizes: I64
    tags: I64


@dataclasses.dataclass
class _IndexState:
    """What the checks of one IndexFile's entries against the records need, between segments."""

    f: IndexFile
    entries_at: int
    entries: npt.NDArray[np.void]  # used entries 1 .. count - 1 (mapped, or a snapshot copy)
    begin_ts: int
    min_phy: int
    max_phy: int
    ascending: bool  # the entries' phyOffsets never go down: bisect them
    times_ok: bool  # whether entry time differences are checked against beginTimestamp

    def entry_at(self, number: int) -> int:
        return self.entries_at + ENTRY_SIZE * number


@dataclasses.dataclass
class _Segment:
    """The valid records of one CommitLog segment, column by column, from the record walk."""

    phys: I64
    sizes: I64
    queue_ids: npt.NDArray[np.int32]
    queue_offsets: I64
    sys_flags: npt.NDArray[np.int32]
    store_ts: I64
    tags_codes: I64
    topic_ids: I64  # store-wide topic ids
    key_rows: I64  # index entries the records need, in RocketMQ's order: record row ...
    key_hashes: npt.NDArray[np.int32]  # ... and key hash

    @classmethod
    def of(cls, pieces: list[tuple[native.Walk, int, I64]]) -> _Segment:
        """The first ``n`` records of each walk, whose topic codes ``ids`` map to topic ids.
        The walk's columns are kept as they are (no copy) when one walk covers the segment."""

        def cat(parts: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
            if len(parts) == 1:
                return parts[0]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

        rows: list[I64] = []
        hashes: list[npt.NDArray[np.int32]] = []
        ids: list[I64] = []
        done = 0
        for w, n, tids in pieces:
            if n == len(w):
                rows.append(w.key_rows + done if done else w.key_rows)
                hashes.append(w.key_hashes)
            else:
                keep = w.key_rows < n
                rows.append(w.key_rows[keep] + done)
                hashes.append(w.key_hashes[keep])
            ids.append(tids[w.topic_codes[:n]])
            done += n
        return cls(
            phys=cat([w.phys[:n] for w, n, _ in pieces]),
            sizes=cat([w.sizes[:n] for w, n, _ in pieces]),
            queue_ids=cat([w.queue_ids[:n] for w, n, _ in pieces]),
            queue_offsets=cat([w.queue_offsets[:n] for w, n, _ in pieces]),
            sys_flags=cat([w.sys_flags[:n] for w, n, _ in pieces]),
            store_ts=cat([w.store_ts[:n] for w, n, _ in pieces]),
            tags_codes=cat([w.tags_codes[:n] for w, n, _ in pieces]),
            topic_ids=cat(ids),
            key_rows=cat(rows),
            key_hashes=cat(hashes),
        )

    def __len__(self) -> int:
        return len(self.phys)

    def dispatchable(self) -> Bools:
        tx = self.sys_flags & record.TRANSACTION_MASK
        ok: Bools = (tx == record.TRANSACTION_NOT_TYPE) | (tx == record.TRANSACTION_COMMIT_TYPE)
        return ok


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
        self.damaged: list[tuple[int, int]] = []  # [start, end) of each damaged stretch
        self.dead: list[tuple[int, int]] = []  # dead regions (rocketstore.pipeline.fencing)
        self.damaged_starts: I64 = np.zeros(0, dtype=np.int64)
        self.damaged_ends: I64 = np.zeros(0, dtype=np.int64)
        self.spans_stale = False  # damaged_starts/ends lag behind damaged
        self.queues: list[_Queue] = []
        self.queue_of: dict[tuple[int, int], _Queue] = {}
        # Units that point at a record of another queue that no unit claims: which side is
        # wrong is known only once every unit has been matched (queue, unit, record fields).
        self.mismatched: list[tuple[_Queue, int, int, int, int, int]] = []
        self.indexes: list[_IndexState] = []
        self.index_begins: list[int] = []  # beginPhyOffset of every IndexFile
        self.oldest_indexed: int | None = None  # oldest record an index entry points at
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
        self.queue_of.clear()
        self.indexes.clear()

    def array(self, i: int) -> npt.NDArray[np.uint8]:
        """Segment ``i`` as a byte array. Only the last few are kept: each pins its segment's
        mapping, and with it a descriptor (see :mod:`rocketstore.pipeline.mappings`)."""
        a = self._arrays.pop(i, None)
        if a is None:
            a = np.frombuffer(self.files[i].buffer, dtype=np.uint8)
        self._arrays[i] = a
        while len(self._arrays) > KEPT_ARRAYS:
            del self._arrays[next(iter(self._arrays))]
        return a

    def mark(self, phys: int, end: int | None) -> None:
        """Note a damaged record (or hole) at ``phys``, reaching to the next boundary ``end``."""
        stop = self.log_end if end is None else end
        self.damaged.append((phys, stop))
        self.report.damaged_bytes += stop - phys
        self.spans_stale = True

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
        return self.raw_topic_id(topic.encode("utf-8"))

    def raw_topic_id(self, raw: bytes) -> int:
        """The store-wide id of a stored topic name; -2 when it is not valid UTF-8."""
        tid = self.topic_ids.get(raw)
        if tid is None:
            try:
                topic = raw.decode("utf-8")
            except UnicodeDecodeError:
                return -2
            tid = self.topic_ids[raw] = len(self.topics)
            self.topics.append(topic)
        return tid

    def record_path(self, phys: int) -> Path:
        return self.files[self.seg_index(phys)].path

    def record_at(self, phys: int) -> native.Walk | None:
        """The one whole, valid record (UTF-8 topic included) at ``phys``, or None."""
        if not self.base0 <= phys < self.log_end:
            return None
        mf = self.files[self.seg_index(phys)]
        limit = min(mf.size, self.log_end - mf.base)
        w = native.walk(mf.buffer, phys - mf.base, limit, mf.base, check_crc=True, max_records=1)
        if len(w) != 1 or self.raw_topic_id(w.raw_topics[0]) == -2:
            return None
        return w

    def run(self) -> VerifyReport:
        started = time.perf_counter()
        self.report.segments = len(self.files)
        self.report.commitlog_bytes = self.cl_total
        self.load_queues()
        self.load_index()
        walked_from = self.done
        self.check_dead_regions()
        self.walk_commitlog()
        self.tick(walked_from + self.cl_total)
        self.check_mismatched()
        self.check_ascending()
        self.tick(self.total)
        self.report.damaged_records = len(self.damaged)
        self.report.seconds = time.perf_counter() - started
        return self.report

    def check_dead_regions(self) -> None:
        """Name what writers fenced off left in the dead regions their successors made; the
        walk then steps over each region, whatever it holds."""
        self.dead = fencing.dead_regions(fencing.read_epochs(self.store.path))
        for e in fencing.read_epochs(self.store.path):
            if e.dead is None or e.start > self.log_end or e.fenced_end < self.base0:
                continue
            junk = fencing.junk_bytes(self.log, e.fenced_end, e.start)
            if junk:
                self.problem(
                    "commitlog-fenced-writer",
                    self.record_path(e.fenced_end),
                    e.fenced_end,
                    f"{junk} bytes in [{e.fenced_end}, {e.start}), the dead region epoch "
                    f"{e.epoch} began with: a writer that had lost the store wrote there; they "
                    "are not data, and `rocketstore recover` restores the region",
                )

    # -- ConsumeQueue units (read before the walk: they guide resynchronisation) -------------
    def file_units(self, q: _Queue, n: int) -> npt.NDArray[np.void]:
        """The units of the queue's file ``n`` (up to the snapshot's length): a view of the
        mapping, to be dropped before the next file is used (mappings are bounded)."""
        per_file = q.cq.units_per_file
        count = max(0, min(per_file, q.length - n * per_file))
        mf = q.cq.segments.files[n]
        return np.frombuffer(mf.buffer, dtype=UNIT_DTYPE, count=per_file)[:count]

    def checked_units(
        self,
        q: _Queue,
        uf: _UnitFile,
        n: int,
        lo: int = 0,
        hi: int = 1 << 62,
        most: int | None = None,
    ) -> _Units:
        """The units of file ``n`` that are checked against their records: valid ones from the
        queue's first real unit to its last valid one, whose records retention has not
        deleted; when the file's offsets ascend, only those pointing into ``[lo, hi)``, and
        of them at most the first ``most`` (else the caller filters)."""
        units = self.file_units(q, n)
        a, b = uf.lo, uf.hi
        if uf.ascending:
            offset = units["offset"]
            a = bisect.bisect_left(offset, lo, a, b, key=int)
            b = bisect.bisect_left(offset, hi, a, b, key=int)
            if most is not None:
                b = min(b, a + most)
        units = units[a:b]
        offsets = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        keep = np.flatnonzero((offsets >= self.base0) & (sizes > 0))
        return _Units(
            k=uf.k0 + a + keep,
            offsets=offsets[keep],
            sizes=sizes[keep],
            tags=units["tags_code"][keep].astype(np.int64),
        )

    def load_queues(self) -> None:
        for (_, _), cq in sorted(self.store.queues.items()):
            files = list(cq.segments.files)
            if not files:
                continue
            per_file = cq.units_per_file
            first = files[0].base // CQ_UNIT_SIZE
            length = per_file * len(files)
            if self.queue_lengths is not None:
                # A writer is appending: units past the snapshot's length are not checked.
                length = min(
                    length, max(0, self.queue_lengths.get(f"{cq.topic}/{cq.queue_id}", 0) - first)
                )
            q = _Queue(cq, first, length, -1, -1, [], np.zeros(0, dtype=bool))
            # RocketMQ's "pre-blank" units fill a queue's first file up to its first unit.
            lead: int | None = None
            last = -1
            for n in range(len(files)):
                units = self.file_units(q, n)
                k0 = n * per_file
                if lead is None:
                    real = np.flatnonzero(units["size"] != PRE_BLANK_SIZE)
                    if len(real):
                        lead = k0 + int(real[0])
                valid = np.flatnonzero((units["offset"] >= 0) & (units["size"] > 0))
                if len(valid):
                    last = max(last, k0 + int(valid[-1]))
                del units
            q.lead = length if lead is None else lead
            q.last = max(last, q.lead - 1)
            q.good = np.zeros(length, dtype=bool)
            stray, stray_at = 0, -1
            for n, mf in enumerate(files):
                units = self.file_units(q, n)
                k0 = n * per_file
                lo = min(len(units), max(0, q.lead - k0))
                hi = min(len(units), max(0, q.last + 1 - k0))
                offsets = units["offset"].astype(np.int64)
                sizes = units["size"].astype(np.int64)
                tags = units["tags_code"].astype(np.int64)
                del units
                invalid = np.flatnonzero((offsets[lo:hi] < 0) | (sizes[lo:hi] <= 0)) + lo
                for j in invalid.tolist():
                    self.unit_problem(
                        q,
                        k0 + j,
                        "cq-hole",
                        f"invalid unit (offset {int(offsets[j])}, size {int(sizes[j])}) before "
                        f"the queue's last unit {q.first + q.last}: consumers stop here",
                    )
                t = max(lo, hi)
                extra = np.flatnonzero((offsets[t:] != 0) | (sizes[t:] != 0) | (tags[t:] != 0))
                if len(extra):
                    if stray_at < 0:
                        stray_at = k0 + t + int(extra[0])
                    stray += len(extra)
                checked = (offsets[lo:hi] >= self.base0) & (sizes[lo:hi] > 0)
                offs = offsets[lo:hi][checked]
                q.parts.append(
                    _UnitFile(
                        mf,
                        k0,
                        lo,
                        hi,
                        int(offs.min()) if len(offs) else 1,
                        int(offs.max()) if len(offs) else 0,
                        bool(np.all(np.diff(offsets[lo:hi]) >= 0)),
                    )
                )
                # Units past the log cannot meet a record in the segment-by-segment checks.
                for j in (np.flatnonzero(checked & (offsets[lo:hi] >= self.log_end)) + lo).tolist():
                    self.points_nowhere(q, k0 + j, int(offsets[j]), int(sizes[j]))
            if stray:
                self.unit_problem(
                    q,
                    stray_at,
                    "cq-garbage-after-end",
                    f"{stray} non-zero unit(s) after the queue's last valid unit",
                )
            self.queues.append(q)
            self.queue_of[(self.topic_id(cq.topic), cq.queue_id)] = q
            self.report.queues += 1
            self.tick(self.done + cq.file_size * len(files))

    def unit_location(self, q: _Queue, k: int) -> tuple[Path, int]:
        per_file = q.cq.units_per_file
        return q.cq.segments.files[k // per_file].path, (k % per_file) * CQ_UNIT_SIZE

    def unit_problem(self, q: _Queue, k: int, kind: str, detail: str) -> None:
        path, pos = self.unit_location(q, k)
        self.problem(kind, path, pos, f"{q.cq.topic}/{q.cq.queue_id} unit {q.first + k}: {detail}")

    def points_nowhere(self, q: _Queue, k: int, offset: int, size: int) -> None:
        self.unit_problem(
            q,
            k,
            "cq-unit-points-nowhere",
            f"no record starts at CommitLog offset {offset} (unit size {size})",
        )

    # -- the CommitLog walk, and the checks of each segment ----------------------------------
    def walk_commitlog(self) -> None:
        """Walk the log with the native record walk, :data:`CHUNK_RECORDS` records at a time;
        once a stretch of the log is walked, check the units and index entries that point into
        it against its records, then drop them (memory is bounded by a chunk of records, not
        the store)."""
        pos: int | None = self.base0
        cq_done = self.done
        pieces: list[tuple[native.Walk, int, I64]] = []
        lo = self.base0  # start of the walked stretch not checked yet
        while pos is not None and pos < self.log_end:
            i = self.seg_index(pos)
            while self.seg_index(lo) < i:
                # The walk left the segment of ``lo``: check up to that segment's end.
                hi = self.segment_end(lo)
                self.check_stretch(pieces, lo, hi)
                pieces, lo = [], hi
            mf = self.files[i]
            limit = min(mf.size, self.log_end - mf.base)
            dead = next(((x, e) for x, e in self.dead if x >= pos and e > pos), None)
            if dead is not None and dead[0] == pos:
                pos = dead[1]  # a dead region is not log (check_dead_regions named its bytes)
                continue
            if dead is not None and dead[0] < mf.base + limit:
                limit = dead[0] - mf.base
            w = native.walk(
                mf.buffer, pos - mf.base, limit, mf.base, check_crc=True, max_records=CHUNK_RECORDS
            )
            if dead is not None and w.stop == native.STOP_END and w.end == dead[0]:
                if len(w):
                    pieces.append((w, len(w), self.topic_codes(w)))
                    self.count(w, len(w))
                pos = dead[1]
                continue
            pos = self.walked(i, w, pieces, full=len(w) == CHUNK_RECORDS)
            if pos is not None and sum(n for _, n, _ in pieces) >= CHUNK_RECORDS:
                # Everything before ``pos`` is walked (or marked damaged): check it now.
                self.check_stretch(pieces, lo, pos)
                pieces, lo = [], pos
            if pos is not None:
                self.tick(cq_done + pos - self.base0)
        while lo < self.log_end:
            hi = self.segment_end(lo)
            self.check_stretch(pieces, lo, hi)
            pieces, lo = [], hi

    def segment_end(self, phys: int) -> int:
        mf = self.files[self.seg_index(phys)]
        return min(mf.base + mf.size, self.log_end)

    def topic_codes(self, w: native.Walk) -> I64:
        """Store-wide topic ids of a walk's topics (-2 for one that is not valid UTF-8)."""
        return np.asarray([self.raw_topic_id(t) for t in w.raw_topics], dtype=np.int64)

    def count(self, w: native.Walk, n: int) -> None:
        self.report.records += n
        self.report.record_bytes += int(w.sizes[:n].sum())

    def walked(
        self, i: int, w: native.Walk, pieces: list[tuple[native.Walk, int, I64]], *, full: bool
    ) -> int | None:
        """Keep the valid records of walk ``w`` of segment ``i``; returns where to go on.
        ``full``: the walk stopped at its record limit, not at the end of the valid records."""
        mf = self.files[i]
        ids = self.topic_codes(w)
        bad = np.flatnonzero(ids[w.topic_codes] == -2) if len(w) else np.zeros(0, dtype=np.int64)
        n = int(bad[0]) if len(bad) else len(w)
        if n:
            pieces.append((w, n, ids))
            self.count(w, n)
        if len(bad):
            return self.damaged_record(
                int(w.phys[n]), "commitlog-topic", "topic is not valid UTF-8"
            )
        if full and w.stop == native.STOP_END:
            return w.end
        r = w.end - mf.base
        if w.stop == native.STOP_INVALID:
            limit = min(mf.size, self.log_end - mf.base)
            size, magic = record.SIZE_MAGIC.unpack_from(mf.buffer, r)
            if magic == record.MAGIC and size >= record.FIXED_SIZE_V4 and r + size <= limit:
                # A whole record whose header or body is wrong inside.
                return self.damaged_record(w.end, _kind_of(w.reason), w.reason)
        return self.boundary(i, r)

    def damaged_record(self, phys: int, kind: str, detail: str) -> int | None:
        target = self.resync(phys)
        self.mark(phys, target)
        self.problem(kind, self.record_path(phys), phys, detail + _resumed(target))
        return target

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
        return self.record_at(phys) is not None

    def next_cq_start(self, phys: int) -> int | None:
        """The first ConsumeQueue offset after ``phys`` that looks like a record start (a unit
        whose offset field was damaged points into the middle of a record: skipped)."""
        found: list[I64] = []
        for q in self.queues:
            # A queue's units ascend: its first files past ``phys`` hold its nearest offsets.
            have = 0
            for n, uf in enumerate(q.parts):
                if uf.max_off <= phys:
                    continue
                offsets = self.checked_units(q, uf, n, phys + 1, most=MAX_CQ_CANDIDATES).offsets
                later = offsets[offsets > phys]
                found.append(later)
                have += len(later)
                if have >= MAX_CQ_CANDIDATES:
                    break
        if not found:
            return None
        near = np.unique(np.concatenate(found))[:MAX_CQ_CANDIDATES]
        for c in near.tolist():
            if c < self.log_end and self.looks_like_record(c):
                return int(c)
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

    def check_stretch(self, pieces: list[tuple[native.Walk, int, I64]], lo: int, hi: int) -> None:
        """Check the units and index entries that point into ``[lo, hi)`` (inside one
        segment) against its records (the walk's ``pieces``)."""
        seg = _Segment.of(pieces)
        self.check_queues(seg, lo, hi)
        self.check_entries(seg, lo, hi)

    def lookup(self, seg: _Segment, offsets: I64) -> tuple[I64, Bools, Bools]:
        """(record row, is a valid record start, lies in a damaged stretch) per offset."""
        n = len(seg)
        if n:
            rows = np.minimum(np.searchsorted(seg.phys, offsets), n - 1)
            found = seg.phys[rows] == offsets
        else:
            rows = np.zeros(len(offsets), dtype=np.int64)
            found = np.zeros(len(offsets), dtype=bool)
        # Inside a damaged stretch: what is there cannot be checked (the stretch is reported).
        if self.spans_stale:
            spans = np.asarray(sorted(self.damaged), dtype=np.int64).reshape(-1, 2)
            self.damaged_starts, self.damaged_ends = spans[:, 0].copy(), spans[:, 1].copy()
            self.spans_stale = False
        if len(self.damaged_starts):
            span = np.searchsorted(self.damaged_starts, offsets, side="right") - 1
            damaged = (span >= 0) & (offsets < self.damaged_ends[np.maximum(span, 0)])
        else:
            damaged = np.zeros(len(offsets), dtype=bool)
        return rows.astype(np.int64), found, damaged

    # -- ConsumeQueues against the records ---------------------------------------------------
    def check_queues(self, seg: _Segment, lo: int, hi: int) -> None:
        n = len(seg)
        claimed = np.zeros(n, dtype=bool)
        pointed = np.zeros(n, dtype=bool)
        joined: list[tuple[_Queue, _Units, I64, Bools, Bools, Bools]] = []
        for q in self.queues:
            tid = self.topic_id(q.cq.topic)
            for f, uf in enumerate(q.parts):
                if uf.max_off < lo or uf.min_off >= hi:
                    continue
                units = self.checked_units(q, uf, f, lo, hi)
                into = np.flatnonzero((units.offsets >= lo) & (units.offsets < hi))
                units = _Units(
                    units.k[into], units.offsets[into], units.sizes[into], units.tags[into]
                )
                rows, found, damaged = self.lookup(seg, units.offsets)
                matched = (
                    found
                    & (seg.topic_ids[rows] == tid)
                    & (seg.queue_ids[rows] == q.cq.queue_id)
                    & (seg.queue_offsets[rows] == q.first + units.k)
                )
                claimed[rows[matched]] = True
                pointed[rows[found]] = True
                q.good[units.k[matched]] = True
                joined.append((q, units, rows, found, damaged, matched))
                self.report.units += int(np.count_nonzero(found))
        for q, units, rows, found, damaged, matched in joined:
            for j in np.flatnonzero(~found & ~damaged).tolist():
                self.points_nowhere(q, int(units.k[j]), int(units.offsets[j]), int(units.sizes[j]))
            for j in np.flatnonzero(found & ~matched).tolist():
                u, r = int(units.k[j]), int(rows[j])
                phys = int(seg.phys[r])
                fields = (int(seg.topic_ids[r]), int(seg.queue_ids[r]), int(seg.queue_offsets[r]))
                if claimed[r]:
                    self.unit_problem(
                        q,
                        u,
                        "cq-unit-wrong-queue",
                        f"points at the record at {phys}, which is {self.says(*fields)} and has "
                        "its own unit",
                    )
                else:
                    self.mismatched.append((q, u, phys, *fields))
            fine = np.flatnonzero(matched)
            for j in fine[units.sizes[fine] != seg.sizes[rows[fine]]].tolist():
                r = int(rows[j])
                self.unit_problem(
                    q,
                    int(units.k[j]),
                    "cq-unit-size-mismatch",
                    f"size {int(units.sizes[j])}, but the record at {int(seg.phys[r])} is "
                    f"{int(seg.sizes[r])} bytes",
                )
            if q.cq.topic != SCHEDULE_TOPIC:
                for j in fine[units.tags[fine] != seg.tags_codes[rows[fine]]].tolist():
                    r = int(rows[j])
                    phys = int(seg.phys[r])
                    self.unit_problem(
                        q,
                        int(units.k[j]),
                        "cq-unit-tags-code",
                        f"tagsCode {int(units.tags[j])}, but the record at {phys} has TAGS "
                        f"{self.tags_of(phys)!r} (hash {int(seg.tags_codes[r])}): the unit or "
                        "the record's TAGS property is damaged",
                    )
            dispatchable = seg.dispatchable()
            for j in fine[~dispatchable[rows[fine]]].tolist():
                r = int(rows[j])
                self.unit_problem(
                    q,
                    int(units.k[j]),
                    "cq-unit-not-dispatchable",
                    f"the record at {int(seg.phys[r])} is a PREPARED or ROLLBACK "
                    f"transaction (sysflag 0x{int(seg.sys_flags[r]) & 0xFFFFFFFF:X})",
                )
        self.check_missing_units(seg, pointed)

    def says(self, tid: int, qid: int, qoff: int) -> str:
        return f"{self.topic_name(tid)}/{qid} offset {qoff}"

    def tags_of(self, phys: int) -> str | None:
        """The TAGS property of the valid record at ``phys``, for a problem's text."""
        mf = self.files[self.seg_index(phys)]
        batch = native.decode(
            mf.buffer,
            np.array([phys - mf.base], dtype=np.int64),
            mf.base,
            path=str(mf.path),
            limit=min(mf.size, self.log_end - mf.base),
            columns=native.Columns.TAGS,
        )
        tags: str | None = batch.column("tags")[0].as_py()
        return tags

    def check_missing_units(self, seg: _Segment, pointed: Bools) -> None:
        root = self.store.path / "consumequeue"
        file_size = self.store.config.mapped_file_size_consume_queue
        for r in np.flatnonzero(seg.dispatchable() & ~pointed).tolist():
            topic = self.topic_name(int(seg.topic_ids[r]))
            qid, qoff = int(seg.queue_ids[r]), int(seg.queue_offsets[r])
            phys = int(seg.phys[r])
            pos = qoff * CQ_UNIT_SIZE
            base = pos - pos % file_size
            where = root / topic / str(qid)
            self.problem(
                "cq-missing-unit",
                where / segment_name(base) if pos >= 0 else where,
                pos - base if pos >= 0 else pos,
                f"no unit points at the record at {phys} ({topic}/{qid} offset {qoff})"
                + self.repair_note(phys),
            )

    def check_mismatched(self) -> None:
        """Blame each unit that points at another queue's unclaimed record, or that record.

        The unit is wrong when the unit at the record's own coordinates points at yet another
        record that does not claim it either (units swapped or shifted); otherwise the record
        is, once."""
        blamed: set[int] = set()
        for q, u, phys, tid, qid, qoff in self.mismatched:
            says = self.says(tid, qid, qoff)
            if self.slot_misused(tid, qid, qoff):
                self.unit_problem(
                    q,
                    u,
                    "cq-unit-wrong-queue",
                    f"points at the record at {phys}, which is {says}, where the unit points "
                    "at yet another record (units swapped or shifted)",
                )
            elif phys not in blamed:
                blamed.add(phys)
                path, pos = self.unit_location(q, u)
                self.problem(
                    "commitlog-record-mismatch",
                    self.record_path(phys),
                    phys,
                    f"record says {says}, but it is unit {q.first + u} of "
                    f"{q.cq.topic}/{q.cq.queue_id} ({path} @ {pos}) and no unit of its own "
                    "points at it",
                )
        self.mismatched.clear()

    def slot_misused(self, tid: int, qid: int, qoff: int) -> bool:
        q = self.queue_of.get((tid, qid))
        if q is None:
            return False
        u = qoff - q.first
        if not (q.lead <= u <= q.last and u < q.length) or q.good[u]:
            return False
        per_file = q.cq.units_per_file
        n = u // per_file
        unit = self.file_units(q, n)[u % per_file]
        offset, size = int(unit["offset"]), int(unit["size"])
        return offset >= self.base0 and size > 0

    def check_ascending(self) -> None:
        """Units that match their records must follow the CommitLog order."""
        for q in self.queues:
            prev: tuple[int, int] | None = None  # (unit, offset) of the last good unit
            for n, uf in enumerate(q.parts):
                units = self.checked_units(q, uf, n)
                good = np.flatnonzero(q.good[units.k])
                k, offs = units.k[good], units.offsets[good]
                if prev is not None and len(k):
                    k = np.concatenate([[prev[0]], k])
                    offs = np.concatenate([[prev[1]], offs])
                for j in (np.flatnonzero(np.diff(offs) <= 0) + 1).tolist():
                    self.unit_problem(
                        q,
                        int(k[j]),
                        "cq-not-ascending",
                        f"offset {int(offs[j])} is not after the previous unit's "
                        f"{int(offs[j - 1])}",
                    )
                if len(k):
                    prev = (int(k[-1]), int(offs[-1]))

    # -- IndexFiles -------------------------------------------------------------------------
    def load_index(self) -> None:
        """Check every IndexFile on its own (header, slots, chains), and find the oldest record
        an entry points at; the entries are checked against the records segment by segment."""
        index = self.store.index
        if index is None or not index.files:
            return
        for n, f in enumerate(index.files):
            self.index_begins.append(self.check_index_file(f, last=n == len(index.files) - 1))
            self.report.index_files += 1
            self.tick(self.done + HEADER_SIZE + SLOT_SIZE * f.slot_num + ENTRY_SIZE * f.index_num)

    def check_entries(self, seg: _Segment, lo: int, hi: int) -> None:
        """Check the index entries that point into ``[lo, hi)`` against the segment's records,
        and that every key of its records from the oldest one indexed on has its entry."""
        if not self.indexes:
            return
        known = np.sort(seg.key_rows << 32 | (seg.key_hashes.astype(np.int64) & 0xFFFFFFFF))
        indexed: list[I64] = []
        for s in self.indexes:
            if s.max_phy < lo or s.min_phy >= hi:
                continue
            path = s.f.path
            if s.ascending:
                column = s.entries["phy_offset"]
                a = bisect.bisect_left(column, lo, key=int)
                into = np.arange(a, bisect.bisect_left(column, hi, a, key=int), dtype=np.int64)
            else:
                phy = s.entries["phy_offset"].astype(np.int64)
                into = np.flatnonzero((phy >= lo) & (phy < hi))
                del phy
            used = s.entries[into]
            phy = used["phy_offset"].astype(np.int64)
            key_hash = used["key_hash"].astype(np.int64)
            time_diff = used["time_diff"].astype(np.int64)
            rows, found, damaged = self.lookup(seg, phy)
            for j in np.flatnonzero(~found & ~damaged).tolist():
                number = int(into[j]) + 1
                self.problem(
                    "index-entry-points-nowhere",
                    path,
                    s.entry_at(number),
                    f"entry {number}: no record starts at phyOffset {int(phy[j])}",
                )
            ok = np.flatnonzero(found)
            self.report.index_entries += len(ok)
            pairs = rows[ok] << 32 | (key_hash[ok] & 0xFFFFFFFF)
            indexed.append(pairs)
            if len(known):
                at = np.minimum(np.searchsorted(known, pairs), len(known) - 1)
                hit = known[at] == pairs
            else:
                hit = np.zeros(len(ok), dtype=bool)
            for j in ok[~hit].tolist():
                number = int(into[j]) + 1
                self.problem(
                    "index-entry-hash",
                    path,
                    s.entry_at(number),
                    f"entry {number}: key hash {int(key_hash[j])} is none of the keys of the "
                    f"record at {int(phy[j])}",
                )
            if s.times_ok:
                # RocketMQ computes entry 1's timeDiff before it sets beginTimestamp; from entry
                # 2 on every difference is from entry 1's store time.
                later = ok[into[ok] >= 1]
                stored = seg.store_ts[rows[later]]
                if s.begin_ts <= 0:
                    expected = np.zeros(len(later), dtype=np.int64)
                else:
                    expected = np.clip((stored - s.begin_ts) // 1000, 0, INT_MAX)
                for j in later[time_diff[later] != expected].tolist():
                    number = int(into[j]) + 1
                    self.problem(
                        "index-entry-time",
                        path,
                        s.entry_at(number),
                        f"entry {number}: timeDiff {int(time_diff[j])}, but its message was "
                        f"stored {int(seg.store_ts[rows[j]]) - s.begin_ts} ms after "
                        "beginTimestamp",
                    )
        self.check_missing_entries(seg, np.sort(np.concatenate(indexed)) if indexed else None)

    def check_missing_entries(self, seg: _Segment, indexed: I64 | None) -> None:
        """Every key of every record from the oldest one indexed on (older ones may have gone
        with deleted index files) must have its entry. The walk lists the keys dispatch
        indexes: none for ROLLBACK records, none for an empty UNIQ_KEY."""
        if self.oldest_indexed is None or not len(seg.key_rows):
            return
        keep = seg.phys[seg.key_rows] >= self.oldest_indexed
        rows, hashes = seg.key_rows[keep], seg.key_hashes[keep].astype(np.int64)
        wanted = rows << 32 | (hashes & 0xFFFFFFFF)
        if indexed is None or not len(indexed):
            missing = np.arange(len(wanted))
        else:
            at = np.minimum(np.searchsorted(indexed, wanted), len(indexed) - 1)
            missing = np.flatnonzero(indexed[at] != wanted)
        files = self.store.index.files if self.store.index is not None else []
        for j in missing.tolist():
            r, h = int(rows[j]), int(hashes[j])
            phys = int(seg.phys[r])
            # The file that should hold it: the last one that begins at or before it.
            n = max(0, int(np.searchsorted(np.asarray(self.index_begins), phys, side="right")) - 1)
            f = files[n]
            self.problem(
                "index-missing-entry",
                f.path,
                HEADER_SIZE + SLOT_SIZE * (h % f.slot_num),
                f"no entry for key hash {h} of the record at {phys} "
                f"({self.topic_name(int(seg.topic_ids[r]))}); it belongs in this slot's chain"
                + self.repair_note(phys),
            )

    def find_oldest_indexed(self, phys: I64) -> None:
        """Lower :attr:`oldest_indexed` to the oldest valid record among ``phys`` (an
        IndexFile's live entries), if older. Candidates are tried from the smallest up; the
        first is almost always a record, so the whole array is sorted only when it is not."""
        rest = phys[phys < self.oldest_indexed] if self.oldest_indexed is not None else phys
        for _ in range(8):
            if not len(rest):
                return
            c = int(rest.min())
            if self.record_at(c) is not None:
                self.oldest_indexed = c
                return
            rest = rest[rest > c]
        for c in np.unique(rest).tolist():
            if self.record_at(c) is not None:
                self.oldest_indexed = c
                return

    def check_index_file(self, f: IndexFile, *, last: bool) -> int:
        """Check one file on its own; returns its beginPhyOffset."""
        mm = np.memmap(f.path, dtype=np.uint8, mode="r")
        return self._check_index_file(f, mm, last)

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

    def _check_index_file(self, f: IndexFile, mm: npt.NDArray[np.uint8], last: bool) -> int:
        path = f.path
        slot_num, index_num = f.slot_num, f.index_num
        entries_at = HEADER_SIZE + SLOT_SIZE * slot_num
        if len(mm) != entries_at + ENTRY_SIZE * index_num:
            self.problem("index-header", path, 0, f"file is {len(mm)} bytes, not as configured")
            return 0
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
        # The file's own widths: an IndexFile may hold 20M entries (160 MB per int64 column).
        key_hash = used["key_hash"].astype(np.int32)
        phy = used["phy_offset"].astype(np.int64)
        time_diff = used["time_diff"].astype(np.int32)
        prev = used["prev_index"].astype(np.int32)
        numbers = np.arange(1, count, dtype=np.int32)

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
        refs = np.bincount(
            np.concatenate([prev[links], slots[heads].astype(np.int32)]), minlength=count
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
        # Entries go in CommitLog order, so those of messages retention deleted (below the
        # CommitLog's first offset) come first; one below it after a live one is damaged.
        live = phy >= self.base0
        seen_live = np.logical_or.accumulate(live)
        expired = ~live & (phy >= 0) & ~seen_live
        # Entries pointing outside the log meet no segment's records: reported here.
        for j in np.flatnonzero(~expired & ((phy < self.base0) | (phy >= self.log_end))).tolist():
            self.problem(
                "index-entry-points-nowhere",
                path,
                entry_at(j + 1),
                f"entry {j + 1}: no record starts at phyOffset {int(phy[j])}",
            )
        for j in np.flatnonzero(time_diff < 0).tolist():
            self.problem(
                "index-entry-time", path, entry_at(j + 1), f"negative timeDiff {int(time_diff[j])}"
            )
        inside = phy[live & (phy < self.log_end)]
        # The oldest record an entry of this file points at (entries may point nowhere).
        self.find_oldest_indexed(inside)
        times_ok = False
        # Header against the entries.
        if count > 1 and not moving:
            if begin_phy != phy[0]:
                head(2, f"but entry 1 is at {int(phy[0])}")
            if end_phy != phy[-1]:
                head(3, f"but the last entry is at {int(phy[-1])}")
            times_ok = True
            first = self.record_at(int(phy[0])) if live[0] else None
            if first is not None:
                first_ts = int(first.store_ts[0])
                if begin_ts != first_ts:
                    head(0, f"but entry 1's message was stored at {first_ts}")
                    times_ok = False
            final = self.record_at(int(phy[-1])) if live[-1] else None
            if final is not None and end_ts != int(final.store_ts[0]):
                head(1, f"but the last entry's message was stored at {int(final.store_ts[0])}")
        if len(inside):
            self.indexes.append(
                _IndexState(
                    f,
                    entries_at,
                    used,
                    begin_ts,
                    int(inside.min()),
                    int(inside.max()),
                    bool(np.all(np.diff(phy) >= 0)),
                    times_ok,
                )
            )
        return begin_phy
