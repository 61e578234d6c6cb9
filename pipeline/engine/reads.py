"""Messages out of a store's files: :class:`StoreReads`, the read face of
:class:`~rocketstore.pipeline.engine.store.MessageStore` (RocketMQ's ``DefaultMessageStore`` read
calls), and the pull and key look-up it runs.

Every read takes the store's lock and checks the store is open, so none runs in the middle of
a put, a flush or a retention round. Reads write nothing; a unit, index entry or record that
does not check out is reported (ConsumeQueue, CommitLog) or passed over (index), never
returned as a message.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Collection
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.results import GetResult, QueueEnds, QueueInfo
from rocketstore.pipeline.errors import (
    CorruptRecordError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    SegmentGoneError,
)
from rocketstore.pipeline.files.commitlog import CommitLog
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue
from rocketstore.pipeline.files.indexservice import IndexService
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.subscription import Subscription
from rocketstore.pipeline.layout import CQ_UNIT_SIZE, UNIT_DTYPE

MAX_TIMESTAMP = 2**63 - 1
SCAN_BUDGET_BYTES = 16000  # RocketMQ's floor on ConsumeQueue bytes one filtered pull scans


def past_retention(log: CommitLog, *queues: ConsumeQueue | None) -> bool:
    """A read-only view met a file that retention deleted after the view listed it: forget
    the files gone at the head of the log and of ``queues``, so that a read done again finds
    what they held below the min offsets, as if they had gone before the view opened (a
    RocketMQ consumer skips a message whose file was removed the same way). Returns whether
    anything was forgotten (nothing: the error stands)."""
    forgot = log.segments.forget_deleted_head()
    for cq in queues:
        forgot = (cq is not None and cq.forget_deleted_head()) or forgot
    return forgot


Call = TypeVar("Call", bound=Callable[..., Any])


def _past_retention(method: Call) -> Call:
    """A read call of a read-only view, done again when retention deleted a file the view had
    listed (see :func:`past_retention`); each try forgets at least one file or the error
    stands, so it ends."""

    @functools.wraps(method)
    def read(self: StoreReads, *args: Any, **kwargs: Any) -> Any:
        while True:
            try:
                return method(self, *args, **kwargs)
            except SegmentGoneError:
                with self._mutex:
                    loaded = [cq for cq in self.queues.values() if cq.loaded]
                    if not self.read_only or not past_retention(self.commitlog, *loaded):
                        raise

    return cast(Call, read)


def pull(
    log: CommitLog, cq: ConsumeQueue | None, offset: int, max_count: int, sub: Subscription
) -> GetResult:
    """Up to ``max_count`` messages of ``cq`` from queue offset ``offset`` that ``sub`` takes
    (see :meth:`~rocketstore.pipeline.engine.store.MessageStore.get_messages`)."""
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
            sub.hash_filter(units["tags_code"]) & (units["offset"] >= log.min_offset)
        )
        stop = len(units)
        # Decoded a call at a time, no more than could still be returned: a tag filter
        # that rejects some of them asks for the next few.
        while len(passed) and stop == len(units):
            need = max_count - len(messages)
            take, passed = passed[:need], passed[need:]
            for i, msg in zip(take.tolist(), unit_messages(log, cq, pos, units, take), strict=True):
                if sub.matches_tag(msg.tags):
                    messages.append(msg)
                    if len(messages) >= max_count:
                        stop = i + 1
                        break
        pos += stop
    status = "FOUND" if messages else "NO_MATCHED_MESSAGE"
    return GetResult(status, messages, pos, lo, hi)


def unit_messages(
    log: CommitLog,
    cq: ConsumeQueue,
    first: int,
    units: npt.NDArray[Any],
    rows: npt.NDArray[np.intp],
) -> list[record.MessageExt]:
    """The messages units ``rows`` (of ``units``, the first at queue offset ``first``)
    point at, each checked to be its unit's: a unit that points elsewhere is reported
    against the ConsumeQueue file, a damaged record against the CommitLog, and neither is
    ever returned."""
    phys = units["offset"][rows].astype(np.int64)
    for row, at in zip(rows.tolist(), phys.tolist(), strict=True):
        if not log.starts_record(at):
            path, pos = cq.unit_location(first + row)
            raise CorruptRecordError(
                path,
                pos,
                f"unit {first + row} points at CommitLog offset {at}, where no "
                f"record of {int(units['size'][row])} bytes starts",
            )
    msgs = log.read_many(phys)
    for row, msg in zip(rows.tolist(), msgs, strict=True):
        queue_offset = first + row
        if (msg.topic, msg.queue_id, msg.queue_offset) != (cq.topic, cq.queue_id, queue_offset):
            raise CorruptRecordError(
                str(log.segments.find(msg.commit_log_offset).path),
                msg.commit_log_offset,
                f"record says {msg.topic}/{msg.queue_id}/{msg.queue_offset}, but unit "
                f"{queue_offset} of {cq.topic}/{cq.queue_id} points at it",
            )
    return msgs


def query_by_key(
    log: CommitLog,
    index: IndexService,
    topic: str,
    key: str,
    begin: int,
    end: int,
    limit: int,
    min_offset: int,
) -> list[record.MessageExt]:
    """Up to ``limit`` messages of ``topic`` with ``key`` stored in ``[begin, end]``, newest
    first (see :meth:`~rocketstore.pipeline.engine.store.MessageStore.query_by_key`): every index
    candidate is checked against the real message, so a hash collision, a damaged entry or an
    entry whose record retention deleted is never returned."""
    found: list[record.MessageExt] = []
    for phys in index.candidates(topic, key, begin, end, min_offset):
        if not log.starts_record(phys):
            continue  # a damaged index entry, or a record retention deleted: not a match
        msg = log.read(phys)
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


class StoreReads:
    """The read calls of a store, over the files :class:`~rocketstore.pipeline.engine.store.MessageStore`
    opened (it inherits them and provides the attributes below). Thread-safety and crash
    behaviour are the store's (see :mod:`rocketstore.pipeline.engine.store`)."""

    commitlog: CommitLog
    queues: dict[tuple[str, int], ConsumeQueue]
    index: IndexService | None
    config: StoreConfig
    read_only: bool
    _mutex: threading.RLock

    def _check_open(self, write: bool = False) -> None:
        raise NotImplementedError  # the store's own

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.queues})

    def queue_ids(self, topic: str | None = None) -> list[tuple[str, int]]:
        """``(topic, queueId)`` of every queue (of ``topic``), sorted: what the directories
        say, with no queue's files read."""
        with self._mutex:
            self._check_open()
            return sorted(k for k in self.queues if topic is None or k[0] == topic)

    @_past_retention
    def queue_infos(
        self, topic: str | None = None, *, topics: Collection[str] | None = None
    ) -> list[QueueInfo]:
        """The bounds of every queue (of ``topic``, or of ``topics``), sorted. A read-only
        store's queue that is not loaded yet is not loaded for it when its file settles its
        bounds at once (:meth:`ConsumeQueue.peek`)."""
        with self._mutex:
            self._check_open()
            out = []
            log_end = self.commitlog.max_offset
            for (t, q), cq in self._selected(topic, topics):
                e = None if cq.loaded else cq.peek(self.commitlog.min_offset, log_end)
                if e is None or e.last is None:
                    out.append(QueueInfo(t, q, cq.min_offset, cq.max_offset, cq.max_physic_offset))
                else:
                    out.append(QueueInfo(t, q, e.min_offset, e.max_offset, sum(e.last)))
            return out

    @_past_retention
    def queue_ends(
        self, topic: str | None = None, *, topics: Collection[str] | None = None
    ) -> list[QueueEnds]:
        """:meth:`queue_infos` with each queue's first and last units (read with its bounds:
        :meth:`ConsumeQueue.ends`)."""
        with self._mutex:
            self._check_open()
            out = []
            for (t, q), cq in self._selected(topic, topics):
                e = cq.ends(self.commitlog.min_offset, self.commitlog.max_offset)
                end = sum(e.last) if e.last is not None else cq.max_physic_offset
                info = QueueInfo(t, q, e.min_offset, e.max_offset, end)
                out.append(QueueEnds(info, e.first, e.last, e.files))
            return out

    def _selected(
        self, topic: str | None, topics: Collection[str] | None
    ) -> list[tuple[tuple[str, int], ConsumeQueue]]:
        return [
            (key, cq)
            for key, cq in sorted(self.queues.items())
            if (topic is None or key[0] == topic) and (topics is None or key[0] in topics)
        ]

    @_past_retention
    def min_offset(self, topic: str, queue_id: int) -> int:
        with self._mutex:
            cq = self.queues.get((topic, queue_id))
            return cq.min_offset if cq else 0

    @_past_retention
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

    @_past_retention
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

    @_past_retention
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

    @_past_retention
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
        return pull(self.commitlog, self.queues.get((topic, queue_id)), offset, max_count, sub)

    @_past_retention
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

    @_past_retention
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
        return query_by_key(self.commitlog, self.index, topic, key, begin, end, limit, min_offset)
