"""The project's wheel, built once per test run from this checkout.

``pip wheel .`` builds in the source tree (``build/``, ``rocketstore.egg-info``), so two xdist
workers building at once tear each other's files out ("No such file or directory" half-way
through ``install_lib``). Builds are serialised by an ``fcntl`` lock on a file in ``build/`` and
the wheel is kept in a directory every worker of the run shares (named after xdist's run id),
so the second worker to ask reuses the first one's wheel.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from tests.kit import ROOT


def _build(dest: Path, timeout_s: float) -> Path:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    (wheel,) = dest.glob("rocketstore-*.whl")
    return wheel


def project_wheel(base: Path, shared: Path, timeout_s: float) -> Path:
    """The wheel ``make wheel`` builds, under ``shared/wheel-<run id>`` when the run has several
    workers (``shared`` is the parent of the workers' base temporary directories), else under
    ``base``. Safe to call from several processes at once."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    dest = shared / f"wheel-{run_id}" if run_id else base / "wheel"
    lock_dir = ROOT / "build"
    lock_dir.mkdir(exist_ok=True)
    with open(lock_dir / ".wheel-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(dest.glob("rocketstore-*.whl")) if dest.is_dir() else []
        if found:
            return found[0]
        dest.mkdir(parents=True, exist_ok=True)
        return _build(dest, timeout_s)
