"""What the console's overview shows: a store root's brokers and topics with their counts,
bytes and time spans, disk use, and the last hour's write rate per broker; with the tier on,
each broker's segments and bytes local, in the bucket and waiting for their upload, with the
upload lag and errors (:func:`tier_row`: the store's files and its tier record, as the metrics
read them; the bucket is not asked).

Bytes, time spans and the rate come from a sample of each queue's units, so that what a page
costs stays bounded however many queues there are: :data:`SIZE_SAMPLE` and
:data:`HOUR_SAMPLE` units a queue, or, for a broker of more than :data:`WIDE_QUEUES` queues,
each queue's first and last units only, read all at once. Counts are exact (the queues'
bounds).

Like :mod:`.views`: every broker is opened read-only and closed before :func:`overview`
returns; calls may run in parallel threads; the result is plain data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.console import rates
from rocketstore.pipeline.console.views import HOUR_MS, Console, now_ms
from rocketstore.pipeline.engine.results import QueueEnds
from rocketstore.pipeline.engine.retention.policy import statvfs_used_ratio
from rocketstore.pipeline.engine.root import TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import StoreError
from rocketstore.pipeline.tier.backlog import recorded_backlog
from rocketstore.pipeline.tier.localstate import TierState

SIZE_SAMPLE = 16  # units read per queue to estimate a topic's bytes and time span
HOUR_SAMPLE = 120  # units read per queue for the last hour's write rate
# A broker of more queues than this is drawn from each queue's first and last units alone
# (WIDE_SAMPLE), all at once (see overview): 8,192 units sampled a broker at most, not 16 and
# 120 a queue of 40,000.
WIDE_QUEUES = 512
WIDE_SAMPLE = 2


@dataclasses.dataclass
class BrokerRow:
    name: str
    path: Path
    queues: int
    messages: int
    commitlog_bytes: int
    store_bytes: int
    min_phy: int
    max_phy: int
    oldest: int | None
    newest: int | None
    disk_ratio: float


@dataclasses.dataclass
class TopicRow:
    name: str
    body_format: str
    brokers: set[str]
    queues: int
    messages: int
    bytes: float
    oldest: int | None
    newest: int | None
    sampled: bool


@dataclasses.dataclass(frozen=True)
class TierRow:
    """A broker's tiers (see the module docstring); ``problem``: why they could not be read
    (the other figures are then 0). Times are ms since the epoch, None when there is none."""

    name: str
    local_segments: int = 0
    local_bytes: int = 0
    bucket_segments: int = 0
    bucket_bytes: int = 0
    pending_segments: int = 0
    pending_bytes: int = 0
    lag_s: float = 0.0
    last_upload: int | None = None
    errors: int = 0
    last_error: int | None = None
    problem: str | None = None


@dataclasses.dataclass
class Overview:
    brokers: list[BrokerRow]
    topics: list[TopicRow]
    edges: npt.NDArray[np.int64]
    rate: list[tuple[str, npt.NDArray[np.float64]]]
    rate_sampled: bool
    disk_max_ratio: float
    file_reserved_hours: int
    delete_when: str
    horizon: int
    note: str | None
    generated: int
    size_sample: int = SIZE_SAMPLE  # units a queue sampled at most, for bytes and spans
    hour_sample: int = HOUR_SAMPLE  # ... for the last hour's rate
    tiers: list[TierRow] = dataclasses.field(default_factory=list)  # with the tier on


def _dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (their apparent sizes), 0 if it is missing."""
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a file retention deleted meanwhile
                total += os.stat(os.path.join(parent, name), follow_symlinks=False).st_size
    return total


def _span(
    old: int | None, new: int | None, times: npt.NDArray[np.int64]
) -> tuple[int | None, int | None]:
    if len(times) == 0:
        return old, new
    lo, hi = int(times.min()), int(times.max())
    return (lo if old is None else min(old, lo)), (hi if new is None else max(new, hi))


def tier_row(name: str, path: Path, config: StoreConfig, now: int) -> TierRow:
    """The tiers of the broker ``name`` at ``path`` as of ``now`` (ms)."""
    try:
        local, record = recorded_backlog(path, config, now)
    except (StoreError, OSError) as exc:
        return TierRow(name, problem=str(exc).splitlines()[0] if str(exc) else repr(exc))
    rec = record if record is not None else TierState("")  # never uploaded
    return TierRow(
        name,
        len(local.local),
        local.local_bytes,
        rec.bucket_segments,
        rec.bucket_bytes,
        len(local.pending),
        local.pending_bytes,
        local.lag_s,
        rec.last_upload_ms or None,
        rec.upload_errors,
        rec.last_error_ms or None,
    )


