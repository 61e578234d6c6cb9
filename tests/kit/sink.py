"""The sink tests' shared pieces: their input (rows, Parquet files, the schema and its Spark
DDL) and store settings; an engine-side read-back of a root; what the Spark tests check of what
a query stored (every row once, intact, in the queue its key hashes to, in order per key); and
running tests/procs/sink_job.py (a sink query in a driver of its own) and checking what it
stored, for the sink fault tests, the real-EIO tests and the Spark version tests."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.bodyformat import SCHEMA_PROPERTY
from rocketstore.pipeline.format.javahash import java_hash
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit import PROCS, ROOT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# Small segments so that tests roll files; the same settings go to the sink as options.
STORE_OPTIONS = {
    "mappedFileSizeCommitLog": str(1 << 20),
    "maxHashSlotNum": "4096",
    "maxIndexNum": "65536",
}
CONFIG = StoreConfig(
    mapped_file_size_commitlog=1 << 20, max_hash_slot_num=4096, max_index_num=65536
)
TAGS = ["TagA", "TagB", "TagC"]


def order_rows(start: int, n: int) -> list[dict[str, Any]]:
    """Rows with every sink column; ``id`` orders one customer's rows."""
    return [
        {
            "id": i,
            "keys": f"customer-{i % 23}",
            "tags": TAGS[i % 3] if i % 7 else None,
            "properties": {"source": "test", "n": str(i)} if i % 5 else None,
            "flag": i % 4,
            "body": f"order {i}".encode(),
        }
        for i in range(start, start + n)
    ]


INPUT_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("keys", pa.string()),
        ("tags", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("flag", pa.int32()),
        ("body", pa.binary()),
    ]
)


# INPUT_SCHEMA as Spark DDL: how the sink tests' queries read the input files.
INPUT_DDL = (
    "id long, keys string, tags string, properties map<string,string>, flag int, body binary"
)


