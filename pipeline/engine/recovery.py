"""Recovery on open: find the true end of the CommitLog and make the derived files agree.

Every open runs it; a writable open repairs, a read-only open only finds the end.

1. **Start point**, the newest offset known good, in order of preference:

   * ``config/rocketstore.json`` (:mod:`rocketstore.pipeline.files.progress`): the exact offset up to which the
     CommitLog, ConsumeQueues and index were flushed, checked against the record it names;
   * after a clean shutdown without it (a store RocketMQ wrote): just past the newest record a
     ConsumeQueue or the index points at, checked against the CommitLog;
   * otherwise RocketMQ's rules: after a crash (``abort`` present), the newest segment whose
     first message is older than the checkpoint's time less 3 s; after a clean shutdown, the
     third-last segment.

2. **End**: walk records from the start point, checking magic, size, field lengths, physical
   offset and (with ``checkCRCOnRecover``) the body CRC; the first record that fails is the end.
   Only the records written since the start point are read, so a kill -9 costs the time to
   check what was written since the last flush, not a whole segment.

3. **Repair** (writable opens): bytes after the end are zeroed and later segments deleted (the
   zero-filled or torn segment a crash leaves); after a crash, ConsumeQueue units and index
   entries of records at or after the start point are dropped, since they may be partial;
   after a clean shutdown, only those past the end. Then every record from the newest point the
   derived files still cover to the end is dispatched again. Dispatch is idempotent, so running
   recovery twice changes nothing the second time. A ConsumeQueue's units are dropped in
   memory first and written again over themselves, and only what the re-dispatch did not
   write again is zeroed at the end: a reader in another process, reading beside the
   recovery, never finds zeros where a unit it may have been offered was.

The :class:`RecoveryReport` says what was done. :func:`recover` runs these as stages, one
method each; reading the CommitLog for steps 1 and 2 (the start points, the walk to the end,
valid records past it) is :mod:`rocketstore.pipeline.engine.recoverylog`'s, checking the derived files
against the log is this module's. Runs during open, before any put; not thread-safe.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.engine import dispatch, fencing
from rocketstore.pipeline.engine.recoverylog import (
    checkpoint_start,
    find_end,
    record_end,
    resumes_after,
    third_last_start,
    trusted_progress,
)
from rocketstore.pipeline.errors import CorruptRecordError, DamagedLogError, OffsetOutOfRangeError
from rocketstore.pipeline.files.checkpoint import StoreCheckpoint
from rocketstore.pipeline.files.commitlog import CommitLog
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue
from rocketstore.pipeline.files.indexservice import IndexService
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.format import native, record
from rocketstore.pipeline.layout import CQ_UNIT_SIZE


@dataclasses.dataclass
class RecoveryReport:
    abort_file_found: bool = False
    start_source: str = ""
    scan_start: int = 0
    commitlog_end: int = 0
    bytes_truncated: int = 0
    units_dropped: int = 0
    index_entries_dropped: int = 0
    redispatch_from: int = 0
    records_redispatched: int = 0
    duration_ms: float = 0.0
    last_record_offset: int = -1  # start of the last record before the end, if known
    queues_rebuilt: list[str] = dataclasses.field(default_factory=list)
    # Rebuilt queues none of whose records the log holds any more, and the queue offset each
    # resumes at (never lower than what was handed out: see _Recovery.rebuild_queues).
    queues_resumed: dict[str, int] = dataclasses.field(default_factory=dict)
    index_rebuilt: bool = False
    index_slots_repaired: int = 0
    # Dead regions (rocketstore.pipeline.engine.fencing) inside the recovered log, and the bytes a fenced writer
    # left in them (restored to a blank and zeros by a writable open).
    fenced_regions: list[list[int]] = dataclasses.field(default_factory=list)
    fenced_bytes: int = 0
    # A valid record after the end found (damage inside the log; a writable open refuses).
    damage_resumes_at: int | None = None
    # Derived files given a new inode before recovery (rocketstore.pipeline.engine.renewal).
    files_renewed: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "abortFileFound": self.abort_file_found,
            "startSource": self.start_source,
            "scanStart": self.scan_start,
            "commitLogEnd": self.commitlog_end,
            "bytesTruncated": self.bytes_truncated,
            "unitsDropped": self.units_dropped,
            "indexEntriesDropped": self.index_entries_dropped,
            "redispatchFrom": self.redispatch_from,
            "recordsRedispatched": self.records_redispatched,
            "queuesRebuilt": self.queues_rebuilt,
            "queuesResumed": self.queues_resumed,
            "indexRebuilt": self.index_rebuilt,
            "indexSlotsRepaired": self.index_slots_repaired,
            "fencedRegions": self.fenced_regions,
            "fencedBytes": self.fenced_bytes,
            "damageResumesAt": self.damage_resumes_at,
            "filesRenewed": self.files_renewed,
            "durationMs": round(self.duration_ms, 3),
        }


def dispatched_end(log: CommitLog, queues: list[ConsumeQueue], index: IndexService | None) -> int:
    """The nearest point every derived file reached: just past the newest record the
    ConsumeQueues point at, or the newest the index holds, whichever is older, each verified
    against the CommitLog. The CommitLog's min offset when they know none, or when the index
    holds nothing although the queues do (it must be rebuilt)."""
    queue_end: int | None = None
    for cq in queues:
        if cq.max_offset > cq.min_offset:
            last = cq.read(cq.max_offset - 1, 1)
            if len(last):
                end = record_end(log, int(last[0]["offset"]), int(last[0]["size"]))
                if end is not None:
                    queue_end = end if queue_end is None else max(queue_end, end)
    if queue_end is None:
        return log.min_offset
    if index is None:
        return queue_end
    if not index.files or index.files[-1].entry_count == 0:
        return log.min_offset
    index_end = record_end(log, index.end_phy_offset, None)
    return log.min_offset if index_end is None else min(queue_end, index_end)


def _record_ending_at(log: CommitLog, queues: list[ConsumeQueue], end: int) -> int:
    """The offset of the valid record that ends at ``end`` and a queue's last unit points
    at; -1 when no queue's last unit does."""
    for cq in queues:
        if cq.max_offset > cq.min_offset:
            last = cq.read(cq.max_offset - 1, 1)
            if len(last):
                at, size = int(last[0]["offset"]), int(last[0]["size"])
                if at + size == end and record_end(log, at, size) == end:
                    return at
    return -1


