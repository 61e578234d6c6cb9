"""The source benchmark: a streaming query reading the store, beside Spark's parquet source.

One store root is written once (not timed): N messages (5M; ``--quick`` 200k) of 100-byte
bodies over 4 brokers x 4 queues, with ``MessageStore.put_batch`` in 500k-message puts. The
same rows are then written once to parquet files (``spark.read.format("rocketstore")`` ->
``write.parquet``, not timed) with exactly the source's default columns, so both sides hold
identical data and schema: the columns a query of the default row pays for.

Each run times, back to back and in a rotating order, from scratch (fresh checkpoints):

* **source**: ``readStream.format("rocketstore")`` (the default row) from the earliest
  offsets, ``trigger(availableNow=True)``, into the ``noop`` sink;
* **parquet**: ``readStream.schema(...).parquet(dir)``, Spark's own file source, the same way;
* **replay** (for the analysis, no target): a minimal Python data source whose ``read()``
  yields the very record batches the source would yield, already decoded, from Arrow IPC files
  (memory-mapped; written once, not timed), as a batch read into ``noop``. It is the floor of
  any Python data source producing these columns: Spark's own cost of taking Arrow batches from
  a Python worker and turning them into rows;

* **replay_stream**: the same replay as a streaming query (a minimal Python streaming data
  source whose one micro-batch holds every file, ``availableNow``, into ``noop``): the floor of
  any Python *streaming* source, which pays what the batch replay does plus Spark's fixed cost
  of a streaming Python source (its own Python process on the driver for the offsets, the
  checkpoint, the micro-batch); the source's target is measured against it;

then, for the analysis, the source with ``includeAll`` (the full row, the default before the
narrow one), and the same two streaming queries reading nothing (the source from the latest
offsets, parquet from an empty directory): what a query costs before its first row.

Timed: ``start()``/``save()`` to the end (planning, every micro-batch, the checkpoint writes),
and the CPU time of every process of the run meanwhile (this one, the JVM, its Python workers;
:func:`bench.common.process_tree_cpu_s`), which a busy machine moves much less than wall time.
Reported: rows/s and rows per CPU-second of each (median of runs), the medians of the per-run
ratios to parquet, and the load average at each run. One untimed warm-up run of each of the
three comes first (Python workers, JIT, page cache); the extra queries come after those in every
run. The Spark session is ``local[2]`` (this machine has 2 vCPUs); it is started once, not timed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import (
    Options,
    PartResult,
    Row,
    log,
    median,
    process_tree_cpu_s,
    scratch_dir,
    spread,
    work_dir_notes,
)
from bench.replay import ReplayDataSource, ReplayStreamDataSource
from bench.session import local_session
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore

TOPIC = "BenchSource"
BROKERS = 4
QUEUES = 4
BODY_BYTES = 100
PUT_CHUNK = 500_000
TARGET_RATIO = 1.0
# Issue 21: the source within 10 % of its floor, the streaming replay (wall time, same run).
FLOOR_TARGET = 0.9


def make_table(first: int, n: int, rng: np.random.Generator) -> pa.Table:
    """``n`` messages numbered from ``first``: 100 random lowercase bytes each, a key, a tag."""
    bodies = rng.integers(97, 123, size=n * BODY_BYTES, dtype=np.uint8)
    offsets = np.arange(0, BODY_BYTES * (n + 1), BODY_BYTES, dtype=np.int32)
    ids = np.arange(first, first + n)
    return pa.table(
        {
            "topic": pa.array([TOPIC] * n, pa.string()),
            "body": pa.Array.from_buffers(
                pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(bodies)]
            ),
            "queueId": pa.array(ids % QUEUES, pa.int32()),
            "keys": pa.array([f"order-{i}" for i in ids.tolist()], pa.string()),
            "tags": pa.array(["TagA", "TagB", "TagC"], pa.string()).take(pa.array(ids % 3)),
        }
    )


def build_root(root: Path, n: int, seed: int) -> int:
    """Write ``n`` messages spread evenly over the brokers; returns the CommitLog bytes."""
    rng = np.random.default_rng(seed)
    StoreRoot(root).ensure_topic(TOPIC, TopicMeta(BROKERS, QUEUES))
    per_broker = n // BROKERS
    written = 0
    for b in range(BROKERS):
        first = b * per_broker
        count = per_broker if b < BROKERS - 1 else n - first
        with MessageStore(root / f"broker-{b}", StoreConfig()) as store:
            for lo in range(0, count, PUT_CHUNK):
                result = store.put_batch(make_table(first + lo, min(PUT_CHUNK, count - lo), rng))
                written += result.total_bytes
    return written


def write_replay_files(root: Path, out: Path) -> None:
    """The source's own record batches, one IPC file per partition (decoded without Spark)."""
    from rocketstore.source import options, schema
    from rocketstore.source.planning import Planner
    from rocketstore.source.read import ReadContext, read_queue_range

    parsed = options.parse({"path": str(root), "topic": TOPIC}, streaming=False)
    ctx = ReadContext(schema=schema.arrow_schema(None), root=str(root))
    planner = Planner(parsed)
    start, end = planner.batch_range()
    out.mkdir(parents=True)
    for i, rng in enumerate(planner.ranges(start, end)):
        path = str(out / f"part-{i:03d}.arrow")
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, ctx.schema) as writer:
            for batch in read_queue_range(rng, ctx):
                writer.write_batch(batch)


