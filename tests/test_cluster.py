"""The jobs on a real Spark standalone cluster: a master and two workers on 127.0.0.1, started
from the pip-installed pyspark, and ``spark-submit --master spark://...`` of ``ingest`` and
``export`` against one store root, with the package shipped as ``--py-files`` and one executor
on each worker.

Every process the test starts is stopped by its PID at the end, whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from conftest import ROOT
from test_jobs import committed_files

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("java") is None,
        reason="needs Java 17 on PATH to run a Spark standalone cluster",
    ),
]

ROWS = 2000
START_TIMEOUT = 90.0
SUBMIT_TIMEOUT = 300.0
PACKAGES = ("pipeline", "sink", "source", "datasource", "jobs")
STORE_TOML = "mappedFileSizeCommitLog = 1048576\nmaxHashSlotNum = 4096\nmaxIndexNum = 65536\n"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def master_state(ui_port: int) -> dict[str, Any] | None:
    """The master's JSON state (workers, applications), or None while it is not answering."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as r:
            state: dict[str, Any] = json.load(r)
            return state
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"({path} missing)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class Cluster:
    """A standalone master and its workers, as child processes of the test."""

    def __init__(self, base: Path, workers: int) -> None:
        self.base = base
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.worker_dirs = [base / f"worker-{i}" for i in range(workers)]
        self.env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(base / "local"),
            "PYSPARK_PYTHON": sys.executable,
        }

    def _spawn(self, name: str, *args: str) -> None:
        log = self.base / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.base,
            )
        self.procs.append((proc, log))

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--webui-port", str(self.ui_port),
        )  # fmt: skip
        # Workers that find no master retry only every ~10 s: start them once it answers.
        self.wait_until(lambda state: state is not None, "the master to answer")
        for i, work in enumerate(self.worker_dirs):
            work.mkdir()
            self._spawn(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1",
                "--port", str(free_port()),
                "--webui-port", str(free_port()),
                "--cores", "1",
                "--memory", "1g",
                "--work-dir", str(work),
                self.url,
            )  # fmt: skip
        self.wait_for_workers()

    def wait_for_workers(self) -> None:
        """Poll the master's REST state until every worker is ALIVE (or a process died)."""

        def all_alive(state: dict[str, Any] | None) -> bool:
            alive = [w for w in (state or {}).get("workers", []) if w.get("state") == "ALIVE"]
            return len(alive) == len(self.worker_dirs)

        self.wait_until(all_alive, "every worker to be ALIVE")

    def wait_until(self, done: Callable[[dict[str, Any] | None], bool], what: str) -> None:
        """Poll the master's JSON state until ``done(state)``; fail if a process exits first."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for proc, log in self.procs:
                if proc.poll() is not None:
                    raise AssertionError(f"{log.stem} exited with {proc.returncode}:\n{tail(log)}")
            if done(master_state(self.ui_port)):
                return
            time.sleep(0.5)  # polling interval, not synchronisation: the loop checks the state
        raise AssertionError(
            f"waited {START_TIMEOUT} s for {what}:\n"
            + "\n".join(f"-- {log.stem}\n{tail(log)}" for _, log in self.procs)
        )

    def stop(self) -> None:
        """Stop every process started here, by PID: SIGTERM, then SIGKILL if it lingers."""
        for proc, _ in reversed(self.procs):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc, _ in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def submit(self, script: str, *args: str, py_files: Path) -> subprocess.CompletedProcess[str]:
        cmd = [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master", self.url,
            "--total-executor-cores", "2",
            "--executor-cores", "1",
            "--executor-memory", "512m",
            "--py-files", str(py_files),
            # As the README says to: the project's Spark settings and quiet logging.
            "--properties-file", str(ROOT / "conf" / "spark-defaults.conf"),
            str(ROOT / "jobs" / script),
            *args,
        ]  # fmt: skip
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=self.env,
            cwd=ROOT,
            timeout=SUBMIT_TIMEOUT,
            check=False,
        )
        (self.base / f"submit-{script}.log").write_text(done.stdout + done.stderr)
        return done


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", workers=2)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def package_zip(path: Path) -> Path:
    """The project's packages in one zip, as ``--py-files`` ships them to every node."""
    with zipfile.ZipFile(path, "w") as z:
        for package in PACKAGES:
            for f in sorted((ROOT / package).rglob("*.py")):
                z.write(f, f.relative_to(ROOT).as_posix())
    return path


def app_dirs(work: Path) -> set[str]:
    """Applications that had an executor on a worker (its work dir holds app-*/<executor>/)."""
    return {app.name for app in work.glob("app-*") if any(app.iterdir())}


def test_ingest_and_export_on_a_standalone_cluster(cluster: Cluster, tmp_path: Path) -> None:
    incoming = tmp_path / "in"
    incoming.mkdir()
    for part in range(2):
        rows = range(part * ROWS // 2, (part + 1) * ROWS // 2)
        (incoming / f"part-{part}.json").write_text(
            "".join(
                json.dumps({"id": i, "customer": f"c{i % 101}", "note": "x" * (i % 50)}) + "\n"
                for i in rows
            )
        )
    store, config = tmp_path / "store", tmp_path / "store.toml"
    config.write_text(STORE_TOML)
    zipped = package_zip(tmp_path / "rocketstore.zip")
    common = ["--store", str(store), "--store-config", str(config), "--topic", "events"]

    ingested = cluster.submit(
        "ingest.py",
        *common,
        "--checkpoint", str(tmp_path / "ck-ingest"),
        "--input", str(incoming),
        "--schema", "id BIGINT, customer STRING, note STRING",
        "--key-column", "customer",
        "--brokers", "2",
        "--queues", "2",
        "--max-files-per-trigger", "1",
        "--trigger", "available-now",
        py_files=zipped,
    )  # fmt: skip
    assert ingested.returncode == 0, ingested.stderr[-4000:]
    # spark-submit passes the Python driver's stderr on as its stdout.
    assert f"{ROWS} message(s) appended" in ingested.stdout

    out = tmp_path / "out"
    exported = cluster.submit(
        "export.py",
        *common,
        "--checkpoint", str(tmp_path / "ck-export"),
        "--output", str(out),
        "--format", "parquet",
        "--max-messages-per-trigger", "1000",
        "--trigger", "available-now",
        py_files=zipped,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-4000:]

    rows = [r for f in committed_files(out) for r in pq.read_table(f).to_pylist()]
    assert sorted(r["id"] for r in rows) == list(range(ROWS))
    assert {r["brokerName"] for r in rows} == {"broker-0", "broker-1"}
    assert all(r["keys"] == [r["customer"]] for r in rows)

    # Both applications ran an executor on each worker.
    per_worker = [app_dirs(w) for w in cluster.worker_dirs]
    assert all(len(apps) == 2 for apps in per_worker), per_worker
    assert per_worker[0] == per_worker[1]
