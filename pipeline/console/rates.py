"""Messages per minute from the store timestamps of sampled ConsumeQueue units.

A queue's offsets rise with its messages' store times, so the curve ``offset(time)`` read at
a few units tells how many messages arrived between two times: a unit's record carries its
store timestamp (:meth:`CommitLog.store_timestamp <rocketstore.pipeline.files.commitlog.CommitLog.store_timestamp>`,
one read of a mapped segment), and the units come from the store's own ConsumeQueue reader
(:meth:`MessageStore.read_units`). Up to ``limit`` units per queue are read, evenly spread;
when a queue holds more, the counts between two sampled units are spread over time linearly
and :attr:`QueueSample.sampled` says so, for the page to say so too. With every unit read the
counts are exact.

Not thread-safe beyond the store's own rule: call from the thread that opened the store. While
a writer appends, a sample stops at the queue's max offset as it was when it was read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.engine.store import MessageStore

MINUTE_MS = 60_000
DEFAULT_LIMIT = 240
MAX_BUCKETS = 24 * 60


@dataclasses.dataclass(frozen=True)
class QueueSample:
    """Store timestamps (ms) of units at ``offsets`` (ascending) of one queue; ``sizes``
    are their records' sizes. ``total`` is the number of units in the sampled range."""

    offsets: npt.NDArray[np.int64]
    times: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    total: int

    @property
    def sampled(self) -> bool:
        """Whether only some units were read (counts between them are estimates)."""
        return len(self.offsets) < self.total

    @property
    def mean_size(self) -> float:
        return float(self.sizes.mean()) if len(self.sizes) else 0.0


