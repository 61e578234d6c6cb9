"""The sink, the source and the jobs from a Spark Connect client, against one Spark Connect
server on 127.0.0.1 for the whole run (the ``connect_url`` fixture).

The client side runs in processes of its own (tests/procs/connect_client.py and the jobs' command
lines); this process checks what landed, with the engine and the classic session.
"""

from __future__ import annotations

import collections
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit.connect_server import client, run
from tests.kit.jobfiles import STORE_TOML, committed_files
from tests.kit.sink import CONFIG, check_stored, read_back, write_input
from tests.kit.sourcekit import body_of, make_root, message_table, write

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def checkpoint_query_id(checkpoint: Path) -> str:
    """The query id Spark recorded in the checkpoint (its ``metadata`` file)."""
    meta: dict[str, str] = json.loads((checkpoint / "metadata").read_text())
    return meta["id"]


def sink_fp(query_id: str) -> str:
    """The UNIQ_KEY prefix of the rows a sink with this id writes (sink/append.py's layout)."""
    return hashlib.sha1(query_id.encode()).hexdigest()[:8].upper()


def verify_root(root: Path) -> None:
    for _, path in StoreRoot(root).brokers():
        with MessageStore(path, CONFIG, read_only=True) as store:
            assert verify(store).ok


def test_foreach_batch_sink_is_exactly_once_across_a_failed_run(
    connect_server: Any, spark: SparkSession, tmp_path: Path
) -> None:
    connect_url = connect_server.url
    rows = write_input(tmp_path / "in", files=3, rows_per_file=300)
    root, ck = tmp_path / "store", tmp_path / "ck"
    # The server's tasks get one attempt: a broker task that stops after 2 chunks of 50 fails
    # the micro-batch and the query, with part of the batch stored. The failpoint is armed
    # through the file the server's environment names (see sink/append.py).
    fired = tmp_path / "fired"
    connect_server.failpoint_file.write_text(f"after_chunk:2:{fired}")
    try:
        failed = client(connect_url, "sink", tmp_path / "in", root, ck)
    finally:
        connect_server.failpoint_file.unlink()
    assert failed["error"] is not None and "failpoint after_chunk:2" in failed["error"]
    assert fired.read_text().startswith("after_chunk ")
    landed = read_back(root, "orders")
    assert 0 < len(landed) < len(rows)
    done = client(connect_url, "sink", tmp_path / "in", root, ck)
    assert done["error"] is None
    query_id = checkpoint_query_id(ck)
    assert failed["queryIds"] == done["queryIds"] == [query_id]
    stored = read_back(root, "orders")
    check_stored(spark, rows, stored, 4, 2)
    # Both runs wrote as the query the checkpoint names, so the second recognised the first's.
    assert {s["uniqKey"][:8] for s in stored} == {sink_fp(query_id)}
    verify_root(root)


def test_two_queries_of_one_session_write_as_themselves(connect_url: str, tmp_path: Path) -> None:
    rows = write_input(tmp_path / "a", files=3, rows_per_file=200)
    write_input(tmp_path / "b", files=3, rows_per_file=200)
    root = tmp_path / "store"
    report = client(
        connect_url, "two-sinks", tmp_path / "a", tmp_path / "b", root, tmp_path / "ck-a",
        tmp_path / "ck-b",
    )  # fmt: skip
    assert report["error"] is None
    ids = [checkpoint_query_id(tmp_path / ck) for ck in ("ck-a", "ck-b")]
    assert report["queryIds"] == ids
    stored = read_back(root, "orders")
    # Both queries wrote the same rows: each is there once per query, under its own id.
    assert collections.Counter(s["body"] for s in stored) == {r["body"]: 2 for r in rows}
    assert collections.Counter(s["uniqKey"][:8] for s in stored) == {
        sink_fp(ids[0]): len(rows),
        sink_fp(ids[1]): len(rows),
    }
    verify_root(root)


