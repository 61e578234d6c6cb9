"""Helpers of the tests that start Spark processes of their own (a standalone cluster, a Spark
Connect server) from the pip-installed pyspark."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"({path} missing)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stop(procs: list[subprocess.Popen[bytes]], group: bool = False) -> None:
    """Stop processes this run started, by PID (or, with ``group``, the process group each
    leads, started with ``start_new_session``): SIGTERM, then SIGKILL for any that lingers."""

    def signal_(proc: subprocess.Popen[bytes], sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)

    for proc in procs:
        if proc.poll() is None or group:
            signal_(proc, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            signal_(proc, signal.SIGKILL)
            proc.wait(timeout=30)
