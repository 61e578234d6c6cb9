"""The live run behind the dashboard picture (:mod:`bench.dashboard`): a store with a writer, a
Spark query and, when the stock RocketMQ 4.9.4 kit can run here, a stock consumer group, scraped
by ``rocketstore exporter`` into a real Prometheus (Debian's package, on loopback, every
second); at the end every panel's PromQL of conf/prometheus/rocketstore-dashboard.json is asked
of Prometheus' HTTP API over the whole run (``query_range``).

The run, over ``minutes`` (default 4), in fractions of it:

* a writer appends to ``orders`` (2 brokers x 2 queues) at 150 messages/s, 400/s from 0.40 to
  0.60, and to ``clicks`` at 80/s, with ~200-byte bodies, each broker's store held open;
* the Spark query ``ingest`` reads ``orders`` (processingTime 2 s, the noop sink); it is stopped
  at 0.45 and started again, on the same checkpoint, at 0.70;
* with the stock kit: a stock broker serves ``broker-2`` of the same root; the stock producer
  sends 100 ``payments`` messages every 10 s, and the consumer group ``billing``
  (tests/java/CommitConsume.java) reads and commits up to 30 per queue every 15 s, except from
  0.30 to 0.60.

The exporter and Prometheus are the tests' (tests/kit/promkit.py), the stock servers too
(tests/kit/stockrocketmq.py). Nothing here is timed: the figures are whatever the run produced.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import PROJECT_DIR, log

DASHBOARD = PROJECT_DIR / "conf" / "prometheus" / "rocketstore-dashboard.json"
RULES = PROJECT_DIR / "conf" / "prometheus" / "rocketstore-rules.yml"
# RocketMQ's own file sizes (1 GiB CommitLog segments, created sparse): the exporter reads every
# broker of the root with one geometry, and the stock broker keeps its defaults.
STORE_TOML = "mappedFileSizeCommitLog = 1073741824\nmappedFileSizeConsumeQueue = 6000000\n"
STEP_S = 2
# Grafana's $__rate_interval with a 1 s scrape interval and a 2 s step: at least four scrapes.
RATE_INTERVAL = "8s"
ORDERS_QUEUES = 2
BROKERS = 2


def orders_rate(f: float) -> int:
    return 400 if 0.40 <= f < 0.60 else 150


CLICKS_RATE = 80


def _batch(fraction: Callable[[], float]) -> Callable[[], list[Any]]:
    """Half a second of one broker's messages at the rates of this moment of the run."""
    from rocketstore.pipeline.format.message import Message

    body = b"x" * 200

    def batch() -> list[Any]:
        orders = orders_rate(fraction()) // 2 // BROKERS
        clicks = CLICKS_RATE // 2 // BROKERS
        return [Message("orders", body, queue_id=i % ORDERS_QUEUES) for i in range(orders)] + [
            Message("clicks", body, queue_id=i % 2) for i in range(clicks)
        ]

    return batch


class Query:
    """The Spark query ``ingest`` on ``orders``: started, stopped and started again."""

    def __init__(self, spark: Any, root: Path, checkpoint: Path) -> None:
        self.spark, self.root, self.checkpoint = spark, root, checkpoint
        self.query: Any = None

    def start(self) -> None:
        self.query = (
            self.spark.readStream.format("rocketstore")
            .option("path", str(self.root))
            .option("topic", "orders")
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(processingTime="2 seconds")
            .start()
        )

    def stop(self) -> None:
        if self.query is not None and self.query.isActive:
            self.query.stop()


class StockGroup:
    """A stock broker on ``root/broker-2``, its producer and the consumer group ``billing``,
    stepped by :meth:`tick` (each call runs the stock client programs once: a few seconds)."""

    def __init__(self, cluster: Any, classes: Path, root: Path) -> None:
        from tests.kit.stockrocketmq import BROKER_PORT, NAMESRV_PORT

        self.cluster, self.classes = cluster, classes
        self.broker = cluster.broker(root / "broker-2", BROKER_PORT)
        cluster.tool("createtopic.sh", str(NAMESRV_PORT), str(BROKER_PORT), "payments", "4")
        self.next_produce = 0.0
        self.next_consume = 0.0

    def tick(self, now: float, fraction: float) -> None:
        from tests.kit.stockrocketmq import NAMESRV_PORT, check_sent

        if now >= self.next_produce:
            self.next_produce = now + 10
            check_sent(self.cluster.tool("produce.sh", str(NAMESRV_PORT), "payments", "100"), 100)
        if now >= self.next_consume and not 0.30 <= fraction < 0.60:
            self.next_consume = now + 15
            take = ",".join(f"broker-2/{q}=30" for q in range(4))
            self.cluster.java(
                self.classes, "CommitConsume", self.cluster.namesrv, "payments", "billing", take
            )


