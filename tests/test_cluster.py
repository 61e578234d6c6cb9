"""The jobs on a real Spark standalone cluster: a master and two workers on 127.0.0.1, started
from the pip-installed pyspark, and ``spark-submit --master spark://...`` of ``ingest`` and
``export`` against one store root, with one executor on each worker. Then the same on hosts of
their own: the store root on a replicated GlusterFS volume, each worker and the driver in a
mount namespace with its own FUSE mount of it at the same path; there, also a streaming sink
and source running at once, and a sink task that fails retried by Spark on the other host.

The project reaches the nodes as docs/cluster.md says it should, with its compiled core
(``--py-files`` cannot carry an extension module): the wheel built by ``pip wheel .``, installed
into the driver's Python and into a virtualenv packed with ``venv-pack`` that ``spark-submit
--archives`` ships to the executors. Neither sees the project's editable install, and the
executors' sees nothing of this machine's Python packages, so the jobs can only run if the
wheel and the archive are complete.

Every process the test starts is stopped by its process group at the end, whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit import PROCS, ROOT, sparkproc
from tests.kit.gluster import unavailable as gluster_unavailable
from tests.kit.jobfiles import committed_files
from tests.kit.sparkproc import free_port, spark_home, tail
from tests.kit.wheelbuild import project_wheel

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
STORE_TOML = "mappedFileSizeCommitLog = 1048576\nmaxHashSlotNum = 4096\nmaxIndexNum = 65536\n"


Launcher = Callable[..., "subprocess.Popen[bytes]"]


def _here(cmd: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, **popen)


def master_state(ui_port: int) -> dict[str, Any] | None:
    """The master's JSON state (workers, applications), or None while it is not answering."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as r:
            state: dict[str, Any] = json.load(r)
            return state
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None


