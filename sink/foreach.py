"""``CommitLogSink``: the ``foreachBatch`` face of the sink.

Per micro-batch (``__call__`` runs on the driver; the ``mapInArrow`` step on executors):

1. route, in Spark SQL: each row gets its message queue (RocketMQ's hash selector over the
   sharding key, with Java's own ``String.hashCode``) and a row number fixed by its input
   partition and position (``monotonically_increasing_id``), so a replay numbers rows the same;
2. shuffle: ``repartition(tasks, key)`` with, for each broker, a key value that Spark's hash
   partitioner sends to partition ``b % tasks``, so broker ``b``'s rows all land in one task
   (one writer per broker), sorted there by broker, then row number, in the JVM. ``tasks``
   is the ``writerTasks`` option, by default the brokers or Spark's default parallelism
   (the cores it runs tasks on), whichever is fewer: a task costs tens of milliseconds
   whether it has rows or not, so 64 brokers on ``local[2]`` are two tasks of 32 brokers,
   not 64 tasks of which most wait for a core and many get no rows. A micro-batch that Spark
   plans as one partition (a small file, a one-partition source) skips the shuffle: its one
   task is then the only writer of every broker and appends to them one after another,
   which saves a stage per batch;
3. append: a task takes each of its brokers' locks in turn and puts that broker's rows as
   they come, Spark's next Arrow batch received in a thread of its own while the native put
   of the current one runs (:func:`rocketstore.sink.writer.append_shuffled`), and flushes
   it once at the end; a broker none of the batch's rows route to is not opened. A re-run
   skips what an earlier attempt of the same batch already stored (see
   :mod:`rocketstore.sink.append`). Either way broker ``b``'s rows are written in the same
   order with the same UNIQ_KEYs (slot ``b``), so a replay finds what landed whichever way
   it runs, with whatever ``writerTasks``.

Exactly once: given a deterministic, replayable input (Spark's file sources, Kafka, the
rocketstore source, ``rate``), every row is stored once across task retries and driver
restarts. The sink id that keeps different queries apart is the streaming query's id, which
survives restarts from the same checkpoint (:mod:`rocketstore.sink.identity` finds it, in a classic
session and over Spark Connect alike).

Over Spark Connect the client pickles the sink and Spark runs the copy in a Python process
beside the server: that copy's ``last`` and ``history`` are the ones that change.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from rocketstore.pipeline import sparkapi
from rocketstore.sink.append import sink_fingerprint
from rocketstore.sink.identity import QueryIdentity
from rocketstore.sink.plan import Plan, prepare, route_batches
from rocketstore.sink.rows import queue_expression
from rocketstore.sink.settings import SinkSettings
from rocketstore.sink.writer import STATS_SCHEMA, append_routed, append_shuffled, stats_batch

log = logging.getLogger("rocketstore.sink")


@dataclasses.dataclass(frozen=True)
class BatchSummary:
    """What one micro-batch did, per broker (``skipped`` rows were stored by an earlier try)."""

    batch_id: int
    rows: int
    appended: int
    skipped: int
    bytes: int
    brokers: dict[str, int]
    shuffled: bool = True


class CommitLogSink:
    """A ``foreachBatch`` function that appends each micro-batch to a store root.

    ``CommitLogSink(path, topic="orders", brokers=4)``; keyword options are the sink's options
    (``queues``, ``sharding_key``, ``body_format``, ``config``, ``lock_timeout_ms``,
    ``sink_id``, ``writer_tasks``) and store settings by their RocketMQ names (``flushDiskType="SYNC_FLUSH"``).
    Options are checked here, so a bad one fails before the query starts.

    ``last`` holds the summary of the latest batch; ``history`` all of them.
    Not thread-safe: one query per instance.
    """

    def __init__(self, path: str, topic: str | None = None, **options: Any) -> None:
        renamed = {_option_name(k): v for k, v in options.items()}
        self.settings = SinkSettings.from_options({"path": path, "topic": topic, **renamed})
        self.last: BatchSummary | None = None
        self.history: list[BatchSummary] = []
        self._partition_keys: dict[int, list[int]] = {}
        self._query = QueryIdentity()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        arrow_schema = sparkapi.to_arrow(df.schema)
        plan = prepare(self.settings, arrow_schema)
        fp = sink_fingerprint(self.settings.sink_id or self._query.id_of(df, batch_id))

        shuffle = not _one_partition(df)

        def append_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            ctx = TaskContext.get()
            attempt = ctx.attemptNumber() if ctx is not None else 0
            routed = route_batches(plan, batches, 0)
            if shuffle:
                stats = append_shuffled(
                    plan.settings,
                    plan.queues,
                    routed,
                    batch_id=batch_id,
                    sink_fp=fp,
                    attempt=attempt,
                )
            else:
                stats = append_routed(
                    plan.settings,
                    plan.queues,
                    routed,
                    batch_id=batch_id,
                    sink_fp=fp,
                    slot=None,
                    attempt=attempt,
                )
            yield from stats_batch(stats)

        target = self._shuffled(df, plan, arrow_schema) if shuffle else df
        stats = target.mapInArrow(append_fn, from_arrow_schema(STATS_SCHEMA)).collect()
        self._record(batch_id, stats, plan, shuffle)

    def _shuffled(self, df: DataFrame, plan: Plan, arrow_schema: pa.Schema) -> DataFrame:
        """``df`` numbered, routed and shuffled into ``writerTasks`` partitions, each broker's
        rows in one of them.

        Routing runs in the JVM here (Java's ``String.hashCode`` through ``java_method``): the
        shuffle needs each row's broker, and the rows then cross into Python once, in the task
        that appends them. A one-partition batch skips all of this: its task numbers and routes
        its rows itself (:func:`rocketstore.sink.plan.route_batches`), by the same rules, with the same
        numbers (``monotonically_increasing_id`` of partition 0 counts from 0).
        """
        tasks = writer_tasks(df.sparkSession, plan.brokers, self.settings.writer_tasks)
        keys = self._keys_for(df.sparkSession, tasks)
        mq = queue_expression(arrow_schema, plan.layout, "`__rs_row`")
        broker = F.floor(F.col("__rs_mq") / F.lit(plan.queues)).cast("int")
        task = F.pmod(broker, F.lit(tasks))
        pk = F.try_element_at(F.array(*[F.lit(k) for k in keys]), task + F.lit(1))
        # Each select is a round trip to the JVM and an analysis of the plan, a fixed cost of
        # every micro-batch: two, and the partition key is an expression of the shuffle.
        numbered = df.select("*", F.monotonically_increasing_id().alias("__rs_row"))
        routed = numbered.select("*", F.expr(mq).alias("__rs_mq"))
        # Sorted in the JVM, so that the task can append each broker's rows in replay order as
        # they come, one broker after another.
        return routed.repartition(tasks, pk).sortWithinPartitions(broker, "__rs_row")

    def partitioned(self, df: DataFrame) -> DataFrame:
        """``df`` as the append step receives it: numbered, routed and shuffled into
        ``writerTasks`` partitions (for the benchmark's floor; ``__call__`` does the same)."""
        arrow_schema = sparkapi.to_arrow(df.schema)
        plan = prepare(self.settings, arrow_schema)
        return self._shuffled(df, plan, arrow_schema) if not _one_partition(df) else df

    def _keys_for(self, spark: SparkSession, n: int) -> list[int]:
        if n not in self._partition_keys:
            self._partition_keys[n] = partition_keys(spark, n)
        return self._partition_keys[n]

    def _record(self, batch_id: int, stats: list[Any], plan: Plan, shuffled: bool) -> None:
        per_broker: dict[str, int] = {}
        for s in stats:
            per_broker[s.broker] = per_broker.get(s.broker, 0) + s.appended
        summary = BatchSummary(
            batch_id,
            sum(s.rows for s in stats),
            sum(s.appended for s in stats),
            sum(s.skipped for s in stats),
            sum(s.bytes for s in stats),
            per_broker,
            shuffled,
        )
        self.last = summary
        self.history.append(summary)
        if summary.skipped:
            log.warning(
                "batch %d: %d row(s) were already stored by an earlier attempt and were skipped",
                batch_id,
                summary.skipped,
            )
        log.info("batch %d: appended %d rows to %s", batch_id, summary.appended, plan.settings.root)


def _one_partition(df: DataFrame) -> bool:
    """Whether Spark plans ``df`` as a single partition. Asked of the JVM's plan in a classic
    session; over Spark Connect there is no cheap way to ask, so the answer is no."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return False
    return bool(jdf.rdd().getNumPartitions() == 1)


def writer_tasks(spark: SparkSession, brokers: int, wanted: int | None) -> int:
    """How many tasks append a shuffled micro-batch: ``wanted`` (the ``writerTasks`` option),
    else Spark's default parallelism (``spark.default.parallelism``, or the cores of the
    executors: ``local[2]`` has 2), at most one per broker. Over Spark Connect, where the
    session has no SparkContext to ask, the configured default parallelism or else one task
    per broker."""
    if wanted is not None:
        return max(1, min(brokers, wanted))
    context = getattr(spark, "sparkContext", None)
    if context is not None:
        slots = int(context.defaultParallelism)
    else:
        configured = spark.conf.get("spark.default.parallelism", None)
        slots = int(configured) if configured else brokers
    return max(1, min(brokers, slots))


def partition_keys(spark: SparkSession, n: int) -> list[int]:
    """For each partition ``p < n``, an int that ``repartition(n, col)`` sends to partition ``p``.

    Spark's hash partitioner is ``pmod(hash(col), n)`` (Murmur3, seed 42), the SQL ``hash``
    function, so Spark itself finds the smallest such ints.
    """
    ids = F.col("id").cast("int")
    found = (
        spark.range(0, 64 * n + 1024)
        .select(ids.alias("k"), F.pmod(F.hash(ids), F.lit(n)).alias("p"))
        .groupBy("p")
        .agg(F.min("k").alias("k"))
        .collect()
    )
    by_partition = {int(r.p): int(r.k) for r in found}
    missing = [p for p in range(n) if p not in by_partition]
    if missing:
        raise RuntimeError(f"no hash pre-image found for partitions {missing} of {n}")
    return [by_partition[p] for p in range(n)]


def _option_name(name: str) -> str:
    """``sharding_key`` → ``shardingKey``; RocketMQ names pass through."""
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)
