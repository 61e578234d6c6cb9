"""A broker directory's figures for monitoring, read cheaply from its files: no store opened,
no lock taken, nothing written.

What a scrape of the metrics endpoint (:mod:`rocketstore.pipeline.tools.metrics`) needs, at tens of
thousands of queues, without opening a :class:`~rocketstore.pipeline.engine.store.MessageStore`
(which maps every queue's files):

* **Queue max offsets and the CommitLog's end** come from the flush progress file
  ``config/rocketstore.json`` (:mod:`rocketstore.pipeline.files.progress`): each queue's length
  and the CommitLog's flushed offset at the writer's last flush. One small file, read whole.
  While a writer appends they trail the files by at most a flush interval
  (``flushIntervalCommitLog``, 500 ms by default; on shared storage they are exactly what
  readers may read: :mod:`rocketstore.pipeline.files.visibility`), and once it has closed the
  store they are exact.
* **Queue min offsets** (which retention moves) cost a read per queue (of its file at
  offset 0; a listing when retention deleted that), so they are cached: computed again for every queue when the CommitLog's first
  segment changes (retention deleted one, which is what moves them), for a queue the cache
  has not seen, and otherwise every :attr:`StoreStats.min_offsets_ttl` seconds (60 by
  default) in case a writer rebuilt a queue.
* **A store the progress file does not describe**, because it has none (RocketMQ wrote it)
  or a RocketMQ broker flushed after it was written (its ``checkpoint`` is newer), is opened
  read-only the usual way (:class:`MessageStore`), at most once per
  :attr:`StoreStats.open_ttl` seconds (30 by default), and its bounds are served from that
  (:meth:`StoreStats.forget_open` drops it sooner: the metrics do when a consumer committed
  past it).
* **Everything else** is a few small reads per broker: the CommitLog segment names and sizes,
  the first record's store time, the epochs file (:mod:`rocketstore.pipeline.engine.fencing`),
  ``abort``, the lock probe (:func:`rocketstore.pipeline.files.lock.is_locked_elsewhere`), statvfs.

:func:`unit_offset` reads where a message of a queue is in the CommitLog (its ConsumeQueue
unit) and :func:`record_times` the store times of records by those offsets, each CommitLog
segment opened once per call: the age of a consumer's lag is the store time of the first
stored of the messages it has not consumed (:mod:`rocketstore.pipeline.tools.metrics`).

Thread-safety: a :class:`StoreStats` may be used from several threads (a lock guards its
caches); the figures it returns are immutable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import fencing
from rocketstore.pipeline.engine.retention.policy import statvfs_used_ratio
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import SegmentGoneError, StoreError
from rocketstore.pipeline.files.checkpoint import StoreCheckpoint
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.lock import is_locked_elsewhere
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.files.segmentread import locate, unit_index, unit_position
from rocketstore.pipeline.format import record
from rocketstore.pipeline.layout import CQ_UNIT_SIZE, PRE_BLANK_SIZE, UNIT

QueueId = tuple[str, int]  # (topic, queueId) within one broker
Bounds = dict[QueueId, tuple[int, int]]  # (min offset, max offset)
MIN_OFFSETS_TTL = 60.0
OPEN_TTL = 30.0
UNITS_KEPT = 200_000
# Bytes of a record's header that hold its store timestamp whatever its born host's size.
_HEADER_READ = record.OFF_BORNHOST + 20 + 8


@dataclasses.dataclass(frozen=True)
class Writer:
    """What the files say about the store's writers: ``epoch`` is the newest recorded in
    ``config/rocketstore-epochs`` (``None`` without that file: only writers on shared storage
    record epochs); ``unclean_takeovers`` counts the epochs taken over from a writer that had
    not closed the store (crashed, or fenced off: each left a dead region); ``abort``:
    the file a writer keeps while it has the store open; ``locked``: another process holds
    the store's lock now."""

    epoch: int | None
    unclean_takeovers: int
    abort: bool
    locked: bool


@dataclasses.dataclass(frozen=True)
class BrokerStats:
    """One broker directory's figures (see the module docstring for where each comes from).

    ``source`` is ``progress`` when the bounds come from the progress file, ``open`` when
    from a read-only open (cached for up to :data:`OPEN_TTL` s). Times are ms since the
    epoch, ``None`` when unknown; ``last_flush`` is the progress file's modification time."""

    name: str
    path: Path
    source: str
    bounds: Bounds
    commitlog_min: int
    commitlog_end: int
    commitlog_files: int
    commitlog_bytes: int
    oldest_ms: int | None
    newest_ms: int | None
    last_flush_ms: int | None
    writer: Writer
    disk_used_ratio: float
    disk_total_bytes: int
    disk_free_bytes: int
    read_at: float


