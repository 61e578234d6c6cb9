"""The consumers page beside a running Spark query: the lag it shows for the query's
checkpoint equals what ``rocketstore lag --checkpoint`` prints for it.

The query reads the ``orders`` topic of a :mod:`consolekit` root with
``format("rocketstore")``, 40 messages a micro-batch, triggered once an hour: its first batch
commits at once, then it runs, waiting, with a checkpoint that holds still while the page and
the command read it.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import cli
from tests.kit.consolekit import SMALL, lag_rows, make_root

pytest.importorskip("starlette", reason="the console needs the 'console' extra")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

from rocketstore.pipeline.console.app import create_app
from rocketstore.pipeline.console.views import Console

pytestmark = pytest.mark.slow


def test_lag_of_a_running_query_equals_the_lag_command(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = make_root(tmp_path)
    checkpoint = tmp_path / "query-ck"
    query = (
        spark.readStream.format("rocketstore")
        .option("path", str(root))
        .option("topic", "orders")
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "40")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 hour")
        .start()
    )
    try:
        deadline = time.monotonic() + 180
        while not (checkpoint / "commits" / "0").exists():
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, "the first micro-batch did not commit in 180 s"
            query.awaitTermination(0.5)  # waits on the query, at most half a second
        assert query.isActive
        config = tmp_path / "small.toml"
        argv = ["lag", str(root), "--checkpoint", str(checkpoint), "--config", str(config)]
        assert cli.main([*argv, "--json"]) == 0
        printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        app = create_app(Console(root, SMALL, (checkpoint,)))
        with TestClient(app, base_url="http://127.0.0.1") as client:
            page = client.get("/consumers").text
        section = re.search(
            r'<section class="consumer" data-kind="query"[^>]*>(.*?)</section>', page, re.S
        )
        assert section, page[-500:]
        shown = [{**row, "batchId": 0} for row in lag_rows(section.group(1))]
        query_rows = [p for p in printed if "group" not in p]
        assert shown == query_rows
        assert sum(r["lag"] for r in shown) == 90 - 40  # the first batch read 40 of 90
        assert "batch 0 committed" in section.group(1)
    finally:
        query.stop()