def overview(console: Console) -> Overview:
    """Brokers and topics with their counts, bytes and time spans, disk use, and the write
    rate of the last hour per broker. Bytes and the time spans come from a sample of each
    queue's units (:data:`SIZE_SAMPLE`, and :data:`HOUR_SAMPLE` for the rate); counts are
    exact (the queues' bounds). A broker of more than :data:`WIDE_QUEUES` queues is drawn from
    each queue's first and last units only (:func:`_wide`): what a page costs stays bounded
    however many queues there are."""
    now = now_ms()
    edges, _ = rates.bucket_edges(now - HOUR_MS, now - 1)
    meta, note = console.topic_meta()
    brokers: list[BrokerRow] = []
    topics: dict[str, TopicRow] = {}
    series: list[tuple[str, npt.NDArray[np.float64]]] = []
    tiers: list[TierRow] = []
    rate_sampled = False
    sample = (SIZE_SAMPLE, HOUR_SAMPLE)
    for name, path in console.brokers():
        with console.open(path) as store:
            ends = store.queue_ends()
            row = BrokerRow(
                name,
                path,
                len(ends),
                0,
                0,
                0,
                store.min_phy_offset,
                store.max_phy_offset,
                None,
                None,
                statvfs_used_ratio(path),
            )
            broker = _Broker(store, row, topics, meta, edges)
            if len(ends) > WIDE_QUEUES:
                per_minute, sampled = _wide(broker, ends)
                sample = (WIDE_SAMPLE, WIDE_SAMPLE)
            else:
                per_minute, sampled = _sampled(broker, ends)
            rate_sampled |= sampled
        row.commitlog_bytes = _dir_bytes(path / "commitlog")
        # Every ConsumeQueue file is the configured size: counted, not listed and stat-ed.
        cq_bytes = sum(e.files for e in ends) * console.config.mapped_file_size_consume_queue
        row.store_bytes = row.commitlog_bytes + cq_bytes + _dir_bytes(path / "index")
        brokers.append(row)
        series.append((name, per_minute))
        if console.config.tier_on:
            tiers.append(tier_row(name, path, console.config, now))
    for name, tm in meta.items():  # topics created in topics.json with nothing stored yet
        if name not in topics:
            topics[name] = TopicRow(name, tm.body_format, set(), 0, 0, 0.0, None, None, False)
    cfg = console.config
    return Overview(
        brokers,
        sorted(topics.values(), key=lambda r: r.name),
        edges,
        series,
        rate_sampled,
        cfg.disk_max_used_space_ratio / 100,
        cfg.file_reserved_time,
        cfg.delete_when,
        now - cfg.file_reserved_time * HOUR_MS,
        note,
        now,
        *sample,
        tiers=tiers,
    )


@dataclasses.dataclass
class _Broker:
    """What the overview gathers of one broker: its store (open), its row, the page's topic
    rows (shared by the brokers), ``topics.json`` and the last hour's bucket edges."""

    store: MessageStore
    row: BrokerRow
    topics: dict[str, TopicRow]
    meta: dict[str, TopicMeta]
    edges: npt.NDArray[np.int64]

    def topic(self, name: str) -> TopicRow:
        t = self.topics.get(name)
        if t is None:
            fmt = self.meta[name].body_format if name in self.meta else "binary"
            t = self.topics[name] = TopicRow(name, fmt, set(), 0, 0, 0.0, None, None, False)
        t.brokers.add(self.row.name)
        return t