def _header_time(head: bytes) -> int | None:
    """The store time of the record whose header ``head`` starts with, ``None`` when it is
    not a record's header (a blank, a file cut short)."""
    if len(head) == _HEADER_READ:
        size, magic = record.SIZE_MAGIC.unpack_from(head, 0)
        if magic == record.MAGIC and size >= record.FIXED_SIZE_V4:
            return record.store_timestamp_at(head, 0)
    return None


def _record_time(log: LocalSegments, base: int) -> int | None:
    """The store time of the record at the start of the CommitLog segment at ``base``,
    ``None`` when no record starts there (or the segment is gone)."""
    with contextlib.suppress(StoreError, OSError):
        return _header_time(log.read(base, 0, _HEADER_READ))
    return None


def record_times(broker: Path, config: StoreConfig, offsets: Iterable[int]) -> dict[int, int]:
    """The store times (ms) of the records at the CommitLog ``offsets`` of a broker
    directory, each segment opened once however many of them it holds. An offset with no
    record (deleted by retention, not written) is left out."""
    size = config.mapped_file_size_commitlog
    by_segment: dict[int, list[tuple[int, int]]] = {}
    for phys in offsets:
        base, position = locate(phys, size)
        by_segment.setdefault(base, []).append((phys, position))
    out: dict[int, int] = {}
    log = LocalSegments(os.path.join(broker, "commitlog"), segment_size=size)
    for base, wanted in by_segment.items():
        try:
            seg = log.open(base)
        except (StoreError, OSError):
            continue
        try:
            for phys, position in wanted:
                with contextlib.suppress(StoreError, OSError):
                    at = _header_time(seg.read(position, min(_HEADER_READ, size - position)))
                    if at is not None:
                        out[phys] = at
        finally:
            seg.close()
    return out


def unit_offset(queue_dir: str, config: StoreConfig, offset: int) -> int | None:
    """The CommitLog offset of message ``offset`` of the queue whose ConsumeQueue files are in
    ``queue_dir`` (one read of its unit); ``None`` when the unit is not there (not written yet,
    deleted by retention) or holds no message."""
    cq_size = config.mapped_file_size_consume_queue
    base, position = unit_position(offset, cq_size)
    try:
        raw = LocalSegments(queue_dir).read(base, position, CQ_UNIT_SIZE)
    except (StoreError, OSError):
        return None
    phys, size, _ = UNIT.unpack(raw)
    if phys < 0 or size <= 0 or size == PRE_BLANK_SIZE:
        return None
    return int(phys)


def _first_unit_min(queue_dir: str, commitlog_min: int) -> int | None:
    """A queue's min offset when its first unit points at a live record (the usual case: one
    read, of the file at offset 0 when there is one, else of the first a listing finds);
    ``None`` when that does not settle it (after retention, a pre-blank)."""
    files = LocalSegments(queue_dir)
    base = 0
    try:
        try:
            raw = files.read(0, 0, CQ_UNIT_SIZE)
        except SegmentGoneError:
            first = files.first()
            if first is None:
                return 0
            base = first
            raw = files.read(base, 0, CQ_UNIT_SIZE)
    except (StoreError, OSError):
        return None
    phys, size, _ = UNIT.unpack(raw)
    if phys >= commitlog_min and 0 < size != PRE_BLANK_SIZE:
        return unit_index(base, 0)
    return None


def queue_dir(broker: Path, topic: str, queue_id: int) -> str:
    """The directory of a queue's ConsumeQueue files, as a string: a scrape names tens of
    thousands of them, and joining strings costs a tenth of building paths."""
    return f"{os.fspath(broker)}/consumequeue/{topic}/{queue_id}"


def queue_min_offset(
    broker: Path, config: StoreConfig, topic: str, queue_id: int, length: int, commitlog_min: int
) -> int:
    """The min offset a read-only open gives a queue of ``length`` units: the first unit
    whose record the CommitLog still holds (RocketMQ's ``correctMinOffset``)."""
    found = _first_unit_min(queue_dir(broker, topic, queue_id), commitlog_min)
    if found is not None:
        return found
    cq = ConsumeQueue(
        broker / "consumequeue",
        topic,
        queue_id,
        config.mapped_file_size_consume_queue,
        read_only=True,
    )
    try:
        cq.load(length)
        cq.correct_min_offset(commitlog_min)
        return cq.min_offset
    finally:
        cq.close()


def read_writer(broker: Path) -> Writer:
    epochs = fencing.read_epochs(broker)
    return Writer(
        epochs[-1].epoch if epochs else None,
        sum(1 for e in epochs if e.dead is not None),
        (broker / "abort").exists(),
        is_locked_elsewhere(broker),
    )


def _progress(broker: Path) -> FlushProgress | None:
    config = broker / "config"
    # On a shared file system listing the directory refreshes the client's entry of a file
    # the writer replaces by a rename (rocketstore.pipeline.files.visibility).
    with contextlib.suppress(OSError):
        os.listdir(config)
    return FlushProgress.read(config)


