"""Retention and disk pressure: deleting old files as RocketMQ 4.9.x's broker does.

:class:`RetentionService` is RocketMQ's three cleaners (``CleanCommitLogService``,
``CleanConsumeQueueService``, ``IndexService.deleteExpiredFile``) as one call,
:meth:`RetentionService.run`: expired CommitLog segments at the ``deleteWhen`` hours, on a
manual clean or above ``diskMaxUsedSpaceRatio``; any segment above 85 %; then the ConsumeQueue
and index files left below the CommitLog's min offset, and each queue's min offset. With the
tier on, only segments the bucket holds. It also keeps the disk-full mark (over 90 % until back
at 85 %). What a round deletes and in what order, with RocketMQ's names and where rocketstore
differs: docs/operations.md ("Retention"). The thresholds, triggers and reasons are
:mod:`rocketstore.pipeline.engine.retention.policy`'s, what a round reports
:mod:`rocketstore.pipeline.engine.retention.report`'s.

Owns: the deletion of a store's files, and the disk-full mark.

Requires: :meth:`~RetentionService.run` and :meth:`~RetentionService.plan` under the store's
writer lock (they read or change its files in memory and on disk, and do not take it
themselves); :meth:`~RetentionService.check_put` first thing in every put, before anything is
encoded or written; :meth:`~RetentionService.run` from a background thread about every
:data:`~rocketstore.pipeline.engine.retention.policy.RUN_INTERVAL_MS`, never on the put path.

Thread-safety: :meth:`~RetentionService.refresh` only measures the disk;
:meth:`~RetentionService.disk_full`, :meth:`~RetentionService.check_put` and
:attr:`~RetentionService.used_ratio` read one attribute each; these need no lock. A call of
:meth:`~RetentionService.run` is bounded (at most
:attr:`RetentionPolicy.max_files_per_run` segments, :attr:`RetentionPolicy.max_queues_per_run`
queues and :attr:`RetentionPolicy.max_derived_files_per_run` derived files; the next round goes
on), so the lock is held for a bounded time. :meth:`~RetentionService.plan` changes nothing and
works on a read-only store.

Crash behaviour: segments go oldest first, the directory synced after each, so a crash leaves
a contiguous run that opens; ConsumeQueue and index files go only after the segments, each
closed before it is unlinked, so a crash between the two leaves files pointing below the min
offset, which recovery steps past and the next round deletes. A file already gone is not an
error. A segment a reader holds a zero-copy view of (:meth:`CommitLog.raw`) is kept and ends
the round (``deferred`` in the report); the next round tries again.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.retention.policy import (
    KIND_COMMITLOG,
    KIND_CONSUMEQUEUE,
    KIND_INDEX,
    REASON_BELOW_MIN_OFFSET,
    REASON_DISK_PRESSURE,
    REASON_EXPIRED,
    REASON_FORCED,
    TRIGGER_DELETE_WHEN,
    TRIGGER_DISK_RATIO,
    TRIGGER_FORCIBLY,
    TRIGGER_MANUAL,
    RetentionPolicy,
    statvfs_total_bytes,
    statvfs_used_ratio,
)
from rocketstore.pipeline.engine.retention.report import (
    CleanPlan,
    CleanReport,
    FileDeletion,
    QueueMinOffset,
)
from rocketstore.pipeline.errors import DiskFullError, ReadOnlyStoreError, StoreClosedError
from rocketstore.pipeline.files.mappedfile import MappedFile
from rocketstore.pipeline.files.segmentread import unit_index
from rocketstore.pipeline.layout import CQ_UNIT_SIZE
from rocketstore.pipeline.tier.localstate import uploaded_end

if TYPE_CHECKING:
    from rocketstore.pipeline.files.commitlog import CommitLog
    from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue
    from rocketstore.pipeline.files.indexservice import IndexService


class RetainedStore(Protocol):
    """What retention works on: the parts of a store it reads and deletes from. A
    :class:`~rocketstore.pipeline.engine.store.MessageStore` is one; this module never imports it (the store
    imports this module to run it)."""

    path: Path
    config: StoreConfig
    commitlog: CommitLog
    queues: dict[tuple[str, int], ConsumeQueue]
    index: IndexService | None
    read_only: bool

    @property
    def closed(self) -> bool: ...


_LONG = struct.Struct(">q")


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclasses.dataclass
class _Round:
    """Working state of one plan or run."""

    execute: bool
    files: list[FileDeletion] = dataclasses.field(default_factory=list)
    queues: list[QueueMinOffset] = dataclasses.field(default_factory=list)
    deferred: list[Path] = dataclasses.field(default_factory=list)
    complete: bool = True


def _stat(path: Path) -> tuple[int, int, int]:
    """(length, allocated bytes, mtime ms) of a file; a vanished file is empty and expired."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return 0, 0, 0
    return st.st_size, st.st_blocks * 512, st.st_mtime_ns // 1_000_000


