"""Queries run through a Spark Connect client, in a process of their own (a process that has
made a Connect session switches PySpark's functions to Connect for good, so the test process,
which holds a classic session, cannot be the client). Run by tests/test_connect.py.

usage: python tests/procs/connect_client.py SCENARIO URL ARGS...

  sink INPUT ROOT CHECKPOINT [FAILPOINT]     foreachBatch(CommitLogSink) of parquet files
  two-sinks INPUT_A INPUT_B ROOT CK_A CK_B   two such queries at once, in one session
  format INPUT ROOT CHECKPOINT               writeStream and write with format("rocketstore")
  source ROOT CHECKPOINT OUTPUT BATCH_OUTPUT readStream / read with format("rocketstore")

Prints one JSON object: the ids of the queries it ran, and the error a query ended with.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# Run by path, this script has tests/procs/ on sys.path: the checkout is added for tests.kit.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from rocketstore.jobs.common import register
from rocketstore.sink.foreach import CommitLogSink
from tests.kit.sink import INPUT_DDL, STORE_OPTIONS

SINK = {"brokers": 2, "queues": 2, **STORE_OPTIONS, "chunkRows": "50"}


def orders(spark: SparkSession, folder: str) -> DataFrame:
    return (
        spark.readStream.schema(INPUT_DDL)
        .option("maxFilesPerTrigger", 1)
        .parquet(folder)
        .drop("id")
    )


def start(writer: DataStreamWriter) -> StreamingQuery:
    """``writer.start()``, tried again when the server failed to start the query's
    ``foreachBatch`` worker: Spark gives a new Python process 10 seconds (a constant) to
    connect back, which a 2-core machine busy with other test runs can miss. Nothing of the
    query exists yet when that happens."""
    tries = 3
    while True:
        tries -= 1
        try:
            return writer.start()
        except PySparkException as exc:
            if tries == 0 or "Python worker failed to connect back" not in str(exc):
                raise


def finish(queries: list[Any]) -> dict[str, Any]:
    """Wait for every query; their ids, and the first error (None when all ended well)."""
    error = None
    for q in queries:
        try:
            q.awaitTermination()
        except StreamingQueryException as exc:
            error = error or str(exc)
    return {"queryIds": [q.id for q in queries], "error": error}


def sink(spark: SparkSession, folder: str, root: str, ck: str) -> dict[str, Any]:
    fn = CommitLogSink(root, topic="orders", **SINK)
    writer = orders(spark, folder).writeStream.foreachBatch(fn).option("checkpointLocation", ck)
    return finish([start(writer.trigger(availableNow=True))])


def two_sinks(
    spark: SparkSession, in_a: str, in_b: str, root: str, ck_a: str, ck_b: str
) -> dict[str, Any]:
    queries = [
        start(
            orders(spark, folder)
            .writeStream.foreachBatch(CommitLogSink(root, topic="orders", **SINK))
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
        )
        for folder, ck in ((in_a, ck_a), (in_b, ck_b))
    ]
    return finish(queries)


def format_writers(spark: SparkSession, folder: str, root: str, ck: str) -> dict[str, Any]:
    q = (
        orders(spark, folder)
        .writeStream.format("rocketstore")
        .option("path", root)
        .option("topic", "orders")
        .options(**SINK)
        .option("checkpointLocation", ck)
        .trigger(availableNow=True)
        .start()
    )
    done = finish([q])
    batch = spark.read.parquet(folder).drop("id")
    batch.write.format("rocketstore").mode("append").option("path", root).option(
        "topic", "again"
    ).options(**STORE_OPTIONS).save()
    return done


def source(
    spark: SparkSession, root: str, ck: str, out: str, batch_out: str, per_trigger: str = "12"
) -> dict[str, Any]:
    """``per_trigger`` is maxMessagesPerTrigger, or ``all`` for none (PySpark before 4.2)."""
    opts = {"path": root, "topic": "orders", "startingOffsets": "earliest"}
    limits = {} if per_trigger == "all" else {"maxMessagesPerTrigger": per_trigger}
    q = (
        spark.readStream.format("rocketstore")
        .options(**opts, **limits)
        .load()
        .select("brokerName", "queueId", "queueOffset", "body")
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", ck)
        .trigger(availableNow=True)
        .start()
    )
    done = finish([q])
    spark.read.format("rocketstore").options(**opts).load().select(
        "brokerName", "queueId", "queueOffset", "body"
    ).write.mode("overwrite").parquet(batch_out)
    return done


SCENARIOS = {"sink": sink, "two-sinks": two_sinks, "format": format_writers, "source": source}


def main(argv: list[str]) -> int:
    scenario, url, *args = argv
    spark = SparkSession.builder.remote(url).getOrCreate()
    register(spark)
    try:
        print(json.dumps(SCENARIOS[scenario](spark, *args)))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