def _sampled(b: _Broker, ends: list[QueueEnds]) -> tuple[npt.NDArray[np.float64], bool]:
    """A broker's queues, each sampled on its own (:data:`SIZE_SAMPLE`, :data:`HOUR_SAMPLE`
    units): into its row and the topic rows; returns the broker's messages per minute of the
    last hour and whether they are estimated."""
    store, row, edges = b.store, b.row, b.edges
    per_minute = np.zeros(len(edges) - 1)
    rate_sampled = False
    for e in ends:
        info = e.info
        depth = info.max_offset - info.min_offset
        row.messages += depth
        span = rates.sample_queue(
            store, info.topic, info.queue_id, info.min_offset, info.max_offset, SIZE_SAMPLE
        )
        t = b.topic(info.topic)
        t.queues += 1
        t.messages += depth
        t.bytes += depth * span.mean_size
        t.sampled |= span.sampled
        t.oldest, t.newest = _span(t.oldest, t.newest, span.times)
        row.oldest, row.newest = _span(row.oldest, row.newest, span.times)
        if len(span.times) and span.times.max() >= edges[0]:
            start = rates.offset_at(
                store, info.topic, info.queue_id, info.min_offset, info.max_offset, int(edges[0])
            )
            hour = rates.sample_queue(
                store, info.topic, info.queue_id, start, info.max_offset, HOUR_SAMPLE
            )
            rate_sampled |= hour.sampled
            per_minute += rates.counts(hour, start, edges)
    return per_minute, rate_sampled


def _wide(b: _Broker, ends: list[QueueEnds]) -> tuple[npt.NDArray[np.float64], bool]:
    """:func:`_sampled` for a broker of many queues: each queue is sampled at its first and
    last units, which its bounds were read with (:meth:`MessageStore.queue_ends`), and their
    store times are read all at once; the time spans are exact (a queue's first and last
    messages are its oldest and newest), bytes and the rate estimated between them."""
    store, row, edges = b.store, b.row, b.edges
    n = len(ends)
    low = np.array([e.info.min_offset for e in ends], dtype=np.int64)
    depth = np.array([e.info.max_offset for e in ends], dtype=np.int64) - low
    units = np.zeros((2, 2, n), dtype=np.int64)  # (first, last) x (offset, size) x queue
    for i, e in enumerate(ends):
        if e.first is not None and e.last is not None:
            units[0, :, i] = e.first
            units[1, :, i] = e.last
    times = [store.commitlog.store_timestamps(units[j, 0], units[j, 1]) for j in (0, 1)]
    live = [(t >= 0) & (depth > 0) for t in times]
    at = [low, np.maximum(low, low + depth - 1)]
    one = depth == 1
    sizes = (units[0, 1] * live[0] + units[1, 1] * (live[1] & ~one)).astype(np.float64)
    read = live[0].astype(np.int64) + (live[1] & ~one)
    mean = np.divide(sizes, read, out=np.zeros(n), where=read > 0)
    # Per topic, all at once: queues, messages, bytes, oldest and newest store time.
    names, topic_of = np.unique([e.info.topic for e in ends], return_inverse=True)
    count = np.bincount(topic_of, minlength=len(names))
    messages = np.bincount(topic_of, weights=depth, minlength=len(names))
    weight = np.bincount(topic_of, weights=depth * mean, minlength=len(names))
    wider = np.bincount(topic_of, weights=depth > WIDE_SAMPLE, minlength=len(names)) > 0
    never = np.iinfo(np.int64).max
    oldest = np.full(len(names), never, dtype=np.int64)
    newest = np.full(len(names), -1, dtype=np.int64)
    for j in (0, 1):
        np.minimum.at(oldest, topic_of[live[j]], times[j][live[j]])
        np.maximum.at(newest, topic_of[live[j]], times[j][live[j]])
    row.messages += int(depth.sum())
    for k, topic in enumerate(names.tolist()):
        t = b.topic(topic)
        t.queues += int(count[k])
        t.messages += int(messages[k])
        t.bytes += float(weight[k])
        t.sampled |= bool(wider[k])
        if newest[k] >= 0:
            spans = np.array([oldest[k], newest[k]], dtype=np.int64)
            t.oldest, t.newest = _span(t.oldest, t.newest, spans)
            row.oldest, row.newest = _span(row.oldest, row.newest, spans)
    newest = np.where(live[1], times[1], np.where(live[0], times[0], -1))
    hour = (depth > 0) & (newest >= edges[0])
    per_minute = rates.ends_counts(
        low[hour],
        (at[0][hour], at[1][hour]),
        (np.where(live[0], times[0], -1)[hour], np.where(live[1], times[1], -1)[hour]),
        depth[hour],
        edges,
    )
    return per_minute, bool(np.any(depth[hour] > WIDE_SAMPLE))
