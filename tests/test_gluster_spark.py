"""Spark across two hosts: the sink appends through one mount of a replicated GlusterFS volume
while a streaming source reads through the other, and one brick of three is killed -9 in the
middle and brought back later. No query fails, and every row is read exactly once, whole.

The sink runs in the test's session (batch appends, ``format("rocketstore")``); the source is
``tests/procs/source_e2e_reader.py`` in a process of its own (``processingTime`` 100 ms, into
Spark's parquet file sink). Waits poll the files the queries write."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.kit.e2e import batch_files, expected_body, sink_write, start_reader, wait_for
from tests.kit.jobfiles import committed_files

pytestmark = [pytest.mark.gluster, pytest.mark.slow]

APPENDS = 10
ROWS = 1000


def rows_out(out: Path) -> int:
    try:
        return sum(pq.read_metadata(f).num_rows for f in committed_files(out))
    except FileNotFoundError:
        return 0


def test_sink_on_one_mount_source_on_the_other_with_a_brick_lost(
    spark: Any, gluster_volume: Any, tmp_path: Path
) -> None:
    vol = gluster_volume
    root_a, root_b = vol.a / "root", vol.b / "root"
    checkpoint, out, log = tmp_path / "ck", tmp_path / "out", tmp_path / "reader.log"
    sink_write(spark, root_a, 0, ROWS)
    total = ROWS
    reader = start_reader(root_b, checkpoint, out, "stream", log)
    try:
        for k in range(APPENDS):
            if k == 3:
                vol.kill_brick(0)
            if k == 7:
                vol.restart_bricks()
            planned = batch_files(checkpoint, "offsets")
            deadline = time.monotonic() + 3
            while batch_files(checkpoint, "offsets") == planned and time.monotonic() < deadline:
                assert reader.poll() is None, log.read_text()[-4000:]
                time.sleep(0.05)  # polling interval: the loop checks the checkpoint itself
            sink_write(spark, root_a, total, ROWS)
            total += ROWS
        vol.wait_for_heal()
        wait_for(f"{total} rows read", lambda: rows_out(out) >= total, reader, log, [])
        assert reader.poll() is None, "the reading query stopped"
    finally:
        reader.send_signal(signal.SIGKILL)
        reader.wait()
    rows = [r for f in committed_files(out) for r in pq.read_table(f).to_pylist()]
    ids = sorted(int(r["keys"][0][1:]) for r in rows)
    assert ids == list(range(total)), f"{len(ids)} rows for {total} messages"
    assert all(r["body"] == expected_body(int(r["keys"][0][1:])) for r in rows)
    assert batch_files(checkpoint, "commits") >= 3
