"""A Spark Connect server on 127.0.0.1 for the tests, started from the pip-installed pyspark
(its wheel ships the spark-connect jar) the way a user starts one:

    spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer spark-internal

Its Python workers (``foreachBatch`` functions, the data source, ``mapInArrow``) run this
interpreter, the project's virtualenv, where rocketstore is installed; the checkout is also put
first on their path so that they run the code under test. One server serves the whole test
run (the ``connect_url`` fixture in conftest.py); it is stopped by its PID.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from sparkproc import free_port, spark_home, stop, tail

from rocketstore.sink.append import FAILPOINT_ENV

ROOT = Path(__file__).resolve().parent.parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 120.0


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
        """Start the server and return once it accepts connections (fail if it exits first)."""
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

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop([self.proc])
