"""A real Prometheus scraping ``rocketstore exporter`` on loopback every second.

* PromQL through Prometheus' HTTP API returns the lag ``rocketstore lag --json`` prints, queue
  by queue, for every consumer group and Spark query, and the bounds ``rocketstore queues``
  prints, once the store stands still and Prometheus has scraped it since.
* With a Spark query reading a topic while a writer appends to it, the project's alert rule
  (its windows cut to seconds) fires once the query is stopped while messages keep arriving,
  and resolves once the restarted query has caught up.

Skipped without Debian's ``prometheus`` package. Polls with deadlines; nothing waits for a
fixed time.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from consolekit import SMALL, SMALL_TOML, make_root
from promkit import PROMETHEUS, SKIP_REASON, Exporter, Prometheus, fast_rules

from rocketstore.pipeline import cli
from rocketstore.pipeline.message import Message
from rocketstore.pipeline.root import StoreRoot, TopicMeta
from rocketstore.pipeline.store import MessageStore

pytestmark = [
    pytest.mark.skipif(PROMETHEUS is None, reason=SKIP_REASON),
    pytest.mark.xdist_group("prometheus"),
]
FAST = {"10m": "5s", "15m": "5s", "2h": "30s", "1h": "30s", "5m": "3s"}
LAG_FOR = "3s"


def cli_json(*argv: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def rules() -> dict[str, Any]:
    found = fast_rules(FAST)
    for group in found["groups"]:
        for rule in group["rules"]:
            if rule.get("alert", "").endswith("LagGrowing"):
                rule["for"] = LAG_FOR
    return found


def assert_promql_is_the_commands(
    prom: Prometheus, root: Path, conf: Path, checkpoints: dict[str, Path]
) -> int:
    """Compare every per-queue lag and bound with what the commands print; returns the
    number of queue lags compared."""
    query_rows: dict[tuple[str, ...], float] = {}
    for name, checkpoint in checkpoints.items():
        for r in cli_json(
            "lag", str(root), "--checkpoint", str(checkpoint), "--json", "--config", str(conf)
        ):
            if "batchId" in r:
                query_rows[(name, r["topic"], r["brokerName"], str(r["queueId"]))] = r["lag"]
    group_rows = {
        (r["group"], r["topic"], r["brokerName"], str(r["queueId"])): r["lag"]
        for r in cli_json("lag", str(root), "--json", "--config", str(conf))
    }

    def keyed(expr: str, *names: str) -> dict[tuple[str, ...], float]:
        return {tuple(dict(k)[n] for n in names): v for k, v in prom.query(expr).items()}

    assert (
        keyed("rocketstore_query_queue_lag_messages", "query", "topic", "broker", "queue_id")
        == query_rows
    )
    assert (
        keyed(
            "rocketstore_consumer_queue_lag_messages",
            "consumer_group",
            "topic",
            "broker",
            "queue_id",
        )
        == group_rows
    )
    totals: dict[tuple[str, ...], float] = {}
    for (g, t, _, _), lag in group_rows.items():
        totals[(g, t)] = totals.get((g, t), 0) + lag
    assert (
        keyed(
            "sum by (consumer_group, topic) (rocketmq_consumer_lag_messages)",
            "consumer_group",
            "topic",
        )
        == totals
    )
    for broker, path in StoreRoot(root).brokers():
        rows = cli_json("queues", str(path), "--json", "--config", str(conf))
        low = keyed(f'rocketstore_queue_min_offset{{broker="{broker}"}}', "topic", "queue_id")
        high = keyed(f'rocketstore_queue_max_offset{{broker="{broker}"}}', "topic", "queue_id")
        assert {
            (r["topic"], str(r["queueId"])): (r["minOffset"], r["maxOffset"]) for r in rows
        } == {k: (low[k], high[k]) for k in high}
    return len(query_rows) + len(group_rows)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Path, Prometheus]]:
    root, checkpoint = make_root(tmp_path)
    conf = tmp_path / "small.toml"
    exporter = Exporter([str(root), "--checkpoint", f"reader={checkpoint}", "--config", str(conf)])
    try:
        prom = Prometheus(tmp_path / "prometheus", [exporter.address], rules())
        try:
            yield root, checkpoint, prom
        finally:
            prom.stop()
    finally:
        exporter.stop()


def test_promql_lag_and_bounds_equal_the_commands(served: tuple[Path, Path, Prometheus]) -> None:
    root, checkpoint, prom = served
    start = time.time()
    prom.scraped_after(start)
    compared = assert_promql_is_the_commands(
        prom, root, root.parent / "small.toml", {"reader": checkpoint}
    )
    assert compared == 8
    # A scrape appends to the root: Prometheus sees the new messages.
    with MessageStore(root / "broker-1", SMALL) as store:
        store.put_batch([Message("orders", b"more", queue_id=1) for _ in range(7)])
    prom.scraped_after(time.time())
    assert_promql_is_the_commands(prom, root, root.parent / "small.toml", {"reader": checkpoint})


class Writer:
    """Appends ``batch`` messages to every queue of ``topic`` on each broker of ``root`` every
    0.2 s until stopped, each broker's store held open (its background flush publishes)."""

    def __init__(self, root: Path, topic: str, brokers: int, queues: int, batch: int = 5) -> None:
        self.stores = [MessageStore(root / f"broker-{b}", SMALL) for b in range(brokers)]
        self.topic, self.queues, self.batch = topic, queues, batch
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop_event.wait(0.2):
                for store in self.stores:
                    store.put_batch(
                        [
                            Message(self.topic, b"event", queue_id=q)
                            for q in range(self.queues)
                            for _ in range(self.batch)
                        ]
                    )
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)
        for store in self.stores:
            store.close()
        assert self.error is None, self.error