def test_format_writers(connect_url: str, spark: SparkSession, tmp_path: Path) -> None:
    rows = write_input(tmp_path / "in", files=2, rows_per_file=300)
    root = tmp_path / "store"
    report = client(connect_url, "format", tmp_path / "in", root, tmp_path / "ck")
    assert report["error"] is None
    check_stored(spark, rows, read_back(root, "orders"), 4, 2)
    # The batch write went to a new topic of 4 x 4, its partitions in no particular order.
    check_stored(spark, rows, read_back(root, "again"), 16, 4, ordered=False)
    verify_root(root)


def test_source_streams_exactly_the_messages_and_reads_them(
    connect_url: str, spark: SparkSession, tmp_path: Path
) -> None:
    root, ck, out, batch_out = (tmp_path / n for n in ("root", "ck", "out", "batch"))
    ids = make_root(root, "orders", brokers=2, queues=2, count=30)
    assert client(connect_url, "source", root, ck, out, batch_out)["error"] is None
    # More messages, then a restart from the checkpoint: it reads only those.
    more = list(range(30, 45))
    for b in range(2):
        write(root, b, message_table("orders", [i for i in more if (i // 2) % 2 == b], 2))
    assert client(connect_url, "source", root, ck, out, batch_out)["error"] is None

    # make_root and the writes above put message i in broker (i // 2) % 2, queue i % 2, at
    # queue offset i // 4.
    expected = spark.createDataFrame(
        [(f"broker-{(i // 2) % 2}", i % 2, i // 4, body_of(i)) for i in [*ids, *more]],
        "brokerName string, queueId int, queueOffset long, body binary",
    )
    streamed = [r for f in committed_files(out) for r in pq.read_table(f).to_pylist()]
    got = spark.createDataFrame(streamed, expected.schema)
    assert_df_equality(got, expected, ignore_row_order=True)
    batch = spark.read.parquet(str(batch_out))
    assert_df_equality(batch, expected, ignore_row_order=True, ignore_nullable=True)


def test_ingest_and_export_jobs(connect_url: str, tmp_path: Path) -> None:
    incoming = tmp_path / "in"
    incoming.mkdir()
    for part in range(2):
        (incoming / f"part-{part}.json").write_text(
            "".join(
                json.dumps({"id": i, "customer": f"c{i % 37}"}) + "\n"
                for i in range(part * 500, (part + 1) * 500)
            )
        )
    store, config = tmp_path / "store", tmp_path / "store.toml"
    config.write_text(STORE_TOML)
    common = ["--store", str(store), "--store-config", str(config), "--topic", "events"]
    ingested = run(
        [
            sys.executable, "-m", "rocketstore.jobs.ingest", "--remote", connect_url, *common,
            "--checkpoint", str(tmp_path / "ck-ingest"),
            "--input", str(incoming),
            "--schema", "id BIGINT, customer STRING",
            "--key-column", "customer",
            "--brokers", "2",
            "--max-files-per-trigger", "1",
            "--trigger", "available-now",
        ]
    )  # fmt: skip
    assert "1000 row(s) read and stored" in ingested.stderr
    out = tmp_path / "out"
    # export takes the server from SPARK_REMOTE.
    run(
        [
            sys.executable, "-m", "rocketstore.jobs.export", *common,
            "--checkpoint", str(tmp_path / "ck-export"),
            "--output", str(out),
            "--max-messages-per-trigger", "400",
            "--trigger", "available-now",
        ],
        env={"SPARK_REMOTE": connect_url},
    )  # fmt: skip
    exported = [r for f in committed_files(out) for r in pq.read_table(f).to_pylist()]
    assert sorted(r["id"] for r in exported) == list(range(1000))
    assert all(r["keys"] == [r["customer"]] for r in exported)
    assert {r["brokerName"] for r in exported} == {"broker-0", "broker-1"}


def test_remote_must_be_a_connect_url(capsys: pytest.CaptureFixture[str]) -> None:
    from rocketstore.jobs import export

    args = ["--store", "/s", "--topic", "t", "--checkpoint", "/ck", "--output", "/o"]
    assert export.main(["--remote", "127.0.0.1:15002", *args]) == 2
    err = capsys.readouterr().err
    assert "export: error: --remote '127.0.0.1:15002': expected a Spark Connect URL" in err
