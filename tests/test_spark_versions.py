"""What each PySpark version runs: the table of docs/spark-versions.md, cell by cell.

The suite runs this module on the newest PySpark; ``make spark-matrix`` (tests/kit/sparkmatrix.py)
runs it again in a virtualenv per older version. What a version should offer is written here,
from its release (``pyspark.sql.datasource`` came in 4.0, admission control for Python sources in
4.2), not asked of rocketstore: where a version lacks an API, the test expects the clear error
that names what is needed, and fails if the feature works anyway or fails some other way.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark
import pytest
from chispa import assert_df_equality

from rocketstore.pipeline.errors import ConfigError, SparkVersionError
from rocketstore.sink.foreach import CommitLogSink
from tests.kit.connect_server import client
from tests.kit.jobfiles import STORE_TOML, committed_files
from tests.kit.sink import (
    INPUT_DDL,
    STORE_OPTIONS,
    check_exactly_once,
    finish,
    job,
    kill_mid_batch,
    read_back,
    write_input,
)
from tests.kit.sourcekit import body_of, ids_of, make_root, message_table, stream, write

pytestmark = pytest.mark.slow

VERSION = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
DATA_SOURCE = VERSION >= (4, 0)  # format("rocketstore"), reading and writing
ARROW_STREAM_WRITER = VERSION >= (4, 1)  # writeStream.format("rocketstore")
ADMISSION_CONTROL = VERSION >= (4, 2)  # maxMessagesPerTrigger and the like


def expect_version_error(exc: BaseException, needs: str) -> None:
    """``exc`` (or Spark's wrapping of it) is rocketstore's error naming ``needs`` and the
    running version."""
    text = str(exc)
    assert "needs PySpark " + needs in text, text[-2000:]
    assert f"this is {pyspark.__version__}" in text, text[-2000:]


def stream_rows(
    spark: Any, opts: Mapping[str, str], checkpoint: Path
) -> tuple[list[dict[str, Any]], list[int], list[dict[str, Any]]]:
    """Everything the source has now (availableNow): the rows, each non-empty micro-batch's
    count and the query's progress reports."""
    batches, progress = stream(spark, opts, checkpoint)
    return [r for b in batches for r in b], [len(b) for b in batches if b], progress


# -- the foreachBatch sink: every version ---------------------------------------------------------


def test_foreach_batch_sink_across_a_restart(spark: Any, tmp_path: Path) -> None:
    """CommitLogSink on a file stream: two runs of one checkpoint store each row once."""
    rows = write_input(tmp_path / "staged", files=3, rows_per_file=200)
    (tmp_path / "in").mkdir()
    root, ck = tmp_path / "store", tmp_path / "ck"

    def run(files: list[str]) -> CommitLogSink:
        for name in files:
            (tmp_path / "staged" / name).rename(tmp_path / "in" / name)
        sink = CommitLogSink(str(root), topic="orders", brokers=2, queues=2, **STORE_OPTIONS)
        df = spark.readStream.schema(INPUT_DDL).option("maxFilesPerTrigger", 1)
        query = (
            df.parquet(str(tmp_path / "in"))
            .drop("id")
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return sink

    first = run(["part-00000.parquet", "part-00001.parquet"])
    assert [s.rows for s in first.history] == [200, 200]
    second = run(["part-00002.parquet"])
    assert [s.rows for s in second.history] == [200]
    stored = read_back(root, "orders")
    assert sorted(s["body"] for s in stored) == sorted(r["body"] for r in rows)
    # The CLI, which never imports PySpark, reads what this version's sink wrote.
    config = tmp_path / "store.toml"
    config.write_text(STORE_TOML)
    for broker in ("broker-0", "broker-1"):
        cli = [sys.executable, "-m", "rocketstore.pipeline.cli", "verify", str(root / broker)]
        cli += ["--config", str(config)]
        done = subprocess.run(cli, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    loaded = [
        sys.executable,
        "-c",
        "import sys, rocketstore.pipeline.cli, rocketstore.pipeline.console; "
        "print(sorted(m for m in sys.modules if m.startswith('pyspark')))",
    ]
    assert subprocess.run(loaded, capture_output=True, text=True, check=True).stdout.strip() == "[]"


@pytest.mark.parametrize("face", ["foreach", "format"])
def test_sink_driver_killed_mid_batch_then_restarted(tmp_path: Path, face: str) -> None:
    """kill -9 of the driver with part of a micro-batch stored, then a restart: exactly once
    (the format face before 4.1: the query fails at its start, naming the version it needs)."""
    rows = write_input(tmp_path / "in", files=2, rows_per_file=300)
    if face == "format" and not ARROW_STREAM_WRITER:
        proc = job(tmp_path, "local[2]", face)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 1
        if DATA_SOURCE:
            expect_version_error(Exception(out + err), "4.1")
        else:
            # 3.5 looks the name up in the JVM, where rocketstore has nothing: Spark's own error
            # (importing rocketstore.datasource names the version: the test below).
            assert "Failed to find the data source: rocketstore" in out + err, err[-2000:]
        assert read_back(tmp_path / "store", "orders") == []
        return
    kill_mid_batch(tmp_path, face, rows)
    finish(job(tmp_path, "local[2]", face))
    check_exactly_once(tmp_path, rows)


# -- read_batch: the batch read through mapInArrow, every version ---------------------------------


def test_read_batch_without_the_data_source(spark: Any, tmp_path: Path) -> None:
    """rocketstore.source.batch.read_batch: every message, a key, a group's start and an
    offsets range, the columns the data source gives (compared with it where there is one)."""
    from rocketstore.source.batch import read_batch

    root = tmp_path / "root"
    ids = make_root(root, "orders", brokers=2, queues=2, count=30)
    base = {"path": str(root), "topic": "orders", "includeProperties": "true"}
    everything = read_batch(spark, base)
    expected = spark.createDataFrame(
        [(f"broker-{(i // 2) % 2}", i % 2, i // 4, body_of(i)) for i in ids],
        "brokerName string, queueId int, queueOffset long, body binary",
    )
    got = everything.select("brokerName", "queueId", "queueOffset", "body")
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)
    assert [
        int(r["properties"]["id"]) for r in read_batch(spark, {**base, "key": "k7"}).collect()
    ] == [7]
    ending = '{"orders": {"broker-0": {"0": 2, "1": 2}, "broker-1": {"0": 2, "1": 2}}}'
    head = read_batch(spark, {**base, "endingOffsets": ending}).collect()
    assert sorted(int(r["properties"]["id"]) for r in head) == [i for i in ids if i // 4 < 2]
    assert read_batch(spark, {**base, "topic": "orders", "subExpression": "TagA"}).count() == sum(
        1 for i in ids if i % 3 == 0
    )
    with pytest.raises(ConfigError, match="option startingOffsets"):
        read_batch(spark, {**base, "startingOffsets": "soon"})
    if DATA_SOURCE:
        loaded = spark.read.format("rocketstore").options(**base).load()
        assert loaded.schema == everything.schema

        def rows(df: Any) -> list[dict[str, Any]]:
            found = [r.asDict(recursive=True) for r in df.collect()]
            return sorted(found, key=lambda r: (r["brokerName"], r["queueId"], r["queueOffset"]))

        assert rows(everything) == rows(loaded)


# -- the jobs: ingest everywhere, process where the source is ----------------------------------


def test_ingest_then_process(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ingest job writes JSON files into a topic on every version; the process job reads
    the topic back through the source from 4.0, and before that fails naming the version."""
    from rocketstore.jobs import ingest, process

    (tmp_path / "in").mkdir()
    lines = [f'{{"id": {i}, "customer": "c{i % 7}", "kind": "K{i % 3}"}}' for i in range(120)]
    (tmp_path / "in" / "a.json").write_text("\n".join(lines) + "\n")
    config = tmp_path / "store.toml"
    config.write_text(STORE_TOML)
    common = ["--store", str(tmp_path / "store"), "--store-config", str(config)]
    common += ["--topic", "orders", "--trigger", "available-now"]
    args = [*common, "--checkpoint", str(tmp_path / "ck-ingest"), "--input", str(tmp_path / "in")]
    args += ["--schema", "id BIGINT, customer STRING, kind STRING", "--key-column", "customer"]
    args += ["--body-format", "json", "--brokers", "2", "--queues", "2"]
    assert ingest.main(args, spark=spark) == 0
    bodies = sorted(json.loads(s["body"])["id"] for s in read_back(tmp_path / "store", "orders"))
    assert bodies == list(range(120))

    out = tmp_path / "out"
    args = [*common, "--checkpoint", str(tmp_path / "ck-process"), "--output", str(out)]
    args += ["--sql", "SELECT id FROM messages", "--format", "json"]
    capsys.readouterr()
    if not DATA_SOURCE:
        assert process.main(args, spark=spark) == 2
        expect_version_error(Exception(capsys.readouterr().err), "4.0")
        return
    assert process.main(args, spark=spark) == 0
    got = sorted(
        json.loads(line)["id"] for f in committed_files(out) for line in f.read_text().splitlines()
    )
    assert got == list(range(120))


# -- format("rocketstore"): 4.0 and later ---------------------------------------------------------


def test_the_data_source_is_there_or_named_as_missing(spark: Any) -> None:
    if DATA_SOURCE:
        from rocketstore.datasource import RocketStoreDataSource, register

        register(spark)  # a second registration (4.0 refuses to replace its own) is fine
        assert RocketStoreDataSource.name() == "rocketstore"
        return
    with pytest.raises(SparkVersionError) as caught:
        import rocketstore.datasource  # noqa: F401
    expect_version_error(caught.value, "4.0")


def test_format_writer_streaming_and_batch(spark: Any, tmp_path: Path) -> None:
    if not DATA_SOURCE:
        pytest.skip("3.5 has no Python data source: the format face's error is the test above")
    rows = write_input(tmp_path / "in", files=2, rows_per_file=100)
    root = tmp_path / "store"
    bodies = sorted(r["body"] for r in rows)
    batch = spark.read.parquet(str(tmp_path / "in")).drop("id")
    writer = batch.write.format("rocketstore").mode("append").option("path", str(root))
    writer.option("topic", "again").options(**STORE_OPTIONS).save()
    assert sorted(s["body"] for s in read_back(root, "again")) == bodies

    df = spark.readStream.schema(INPUT_DDL).parquet(str(tmp_path / "in")).drop("id")
    query = (
        df.writeStream.format("rocketstore")
        .option("path", str(root))
        .option("topic", "orders")
        .options(**STORE_OPTIONS)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
    )
    if not ARROW_STREAM_WRITER:
        with pytest.raises(Exception) as caught:
            query.start().awaitTermination()
        expect_version_error(caught.value, "4.1")
        assert read_back(root, "orders") == []
        return
    query.start().awaitTermination()
    assert sorted(s["body"] for s in read_back(root, "orders")) == bodies


def test_source_streams_exactly_once_across_a_restart(spark: Any, tmp_path: Path) -> None:
    if not DATA_SOURCE:
        pytest.skip("3.5 has no Python data source: the format face's error is the test above")
    root, ck = tmp_path / "root", tmp_path / "ck"
    ids = make_root(root, "orders", brokers=2, queues=2, count=40)
    opts = {"path": str(root), "topic": "orders", "startingOffsets": "earliest"}
    opts["includeProperties"] = "true"
    first, _, progress = stream_rows(spark, opts, ck)
    assert ids_of(first) == ids
    # The store's newest offsets and the batch's end in the progress: JSON from 4.2 (the source
    # reports them, reportLatestOffset); before, Spark writes the source's dict in Python's
    # notation, single quotes and all.
    newest = {"orders": {"broker-0": {"0": 10, "1": 10}, "broker-1": {"0": 10, "1": 10}}}
    (source,) = [p["sources"][0] for p in progress if p["numInputRows"]]
    for shown in (source["latestOffset"], source["endOffset"]):
        if ADMISSION_CONTROL:
            assert json.loads(shown) == newest
        else:
            assert "'orders'" in shown and ast.literal_eval(shown) == newest
    more = list(range(40, 55))
    for b in range(2):
        write(root, b, message_table("orders", [i for i in more if (i // 2) % 2 == b], 2))
    second, _, _ = stream_rows(spark, opts, ck)
    assert ids_of(second) == more
    assert all(r["body"] == body_of(int(r["properties"]["id"])) for r in first + second)
    third, _, _ = stream_rows(spark, opts, ck)
    assert third == []


def test_batch_reads_a_key_and_a_group_start(spark: Any, tmp_path: Path) -> None:
    if not DATA_SOURCE:
        pytest.skip("3.5 has no Python data source: the format face's error is the test above")
    root = tmp_path / "root"
    ids = make_root(root, "orders", brokers=2, queues=2, count=30)
    base = {"path": str(root), "topic": "orders"}

    def read(**extra: str) -> Any:
        reader = spark.read.format("rocketstore")
        for k, v in {**base, **extra}.items():
            reader = reader.option(k, v)
        return reader.load()

    everything = read(includeProperties="true")
    assert sorted(int(r["properties"]["id"]) for r in everything.collect()) == ids
    expected = spark.createDataFrame(
        [(f"broker-{(i // 2) % 2}", i % 2, i // 4, body_of(i)) for i in ids],
        "brokerName string, queueId int, queueOffset long, body binary",
    )
    got = everything.select("brokerName", "queueId", "queueOffset", "body")
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)
    keyed = read(key="k7", includeProperties="true").collect()
    assert [int(r["properties"]["id"]) for r in keyed] == [7]
    # From where a RocketMQ consumer group committed: broker-0's queue 0 holds ids 0, 4, 8...
    config = root / "broker-0" / "config" / "consumerOffset.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_bytes(b'{"offsetTable":{"orders@billing":{0:5}}}')
    grouped = read(startingOffsets="group:billing", includeProperties="true").collect()
    skipped = {i for i in ids if (i // 2) % 2 == 0 and i % 2 == 0 and i // 4 < 5}
    assert sorted(int(r["properties"]["id"]) for r in grouped) == sorted(set(ids) - skipped)


def test_per_trigger_limits(spark: Any, tmp_path: Path) -> None:
    """maxMessagesPerTrigger bounds each micro-batch from 4.2; before it, the query fails at its
    start naming the option and the version (it would otherwise read everything at once)."""
    if not DATA_SOURCE:
        pytest.skip("3.5 has no Python data source: the format face's error is the test above")
    root = tmp_path / "root"
    ids = make_root(root, "orders", brokers=2, queues=2, count=50)
    opts = {"path": str(root), "topic": "orders", "startingOffsets": "earliest"}
    opts |= {"maxMessagesPerTrigger": "12", "includeProperties": "true"}
    if ADMISSION_CONTROL:
        rows, sizes, _ = stream_rows(spark, opts, tmp_path / "ck")
        assert sizes == [12, 12, 12, 12, 2]
        assert ids_of(rows) == ids
        return
    with pytest.raises(Exception) as caught:
        stream(spark, opts, tmp_path / "ck")
    expect_version_error(caught.value, "4.2")
    assert "option maxMessagesPerTrigger" in str(caught.value)


# -- Spark Connect: 4.0 and later ------------------------------------------------------------------


def test_connect_sink_and_source(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """From a Spark Connect client: the foreachBatch sink, then the source streaming what it
    wrote and reading it as a batch (no per-trigger limit before 4.2)."""
    if not DATA_SOURCE:
        pytest.skip("PySpark 3.5's package ships no Spark Connect server to test against")
    connect_url = request.getfixturevalue("connect_url")
    rows = write_input(tmp_path / "in", files=2, rows_per_file=150)
    root = tmp_path / "store"
    assert client(connect_url, "sink", tmp_path / "in", root, tmp_path / "ck")["error"] is None
    assert sorted(s["body"] for s in read_back(root, "orders")) == sorted(r["body"] for r in rows)

    source = tmp_path / "root"
    ids = make_root(source, "orders", brokers=2, queues=2, count=30)
    out, batch_out = tmp_path / "out", tmp_path / "batch"
    limit = "12" if ADMISSION_CONTROL else "all"
    report = client(connect_url, "source", source, tmp_path / "ck2", out, batch_out, limit)
    assert report["error"] is None
    expected = sorted(body_of(i) for i in ids)
    streamed = [r for f in committed_files(out) for r in pq.read_table(f).to_pylist()]
    assert sorted(r["body"] for r in streamed) == expected
    assert sorted(r["body"] for r in pq.read_table(batch_out).to_pylist()) == expected
