"""Spark across two hosts: the sink appends through one mount of a replicated GlusterFS volume
while a streaming source reads through the other, and one brick of three is killed -9 in the
middle and brought back later. No query fails, and every row is read exactly once, whole.

The sink runs in the test's session (batch appends, ``format("rocketstore")``); the source is
``tests/procs/source_e2e_reader.py`` in a process of its own (``processingTime`` 100 ms, into
Spark's parquet file sink). Waits poll the files the queries write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.kit.e2e import StreamRun

pytestmark = [pytest.mark.gluster, pytest.mark.slow]

APPENDS = 10
ROWS = 1000


def test_sink_on_one_mount_source_on_the_other_with_a_brick_lost(
    spark: Any, gluster_volume: Any, tmp_path: Path
) -> None:
    vol = gluster_volume
    run = StreamRun(spark, vol.a / "root", vol.b / "root", tmp_path, ROWS)
    with run:
        for k in range(APPENDS):
            if k == 3:
                vol.kill_brick(0)
            if k == 7:
                vol.restart_bricks()
            run.next_batch()
            run.append()
        vol.wait_for_heal()
    run.check()