def _described(broker: Path, progress: FlushProgress | None) -> bool:
    """Whether the progress file describes the store: there, and no RocketMQ broker has
    flushed records after it (the ``checkpoint`` a broker writes would be newer)."""
    if progress is None:
        return False
    try:
        checkpoint = StoreCheckpoint.read(broker / "checkpoint")
    except (StoreError, OSError):
        return True
    return checkpoint.physic_msg_timestamp <= progress.store_timestamp


@dataclasses.dataclass
class _MinOffsets:
    commitlog_min: int
    computed_at: float
    values: dict[QueueId, int]


class StoreStats:
    """The brokers' figures with their caches (see the module docstring). ``clock`` is
    monotonic seconds (tests move it)."""

    def __init__(
        self,
        config: StoreConfig,
        *,
        min_offsets_ttl: float = MIN_OFFSETS_TTL,
        open_ttl: float = OPEN_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.min_offsets_ttl = min_offsets_ttl
        self.open_ttl = open_ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._mins: dict[Path, _MinOffsets] = {}
        self._opened: dict[Path, tuple[float, Bounds, int]] = {}
        self._units: OrderedDict[tuple[str, str, int, int], int] = OrderedDict()

    def broker(self, name: str, path: Path) -> BrokerStats:
        """The figures of the broker directory ``path``; :class:`StoreError` or ``OSError``
        when it cannot be read."""
        log = LocalSegments(path / "commitlog")
        segments = log.listed()
        commitlog_min = segments[0] if segments else 0
        progress = _progress(path)
        if _described(path, progress):
            assert progress is not None
            source = "progress"
            end = progress.flushed_offset
            bounds = self._bounds_from(path, progress, commitlog_min)
            newest: int | None = progress.store_timestamp
        else:
            source = "open"
            bounds, end = self._bounds_opened(path)
            newest = None
        oldest = _record_time(log, segments[0]) if segments else None
        # Files retention deleted since the listing count nothing.
        sizes = sum(max(0, log.size_of(base)) for base in segments)
        try:
            flushed = (path / "config" / "rocketstore.json").stat().st_mtime_ns // 1_000_000
        except OSError:
            flushed = None
        st = os.statvfs(path)
        return BrokerStats(
            name,
            path,
            source,
            bounds,
            commitlog_min,
            end,
            len(segments),
            sizes,
            oldest,
            newest,
            flushed,
            read_writer(path),
            statvfs_used_ratio(path),
            st.f_blocks * st.f_frsize,
            st.f_bavail * st.f_frsize,
            self.clock(),
        )

    def _bounds_from(self, path: Path, progress: FlushProgress, commitlog_min: int) -> Bounds:
        now = self.clock()
        with self._lock:
            mins = self._mins.get(path)
            if (
                mins is None
                or mins.commitlog_min != commitlog_min
                or now - mins.computed_at > self.min_offsets_ttl
            ):
                mins = self._mins[path] = _MinOffsets(commitlog_min, now, {})
            known = mins.values
        bounds: Bounds = {}
        for name, length in progress.queues.items():
            topic, _, qid = name.rpartition("/")
            key = (topic, int(qid))
            low = known.get(key)
            if low is None:
                low = queue_min_offset(path, self.config, topic, key[1], length, commitlog_min)
                known[key] = low
            bounds[key] = (min(low, length), length)
        return bounds

    def _bounds_opened(self, path: Path) -> tuple[Bounds, int]:
        now = self.clock()
        with self._lock:
            cached = self._opened.get(path)
        if cached is not None and now - cached[0] <= self.open_ttl:
            return cached[1], cached[2]
        with MessageStore(path, self.config, read_only=True) as store:
            bounds = {
                (i.topic, i.queue_id): (i.min_offset, i.max_offset) for i in store.queue_infos()
            }
            end = store.max_phy_offset
        with self._lock:
            self._opened[path] = (now, bounds, end)
        return bounds, end

    def forget_open(self, path: Path) -> None:
        """Drop the cached open of ``path``: the next :meth:`broker` opens it again."""
        with self._lock:
            self._opened.pop(path, None)

    def unit_offset(self, path: Path, topic: str, queue_id: int, offset: int) -> int | None:
        """:func:`unit_offset` of a queue of the broker directory ``path``, remembered for the
        :data:`UNITS_KEPT` most recently asked (a unit, once written, does not change)."""
        key = (os.fspath(path), topic, queue_id, offset)  # a str compares faster than a Path
        with self._lock:
            found = self._units.get(key)
            if found is not None:
                self._units.move_to_end(key)
                return found
        value = unit_offset(queue_dir(path, topic, queue_id), self.config, offset)
        if value is not None:
            with self._lock:
                self._units[key] = value
                while len(self._units) > UNITS_KEPT:
                    self._units.popitem(last=False)
        return value

    def record_times(self, path: Path, offsets: Iterable[int]) -> dict[int, int]:
        """:func:`record_times` of the broker directory ``path``."""
        return record_times(path, self.config, offsets)
