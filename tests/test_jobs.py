"""The pipeline jobs (jobs/ingest.py, process.py, export.py), each run through its ``main()``
on the session's local Spark, with ``--trigger available-now`` so that every run ends by itself.

Stores are read back with the engine (``MessageStore``), independently of the source the jobs
read with; exported files are read through their ``_spark_metadata`` manifest, as Spark does.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rocketstore.jobs import export, ingest, process
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.engine.store import MessageStore
from tests.kit import ROOT
from tests.kit.jobfiles import STORE_TOML, committed_files

CONFIG = StoreConfig(
    mapped_file_size_commitlog=1 << 20, max_hash_slot_num=4096, max_index_num=65536
)
KINDS = ("NEW", "PAID", "SHIPPED")
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ORDER_DDL = "id BIGINT, customer STRING, kind STRING, amount DOUBLE, eventTime TIMESTAMP"


def store_args(tmp_path: Path, store_config: Path, topic: str, checkpoint: str) -> list[str]:
    """What every job here is given first: the store under ``tmp_path``, its settings, the
    topic and a checkpoint folder of ``tmp_path``."""
    return [
        "--store", str(tmp_path / "store"),
        "--store-config", str(store_config),
        "--topic", topic,
        "--checkpoint", str(tmp_path / checkpoint),
    ]  # fmt: skip


def orders(start: int, n: int) -> list[dict[str, Any]]:
    """Orders one second apart from BASE, 23 customers, three kinds."""
    return [
        {
            "id": i,
            "customer": f"customer-{i % 23}",
            "kind": KINDS[i % 3],
            "amount": round(1.5 * i, 2),
            "eventTime": (BASE + dt.timedelta(seconds=i)).isoformat().replace("+00:00", "Z"),
        }
        for i in range(start, start + n)
    ]


def write_json(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def stored(root: Path, topic: str) -> list[dict[str, Any]]:
    """Every message of ``topic`` in ``root``, with its broker, queue and decoded JSON body."""
    out = []
    for name, path in StoreRoot(root).brokers():
        with MessageStore(path, CONFIG, read_only=True) as store:
            for info in store.queue_infos(topic):
                got = store.get_messages(topic, info.queue_id, info.min_offset, 100_000)
                assert len(got.messages) == info.max_offset - info.min_offset
                for m in got.messages:
                    out.append(
                        {
                            "broker": name,
                            "queueId": m.queue_id,
                            "keys": list(m.keys),
                            "tags": m.properties.get("TAGS"),
                            "body": json.loads(m.body),
                        }
                    )
    return out


def read_output(output: Path, fmt: str = "parquet") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in committed_files(output):
        if fmt == "parquet":
            rows += pq.read_table(f).to_pylist()
        else:
            rows += [json.loads(line) for line in f.read_text().splitlines() if line]
    return rows


@pytest.fixture
def store_config(tmp_path: Path) -> Path:
    path = tmp_path / "store.toml"
    path.write_text(STORE_TOML)
    return path


def ingest_args(tmp_path: Path, store_config: Path, *extra: str) -> list[str]:
    return [
        *store_args(tmp_path, store_config, "orders", "ck-ingest"),
        "--input", str(tmp_path / "in"),
        "--schema", ORDER_DDL,
        "--key-column", "customer",
        "--tag-column", "kind",
        "--brokers", "2",
        "--queues", "2",
        "--trigger", "available-now",
        *extra,
    ]  # fmt: skip


# -- help and usage ---------------------------------------------------------------------------------


@pytest.mark.parametrize("job", [ingest, process, export])
def test_help_exits_0_and_documents_the_options(
    job: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert job.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {job.PROG}")
    for option in ("--store", "--checkpoint", "--trigger", "--timeout", "--store-config"):
        assert option in out


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert export.main(["--store", "x"]) == 2
    assert "required" in capsys.readouterr().err


def test_spark_submit_runs_a_job_as_a_script() -> None:
    """``spark-submit jobs/ingest.py`` runs the file as a script, not as a module of a package:
    its imports must still resolve."""
    submit = Path(sys.executable).parent / "spark-submit"
    done = subprocess.run(
        [str(submit), str(ROOT / "jobs" / "ingest.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYSPARK_PYTHON": sys.executable, "HOME": str(Path.home())},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: ingest" in done.stdout


# -- ingest -----------------------------------------------------------------------------------------


def test_ingest_json_files_each_row_once_across_restarts(
    spark: Any, tmp_path: Path, store_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = orders(0, 300), orders(300, 200)
    write_json(tmp_path / "in", "a.json", first)
    args = ingest_args(tmp_path, store_config, "--body-format", "json")
    assert ingest.main(args, spark=spark) == 0
    assert len(stored(tmp_path / "store", "orders")) == 300

    # A restart from the checkpoint reads only the file that arrived since.
    write_json(tmp_path / "in", "b.json", second)
    assert ingest.main(args, spark=spark) == 0
    assert "200 message(s) appended" in capsys.readouterr().err

    messages = stored(tmp_path / "store", "orders")
    assert sorted(m["body"]["id"] for m in messages) == list(range(500))
    by_id = {m["body"]["id"]: m for m in messages}
    for row in first + second:
        m = by_id[row["id"]]
        assert m["keys"] == [row["customer"]]
        assert m["tags"] == row["kind"]
        assert m["body"]["customer"] == row["customer"]
        assert m["body"]["amount"] == row["amount"]
    # One customer's orders share a queue: the key picks it.
    queues = {(m["broker"], m["queueId"]) for m in messages if m["keys"] == ["customer-5"]}
    assert len(queues) == 1
    assert {m["broker"] for m in messages} == {"broker-0", "broker-1"}


def test_ingest_csv_with_inferred_schema(spark: Any, tmp_path: Path, store_config: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("id,customer,kind\n1,c1,NEW\n2,c2,PAID\n3,c1,NEW\n")
    args = ingest_args(tmp_path, store_config, "--source", "csv", "--body-format", "json")
    args.remove("--schema")
    args.remove(ORDER_DDL)
    assert ingest.main(args, spark=spark) == 0
    got = sorted(
        (m["body"]["id"], m["tags"], m["keys"][0]) for m in stored(tmp_path / "store", "orders")
    )
    # inferSchema made id an integer, not the string "1".
    assert got == [(1, "NEW", "c1"), (2, "PAID", "c2"), (3, "NEW", "c1")]


def test_ingest_rate_source_until_timeout(spark: Any, tmp_path: Path, store_config: Path) -> None:
    args = [
        *store_args(tmp_path, store_config, "load", "ck"),
        "--source", "rate",
        "--rows-per-second", "200",
        "--body-format", "json",
        "--trigger", "1 second",
        "--timeout", "12",
    ]  # fmt: skip
    assert ingest.main(args, spark=spark) == 0
    values = [m["body"]["value"] for m in stored(tmp_path / "store", "load")]
    assert values, "the rate source produced nothing in 12 s"
    assert len(values) == len(set(values))
    # Rate values are consecutive from 0; the stop comes between micro-batches.
    assert sorted(values) == list(range(len(values)))


def test_ingest_bad_options_exit_2(
    spark: Any, tmp_path: Path, store_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ingest_args(tmp_path, store_config)
    assert ingest.main(args, spark=spark) == 2
    err = capsys.readouterr().err
    assert err.startswith("ingest: error: --input") and "no such directory" in err
    write_json(tmp_path / "in", "a.json", orders(0, 3))
    assert ingest.main([*args, "--tag-column", "nope"], spark=spark) == 2
    err = capsys.readouterr().err
    assert "ingest: error: no column nope" in err and "customer" in err


# -- process ---------------------------------------------------------------------------------------


WINDOW_SQL = """
SELECT date_format(window.start, "yyyy-MM-dd'T'HH:mm:ss") AS windowStart, kind AS keys,
       kind AS tags, count(*) AS orders, round(sum(amount), 2) AS revenue
