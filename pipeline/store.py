"""``MessageStore``: one broker store directory, laid out exactly as RocketMQ's.

::

    STORE/
      commitlog/<20-digit offset>            every message (rocketstore.pipeline.commitlog)
      consumequeue/<topic>/<queueId>/<off>   per-queue units (rocketstore.pipeline.consumequeue)
      index/<yyyyMMddHHmmssSSS>              key index (rocketstore.pipeline.indexfile)
      config/                                broker metadata (RocketMQ keeps JSON files here)
      checkpoint                             flush timestamps (rocketstore.pipeline.checkpoint)
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
import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from rocketstore.pipeline import (
    consumequeue,
    dispatch,
    durability,
    encode,
    failpoints,
    fencing,
    filesystem,
    indexfile,
    mapped_file,
    native,
    record,
    renewal,
    storehost,
    visibility,
)
from rocketstore.pipeline.background import PeriodicTask
from rocketstore.pipeline.checkpoint import StoreCheckpoint
from rocketstore.pipeline.commitlog import CommitLog
from rocketstore.pipeline.config import CQ_UNIT_SIZE, StoreConfig
from rocketstore.pipeline.consumequeue import UNIT_DTYPE, ConsumeQueue
from rocketstore.pipeline.errors import (
    CorruptRecordError,
    FencedError,
    InvalidMessageError,
    NotAStoreError,
    OffsetOutOfRangeError,
    ProgressNotRecordedError,
    ReadOnlyStoreError,
    SegmentCreateError,
    StoreClosedError,
    StoreFailedError,
)
from rocketstore.pipeline.geometry import check_geometry
from rocketstore.pipeline.index_service import IndexService
from rocketstore.pipeline.lock import DirectoryLock
from rocketstore.pipeline.mapped_file import WHOLE, MappedFile, free_space, limit_note
from rocketstore.pipeline.mappings import MappingCache
from rocketstore.pipeline.message import Message
from rocketstore.pipeline.progress import FlushProgress
from rocketstore.pipeline.recovery import RecoveryReport, recover
from rocketstore.pipeline.retention import RUN_INTERVAL_MS, RetentionService, statvfs_used_ratio
from rocketstore.pipeline.segments import SegmentQueue
from rocketstore.pipeline.subscription import Subscription
from rocketstore.pipeline.topicconfig import TopicConfigError, TopicsKeeper

STORE_ENTRIES = ("commitlog", "consumequeue", "index", "config", "checkpoint", "abort", "lock")
MAX_TIMESTAMP = 2**63 - 1
_NO_INDEX = (None, 0, 0, 0, 0)  # the single put's index arguments without a key index
SCAN_BUDGET_BYTES = 16000  # RocketMQ's floor on ConsumeQueue bytes one filtered pull scans
SINGLE_RESERVE = 64 * 1024  # the largest record a single put writes without the batch path
_log = logging.getLogger(__name__)


class PutResult(NamedTuple):
    """Outcome of one message of a put (``status`` named as RocketMQ's PutMessageStatus).

    A named tuple rather than a frozen dataclass: a single put makes one per call, and a
    tuple is built several times faster."""

    status: str
    msg_id: str
    commit_log_offset: int
    queue_offset: int
    store_size: int
    store_timestamp: int
    uniq_key: str


@dataclasses.dataclass(frozen=True)
class BatchPutResult:
    """Outcome of a batch put, column by column (index ``i`` is the batch's message ``i``)."""

    commit_log_offsets: npt.NDArray[np.int64]
    queue_offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    store_timestamp: int
    uniq_keys: pa.StringArray
    store_host: bytes
    flushed: bool

    def __len__(self) -> int:
        return len(self.commit_log_offsets)

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())

    def msg_ids(self) -> list[str]:
        prefix = self.store_host.hex().upper()
        return [f"{prefix}{off:016X}" for off in self.commit_log_offsets.tolist()]

    def results(self) -> Iterator[PutResult]:
        uniq = self.uniq_keys.to_pylist()
        for i, msg_id in enumerate(self.msg_ids()):
            yield PutResult(
                "PUT_OK",
                msg_id,
                int(self.commit_log_offsets[i]),
                int(self.queue_offsets[i]),
                int(self.sizes[i]),
                self.store_timestamp,
                uniq[i],
            )


@dataclasses.dataclass(frozen=True)
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    max_physic_offset: int


@dataclasses.dataclass(frozen=True)
class GetResult:
    """Outcome of :meth:`MessageStore.get_messages` (``status`` as RocketMQ's GetMessageStatus)."""

    status: str
    messages: list[record.MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MessageStore:
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
        # them); by default it refuses and changes nothing (rocketstore.pipeline.recovery).
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
        self._check_directory(create)
        if not read_only:
            self._lock = DirectoryLock(self.path)
            self._lock.acquire()
        try:
            if not read_only:
                # Before _open writes anything (the abort file above all): a refused open must
                # leave the store as it was.
                check_geometry(self.path, self.config)
            self._open()
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise
        self._closed = False
        # config/topics.json, which a RocketMQ broker needs to serve the topics written here.
        self._topics = TopicsKeeper(self.path / "config", clock_ms=clock_ms)
        self._topics_error: str | None = None
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

    # -- opening ----------------------------------------------------------------------------
    def _check_directory(self, create: bool) -> None:
        p = self.path
        if p.exists() and not p.is_dir():
            raise NotAStoreError(f"{p} is a file, not a store directory")
        if not p.exists():
            if self.read_only or not create:
                raise NotAStoreError(f"{p}: no such store directory")
            # Two writers may create a new broker directory at once (tasks of one micro-batch);
            # the loser goes on to the lock, which decides between them.
            p.mkdir(parents=True, exist_ok=True)
            return
        entries = {e.name for e in p.iterdir()}
        if entries and not entries & set(STORE_ENTRIES):
            raise NotAStoreError(
                f"{p} is not a RocketMQ store directory (it has none of "
                f"{', '.join(STORE_ENTRIES)}) and is not empty; refusing to write into it"
            )
        if self.read_only and "commitlog" not in entries:
            raise NotAStoreError(f"{p} is not a RocketMQ store directory (no commitlog/)")

    def _write_in_place(self) -> None:
        """On a copy-on-write file system, have new store files written in place, so that the
        blocks reserved for them are the blocks their mapped writes use (rocketstore.pipeline.filesystem)."""
        if filesystem.fs_type(self.path) not in filesystem.NOCOW_CAPABLE:
            return
        for sub in ("commitlog", "consumequeue", "index"):
            try:
                filesystem.set_nocow(self.path / sub)
            except OSError as e:
                _log.warning(
                    "%s: cannot set NOCOW (%s); on a full disk a write through a mapping of "
                    "a file created here can fail with SIGBUS",
                    self.path / sub,
                    e,
                )

    def _open(self) -> None:
        cfg = self.config
        self.abort_file_found = (self.path / "abort").exists()
        if not self.read_only:
            for sub in ("commitlog", "consumequeue", "index", "config"):
                durability.make_dirs(self.path / sub)
            # Durable before anything is written: after a power cut, the next open must know
            # the shutdown was not clean.
            (self.path / "abort").touch()
            durability.fsync_dir(self.path)
            self._write_in_place()
        # A read-only view of a store a writer on another host appends to looks for a file its
        # listing lacks in the directory listed again, for up to visibilityWaitMs
        # (rocketstore.pipeline.segments); None: this host's listing is the directory.
        self._listing_wait: int | None = None
        if self.read_only and visibility.is_shared(self.path, cfg.shared_storage):
            self._listing_wait = cfg.visibility_wait_ms
            self._forget_cached_tails()
        self.mappings = MappingCache(cfg.max_mapped_files)
        # Where reading a hole through a mapping allocates (tmpfs), files get every block when
        # created, so that no reader can die of SIGBUS on a full disk (rocketstore.pipeline.filesystem).
        whole = not self.read_only and filesystem.reads_allocate(self.path)
        self._cq_ahead = WHOLE if whole else consumequeue.RESERVE_AHEAD
        self.shared = visibility.is_shared(self.path, cfg.shared_storage)
        # The writer before may be alive on the other side of a partition, with dirty pages of
        # the derived files it had mapped: they get new inodes, which its late write-back
        # cannot reach, before anything here reads them (rocketstore.pipeline.renewal).
        renewed = 0
        if not self.read_only and self.shared and self.abort_file_found:
            # A writer on this host whose write-back failed (its host cut off from the
            # servers) left those pages clean in this host's cache with bytes the servers never
            # got: recovery and the renewal must read the files from the servers.
            self._forget_cached_tails()
            renewed = renewal.renew_derived(
                self.path,
                cfg.mapped_file_size_consume_queue,
                FlushProgress.read(self.path / "config"),
            )
        self.checkpoint = StoreCheckpoint.read(self.path / "checkpoint")
        self.commitlog = CommitLog(
            SegmentQueue(
                self.path / "commitlog",
                cfg.mapped_file_size_commitlog,
                read_only=self.read_only,
                cache=self.mappings,
                ahead=WHOLE if whole else mapped_file.RESERVE_AHEAD,
                visibility_wait_ms=self._listing_wait,
            )
        )
        self.commitlog.load()
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._progress = FlushProgress.read(self.path / "config")
        lengths = self._progress.queues if self._progress is not None else {}
        self._notes: dict[str, list[int]] = (
            dict(self._progress.notes) if self._progress is not None else {}
        )
        cq_root = self.path / "consumequeue"
        if cq_root.is_dir():
            for topic_dir in sorted(cq_root.iterdir()):
                if not topic_dir.is_dir():
                    continue
                for qdir in sorted(topic_dir.iterdir()):
                    if qdir.is_dir() and qdir.name.isdigit():
                        length = lengths.get(f"{topic_dir.name}/{qdir.name}")
                        self._queue(topic_dir.name, int(qdir.name)).load(length)
        self.index: IndexService | None = None
        if cfg.message_index_enable:
            self.index = IndexService(
                self.path / "index",
                cfg.max_hash_slot_num,
                cfg.max_index_num,
                read_only=self.read_only,
                clock_ms=self.clock_ms,
                cache=self.mappings,
                ahead=WHOLE if whole else indexfile.RESERVE_AHEAD,
            )
            self.index.load()
        # On shared storage a writer fences off those before it (rocketstore.pipeline.fencing); every
        # writable open honours the dead regions earlier take-overs left.
        self._fence: fencing.Fence | None = None
        self.recovery = self._recover()
        self.recovery.files_renewed = renewed
        if not self.read_only and self.shared:
            self._take_epoch()
        if not self.read_only:
            # Every writer of a directory stamps the directory's store host (rocketstore.pipeline.storehost).
            newest = storehost.newest_record_host(
                self.commitlog, self.queues.values(), self.recovery.last_record_offset
            )
            self.config = cfg = storehost.for_directory(cfg, newest)
        self._store_host_field = record.encode_host(cfg.store_host)[0]
        self._store_host_hex = self._store_host_field.hex().upper()
        self._sync_flush = cfg.sync_flush
        self._flush_every_s = cfg.flush_interval_commitlog / 1000
        # On shared storage readers see only what a flush published (rocketstore.pipeline.visibility);
        # under SYNC_FLUSH a put publishes before it returns, so what it acknowledges is
        # readable from every host.
        self._publish_each_put = self._sync_flush and self.shared
        if self.read_only and self.shared:
            self._hide_unpublished()
        self._single = native.SinglePut(
            self._store_host_field,
            cfg.max_message_size,
            cfg.mapped_file_size_commitlog,
            cfg.max_hash_slot_num,
            cfg.max_index_num,
        )
        self._uniq = encode.UniqKeyGenerator()
        # (offset, store time) of the newest record this process wrote: what the progress file
        # names as the last flushed record.
        self._last_record: tuple[int, int] | None = None
        last = self.recovery.last_record_offset
        if last >= 0:
            self._last_record = (last, self.commitlog.store_timestamp(last, record.FIXED_SIZE_V4))
        # Everything before this offset is in the CommitLog and dispatched to the ConsumeQueues
        # and the index: the durable dispatch point a flush records.
        self._dispatched_end = self.commitlog.max_offset
        self._flushed_end = -1 if self.recovery.records_redispatched else self._dispatched_end
        self._flushed_at = time.monotonic()

    def _forget_cached_tails(self) -> None:
        """Drop this host's cached pages of the files a writer appends to (the last CommitLog
        segments, each queue's and the index's last files), so that a read-only view, or a
        writer taking over after an unclean end, reads them from the file system, not as this
        host saw them before (rocketstore.pipeline.visibility)."""
        with contextlib.suppress(OSError):
            os.listdir(self.path)  # refreshes the client's attributes of the checkpoint
        dirs = [self.path / "commitlog", self.path / "index"]
        with contextlib.suppress(OSError):
            for topic in (self.path / "consumequeue").iterdir():
                with contextlib.suppress(OSError):
                    dirs.extend(q for q in topic.iterdir() if q.name.isdigit())
        for directory in dirs:
            with contextlib.suppress(OSError):
                for path in sorted(directory.iterdir())[-2:]:
                    visibility.drop_cached(path)

    def _hide_unpublished(self) -> None:
        """A read-only view of a store on shared storage ends at what its writer published
        and this host can read (rocketstore.pipeline.visibility): the log at the published offset or the
        last record that checked out here, whichever is first; each queue at its published
        length or its last unit whose record is in that log, whichever is first."""
        point = visibility.published(self.path)
        if point is None:
            return  # nothing published (RocketMQ wrote the store): as on one host
        end = min(self.commitlog.max_offset, max(point.commitlog_end, self.commitlog.min_offset))
        self.commitlog.set_end(end)
        for (topic, queue_id), cq in self.queues.items():
            cq.hide_from(min(point.queue_length(topic, queue_id), cq.first_past(end)))
        self._next_queue_offset = {key: cq.max_offset for key, cq in self.queues.items()}

    def _take_epoch(self) -> None:
        """Record this writer's epoch (rocketstore.pipeline.fencing). After an unclean take-over (``abort``
        found: the last holder never closed, and on shared storage may still be alive) the log
        goes on in a fresh segment, so that anything the old holder still writes lands in the
        dead region before it."""
        assert self._lock is not None
        end = self.commitlog.max_offset
        start = self.commitlog.fence_off() if self.abort_file_found else end
        self._fence = fencing.Fence.take(self.path, self._lock, end, start, self.clock_ms())

    def _check_fence(self, what: str) -> None:
        """Refuse a write of a writer that no longer owns the store (rocketstore.pipeline.fencing)."""
        if self._fence is None:
            return
        try:
            self._fence.check(what)
        except FencedError as exc:
            self._failure = self._failure or exc
            raise

    def _recover(self) -> RecoveryReport:
        epochs = fencing.read_epochs(self.path)
        # After an unclean take-over the writer fenced off may have had pages of the
        # ConsumeQueues and the index on their way. The derived files it could reach got new
        # inodes (rocketstore.pipeline.renewal); a full recovery (`rocketstore recover`) still
        # checks every unit and builds the index anew from the log, whatever arrived.
        suspect = self.full_check and bool(epochs) and epochs[-1].dead is not None
        report = recover(
            dead=fencing.dead_regions(epochs),
            rebuild_index=suspect,
            log=self.commitlog,
            queues=self.queues,
            index=self.index,
            checkpoint=self.checkpoint,
            progress=self._progress,
            abnormal=self.abort_file_found,
            read_only=self.read_only,
            check_crc=self.config.check_crc_on_recover,
            queue_factory=self._queue,
            full_check=self.full_check,
            cut_at_damage=self.cut_at_damage,
        )
        self._next_queue_offset = {key: cq.max_offset for key, cq in self.queues.items()}
        return report

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
            # After a failed put the files still flush, but the progress file keeps naming the
            # last point every derived file reached, so recovery redoes the failed put's tail.
            end = self._dispatched_end
            if end == self._flushed_end and not force and self._unrecorded is None:
                return
            # An msync or write that failed may have lost pages the page cache held, so nothing
            # after it can be vouched for: stop writing, as after a failed put.
            # The pages go out before the fence is checked: they were written while this
            # writer owned the store, and pushing them out is what rids this host of them. Cut
            # off, the msync fails and leaves them clean; left dirty, they would reach the
            # servers whenever the kernel wrote them back, perhaps after the heal, over files
            # another writer has taken over (rocketstore.pipeline.fencing).
            try:
                with self._fail_stop("flush"):
                    self._flush_files()
            except StoreFailedError:
                # A writer that lost the store finds the files it mapped replaced, and their
                # sync fails (rocketstore.pipeline.renewal): say that it was fenced, rather
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
                self._record_progress(end)
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
                self._update_topics()

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
            # files that a writer elsewhere has taken over meanwhile (rocketstore.pipeline.fencing).
            for derived in [*self.queues.values(), self.index]:
                with contextlib.suppress(Exception):
                    if derived is not None:
                        derived.flush()
            raise
        for cq in self.queues.values():
            cq.flush()
        if self.index is not None:
            self.index.flush()

    def _record_progress(self, end: int) -> None:
        """Write the progress file, then the checkpoint. Each is replaced whole or not at all,
        so a failure leaves both naming an earlier point that is still true."""
        if self._last_record is not None:
            failpoints.hit("progress-write")
            last_offset, last_ts = self._last_record
            lengths = {f"{t}/{q}": cq.max_offset for (t, q), cq in self.queues.items()}
            FlushProgress(end, last_offset, last_ts, lengths, dict(self._notes)).write(
                self.path / "config"
            )
        failpoints.hit("checkpoint-write")
        self._write_checkpoint()

    def _update_topics(self) -> None:
        """Name every topic and queue count in ``config/topics.json`` (rocketstore.pipeline.topicconfig),
        after the data it describes is flushed. A file that cannot be written or read is
        logged, not raised: the data is whole, only a broker would not see the new topics, and
        the next flush tries again (``rocketstore topics`` shows what a broker would see)."""
        try:
            self._topics.update(self.queues)
        except (OSError, TopicConfigError) as exc:
            text = str(exc)
            if text != self._topics_error:
                _log.warning("%s: config/topics.json not updated: %s", self.path, text)
            self._topics_error = text
        else:
            self._topics_error = None

    MAX_NOTES = 64

    def note(self, name: str) -> list[int] | None:
        """The note ``name`` as last set, or as the progress file had it at open."""
        with self._mutex:
            got = self._notes.get(name)
            return list(got) if got is not None else None

    def set_note(self, name: str, value: list[int]) -> None:
        """Keep a small fact with the store (see :mod:`rocketstore.pipeline.progress`): written by the next
        flush that records progress, so it becomes durable with the data written before that
        flush, never before it. At most :attr:`MAX_NOTES` are kept; the least recently set go.
        A crash before that flush loses the change, so a note must only ever be a safe hint."""
        self._check_open(write=True)
        with self._mutex:
            self._notes.pop(name, None)
            self._notes[name] = [int(x) for x in value]
            while len(self._notes) > self.MAX_NOTES:
                del self._notes[next(iter(self._notes))]

    def writer_lock(self) -> threading.RLock:
        """The lock every write takes (puts, flushes, retention); hold it to run maintenance
        that must not interleave with them."""
        return self._mutex

    def clean(self) -> None:
        """One retention round (expired files, disk pressure, the disk-full check) under the
        store's lock. Run by the cleaner thread every 10 s; ``rocketstore clean`` runs
        :class:`~rocketstore.pipeline.retention.RetentionService` directly for a manual clean."""
        if self.retention is None:
            return
        with self._mutex:
            if not self._closed:
                self._check_fence("retention")
                self.retention.run()

    def _write_checkpoint(self) -> None:
        last_ts = self._last_record[1] if self._last_record else self._last_store_timestamp()
        if last_ts > 0:
            self.checkpoint.physic_msg_timestamp = last_ts
            self.checkpoint.logics_msg_timestamp = last_ts
        if self.index is not None and self.index.end_timestamp > 0:
            self.checkpoint.index_msg_timestamp = self.index.end_timestamp
        self.checkpoint.write(self.path / "checkpoint", sync=True)

    def _last_store_timestamp(self) -> int:
        best = 0
        for cq in self.queues.values():
            if cq.max_offset > cq.min_offset:
                u = cq.read(cq.max_offset - 1, 1)[0]
                best = max(best, self.commitlog.store_timestamp(int(u["offset"]), int(u["size"])))
        return best

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
                for cq in self.queues.values():
                    step(cq.close)
                if self.index is not None:
                    step(self.index.close)
                if self._fence is not None:
                    step(self._fence.close)
                if not self.read_only and clean and self._failure is None:
                    step(functools.partial(durability.remove, self.path / "abort"))
        finally:
            if self._lock is not None:
                step(self._lock.release)
        if errors:
            for later in errors[1:]:
                errors[0].add_note(f"also while closing {self.path}: {later!r}")
            raise errors[0]

    # -- writing ----------------------------------------------------------------------------
    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(
                self.path / "consumequeue",
                topic,
                queue_id,
                self.config.mapped_file_size_consume_queue,
                read_only=self.read_only,
                cache=self.mappings,
                ahead=self._cq_ahead,
                visibility_wait_ms=self._listing_wait,
            )
            self.queues[(topic, queue_id)] = cq
        return cq

    def put(self, message: Message) -> PutResult:
        """Store one message.

        A plain message (no transaction bits, born host or reserved property names) that fits
        the current CommitLog segment, ConsumeQueue file and index file takes a path that
        builds no Arrow table; anything else is put as a batch of one. Both write the same
        bytes and give the same result, errors included.
        """
        self._check_open(write=True)
        with self._mutex:
            if self._flusher is not None:
                self._flusher.raise_if_failed()
            if self._fence is not None:  # tested here: the single put's path is short
                self._check_fence("put of 1 message")
            if self.retention is not None:
                self.retention.check_put()
            now = self.clock_ms()
            done = self._put_one(message, now)
            if done is not None:
                return done
            return next(self._put_batch([message], now).results())

    def _put_one(self, m: Message, now: int) -> PutResult | None:
        """The single-put path, or None (nothing done) when ``m`` needs the batch path.

        The message's validation, its record, ConsumeQueue unit and index entries are one
        native call (:class:`rocketstore.pipeline._native.SinglePut`); Python finds where they go and takes
        note of what was written. Under SYNC_FLUSH, or with a failpoint armed, the call stops
        between its write steps to flush the CommitLog and to hit the failpoints, in the same
        order as the batch path."""
        topic, qid = m.topic, m.queue_id
        if type(topic) is not str or type(qid) is not int:
            return None
        key = (topic, qid)
        cq = self.queues.get(key)
        if cq is None:
            return None
        queue_offset = self._next_queue_offset.get(key, 0)
        unit_file = cq.tail_for(queue_offset)
        if unit_file is None:
            return None
        mf = self.commitlog.segments.last
        if mf is None or not mf.wrote_position:
            return None  # a new store, or one whose last segment is still empty
        rel = mf.wrote_position
        pos = mf.base + rel
        index_file = None
        at: tuple[memoryview | None, int, int, int, int] = _NO_INDEX
        if self.index is not None:
            if not self.index.files:
                return None
            index_file = self.index.files[-1]
        # Blocks for what this put writes (see _prepare), a window at a time: a record of up
        # to SINGLE_RESERVE bytes, one unit and, since each KEYS token is at least one
        # character, at most 1 + len(keys) index entries. A longer record is left to the
        # batch path, which reserves what it needs.
        keys = m.keys
        try:
            mf.reserve(rel + SINGLE_RESERVE)
            unit_file.reserve(unit_file.wrote_position + CQ_UNIT_SIZE)
            if index_file is not None:
                index_file.reserve(1 + (len(keys) if keys else 0))
        except SegmentCreateError as exc:
            raise SegmentCreateError(f"{exc}; the put of 1 message wrote nothing") from exc
        if index_file is not None:
            at = (
                index_file.mapping,
                index_file.index_count,
                index_file.begin_timestamp,
                index_file.begin_phy_offset,
                index_file.hash_slot_count,
            )
        uniq = m.uniq_key or self._uniq.next_id(now)
        hook = (
            functools.partial(self._single_step, mf, rel)
            if self._sync_flush or failpoints.armed()
            else None
        )
        try:
            # The record's view ends where the reserved blocks do: a record that does not fit
            # is left to the batch path, whose prepare step reserves what it needs.
            done = self._single.put(
                m, uniq, now, mf.buffer[: mf.allocated], rel, pos, unit_file.buffer,
                unit_file.wrote_position, queue_offset, *at, hook,
            )  # fmt: skip
        except BaseException as exc:
            self._stop_writes(f"put of 1 message at CommitLog offset {pos}", exc)
        if done is None:
            return None
        size, entries, new_slots = done
        mf.wrote_position = rel + size
        cq.appended_one(unit_file, pos + size)
        if index_file is not None:
            index_file.took_entries(entries, new_slots, pos, now)
        self._next_queue_offset[key] = queue_offset + 1
        self._dispatched_end = pos + size
        self._last_record = (pos, now)
        if self._publish_each_put or time.monotonic() - self._flushed_at >= self._flush_every_s:
            self._flush(force=False, quiet=True)
        return PutResult(
            "PUT_OK",
            f"{self._store_host_hex}{pos:016X}",
            pos,
            queue_offset,
            size,
            now,
            uniq,
        )

    def _single_step(self, mf: MappedFile, rel: int, step: str, size: int) -> None:
        """Between the write steps of a single put (see :meth:`_put_one`)."""
        if step == "record-sealed":
            mf.wrote_position = rel + size
            if self._sync_flush:
                failpoints.hit("flush")
                self.commitlog.flush()
        else:
            failpoints.hit(step)

    def put_batch(self, batch: pa.Table | pa.RecordBatch | Sequence[Message]) -> BatchPutResult:
        """Store a batch of messages (see :mod:`rocketstore.pipeline.message` for the columns).

        Validates everything first; on :class:`InvalidMessageError` nothing is written.
        """
        self._check_open(write=True)
        with self._mutex:
            return self._put_batch(batch)

    def _put_batch(
        self, batch: pa.Table | pa.RecordBatch | Sequence[Message], now: int | None = None
    ) -> BatchPutResult:
        if self._flusher is not None:
            self._flusher.raise_if_failed()
        self._check_fence("put")
        if self.retention is not None:
            # Refused before anything is encoded or written; the cached verdict of the last
            # disk check, so the put path never measures the disk itself.
            self.retention.check_put()
        now = self.clock_ms() if now is None else now
        b = encode.prepare(batch, self.config, self._uniq, now)
        if b.n == 0:
            return BatchPutResult(
                np.zeros(0, np.int64),
                np.zeros(0, np.int64),
                np.zeros(0, np.int64),
                now,
                pa.array([], pa.string()),
                self._store_host_field,
                False,
            )
        queue_offsets, next_offsets, groups = self._assign_queue_offsets(b)
        phys, blanks = self.commitlog.plan(b.sizes)
        self._prepare(b, phys, queue_offsets, groups)
        with self._fail_stop(f"put of {b.n} message(s) at CommitLog offset {int(phys[0])}"):
            self._write_records(b, phys, blanks, queue_offsets, now)
            if self._sync_flush:
                failpoints.hit("flush")
                self.commitlog.flush()
            dispatch.apply(
                dispatch.from_prepared(b, phys, queue_offsets, now, groups),
                self._queue,
                self.index,
            )
        self._next_queue_offset.update(next_offsets)
        self._dispatched_end = int(phys[-1] + b.sizes[-1])
        self._last_record = (int(phys[-1]), now)
        if self._publish_each_put or time.monotonic() - self._flushed_at >= self._flush_every_s:
            # Back-to-back puts can keep the flusher thread from the lock; flushing here when
            # it is due bounds how much a crash makes recovery re-scan.
            self._flush(force=False, quiet=True)
        return BatchPutResult(
            phys,
            queue_offsets,
            b.sizes,
            now,
            b.uniq_keys,
            self._store_host_field,
            self._sync_flush,
        )

    def _prepare(
        self,
        b: encode.PreparedBatch,
        phys: npt.NDArray[np.int64],
        queue_offsets: npt.NDArray[np.int64],
        groups: list[npt.NDArray[np.int64]],
    ) -> None:
        """Create every file the batch will write (CommitLog segments, ConsumeQueue files,
        IndexFiles) and reserve the blocks its bytes will land in, before the first byte of the
        CommitLog: a full disk or a missing descriptor fails here, as
        :class:`SegmentCreateError`, with nothing written and the store usable. Past this point
        no write touches a page without a block, so none can die of SIGBUS."""
        try:
            self.commitlog.prepare_segments(int(phys[0]), int(phys[-1] + b.sizes[-1]))
            for part in groups:
                first = int(part[0])
                cq = self._queue(b.topics[int(b.topic_codes[first])], int(b.queue_ids[first]))
                cq.prepare(int(queue_offsets[first]), len(part))
            if self.index is not None:
                self.index.prepare(len(b.key_hashes))
        except SegmentCreateError as exc:
            raise SegmentCreateError(
                f"{exc}; nothing of the put of {b.n} message(s) was written"
            ) from exc
        except OSError as exc:
            where = exc.filename or self.path
            raise SegmentCreateError(
                f"{where}: cannot create a file for a put of {b.n} message(s): "
                f"{exc.strerror or exc} ({limit_note(exc, self.path)}); nothing was written"
            ) from exc

    def _assign_queue_offsets(
        self, b: encode.PreparedBatch
    ) -> tuple[npt.NDArray[np.int64], dict[tuple[str, int], int], list[npt.NDArray[np.int64]]]:
        """Queue offsets per (topic, queueId) in batch order, 0 for messages that get no
        ConsumeQueue unit (PREPARED / ROLLBACK), which do not consume an offset; each queue's
        next offset once the batch is stored (taken only when the put succeeds); and the rows
        that get units, split by queue, for the dispatch."""
        offsets = np.zeros(b.n, dtype=np.int64)
        next_offsets: dict[tuple[str, int], int] = {}
        rows = np.flatnonzero(dispatch.consume_queue_mask(b.sys_flags))
        groups = dispatch.group_rows(b.topic_codes, b.queue_ids, rows)
        for part in groups:
            first = int(part[0])
            key = (b.topics[int(b.topic_codes[first])], int(b.queue_ids[first]))
            base = self._next_queue_offset.get(key, 0)
            offsets[part] = base + np.arange(len(part), dtype=np.int64)
            next_offsets[key] = base + len(part)
        return offsets, next_offsets, groups

    def _write_records(
        self,
        b: encode.PreparedBatch,
        phys: npt.NDArray[np.int64],
        blanks: list[int],
        queue_offsets: npt.NDArray[np.int64],
        now: int,
    ) -> None:
        """Encode the batch straight into the CommitLog's mapped segments, one run of records
        per segment, with the END_OF_FILE blanks between them."""
        segment_of = phys // self.config.mapped_file_size_commitlog
        bounds = np.flatnonzero(segment_of[1:] != segment_of[:-1]) + 1
        blank_iter = iter(blanks)
        next_blank = next(blank_iter, None)
        for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), b.n], strict=True):
            while next_blank is not None and next_blank < int(phys[lo]):
                self.commitlog.write_blank(next_blank)
                next_blank = next(blank_iter, None)
            failpoints.hit("commitlog-write")
            self.commitlog.write_encoded(b.encoder, lo, hi, phys, queue_offsets, b.sizes, now)

    # -- reading ----------------------------------------------------------------------------
    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.queues})

    def queue_infos(self, topic: str | None = None) -> list[QueueInfo]:
        with self._mutex:
            self._check_open()
            return [
                QueueInfo(t, q, cq.min_offset, cq.max_offset, cq.max_physic_offset)
                for (t, q), cq in sorted(self.queues.items())
                if topic is None or t == topic
            ]

    def min_offset(self, topic: str, queue_id: int) -> int:
        with self._mutex:
            cq = self.queues.get((topic, queue_id))
            return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        with self._mutex:
            cq = self.queues.get((topic, queue_id))
            return cq.max_offset if cq else 0

    @property
    def min_phy_offset(self) -> int:
        with self._mutex:
            return self.commitlog.min_offset

    @property
    def max_phy_offset(self) -> int:
        with self._mutex:
            return self.commitlog.max_offset

    def read_units(
        self, topic: str, queue_id: int, offset: int, count: int
    ) -> npt.NDArray[np.void]:
        """Raw ConsumeQueue units ``[offset, offset + count)`` (clipped to the queue)."""
        with self._mutex:
            self._check_open()
            cq = self.queues.get((topic, queue_id))
            if cq is None:
                return np.empty(0, dtype=UNIT_DTYPE)
            return cq.read(offset, count)

    def get_message(self, commit_log_offset: int) -> record.MessageExt:
        """The message at a CommitLog offset (RocketMQ's ``lookMessageByOffset``)."""
        with self._mutex:
            self._check_open()
            return self.commitlog.read(commit_log_offset)

    def get_by_msg_id(self, msg_id: str) -> record.MessageExt:
        """The message an offset msgId names; refuses an id whose host does not match."""
        _, offset = record.parse_msg_id(msg_id)
        msg = self.get_message(offset)
        if msg.msg_id != msg_id.strip().upper():
            raise OffsetOutOfRangeError(
                f"msgId {msg_id}: the message at offset {offset} has id {msg.msg_id}"
            )
        return msg

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        subscription: str | Subscription | None = None,
    ) -> GetResult:
        """Up to ``max_count`` messages from a queue, starting at queue offset ``offset``.

        With a subscription, units are filtered by tag hash first and then by the real tag;
        like RocketMQ, at most ``max(800, max_count)`` units (16000 bytes of ConsumeQueue) are
        scanned per call and
        ``next_begin_offset`` says where to continue.
        """
        with self._mutex:
            return self._get_messages(topic, queue_id, offset, max_count, subscription)

    def _get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        subscription: str | Subscription | None,
    ) -> GetResult:
        self._check_open()
        sub = (
            subscription
            if isinstance(subscription, Subscription)
            else Subscription.parse(subscription)
        )
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            return GetResult("NO_MATCHED_LOGIC_QUEUE", [], 0, 0, 0)
        lo, hi = cq.min_offset, cq.max_offset
        if hi == 0:
            return GetResult("NO_MESSAGE_IN_QUEUE", [], 0, lo, hi)
        if offset < lo:
            return GetResult("OFFSET_TOO_SMALL", [], lo, lo, hi)
        if offset == hi:
            return GetResult("OFFSET_OVERFLOW_ONE", [], offset, lo, hi)
        if offset > hi:
            # RocketMQ sends a consumer that is past the end back to the start when the queue
            # still starts at 0, else to the end.
            return GetResult("OFFSET_OVERFLOW_BADLY", [], lo if lo == 0 else hi, lo, hi)
        budget = max(SCAN_BUDGET_BYTES // CQ_UNIT_SIZE, max_count)
        messages: list[record.MessageExt] = []
        pos = offset
        while pos < hi and len(messages) < max_count and pos - offset < budget:
            units = cq.read(pos, min(1024, budget - (pos - offset)))
            # Units whose record retention already deleted are skipped, as RocketMQ skips them.
            passed = np.flatnonzero(
                sub.hash_filter(units["tags_code"]) & (units["offset"] >= self.commitlog.min_offset)
            )
            stop = len(units)
            # Decoded a call at a time, no more than could still be returned: a tag filter
            # that rejects some of them asks for the next few.
            while len(passed) and stop == len(units):
                need = max_count - len(messages)
                take, passed = passed[:need], passed[need:]
                for i, msg in zip(
                    take.tolist(), self._unit_messages(cq, pos, units, take), strict=True
                ):
                    if sub.matches_tag(msg.tags):
                        messages.append(msg)
                        if len(messages) >= max_count:
                            stop = i + 1
                            break
            pos += stop
        status = "FOUND" if messages else "NO_MATCHED_MESSAGE"
        return GetResult(status, messages, pos, lo, hi)

    def _unit_messages(
        self, cq: ConsumeQueue, first: int, units: npt.NDArray[Any], rows: npt.NDArray[np.intp]
    ) -> list[record.MessageExt]:
        """The messages units ``rows`` (of ``units``, the first at queue offset ``first``)
        point at, each checked to be its unit's: a unit that points elsewhere is reported
        against the ConsumeQueue file, a damaged record against the CommitLog, and neither is
        ever returned."""
        phys = units["offset"][rows].astype(np.int64)
        for row, at in zip(rows.tolist(), phys.tolist(), strict=True):
            if not self.commitlog.starts_record(at):
                path, pos = cq.unit_location(first + row)
                raise CorruptRecordError(
                    path,
                    pos,
                    f"unit {first + row} points at CommitLog offset {at}, where no "
                    f"record of {int(units['size'][row])} bytes starts",
                )
        msgs = self.commitlog.read_many(phys)
        for row, msg in zip(rows.tolist(), msgs, strict=True):
            queue_offset = first + row
            if (msg.topic, msg.queue_id, msg.queue_offset) != (cq.topic, cq.queue_id, queue_offset):
                raise CorruptRecordError(
                    str(self.commitlog.segments.find(msg.commit_log_offset).path),
                    msg.commit_log_offset,
                    f"record says {msg.topic}/{msg.queue_id}/{msg.queue_offset}, but unit "
                    f"{queue_offset} of {cq.topic}/{cq.queue_id} points at it",
                )
        return msgs

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """RocketMQ's ``getOffsetInQueueByTime`` (see :meth:`ConsumeQueue.offset_by_time`)."""
        with self._mutex:
            self._check_open()
            cq = self.queues.get((topic, queue_id))
            if cq is None:
                return 0
            return cq.offset_by_time(
                timestamp, self.commitlog.min_offset, self.commitlog.store_timestamp
            )

    def query_by_key(
        self,
        topic: str,
        key: str,
        *,
        begin: int = 0,
        end: int = MAX_TIMESTAMP,
        max_count: int | None = None,
        min_offset: int = 0,
    ) -> list[record.MessageExt]:
        """Messages of ``topic`` with ``key`` (a KEYS token or the UNIQ_KEY) stored in
        ``[begin, end]``, newest first, at most ``max_count`` (capped by maxMsgsNumBatch).
        ``min_offset`` leaves out records before that CommitLog offset without reading the
        index files that hold only such records.

        Unlike RocketMQ, every candidate is checked against the real message, so a hash
        collision is never returned.
        """
        with self._mutex:
            return self._query_by_key(topic, key, begin, end, max_count, min_offset)

    def _query_by_key(
        self, topic: str, key: str, begin: int, end: int, max_count: int | None, min_offset: int
    ) -> list[record.MessageExt]:
        self._check_open()
        if self.index is None:
            raise InvalidMessageError("messageIndexEnable=false: this store keeps no key index")
        limit = min(max_count or self.config.max_msgs_num_batch, self.config.max_msgs_num_batch)
        found: list[record.MessageExt] = []
        for phys in self.index.candidates(topic, key, begin, end, min_offset):
            if not self.commitlog.starts_record(phys):
                continue  # a damaged index entry, or a record retention deleted: not a match
            msg = self.commitlog.read(phys)
            if (
                msg.topic == topic
                and begin <= msg.store_timestamp <= end
                and (key == msg.uniq_key or key in msg.keys)
                and record.transaction_type(msg.sys_flag) != record.TRANSACTION_ROLLBACK_TYPE
            ):
                found.append(msg)
                if len(found) >= limit:
                    break
        return found
