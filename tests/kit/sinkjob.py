"""Running tests/procs/sink_job.py (a sink query in a driver of its own) and checking what it
stored: the sink fault tests' and the real-EIO tests' shared steps."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit import PROCS, ROOT
from tests.kit.sinkutil import CONFIG, read_back

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
