"""The sink benchmark: one stream of rows written by the rocketstore sink, by Spark's parquet
file sink and by the ``noop`` sink, in one run.

The input is N rows (default 5M; ``--quick`` 200k) of a 100-byte body and a key each (100 000
distinct keys), stored once as parquet files. Each timed run is a streaming query over those
files with ``trigger(availableNow=True)`` and ``maxFilesPerTrigger`` giving micro-batches of
about 1M rows, into:

- ``rocketstore``: ``foreachBatch(CommitLogSink(...))`` with 2 brokers x 4 queues (one broker
  per core), store defaults from ``conf/store.toml`` (1 GiB segments, ASYNC_FLUSH, key index);
- ``rocketstore-ds``: the same store layout through the data source writer,
  ``writeStream.format("rocketstore")`` (no shuffle: each input partition's task appends to
  both brokers, free broker first);
- ``parquet``: Spark's file sink, the baseline the target is set against;
- ``noop``: the cost of reading the input and running the micro-batches, for scale.

Figures are rows/s over the query's wall time (start to termination), the median of
``--runs``; ratios are against the parquet sink in the same run. Target: the rocketstore sink
at least as fast as the parquet sink (either face; ``CommitLogSink`` is the design's).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from bench.common import Options, PartResult, Row, log, median, scratch_dir, spread
from bench.session import local_session

TARGET_RATIO = 1.0
FILES = 10
NAMES = {
    "rocketstore": "rocketstore sink (foreachBatch)",
    "rocketstore-ds": "rocketstore sink (data source writer)",
    "parquet": "parquet sink",
    "noop": "noop sink",
}


def _session() -> tuple[Any, bool]:
    # Two shuffle partitions: one per broker of the sink's layout; 4 GiB for the driver.
    return local_session(
        "rocketstore-bench-sink",
        **{"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g"},
    )


def make_input(spark: Any, folder: Path, rows: int) -> None:
    from pyspark.sql import functions as F

    per_file = rows // FILES
    body = F.rpad(F.concat(F.lit("order-"), F.col("id").cast("string"), F.lit(" ")), 100, "x")
    (
        spark.range(0, per_file * FILES, numPartitions=FILES)
        .select(
            F.concat(F.lit("customer-"), (F.col("id") % 100_000).cast("string")).alias("keys"),
            body.cast("binary").alias("body"),
        )
        .write.mode("overwrite")
        .parquet(str(folder))
    )


def run(options: Options) -> PartResult:
    from pyspark.sql import functions as F  # noqa: F401  (imported for the session's side)

    from sink.foreach import CommitLogSink

    rows = 200_000 if options.quick else 5_000_000
    spark, owned = _session()
    results: dict[str, list[float]] = {name: [] for name in NAMES}
    with scratch_dir(options.work_dir, "sink-") as work:
        source = work / "input"
        make_input(spark, source, rows)
        schema = spark.read.parquet(str(source)).schema

        def stream() -> Any:
            return (
                spark.readStream.schema(schema)
                .option("maxFilesPerTrigger", max(1, FILES // 5))
                .parquet(str(source))
            )

        for i in range(options.runs):
            for name in ("noop", "parquet", "rocketstore", "rocketstore-ds"):
                out = work / f"{name}-{i}"
                writer = stream().writeStream.option("checkpointLocation", str(out / "_ck"))
                if name == "rocketstore":
                    writer = writer.foreachBatch(
                        CommitLogSink(str(out / "store"), topic="bench", brokers=2, queues=4)
                    )
                elif name == "rocketstore-ds":
                    writer = (
                        writer.format("rocketstore")
                        .option("path", str(out / "store"))
                        .option("topic", "bench")
                        .option("brokers", 2)
                        .option("queues", 4)
                    )
                elif name == "parquet":
                    writer = writer.format("parquet").option("path", str(out / "files"))
                else:
                    writer = writer.format("noop")
                t0 = time.perf_counter()
                writer.trigger(availableNow=True).start().awaitTermination()
                elapsed = time.perf_counter() - t0
                results[name].append(rows / elapsed)
                log(f"sink run {i + 1}/{options.runs} {name}: {rows / elapsed:,.0f} rows/s")
                shutil.rmtree(out, ignore_errors=True)
    if owned:
        spark.stop()
    base = median(results["parquet"])
    table = []
    for name in NAMES:
        m = median(results[name])
        s = spread(results[name])
        is_target = name.startswith("rocketstore")
        table.append(
            Row(
                name=f"{NAMES[name]}, {rows:,} x 100 B",
                unit="rows/s",
                median=m,
                low=s["min"],
                high=s["max"],
                baseline="parquet sink",
                ratio=m / base,
                target=f">= {TARGET_RATIO:g} x parquet" if is_target else "",
                met=(m / base >= TARGET_RATIO) if is_target else None,
            )
        )
    return PartResult("sink", table, {"rows": rows, "rows_per_s": results})
