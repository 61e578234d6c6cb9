"""A Spark Connect server on 127.0.0.1 for the tests, started from the pip-installed pyspark
(its wheel ships the spark-connect jar) the way a user starts one:

    spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer spark-internal

Its Python workers (``foreachBatch`` functions, the data source, ``mapInArrow``) run this
interpreter, the project's virtualenv, where rocketstore is installed; the checkout is also put
first on their path so that they run the code under test. One server serves the whole test
run (the ``connect_url`` fixture in conftest.py); it is stopped by its PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rocketstore.sink.append import FAILPOINT_ENV
from tests.kit import PROCS, ROOT
from tests.kit.sparkproc import free_port, spark_home, stop, tail

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 120.0
BIND_ATTEMPTS = 5


class ConnectServer:
    """One Spark Connect server (``local[2]``), a child process of the test run."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.log = base / "connect-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.failpoint_file = base / "sink-failpoint"

    def start(self) -> None:
        """Start the server and return once it accepts connections (fail if it exits first).

        The port is one the kernel had free a moment ago; another process (a test on the other
        worker, any outgoing connection) can take it before the server binds it. A server that
        exits for that reason is started again on another port, a few times."""
        for attempt in range(1, BIND_ATTEMPTS + 1):
            if self._launch():
                return
            if attempt == BIND_ATTEMPTS:
                break
            self.port = free_port()
            self.url = f"sc://127.0.0.1:{self.port}"
        raise RuntimeError(
            f"the Spark Connect server found no free port in {BIND_ATTEMPTS} tries:\n"
            f"{tail(self.log)}"
        )

    def _launch(self) -> bool:
        """One start on ``self.port``: True once it accepts connections, False when it exited
        because the port was taken; raises on any other failure."""
        self.base.mkdir(parents=True, exist_ok=True)
        log4j = ROOT / "conf" / "log4j2.properties"
        cmd = [
            str(spark_home() / "bin" / "spark-submit"),
            "--class", SERVER_CLASS,
            "--master", "local[2]",
            "--driver-java-options", f"-Dlog4j2.configurationFile={log4j}",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={self.port}",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.sql.shuffle.partitions=4",
            "--conf", "spark.default.parallelism=2",
            "--conf", f"spark.pyspark.python={sys.executable}",
            "spark-internal",
        ]  # fmt: skip
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": path,
            # The sink's test failpoint, armed per test by writing this file (see sink/append.py).
            FAILPOINT_ENV: f"@{self.failpoint_file}",
        }
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.base
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not self._accepts():
            if self.proc.poll() is not None:
                if "java.net.BindException" in self.log.read_text(errors="replace"):
                    return False
                raise RuntimeError(
                    f"the Spark Connect server exited with {self.proc.returncode}:\n"
                    f"{tail(self.log)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Spark Connect server did not listen on {self.url} within "
                    f"{START_TIMEOUT:.0f} s:\n{tail(self.log)}"
                )
            time.sleep(0.5)  # polling interval; the loop waits on the port, not on time
        return True

    def _accepts(self) -> bool:
        """Whether the server listens on its port: a socket of its own process, not another
        process's that took the port first (a connection alone would not tell them apart)."""
        if self.proc is None or not _listens(self.proc.pid, self.port):
            return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop([self.proc])


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` (spark-submit execs the JVM, so it is the server) or a child of
    it holds a TCP socket listening on ``port`` (Linux's /proc)."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    listening.add(f"socket:[{inode}]")
    if not listening:
        return False
    pids = [pid]
    with contextlib.suppress(OSError):
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    pids.append(int(stat.parent.name))
    for p in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{p}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in listening:
                        return True
    return False


CLIENT = PROCS / "connect_client.py"
CLIENT_TIMEOUT = 600


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a client command from the checkout; fails the test unless it exits with 0."""
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=CLIENT_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def client(url: str, scenario: str, *args: Path | str) -> dict[str, Any]:
    """Run a scenario of tests/procs/connect_client.py; its JSON report."""
    done = run([sys.executable, str(CLIENT), scenario, url, *map(str, args)])
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report