class Cluster:
    """A standalone master and its workers, as child processes of the test."""

    def __init__(self, base: Path, workers: int, host: Launcher | None = None) -> None:
        self.base = base
        # How a worker or a driver is started: here, or on a "host" of its own (a mount
        # namespace, see tests/kit/gluster.py). The master needs no storage and runs here.
        self.host: Launcher = host or _here
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
        launch = _here if name == "master" else self.host
        with open(log, "wb") as out:
            proc = launch(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.base,
                start_new_session=True,
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
        """Stop every process started here, by process group (a worker on a host of its own
        runs under a shell that holds its mount): SIGTERM, then SIGKILL if it lingers."""
        sparkproc.stop([proc for proc, _ in reversed(self.procs)], group=True)

    def driver_dir(self, node: NodeEnv) -> Path:
        """Where spark-submit runs: in client mode the driver starts Python workers of its own
        (the data source's planning) with ``spark.pyspark.python``, a path relative to its
        working directory, so the archive is unpacked there too, as docs/cluster.md says."""
        where = self.base / "driver"
        if not (where / EXECUTOR_PYTHON).exists():
            (where / "environment").mkdir(parents=True)
            shutil.unpack_archive(node.archive, where / "environment")
        return where

    def submit(
        self, script: str | Path, *args: str, node: NodeEnv, conf: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``spark-submit`` of ``script`` (a job's file name, or a path) on the cluster, from
        the driver's host, with the executors' Python shipped as ``node.archive``; waits for it
        and returns what it printed."""
        settings = {
            "spark.pyspark.python": EXECUTOR_PYTHON,
            "spark.pyspark.driver.python": str(node.driver),
            **(conf or {}),
        }
        cmd = [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master", self.url,
            "--total-executor-cores", "2",
            "--executor-cores", "1",
            "--executor-memory", "512m",
            "--archives", f"{node.archive}#environment",
            *[arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")],
            # As docs/cluster.md says to: the project's Spark settings and quiet logging.
            "--properties-file", str(ROOT / "conf" / "spark-defaults.conf"),
            str(script if isinstance(script, Path) else ROOT / "jobs" / script),
            *args,
        ]  # fmt: skip
        proc = self.host(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=self.driver_dir(node),
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=SUBMIT_TIMEOUT)
        finally:
            sparkproc.stop([proc], group=True)
        done = subprocess.CompletedProcess(cmd, proc.returncode, out.decode(), err.decode())
        (self.base / f"submit-{Path(script).name}.log").write_text(done.stdout + done.stderr)
        return done


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", workers=2)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@dataclass(frozen=True)
class NodeEnv:
    """What a job's processes run: the driver's Python (where spark-submit runs) and the packed
    virtualenv shipped to the executors with ``--archives``."""

    driver: Path
    archive: Path


# The executors' Python inside the archive, as Spark unpacks it into each executor's working
# directory under the name after the '#'.
EXECUTOR_PYTHON = "./environment/bin/python"


@pytest.fixture(scope="session")
def node_venv(tmp_path_factory: pytest.TempPathFactory) -> NodeEnv:
    """:func:`node_python` and :func:`packed_env`, built once per test session (worker)."""
    base = tmp_path_factory.mktemp("node")
    wheel = project_wheel(base, tmp_path_factory.getbasetemp().parent, SUBMIT_TIMEOUT)
    return NodeEnv(node_python(base, wheel), packed_env(base, wheel))


def venv_with(env: Path, packages: list[str]) -> Path:
    """A virtualenv at ``env`` without pip, ``packages`` installed into it (no dependencies:
    each caller names what it needs); returns its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next((env / "lib").glob("python*/site-packages"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            *packages,
        ],
        check=True,
        timeout=SUBMIT_TIMEOUT,
    )
    return site


def node_python(base: Path, wheel: Path) -> Path:
    """The driver's Python: a virtualenv that sees the test's third-party packages (a ``.pth``
    line naming their site-packages, whose own ``.pth`` files, the editable install's among
    them, are not run) and the project only as the wheel ``pip wheel .`` builds from this
    checkout."""
    env = base / "node-venv"
    site = venv_with(env, [str(wheel)])
    (site / "third_party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = env / "bin" / "python"
    where = subprocess.run(
        [str(python), "-c", "import rocketstore.pipeline._native as n; print(n.__file__)"],
        capture_output=True,
        text=True,
        cwd=base,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(site), where
    return python


# What executors import besides rocketstore (docs/cluster.md lists it): pyspark itself comes
# from the Spark installation the workers run, pandas with its own dependencies (six is
# python-dateutil's: without it pandas fails to import, and pyarrow, which imports pandas when
# it first converts a Python value, then fails with a misleading TypeError).
EXECUTOR_PACKAGES = (
    "pyarrow", "fastavro", "numpy", "pandas", "python-dateutil", "six", "pytz", "tzdata",
)  # fmt: skip


def packed_env(base: Path, wheel: Path) -> Path:
    """The executors' environment as Spark's Python package guide ships one: a virtualenv
    holding the wheel and the packages executors import (the versions this test runs, from the
    package index or pip's cache), packed by ``venv-pack``. It sees nothing of this machine's
    other environments, so a job runs only if the archive is complete."""
    env = base / "exec-venv"
    pins = [f"{name}=={metadata.version(name)}" for name in EXECUTOR_PACKAGES]
    venv_with(env, [str(wheel), *pins])
    archive = base / "exec-env.tar.gz"
    # Level 1: the archive is unpacked on this machine, so the time to pack matters more than
    # its size (345 MB packs to 120 MB in ~13 s here).
    subprocess.run(
        [
            str(Path(sys.executable).parent / "venv-pack"),
            "-q",
            "-p",
            str(env),
            "-o",
            str(archive),
            "--compress-level",
            "1",
        ],
        check=True,
        timeout=SUBMIT_TIMEOUT,
    )
    return archive


def app_dirs(work: Path) -> set[str]:
    """Applications that had an executor on a worker (its work dir holds app-*/<executor>/)."""
    return {app.name for app in work.glob("app-*") if any(app.iterdir())}


# Where GlusterFS volumes can be made, test_jobs_on_hosts_of_their_own runs these same jobs
# (run_jobs) on hosts of their own, and more; running both only cost the suite minutes.
@pytest.mark.skipif(
    gluster_unavailable() is None,
    reason="the same jobs run on hosts of their own in test_jobs_on_hosts_of_their_own",
)
def test_ingest_and_export_on_a_standalone_cluster(
    cluster: Cluster, node_venv: NodeEnv, tmp_path: Path
) -> None:
    run_jobs(cluster, tmp_path, tmp_path, tmp_path, node_venv)


def run_jobs(cluster: Cluster, tmp_path: Path, shared: Path, view: Path, node: NodeEnv) -> None:
    """``ingest`` then ``export`` on ``cluster`` with the nodes' ``python``, the store,
    checkpoints and output under ``shared`` as the driver and executors see it, checked through
    ``view`` (the same directory as this process sees it)."""
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
    store, config = shared / "store", tmp_path / "store.toml"
    config.write_text(STORE_TOML)
    common = ["--store", str(store), "--store-config", str(config), "--topic", "events"]

    ingested = cluster.submit(
        "ingest.py",
        *common,
        "--checkpoint", str(shared / "ck-ingest"),
        "--input", str(incoming),
        "--schema", "id BIGINT, customer STRING, note STRING",
        "--key-column", "customer",
        "--brokers", "2",
        "--queues", "2",
        "--max-files-per-trigger", "1",
        "--trigger", "available-now",
        node=node,
    )  # fmt: skip
    assert ingested.returncode == 0, ingested.stderr[-4000:]
    # spark-submit passes the Python driver's stderr on as its stdout.
    assert f"{ROWS} message(s) appended" in ingested.stdout

    exported = cluster.submit(
        "export.py",
        *common,
        "--checkpoint", str(shared / "ck-export"),
        "--output", str(shared / "out"),
        "--format", "parquet",
        "--max-messages-per-trigger", "1000",
        "--trigger", "available-now",
        node=node,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-4000:]

    # The manifest names files as the driver saw them: read them through this process's view.
    files = [view / f.relative_to(shared) for f in committed_files(view / "out")]
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert sorted(r["id"] for r in rows) == list(range(ROWS))
    assert {r["brokerName"] for r in rows} == {"broker-0", "broker-1"}
    assert all(r["keys"] == [r["customer"]] for r in rows)

    # Both applications ran an executor on each worker, in the Python the archive carried.
    per_worker = [app_dirs(w) for w in cluster.worker_dirs]
    assert all(len(apps) == 2 for apps in per_worker), per_worker
    assert per_worker[0] == per_worker[1]
    for work in cluster.worker_dirs:
        unpacked = list(work.glob("app-*/*/environment/bin/python"))
        assert len(unpacked) == 2, f"{work}: {unpacked}"


STREAM_FILES = 6
STREAM_ROWS = 3000
STREAM_FIRST_ID = 100_000


def run_stream(cluster: Cluster, tmp_path: Path, shared: Path, view: Path, node: NodeEnv) -> None:
    """A streaming sink and a streaming source at once (``tests/procs/cluster_stream.py``: the ingest
    and export jobs' queries in one application), with one sink task failing after it stored
    its part and Spark retrying it on the other worker's host; every row exactly once."""
    incoming = tmp_path / "in-stream"
    incoming.mkdir()
    per_file = STREAM_ROWS // STREAM_FILES
    for part in range(STREAM_FILES):
        first = STREAM_FIRST_ID + part * per_file
        (incoming / f"part-{part}.json").write_text(
            "".join(
                json.dumps({"id": i, "customer": f"c{i % 37}", "note": "y" * (i % 40)}) + "\n"
                for i in range(first, first + per_file)
            )
        )
    fired, events, summary = tmp_path / "fired", tmp_path / "events", tmp_path / "stream.json"
    events.mkdir()
    done = cluster.submit(
        PROCS / "cluster_stream.py",
        str(shared / "store"), str(tmp_path / "store.toml"), str(incoming), str(shared),
        str(STREAM_ROWS), str(summary),
        node=node,
        conf={
            # The first sink task to store its part then fails, once in the whole run.
            "spark.executorEnv.ROCKETSTORE_TEST_FAILPOINT": f"once_after_chunk:1:{fired}",
            # A failed task is not retried on the executor it failed on: the other host.
            "spark.excludeOnFailure.enabled": "true",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
            "spark.sql.streaming.numRecentProgressUpdates": "10000",
        },
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads(summary.read_text())
    assert len(fired.read_text().splitlines()) == 1
    # The retry found what the failed attempt stored and appended only the rest.
    assert result["skipped"] > 0 and result["appended"] + result["skipped"] == STREAM_ROWS
    # Every file went in after the source had read all before it.
    assert result["fed"] == STREAM_FILES, result

    files = [view / f.relative_to(shared) for f in committed_files(view / "out-stream")]
    ids = sorted(r["id"] for f in files for r in pq.read_table(f, columns=["id"]).to_pylist())
    assert ids == list(range(STREAM_FIRST_ID, STREAM_FIRST_ID + STREAM_ROWS))

    failed, retried = retried_task(events)
    hosts = [executor_worker(cluster, events, e) for e in (failed, retried)]
    assert hosts[0] != hosts[1], hosts


def event_log(events: Path) -> tuple[str, list[dict[str, Any]]]:
    """The application id and the events of the one application logged in ``events`` (an
    uncompressed log: a file named after the application, or Spark 4's directory of parts)."""
    (log,) = events.iterdir()
    parts = sorted(log.glob("events_*")) if log.is_dir() else [log]
    app = log.name.removeprefix("eventlog_v2_").split(".")[0]
    return app, [json.loads(line) for p in parts for line in p.read_text().splitlines()]


def retried_task(events: Path) -> tuple[str, str]:
    """The executors of the failpoint's failed task attempt and of its successful retry, from
    the application's event log."""
    ends = [e for e in event_log(events)[1] if e["Event"] == "SparkListenerTaskEnd"]
    failures = [
        e for e in ends if "failpoint" in json.dumps(e["Task End Reason"]).lower()
    ]  # fmt: skip
    assert len(failures) == 1, [e["Task End Reason"] for e in ends if e["Task End Reason"]]
    bad = failures[0]
    again = [
        e for e in ends
        if e["Stage ID"] == bad["Stage ID"]
        and e["Task Info"]["Index"] == bad["Task Info"]["Index"]
        and e["Task End Reason"]["Reason"] == "Success"
    ]  # fmt: skip
    assert len(again) == 1, again
    return bad["Task Info"]["Executor ID"], again[0]["Task Info"]["Executor ID"]


def executor_worker(cluster: Cluster, events: Path, executor: str) -> int:
    """Which worker (host) ran ``executor`` of the application logged in ``events``."""
    app = event_log(events)[0]
    (worker,) = [i for i, w in enumerate(cluster.worker_dirs) if (w / app / executor).is_dir()]
    return worker


@pytest.mark.gluster
def test_jobs_on_hosts_of_their_own(
    gluster_volume: Any, node_venv: NodeEnv, tmp_path: Path
) -> None:
    """The same jobs with the store root on a replicated GlusterFS volume and each worker and
    the driver on a host of its own: a mount namespace with its own FUSE mount of the volume
    at the same path (its own client and cache). Then a streaming sink and a streaming
    source at once, with a sink task retried on the other host (:func:`run_stream`). The
    results are read through a fourth mount."""
    vol = gluster_volume
    shared = tmp_path / "hosts"

    def host(cmd: list[str], **popen: Any) -> subprocess.Popen[bytes]:
        return vol.in_namespace(cmd, shared, **popen)  # type: ignore[no-any-return]

    cluster = Cluster(tmp_path / "cluster", workers=2, host=host)
    try:
        cluster.start()
        run_jobs(cluster, tmp_path, shared, vol.a, node_venv)
        run_stream(cluster, tmp_path, shared, vol.a, node_venv)
    finally:
        cluster.stop()
    config = StoreConfig.load(tmp_path / "store.toml")
    for broker in ("broker-0", "broker-1"):
        with MessageStore(vol.a / "store" / broker, config, read_only=True) as store:
            report = verify(store)
            assert report.ok, [str(p) for p in report.problems][:5]
            live = [q for q in store.queue_infos("live")]
            assert sum(q.max_offset for q in live) > 0