@pytest.mark.slow
def test_alert_fires_for_a_stopped_query_and_resolves_when_it_catches_up(
    spark: Any, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    StoreRoot(root).ensure_topic("events", TopicMeta(2, 2))
    conf = tmp_path / "small.toml"
    conf.write_text(SMALL_TOML)
    writer = Writer(root, "events", 2, 2)
    (root / "broker-0" / "config").mkdir(exist_ok=True)
    (root / "broker-0" / "config" / "consumerOffset.json").write_text(
        json.dumps({"offsetTable": {"events@billing": {"0": 3, "1": 0}}})
    )
    checkpoint = tmp_path / "ingest-ck"
    checkpoint.mkdir()  # the exporter refuses a checkpoint that is not there (a typo)

    def start_query() -> Any:
        return (
            spark.readStream.format("rocketstore")
            .option("path", str(root))
            .option("topic", "events")
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="500 milliseconds")
            .start()
        )

    exporter = Exporter([str(root), "--checkpoint", f"ingest={checkpoint}", "--config", str(conf)])
    prom: Prometheus | None = None
    query = None
    try:
        prom = Prometheus(tmp_path / "prometheus", [exporter.address], rules())
        query = start_query()
        prom.wait_for(
            "the query's first batches scraped",
            lambda: prom.query('rocketstore_query_committed_batch{query="ingest"} >= 1'),
            180,
        )
        query.stop()
        prom.wait_for(
            "RocketstoreQueryLagGrowing firing while the query is stopped",
            lambda: "firing" in prom.alerts("RocketstoreQueryLagGrowing"),
        )
        behind = sum(prom.query('rocketstore_query_lag_messages{query="ingest"}').values())
        assert behind > 0
        query = start_query()  # the same checkpoint: it goes on where it stopped
        prom.wait_for(
            "RocketstoreQueryLagGrowing resolved once the query caught up",
            lambda: "firing" not in prom.alerts("RocketstoreQueryLagGrowing"),
        )
        caught_up = sum(prom.query('rocketstore_query_lag_messages{query="ingest"}').values())
        assert caught_up < behind
        # The group never consumes: its alert fires too.
        assert "firing" in prom.alerts("RocketstoreConsumerLagGrowing")
        writer.stop()
        query.processAllAvailable()
        query.stop()
        # Messages the stopped query has not read, so that its lag is not 0 when compared.
        with MessageStore(root / "broker-1", SMALL) as store:
            store.put_batch([Message("events", b"late", queue_id=0) for _ in range(11)])
        prom.scraped_after(time.time())
        assert_promql_is_the_commands(prom, root, conf, {"ingest": checkpoint})
        assert sum(prom.query('rocketstore_query_lag_messages{query="ingest"}').values()) == 11
    finally:
        if query is not None and query.isActive:
            query.stop()
        if not writer.stop_event.is_set():
            writer.stop()
        if prom is not None:
            prom.stop()
        exporter.stop()
