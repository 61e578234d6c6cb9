"""The end-to-end source test's steps, shared with the Spark tests across hosts: a sink writing
through ``format("rocketstore")``, a reader query in a process of its own
(tests/procs/source_e2e_reader.py), waiting on its checkpoint and its output, and checking
that every row was read exactly once, whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tests.kit import PROCS, ROOT
from tests.kit.jobfiles import committed_files

READER = PROCS / "source_e2e_reader.py"
WAIT_S = 120


def batch_files(checkpoint: Path, kind: str) -> int:
    """How many micro-batches the query has planned (``offsets``) or finished (``commits``)."""
    try:
        return sum(1 for p in (checkpoint / kind).iterdir() if p.name.isdigit())
    except FileNotFoundError:
        return 0


def wait_for(
    what: str,
    cond: Callable[[], bool],
    proc: subprocess.Popen[bytes],
    log: Path,
    errors: list[BaseException],
) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if errors:
            raise AssertionError(f"the sink failed: {str(errors[0])[:4000]}")
        if proc.poll() is not None:
            raise AssertionError(
                f"reader exited ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")
        threading.Event().wait(0.05)


def expected_body(i: int) -> bytes:
    return f"m{i}:".encode() + bytes([97 + i % 26]) * (i % 40)


def sink_write(spark: Any, root: Path, first: int, count: int) -> None:
    df = spark.range(first, first + count).selectExpr(
        "cast(concat('m', id, ':', repeat(char(97 + id % 26), cast(id % 40 as int))) as binary) as body",
        "array(concat('k', id)) as keys",
    )
    (
        df.write.format("rocketstore")
        .mode("append")
        .option("path", str(root))
        .option("topic", "e2e")
        .option("brokers", "2")
        .option("queues", "2")
        .option("mappedFileSizeCommitLog", str(1 << 20))
        .save()
    )


def start_reader(
    root: Path, checkpoint: Path, out: Path, mode: str, log: Path
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, str(READER), str(root), str(checkpoint), str(out), mode],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )


def rows_out(out: Path) -> int:
    """Rows in the reader's committed parquet files so far."""
    try:
        return sum(pq.read_metadata(f).num_rows for f in committed_files(out))
    except FileNotFoundError:
        return 0


def read_all(out: Path, total: int) -> Callable[[], bool]:
    """A :func:`wait_for` condition: the reader's output holds ``total`` rows."""
    return lambda: rows_out(out) >= total


def next_batch(reader: subprocess.Popen[bytes], checkpoint: Path, log: Path) -> None:
    """Until the reader plans another micro-batch, or 3 s: appends then land between batches
    as well as in them."""
    planned = batch_files(checkpoint, "offsets")
    deadline = time.monotonic() + 3
    while batch_files(checkpoint, "offsets") == planned and time.monotonic() < deadline:
        assert reader.poll() is None, log.read_text()[-4000:]
        time.sleep(0.05)  # polling interval: the loop checks the checkpoint itself


def assert_read_once(rows: list[dict[str, Any]], total: int, checkpoint: Path) -> None:
    """The reader's rows are messages 0 .. total - 1 of :func:`sink_write`, each once, whole,
    each at its own queue offset, over at least three micro-batches."""
    ids = sorted(int(r["keys"][0][1:]) for r in rows)
    assert ids == list(range(total)), f"{len(ids)} rows for {total} messages"
    assert all(r["body"] == expected_body(int(r["keys"][0][1:])) for r in rows)
    assert len({(r["brokerName"], r["queueId"], r["queueOffset"]) for r in rows}) == len(rows)
    assert batch_files(checkpoint, "commits") >= 3


def committed_rows(out: Path) -> list[dict[str, Any]]:
    """The rows of the reader's committed parquet files."""
    return [r for f in committed_files(out) for r in pq.read_table(f).to_pylist()]


class StreamRun:
    """A sink appending ROWS-message batches through ``root_a`` in the test's session while the
    reader process streams ``root_b`` (two hosts' mounts of one root, or one path): ``with``
    starts the reader after a first append; leaving the block waits until every appended row
    is read, then kills the reader; :meth:`check` then checks them, each once."""

    def __init__(self, spark: Any, root_a: Path, root_b: Path, work: Path, rows: int) -> None:
        self.spark, self.root_a, self.root_b, self.rows = spark, root_a, root_b, rows
        self.checkpoint, self.out, self.log = work / "ck", work / "out", work / "reader.log"
        self.total = 0
        self.reader: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> StreamRun:
        self.append()
        self.start()
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        try:
            if kind is None:
                self.wait_all()
                assert self.running.poll() is None, "the reading query stopped"
        finally:
            self.kill()

    @property
    def running(self) -> subprocess.Popen[bytes]:
        assert self.reader is not None, "no reader running"
        return self.reader

    def start(self) -> None:
        self.reader = start_reader(self.root_b, self.checkpoint, self.out, "stream", self.log)

    def kill(self) -> None:
        """SIGKILL the reader (it restarts from its checkpoint on :meth:`start`)."""
        if self.reader is not None:
            self.reader.send_signal(signal.SIGKILL)
            self.reader.wait()
            self.reader = None

    def append(self) -> None:
        sink_write(self.spark, self.root_a, self.total, self.rows)
        self.total += self.rows

    def next_batch(self) -> None:
        next_batch(self.running, self.checkpoint, self.log)

    def wait_all(self) -> None:
        wait_for(
            f"{self.total} rows read", read_all(self.out, self.total), self.running, self.log, []
        )

    def check(self) -> None:
        assert_read_once(committed_rows(self.out), self.total, self.checkpoint)
