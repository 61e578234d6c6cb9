"""Helpers of the tests that start Spark processes of their own (a standalone cluster, a Spark
Connect server) from the pip-installed pyspark."""

from __future__ import annotations

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


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop processes this run started, by PID: SIGTERM, then SIGKILL for any that lingers."""
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