def _timestamps(store: MessageStore, units: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    log = store.commitlog
    return np.array(
        [log.store_timestamp(int(u["offset"]), int(u["size"])) for u in units], dtype=np.int64
    )


def sample_queue(
    store: MessageStore,
    topic: str,
    queue_id: int,
    low: int,
    high: int,
    limit: int = DEFAULT_LIMIT,
) -> QueueSample:
    """Units of queue offsets ``[low, high)``: all of them when there are at most ``limit``,
    else ``limit`` evenly spaced ones, the first and the last included. Units whose record
    retention has deleted (timestamp -1) are left out."""
    total = max(high - low, 0)
    if total == 0:
        empty = np.empty(0, dtype=np.int64)
        return QueueSample(empty, empty, empty, 0)
    units: npt.NDArray[Any]
    if total <= limit:
        units = store.read_units(topic, queue_id, low, total)
        offsets = np.arange(low, low + len(units), dtype=np.int64)
    else:
        offsets = np.unique(np.linspace(low, high - 1, limit).astype(np.int64))
        parts = [store.read_units(topic, queue_id, int(o), 1) for o in offsets]
        kept = [i for i, p in enumerate(parts) if len(p)]
        offsets = offsets[kept]
        if not kept:
            empty = np.empty(0, dtype=np.int64)
            return QueueSample(empty, empty, empty, total)
        units = np.concatenate([parts[i] for i in kept])
    if len(units) == 0:
        empty = np.empty(0, dtype=np.int64)
        return QueueSample(empty, empty, empty, total)
    times = _timestamps(store, units)
    live = times >= 0
    sizes = units["size"].astype(np.int64)
    return QueueSample(offsets[live], times[live], sizes[live], total)


def offset_at(
    store: MessageStore, topic: str, queue_id: int, low: int, high: int, when: int
) -> int:
    """The first queue offset in ``[low, high)`` whose message was stored at or after ``when``
    (``high`` when none): a binary search over the units' store timestamps, which rise with
    the offsets in a queue."""
    lo, hi = low, high
    while lo < hi:
        mid = (lo + hi) // 2
        units = store.read_units(topic, queue_id, mid, 1)
        t = _timestamps(store, units)[0] if len(units) else -1
        if t < when:  # a deleted record (-1) lies before every live one
            lo = mid + 1
        else:
            hi = mid
    return lo


def bucket_edges(start_ms: int, end_ms: int) -> tuple[npt.NDArray[np.int64], int]:
    """Bucket boundaries covering ``[start_ms, end_ms]``, one a minute (wider when that would
    make more than :data:`MAX_BUCKETS`), and the bucket width in ms."""
    width = MINUTE_MS
    span = max(end_ms - start_ms, 1)
    while span // width > MAX_BUCKETS:
        width *= 2 if width < 3_600_000 else 24
    first = start_ms - start_ms % width
    count = (end_ms - first) // width + 1
    return first + width * np.arange(count + 1, dtype=np.int64), width


def counts(
    sample: QueueSample, first_offset: int, edges: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """Messages stored in each ``[edges[i], edges[i+1])``, by the sample: exactly for the
    units read, and between them spread linearly in time. ``first_offset`` is the queue
    offset the sample starts counting at (its low end)."""
    out = np.zeros(len(edges) - 1, dtype=np.float64)
    if len(sample.offsets) == 0:
        return out
    # Messages at and before each sampled unit, as a function of time; store times can step
    # back a little (clock adjustments), which the running maximum irons out.
    times = np.maximum.accumulate(sample.times).astype(np.float64)
    done = (sample.offsets - first_offset + 1).astype(np.float64)
    if not sample.sampled:
        # Every unit read: each message counts in its own bucket.
        before_edge = np.searchsorted(times, edges.astype(np.float64), side="left")
        return np.diff(before_edge).astype(np.float64)
    # Messages stored before each edge: all those up to the last sampled unit stored before
    # it, and a share, linear in time, of those between that unit and the next (which was
    # stored at or after the edge). Many units share one timestamp (a batch), so this is
    # done by hand rather than with np.interp, which wants distinct times.
    at = edges.astype(np.float64)
    k = np.searchsorted(times, at, side="left")
    n = len(times)
    inner = (k > 0) & (k < n)
    before = np.where(k >= n, done[-1], 0.0)
    lo = np.clip(k - 1, 0, n - 1)
    hi = np.clip(k, 0, n - 1)
    span = np.where(inner, times[hi] - times[lo], 1.0)
    share = np.where(inner, (at - times[lo]) / span, 0.0)
    between = done[hi] - 1 - done[lo]
    before = np.where(inner, done[lo] + between * share, before)
    return np.diff(before)


def ends_counts(
    low: npt.NDArray[np.int64],
    offsets: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    times: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    totals: npt.NDArray[np.int64],
    edges: npt.NDArray[np.int64],
) -> npt.NDArray[np.float64]:
    """:func:`counts` summed over many queues, each sampled at two units only (its first and
    last), all at once: queue ``i`` holds ``totals[i]`` units from queue offset ``low[i]``;
    its two units are at ``offsets[0][i]`` and ``offsets[1][i]`` (the same offset for a queue
    of one unit) and were stored at ``times[0][i]`` and ``times[1][i]`` (-1: retention
    deleted the record; the unit is left out, as :func:`sample_queue` leaves it out)."""
    first = times[0] >= 0
    second = (times[1] >= 0) & (offsets[1] != offsets[0])
    points = first.astype(np.int64) + second
    # With one unit left, it is the first of the sample.
    t0 = np.where(first, times[0], times[1]).astype(np.float64)
    o0 = np.where(first, offsets[0], offsets[1])
    t1 = np.maximum(t0, times[1].astype(np.float64))  # the running maximum of counts()
    d0 = (o0 - low + 1).astype(np.float64)
    d1 = (offsets[1] - low + 1).astype(np.float64)
    at = edges.astype(np.float64)[None, :]
    # Units of the sample stored before each edge.
    k = ((points[:, None] >= 1) & (t0[:, None] < at)).astype(np.int64) + (
        (points[:, None] >= 2) & (t1[:, None] < at)
    )
    sampled = points < totals
    done = np.where(points == 2, d1, d0)[:, None]
    before = np.where(k >= points[:, None], done, 0.0)
    inner = (points[:, None] == 2) & (k == 1)
    span = np.where(inner, t1[:, None] - t0[:, None], 1.0)
    share = d0[:, None] + (d1 - 1 - d0)[:, None] * (at - t0[:, None]) / span
    before = np.where(inner, share, before)
    before = np.where(sampled[:, None], before, k.astype(np.float64))
    before[points == 0] = 0.0
    out: npt.NDArray[np.float64] = np.diff(before, axis=1).sum(axis=0)
    return out