# The header fields up to QUEUEOFFSET (the first 28 bytes of a record).
_CHECKED = ("size", "magic", "queue_id", "queue_offset")
_HEAD_FIELDS: Mapping[str, Any] = record.HEAD_DTYPE.fields or {}
_HEAD_CHECK = np.dtype(
    {
        "names": list(_CHECKED),
        "formats": [_HEAD_FIELDS[f][0] for f in _CHECKED],
        "offsets": [_HEAD_FIELDS[f][1] for f in _CHECKED],
        "itemsize": record.OFF_PHYSICALOFFSET,
    }
)


def last_unit_matches(log: CommitLog, cq: ConsumeQueue) -> bool:
    """Whether the queue's last unit points at a record of the queue (what
    :func:`damaged_queues` checks of every unit, for the last one, without numpy: after a
    clean close, and when a store first loads a queue, it vouches for the rest). True for a
    queue with no unit, and for one whose last unit points below the CommitLog's first record:
    retention deleted every record of the queue, and there is nothing left to check it
    against."""
    hi = cq.max_offset
    if hi <= cq.min_offset:
        return True
    unit = cq.read(hi - 1, 1)
    offset, size = int(unit["offset"][0]), int(unit["size"][0])
    if 0 <= offset < log.min_offset and size > 0:
        return True
    if offset < log.min_offset or size < record.FIXED_SIZE_V4:
        return False
    try:
        mf = log.segments.find(offset)
    except OffsetOutOfRangeError:
        return False
    rel = offset - mf.base
    if rel + size > mf.wrote_position:
        return False
    total, magic, _, queue_id, _, queue_offset, *_ = record.HEAD.unpack(
        mf.read(rel, record.HEAD_SIZE)
    )
    return bool(
        total == size
        and magic == record.MAGIC
        and queue_id == cq.queue_id
        and queue_offset == hi - 1
    )


