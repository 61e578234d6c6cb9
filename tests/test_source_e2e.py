"""End to end: a sink query appends to the store while a source query reads it into Spark's
parquet file sink; the reading query is killed with SIGKILL at random points and started again
from its checkpoint. The files must hold every message exactly once, whole.

The reader runs in its own process (``tests/procs/source_e2e_reader.py``); the writer is a sequence of
``df.write.format("rocketstore")`` appends from a thread of the test process, each waiting until
the reader has planned another micro-batch (or a few seconds have passed), so that appends and
reads interleave. Nothing waits by sleeping: every wait polls files the queries write.

The random choices (append sizes, where the reader is killed) come from a seed drawn per run
and printed in every failure; ``ROCKETSTORE_E2E_SEED=N`` runs with seed N again.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kit.e2e import assert_read_once, batch_files, sink_write, start_reader, wait_for

SEED_ENV = "ROCKETSTORE_E2E_SEED"
pytestmark = pytest.mark.slow


def test_killed_reader_restarts_exactly_once_beside_a_concurrent_sink(
    spark: Any, tmp_path: Path
) -> None:
    seed = int(os.environ.get(SEED_ENV) or random.randrange(1 << 30))
    try:
        run_with_seed(spark, tmp_path, seed)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n[seed {seed}: rerun with {SEED_ENV}={seed}]") from exc


def run_with_seed(spark: Any, tmp_path: Path, seed: int) -> None:
    # One generator per thread: draws shared between the writer thread and this one would
    # interleave differently on every run, and the seed would not reproduce them.
    appends = random.Random(f"{seed}:appends")
    kills = random.Random(f"{seed}:kills")
    root, checkpoint, out, log = (tmp_path / n for n in ("root", "ck", "out", "reader.log"))
    sink_write(spark, root, 0, 500)
    total = [500]
    writer_error: list[BaseException] = []

    def writer() -> None:
        try:
            # A Python data source is looked up in the JVM thread's active session, which a
            # new Python thread does not have (its JVM thread is new too).
            jvm = spark.sparkContext._jvm
            jvm.org.apache.spark.sql.classic.SparkSession.setActiveSession(spark._jsparkSession)
            for _ in range(10):
                planned = batch_files(checkpoint, "offsets")
                deadline = time.monotonic() + 3
                while batch_files(checkpoint, "offsets") == planned and time.monotonic() < deadline:
                    threading.Event().wait(0.05)
                n = appends.randrange(50, 400)
                sink_write(spark, root, total[0], n)
                total[0] += n
        except BaseException as exc:  # reported by the main thread
            writer_error.append(exc)

    appender = threading.Thread(target=writer, name="e2e-sink")
    appender.start()
    try:
        for _ in range(3):
            proc = start_reader(root, checkpoint, out, "stream", log)
            try:
                commits = batch_files(checkpoint, "commits")
                if kills.random() < 0.5:
                    goal = commits + kills.randrange(1, 3)
                    wait_for(
                        f"{goal} commits",
                        lambda goal=goal: batch_files(checkpoint, "commits") >= goal,
                        proc,
                        log,
                        writer_error,
                    )
                else:
                    # Killed while a micro-batch is in flight: planned, not committed.
                    wait_for(
                        "a micro-batch in flight",
                        lambda c=commits: (
                            batch_files(checkpoint, "offsets")
                            > max(c, batch_files(checkpoint, "commits"))
                        ),
                        proc,
                        log,
                        writer_error,
                    )
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    finally:
        appender.join()
    assert not writer_error, str(writer_error[0])[:4000]
    drain = start_reader(root, checkpoint, out, "drain", log)
    assert drain.wait(timeout=300) == 0, log.read_text()[-4000:]

    rows = [r.asDict() for r in spark.read.parquet(str(out)).collect()]
    assert_read_once(rows, total[0], checkpoint)
