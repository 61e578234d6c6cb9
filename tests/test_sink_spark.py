"""The sink through Spark: foreachBatch and format("rocketstore"), read back with the engine."""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rocketstore.pipeline.engine.root import StoreRoot, select_queues
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.bodyformat import BodySchema, decode_bodies
from rocketstore.pipeline.tools.verify.check import verify
from rocketstore.sink.foreach import CommitLogSink, partition_keys
from tests.kit.sink import CONFIG, INPUT_DDL, STORE_OPTIONS, check_stored, read_back, write_input


def stream(spark: SparkSession, folder: Path, files_per_batch: int = 1) -> DataFrame:
    reader = spark.readStream.schema(INPUT_DDL).option("maxFilesPerTrigger", files_per_batch)
    return reader.parquet(str(folder))


def run_foreach(df: DataFrame, sink: CommitLogSink, checkpoint: Path) -> None:
    q = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()


def test_partition_keys_send_each_broker_to_its_own_task(spark: SparkSession) -> None:
    keys = partition_keys(spark, 5)
    df = spark.createDataFrame([(b, k) for b, k in enumerate(keys)], "b int, k int")
    placed = df.repartition(5, "k").select("b", F.spark_partition_id().alias("p")).collect()
    assert sorted((r.b, r.p) for r in placed) == [(b, b) for b in range(5)]


