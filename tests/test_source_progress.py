"""Spark's own progress of a query reading ``format("rocketstore")``: each batch's source entry
carries the ``latestOffset`` the source reports (``reportLatestOffset``: the queues' max
offsets), and :func:`rocketstore.source.progress.offsets_behind_latest` turns it and the
batch's ``endOffset`` into the Kafka source's ``avg/max/minOffsetsBehindLatest``; the source's
``metrics`` map, where the Kafka source puts those, stays empty (Spark has no hook for it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.errors import StoreError
from rocketstore.source.progress import offsets_behind_latest
from tests.kit.sourcekit import make_root

END = {"T": {"broker-0": {"0": 4, "1": 10}, "broker-1": {"0": 0}}}
LATEST = {"T": {"broker-0": {"0": 10, "1": 10}, "broker-1": {"0": 7, "1": 3}}}


def test_figures_from_a_progress_entry_as_dicts_or_json_text() -> None:
    expected = {
        "avgOffsetsBehindLatest": (6 + 0 + 7) / 3,
        "maxOffsetsBehindLatest": 7.0,
        "minOffsetsBehindLatest": 0.0,
    }
    assert offsets_behind_latest({"endOffset": END, "latestOffset": LATEST}) == expected
    as_text = {"endOffset": json.dumps(END), "latestOffset": json.dumps(LATEST)}
    assert offsets_behind_latest(as_text) == expected


def test_no_latest_offset_and_offsets_of_another_source() -> None:
    assert offsets_behind_latest({"endOffset": END, "latestOffset": None}) is None
    assert offsets_behind_latest({"endOffset": END}) is None
    with pytest.raises(StoreError, match="latestOffset: not JSON"):
        offsets_behind_latest({"endOffset": END, "latestOffset": "{oops"})
    with pytest.raises(StoreError, match="endOffset"):
        offsets_behind_latest({"endOffset": {"topic-0": 5}, "latestOffset": LATEST})


@pytest.mark.slow
def test_each_batchs_progress_carries_the_stores_latest_offsets(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_root(root, "T", brokers=2, queues=2, count=40)  # 10 messages in each of 4 queues
    stored = {f"broker-{b}": {str(q): 10 for q in range(2)} for b in range(2)}
    query = (
        spark.readStream.format("rocketstore")
        .option("path", str(root))
        .option("topic", "T")
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "15")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(300)
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in progress] == [15, 15, 10]
    for p in progress:
        (source,) = p["sources"]
        latest = source["latestOffset"]
        latest = json.loads(latest) if isinstance(latest, str) else latest
        assert latest == {"T": stored}
        end = source["endOffset"]
        end = json.loads(end) if isinstance(end, str) else end
        behind = [stored[b][q] - end["T"][b][q] for b in stored for q in stored[b]]
        assert offsets_behind_latest(source) == {
            "avgOffsetsBehindLatest": sum(behind) / 4,
            "maxOffsetsBehindLatest": max(behind),
            "minOffsetsBehindLatest": min(behind),
        }
        assert not source["metrics"]  # what Spark leaves a Python source
    assert offsets_behind_latest(progress[-1]["sources"][0])["maxOffsetsBehindLatest"] == 0