def check_loaded_queue(log: CommitLog, cq: ConsumeQueue) -> None:
    """What recovery checks of a writer's queue, for one it had not loaded, when the store
    first loads it (rocketstore.pipeline.engine.queueset): the queue must end where the last flush
    recorded and its last unit point at a record of the queue. Raises
    :class:`CorruptRecordError` naming the queue's files otherwise (`rocketstore recover`
    rebuilds it)."""
    if cq.expected_length is not None and cq.max_offset != cq.expected_length:
        raise CorruptRecordError(
            str(cq.directory),
            cq.max_offset * CQ_UNIT_SIZE,
            f"queue {cq.topic}/{cq.queue_id} holds {cq.max_offset} unit(s), but the last "
            f"flush recorded {cq.expected_length} (config/rocketstore.json): its files were "
            "changed since; `rocketstore recover` rebuilds it from the CommitLog",
        )
    if not last_unit_matches(log, cq):
        where, at = cq.unit_location(cq.max_offset - 1)
        raise CorruptRecordError(
            where,
            at,
            f"the last unit of queue {cq.topic}/{cq.queue_id} does not point at a record "
            "of the queue in the CommitLog; `rocketstore recover` rebuilds the queue",
        )


def damaged_queues(
    log: CommitLog, queues: dict[tuple[str, int], ConsumeQueue]
) -> list[tuple[str, int]]:
    """Queues with a unit that does not point at a record of that queue: the record at the
    unit's offset must lie inside the log and have the magic code, the unit's size, the queue's
    id and the unit's queue offset. Every unit is checked, vectorised per segment
    (:func:`last_unit_matches` checks one queue's last), but for the queue's oldest units that
    point below the CommitLog's first record: what retention leaves (RocketMQ deletes a
    queue's files only once a newer one exists), so not damage, as long as they come first."""
    files = log.segments.files
    bad: list[tuple[str, int]] = []
    for key, cq in queues.items():
        lo, hi = cq.min_offset, cq.max_offset
        if hi <= lo:
            continue
        units = cq.read(lo, hi - lo)
        expired = expired_units(units, log.min_offset)
        if expired == len(units):
            continue
        if not files:
            bad.append(key)
            continue
        lo, units = lo + expired, units[expired:]
        offsets = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        seg = (offsets - files[0].base) // log.segment_size
        ok = (offsets >= log.min_offset) & (sizes >= record.FIXED_SIZE_V4) & (seg < len(files))
        if not ok.all():
            bad.append(key)
            continue
        for s in np.unique(seg).tolist():
            mf = files[s]
            rows = np.flatnonzero(seg == s)
            rel = offsets[rows] - mf.base
            if int((rel + sizes[rows]).max()) > mf.wrote_position:
                break
            data = np.frombuffer(mf.buffer, dtype=np.uint8)
            # One gather of each record's first 28 bytes, read as the header's fields.
            heads = data[rel[:, None] + np.arange(_HEAD_CHECK.itemsize)].view(_HEAD_CHECK)[:, 0]
            good = (
                (heads["size"] == sizes[rows])
                & (heads["magic"] == record.MAGIC)
                & (heads["queue_id"] == key[1])
                & (heads["queue_offset"] == lo + rows)
            )
            del data, heads
            if not good.all():
                break
        else:
            continue
        bad.append(key)
    return bad


