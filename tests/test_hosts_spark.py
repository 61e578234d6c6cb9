"""The Spark sink on one host and the streaming source on another, on each shared file system
the suite runs across hosts (``two_hosts``: GlusterFS, and CephFS through ceph-fuse; issue 42).

The sink appends with ``format("rocketstore")`` through mount A in the test's session; the
source is ``tests/procs/source_e2e_reader.py`` reading mount B in a process of its own (into
Spark's parquet file sink), killed -9 part-way and started again on its checkpoint. Every row
is read exactly once, whole. Waits poll the files the queries write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.kit.e2e import StreamRun

pytestmark = [pytest.mark.slow]

APPENDS = 6
ROWS = 1000
KILL_AFTER = 3  # appends before the reader is killed -9


def test_sink_on_one_host_source_on_the_other_exactly_once(
    spark: Any, two_hosts: Any, tmp_path: Path
) -> None:
    run = StreamRun(spark, two_hosts.a / "root", two_hosts.b / "root", tmp_path, ROWS)
    with run:
        for k in range(APPENDS):
            if k == KILL_AFTER:
                run.wait_all()
                run.kill()
                run.append()  # while no reader runs
                run.start()
            run.next_batch()
            run.append()
    run.check()
