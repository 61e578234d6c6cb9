"""Installing rocketstore as a user does: the wheel ``make wheel`` builds, in a fresh virtualenv
with no Rust toolchain on ``PATH``.

Only ``rocketstore`` and ``pyspark_rocketstore`` land at the top of site-packages, none of the
repository's folder names is importable on its own, the command line runs, and Spark finds
``format("rocketstore")`` by itself: a batch write, a batch read and a streaming read with no
registration call. The virtualenv sees the test's third-party packages (pyspark, pyarrow, ...)
through a ``.pth`` line naming their site-packages, whose own ``.pth`` files (the editable
install's among them) are not run, so the project comes from the wheel alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.kit.wheelbuild import project_wheel

pytestmark = pytest.mark.slow

TIMEOUT_S = 600
BARE_NAMES = ("pipeline", "sink", "source", "datasource", "jobs")


def no_rust_path() -> str:
    """``PATH`` without any directory that holds ``cargo`` or ``rustc``."""
    keep = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not any((Path(d) / tool).exists() for tool in ("cargo", "rustc"))
    ]
    return os.pathsep.join(keep)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("install")
    wheel = project_wheel(base, tmp_path_factory.getbasetemp().parent, TIMEOUT_S)
    assert "-cp311-abi3-" in wheel.name, wheel.name
    env = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=TIMEOUT_S)
    site = next((env / "lib").glob("python*/site-packages"))
    # What a new virtualenv holds already (pip, setuptools, their .pth files).
    (base / "seeded.txt").write_text("\n".join(p.name for p in site.iterdir()))
    (site / "third_party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [str(env / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=dict(os.environ, PATH=no_rust_path()),
        check=False,
    )
    assert installed.returncode == 0, installed.stderr[-4000:]
    return env


def run(env: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean["PATH"] = os.pathsep.join([str(env / "bin"), no_rust_path()])
    clean["PYSPARK_PYTHON"] = str(env / "bin" / "python")
    return subprocess.run(
        list(argv), capture_output=True, text=True, cwd=cwd, env=clean, timeout=TIMEOUT_S
    )


def test_only_one_import_name_lands_in_site_packages(venv: Path, tmp_path: Path) -> None:
    site = next((venv / "lib").glob("python*/site-packages"))
    seeded = set((venv.parent / "seeded.txt").read_text().split())
    ours = {p.name for p in site.iterdir()} - seeded
    assert ours == {
        "rocketstore",
        "pyspark_rocketstore",
        "rocketstore-0.1.0.dist-info",
        "third_party.pth",
    }, ours
    for name in BARE_NAMES:
        got = run(venv, str(venv / "bin" / "python"), "-c", f"import {name}", cwd=tmp_path)
        assert got.returncode != 0 and "ModuleNotFoundError" in got.stderr, (name, got.stderr)


def test_the_command_line_runs_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    cli = str(venv / "bin" / "rocketstore")
    produced = subprocess.run(
        [cli, "produce", str(store)],
        input='{"topic": "Orders", "body": "first"}\n{"topic": "Orders", "body": "second"}\n',
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": no_rust_path()},
        timeout=TIMEOUT_S,
        check=False,
    )
    assert produced.returncode == 0, produced.stderr
    queues = run(venv, cli, "queues", str(store), "--json", cwd=tmp_path)
    assert queues.returncode == 0, queues.stderr
    assert '"Orders"' in queues.stdout


SPARK = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession

    root = sys.argv[1]
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    rows = spark.createDataFrame([(f"order-{i}",) for i in range(50)], "body string")
    rows.write.format("rocketstore").mode("append").option("path", root) \\
        .option("topic", "orders").save()
    batch = spark.read.format("rocketstore").option("path", root).option("topic", "orders")
    print("batch", batch.load().count())
    seen = []
    query = (spark.readStream.format("rocketstore").option("path", root)
             .option("topic", "orders").option("startingOffsets", "earliest").load()
             .writeStream.foreachBatch(lambda df, _: seen.extend(r.body for r in df.collect()))
             .option("checkpointLocation", sys.argv[2]).trigger(availableNow=True).start())
    query.awaitTermination()
    print("stream", len(seen), len(set(seen)))
    import rocketstore.pipeline
    print("from", rocketstore.pipeline.__file__)
    """
)


def test_spark_finds_the_data_source_with_no_registration_call(venv: Path, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SPARK)
    got = run(
        venv,
        str(venv / "bin" / "python"),
        str(script),
        str(tmp_path / "root"),
        str(tmp_path / "checkpoint"),
        cwd=tmp_path,
    )
    assert got.returncode == 0, got.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in got.stdout.splitlines() if " " in line)
    assert lines["batch"] == "50"
    assert lines["stream"] == "50 50"
    assert Path(lines["from"]).is_relative_to(venv), lines["from"]


CONSOLE = textwrap.dedent(
    """
    import sys, warnings
    warnings.filterwarnings("ignore", "Using `httpx`")
    from pathlib import Path
    from starlette.testclient import TestClient
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.console import app
    from rocketstore.pipeline.console.views import Console

    client = TestClient(app.create_app(Console(Path(sys.argv[1]), StoreConfig())),
                        base_url="http://127.0.0.1")
    for path in ("/", "/topic/Orders", "/static/console.css", "/static/console.js"):
        print(path, client.get(path).status_code)
    print("from", app.__file__)
    """
)


def test_the_console_runs_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    """Its templates and static files are in the wheel (package data), and it serves them."""
    pytest.importorskip("starlette", reason="the console needs the 'console' extra")
    store = tmp_path / "store"
    lines_in = tmp_path / "in.jsonl"
    lines_in.write_text('{"topic": "Orders", "body": "first"}\n')
    cli = str(venv / "bin" / "rocketstore")
    produced = run(venv, cli, "produce", str(store), str(lines_in), cwd=tmp_path)
    assert produced.returncode == 0, produced.stderr
    got = run(venv, str(venv / "bin" / "python"), "-c", CONSOLE, str(store), cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    lines = got.stdout.splitlines()
    assert lines[:4] == [
        "/ 200",
        "/topic/Orders 200",
        "/static/console.css 200",
        "/static/console.js 200",
    ], got.stdout
    assert str(venv) in lines[4], lines[4]