FROM orders GROUP BY window(eventTime, '10 seconds'), kind
"""


@pytest.fixture
def order_store(spark: Any, tmp_path: Path, store_config: Path) -> list[dict[str, Any]]:
    """Topic orders (avro bodies) in tmp_path/store: 95 orders one second apart."""
    rows = orders(0, 95)
    write_json(tmp_path / "in", "a.json", rows)
    assert ingest.main(ingest_args(tmp_path, store_config), spark=spark) == 0
    return rows


def expected_windows(rows: list[dict[str, Any]], watermark_s: int) -> dict[tuple[str, str], int]:
    """(windowStart, kind) -> orders of each 10-second window the watermark has closed."""
    end = max(int(r["id"]) for r in rows) - watermark_s  # event times are BASE + id seconds
    out: Counter[tuple[str, str]] = Counter()
    for r in rows:
        start = int(r["id"]) // 10 * 10
        if start + 10 <= end:
            t = (BASE + dt.timedelta(seconds=start)).strftime("%Y-%m-%dT%H:%M:%S")
            out[(t, r["kind"])] += 1
    return dict(out)


def test_process_windowed_aggregation_into_a_topic(
    spark: Any, tmp_path: Path, store_config: Path, order_store: list[dict[str, Any]]
) -> None:
    args = [
        *store_args(tmp_path, store_config, "orders", "ck-process"),
        "--view", "orders",
        "--watermark", "eventTime=5 seconds",
        "--sql", WINDOW_SQL,
        "--output-topic", "stats",
        "--body-format", "json",
        "--brokers", "1",
        "--queues", "2",
        "--trigger", "available-now",
    ]  # fmt: skip
    assert process.main(args, spark=spark) == 0
    got = stored(tmp_path / "store", "stats")
    windows = {(m["body"]["windowStart"], m["tags"]): m["body"]["orders"] for m in got}
    # Append mode: each window once, when the watermark (max event time - 5 s) has passed it.
    assert len(windows) == len(got)
    assert windows == expected_windows(order_store, 5)
    assert all(m["keys"] == [m["tags"]] for m in got)


def test_process_into_json_files(
    spark: Any, tmp_path: Path, store_config: Path, order_store: list[dict[str, Any]]
) -> None:
    out = tmp_path / "out"
    args = [
        *store_args(tmp_path, store_config, "orders", "ck-process"),
        "--sql", "SELECT id, upper(customer) AS who FROM messages WHERE tags = 'PAID'",
        "--output", str(out),
        "--format", "json",
        "--trigger", "available-now",
    ]  # fmt: skip
    assert process.main(args, spark=spark) == 0
    rows = read_output(out, "json")
    expected = sorted((r["id"], r["customer"].upper()) for r in order_store if r["kind"] == "PAID")
    assert sorted((r["id"], r["who"]) for r in rows) == expected


def test_process_bad_sql_exits_2(
    spark: Any,
    tmp_path: Path,
    store_config: Path,
    order_store: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        *store_args(tmp_path, store_config, "orders", "ck-process"),
        "--sql", "SELECT nosuchcolumn FROM messages",
        "--format", "console",
    ]  # fmt: skip
    assert process.main(args, spark=spark) == 2
    err = capsys.readouterr().err
    assert "process: error: --sql" in err and "nosuchcolumn" in err


# -- export ----------------------------------------------------------------------------------------


def test_export_to_parquet_every_message_once(
    spark: Any, tmp_path: Path, store_config: Path, order_store: list[dict[str, Any]]
) -> None:
    out = tmp_path / "out"
    args = [
        *store_args(tmp_path, store_config, "orders", "ck-export"),
        "--output", str(out),
        "--max-messages-per-trigger", "40",
        "--with-column", "exportedAt=current_timestamp()",
        "--trigger", "available-now",
    ]  # fmt: skip
    assert export.main(args, spark=spark) == 0
    rows = read_output(out)
    assert sorted(r["id"] for r in rows) == [r["id"] for r in order_store]
    assert len({(r["brokerName"], r["queueId"], r["queueOffset"]) for r in rows}) == len(rows)
    first = next(r for r in rows if r["id"] == 7)
    assert first["customer"] == "customer-7" and first["tags"] == KINDS[7 % 3]
    assert first["keys"] == ["customer-7"] and first["topic"] == "orders"
    assert all(r["exportedAt"] >= r["storeTimestamp"] for r in rows)
    # 95 messages at most 40 per micro-batch: at least three batches.
    assert len(list((tmp_path / "ck-export" / "commits").glob("[0-9]*"))) >= 3

    # Nothing new: a second run exports nothing more.
    assert export.main(args, spark=spark) == 0
    assert len(read_output(out)) == len(rows)


def test_export_columns_and_unknown_column(
    spark: Any,
    tmp_path: Path,
    store_config: Path,
    order_store: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = [
        *store_args(tmp_path, store_config, "orders", "ck-export"),
        "--output", str(tmp_path / "out"),
        "--format", "json",
        "--sub-expression", "SHIPPED",
        "--trigger", "available-now",
    ]  # fmt: skip
    assert export.main([*base, "--columns", "id,nope"], spark=spark) == 2
    assert "--columns: no column nope" in capsys.readouterr().err
    assert export.main([*base, "--columns", "id,tags"], spark=spark) == 0
    rows = read_output(tmp_path / "out", "json")
    assert sorted(rows, key=lambda r: r["id"]) == [
        {"id": r["id"], "tags": "SHIPPED"} for r in order_store if r["kind"] == "SHIPPED"
    ]


def test_committed_files_reads_the_manifest(tmp_path: Path) -> None:
    """The test helper itself: files not in the manifest are not output."""
    out = tmp_path / "out"
    (out / "_spark_metadata").mkdir(parents=True)
    table = pa.table({"x": [1, 2]})
    pq.write_table(table, out / "a.parquet")
    pq.write_table(table, out / "stray.parquet")
    entry = {"path": f"file://{out / 'a.parquet'}", "action": "add"}
    (out / "_spark_metadata" / "0").write_text("v1\n" + json.dumps(entry) + "\n")
    assert [r["x"] for r in read_output(out)] == [1, 2]


# -- demo ------------------------------------------------------------------------------------------


def test_demo_runs_the_pipeline_and_accounts_for_every_order(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rocketstore.jobs import demo

    work = tmp_path / "demo"
    (work / "keep.txt").parent.mkdir()
    (work / "keep.txt").write_text("not the demo's")
    argv = ["--dir", str(work), "--seconds", "12", "--rate", "50", "--every", "4"]
    assert demo.main(argv, spark=spark) == 0
    out = capsys.readouterr().out

    assert "generator stopped; draining" in out
    assert out.count("] generated") >= 2, "expected progress lines while it ran"
    assert "every order is in the store once and in the export once" in out
    generated = int(out.split(" orders generated in ")[0].rsplit("\n", 1)[-1].replace(",", ""))
    assert generated >= 50 * 10  # about one file of 50 a second for 12 s
    assert f"orders: {generated:,} messages" in out
    for heading in (
        "Messages per topic and queue",
        "Throughput",
        "End-to-end latency",
        "Consumer lag",
    ):
        assert heading in out
    assert "after draining: 0" in out
    assert (work / "keep.txt").read_text() == "not the demo's"

    # The figures match the files: the export holds each order once.
    exported = read_output(work / "export" / "orders")
    ids = [r["orderId"] for r in exported]
    assert len(ids) == len(set(ids)) == generated
    assert all(r["storeTimestamp"] >= r["eventTime"] for r in exported)


# -- the sink gate ---------------------------------------------------------------------------------


class FakeBatch:
    """A stand-in for a micro-batch DataFrame (SinkGate only passes it on)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows


def test_sink_gate_closes_between_batches() -> None:
    import threading

    from rocketstore.jobs.sinkgate import SinkGate, StopRequested

    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []

    class BlockingSink:
        history: list[int] = calls

        def __call__(self, df: FakeBatch, batch_id: int) -> None:
            calls.append(batch_id)
            entered.set()
            assert release.wait(60)

    gate = SinkGate(BlockingSink())
    release.set()
    gate(FakeBatch(0), 0)  # type: ignore[arg-type]
    gate(FakeBatch(3), 1)  # type: ignore[arg-type]
    assert calls == [0, 1] and gate.history == [0, 1]

    release.clear()
    entered.clear()
    worker = threading.Thread(target=gate, args=(FakeBatch(5), 2))
    worker.start()
    assert entered.wait(60)
    # Batch 2 is appending: closing cannot complete until it has.
    assert gate.close(0.05) is False
    release.set()
    assert gate.close(60) is True
    worker.join(60)
    assert calls == [0, 1, 2]
    with pytest.raises(StopRequested, match=StopRequested.MARK):
        gate(FakeBatch(5), 3)  # type: ignore[arg-type]
    assert calls == [0, 1, 2]
