"""``MessageStore``: one broker store directory, laid out exactly as RocketMQ's.

::

    STORE/
      commitlog/<20-digit offset>            every message (rocketstore.pipeline.files.commitlog)
      consumequeue/<topic>/<queueId>/<off>   per-queue units (rocketstore.pipeline.files.consumequeue.queue)
      index/<yyyyMMddHHmmssSSS>              key index (rocketstore.pipeline.files.indexfile)
      config/                                broker metadata (RocketMQ keeps JSON files here)
      checkpoint                             flush timestamps (rocketstore.pipeline.files.checkpoint)
      abort                                  present while a writer has the store open
      lock                                   locked while a writer has the store open

Contract:

* One writer per directory. Opening for writing takes the ``lock`` file's lock; a second
  writable open, from this or any other process (a RocketMQ broker included), fails at once
  with :class:`StoreLockedError`. Read-only opens take no lock and write nothing.
* Not thread-safe: use one ``MessageStore`` from one thread at a time. Every read and write
  takes the store's lock (:meth:`MessageStore.writer_lock`), so none runs in the middle of
  the store's own background flush or retention round.
* A put or batch put returns after its records are in the CommitLog (flushed first under
  ``SYNC_FLUSH``, once per batch) and dispatched to the ConsumeQueues and index. A batch is all
  or nothing with respect to validation: a bad message refuses the whole batch before anything
  is written.
* Fail-stop: a put either returns with the CommitLog, every ConsumeQueue and the index
  consistent, or raises. A put that fails before writing a byte (validation, a full disk, a
  segment that cannot be created) leaves the store unchanged and usable. One that fails after
  (an I/O error while writing or dispatching) raises :class:`StoreFailedError`, and so does
  every later write of this ``MessageStore``: reopen the store, and recovery repairs it
  exactly, from the durable dispatch point recorded by the last complete flush.
* :meth:`close` flushes everything, writes the checkpoint, removes ``abort`` and unlocks;
  each of its steps runs even if an earlier one failed, and the lock is always released.
* A writable store runs two background threads: the flusher (every flushIntervalCommitLog ms,
  which is what makes ``ASYNC_FLUSH`` data durable while the store stays open) and the cleaner
  (retention every 10 s). ``background=False`` starts neither, for a writer that holds the
  store briefly: it calls :meth:`clean` itself, and its data is flushed on :meth:`close`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import fencing, sharedopen, storehost
from rocketstore.pipeline.engine.appender import Appender
from rocketstore.pipeline.engine.background import PeriodicTask
from rocketstore.pipeline.engine.earlyroll import EarlyRoll
from rocketstore.pipeline.engine.publish import MAX_NOTES, FlushPointRecorder
from rocketstore.pipeline.engine.reads import StoreReads
from rocketstore.pipeline.engine.recovery import (
    RecoveryFiles,
    RecoveryOptions,
    RecoveryReport,
    check_loaded_queue,
    recover,
)
from rocketstore.pipeline.engine.results import BatchPutResult, PutResult
from rocketstore.pipeline.engine.retention.policy import RUN_INTERVAL_MS, statvfs_used_ratio
from rocketstore.pipeline.engine.retention.report import CleanReport
from rocketstore.pipeline.engine.retention.service import RetentionService
from rocketstore.pipeline.engine.sharedopen import PublishedView
from rocketstore.pipeline.engine.storefiles import open_files
from rocketstore.pipeline.errors import (
    FencedError,
    ProgressNotRecordedError,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreFailedError,
)
from rocketstore.pipeline.files import durability, failpoints, storedir
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue
from rocketstore.pipeline.files.filecreation import free_space
from rocketstore.pipeline.files.filesizes import check_file_sizes
from rocketstore.pipeline.files.lock import DirectoryLock
from rocketstore.pipeline.files.mappings import WorkCounts
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.message import Message

_log = logging.getLogger(__name__)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MessageStore(StoreReads):
    def __init__(
        self,
        path: str | os.PathLike[str],
        config: StoreConfig | None = None,
        *,
        read_only: bool = False,
        create: bool = True,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        disk_usage: Callable[[Path], float] | None = None,
        full_check: bool = False,
        background: bool = True,
        cut_at_damage: bool = False,
    ) -> None:
        self.path = Path(path)
        self.full_check = full_check
        # Whether recovery may cut a log with valid records after damage inside it (dropping
        # them); by default it refuses and changes nothing (rocketstore.pipeline.engine.recovery).
        self.cut_at_damage = cut_at_damage
        self.config = config or StoreConfig()
        self.read_only = read_only
        self.clock_ms = clock_ms
        self._closed = True
        self._lock: DirectoryLock | None = None
        self._mutex = threading.RLock()
        self._flusher: PeriodicTask | None = None
        self._cleaner: PeriodicTask | None = None
        self.retention: RetentionService | None = None
        self._failure: BaseException | None = None
        # Why the last flush could not record its progress, until one does.
        self._unrecorded: OSError | None = None
        storedir.check_directory(self.path, read_only=read_only, create=create)
        if not read_only:
            self._lock = DirectoryLock(self.path)
            self._lock.acquire()
        try:
            if not read_only:
                # Before _open writes anything (the abort file above all): a refused open must
                # leave the store as it was.
                check_file_sizes(self.path, self.config)
            self._open()
        except BaseException:
            if self._lock is not None:
                self._lock.release_refused()
            raise
        self._closed = False
        if not read_only:
            self.retention = RetentionService(
                self, clock_ms=clock_ms, disk_usage=disk_usage or statvfs_used_ratio
            )
        if not read_only and background:
            self._flusher = PeriodicTask(
                self.config.flush_interval_commitlog,
                functools.partial(self._flush, force=False, quiet=True),
                name=f"rocketstore-flush:{self.path.name}",
            )
            self._flusher.start()
            self._cleaner = PeriodicTask(
                RUN_INTERVAL_MS, self.clean, name=f"rocketstore-clean:{self.path.name}"
            )
            self._cleaner.start()
        self._tasks = tuple(t for t in (self._flusher, self._cleaner) if t is not None)

    # -- opening ----------------------------------------------------------------------------
    def _open(self) -> None:
        """Open the files, recover them and get ready to write: the plain open, with the steps
        shared storage adds around it (rocketstore.pipeline.engine.sharedopen)."""
        # From a listing: a stat may answer from a name this host cached, which another host
        # may have removed a moment ago (rocketstore.pipeline.engine.fencing, "Stale reads").
        self.abort_file_found = fencing.abort_identity(self.path) is not None
        if self._lock is not None:  # a writer
            for sub in ("commitlog", "consumequeue", "index", "config"):
                durability.make_dirs(self.path / sub)
            self._lock.mark_open()  # abort, and what keeps a broker off meanwhile
            storedir.write_in_place(self.path)
        sharing = sharedopen.before_files(
            self.path, self.config, read_only=self.read_only, abort_found=self.abort_file_found
        )
        self.shared = sharing.shared
        files = open_files(
            self.path,
            self.config,
            read_only=self.read_only,
            shared=self.shared,
            listing_wait=sharing.listing_wait,
            clock_ms=self.clock_ms,
        )
        self.mappings = files.mappings
        self.checkpoint = files.checkpoint
        self.commitlog = files.commitlog
        self._progress = files.progress
        self._queueset = files.queueset
        self.index = files.index
        self.queues: dict[tuple[str, int], ConsumeQueue] = self._queueset.queues
        # On shared storage, or once any writer fenced the store, a writer fences off those
        # before it (rocketstore.pipeline.engine.fencing); every writable open honours dead regions.
        self._fence: fencing.Fence | None = None
        self.recovery = self._recover(taking_over=sharing.fenced and self.abort_file_found)
        self.recovery.files_renewed = sharing.renewed
        if sharing.fenced:
            self._take_epoch()
        self._view: PublishedView | None = None
        if self.read_only and self.shared:
            self._view = PublishedView.hide_unpublished(
                self.path, self.commitlog, self.queues.values()
            )
        elif self.read_only:
            # Recovery loaded the queues written past the last flush after it walked the log
            # to its end: the writer may have added units to them in between.
            for cq in self.queues.values():
                if cq.loaded:
                    self._end_at_view(cq)
        self._start_writes()

    def _start_writes(self) -> None:
        """After recovery: the store host, the flush schedule, the appender and the recorder
        of progress (a read-only store has them too, and writes nothing with them)."""
        cfg = self.config
        if not self.read_only:
            # Every writer of a directory stamps the directory's store host (rocketstore.pipeline.engine.storehost).
            newest = storehost.newest_record_host(
                self.commitlog, self.queues.values(), self.recovery.last_record_offset
            )
            self.config = cfg = storehost.for_directory(cfg, newest)
        self._sync_flush = cfg.sync_flush
        self._flush_every_s = cfg.flush_interval_commitlog / 1000
        # On shared storage readers see only what a flush published (rocketstore.pipeline.files.visibility);
        # under SYNC_FLUSH a put publishes before it returns, so what it acknowledges is
        # readable from every host.
        self._publish_each_put = self._sync_flush and self.shared
        self._queueset.on_load = self._queue_loaded
        last = self.recovery.last_record_offset
        self._appender = Appender(
            path=self.path,
            commitlog=self.commitlog,
            queues=self.queues,
            queue=self._queue,
            index=self.index,
            config=cfg,
            next_queue_offset={},
            last_record=(
                (last, self.commitlog.store_timestamp(last, record.FIXED_SIZE_V4))
                if last >= 0
                else None
            ),
            stop_writes=self._stop_writes,
        )
        self._roll = EarlyRoll(cfg, self.commitlog, self._appender)
        self._recorder = FlushPointRecorder(
            self.path,
            commitlog=self.commitlog,
            queues=self.queues,
            index=self.index,
            checkpoint=self.checkpoint,
            notes=dict(self._progress.notes) if self._progress is not None else {},
            clock_ms=self.clock_ms,
        )
        self._flushed_end = (
            -1 if self.recovery.records_redispatched else self._appender.dispatched_end
        )
        self._flushed_at = time.monotonic()

    def _queue_loaded(self, cq: ConsumeQueue) -> None:
        """A queue's files were looked at for the first time since the store opened (see
        rocketstore.pipeline.engine.queueset): what recovery does for the queues it loads, it does
        now. A writer's queue must end where the last flush recorded and its last unit point at
        a record of the queue, or the queue is refused (`rocketstore recover` rebuilds it); a
        read-only view's ends at the log's end the view fixed when it opened."""
        cq.correct_min_offset(self.commitlog.min_offset)
        if self._view is not None:
            self._view.hide(cq)
        elif self.read_only:
            self._end_at_view(cq)
        if not self.read_only:
            check_loaded_queue(self.commitlog, cq)

    def _end_at_view(self, cq: ConsumeQueue) -> None:
        """A view is the store as it opened: the units a writer added since point past the
        log's end the view fixed then, and are not there for it (not damage either)."""
        cq.hide_past(self.commitlog.max_offset)

    def _take_epoch(self) -> None:
        """Record this writer's epoch, after fencing off an unclean end (rocketstore.pipeline.engine.fencing)."""
        assert self._lock is not None
        self._fence = fencing.take_over(
            self.commitlog, self.path, self._lock, self.abort_file_found, self.clock_ms()
        )

    def _check_fence(self, what: str) -> None:
        """Refuse a write of a writer that no longer owns the store (rocketstore.pipeline.engine.fencing)."""
        if self._fence is None:
            return
        try:
            self._fence.check(what)
        except FencedError as exc:
            self._failure = self._failure or exc
            raise

    def _recover(self, *, taking_over: bool) -> RecoveryReport:
        dead, suspect = sharedopen.dead_regions(self.path, full_check=self.full_check)
        files = RecoveryFiles(
            log=self.commitlog,
            queues=self.queues,
            index=self.index,
            checkpoint=self.checkpoint,
            progress=self._progress,
            queue_factory=self._queue,
            sync_truncated=self._queueset.sync_truncated,
        )
        options = RecoveryOptions(
            abnormal=self.abort_file_found,
            read_only=self.read_only,
            check_crc=self.config.check_crc_on_recover,
            full_check=self.full_check,
            dead=dead,
            cut_at_damage=self.cut_at_damage,
            rebuild_index=suspect,
            taking_over=taking_over,
        )
        return recover(files, options)

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self, write: bool = False) -> None:
        if self._closed:
            raise StoreClosedError(f"{self.path}: store is closed")
        if write and self.read_only:
            raise ReadOnlyStoreError(f"{self.path}: store was opened read-only")
        if write and self._failure is not None and self._fence is not None:
            # A write that failed when the network went may have lost the store as well: say
            # so rather than only that the write failed.
            with self._mutex:
                self._check_fence("put")
        if write and isinstance(self._failure, FencedError):
            raise FencedError(str(self._failure)) from self._failure
        if write and self._failure is not None:
            raise StoreFailedError(
                f"{self.path}: an earlier put failed part-way ({self._failure!r}); the store "
                "takes no more writes until it is closed and opened again, which recovers it"
            ) from self._failure

    @property
    def progress_at_open(self) -> FlushProgress | None:
        """The progress file as this store read it when it opened, before it listed any file
        (None without one): for a read-only view of a live store, what was durable then, all
        of whose files the view has."""
        return self._progress

    @property
    def work(self) -> WorkCounts:
        """What this store did to its files since it opened (rocketstore.pipeline.files.mappings)."""
        return self.mappings.work

    @property
    def failed(self) -> BaseException | None:
        """The error that stopped writes (see the fail-stop contract), or None."""
        return self._failure

    def flush(self, *, force: bool = False) -> None:
        """Flush CommitLog, ConsumeQueues and index, then record how far in the progress file
        and the checkpoint. Called by the background flusher every flushIntervalCommitLog ms
        and on close; safe to call from any thread.

        A failed msync is fail-stop (:class:`StoreFailedError`). A failed write of the progress
        file or the checkpoint (a full disk, an I/O error) is not: the data files are whole and
        flushed, both files keep naming the previous point, and the store goes on taking puts.
        This call then raises :class:`ProgressNotRecordedError` (notes set since the last
        recorded point are not durable yet); the next flush tries again."""
        self._flush(force=force, quiet=False)

    def _flush(self, *, force: bool, quiet: bool) -> None:
        """:meth:`flush`; with ``quiet``, a progress file that cannot be written is left for the
        next round instead of raised (the background flusher, a put's own flush)."""
        if self._closed:
            raise StoreClosedError(f"{self.path}: store is closed")
        if self.read_only:
            raise ReadOnlyStoreError(f"{self.path}: store was opened read-only")
        with self._mutex:
            if self._failure is None:
                self._roll_if_due(self.clock_ms())
            # After a failed put the files still flush, but the progress file keeps naming the
            # last point every derived file reached, so recovery redoes the failed put's tail.
            end = self._appender.dispatched_end
            if end == self._flushed_end and not force and self._unrecorded is None:
                return
            # An msync or write that failed may have lost pages the page cache held, so nothing
            # after it can be vouched for: stop writing, as after a failed put.
            # The pages go out before the fence is checked: they were written while this
            # writer owned the store, and pushing them out is what rids this host of them. Cut
            # off, the msync fails and leaves them clean; left dirty, they would reach the
            # servers whenever the kernel wrote them back, perhaps after the heal, over files
            # another writer has taken over (rocketstore.pipeline.engine.fencing).
            try:
                with self._fail_stop("flush"):
                    self._flush_files()
            except StoreFailedError:
                # A writer that lost the store finds the files it mapped replaced, and their
                # sync fails (rocketstore.pipeline.engine.renewal): say that it was fenced, rather
                # than only that the flush failed.
                self._check_fence("flush")
                raise
            # A writer that lost the store must not publish its own end over the new writer's.
            self._check_fence("flush")
            self._flushed_end = end
            self._flushed_at = time.monotonic()
            if self._failure is not None:
                # After a failure the progress file and the checkpoint keep naming the last
                # point that was whole and flushed; recovery redoes what follows.
                return
            try:
                self._recorder.record(end, self._appender.last_record)
            except OSError as exc:
                self._unrecorded = exc
                if not quiet:
                    raise ProgressNotRecordedError(
                        f"{self.path}: the store's files are flushed, but how far could not be "
                        f"recorded ({exc!r}, {free_space(self.path)}); the "
                        "store goes on, and after a crash recovery starts from the last point "
                        "recorded"
                    ) from exc
            else:
                self._unrecorded = None
                self._recorder.update_topics()

    @contextlib.contextmanager
    def _fail_stop(self, what: str) -> Iterator[None]:
        """Fail-stop around a write step (see :meth:`_stop_writes`)."""
        try:
            yield
        except BaseException as exc:
            self._stop_writes(what, exc)

    def _stop_writes(self, what: str, exc: BaseException) -> NoReturn:
        """Fail-stop after ``exc`` broke a write step: writes end until the store is reopened;
        an ``Exception`` is raised as :class:`StoreFailedError`, an interrupt or an exit (not
        an ``Exception``) goes through as it is."""
        self._failure = self._failure or exc
        if isinstance(exc, Exception):
            raise StoreFailedError(
                f"{self.path}: {what} failed part-way ({exc!r}); the store takes no more "
                "writes until it is closed and opened again, which recovers it"
            ) from exc
        raise exc

    def _flush_files(self) -> None:
        failpoints.hit("flush")
        try:
            self.commitlog.flush()
        except BaseException:
            # Push out every other dirty page now, each failing as the CommitLog's did: on a
            # shared file system a failed write-back leaves a page clean, while one left dirty
            # is written whenever the kernel gets to it, after a partition heals perhaps, over
            # files that a writer elsewhere has taken over meanwhile (rocketstore.pipeline.engine.fencing).
            self._queueset.push_out()
            if self.index is not None:
                with contextlib.suppress(Exception):
                    self.index.flush()
            raise
        self._recorder.flushed(self._queueset.flush())
        if self.index is not None:
            self.index.flush()

    MAX_NOTES = MAX_NOTES

    def note(self, name: str) -> list[int] | None:
        """The note ``name`` as last set, or as the progress file had it at open."""
        with self._mutex:
            got = self._recorder.notes.get(name)
            return list(got) if got is not None else None

    def set_note(self, name: str, value: list[int]) -> None:
        """Keep a small fact with the store (see :mod:`rocketstore.pipeline.files.progress`): written by the next
        flush that records progress, so it becomes durable with the data written before that
        flush, never before it. At most :attr:`MAX_NOTES` are kept; the least recently set go.
        A crash before that flush loses the change, so a note must only ever be a safe hint."""
        self._check_open(write=True)
        with self._mutex:
            self._recorder.set_note(name, value)

    def writer_lock(self) -> threading.RLock:
        """The lock every write takes (puts, flushes, retention); hold it to run maintenance
        that must not interleave with them."""
        return self._mutex

    def clean(self, *, force_expired: bool = False, max_files: int | None = None) -> CleanReport:
        """One retention round (expired files, disk pressure, the disk-full check) under the
        store's lock, once the fence says this writer still owns the store. Run by the cleaner
        thread every 10 s, and by ``rocketstore clean`` (``force_expired``: a manual clean; see
        :meth:`~rocketstore.pipeline.engine.retention.service.RetentionService.run`)."""
        self._check_open(write=True)
        assert self.retention is not None
        with self._mutex:
            self._check_fence("retention")
            return self.retention.run(force_expired=force_expired, max_files=max_files)

    def close(self) -> None:
        """Stop the background threads, flush everything, close every file, remove ``abort``
        and unlock. Idempotent.

        Each step runs whatever became of the others, and the lock is always released; the
        first error is raised at the end, with the later ones as notes. ``abort`` is removed
        only after a complete flush of a store that had not failed: otherwise the next open
        recovers as after a crash. A zero-copy view of a segment still alive does not stop
        the close: its mapping stays valid until the view is collected."""
        if self._closed:
            return
        errors: list[BaseException] = []

        def step(action: Callable[[], object]) -> bool:
            try:
                action()
            except BaseException as exc:
                errors.append(exc)
                return False
            return True

        try:
            for task in (self._cleaner, self._flusher):
                if task is not None:
                    step(task.stop)
            clean = self.read_only or step(functools.partial(self.flush, force=True))
            with self._mutex:
                # Under the lock: a read in another thread either ran before or sees it closed.
                self._closed = True
                step(self.commitlog.close)
                for close_queue in self._queueset.close():
                    step(close_queue)
                if self.index is not None:
                    step(self.index.close)
                if self._fence is not None:
                    step(self._fence.close)
                if self._lock is not None and clean and self._failure is None:
                    step(self._lock.mark_closed)
        finally:
            if self._lock is not None:
                step(self._lock.release)
        if errors:
            for later in errors[1:]:
                errors[0].add_note(f"also while closing {self.path}: {later!r}")
            raise errors[0]

    # -- writing ----------------------------------------------------------------------------
    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        return self._queueset.queue(topic, queue_id)

    def put(self, message: Message) -> PutResult:
        """Store one message.

        A plain message (no transaction bits, born host or reserved property names) that fits
        the current CommitLog segment, ConsumeQueue file and index file takes a path that
        builds no Arrow table; anything else is put as a batch of one. Both write the same
        bytes and give the same result, errors included.
        """
        self._check_open(write=True)
        with self._mutex:
            for task in self._tasks:  # a flush or retention round that failed stops puts
                task.raise_if_failed()
            if self._fence is not None:  # tested here: the single put's path is short
                self._check_fence("put of 1 message")
            if self.retention is not None:
                self.retention.check_put()
            now = self.clock_ms()
            self._roll_if_due(now)
            done = self._appender.put_one(message, now)
            if done is None:
                return next(self._put_batch([message], now).results())
            self._flush_if_due()
            return done

    def put_batch(self, batch: pa.Table | pa.RecordBatch | Sequence[Message]) -> BatchPutResult:
        """Store a batch of messages (see :mod:`rocketstore.pipeline.format.message` for the columns).

        Validates everything first; on :class:`InvalidMessageError` nothing is written.
        """
        self._check_open(write=True)
        with self._mutex:
            return self._put_batch(batch)

    def _put_batch(
        self, batch: pa.Table | pa.RecordBatch | Sequence[Message], now: int | None = None
    ) -> BatchPutResult:
        for task in self._tasks:
            task.raise_if_failed()
        self._check_fence("put")
        if self.retention is not None:
            # Refused before anything is encoded or written; the cached verdict of the last
            # disk check, so the put path never measures the disk itself.
            self.retention.check_put()
        now = self.clock_ms() if now is None else now
        self._roll_if_due(now)
        done = self._appender.put_batch(batch, now)
        self._flush_if_due()
        return done

    def _roll_if_due(self, now: int) -> None:
        """With the tier on, end the current segment when its first record is older than
        tieredStoreGroupCommitTimeout (rocketstore.pipeline.engine.earlyroll): at a put, a
        flush and so at close."""
        if self._roll.timeout_ms is None:
            return  # the tier is off: no context manager on every put for nothing
        with self._fail_stop("early roll of the CommitLog segment"):
            self._roll.check(now)

    def _flush_if_due(self) -> None:
        """After a put: publish it now under SYNC_FLUSH on shared storage, else flush when a
        flush is due (back-to-back puts can keep the flusher thread from the lock; flushing here
        bounds how much a crash makes recovery re-scan)."""
        if self._publish_each_put or time.monotonic() - self._flushed_at >= self._flush_every_s:
            self._flush(force=False, quiet=True)
