"""A ConsumeQueue's look-up by store time: RocketMQ's ``getOffsetInQueueByTime``.

Reads the queue's units through its mapped files and asks the caller for each candidate
message's store time (the CommitLog holds it, not the unit). Changes nothing; not thread-safe
(the queue's files belong to one owner).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rocketstore.pipeline.files.mappedfile import MappedFile
from rocketstore.pipeline.files.segmentread import unit_index
from rocketstore.pipeline.layout import CQ_UNIT_SIZE, UNIT_DTYPE


def offset_by_time(
    files: list[MappedFile],
    min_offset: int,
    max_offset: int,
    timestamp: int,
    min_physic_offset: int,
    store_time: Callable[[int, int], int],
) -> int:
    """The queue offset of the unit whose message was stored at ``timestamp`` (else the nearer
    neighbour) in the queue of ``files`` holding units ``[min_offset, max_offset)``; see
    :meth:`rocketstore.pipeline.files.consumequeue.queue.ConsumeQueue.offset_by_time`."""
    if not files or max_offset <= min_offset:
        return 0
    chosen = None
    for mf in files:
        if mf.wrote_position == 0:
            continue
        last_unit = np.frombuffer(
            mf.buffer, dtype=UNIT_DTYPE, count=1, offset=mf.wrote_position - CQ_UNIT_SIZE
        )[0]
        chosen = mf
        if store_time(int(last_unit["offset"]), int(last_unit["size"])) >= timestamp:
            break
    if chosen is None:
        return 0
    base_unit = unit_index(chosen.base, 0)
    low = max(min_offset - base_unit, 0)
    high = chosen.wrote_position // CQ_UNIT_SIZE - 1
    units = np.frombuffer(chosen.buffer, dtype=UNIT_DTYPE, count=high + 1)
    left_off = right_off = target = -1
    left_val = right_val = -1
    while high >= low:
        mid = (low + high) // 2
        phy = int(units[mid]["offset"])
        if phy < min_physic_offset:
            low = mid + 1
            left_off = mid
            continue
        t = store_time(phy, int(units[mid]["size"]))
        if t < 0:
            return 0
        if t == timestamp:
            target = mid
            break
        if t > timestamp:
            high = mid - 1
            right_off, right_val = mid, t
        else:
            low = mid + 1
            left_off, left_val = mid, t
    if target != -1:
        found = target
    elif left_val == -1:
        found = right_off
    elif right_val == -1:
        found = left_off
    else:
        found = right_off if abs(timestamp - left_val) > abs(timestamp - right_val) else left_off
    return base_unit + found