def expired_units(units: npt.NDArray[np.void], min_offset: int) -> int:
    """How many of ``units`` (a queue's, from its min offset on) lead with a record below the
    CommitLog's ``min_offset``: retention deleted those records."""
    below = (units["offset"] < min_offset) & (units["offset"] >= 0) & (units["size"] > 0)
    return len(units) if below.all() else int(np.argmin(below))


def index_damaged(log: CommitLog, index: IndexService) -> bool:
    """Whether an index file's header is impossible or its newest entry does not point at a
    record start."""
    for f in index.files:
        if not (1 <= f.index_count <= f.index_num) or not (
            0 <= f.hash_slot_count <= min(f.slot_num, max(f.index_count - 1, 0))
        ):
            return True
        if (
            f.entry_count
            and f.end_phy_offset >= log.min_offset
            and record_end(log, f.end_phy_offset, None) is None
        ):
            return True
    return False


@dataclasses.dataclass(frozen=True)
class RecoveryFiles:
    """What recovery works on: a store's files as its open loaded them. Recovery changes them
    in place (``queues`` loses the queues it rebuilds, ``queue_factory`` makes their new ones)
    and sets the checkpoint's logics time when it dispatches records again.
    ``sync_truncated`` makes what the ConsumeQueues' cuts zeroed durable (the store's does it
    with one syncfs for many queues; None: each queue syncs its own)."""

    log: CommitLog
    queues: dict[tuple[str, int], ConsumeQueue]
    index: IndexService | None
    checkpoint: StoreCheckpoint
    progress: FlushProgress | None
    queue_factory: Callable[[str, int], ConsumeQueue]
    sync_truncated: Callable[[list[ConsumeQueue]], None] | None = None


@dataclasses.dataclass(frozen=True)
class RecoveryOptions:
    """How an open recovers.

    ``abnormal``: the abort file was found (a crash). ``read_only``: find the end, repair
    nothing. ``full_check``: check every unit of every queue, whatever a progress file vouches
    for. ``dead``: the CommitLog's dead regions (rocketstore.pipeline.engine.fencing).
    ``cut_at_damage``: cut the log at its end even when valid records follow it (see
    :func:`recover`). ``rebuild_index``: drop the index and dispatch it again from the log,
    whatever it holds (a writer fenced off may have written a page of it late).
    ``taking_over``: the open fences off the writer before it (rocketstore.pipeline.engine.fencing),
    which ends the log in a segment of its own after every file there is now."""

    abnormal: bool
    read_only: bool
    check_crc: bool
    full_check: bool = False
    dead: Sequence[tuple[int, int]] = ()
    cut_at_damage: bool = False
    rebuild_index: bool = False
    taking_over: bool = False


def recover(files: RecoveryFiles, options: RecoveryOptions) -> RecoveryReport:
    """Recover (see the module), stage by stage; the report says what each stage did.

    Raises :class:`DamagedLogError`, having changed nothing, when valid records follow the end
    it found: cutting there would drop them (rocketstore.pipeline.engine.recoverylog.resumes_after);
    with ``cut_at_damage`` it cuts all the same (the report's ``damageResumesAt`` says where
    valid records resumed). ``sync_truncated`` runs once the ConsumeQueues are dispatched
    again, before the store takes a put."""
    started = time.perf_counter()
    run = _Recovery(files, options)
    run.find_start()
    run.find_end()
    run.choose_queues()
    run.refuse_damage()
    run.note_fenced_regions()
    run.note_last_record()
    run.cut_log()
    if not options.read_only:
        run.repair_derived()
    run.correct_min_offsets()
    if not options.read_only:
        run.rebuild_queues()
    run.report.duration_ms = (time.perf_counter() - started) * 1000
    return run.report


