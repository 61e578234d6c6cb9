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

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message
from tests.kit.consolekit import SMALL, SMALL_TOML, make_root
from tests.kit.promkit import (
    PROMETHEUS_MARKS,
    Exporter,
    Prometheus,
    Writer,
    assert_promql_is_the_commands,
    fast_rules,
)

pytestmark = PROMETHEUS_MARKS
FAST = {"10m": "5s", "15m": "5s", "2h": "30s", "1h": "30s", "5m": "3s"}
LAG_FOR = "3s"


def rules() -> dict[str, Any]:
    found = fast_rules(FAST)
    for group in found["groups"]:
        for rule in group["rules"]:
            if rule.get("alert", "").endswith("LagGrowing"):
                rule["for"] = LAG_FOR
    return found


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


@pytest.mark.slow
def test_alert_fires_for_a_stopped_query_and_resolves_when_it_catches_up(
    spark: Any, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    StoreRoot(root).ensure_topic("events", TopicMeta(2, 2))
    conf = tmp_path / "small.toml"
    conf.write_text(SMALL_TOML)
    writer = Writer(
        root,
        2,
        SMALL,
        0.2,
        lambda: [Message("events", b"event", queue_id=q) for q in range(2) for _ in range(5)],
    )
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