@contextlib.contextmanager
def _stock(work: Path, root: Path) -> Iterator[StockGroup | None]:
    from tests.kit.stockrocketmq import (
        StockCluster,
        build_java,
        javac_unavailable,
        unavailable,
    )

    why = unavailable() or javac_unavailable()
    if why is not None:
        log(f"dashboard: no consumer group in this run: {why}")
        yield None
        return
    classes = build_java(PROJECT_DIR / "tests" / "java" / "CommitConsume.java", work / "classes")
    with StockCluster(work / "rmq-run") as cluster:
        yield StockGroup(cluster, classes, root)


def panel_queries(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Each panel's title, type, unit, grid position and targets, their PromQL with Grafana's
    variables replaced (every job; :data:`RATE_INTERVAL`)."""
    out = []
    for panel in dashboard["panels"]:
        targets = [
            {
                "expr": t["expr"].replace("$job", ".*").replace("$__rate_interval", RATE_INTERVAL),
                "legend": t.get("legendFormat", ""),
            }
            for t in panel.get("targets", [])
        ]
        out.append(
            {
                "title": panel["title"],
                "type": panel["type"],
                "unit": panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""),
                "grid": panel["gridPos"],
                "targets": targets,
            }
        )
    return out


def run(minutes: float, work: Path) -> dict[str, Any]:
    """Run the scenario in ``work``; the panels with every target's ``query_range`` result."""
    import yaml

    from bench.session import local_session
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
    from tests.kit.promkit import Exporter, Prometheus, Writer

    seconds = minutes * 60
    root = work / "root"
    conf = work / "store.toml"
    conf.write_text(STORE_TOML)
    config = StoreConfig.effective(conf)
    StoreRoot(root).ensure_topic("orders", TopicMeta(BROKERS, ORDERS_QUEUES))
    StoreRoot(root).ensure_topic("clicks", TopicMeta(BROKERS, 2))
    checkpoint = work / "ck-ingest"
    checkpoint.mkdir()
    spark, owned = local_session("rocketstore-dashboard")
    begun = time.time()

    def fraction() -> float:
        return (time.time() - begun) / seconds

    with _stock(work, root) as group:
        writer = Writer(root, BROKERS, config, 0.5, _batch(fraction))
        exporter = Exporter(
            [str(root), "--checkpoint", f"ingest={checkpoint}", "--config", str(conf)]
        )
        prom = Prometheus(
            work / "prometheus", [exporter.address], yaml.safe_load(RULES.read_text())
        )
        query = Query(spark, root, checkpoint)
        try:
            start = time.time()
            begun = start
            query.start()
            stopped = restarted = False
            while (now := time.time()) < start + seconds:
                f = fraction()
                if f >= 0.45 and not stopped:
                    log("dashboard: the query stops")
                    query.stop()
                    stopped = True
                if f >= 0.70 and not restarted:
                    log("dashboard: the query starts again")
                    query.start()
                    restarted = True
                if group is not None:
                    group.tick(now, f)
                time.sleep(0.5)  # the scenario's pace, not synchronisation
            end = time.time()
            panels = panel_queries(json.loads(DASHBOARD.read_text()))
            for panel in panels:
                for target in panel["targets"]:
                    target["result"] = prom.api(
                        "query_range",
                        query=target["expr"],
                        start=f"{start:.3f}",
                        end=f"{end:.3f}",
                        step=str(STEP_S),
                    )["result"]
        finally:
            query.stop()
            writer.stop()
            prom.stop()
            exporter.stop()
    if owned:
        spark.stop()
    return {
        "start": start,
        "end": end,
        "minutes": minutes,
        "consumer_group": group is not None,
        "panels": panels,
    }
