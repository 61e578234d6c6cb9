"""The demo's summary: what the run did, read back from the store, the exported files and the
queries' progress, and whether every order is in the store once and in the export once.

Runs on the driver once the demo's queries stopped (:mod:`rocketstore.jobs.demo`); opens the
store read-only.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rocketstore.pipeline.tools.output import format_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from rocketstore.jobs.demo_files import Paths


def say(text: str = "") -> None:
    print(text, flush=True)


def _cell(v: object) -> str:
    """A summary cell: numbers with thousands separators, ``-`` for nothing."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.2f}"
    return str(v)


def table(header: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> str:
    """An aligned text table (the command line's layout), numbers with thousands separators."""
    return format_table(header, rows, cell=_cell, indent=indent)


def store_queues(paths: Paths, config: Any) -> list[tuple[str, str, int, int, int]]:
    """(topic, broker, queueId, minOffset, maxOffset) of every queue in the store."""
    from rocketstore.pipeline.engine.root import StoreRoot
    from rocketstore.pipeline.engine.store import MessageStore

    out = []
    for name, path in StoreRoot(paths.store).brokers():
        with MessageStore(path, config, read_only=True) as store:
            out += [
                (i.topic, name, i.queue_id, i.min_offset, i.max_offset) for i in store.queue_infos()
            ]
    return sorted(out)


def batch_stats(query: StreamingQuery | None) -> tuple[int, int, float]:
    """Micro-batches with input, rows, and seconds spent running them."""
    if query is None:
        return 0, 0, 0.0
    busy = [p for p in query.recentProgress if int(p.numInputRows) > 0]
    rows = sum(int(p.numInputRows) for p in busy)
    seconds = sum(int(p.durationMs.get("triggerExecution", 0)) for p in busy) / 1000
    return len(busy), rows, seconds


def percentiles(frame: Any, column: str) -> tuple[int, int, int, int, int]:
    """(count, p50, p90, p99, max) of an integer column, exact."""
    from pyspark.sql import functions as F

    row = frame.agg(
        F.count(column).alias("n"),
        F.percentile(column, [0.5, 0.9, 0.99]).alias("p"),
        F.max(column).alias("top"),
    ).first()
    if row is None or not row["n"]:
        return 0, 0, 0, 0, 0
    p50, p90, p99 = (int(v) for v in row["p"])
    return int(row["n"]), p50, p90, p99, int(row["top"])


def rate(count: float, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s" if seconds > 0 else "-"


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the run itself knows, beside what is in the store and the files."""

    orders: int
    files: int
    lag_at_stop: int | None
    warm_at: float | None  # epoch seconds
    store_config: str
    order_types: tuple[str, ...]  # what the generator draws from: one window row each
    appended_bytes: int  # CommitLog bytes the ingest appended
    # (query label, micro-batches with input, messages, seconds running them) per query
    throughput: tuple[tuple[str, int, int, float], ...]


def summary(spark: SparkSession, paths: Paths, config: Any, args: argparse.Namespace,
            facts: RunFacts) -> int:  # fmt: skip
    """Print the summary of a run; 0 when every order is in the store once and in the export
    once, else 1."""
    say("== Summary " + "=" * 68)
    say(
        f"{facts.orders:,} orders generated in {facts.files} files over {facts.files} s "
        f"(a warm-up, then {args.seconds} s)"
    )
    stored = _messages(paths, config)
    exported = spark.read.parquet(str(paths.export_orders))
    ok = _exactly_once(exported, stored, facts)
    _throughput(stored, facts)
    _latency(exported, facts)
    _lag(paths, config, facts)
    _windows(spark, paths, facts)
    _where(paths, facts)
    return 0 if ok else 1


def _messages(paths: Paths, config: Any) -> int:
    """Messages per topic and queue, from the store itself; returns how many ``orders`` holds."""
    queues = store_queues(paths, config)
    say(f"\nMessages per topic and queue ({paths.store}):")
    say(table(("topic", "broker", "queue", "messages", "maxOffset"),
              [(t, b, q, hi - lo, hi) for t, b, q, lo, hi in queues]))  # fmt: skip
    per_topic: dict[str, int] = {}
    for t, _, _, lo, hi in queues:
        per_topic[t] = per_topic.get(t, 0) + hi - lo
    say("  " + ", ".join(f"{t}: {n:,} messages" for t, n in sorted(per_topic.items())))
    return per_topic.get("orders", 0)


def _exactly_once(exported: DataFrame, stored: int, facts: RunFacts) -> bool:
    """Whether every generated order is in the store once and in the export once (says so)."""
    from pyspark.sql import functions as F

    counts = exported.agg(
        F.count("*").alias("rows"), F.countDistinct("orderId").alias("orders")
    ).first()
    rows, distinct = (int(counts["rows"]), int(counts["orders"])) if counts else (0, 0)
    if stored == facts.orders and rows == distinct == facts.orders:
        say(f"  every order is in the store once and in the export once ({rows:,})")
        return True
    say(
        f"  MISMATCH: {facts.orders:,} generated, {stored:,} stored, {rows:,} exported "
        f"rows holding {distinct:,} distinct orders"
    )
    return False


def _throughput(stored: int, facts: RunFacts) -> None:
    say("\nThroughput:")
    rows = [(label, batches, n, rate(n, busy)) for label, batches, n, busy in facts.throughput]
    say(table(("query", "micro-batches", "messages", "while running"), rows))
    say(
        f"  the store took {stored:,} orders ({facts.appended_bytes / 1e6:,.1f} MB of CommitLog) "
        f"in {facts.files} s: {rate(stored, facts.files)} sustained, at the generator's pace"
    )


def _latency(exported: DataFrame, facts: RunFacts) -> None:
    """End-to-end latency percentiles from each order's event time."""
    from pyspark.sql import functions as F

    say("\nEnd-to-end latency from an order's event time, ms:")
    stamped = exported.select(
        F.col("eventTime"),
        (F.unix_millis("storeTimestamp") - F.unix_millis("eventTime")).alias("stored"),
        (F.unix_millis("exportedAt") - F.unix_millis("eventTime")).alias("exported"),
    )
    groups = [("all orders", stamped)]
    if facts.warm_at is not None:
        warm = dt.datetime.fromtimestamp(facts.warm_at, dt.UTC)
        groups.append(("after warm-up", stamped.where(F.col("eventTime") >= F.lit(warm))))
    latency_rows = []
    for label, frame in groups:
        for column in ("stored", "exported"):
            n, p50, p90, p99, top = percentiles(frame, column)
            if n:
                latency_rows.append((f"{label}: {column}", n, p50, p90, p99, top))
    if latency_rows:
        say(table(("orders, until", "orders", "p50", "p90", "p99", "max"), latency_rows))
        say(
            "  stored = storeTimestamp, exported = exportedAt (the export's micro-batch time);"
            "\n  orders reach the ingest as one file a second, and each query runs every 2-5 s;"
            "\n  warm-up: until every query had run a micro-batch and worked off the backlog"
        )


def _lag(paths: Paths, config: Any, facts: RunFacts) -> None:
    """Consumer lag of the export, as ``rocketstore lag`` shows it."""
    from rocketstore.pipeline.tools.lag import consumer_lag, read_committed_offsets

    say("\nConsumer lag of the orders export (its checkpoint against the store):")
    progress = read_committed_offsets(paths.checkpoints / "export-orders")
    lags = consumer_lag(paths.store, progress.offsets, config, ["orders"])
    say(table(
        ("topic", "broker", "queue", "committedOffset", "maxOffset", "lag"),
        [(r.topic, r.broker, r.queue_id, r.committed, r.max_offset, r.lag) for r in lags],
    ))  # fmt: skip
    total = sum(r.lag or 0 for r in lags)
    at_stop = "-" if facts.lag_at_stop is None else f"{facts.lag_at_stop:,}"
    say(f"  lag when the generator stopped: {at_stop} messages; after draining: {total:,}")


def _windows(spark: SparkSession, paths: Paths, facts: RunFacts) -> None:
    """The windows the processing query closed."""
    from pyspark.sql import functions as F

    # A micro-batch that closed no window leaves an empty file, which has no schema to infer.
    stats_files = [str(f) for f in paths.export_stats.glob("part-*.json") if f.stat().st_size]
    if not stats_files:
        say("\nNo window was closed by the watermark yet (run longer with --seconds).")
        return
    stats = spark.read.json(stats_files)
    windows = stats.select("windowStart").distinct().count()
    say(f"\n10-second windows closed by the watermark: {windows} (topic order-stats); the last:")
    last = stats.orderBy(F.col("windowStart").desc(), "orderType").limit(len(facts.order_types))
    say(table(
        ("windowStart", "orderType", "orders", "revenue", "customers"),
        [(r["windowStart"], r["orderType"], int(r["orders"]), float(r["revenue"]),
          int(r["customers"])) for r in last.collect()],
    ))  # fmt: skip


def _where(paths: Paths, facts: RunFacts) -> None:
    say("\nWhere things are:")
    say(table(("what", "path"), [
        ("incoming order files", paths.incoming),
        ("store root", paths.store),
        ("orders export (parquet)", paths.export_orders),
        ("order-stats export (JSON)", paths.export_stats),
        ("checkpoints", paths.checkpoints),
    ]))  # fmt: skip
    relative = os.path.relpath(facts.store_config)
    cfg = shlex.quote(facts.store_config if relative.startswith("..") else relative)
    say("  look inside:")
    say(f"    rocketstore queues {paths.store}/broker-0 --config {cfg}")
    say(f"    rocketstore query-key {paths.store}/broker-0 --topic orders --key customer-0001 "
        f"--config {cfg}")  # fmt: skip
    say(f"    rocketstore lag {paths.store} --checkpoint {paths.checkpoints}/export-orders "
        f"--config {cfg}")  # fmt: skip