class _Recovery:
    """One recovery: its files and options, the report its stages fill in, and what one stage
    finds for the next (the start point, the end, the walks, the queues to look at)."""

    def __init__(self, files: RecoveryFiles, options: RecoveryOptions) -> None:
        self.files, self.options, self.log = files, options, files.log
        self.report = RecoveryReport(abort_file_found=options.abnormal)
        self.queue_list = list(files.queues.values())
        self.trusted = trusted_progress(self.log, files.progress, options.dead)
        # Made True when a fenced writer's bytes were found: every derived file is then
        # checked whole.
        self.full_check = options.full_check
        self.start = self.end = 0
        self.walked: list[native.Walk] = []
        self.active = self.queue_list
        self.live: list[tuple[int, int]] = []

    def find_start(self) -> None:
        log, report, dead = self.log, self.report, self.options.dead
        if self.trusted is not None:
            start, report.start_source = self.trusted, "progress"
        elif not self.options.abnormal:
            hint = dispatched_end(log, self.queue_list, self.files.index)
            if hint > log.min_offset or not log.segments.files:
                start, report.start_source = hint, "consumequeue"
            else:
                start, report.start_source = third_last_start(log), "rocketmq-normal"
        else:
            start = checkpoint_start(log, self.files.checkpoint)
            report.start_source = "checkpoint"
        for x, s in dead:
            if x < start < s:
                # A fenced writer's unit or index entry pointed inside its dead region: start
                # where the region does, so that the region is checked and restored.
                start = x
        self.start = report.scan_start = start

    def find_end(self) -> None:
        self.end, self.walked = find_end(
            self.log, self.start, check_crc=self.options.check_crc, dead=self.options.dead
        )
        self.report.commitlog_end = self.end

    def choose_queues(self) -> None:
        """The queues recovery must look at. A trusted progress file vouches for each queue it
        records that is not loaded yet (rocketstore.pipeline.engine.queueset): every unit below the
        recorded length points below the flushed point, so nothing of them is cut or
        dispatched again, and the queue is checked when first used. Only units written past
        that length (after the flush, before a crash, or by another writer since) make it one
        to look at."""
        if self.trusted is None or self.full_check:
            return
        if self.options.abnormal or self.end != self.trusted:
            for cq in self.queue_list:
                recorded = cq.recorded
                if recorded is not None and cq.units_past(recorded):
                    cq.load(recorded)
        self.active = [cq for cq in self.queue_list if cq.recorded is None]

    def refuse_damage(self) -> None:
        log, end = self.log, self.end
        if not log.has_data_after(end):
            return
        resume = self.report.damage_resumes_at = resumes_after(log, end)
        if resume is not None and not self.options.read_only and not self.options.cut_at_damage:
            seg = log.segments.find(end)
            raise DamagedLogError(
                str(seg.path),
                end,
                f"the log does not end here: a valid record follows at offset {resume} "
                f"({resume - end} bytes on), so this is damage inside the log (another "
                "writer's bytes over this one's, or a bad block), not a torn tail. Recovery "
                f"changed nothing: cutting at {end} would drop every record after it. "
                "`rocketstore verify` lists the damage; `rocketstore recover --cut-at-damage` "
                "cuts all the same",
            )

    def note_fenced_regions(self) -> None:
        """Every dead region still in the log, also those behind the start point: a fenced
        writer's late write can arrive after the recovery that made the region, and RocketMQ's
        own recovery, which knows nothing of dead regions, would take it for records. Each
        costs a read of its part of a segment; there is one per unclean take-over on shared
        storage."""
        log = self.log
        self.live = [(x, e) for x, e in self.options.dead if log.min_offset <= x and e <= self.end]
        self.report.fenced_regions = [[x, e] for x, e in self.live]
        self.report.fenced_bytes = sum(fencing.junk_bytes(log, x, e) for x, e in self.live)

    def note_last_record(self) -> None:
        log, report, progress = self.log, self.report, self.files.progress
        lasts = [int(w.phys[-1]) for w in self.walked if len(w)]
        last = lasts[-1] if lasts else -1
        report.last_record_offset = last
        if (
            last < 0
            and self.trusted is not None
            and progress is not None
            and self.start > log.min_offset
        ):
            report.last_record_offset = progress.last_record_offset
        if report.last_record_offset < 0 and self.end > log.min_offset:
            # Nothing walked and no progress file to trust (one a fenced writer wrote): the
            # record a queue's last unit points at, so that the next flush names a point of
            # this log.
            report.last_record_offset = _record_ending_at(log, self.queue_list, self.end)

    def cut_log(self) -> None:
        log, end = self.log, self.end
        if not self.options.read_only and self.report.fenced_bytes:
            # A fenced writer's bytes are not data: the blanks the dead regions began with come
            # back, and every derived file is checked whole, since its units and entries may
            # have gone over the live writer's.
            for x, e in self.live:
                fencing.restore(log, x, e)
            self.full_check = True
        if not self.options.read_only and log.has_data_after(end):
            # A take-over keeps the segment files after the end: the writer it fences off may
            # have made them, and could still write into a file of the same name made anew.
            self.report.bytes_truncated = log.cut(end, keep_later=self.options.taking_over)
        log.set_end(end)

    def repair_derived(self) -> None:
        """What was dispatched after the start point may be partial (one queue's units
        written, another's not, the index behind): drop it all and dispatch it again from the
        log. A trusted progress file names the durable dispatch point; without one, after a
        crash, it is the start point; after a clean shutdown, the end."""
        log, index, report, trusted = self.log, self.files.index, self.report, self.trusted
        abnormal = self.options.abnormal
        cut_at = self.start if (trusted is not None or abnormal) else self.end
        if index is not None and index.files and (abnormal or trusted is None):
            # A crash may have left the last file's header, slots and entries out of step
            # (a killed process, or a lost host whose pages arrived in any order): it is cut
            # to its trustworthy entries before ``cut_at`` and its slots recomputed.
            dropped, report.index_slots_repaired = index.mend(cut_at, _store_time(log))
            report.index_entries_dropped += dropped
        _drop_derived(log, self.active, index, cut_at, report)
        if index is not None and (
            self.options.rebuild_index or index_damaged(log, index) or report.fenced_bytes
        ):
            # Unlike RocketMQ, an impossible index is dropped and dispatched again.
            index.destroy()
            report.index_rebuilt = True
        self._redispatch(cut_at)

    def _redispatch(self, cut_at: int) -> None:
        """Derived files that lag further (deleted or emptied; without a progress file, any
        that stopped short) are dispatched again from where the furthest behind stopped. With
        one, the files before its point are vouched for, and trailing records that make no
        unit or entry (transactions, no keys) must not count as a lag."""
        files, log, index, report = self.files, self.log, self.files.index, self.report
        redispatch_from = cut_at
        if self.trusted is None or _derived_lost(log, files.queues, index, files.progress):
            redispatch_from = min(cut_at, dispatched_end(log, self.queue_list, index))
        if redispatch_from < cut_at:
            _drop_derived(log, self.queue_list, index, redispatch_from, report)
        report.redispatch_from = redispatch_from
        if redispatch_from < self.end:
            count, last_unit_ts = dispatch.redispatch(
                log, redispatch_from, self.end, files.queue_factory, index
            )
            report.records_redispatched = count
            if last_unit_ts >= 0:
                # As RocketMQ does while re-dispatching: the logics time is the newest
                # dispatched message's.
                files.checkpoint.logics_msg_timestamp = last_unit_ts
        # The units past the point that were not written again go now (a reader beside this
        # recovery found the others where they were all along), durably before anything is
        # written after them.
        queues = list(files.queues.values())
        for cq in queues:
            report.units_dropped += cq.trim(sync=False)
        if files.sync_truncated is not None:
            files.sync_truncated(queues)
        else:
            for cq in queues:
                cq.sync_truncated()

    def correct_min_offsets(self) -> None:
        for cq in self.files.queues.values():
            # Units below the CommitLog's first offset are expected after retention: skip them.
            # (A queue not loaded does this when it loads.)
            if cq.loaded:
                cq.correct_min_offset(self.log.min_offset)

    def rebuild_queues(self) -> None:
        """Unlike RocketMQ, rebuild ConsumeQueues that do not match the log."""
        log, queues, progress = self.log, self.files.queues, self.files.progress
        looked_at = {key: cq for key, cq in queues.items() if cq.loaded}
        if self.trusted is not None and not self.full_check:
            # What a clean close vouches for the rest: each queue's last unit, one read each.
            rebuild = [key for key, cq in looked_at.items() if not last_unit_matches(log, cq)]
        else:
            rebuild = damaged_queues(log, looked_at)
        if progress is not None and self.trusted is not None:
            # Queues the last flush recorded that are now missing or shorter.
            for name, length in progress.queues.items():
                topic, _, qid = name.rpartition("/")
                have = queues.get((topic, int(qid)))
                if (have is None or have.max_offset < length) and (topic, int(qid)) not in rebuild:
                    rebuild.append((topic, int(qid)))
        if not rebuild:
            return
        floors = {key: self._floor(key) for key in rebuild}
        for key in rebuild:
            if key in queues:
                queues.pop(key).destroy()
        # Queues that are intact skip the units they hold.
        dispatch.redispatch(log, log.min_offset, self.end, self.files.queue_factory, None)
        self.report.queues_rebuilt = [f"{t}/{q}" for t, q in rebuild]
        self.correct_min_offsets()  # the rebuilt queues are new objects
        for (topic, queue_id), floor in floors.items():
            cq = self.files.queue_factory(topic, queue_id)
            if cq.max_offset < floor and cq.max_offset <= cq.min_offset and log.min_offset > 0:
                # Every record of the queue is gone from the log (retention), and with them
                # what the units said: the queue resumes where its offsets ended, not at 0.
                cq.resume_at(floor, log.min_offset)
                self.report.queues_resumed[f"{topic}/{queue_id}"] = floor

    def _floor(self, key: tuple[str, int]) -> int:
        """Where a queue about to be rebuilt must end at least: the length the last flush
        recorded (durable, whether or not the progress file is trusted as a start point), and
        past the queue's leading units whose records retention deleted (they were handed
        out, and the log no longer holds them to dispatch again)."""
        topic, queue_id = key
        progress = self.files.progress
        floor = progress.queues.get(f"{topic}/{queue_id}", 0) if progress is not None else 0
        cq = self.files.queues.get(key)
        if cq is not None and cq.max_offset > cq.min_offset:
            lo = cq.min_offset
            units = cq.read(lo, cq.max_offset - lo)
            floor = max(floor, lo + expired_units(units, self.log.min_offset))
        return floor