class RetentionService:
    """Deletes a store's expired files and watches its disk (see the module docstring).

    ``clock_ms`` gives the time when a call passes none; ``disk_usage`` the used share (0..1) of
    the filesystem holding a path, ``disk_total`` its size in bytes (for dry-run estimates).
    All three default to the real thing and exist so tests can drive time and disk use.
    """

    def __init__(
        self,
        store: RetainedStore,
        policy: RetentionPolicy | None = None,
        *,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        disk_usage: Callable[[Path], float] = statvfs_used_ratio,
        disk_total: Callable[[Path], int] = statvfs_total_bytes,
    ) -> None:
        self.store = store
        self.policy = policy or RetentionPolicy.from_config(store.config)
        self.clock_ms = clock_ms
        self.disk_usage = disk_usage
        self.disk_total = disk_total
        self._used_ratio = 0.0
        self._disk_full = False
        # CommitLog min offset the ConsumeQueues and index were last cleaned for; -1 makes the
        # first run check them all (after a crash between the CommitLog and them).
        self._derived_clean_for = -1
        # With the tier on: the segments not uploaded at the last round, for DiskFullError.
        self._tier_backlog: str | None = None
        # The queues still to look at for the min offset ``_pending_for`` (see _clean_derived).
        self._pending: list[tuple[str, int]] = []
        self._pending_for = -1
        self.refresh()

    # -- disk state (lock-free readers) -----------------------------------------------------
    @property
    def used_ratio(self) -> float:
        """Disk use at the last measurement (0..1; -1 if unknown)."""
        return self._used_ratio

    def disk_full(self) -> bool:
        """Whether puts must be refused (cached; see :meth:`refresh`)."""
        return self._disk_full

    def check_put(self) -> None:
        """Raise :class:`DiskFullError` if puts must be refused. For the put path: cheap."""
        if self._disk_full:
            raise DiskFullError(
                str(self.store.path),
                self._used_ratio,
                self.policy.warning_level_ratio,
                self._tier_backlog,
            )

    def refresh(self) -> float:
        """Measure the disk and update :meth:`disk_full`; returns the used share."""
        ratio = self._measure()
        self._note(ratio)
        return ratio

    def _measure(self) -> float:
        directory = self.store.path / "commitlog"
        return float(self.disk_usage(directory if directory.is_dir() else self.store.path))

    def _note(self, ratio: float) -> None:
        self._used_ratio = ratio
        if ratio > self.policy.warning_level_ratio:
            self._disk_full = True
        elif ratio <= self.policy.clean_forcibly_ratio:
            self._disk_full = False

    def _full_after(self, ratio: float) -> bool:
        if ratio > self.policy.warning_level_ratio:
            return True
        if ratio <= self.policy.clean_forcibly_ratio:
            return False
        return self._disk_full

    # -- planning and running ---------------------------------------------------------------
    def plan(
        self,
        now_ms: int | None = None,
        *,
        force_expired: bool = False,
        max_files: int | None = None,
    ) -> CleanPlan:
        """What :meth:`run` with the same arguments would delete, and why. Changes nothing."""
        self._check_store(write=False)
        now = self.clock_ms() if now_ms is None else now_ms
        ratio = self._measure()
        log = self.store.commitlog
        before = log.min_offset
        rnd = _Round(execute=False)
        total = max(1, self.disk_total(self.store.path))
        after = self._clean_commitlog(
            rnd, now, ratio, force_expired, max_files, lambda freed: ratio - freed / total
        )
        self._clean_derived(rnd, after)
        est = ratio - sum(f.allocated for f in rnd.files) / total if ratio >= 0 else ratio
        return CleanPlan(
            store=self.store.path,
            now_ms=now,
            disk_used_ratio=ratio,
            triggers=self._triggers(now, ratio, force_expired),
            files=rnd.files,
            queues=rnd.queues,
            commitlog_min_offset_before=before,
            commitlog_min_offset_after=after,
            disk_used_ratio_after=est,
            disk_full=self._full_after(est),
        )

    def run(
        self,
        now_ms: int | None = None,
        *,
        force_expired: bool = False,
        max_files: int | None = None,
    ) -> CleanReport:
        """Delete what is due (see the module docstring), measure the disk again, report.

        ``force_expired`` deletes expired CommitLog segments whatever the hour (a manual clean);
        ``max_files`` overrides the policy's limit on CommitLog segments for this call.
        """
        self._check_store(write=True)
        now = self.clock_ms() if now_ms is None else now_ms
        ratio = self._measure()
        self._note(ratio)
        triggers = self._triggers(now, ratio, force_expired)
        log = self.store.commitlog
        before = log.min_offset
        rnd = _Round(execute=True)
        after = self._clean_commitlog(
            rnd, now, ratio, force_expired, max_files, lambda _freed: self._measure()
        )
        self._clean_derived(rnd, after)
        ratio_after = self._measure() if rnd.files else ratio
        self._note(ratio_after)
        return CleanReport(
            store=self.store.path,
            now_ms=now,
            disk_used_ratio=ratio,
            triggers=triggers,
            files=rnd.files,
            queues=rnd.queues,
            commitlog_min_offset_before=before,
            commitlog_min_offset_after=after,
            disk_used_ratio_after=ratio_after,
            disk_full=self._disk_full,
            deferred=rnd.deferred,
            complete=rnd.complete,
        )

    def _check_store(self, *, write: bool) -> None:
        if self.store.closed:
            raise StoreClosedError(f"{self.store.path}: store is closed")
        if write and self.store.read_only:
            raise ReadOnlyStoreError(
                f"{self.store.path}: store was opened read-only; retention can only plan"
            )

    def _triggers(self, now_ms: int, ratio: float, force_expired: bool) -> list[str]:
        p = self.policy
        out: list[str] = []
        if p.is_delete_hour(now_ms):
            out.append(TRIGGER_DELETE_WHEN)
        if force_expired:
            out.append(TRIGGER_MANUAL)
        if ratio < 0 or ratio > p.disk_max_used_space_ratio:
            out.append(TRIGGER_DISK_RATIO)
        if p.clean_file_forcibly_enable and ratio > p.clean_forcibly_ratio:
            out.append(TRIGGER_FORCIBLY)
        return out

    def _clean_commitlog(
        self,
        rnd: _Round,
        now: int,
        ratio: float,
        force_expired: bool,
        max_files: int | None,
        ratio_after: Callable[[int], float],
    ) -> int:
        """Delete (or plan) CommitLog segments; returns the CommitLog min offset after."""
        p = self.policy
        triggers = self._triggers(now, ratio, force_expired)
        on_time = TRIGGER_DELETE_WHEN in triggers or TRIGGER_MANUAL in triggers
        on_space = TRIGGER_DISK_RATIO in triggers
        forcibly = TRIGGER_FORCIBLY in triggers
        limit = p.max_files_per_run if max_files is None else max_files
        segments = self.store.commitlog.segments
        files = segments.files
        tier_end = self._tier_end(files)
        freed = 0
        done = 0
        while True:
            k = 0 if rnd.execute else done
            if k >= len(files) - 1:
                break  # only the segment being written is left
            mf = files[k]
            if tier_end is not None and mf.base + mf.size > tier_end:
                break  # not in the bucket yet: never deleted, whatever the disk
            size, allocated, mtime = _stat(mf.path)
            expired = now >= mtime + p.reserved_ms
            if expired and on_time:
                reason = REASON_EXPIRED
            elif expired and on_space:
                reason = REASON_DISK_PRESSURE
            elif forcibly:
                reason = REASON_FORCED
            else:
                break  # not due: and nothing after it may go before it does
            if done >= limit:
                rnd.complete = False
                break
            if rnd.execute and not segments.delete_first():
                rnd.deferred.append(mf.path)
                rnd.complete = False
                break
            rnd.files.append(FileDeletion(mf.path, KIND_COMMITLOG, size, allocated, reason, mtime))
            done += 1
            freed += allocated
            if forcibly:
                now_ratio = ratio_after(freed)
                if 0 <= now_ratio <= p.clean_forcibly_ratio:
                    forcibly = False
        return files[done if not rnd.execute else 0].base if files else 0

    def _tier_end(self, files: list[MappedFile]) -> int | None:
        """With the tier on, ``uploadedEnd`` (read again now), and the backlog above it noted
        for :meth:`check_put`; None with the tier off."""
        if not self.store.config.tier_on:
            self._tier_backlog = None
            return None
        end = uploaded_end(self.store.path)
        # The last segment is being written: the backlog is what is sealed and not uploaded.
        waiting = [mf for mf in files[:-1] if mf.base + mf.size > end]
        self._tier_backlog = (
            f"the tier's upload backlog is {len(waiting)} segments "
            f"({sum(_stat(mf.path)[1] for mf in waiting)} bytes) above uploadedEnd {end} "
            "(config/rocketstore-tier.json); local retention deletes only segments the bucket "
            "holds: run `rocketstore tier upload`, or see why it stalls (`rocketstore tier "
            "status`)"
            if waiting
            else None
        )
        return end

    def _queues_to_clean(self) -> list[tuple[str, int]]:
        """The queues a new CommitLog min offset may change, in order: those loaded (their
        min offset is in memory), and those not loaded whose files may be more than one (the
        length the last flush recorded does not fit the first, or is not known). A queue not
        loaded that fits its first file has no file to delete (the last never goes), and
        takes the CommitLog's min offset into account when it loads; nothing of it is read."""
        return sorted(
            key
            for key, cq in self.store.queues.items()
            if cq.loaded or cq.recorded is None or cq.recorded > cq.units_per_file
        )

    def _clean_derived(self, rnd: _Round, min_phy: int) -> None:
        """Delete (or plan) ConsumeQueue and index files below ``min_phy``, move queue mins.

        A run looks at :attr:`RetentionPolicy.max_queues_per_run` queues at most (of
        :meth:`_queues_to_clean`) and deletes :attr:`RetentionPolicy.max_derived_files_per_run`
        files at most; the next run goes on where it stopped, so a run's cost follows what it
        deletes, not how many queues the store has."""
        if min_phy == self._derived_clean_for:
            return
        budget = self.policy.max_derived_files_per_run
        if rnd.execute:
            if self._pending_for != min_phy:
                self._pending, self._pending_for = self._queues_to_clean(), min_phy
            keys = self._pending
        else:
            keys = self._queues_to_clean()
        complete = True
        looked = 0
        for topic, queue_id in keys:
            if budget <= 0 or looked >= self.policy.max_queues_per_run:
                complete = False
                break
            cq = self.store.queues.get((topic, queue_id))
            if cq is None:
                looked += 1
                continue
            files = cq.segments.files
            done = 0
            while True:
                k = 0 if rnd.execute else done
                if k >= len(files) - 1:
                    break
                mf = files[k]
                if mf.wrote_position < mf.size or _last_unit_offset(mf) >= min_phy:
                    break
                if budget <= 0:
                    complete = False
                    break
                stat = _stat(mf.path)
                if rnd.execute and not cq.segments.delete_first():
                    rnd.deferred.append(mf.path)
                    complete = False
                    break
                rnd.files.append(_derived(mf.path, KIND_CONSUMEQUEUE, stat))
                done += 1
                budget -= 1
            if files:
                old = cq.min_offset
                if rnd.execute:
                    cq.correct_min_offset(min_phy)
                    new = cq.min_offset
                else:
                    new = unit_index(cq.corrected_min_logic_offset(min_phy, done), 0)
                if new != old:
                    rnd.queues.append(QueueMinOffset(topic, queue_id, old, new))
            if not complete:
                break  # this queue has more to delete: the next run starts with it
            looked += 1
        if rnd.execute:
            del self._pending[:looked]
        index = self.store.index
        if index is not None:
            done = 0
            while budget > 0:
                k = 0 if rnd.execute else done
                if k >= len(index.files) - 1:
                    break
                f = index.files[k]
                if f.end_phy_offset >= min_phy:
                    break
                stat = _stat(f.path)
                if rnd.execute:
                    index.delete_first()
                rnd.files.append(_derived(f.path, KIND_INDEX, stat))
                done += 1
                budget -= 1
            else:
                complete = False
        rnd.complete = rnd.complete and complete
        if rnd.execute and complete:
            self._derived_clean_for = min_phy
            self._pending, self._pending_for = [], -1


def _derived(path: Path, kind: str, stat: tuple[int, int, int]) -> FileDeletion:
    size, allocated, mtime = stat
    return FileDeletion(path, kind, size, allocated, REASON_BELOW_MIN_OFFSET, mtime)


def _last_unit_offset(mf: MappedFile) -> int:
    """CommitLog offset of a full ConsumeQueue file's last unit."""
    # Read, not mapped: retention looks at old files nothing else is using.
    return int(_LONG.unpack(mf.read(mf.size - CQ_UNIT_SIZE, _LONG.size))[0])