@pytest.mark.parametrize("files_per_batch", [1, 2])
def test_foreach_batch_sink_stores_every_row_once(
    spark: SparkSession, tmp_path: Path, files_per_batch: int
) -> None:
    """One file a micro-batch is one partition, which the sink appends without a shuffle; two
    files are two partitions, shuffled into one task per broker. (Spark packs a batch's files
    into partitions largest first, so across two files the sink's order, which is the
    partitions' order, is not the ids' order.)"""
    rows = write_input(tmp_path / "in", files=4, rows_per_file=300)
    root = tmp_path / "store"
    sink = CommitLogSink(str(root), topic="orders", brokers=3, queues=2, **STORE_OPTIONS)
    df = stream(spark, tmp_path / "in", files_per_batch).drop("id")
    run_foreach(df, sink, tmp_path / "ck")
    per_batch = 300 * files_per_batch
    assert [s.rows for s in sink.history] == [per_batch] * (4 // files_per_batch)
    assert [s.shuffled for s in sink.history] == [files_per_batch > 1] * (4 // files_per_batch)
    assert sum(s.skipped for s in sink.history) == 0
    stored = read_back(root, "orders")
    check_stored(spark, rows, stored, 6, 2, ordered=files_per_batch == 1)
    # A root's brokers stamp ports 10 apart (rocketstore.sink.writer.broker_config), so msgIds differ.
    assert len({s["msgId"] for s in stored}) == len(stored)
    meta = StoreRoot(root).topic("orders")
    assert meta is not None and (meta.brokers, meta.queues) == (3, 2)
    for _, path in StoreRoot(root).brokers():
        with MessageStore(path, CONFIG, read_only=True) as store:
            assert verify(store).ok


def test_one_partition_batches_store_what_the_shuffle_would(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same rows, same queues, same order and the same UNIQ_KEYs whether a one-partition batch
    is routed by its own task or shuffled: a replay finds what landed either way."""
    write_input(tmp_path / "in", files=2, rows_per_file=250)
    placed = {}
    for shuffle in (False, True):
        monkeypatch.setattr("rocketstore.sink.foreach._one_partition", lambda df, s=shuffle: not s)
        sink = CommitLogSink(
            str(tmp_path / f"store-{shuffle}"),
            topic="orders",
            brokers=2,
            queues=3,
            sink_id="one-id-for-both",  # the UNIQ_KEYs' sink part would differ by query id
            **STORE_OPTIONS,
        )
        run_foreach(stream(spark, tmp_path / "in").drop("id"), sink, tmp_path / f"ck-{shuffle}")
        assert [s.shuffled for s in sink.history] == [shuffle, shuffle]
        placed[shuffle] = [
            (m["broker"], m["queueId"], m["queueOffset"], m["body"], m["uniqKey"])
            for m in read_back(tmp_path / f"store-{shuffle}", "orders")
        ]
    assert len(placed[True]) == 500
    assert placed[False] == placed[True]


def test_format_sink_streaming_and_batch(spark: SparkSession, tmp_path: Path) -> None:
    rows = write_input(tmp_path / "in", files=2, rows_per_file=300)
    root = tmp_path / "store"
    q = (
        stream(spark, tmp_path / "in")
        .drop("id")
        .writeStream.format("rocketstore")
        .option("path", str(root))
        .option("topic", "orders")
        .option("brokers", 2)
        .options(**STORE_OPTIONS)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    check_stored(spark, rows, read_back(root, "orders"), 8, 4)
    batch = spark.read.parquet(str(tmp_path / "in")).drop("id")
    batch.write.format("rocketstore").mode("append").option("path", str(root)).option(
        "topic", "again"
    ).options(**STORE_OPTIONS).save()
    # A new topic gets 4 x 4. A batch read has no order across its partitions, and the data
    # source writer appends each partition as it comes: no order to check.
    check_stored(spark, rows, read_back(root, "again"), 16, 4, ordered=False)
    with pytest.raises(Exception, match="append-only"):
        batch.write.format("rocketstore").mode("overwrite").option("path", str(root)).option(
            "topic", "again"
        ).save()


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_row_bodies_round_trip(spark: SparkSession, tmp_path: Path, fmt: str) -> None:
    df = (
        spark.createDataFrame(
            [
                (
                    f"c{i % 5}",
                    i,
                    float(i) / 4,
                    None if i % 3 == 0 else f"sku-{i}",
                    [i, i + 1],
                    {"a": i},
                    (i, f"n{i}"),
                )
                for i in range(60)
            ],
            "keys string, id long, amount double, sku string, qty array<int>, "
            "extra map<string,int>, nested struct<x:int,y:string>",
        )
        .withColumn("at", F.timestamp_seconds(F.col("id") * 1000))
        .withColumn("day", F.to_date(F.col("at")))
    )
    root = tmp_path / "store"
    CommitLogSink(str(root), topic="rows", brokers=2, body_format=fmt, **STORE_OPTIONS)(df, 0)
    stored = read_back(root, "rows")
    assert len(stored) == 60
    meta = StoreRoot(root).topic("rows")
    assert meta is not None and meta.body_format == fmt and len(meta.schemas) == 1
    schema = BodySchema.from_document(StoreRoot(root).load_schema(meta.schemas[0]))
    table = decode_bodies(
        [s["body"] for s in stored],
        [s["schema"] for s in stored],
        fmt,
        schema,
        lambda fp: BodySchema.from_document(StoreRoot(root).load_schema(fp)),
        lambda i: ("body", i),
    )
    got = spark.createDataFrame(table, df.drop("keys").schema)
    # Spark cannot sort maps, so order both sides by id instead of ignore_row_order.
    assert_df_equality(got.orderBy("id"), df.drop("keys").orderBy("id"))


def test_bad_rows_fail_the_query_naming_column_and_count(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    df = spark.createDataFrame(
        [("k1", b"ok"), ("k1", None), ("k1", None)], "keys string, body binary"
    )
    with pytest.raises(Exception, match=r"body.*2 row") as err:
        CommitLogSink(str(root), topic="orders", brokers=1, **STORE_OPTIONS)(df, 0)
    assert "body is null" in str(err.value)
    # The broker's task validated before appending: the good row is not stored either.
    assert read_back(root, "orders") == []
    with pytest.raises(Exception, match="column flag: expected an integer"):
        CommitLogSink(str(root), topic="orders")(df.withColumn("flag", F.lit("x")), 0)
    with pytest.raises(Exception, match="option topic='a/b'"):
        CommitLogSink(str(root), topic="a/b")


def test_two_queries_writing_one_root_at_once(spark: SparkSession, tmp_path: Path) -> None:
    rows_a = write_input(tmp_path / "a", files=3, rows_per_file=200)
    rows_b = write_input(tmp_path / "b", files=3, rows_per_file=200)
    root = tmp_path / "store"
    sinks = [
        CommitLogSink(str(root), topic="orders", brokers=2, queues=2, **STORE_OPTIONS),
        CommitLogSink(str(root), topic="orders", brokers=2, queues=2, **STORE_OPTIONS),
    ]
    queries = [
        stream(spark, tmp_path / name)
        .drop("id")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / f"ck-{name}"))
        .trigger(availableNow=True)
        .start()
        for name, sink in zip(["a", "b"], sinks, strict=True)
    ]
    errors: list[BaseException] = []

    def wait(q: Any) -> None:
        try:
            q.awaitTermination()
        except StreamingQueryException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=wait, args=(q,)) for q in queries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # Both wrote ids 0..599: each id must be there exactly twice (once per query).
    stored = read_back(root, "orders")
    counts = collections.Counter(s["body"] for s in stored)
    assert len(stored) == 1200 and set(counts.values()) == {2}
    assert {r["body"] for r in rows_a} == {r["body"] for r in rows_b} == set(counts)
    for _, path in StoreRoot(root).brokers():
        with MessageStore(path, CONFIG, read_only=True) as store:
            assert verify(store).ok


# Keys with every kind of spacing: runs, leading and trailing, only spaces, empty, and a tab
# (which separates nothing).
SPACED = ["k{}  extra", "k{}", " k{}", "k{} ", "   ", "", "a  b   k{}", " k{}\tx  y ", "k{} z"]


def test_spark_routing_matches_the_numpy_routing(spark: SparkSession) -> None:
    """The SQL expression foreachBatch routes with and the numpy routing of the data source
    writer choose the same queue for every row (string keys, array keys, no key, queueId)."""
    import numpy as np
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from rocketstore.sink.rows import Layout, queue_expression, route

    df = spark.createDataFrame(
        [
            (
                i,
                SPACED[i % len(SPACED)].format(i % 97) if i % 11 else None,
                [f"a{i}", "b"],
                i % 9 if i % 5 == 0 else None,
            )
            for i in range(400)
        ],
        "row long, keys string, arr array<string>, queueId int",
    )
    for keys_col in ("keys", "arr"):
        picked = df.select("row", F.col(keys_col).alias("keys"), "queueId")
        layout = Layout("t", 12, None, "binary", None)
        sql = picked.withColumn(
            "mq", F.expr(queue_expression(to_arrow_schema(picked.schema), layout, "row"))
        )
        got = [r.mq for r in sql.orderBy("row").collect()]
        table = pa.Table.from_pylist(
            [r.asDict() for r in picked.orderBy("row").collect()], to_arrow_schema(picked.schema)
        )
        batch = (
            table.drop_columns(["row"])
            .append_column("body", pa.array([b"x"] * 400))
            .to_batches()[0]
        )
        expected = route(batch, layout, 0).column("__rs_mq").to_pylist()
        assert got == expected, keys_col
        assert np.unique(got).size == 12


def test_empty_batches_and_brokers_without_rows(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "store"
    sink = CommitLogSink(str(root), topic="orders", brokers=2, queues=2, **STORE_OPTIONS)
    schema = "keys string, body binary"
    sink(spark.createDataFrame([], schema), 0)
    # One key: every row routes to one queue of one broker; the other broker's task is empty.
    sink(spark.createDataFrame([("only-key", b"m%d" % i) for i in range(5)], schema), 1)
    assert [(h.batch_id, h.rows) for h in sink.history] == [(0, 0), (1, 5)]
    stored = read_back(root, "orders")
    assert [s["body"] for s in sorted(stored, key=lambda s: s["queueOffset"])] == [
        b"m%d" % i for i in range(5)
    ]
    assert len({(s["broker"], s["queueId"]) for s in stored}) == 1


def keys_of_brokers(brokers: set[int], n: int, total_brokers: int, queues: int) -> list[str]:
    """``n`` keys that RocketMQ's hash selector sends to ``brokers``, taking the brokers in
    turn."""
    candidates = [f"customer-{i}" for i in range(50 * n + 1000)]
    mq = select_queues(pa.array(candidates), np.arange(len(candidates)), total_brokers * queues)
    found: dict[int, list[str]] = {b: [] for b in brokers}
    for key, b in zip(candidates, (mq // queues).tolist(), strict=True):
        if b in found:
            found[b].append(key)
    ordered = sorted(brokers)
    return [found[ordered[k % len(ordered)]][k // len(ordered)] for k in range(n)]


def test_sixty_four_brokers_on_two_cores(spark: SparkSession, tmp_path: Path) -> None:
    """brokers=64 on local[2]: a micro-batch is shuffled into two tasks (the session's default
    parallelism), not 64 that wait for a core and mostly get no rows; a batch whose rows route
    to three brokers opens those three only, its replay stores nothing more, and a batch over
    every broker lands whole and reads back through the source."""
    root = tmp_path / "store"
    sink = CommitLogSink(
        str(root), topic="orders", brokers=64, queues=2, sink_id="many", **STORE_OPTIONS
    )
    schema = "keys string, body binary"
    few_keys = keys_of_brokers({5, 17, 40}, 60, 64, 2)
    few = spark.createDataFrame(
        [(k, b"few %d" % i) for i, k in enumerate(few_keys)], schema
    ).repartition(2)
    assert sink.partitioned(few).rdd.getNumPartitions() == 2
    assert (
        CommitLogSink(str(root), topic="orders", writer_tasks=5)
        .partitioned(few)
        .rdd.getNumPartitions()
        == 5
    )
    sink(few, 0)
    assert sink.last is not None and sink.last.shuffled
    assert sink.last.brokers == {"broker-5": 20, "broker-17": 20, "broker-40": 20}
    assert sorted(p.name for p in root.glob("broker-*")) == ["broker-17", "broker-40", "broker-5"]
    sink(few, 0)  # the same batch again, as after a restart
    assert (sink.last.appended, sink.last.skipped) == (0, 60)

    every_keys = keys_of_brokers(set(range(64)), 128, 64, 2)
    every = spark.createDataFrame(
        [(k, b"every %d" % i) for i, k in enumerate(every_keys)], schema
    ).repartition(2)
    sink(every, 1)
    assert sink.last.appended == 128 and len(sink.last.brokers) == 64
    read = spark.read.format("rocketstore").option("path", str(root)).option("topic", "orders")
    got = read.load().select(F.col("keys")[0].alias("keys"), F.col("body"))
    expected = spark.createDataFrame(
        [(k, b"few %d" % i) for i, k in enumerate(few_keys)]
        + [(k, b"every %d" % i) for i, k in enumerate(every_keys)],
        schema,
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)
