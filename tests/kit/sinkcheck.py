"""What the sink's Spark tests check of a root they wrote (its rows read back with
:func:`tests.kit.sinkutil.read_back`): every row once, intact, in the queue its key hashes to,
in order per key."""

from __future__ import annotations

import collections
from typing import Any

from chispa import assert_df_equality
from pyspark.sql import SparkSession

from rocketstore.pipeline.format.javahash import java_hash


def check_stored(
    spark: SparkSession,
    rows: list[dict[str, Any]],
    stored: list[dict[str, Any]],
    total_queues: int,
    queues: int,
    ordered: bool = True,
) -> None:
    """Every input row exactly once, intact, in its hash-selected queue, and (``ordered``) in
    id order per key."""

    def props(p: dict[str, str] | list[tuple[str, str]] | None) -> str:
        # chispa sorts and compares whole rows, and Spark cannot order maps: compare as text.
        items = dict(p or {})
        return ",".join(f"{k}={v}" for k, v in sorted(items.items()))

    compared = "id long, keys string, tags string, properties string, flag int, body binary"
    expected = spark.createDataFrame(
        sorted(
            (r["id"], r["keys"], r["tags"], props(r["properties"]), r["flag"], r["body"])
            for r in rows
        ),
        compared,
    )
    got = spark.createDataFrame(
        sorted(
            (
                int(s["body"].split()[1]),
                s["keys"],
                s["tags"],
                props(s["properties"]),
                s["flag"],
                s["body"],
            )
            for s in stored
        ),
        compared,
    )
    assert_df_equality(got, expected)
    per_queue: dict[tuple[str, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for s in stored:
        mq = abs(java_hash(s["keys"])) % total_queues
        assert (s["broker"], s["queueId"]) == (f"broker-{mq // queues}", mq % queues)
        per_queue[(s["broker"], s["queueId"])].append(s)
    for msgs in per_queue.values():
        msgs.sort(key=lambda s: s["queueOffset"])
        assert [s["queueOffset"] for s in msgs] == list(range(len(msgs)))
        by_key: dict[str, list[int]] = collections.defaultdict(list)
        for s in msgs:
            by_key[s["keys"]].append(int(s["body"].split()[1]))
        for ids in by_key.values():
            assert not ordered or ids == sorted(ids), (
                "one key's messages out of order within its queue"
            )