def write_input(folder: Path, files: int, rows_per_file: int) -> list[dict[str, Any]]:
    """Parquet files ``part-00000.parquet``... and the rows they hold, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    everything = []
    # Spark's file source takes new files oldest first, and files written within one
    # millisecond tie: a second apart, they are taken in the order of their rows.
    t0 = time.time() - 3600
    for f in range(files):
        rows = order_rows(f * rows_per_file, rows_per_file)
        path = folder / f"part-{f:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, INPUT_SCHEMA), path)
        os.utime(path, (t0 + f, t0 + f))
        everything += rows
    return everything


def read_back(root: Path, topic: str) -> list[dict[str, Any]]:
    """Every message of ``topic`` in every broker, with where it is stored."""
    out = []
    for name, path in StoreRoot(root).brokers():
        with MessageStore(path, CONFIG, read_only=True) as store:
            for info in store.queue_infos(topic):
                offset = info.min_offset
                while offset < info.max_offset:
                    got = store.get_messages(topic, info.queue_id, offset, 1000).messages
                    assert got, f"{name} queue {info.queue_id}: nothing at offset {offset}"
                    for m in got:
                        props = {
                            k: v
                            for k, v in m.properties.items()
                            if k not in ("KEYS", "TAGS", "UNIQ_KEY", "WAIT")
                        }
                        out.append(
                            {
                                "broker": name,
                                "queueId": m.queue_id,
                                "queueOffset": m.queue_offset,
                                "keys": " ".join(m.keys) or None,
                                "tags": m.properties.get("TAGS"),
                                "properties": props,
                                "flag": m.flag,
                                "body": m.body,
                                "uniqKey": m.uniq_key,
                                "msgId": m.msg_id,
                                "schema": props.pop(SCHEMA_PROPERTY, None),
                            }
                        )
                    offset = got[-1].queue_offset + 1
    return out


def check_stored(
    spark: SparkSession,
    rows: list[dict[str, Any]],
    stored: list[dict[str, Any]],
    total_queues: int,
    queues: int,
    ordered: bool = True,
) -> None:
    """Every input row exactly once, intact, in its hash-selected queue, and (``ordered``) in
    id order per key."""
    from chispa import assert_df_equality

    def props(p: dict[str, str] | list[tuple[str, str]] | None) -> str:
        # chispa sorts and compares whole rows, and Spark cannot order maps: compare as text.
        items = dict(p or {})
        return ",".join(f"{k}={v}" for k, v in sorted(items.items()))

    compared = "id long, keys string, tags string, properties string, flag int, body binary"
    expected = spark.createDataFrame(
        sorted(
            (r["id"], r["keys"], r["tags"], props(r["properties"]), r["flag"], r["body"])
            for r in rows
        ),
        compared,
    )
    got = spark.createDataFrame(
        sorted(
            (
                int(s["body"].split()[1]),
                s["keys"],
                s["tags"],
                props(s["properties"]),
                s["flag"],
                s["body"],
            )
            for s in stored
        ),
        compared,
    )
    assert_df_equality(got, expected)
    per_queue: dict[tuple[str, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for s in stored:
        mq = abs(java_hash(s["keys"])) % total_queues
        assert (s["broker"], s["queueId"]) == (f"broker-{mq // queues}", mq % queues)
        per_queue[(s["broker"], s["queueId"])].append(s)
    for msgs in per_queue.values():
        msgs.sort(key=lambda s: s["queueOffset"])
        assert [s["queueOffset"] for s in msgs] == list(range(len(msgs)))
        by_key: dict[str, list[int]] = collections.defaultdict(list)
        for s in msgs:
            by_key[s["keys"]].append(int(s["body"].split()[1]))
        for ids in by_key.values():
            assert not ordered or ids == sorted(ids), (
                "one key's messages out of order within its queue"
            )


JOB = PROCS / "sink_job.py"


def job(
    tmp_path: Path,
    master: str,
    face: str,
    failpoint: str | None = None,
    env_extra: dict[str, str] | None = None,
    root: Path | None = None,
) -> subprocess.Popen[str]:
    args = [
        sys.executable,
        str(JOB),
        str(tmp_path / "in"),
        str(root or tmp_path / "store"),
        str(tmp_path / "ck-{face}"),
        master,
        face,
    ]
    if failpoint:
        args.append(failpoint)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, **(env_extra or {}))
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return out


def check_exactly_once(
    tmp_path: Path, rows: list[dict[str, object]], root: Path | None = None
) -> None:
    root = root or tmp_path / "store"
    stored = read_back(root, "orders")
    counts = collections.Counter(s["body"] for s in stored)
    assert sorted(counts) == sorted(r["body"] for r in rows)  # type: ignore[type-var]
    assert set(counts.values()) == {1}
    for _, path in StoreRoot(root).brokers():
        with MessageStore(path, CONFIG, read_only=True) as store:
            assert verify(store).ok


def fired(log: Path) -> list[str]:
    """The lines the failpoint wrote each time it fired (see sink/append.py)."""
    return log.read_text().splitlines() if log.exists() else []


def outcomes(out: str) -> dict[str, dict[str, object]]:
    """What tests/procs/sink_job.py printed of each query, by face."""
    return {r["face"]: r for r in map(json.loads, out.splitlines())}


def kill_mid_batch(tmp_path: Path, face: str, rows: list[dict[str, object]]) -> None:
    """Run ``face``'s job until a task has appended one chunk of a micro-batch and hangs there
    (the ``hang_after_chunk`` failpoint), check that part of the batch landed, then SIGKILL the
    whole driver process group."""
    marker = tmp_path / "hung"
    proc = job(tmp_path, "local[2]", face, f"hang_after_chunk:1:{marker}")
    try:
        deadline = time.monotonic() + 300
        # The failpoint writes the marker once a task has appended one chunk and hangs; the
        # marker is the observable state this waits on.
        while not fired(marker):
            assert proc.poll() is None, proc.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "the job never reached the failpoint"
            time.sleep(0.05)
        landed = read_back(tmp_path / "store", "orders")
        assert 0 < len(landed) < len(rows)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
