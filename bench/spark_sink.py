"""The sink benchmark: one stream of rows written by the rocketstore sink's two faces, by
Spark's parquet file sink and ``noop`` sink, and by the floors of a Python sink, in one run.

The input is N rows (default 5M; ``--quick`` 200k) of a 100-byte body and a key each (100 000
distinct keys), stored once as parquet files. Each timed run is a streaming query over those
files with ``trigger(availableNow=True)`` and ``maxFilesPerTrigger`` giving micro-batches of
about 1M rows, into:

- ``rocketstore``: ``foreachBatch(CommitLogSink(...))`` with 2 brokers x 4 queues (one broker
  per core), store defaults from ``conf/store.toml`` (1 GiB segments, ASYNC_FLUSH, key index);
- ``rocketstore-ds``: the same store layout through the data source writer,
  ``writeStream.format("rocketstore")`` (no shuffle: each input partition's task appends to
  both brokers, free broker first);
- ``floor-ds``: a Python data source writer with the same partitions that only counts the
  Arrow batches it is handed: what any Python data source sink costs before it does anything;
- ``floor-fb``: the ``foreachBatch`` face's own routing and shuffle into one task per broker,
  feeding a ``mapInArrow`` task that only counts: the same for ``CommitLogSink``;
- ``parquet``: Spark's file sink, the baseline the targets are set against;
- ``noop``: the cost of reading the input and running the micro-batches, for scale.

Each query's wall time and its CPU seconds (this process, its JVM and the JVM's Python
workers together, :func:`bench.common.process_tree_cpu_s`) are taken; figures are medians of
``--runs``. The same run also times the native batch put of the same rows in this process
(``MessageStore.put_batch``, CPU seconds of one thread), the work no sink can avoid.

Targets: the data source writer at least 0.5 x the parquet sink and ``foreachBatch`` at least
0.4 x; each sink's CPU per row beyond its floor's at most 1.5 x the native put's CPU per row.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from bench.common import (
    Options,
    PartResult,
    Row,
    log,
    median,
    process_tree_cpu_s,
    scratch_dir,
    spread,
)
from bench.session import local_session

TARGETS = {"rocketstore": 0.4, "rocketstore-ds": 0.5}
CPU_TARGET = 1.5  # a sink's CPU per row beyond its floor's, over the native put's
FILES = 10
BROKERS, QUEUES = 2, 4
NAMES = {
    "rocketstore": "rocketstore sink (foreachBatch)",
    "rocketstore-ds": "rocketstore sink (data source writer)",
    "floor-fb": "floor of foreachBatch (shuffle, count in Python)",
    "floor-ds": "floor of a data source writer (count in Python)",
    "parquet": "parquet sink",
    "noop": "noop sink",
}
FLOOR_OF = {"rocketstore": "floor-fb", "rocketstore-ds": "floor-ds"}
ORDER = ("noop", "parquet", "floor-ds", "rocketstore-ds", "floor-fb", "rocketstore")


class CountDataSource(DataSource):
    """A streaming data source writer that counts the rows it is handed and stores nothing."""

    @classmethod
    def name(cls) -> str:
        return "rocketstore_bench_count"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        # An Arrow writer is not a DataSourceStreamWriter in PySpark's classes, though Spark
        # takes either; where PySpark is not type-checked (make lint) the ignore is unused.
        return CountWriter()  # type: ignore[return-value, unused-ignore]


class CountWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class ShuffleFloor:
    """``foreachBatch`` function: what ``CommitLogSink`` does to a micro-batch before the
    append (routing and the shuffle into one task per broker), then a task that counts."""

    def __init__(self, path: str) -> None:
        from rocketstore.sink.foreach import CommitLogSink

        self.sink = CommitLogSink(path, topic="bench", brokers=BROKERS, queues=QUEUES)

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql.pandas.types import from_arrow_schema

        def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            rows = sum(b.num_rows for b in batches)
            yield pa.RecordBatch.from_pydict({"rows": [rows]})

        target = self.sink.partitioned(df)
        out = from_arrow_schema(pa.schema([("rows", pa.int64())]))
        target.mapInArrow(count, out).collect()


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


def native_put_cpu_s(source: Path, store: Path) -> float:
    """CPU seconds (this thread) of putting the input's rows into one store in 1M-row batches
    and flushing it: the native batch put every sink runs, without Spark around it."""
    import numpy as np

    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.engine.store import MessageStore
    from rocketstore.sink.append import uniq_keys

    table = ds.dataset(str(source)).to_table()
    n = table.num_rows
    rows = pa.table(
        {
            "topic": pa.array(np.full(n, "bench", dtype=object), pa.string()),
            "body": table.column("body"),
            "queueId": pa.array((np.arange(n) % QUEUES).astype(np.int32)),
            "keys": table.column("keys"),
            # The sink gives every row a UNIQ_KEY, which the index holds beside the keys.
            "uniqKey": uniq_keys(b"bnch", 0, 0, n),
        }
    )
    cpu = 0.0
    with MessageStore(store, StoreConfig.effective(None), create=True, background=False) as s:
        for lo in range(0, n, 1_000_000):
            part = rows.slice(lo, 1_000_000)
            t0 = time.thread_time()
            s.put_batch(part)
            cpu += time.thread_time() - t0
        t0 = time.thread_time()
        s.flush()
        cpu += time.thread_time() - t0
    shutil.rmtree(store, ignore_errors=True)
    return cpu


def run(options: Options) -> PartResult:
    rows = 200_000 if options.quick else 5_000_000
    spark, owned = _session()
    spark.dataSource.register(CountDataSource)
    wall: dict[str, list[float]] = {name: [] for name in NAMES}
    cpu: dict[str, list[float]] = {name: [] for name in NAMES}
    put_cpu: list[float] = []
    loads: list[float] = []
    with scratch_dir(options.work_dir, "sink-") as work:
        source, warm = work / "input", work / "warm"
        make_input(spark, source, rows)
        make_input(spark, warm, 20 * FILES)
        schema = spark.read.parquet(str(source)).schema

        def stream(files: Path) -> Any:
            return (
                spark.readStream.schema(schema)
                .option("maxFilesPerTrigger", max(1, FILES // 5))
                .parquet(str(files))
            )

        def query(name: str, out: Path, files: Path = source) -> Any:
            writer = stream(files).writeStream.option("checkpointLocation", str(out / "_ck"))
            store = str(out / "store")
            if name == "rocketstore":
                from rocketstore.sink.foreach import CommitLogSink

                sink = CommitLogSink(store, topic="bench", brokers=BROKERS, queues=QUEUES)
                return writer.foreachBatch(sink)
            if name == "floor-fb":
                return writer.foreachBatch(ShuffleFloor(store))
            if name in ("rocketstore-ds", "floor-ds"):
                fmt = "rocketstore" if name == "rocketstore-ds" else CountDataSource.name()
                return (
                    writer.format(fmt)
                    .option("path", store)
                    .option("topic", "bench")
                    .option("brokers", BROKERS)
                    .option("queues", QUEUES)
                )
            if name == "parquet":
                return writer.format("parquet").option("path", str(out / "files"))
            return writer.format("noop")

        # Warm-up, not timed: each kind's first query starts its Python workers and loads its
        # classes, a fixed cost that would otherwise fall on whichever kind runs first.
        for name in ORDER:
            out = work / f"warm-{name}"
            query(name, out, warm).trigger(availableNow=True).start().awaitTermination()
            shutil.rmtree(out, ignore_errors=True)
        for i in range(options.runs):
            loads.append(_load())
            # Rotated, so that no kind always runs first after the machine was idle.
            order = ORDER[i % len(ORDER) :] + ORDER[: i % len(ORDER)]
            for name in order:
                out = work / f"{name}-{i}"
                cpu0 = process_tree_cpu_s()
                t0 = time.perf_counter()
                query(name, out).trigger(availableNow=True).start().awaitTermination()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(process_tree_cpu_s() - cpu0)
                log(
                    f"sink run {i + 1}/{options.runs} {name}: {rows / wall[name][-1]:,.0f} rows/s, "
                    f"{cpu[name][-1]:.2f} CPU s"
                )
                shutil.rmtree(out, ignore_errors=True)
            put_cpu.append(native_put_cpu_s(source, work / f"put-{i}"))
            log(f"sink run {i + 1}/{options.runs} native put: {put_cpu[-1]:.2f} CPU s")
            loads.append(_load())
    if owned:
        spark.stop()
    return PartResult(
        "sink", _table(rows, wall, cpu, put_cpu), _data(rows, wall, cpu, put_cpu, loads)
    )


def _load() -> float:
    import os

    return os.getloadavg()[0]


def _table(
    rows: int, wall: dict[str, list[float]], cpu: dict[str, list[float]], put_cpu: list[float]
) -> list[Row]:
    per_m = 1_000_000 / rows
    speed = {name: [rows / w for w in wall[name]] for name in NAMES}
    base = median(speed["parquet"])
    put = median(put_cpu) * per_m
    table = []
    for name in NAMES:
        m, s = median(speed[name]), spread(speed[name])
        goal = TARGETS.get(name)
        table.append(
            Row(
                name=f"{NAMES[name]}, {rows:,} x 100 B",
                unit="rows/s",
                median=m,
                low=s["min"],
                high=s["max"],
                baseline="parquet sink",
                ratio=m / base,
                target=f">= {goal:g} x parquet" if goal else "",
                met=(m / base >= goal) if goal else None,
            )
        )
    for name, floor in FLOOR_OF.items():
        table.append(
            Row(
                name=f"{NAMES[name]} over its floor",
                unit="x",
                median=median(speed[name]) / median(speed[floor]),
                baseline=NAMES[floor],
            )
        )
    for name in NAMES:
        c = [x * per_m for x in cpu[name]]
        table.append(Row(name=f"{NAMES[name]}: CPU", unit="CPU s / M rows", median=median(c)))
    table.append(Row(name="native batch put (one thread)", unit="CPU s / M rows", median=put))
    for name, floor in FLOOR_OF.items():
        beyond = (median(cpu[name]) - median(cpu[floor])) * per_m
        table.append(
            Row(
                name=f"{NAMES[name]}: CPU beyond its floor",
                unit="CPU s / M rows",
                median=beyond,
                baseline="native batch put",
                ratio=beyond / put,
                target=f"<= {CPU_TARGET:g} x native put",
                met=beyond / put <= CPU_TARGET,
            )
        )
    return table


def _data(
    rows: int,
    wall: dict[str, list[float]],
    cpu: dict[str, list[float]],
    put_cpu: list[float],
    loads: list[float],
) -> dict[str, Any]:
    return {
        "rows": rows,
        "wall_s": wall,
        "cpu_s": cpu,
        "native_put_cpu_s": put_cpu,
        "load_avg": loads,
    }