def read_replay(spark: Any, files: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    df = spark.read.format("rocketstore_bench_replay").option("path", str(files)).load()
    df.write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - t0
    # A batch write reports no input rows; the files say how many there are.
    rows = 0
    for p in files.glob("*.arrow"):
        with pa.memory_map(str(p)) as source:
            rows += pa.ipc.open_file(source).read_all().num_rows
    return elapsed, rows


def read_replay_stream(spark: Any, files: Path, checkpoint: Path) -> tuple[float, int]:
    return _timed(
        lambda: (
            spark.readStream.format("rocketstore_bench_replay_stream")
            .option("path", str(files))
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
    )


def _session() -> tuple[Any, bool]:
    spark, owned = local_session("rocketstore-bench-source")
    spark.dataSource.register(ReplayDataSource)
    spark.dataSource.register(ReplayStreamDataSource)
    return spark, owned


def _timed(query_start: Any) -> tuple[float, int]:
    t0 = time.perf_counter()
    query = query_start()
    query.awaitTermination()
    elapsed = time.perf_counter() - t0
    rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
    return elapsed, rows


def read_source(
    spark: Any, root: Path, checkpoint: Path, starting: str = "earliest", **extra: str
) -> tuple[float, int]:
    return _timed(
        lambda: (
            spark.readStream.format("rocketstore")
            .option("path", str(root))
            .option("topic", TOPIC)
            .option("startingOffsets", starting)
            .options(**extra)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
    )


def read_parquet(spark: Any, files: Path, schema: Any, checkpoint: Path) -> tuple[float, int]:
    return _timed(
        lambda: (
            spark.readStream.schema(schema)
            .parquet(str(files))
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
    )


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_parquet_copy(spark: Any, root: Path, files: Path) -> Any:
    """The store's rows as parquet, in the source's default row; returns their Spark schema."""
    from rocketstore.source.schema import arrow_schema

    columns = arrow_schema(None).names
    df = spark.read.format("rocketstore").option("path", str(root)).option("topic", TOPIC).load()
    if df.columns != columns:
        raise AssertionError(f"the source's default row is {df.columns}, expected {columns}")
    df.write.parquet(str(files))
    return df.schema


KINDS = ("source", "parquet", "replay", "replay_stream")
# For the analysis, after those three: the full row, and two queries that read nothing.
EXTRA_KINDS = ("source_all", "source_empty", "parquet_empty")
EMPTY_KINDS = ("source_empty", "parquet_empty")


def run(options: Options) -> PartResult:
    n = 200_000 if options.quick else 5_000_000
    notes = work_dir_notes(options.work_dir, "source")
    spark, owned = _session()
    try:
        with scratch_dir(options.work_dir, "source-") as scratch:
            root = scratch / "root"
            log(f"source: writing {n:,} messages to {BROKERS} brokers x {QUEUES} queues")
            t0 = time.perf_counter()
            log_bytes = build_root(root, n, options.seed)
            build_s = time.perf_counter() - t0
            files = scratch / "parquet"
            schema = write_parquet_copy(spark, root, files)
            empty = scratch / "parquet-empty"
            empty.mkdir()
            replay = scratch / "replay"
            write_replay_files(root, replay)
            log(f"source: store {log_bytes:,} bytes, parquet {_dir_bytes(files):,} bytes")
            counter = iter(range(1_000_000))

            def measure(which: str) -> tuple[float, int, float]:
                """(wall seconds, rows, CPU seconds of every process) of one query."""
                checkpoint = scratch / f"ck-{next(counter)}"
                cpu0 = process_tree_cpu_s()
                if which == "source":
                    secs, rows = read_source(spark, root, checkpoint)
                elif which == "parquet":
                    secs, rows = read_parquet(spark, files, schema, checkpoint)
                elif which == "replay":
                    secs, rows = read_replay(spark, replay)
                elif which == "replay_stream":
                    secs, rows = read_replay_stream(spark, replay, checkpoint)
                elif which == "source_all":
                    secs, rows = read_source(spark, root, checkpoint, includeAll="true")
                elif which == "source_empty":
                    secs, rows = read_source(spark, root, checkpoint, starting="latest")
                else:
                    secs, rows = read_parquet(spark, empty, schema, checkpoint)
                return secs, rows, process_tree_cpu_s() - cpu0

            # Warm-up: Python workers, the JIT, the page cache (the extra queries run after these
            # in every run, so they find everything warm).
            for which in KINDS:
                measure(which)
            runs: list[dict[str, Any]] = []
            for i in range(options.runs):
                order = KINDS[i % len(KINDS) :] + KINDS[: i % len(KINDS)]
                load_before = os.getloadavg()[0]
                got = {which: measure(which) for which in order + EXTRA_KINDS}
                load_after = os.getloadavg()[0]
                for which, (_, count, _) in got.items():
                    want = 0 if which in EMPTY_KINDS else n
                    if count != want:
                        raise AssertionError(f"{which} read {count} rows, expected {want}")
                secs = {which: got[which][0] for which in KINDS + EXTRA_KINDS}
                cpu = {which: got[which][2] for which in KINDS + EXTRA_KINDS}
                runs.append(
                    {
                        "order": list(order),
                        "load_avg_before": load_before,
                        "load_avg_after": load_after,
                        **{f"{k}_s": v for k, v in secs.items()},
                        **{f"{k}_cpu_s": v for k, v in cpu.items()},
                        **{f"{k}_rows_per_s": n / secs[k] for k in KINDS},
                        **{f"{k}_rows_per_cpu_s": n / cpu[k] for k in KINDS},
                        "source_over_parquet": secs["parquet"] / secs["source"],
                        "replay_over_parquet": secs["parquet"] / secs["replay"],
                        "source_over_parquet_cpu": cpu["parquet"] / cpu["source"],
                        "replay_over_parquet_cpu": cpu["parquet"] / cpu["replay"],
                        "source_over_floor": secs["replay_stream"] / secs["source"],
                        "source_over_floor_cpu": cpu["replay_stream"] / cpu["source"],
                        "source_all_over_source": secs["source"] / secs["source_all"],
                    }
                )
                log(
                    f"source: run {i + 1} (load {load_before:.1f} .. {load_after:.1f}): "
                    + ", ".join(f"{k} {secs[k]:.2f} s / {cpu[k]:.2f} CPU s" for k in secs)
                )
    finally:
        if owned:
            spark.stop()
    return _result(n, log_bytes, build_s, runs, notes)


def _result(
    n: int, log_bytes: int, build_s: float, runs: list[dict[str, Any]], notes: list[str]
) -> PartResult:
    loads = _col(runs, "load_avg_before") + _col(runs, "load_avg_after")
    notes.append(
        f"load average {min(loads):.1f} .. {max(loads):.1f} over the runs (2 vCPUs): compare "
        "the ratios, measured side by side, rather than the absolute figures"
    )
    return PartResult("source", _rows(n, runs), _data(n, log_bytes, build_s, runs), notes)


def _col(runs: list[dict[str, Any]], key: str) -> list[float]:
    """One figure of every run."""
    return [float(r[key]) for r in runs]


def _per_kind(runs: list[dict[str, Any]], figure: str) -> dict[str, list[float]]:
    """A figure (``rows_per_s``, ``rows_per_cpu_s``) of every run, per kind of read."""
    return {k: _col(runs, f"{k}_{figure}") for k in KINDS}


def _spread_row(name: str, unit: str, values: list[float], **extra: Any) -> Row:
    return Row(name, unit, median(values), min(values), max(values), **extra)


def _rows(n: int, runs: list[dict[str, Any]]) -> list[Row]:
    """The table: the source against parquet (its target) and against its floor (its
    target), the other kinds of read, CPU, the full row, and the queries reading nothing."""

    def col(key: str) -> list[float]:
        return _col(runs, key)

    rate = _per_kind(runs, "rows_per_s")
    per_cpu = _per_kind(runs, "rows_per_cpu_s")
    ratio = median(col("source_over_parquet"))
    floor_ratio = median(col("source_over_floor"))
    floor = f"streaming replay {median(rate['replay_stream']):,.0f} rows/s"
    baseline = f"parquet source {median(rate['parquet']):,.0f} rows/s"
    cpu_baseline = f"parquet source {median(per_cpu['parquet']):,.0f} rows/CPU-s"
    return [
        _spread_row(
            f"source -> noop, availableNow, {n:,} x {BODY_BYTES} B, default row",
            "rows/s",
            rate["source"],
            baseline=baseline,
            ratio=ratio,
            target=f">= {TARGET_RATIO:g} x parquet",
            met=ratio >= TARGET_RATIO,
        ),
        _spread_row(
            "source against its floor (the streaming replay)",
            "rows/s",
            rate["source"],
            baseline=floor,
            ratio=floor_ratio,
            target=f">= {FLOOR_TARGET:g} x its floor",
            met=floor_ratio >= FLOOR_TARGET,
        ),
        _spread_row("parquet file source -> noop, availableNow", "rows/s", rate["parquet"]),
        _spread_row(
            "replay: Python data source, pre-decoded batches -> noop",
            "rows/s",
            rate["replay"],
            baseline=baseline,
            ratio=median(col("replay_over_parquet")),
        ),
        _spread_row(
            "replay_stream: the same as a streaming query (the source's floor)",
            "rows/s",
            rate["replay_stream"],
            baseline=baseline,
        ),
        _spread_row(
            "source per CPU-second, against its floor's",
            "rows/CPU-s",
            per_cpu["source"],
            baseline=f"streaming replay {median(per_cpu['replay_stream']):,.0f} rows/CPU-s",
            ratio=median(col("source_over_floor_cpu")),
        ),
        *(
            _spread_row(
                f"{kind}, per CPU-second of every process",
                "rows/CPU-s",
                per_cpu[kind],
                baseline=cpu_baseline,
                ratio=median(col(f"{kind}_over_parquet_cpu")),
            )
            for kind in ("source", "replay")
        ),
        _spread_row(
            "source -> noop, includeAll (the full row, the old default)",
            "rows/s",
            [n / v for v in col("source_all_s")],
            baseline=f"default row {median(rate['source']):,.0f} rows/s",
            ratio=median(col("source_all_over_source")),
        ),
        _spread_row("source query reading nothing (latest)", "s", col("source_empty_s")),
        _spread_row("parquet query reading nothing (empty dir)", "s", col("parquet_empty_s")),
    ]


def _data(n: int, log_bytes: int, build_s: float, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the JSON file keeps: the setup, every run, and each figure's spread."""

    def col(key: str) -> list[float]:
        return _col(runs, key)

    return {
        "messages": n,
        "brokers": BROKERS,
        "queues_per_broker": QUEUES,
        "body_bytes": BODY_BYTES,
        "commitlog_bytes": log_bytes,
        "build_s": build_s,
        "runs": runs,
        **{f"{k}_rows_per_s": spread(v) for k, v in _per_kind(runs, "rows_per_s").items()},
        **{f"{k}_rows_per_cpu_s": spread(v) for k, v in _per_kind(runs, "rows_per_cpu_s").items()},
        "source_over_parquet": spread(col("source_over_parquet")),
        "replay_over_parquet": spread(col("replay_over_parquet")),
        "source_over_parquet_cpu": spread(col("source_over_parquet_cpu")),
        "replay_over_parquet_cpu": spread(col("replay_over_parquet_cpu")),
        "source_all_over_source": spread(col("source_all_over_source")),
        "source_over_floor": spread(col("source_over_floor")),
        "source_over_floor_cpu": spread(col("source_over_floor_cpu")),
        "source_empty_s": spread(col("source_empty_s")),
        "parquet_empty_s": spread(col("parquet_empty_s")),
    }
