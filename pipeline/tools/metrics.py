"""Prometheus metrics of a store root: what ``/metrics`` serves (the console's and
``rocketstore exporter``'s), built with ``prometheus_client``.

Names follow RocketMQ 5's metrics where one exists (``rocketmq_messages_in_total``,
``rocketmq_throughput_in_total``, ``rocketmq_consumer_lag_messages``,
``rocketmq_consumer_lag_latency``, in its units: messages, bytes, milliseconds), and are
``rocketstore_*`` otherwise; :data:`rocketstore.pipeline.tools.metricfamilies.FAMILIES` lists every
family with its help text, and docs/monitoring.md describes them. Labels: ``broker`` (the broker directory's name),
``topic``, ``queue_id``, ``consumer_group`` for RocketMQ consumer groups
(``config/consumerOffset.json``) and ``query`` for Spark queries (a checkpoint directory).

Cardinality is bounded: per-queue series (``rocketstore_queue_*`` and the per-queue lag
families) are left out when the root has more than ``per_queue_limit`` queues (1000 by
default), so a scrape of a root of 40,000 queues stays a few hundred series; everything else
is per broker, topic and consumer.

Each scrape reads the files afresh through :class:`~rocketstore.pipeline.tools.storestats.StoreStats`
(its caches and their freshness are described there) and computes lag with the functions
``rocketstore lag`` uses (:mod:`rocketstore.pipeline.tools.lag`), so PromQL's lag is the command's.
Reads only: no store is locked or written. With the tier on, each broker's ``rocketstore_tier_*``
families come from its files and its tier record
(:func:`rocketstore.pipeline.tier.backlog.recorded_backlog`): no request to the bucket, and
with the tier off nothing of the tier is imported.

Thread-safety: :meth:`StoreCollector.collect` may be called from several threads; scrapes
run one at a time (a lock), so two scrapes at once cost one scrape's work twice in a row,
not in parallel.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.groups import ConsumerOffsets, broker_offsets
from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.errors import StoreError
from rocketstore.pipeline.tools.lag import (
    BrokerBounds,
    CommittedOffsets,
    QueueLag,
    consumer_lag,
    group_lag,
    read_committed_offsets,
)
from rocketstore.pipeline.tools.metricfamilies import Families
from rocketstore.pipeline.tools.storestats import BrokerStats, StoreStats

DEFAULT_PER_QUEUE_LIMIT = 1000
HOUR_S = 3600
# (latency family, consumer group or query, topic, broker) -> the CommitLog offset of the first
# stored message it has not consumed there (None: not found), for StoreCollector._ages.
_Ages = dict[tuple[str, str, str, str], int | None]


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    """The last verify run, as the console's health page knows it: ``problems`` per broker,
    ``finished`` in seconds since the epoch (``None`` while the first run lasts)."""

    running: bool
    finished: float | None
    problems: dict[str, int]


@dataclasses.dataclass(frozen=True)
class Target:
    """What to export: a store root (or one store directory), the settings to read it with,
    Spark checkpoints by query name, and the per-queue series limit."""

    root: Path
    config: StoreConfig
    checkpoints: tuple[tuple[str, Path], ...] = ()
    per_queue_limit: int = DEFAULT_PER_QUEUE_LIMIT


def _bounds_reader(stats: dict[str, BrokerStats]) -> Callable[[str, Path], BrokerBounds]:
    def read(name: str, path: Path) -> BrokerBounds:
        found = stats.get(name)
        if found is None:
            raise StoreError(f"{path}: the broker could not be read at this scrape")
        return found.bounds

    return read


class StoreCollector(Collector):
    """A ``prometheus_client`` collector of one :class:`Target`. ``verify`` returns the last
    verify run (the console's), or ``None`` when there is none; ``clock_ms`` is wall time."""

    def __init__(
        self,
        target: Target,
        stats: StoreStats | None = None,
        *,
        verify: Callable[[], VerifyResult | None] | None = None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.target = target
        self.stats = stats or StoreStats(target.config)
        self.verify = verify
        self.clock_ms = clock_ms
        self._lock = threading.Lock()
        self.per_queue: bool | None = None  # None: by the limit; True/False: forced

    def collect(self) -> Iterable[Metric]:
        return self.scrape()

    def scrape(
        self, names: frozenset[str] | None = None, per_queue: bool | None = None
    ) -> list[Metric]:
        """Every family (or those of ``names``); ``per_queue`` overrides the limit."""
        with self._lock:
            started = time.perf_counter()
            out = Families(names)
            self._collect(out, per_queue)
            out.add("rocketstore_scrape_duration_seconds", (), time.perf_counter() - started)
            return list(out)

    def _collect(self, out: Families, per_queue: bool | None) -> None:
        target = self.target
        cfg = target.config
        stats: dict[str, BrokerStats] = {}
        for name, path in StoreRoot(target.root).brokers():
            if not (path / "commitlog").is_dir():
                continue
            try:
                stats[name] = self.stats.broker(name, path)
            except (StoreError, OSError):
                out.add("rocketstore_broker_up", (name,), 0)
        queues = sum(len(s.bounds) for s in stats.values())
        if per_queue is None:
            per_queue = queues <= target.per_queue_limit
        out.add("rocketstore_per_queue_series", (), 1 if per_queue else 0)
        out.add("rocketstore_retention_seconds", (), cfg.file_reserved_time * HOUR_S)
        groups, queries = self._committed()
        for name in _stale_opens(stats, groups, queries):
            # A consumer committed past the queue's end as a cached open saw it: the cache
            # is older than the offsets, so open the store again rather than show a lag < 0.
            self.stats.forget_open(stats[name].path)
            stats[name] = self.stats.broker(name, stats[name].path)
        for s in stats.values():
            self._broker(out, s, per_queue)
            if cfg.tier_on:
                self._tier(out, s)
        read = _bounds_reader(stats)
        ages: _Ages = {}
        self._groups(out, read, stats, per_queue, ages, groups)
        self._queries(out, read, stats, per_queue, ages, queries)
        self._ages(out, ages, stats)
        self._verify(out)

    def _broker(self, out: Families, s: BrokerStats, per_queue: bool) -> None:
        b = s.name
        cfg = self.target.config
        out.add("rocketstore_broker_up", (b,), 1)
        out.add("rocketstore_broker_info", (b, s.source), 1)
        topics: dict[str, list[tuple[int, int]]] = {}
        for (topic, qid), (low, high) in sorted(s.bounds.items()):
            topics.setdefault(topic, []).append((low, high))
            if per_queue:
                out.add("rocketstore_queue_min_offset", (b, topic, str(qid)), low)
                out.add("rocketstore_queue_max_offset", (b, topic, str(qid)), high)
        for topic, pairs in topics.items():
            out.add("rocketmq_messages_in", (b, topic), sum(h for _, h in pairs))
            out.add("rocketstore_messages", (b, topic), sum(h - lo for lo, h in pairs))
            out.add("rocketstore_queues", (b, topic), len(pairs))
        out.add("rocketmq_throughput_in", (b,), s.commitlog_end)
        out.add("rocketstore_commitlog_min_offset_bytes", (b,), s.commitlog_min)
        out.add("rocketstore_commitlog_files", (b,), s.commitlog_files)
        out.add("rocketstore_commitlog_size_bytes", (b,), s.commitlog_bytes)
        out.add(
            "rocketstore_commitlog_files_deleted",
            (b,),
            s.commitlog_min // cfg.mapped_file_size_commitlog,
        )
        for name, ms in (
            ("rocketstore_oldest_message_timestamp_seconds", s.oldest_ms),
            ("rocketstore_newest_message_timestamp_seconds", s.newest_ms),
            ("rocketstore_last_flush_timestamp_seconds", s.last_flush_ms),
        ):
            if ms is not None and ms > 0:
                out.add(name, (b,), ms / 1000)
        out.add("rocketstore_disk_used_ratio", (b,), s.disk_used_ratio)
        out.add("rocketstore_disk_max_used_ratio", (b,), cfg.disk_max_used_space_ratio / 100)
        out.add("rocketstore_disk_size_bytes", (b,), s.disk_total_bytes)
        out.add("rocketstore_disk_free_bytes", (b,), s.disk_free_bytes)
        w = s.writer
        out.add("rocketstore_writer_locked", (b,), 1 if w.locked else 0)
        out.add("rocketstore_abort_file", (b,), 1 if w.abort else 0)
        if w.epoch is not None:
            out.add("rocketstore_writer_epoch", (b,), w.epoch)
        out.add("rocketstore_writer_unclean_takeovers", (b,), w.unclean_takeovers)

    def _tier(self, out: Families, s: BrokerStats) -> None:
        """The broker's tiers, from its files and its tier record: no request to the bucket
        (what the bucket holds is what the uploader recorded)."""
        # Here, not at the top: with the tier off nothing of it is imported.
        from rocketstore.pipeline.tier.backlog import recorded_backlog
        from rocketstore.pipeline.tier.localstate import TierState

        b = s.name
        try:
            local, record = recorded_backlog(s.path, self.target.config, self.clock_ms())
        except (StoreError, OSError):
            out.add("rocketstore_tier_up", (b,), 0)
            return
        out.add("rocketstore_tier_up", (b,), 1)
        # Never uploaded: the bucket holds nothing of it and no upload has failed.
        rec = record if record is not None else TierState("")
        for tier, segments, size in (
            ("local", len(local.local), local.local_bytes),
            ("bucket", rec.bucket_segments, rec.bucket_bytes),
        ):
            out.add("rocketstore_tier_segments", (b, tier), segments)
            out.add("rocketstore_tier_bytes", (b, tier), size)
        out.add("rocketstore_tier_pending_segments", (b,), len(local.pending))
        out.add("rocketstore_tier_pending_bytes", (b,), local.pending_bytes)
        out.add("rocketstore_tier_upload_lag_seconds", (b,), local.lag_s)
        out.add("rocketstore_tier_uploaded_offset_bytes", (b,), rec.uploaded_end)
        out.add("rocketstore_tier_upload_errors", (b,), rec.upload_errors)
        for name, ms in (
            ("rocketstore_tier_last_upload_timestamp_seconds", rec.last_upload_ms),
            ("rocketstore_tier_last_error_timestamp_seconds", rec.last_error_ms),
        ):
            if ms > 0:
                out.add(name, (b,), ms / 1000)

    def _lag(
        self,
        out: Families,
        kind: str,
        who: str,
        rows: Sequence[QueueLag],
        stats: dict[str, BrokerStats],
        per_queue: bool,
        ages: _Ages,
    ) -> None:
        """Lag per (topic, broker), and per queue when ``per_queue``; ``kind`` is ``consumer``
        (a group) or ``query``. Where each lag's oldest message is goes into ``ages``."""
        total, latency, queue_family = (
            (
                "rocketmq_consumer_lag_messages",
                "rocketmq_consumer_lag_latency",
                "rocketstore_consumer_queue_lag_messages",
            )
            if kind == "consumer"
            else (
                "rocketstore_query_lag_messages",
                "rocketstore_query_lag_latency",
                "rocketstore_query_queue_lag_messages",
            )
        )
        sums: dict[tuple[str, str], int] = {}
        first: dict[tuple[str, str], int] = {}
        for r in rows:
            if r.lag is None:
                continue  # a queue the store no longer has
            key = (r.topic, r.broker)
            sums[key] = sums.get(key, 0) + r.lag
            if per_queue:
                out.add(queue_family, (who, r.topic, r.broker, str(r.queue_id)), r.lag)
            s = stats.get(r.broker)
            if r.lag > 0 and s is not None:
                start = r.committed if r.committed is not None else r.min_offset or 0
                start = max(start, r.min_offset or 0)
                phys = self.stats.unit_offset(s.path, r.topic, r.queue_id, start)
                if phys is not None and (key not in first or phys < first[key]):
                    first[key] = phys
        for key, value in sums.items():
            out.add(total, (who, *key), value)
            ages[(latency, who, *key)] = first.get(key)

    def _ages(self, out: Families, ages: _Ages, stats: dict[str, BrokerStats]) -> None:
        """The lag latencies: the age of the first stored of the messages each consumer has not
        consumed on a topic and broker, by the CommitLog offset of the first unconsumed
        message of each of its queues. Each broker's records are read in one go (a segment is
        opened once); an age that cannot be read (no lag, or its message just deleted by
        retention) is 0."""
        wanted: dict[str, set[int]] = {}
        for (_, _, _, broker), phys in ages.items():
            if phys is not None:
                wanted.setdefault(broker, set()).add(phys)
        times = {b: self.stats.record_times(stats[b].path, offs) for b, offs in wanted.items()}
        now = self.clock_ms()
        for (family, who, topic, broker), phys in ages.items():
            at = None if phys is None else times[broker].get(phys)
            out.add(family, (who, topic, broker), 0 if at is None else max(0, now - at))

    def _groups(
        self,
        out: Families,
        read: Callable[[str, Path], BrokerBounds],
        stats: dict[str, BrokerStats],
        per_queue: bool,
        ages: _Ages,
        offsets: dict[str, ConsumerOffsets] | None,
    ) -> None:
        try:
            if offsets is None:
                raise StoreError("a consumerOffset.json could not be read")
            groups = group_lag(
                self.target.root, self.target.config, brokers=offsets, read_bounds=read
            )
        except (StoreError, OSError):
            out.add("rocketstore_consumer_offsets_up", (), 0)
            return
        out.add("rocketstore_consumer_offsets_up", (), 1)
        for g in groups:
            self._lag(out, "consumer", g.group, g.queues, stats, per_queue, ages)

    def _queries(
        self,
        out: Families,
        read: Callable[[str, Path], BrokerBounds],
        stats: dict[str, BrokerStats],
        per_queue: bool,
        ages: _Ages,
        committed: dict[str, CommittedOffsets | None],
    ) -> None:
        for name, _ in self.target.checkpoints:
            try:
                progress = committed[name]
                if progress is None:
                    raise StoreError(f"the checkpoint of query {name} could not be read")
                rows = (
                    consumer_lag(
                        self.target.root, progress.offsets, self.target.config, read_bounds=read
                    )
                    if progress.offsets
                    else []
                )
            except (StoreError, OSError):
                out.add("rocketstore_query_up", (name,), 0)
                continue
            out.add("rocketstore_query_up", (name,), 1)
            batch = -1 if progress.batch_id is None else progress.batch_id
            out.add("rocketstore_query_committed_batch", (name,), batch)
            self._lag(out, "query", name, rows, stats, per_queue, ages)

    def _committed(
        self,
    ) -> tuple[dict[str, ConsumerOffsets] | None, dict[str, CommittedOffsets | None]]:
        """The groups' offsets by broker and each query's last committed offsets, read once
        per scrape; ``None`` where they could not be read."""
        groups: dict[str, ConsumerOffsets] | None
        try:
            groups = broker_offsets(self.target.root)
        except (StoreError, OSError):
            groups = None
        queries: dict[str, CommittedOffsets | None] = {}
        for name, checkpoint in self.target.checkpoints:
            try:
                queries[name] = read_committed_offsets(checkpoint)
            except (StoreError, OSError):
                queries[name] = None
        return groups, queries

    def _verify(self, out: Families) -> None:
        if self.verify is None:
            return
        found = self.verify()
        if found is None:
            return
        out.add("rocketstore_verify_running", (), 1 if found.running else 0)
        for broker, problems in found.problems.items():
            _verified(out, broker, problems, found.finished)


def _verified(out: Families, broker: str, problems: int, finished: float | None) -> None:
    if finished is not None:
        out.add("rocketstore_verify_last_run_timestamp_seconds", (broker,), finished)
    out.add("rocketstore_verify_ok", (broker,), 0 if problems else 1)
    out.add("rocketstore_verify_problems", (broker,), problems)


class Fixed(Collector):
    """Families made beforehand (one scrape's, a verify result), for an encoder."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def write_verify_textfile(path: Path, broker: str, problems: int) -> None:
    """The result of ``rocketstore verify`` of one store directory (``broker``), ended now, as
    the families the console exports for its verify runs, in Prometheus' text format: for
    node_exporter's textfile collector (one file per store directory; the collector merges
    them). Replaced atomically (``prometheus_client.write_to_textfile``: a temporary file
    beside it, then a rename), so a scrape never reads half of it."""
    from prometheus_client import CollectorRegistry, write_to_textfile

    out = Families(None)
    _verified(out, broker, problems, time.time())
    registry = CollectorRegistry()
    registry.register(Fixed(out))
    write_to_textfile(str(path), registry)


def _stale_opens(
    stats: dict[str, BrokerStats],
    groups: dict[str, ConsumerOffsets] | None,
    queries: dict[str, CommittedOffsets | None],
) -> set[str]:
    """Brokers whose bounds come from a cached read-only open that a committed offset has
    passed (a group's or a query's offset above the queue's max offset, or on a queue the
    open did not see)."""
    committed: list[tuple[str, str, int, int]] = []
    for broker, offsets in (groups or {}).items():
        for by_topic in offsets.table.values():
            for topic, queues in by_topic.items():
                committed += [(broker, topic, q, at) for q, at in queues.items()]
    for progress in queries.values():
        if progress is not None:
            committed += [(b, t, q, at) for (t, b, q), at in progress.offsets.items()]
    return {
        broker
        for broker, topic, qid, at in committed
        if broker in stats
        and stats[broker].source == "open"
        and at > stats[broker].bounds.get((topic, qid), (0, 0))[1]
    }


def query_names(checkpoints: Sequence[str | Path]) -> tuple[tuple[str, Path], ...]:
    """``(query label, directory)`` for checkpoint arguments: ``NAME=DIR`` names the query,
    a bare ``DIR`` is named by its path as given."""
    out: list[tuple[str, Path]] = []
    for item in checkpoints:
        text = str(item)
        name, sep, rest = text.partition("=")
        if sep and name and "/" not in name:
            out.append((name, Path(rest)))
        else:
            out.append((text, Path(text)))
    return tuple(out)
