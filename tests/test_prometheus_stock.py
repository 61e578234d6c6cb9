"""A real Prometheus scraping ``rocketstore exporter`` over a root that stock RocketMQ 4.9.4
brokers serve (../shared/rocketmq-4.9.4, tests/kit/stockrocketmq.py), with a consumer group that a
stock Java client commits through them (tests/java/CommitConsume.java).

While the brokers run, PromQL's lag of the group reaches ``mqadmin consumerProgress``'s total
(the broker writes ``config/consumerOffset.json`` every 5 s; the exporter opens the stores it
has no progress file for, read-only); once they have stopped, PromQL's lag, queue by queue and
in total, and the queues' bounds equal ``rocketstore lag --json`` and ``rocketstore queues
--json`` on the files the brokers left.

Skipped without Debian's ``prometheus`` package, the stock kit (../shared), root with network
namespaces, or a JDK.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.kit.promkit import PROMETHEUS_MARKS, Exporter, Prometheus, assert_promql_is_the_commands
from tests.kit.stockrocketmq import (
    BROKER_PORT,
    NAMESRV_PORT,
    PORT_STEP,
    StockCluster,
    build_java,
    check_sent,
    javac_unavailable,
    unavailable,
)

pytestmark = [*PROMETHEUS_MARKS, pytest.mark.slow]
JAVA = Path(__file__).resolve().parent / "java"
# The stock broker's file sizes (broker.sh keeps RocketMQ's defaults).
STOCK_TOML = "mappedFileSizeCommitLog = 1073741824\nmappedFileSizeConsumeQueue = 6000000\n"
SENT = 120
# What the group reads and commits per queue; the other five queues it never commits.
TAKE = "broker-0/0=7,broker-0/2=1000,broker-1/1=13"


def test_a_stock_consumer_groups_lag_in_promql_is_rocketstore_lags(tmp_path: Path) -> None:
    why = unavailable() or javac_unavailable()
    if why is not None:
        pytest.skip(why)
    classes = build_java(JAVA / "CommitConsume.java", tmp_path / "classes")
    root = tmp_path / "root"
    conf = tmp_path / "stock.toml"
    conf.write_text(STOCK_TOML)
    exporter: Exporter | None = None
    prom: Prometheus | None = None
    try:
        with StockCluster(tmp_path / "rmq-run") as cluster:
            ports = [BROKER_PORT + PORT_STEP * i for i in range(2)]
            brokers = [cluster.broker(root / f"broker-{i}", p) for i, p in enumerate(ports)]
            for port in ports:
                cluster.tool("createtopic.sh", str(NAMESRV_PORT), str(port), "Orders", "4")
            check_sent(cluster.tool("produce.sh", str(NAMESRV_PORT), "Orders", str(SENT)), SENT)
            out = cluster.java(classes, "CommitConsume", cluster.namesrv, "Orders", "billing", TAKE)
            assert "COMMIT" in out
            _, diff_total = cluster.consumer_progress("billing")
            assert 0 < diff_total < SENT

            exporter = Exporter([str(root), "--config", str(conf)])
            prom = Prometheus(tmp_path / "prometheus", [exporter.address], {"groups": []})
            live = prom
            # The live brokers' stores: bounds from a read-only open, offsets from the file the
            # broker rewrites every 5 s.
            live.wait_for(
                "PromQL's lag of billing equal to consumerProgress's total on the live brokers",
                lambda: (
                    live.query('sum(rocketmq_consumer_lag_messages{consumer_group="billing"})')
                    == {(): float(diff_total)}
                ),
                60,
            )
            assert set(live.query("sum by (broker, bounds) (rocketstore_broker_info)").keys()) == {
                (("bounds", "open"), ("broker", f"broker-{i}")) for i in range(2)
            }
            assert set(live.query("sum by (broker) (rocketstore_writer_locked) == 1").keys()) == {
                (("broker", f"broker-{i}"),) for i in range(2)
            }
            for broker in brokers:
                cluster.stop(broker)  # a broker writes consumerOffset.json as it stops

        # The store stands still: the lag the exporter serves is the command's, queue by queue.
        prom.scraped_after(time.time())
        compared = assert_promql_is_the_commands(prom, root, conf, {})
        assert compared == 8  # 4 queues on each broker, all of them the group's topic's
        assert prom.query('sum(rocketmq_consumer_lag_messages{consumer_group="billing"})') == {
            (): float(diff_total)
        }
    finally:
        if prom is not None:
            prom.stop()
        if exporter is not None:
            exporter.stop()
