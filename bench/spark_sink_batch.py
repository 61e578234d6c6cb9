"""The sink's fixed cost per micro-batch: small micro-batches through the rocketstore sink and
through Spark's parquet sink, into an empty store and into one already holding a large store.

Input: ``BATCHES`` parquet files of 100 rows each (a 100-byte body and a key), read by a
streaming query with ``maxFilesPerTrigger=1`` and ``trigger(availableNow=True)``, so every
micro-batch is 100 rows. Per micro-batch, the figure is Spark's own ``triggerExecution``
duration from the query's progress reports (planning, the batch's job, the sink, the commit);
the first micro-batch of each query (which creates files and warms the JVM's code paths) is
left out, and the median over the others and over ``--runs`` is reported. Three sinks, run one
after another in each run:

- ``parquet``: Spark's file sink, the baseline;
- ``rocketstore, empty store``: ``CommitLogSink`` with 2 brokers x 4 queues into a new store
  root (store defaults: 1 GiB segments, ASYNC_FLUSH, key index);
- ``rocketstore, large store``: the same sink into a root that already holds ``LARGE``
  messages (50M; ``--quick`` 500k) of the same topic, written before the runs by batch puts
  (not timed). The point is the growth: its ratio to the empty store's figure.

Targets (issue 10): a 100-row micro-batch at most 1.5 x the parquet sink's; on the large store
within 20 % of the empty store's.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import Options, PartResult, Row, log, median, scratch_dir, spread
from bench.spark_sink import _session

BATCHES = 21
ROWS = 100
LARGE = 50_000_000
CHUNK = 1_000_000
SMALL_TARGET = 1.5
GROWTH_TARGET = 1.2


def make_input(spark: Any, folder: Path, batches: int) -> None:
    from pyspark.sql import functions as F

    for i in range(batches):
        (
            spark.range(i * ROWS, (i + 1) * ROWS, numPartitions=1)
            .select(
                F.concat(F.lit("customer-"), F.col("id").cast("string")).alias("keys"),
                F.rpad(F.col("id").cast("string"), 100, "x").cast("binary").alias("body"),
            )
            .write.mode("append")
            .parquet(str(folder))
        )


def fill_store(root: Path, messages: int) -> None:
    """``messages`` messages of topic ``bench`` in the layout the sink writes (2 brokers x 4
    queues), by batch puts of up to 1M: what a pipeline would have left behind."""
    from rocketstore.pipeline.engine.store import MessageStore
    from rocketstore.sink.plan import prepare
    from rocketstore.sink.settings import SinkSettings
    from rocketstore.sink.writer import broker_config

    settings = SinkSettings.from_options(
        {"path": str(root), "topic": "bench", "brokers": 2, "queues": 4}
    )
    prepare(settings, pa.schema([("keys", pa.string()), ("body", pa.binary())]))
    body = pa.array(np.full(CHUNK, b"x" * 100, dtype=object), pa.binary())
    queue_ids = pa.array((np.arange(CHUNK) % 4).astype(np.int32))
    per_broker = messages // 2
    for b in range(2):
        config = broker_config(settings.store_config, b)
        with MessageStore(settings.store_root.broker_path(b), config, create=True) as store:
            for start in range(0, per_broker, CHUNK):
                n = min(CHUNK, per_broker - start)
                keys = pa.array([f"old-{b}-{start + i}" for i in range(n)])
                table = pa.table(
                    {
                        "topic": pa.array(["bench"] * n),
                        "body": body.slice(0, n),
                        "queueId": queue_ids.slice(0, n),
                        "keys": keys,
                    }
                )
                store.put_batch(table)
        log(f"sink-batch: broker {b}: {per_broker:,} messages written")


def trigger_ms(query: Any) -> list[float]:
    """``triggerExecution`` of each micro-batch that read rows, in order."""
    return [
        float(p["durationMs"]["triggerExecution"])
        for p in query.recentProgress
        if p.get("numInputRows", 0) > 0
    ]


def run(options: Options) -> PartResult:
    from rocketstore.sink.foreach import CommitLogSink

    batches = 6 if options.quick else BATCHES
    large = 500_000 if options.quick else LARGE
    spark, owned = _session()
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(batches + 10))
    per_batch: dict[str, list[float]] = {"parquet": [], "empty": [], "large": []}
    load: list[tuple[float, float, float]] = [os.getloadavg()]
    with scratch_dir(options.work_dir, "sink-batch-") as work:
        source = work / "input"
        make_input(spark, source, batches)
        schema = spark.read.parquet(str(source)).schema
        t0 = time.perf_counter()
        fill_store(work / "large", large)
        log(f"sink-batch: large store of {large:,} messages in {time.perf_counter() - t0:.0f} s")

        for i in range(options.runs):
            for name in ("parquet", "empty", "large"):
                out = work / f"{name}-{i}"
                stream = (
                    spark.readStream.schema(schema)
                    .option("maxFilesPerTrigger", 1)
                    .parquet(str(source))
                )
                writer = stream.writeStream.option("checkpointLocation", str(out / "_ck"))
                if name == "parquet":
                    writer = writer.format("parquet").option("path", str(out / "files"))
                else:
                    root = work / "large" if name == "large" else out / "store"
                    writer = writer.foreachBatch(
                        CommitLogSink(str(root), topic="bench", brokers=2, queues=4)
                    )
                query = writer.trigger(availableNow=True).start()
                query.awaitTermination()
                got = trigger_ms(query)[1:]
                per_batch[name].append(statistics.median(got))
                log(
                    f"sink-batch run {i + 1}/{options.runs} {name}: median "
                    f"{per_batch[name][-1]:.0f} ms over {len(got)} micro-batches of {ROWS} rows"
                )
                shutil.rmtree(out, ignore_errors=True)
        load.append(os.getloadavg())
    if owned:
        spark.stop()
    pq, empty, big = (median(per_batch[k]) for k in ("parquet", "empty", "large"))

    def row(name: str, key: str, **against: Any) -> Row:
        s = spread(per_batch[key])
        return Row(
            name=name,
            unit="ms",
            median=median(per_batch[key]),
            low=s["min"],
            high=s["max"],
            **against,
        )

    rows = [
        row(
            f"rocketstore sink, {ROWS}-row micro-batch, empty store",
            "empty",
            baseline="parquet sink",
            ratio=empty / pq,
            target=f"<= {SMALL_TARGET:g} x parquet",
            met=empty / pq <= SMALL_TARGET,
        ),
        row(
            f"rocketstore sink, {ROWS}-row micro-batch, store of {large:,}",
            "large",
            baseline="same sink, empty store",
            ratio=big / empty,
            target=f"<= {GROWTH_TARGET:g} x empty",
            met=big / empty <= GROWTH_TARGET,
        ),
        row(f"parquet sink, {ROWS}-row micro-batch", "parquet"),
    ]
    notes = [f"load average before {load[0][0]:.1f}, after {load[-1][0]:.1f} (1 min)"]
    return PartResult(
        "sink-batch",
        rows,
        {"batches": batches, "large": large, "ms_per_batch": per_batch, "loadavg": load},
        notes,
    )