def _store_time(log: CommitLog) -> Callable[[int], int]:
    """The store time of the record at a CommitLog offset, for an index file's new end."""
    return lambda at: log.store_timestamp(at, record.FIXED_SIZE_V4)


def _drop_derived(
    log: CommitLog,
    queues: list[ConsumeQueue],
    index: IndexService | None,
    phys: int,
    report: RecoveryReport,
) -> None:
    """Forget ConsumeQueue units and index entries of records at ``phys`` or later: the
    queues' ends are taken back in memory (their units stay on disk until the re-dispatch has
    written them again, and the caller trims the rest and syncs it)."""
    for cq in queues:
        cq.rewind_after_physical(phys)
    if index is not None:
        report.index_entries_dropped += index.truncate_from(phys, _store_time(log))


def _derived_lost(
    log: CommitLog,
    queues: dict[tuple[str, int], ConsumeQueue],
    index: IndexService | None,
    progress: FlushProgress | None,
) -> bool:
    """Whether a derived file the last flush recorded is gone or shorter, or the index is empty
    although the log is not."""
    if progress is not None:
        for name, length in progress.queues.items():
            topic, _, qid = name.rpartition("/")
            have = queues.get((topic, int(qid)))
            if have is None or have.max_offset < length:
                return True
    if index is not None and log.max_offset > log.min_offset:
        return not index.files or index.files[-1].entry_count == 0
    return False
