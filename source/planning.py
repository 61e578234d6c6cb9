"""Offset planning for the source, on the driver: what each micro-batch (or batch read) reads.

* :class:`Planner` resolves the starting options to offsets, finds the latest readable offsets
  (:class:`~rocketstore.source.brokerview.BrokerView`), applies the read limits, detects data loss, and cuts
  a batch into :class:`QueueRange` partitions.
* :func:`apportion` spreads a budget over queues in proportion to their backlog (largest
  remainders, so the shares add up to the budget exactly and none exceeds its backlog).
* :func:`split_ranges` splits big ranges so that a batch has at least ``minPartitions`` tasks.

Contract with Spark (see :mod:`rocketstore.source.format`): every method runs in the driver's
long-lived Python process; the planner keeps only what may be lost without harm (the time of
the last trigger, for ``maxTriggerDelay``, the ``availableNow`` target, and each broker's
bounds until its files change: :mod:`rocketstore.source.brokercache`), because progress
lives in the query's checkpoint as the offsets these methods return. Not thread-safe (Spark
calls it from one thread). No Spark imports.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TypeVar

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.groups import broker_offsets, require_group
from rocketstore.pipeline.errors import ConfigError, DataLossError, NotFoundError
from rocketstore.pipeline.tier.manifest import tier_prefix
from rocketstore.pipeline.tier.objects import ObjectStore, shared_store
from rocketstore.pipeline.tier.remote import RemoteSegments
from rocketstore.source.brokercache import BoundsCache, PlanWork
from rocketstore.source.brokerview import BrokerView, QueueBounds, Tails
from rocketstore.source.offsets import (
    EARLIEST,
    LATEST,
    Offsets,
    OffsetSpec,
    QueueKey,
    queue_name,
    sort_key,
)
from rocketstore.source.options import ReadOptions
from rocketstore.source.tiers import BucketRoot, TierView

log = logging.getLogger("rocketstore.source")

K = TypeVar("K", bound=Hashable)


@dataclasses.dataclass(frozen=True)
class QueueRange:
    """Queue offsets ``[start, end)`` of one message queue: one Spark input partition."""

    topic: str
    broker: str
    broker_path: str
    queue_id: int
    start: int
    end: int
    # The broker's objects in the tier (``<objectStorePrefix><brokerName>/``), "" without one;
    # ``cold``: the range is read from the tier rather than the broker directory.
    tier: str = ""
    cold: bool = False
    # A cold range lies in one segment of the tier, this one: the planner cuts them there, so
    # that a partition reads each object once for every queue it holds (see pack_ranges).
    segment: int = -1

    @property
    def key(self) -> QueueKey:
        return (self.topic, self.broker, self.queue_id)

    @property
    def count(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class KeyRange:
    """A key look-up on one broker: one Spark input partition of a batch read by key."""

    topic: str
    broker: str
    broker_path: str
    key: str
    begin: int
    end: int
    tier: str = ""  # the broker's objects in the tier, as QueueRange.tier


@dataclasses.dataclass(frozen=True)
class Limit:
    """A read limit as the planner sees it (Spark's ``ReadLimit`` translated)."""

    max_rows: int | None = None
    min_rows: int | None = None
    all_available: bool = False


@dataclasses.dataclass(frozen=True)
class Loss:
    """Queue offsets ``[start, now_min)`` the query had not read and cannot read any more."""

    key: QueueKey
    start: int
    now_min: int

    @property
    def count(self) -> int:
        return self.now_min - self.start


@dataclasses.dataclass
class Look:
    """What one look at the brokers found: every queue's readable offsets across both tiers,
    where each broker is (its directory, or its tier's location when it has no directory
    here), each broker's tier prefix, and for each queue the tier holds older messages of
    than its directory, the offset where the directory takes over (below it: the tier)."""

    bounds: dict[QueueKey, QueueBounds]
    paths: dict[str, str]
    tiers: dict[str, str] = dataclasses.field(default_factory=dict)
    cold: dict[QueueKey, int] = dataclasses.field(default_factory=dict)


def merge_cold(look: Look, q: QueueKey, cold: QueueBounds) -> None:
    """Add what the tier holds of queue ``q`` (``cold``) to ``look``. The directory is read
    wherever it holds the offsets (it is local, and its tail is newer than any upload): the
    tier serves the offsets below the directory's first, up to the tier's last. Offsets in
    neither (the directory's retention ran before the tier held them) are below the first the
    look offers, or read as lost."""
    local = look.bounds.get(q)
    if local is None:
        look.bounds[q] = cold
        look.cold[q] = cold.max
        return
    takes_over = min(local.min, cold.max)
    if cold.min < takes_over:
        look.bounds[q] = QueueBounds(cold.min, local.max)
        look.cold[q] = takes_over


def describe_losses(losses: Iterable[Loss]) -> str:
    items = sorted(losses, key=lambda x: sort_key(x.key))
    total = sum(x.count for x in items)
    parts = "; ".join(
        f"{queue_name(x.key)}: offsets [{x.start}, {x.now_min}), {x.count} messages" for x in items
    )
    return (
        f"{total} messages the query had not read were deleted by retention ({parts}). The "
        "query would go on from each queue's new earliest offset; set failOnDataLoss=false to "
        "allow that"
    )


def apportion(weights: Mapping[K, int], budget: int, order: Callable[[K], object]) -> dict[K, int]:
    """Split ``budget`` over keys in proportion to ``weights``, by largest remainders.

    Each share is at most its weight; the shares add up to ``min(budget, sum(weights))``. Ties
    go to the key first in ``order``, so the result is deterministic.
    """
    total = sum(max(0, w) for w in weights.values())
    if budget >= total:
        return {k: max(0, w) for k, w in weights.items()}
    shares: dict[K, int] = {}
    remainders: list[tuple[float, K]] = []
    for k, w in weights.items():
        exact = budget * max(0, w) / total
        shares[k] = math.floor(exact)
        remainders.append((exact - shares[k], k))
    left = budget - sum(shares.values())
    remainders.sort(key=lambda rk: (-rk[0], order(rk[1])))
    for _, k in remainders:
        if left <= 0:
            break
        if shares[k] < weights[k]:
            shares[k] += 1
            left -= 1
    return shares


def split_ranges(ranges: list[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Split ranges so that there are ``min(min_partitions, messages)`` of them, the extra
    parts going to the biggest ranges in proportion to their size (as Kafka's source splits
    for ``minPartitions``). Fewer-than-asked ranges are left alone when there are already
    enough."""
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.count for r in ranges)
    extra_total = min(min_partitions, total) - len(ranges)
    if extra_total <= 0:
        return ranges
    # Extra parts per range, proportional to size, at most count - 1 each.
    room = {i: r.count - 1 for i, r in enumerate(ranges)}
    extra = apportion({i: r.count for i, r in enumerate(ranges)}, extra_total, lambda i: i)
    overflow = 0
    for i in extra:
        if extra[i] > room[i]:
            overflow += extra[i] - room[i]
            extra[i] = room[i]
    for i in sorted(room, key=lambda i: -ranges[i].count):
        give = min(overflow, room[i] - extra[i])
        extra[i] += give
        overflow -= give
    out: list[QueueRange] = []
    for i, r in enumerate(ranges):
        parts = 1 + extra[i]
        bounds = [r.start + (r.count * p) // parts for p in range(parts + 1)]
        out.extend(
            dataclasses.replace(r, start=a, end=b) for a, b in itertools.pairwise(bounds) if b > a
        )
    return out


# Spark runs a Python data source partition as a task of its own, which costs tens of ms
# whatever it reads (about 70 ms each on a loaded 2-vCPU machine, against about 5 ms to decode
# 10K messages): small queue ranges share a partition until it holds this many messages.
PARTITION_MESSAGES = 1 << 16


def pack_ranges(
    ranges: list[QueueRange], min_partitions: int | None, target: int = PARTITION_MESSAGES
) -> list[tuple[QueueRange, ...]]:
    """Group ``ranges`` (in order) into partitions of at least ``target`` messages where they
    are smaller, each range in exactly one partition; a range of ``target`` or more is a
    partition of its own. The tier's ranges group by segment first (each segment's in one
    partition). With ``minPartitions``, the ranges (already split to that many) are
    not packed: the user asked for that parallelism."""
    if min_partitions:
        return [(r,) for r in ranges]
    out: list[tuple[QueueRange, ...]] = []
    group: list[QueueRange] = []
    size = 0
    # The tier's ranges of one segment go together, whatever their size, so that the
    # partition fetches the object once for all of them (source.tierread.read_tier_segment);
    # segments then pack as small ranges do.
    by_segment: dict[tuple[str, str, int], list[QueueRange]] = {}
    for r in ranges:
        if r.cold:
            by_segment.setdefault((r.broker, r.tier, r.segment), []).append(r)
    for _, pieces in sorted(by_segment.items()):
        group.extend(pieces)
        size += sum(r.count for r in pieces)
        if size >= target:
            out.append(tuple(group))
            group, size = [], 0
    if group:
        out.append(tuple(group))
        group, size = [], 0
    for r in (r for r in ranges if not r.cold):
        if r.count >= target:
            out.append((r,))
            continue
        group.append(r)
        size += r.count
        if size >= target:
            out.append(tuple(group))
            group, size = [], 0
    if group:
        out.append(tuple(group))
    return out


@dataclasses.dataclass(frozen=True)
class Step:
    """What :func:`next_offsets` decided: the end offsets and the losses it stepped over."""

    end: Offsets
    losses: list[Loss]


def next_offsets(
    start: Mapping[QueueKey, int],
    bounds: Mapping[QueueKey, QueueBounds],
    limit: Limit,
    *,
    target: Mapping[QueueKey, int] | None = None,
    default_max: int | None = None,
    default_min: int | None = None,
    may_wait: bool = False,
) -> Step:
    """The end of the micro-batch after ``start``, given every queue's readable ``bounds``.

    * A queue missing from ``start`` (new) begins at its earliest offset; one whose offset
      retention passed begins at its new earliest (a :class:`Loss`, reported by the caller).
    * A queue whose latest offset is below the query's offset (a writer re-dispatching after a
      crash, for one) is waited for, never read backwards.
    * With ``target`` (``availableNow``), no queue goes past its target; queues that appeared
      after it are not read.
    * Unless ``limit.all_available``: ``minMessagesPerTrigger`` (``limit.min_rows`` or
      ``default_min``) returns ``start`` unchanged while fewer are available and ``may_wait``
      (the delay has not passed; never with a target); ``maxMessagesPerTrigger``
      (``limit.max_rows`` or ``default_max``) caps the batch, spread over queues in proportion
      to their backlog.
    * Queues in ``start`` keep their entry; new queues get one only when they are read.
    """
    begin: dict[QueueKey, int] = {}
    losses: list[Loss] = []
    avail: dict[QueueKey, int] = {}
    for q, b in bounds.items():
        s = start.get(q)
        if s is None:
            s = b.min
        elif s < b.min:
            losses.append(Loss(q, s, b.min))
            s = b.min
        begin[q] = s
        top = b.max if target is None else min(b.max, target.get(q, s))
        avail[q] = max(0, top - s)
    shares = avail
    if not limit.all_available:
        min_rows = limit.min_rows if limit.min_rows is not None else default_min
        max_rows = limit.max_rows if limit.max_rows is not None else default_max
        total = sum(avail.values())
        if min_rows is not None and target is None and 0 < total < min_rows and may_wait:
            return Step(dict(start), [])
        if max_rows is not None and total > max_rows:
            shares = apportion(avail, max_rows, sort_key)
    end: Offsets = dict(start)
    for q, share in shares.items():
        if q in start or share > 0:
            end[q] = begin[q] + share
    return Step(end, losses)


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Planner:
    """The driver-side logic of one query or batch read (see the module docstring)."""

    def __init__(self, options: ReadOptions, clock_ms: Callable[[], int] = _now_ms) -> None:
        self.options = options
        self.clock_ms = clock_ms
        self.last_trigger_ms = clock_ms()
        self.available_now_target: Offsets | None = None
        # Each queue's tail as the last call found it, per broker: a streaming query asks for
        # the latest offsets every few milliseconds while idle, and a queue with nothing new
        # then costs two unit reads.
        self._tails: dict[str, Tails] = {}
        # Each broker's bounds, kept until its files change (rocketstore.source.brokercache):
        # a plan reads the brokers a writer touched since the last one, not all of them.
        self._cache = BoundsCache()
        self._views: dict[str, BrokerView] = {}
        self._root = options.root  # one, so that it keeps its brokers' paths
        # Each broker's tier (source.tiers), with the tier on; a path that is a bucket has
        # nothing else.
        self._tiers: dict[str, TierView] = {}
        self._last_cold: dict[QueueKey, int] = {}
        self._bucket: BucketRoot | None = None
        self._objects: ObjectStore | None = None

    def __getstate__(self) -> dict[str, object]:
        # Spark pickles the stream reader, planner included, to its executors, which never
        # plan: the S3 clients (which do not pickle) stay behind, and come back on first use.
        state = dict(self.__dict__)
        state.update(_tiers={}, _bucket=None, _objects=None)
        return state

    @property
    def work(self) -> PlanWork:
        """Brokers checked and read by this planner's plans so far."""
        return self._cache.work

    # -- what is there --------------------------------------------------------------------------

    def brokers(self) -> list[BrokerView]:
        """The root's broker directories now; a broker's view (and the file system type it
        looked up) is kept from one call to the next."""
        setting = (self.options.config or StoreConfig()).shared_storage
        views: list[BrokerView] = []
        for name, path in self._root.brokers():
            view = self._views.get(name)
            if view is None or (view.path is not path and view.path != path):
                view = self._views[name] = BrokerView(name, path, setting)
            views.append(view)
        return views

    def tiers(self) -> dict[str, TierView]:
        """Each broker's tier now (none with the tier off), its manifest read again when it
        is older than a second (:class:`TierView`)."""
        config = self.options.store_config
        if not config.tier_on:
            return {}
        if self.options.bucket is not None:
            if self._bucket is None:
                self._bucket = BucketRoot(self.options.path, config)
            found = self._bucket.brokers()
            objects = self._bucket.objects
        else:
            if self._objects is None:
                self._objects = shared_store(config)
            objects = self._objects
            found = [(v.name, tier_prefix(v.path, config)) for v in self.brokers()]
        tiers: dict[str, TierView] = {}
        for name, prefix in found:
            view = self._tiers.get(name)
            if view is None or view.prefix != prefix:
                segments = RemoteSegments(objects, prefix, name=objects.target.url())
                view = TierView(name, segments, self.clock_ms)
            view.refresh()
            tiers[name] = view
        self._tiers = tiers
        return tiers

    def bounds(self) -> dict[QueueKey, QueueBounds]:
        """Readable offsets of every queue of the query's topics on every broker, now, across
        both tiers."""
        return self._look().bounds

    def _look(self) -> Look:
        """:meth:`bounds`, where they were read from, and where each queue's tier ends."""
        out: dict[QueueKey, QueueBounds] = {}
        views = self.brokers()
        self._cache.keep_only({v.name for v in views})
        for broker in views:
            tails = self._tails.setdefault(broker.name, {})
            for topic, queues in self._cache.bounds(broker, self.options.topics, tails).items():
                for qid, b in queues.items():
                    out[(topic, broker.name, qid)] = b
        look = Look(out, {v.name: str(v.path) for v in views})
        self._last_cold = look.cold
        for name, tier in self.tiers().items():
            look.tiers[name] = tier.prefix
            look.paths.setdefault(name, tier.location)
            for topic in self.options.topics:
                for qid, cold in tier.bounds(topic).items():
                    merge_cold(look, (topic, name, qid), cold)
        return look

    def latest(self) -> Offsets:
        return {q: b.max for q, b in self.bounds().items()}

    # -- starting and ending offsets ------------------------------------------------------------

    def resolve(self, spec: OffsetSpec, bounds: Mapping[QueueKey, QueueBounds]) -> Offsets:
        """Offsets of every queue for a starting (or ending) spec; queues the spec does not
        name get their earliest offset (their latest for an ending spec: see
        :meth:`batch_range`)."""
        if spec.kind == "earliest":
            return {q: b.min for q, b in bounds.items()}
        if spec.kind == "latest":
            return {q: b.max for q, b in bounds.items()}
        if spec.kind == "timestamp":
            views = {v.name: v for v in self.brokers()}
            return {
                q: self._offset_for_time(q, spec.timestamp, b, views) for q, b in bounds.items()
            }
        named = self.group_offsets(spec.group) if spec.kind == "group" else spec.mapping
        out: Offsets = {}
        views = {v.name: v for v in self.brokers()} if spec.kind == "timestamps" else {}
        for q in set(bounds) | set(named):
            b = bounds.get(q, QueueBounds(0, 0))
            value = named.get(q, EARLIEST)
            if value == EARLIEST:
                out[q] = b.min
            elif value == LATEST:
                out[q] = b.max
            elif spec.kind == "timestamps":
                out[q] = b.max if q not in bounds else self._offset_for_time(q, value, b, views)
            else:
                out[q] = value
        return out

    def _offset_for_time(
        self, q: QueueKey, timestamp: int, b: QueueBounds, views: Mapping[str, BrokerView]
    ) -> int:
        """The first offset of queue ``q`` in ``b`` stored at or after ``timestamp``: in the
        tier below where its local files take over, else in the broker directory."""
        topic, broker, queue_id = q
        local_from = b.min
        tier = self._tiers.get(broker)
        cold = self._last_cold.get(q)
        if tier is not None and cold is not None and b.min < cold:
            found = tier.offset_for_time(topic, queue_id, timestamp)
            if found is not None and found < cold:
                return max(int(found), b.min)
            local_from = cold
        view = views.get(broker)
        if view is None or local_from >= b.max:
            return b.max
        return view.offset_for_time(topic, queue_id, timestamp, QueueBounds(local_from, b.max))

    def group_offsets(self, group: str) -> Offsets:
        """What the RocketMQ consumer group ``group`` committed for the query's topics, read
        now from each broker directory's ``config/consumerOffset.json``. Raises
        :class:`ConfigError` when it committed nothing for them (a misspelt group must not
        start from the earliest offsets), and
        :class:`~rocketstore.pipeline.engine.groups.ConsumerOffsetsError` for a damaged file."""
        if self.options.bucket is not None:
            raise ConfigError(
                f"option startingOffsets=group:{group}: a consumer group's offsets are in the "
                f"store root's broker directories (config/consumerOffset.json), and path "
                f"{self.options.path} is a bucket's tier; read them from the store root"
            )
        root = self.options.root.path
        try:
            found = require_group(root, broker_offsets(root), group, self.options.topics)
        except NotFoundError as exc:
            raise ConfigError(f"option startingOffsets=group:{group}: {exc}") from None
        log.info(
            "startingOffsets=group:%s: %d queue(s) committed, the others start at their earliest",
            group,
            len(found),
        )
        return found

    def initial_offsets(self) -> Offsets:
        return self.resolve(self.options.starting, self.bounds())

    # -- streaming ------------------------------------------------------------------------------

    def prepare_available_now(self) -> None:
        """Record what ``availableNow`` reads up to: every queue's latest offset now."""
        self.available_now_target = self.latest()

    def _report(self, losses: list[Loss]) -> None:
        if not losses:
            return
        if self.options.fail_on_data_loss:
            raise DataLossError(describe_losses(losses))
        log.warning(
            "failOnDataLoss=false: skipping %d messages retention deleted before they were "
            "read: %s",
            sum(x.count for x in losses),
            ", ".join(f"{queue_name(x.key)} [{x.start}, {x.now_min})" for x in losses),
        )

    def next_end(self, start: Mapping[QueueKey, int], limit: Limit) -> Offsets:
        """The end offset of the next micro-batch starting at ``start`` (``start`` itself when
        there is nothing to read, or ``minMessagesPerTrigger`` says to wait)."""
        opts = self.options
        now = self.clock_ms()
        step = next_offsets(
            start,
            self.bounds(),
            limit,
            target=self.available_now_target,
            default_max=opts.max_per_trigger,
            default_min=opts.min_per_trigger,
            may_wait=now - self.last_trigger_ms < opts.max_trigger_delay_ms,
        )
        self._report(step.losses)
        if step.end != dict(start):
            self.last_trigger_ms = now
        return step.end

    def ranges(
        self, start: Mapping[QueueKey, int], end: Mapping[QueueKey, int]
    ) -> list[QueueRange]:
        """The partitions of the micro-batch ``(start, end]``; a queue missing from ``start``
        (new since) reads from its earliest offset. Checks for data loss again: a batch
        replayed after a restart may find its first messages deleted."""
        look = self._look()
        bounds, paths = look.bounds, look.paths
        out: list[QueueRange] = []
        losses: list[Loss] = []
        for q in sorted(end, key=sort_key):
            e = end[q]
            b = bounds.get(q)
            s = start.get(q)
            if s is None:
                s = b.min if b is not None else e
            if b is not None and s < min(b.min, e):
                losses.append(Loss(q, s, min(b.min, e)))
                s = min(b.min, e)
            if e <= s:
                continue
            path = paths.get(q[1])
            if path is None:
                losses.append(Loss(q, s, e))  # the whole broker directory is gone
                continue
            tier = look.tiers.get(q[1], "")
            cold = look.cold.get(q)
            if cold is not None and s < cold:
                view = self._tiers[q[1]]
                top = min(e, cold)
                out.extend(
                    QueueRange(q[0], q[1], path, q[2], a, b, tier, True, base)
                    for base, a, b in view.pieces(q[0], q[2], s, top)
                )
                s = top
            if s < e:
                out.append(QueueRange(q[0], q[1], path, q[2], s, e, tier))
        self._report(losses)
        return split_ranges(out, self.options.min_partitions)

    # -- batch ----------------------------------------------------------------------------------

    def batch_range(self) -> tuple[Offsets, Offsets]:
        """(start, end) of a batch read from ``startingOffsets`` / ``endingOffsets``."""
        bounds = self.bounds()
        start = self.resolve(self.options.starting, bounds)
        ending = self.options.ending
        end = {q: b.max for q, b in bounds.items()}
        if ending.kind == "offsets":
            for q, v in ending.mapping.items():
                end[q] = bounds[q].max if v == LATEST and q in bounds else max(v, 0)
        for q, e in end.items():
            s = start.setdefault(q, bounds[q].min if q in bounds else 0)
            if e < s and ending.kind == "offsets" and q in ending.mapping:
                raise ConfigError(
                    f"option endingOffsets: {queue_name(q)} ends at {e}, before its starting "
                    f"offset {s}; expected endingOffsets >= startingOffsets"
                )
        return start, end

    def packed(
        self, start: Mapping[QueueKey, int], end: Mapping[QueueKey, int]
    ) -> list[tuple[QueueRange, ...]]:
        """The partitions of ``(start, end]``: its queue ranges (:meth:`ranges`) packed
        (:func:`pack_ranges`)."""
        return pack_ranges(self.ranges(start, end), self.options.min_partitions)

    def batch_parts(self) -> list[KeyRange | tuple[QueueRange, ...]]:
        """The partitions of a batch read: one per broker and topic for a ``key`` look-up,
        else ``startingOffsets`` to ``endingOffsets`` packed (read each with
        :func:`rocketstore.source.tierread.read_part`)."""
        if self.options.key is not None:
            return list(self.key_ranges())
        return list(self.packed(*self.batch_range()))

    def key_ranges(self) -> list[KeyRange]:
        key = self.options.key
        assert key is not None
        opts = self.options
        tiers = self.tiers()
        brokers = {v.name: str(v.path) for v in self.brokers()}
        for name, tier in tiers.items():
            brokers.setdefault(name, tier.location)
        return [
            KeyRange(
                topic,
                name,
                path,
                key,
                opts.start_timestamp,
                opts.end_timestamp,
                tiers[name].prefix if name in tiers else "",
            )
            for topic in opts.topics
            for name, path in sorted(brokers.items())
        ]
