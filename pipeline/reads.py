"""Messages out of a store's files: a pull from one queue, and a look-up by key.

The read paths of :class:`~rocketstore.pipeline.store.MessageStore`, which calls them under its
lock after checking it is open. Each works on the files it is given and writes nothing; a
unit, index entry or record that does not check out is reported (ConsumeQueue, CommitLog) or
passed over (index), never returned as a message.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline import record
from rocketstore.pipeline.commitlog import CommitLog
from rocketstore.pipeline.config import CQ_UNIT_SIZE
from rocketstore.pipeline.consumequeue import ConsumeQueue
from rocketstore.pipeline.errors import CorruptRecordError
from rocketstore.pipeline.index_service import IndexService
from rocketstore.pipeline.results import GetResult
from rocketstore.pipeline.subscription import Subscription

MAX_TIMESTAMP = 2**63 - 1
SCAN_BUDGET_BYTES = 16000  # RocketMQ's floor on ConsumeQueue bytes one filtered pull scans


def pull(
    log: CommitLog, cq: ConsumeQueue | None, offset: int, max_count: int, sub: Subscription
) -> GetResult:
    """Up to ``max_count`` messages of ``cq`` from queue offset ``offset`` that ``sub`` takes
    (see :meth:`~rocketstore.pipeline.store.MessageStore.get_messages`)."""
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
    first (see :meth:`~rocketstore.pipeline.store.MessageStore.query_by_key`): every index
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
