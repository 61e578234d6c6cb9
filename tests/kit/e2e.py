"""The end-to-end source test's steps, shared with the GlusterFS Spark test: a sink writing
through ``format("rocketstore")``, a reader query in a process of its own
(tests/procs/source_e2e_reader.py), and waiting on its checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.kit import PROCS, ROOT

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
