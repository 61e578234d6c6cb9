"""Run tests/test_spark_versions.py against other PySpark versions, each in a virtualenv of its own.

usage: python -m tests.kit.sparkmatrix [VERSION ...]     (default: MATRIX below)

Each version gets ``build/spark-matrix/<version>/``: a virtualenv holding only that PySpark
(``pip install --no-deps``: pip's cache keeps the wheel it built from the sdist, so a second
machine-local run installs in seconds) and a ``.pth`` file that adds the project's ``.venv``
behind it, for rocketstore itself (the editable install) and everything else it needs. The
version's own ``site-packages`` comes first on ``sys.path``, so its ``pyspark`` is the one
imported, by the tests and by Spark's Python workers (``PYSPARK_PYTHON`` is that interpreter).

Prints one line per version (passed, failed, skipped, seconds) and exits 1 if any failed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "build" / "spark-matrix"
MODULE = "tests/test_spark_versions.py"
# The newest patch release of each line the project supports below the one the suite runs on.
MATRIX = ("3.5.9", "4.0.5", "4.1.4", "4.2.1")
INSTALL_TIMEOUT = 1800
RUN_TIMEOUT = 1800


def venv_for(version: str) -> Path:
    """The version's virtualenv, made (or completed) if needed; its interpreter."""
    env = BASE / version
    python = env / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # addsitedir (not a bare path line) so that the project venv's own .pth files, the editable
    # install's among them, are read too; it appends, behind this venv's site-packages.
    project_site = sysconfig.get_paths()["purelib"]
    (site / "_rocketstore_project.pth").write_text(
        f"import site; site.addsitedir({project_site!r})\n"
    )
    stamp = env / ".pyspark"
    if not stamp.exists() or stamp.read_text() != version:
        # The project venv's pip installs into this one's site-packages; --ignore-installed
        # keeps it from replacing the project's own pyspark, which it sees installed.
        subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                "--ignore-installed", "--upgrade", "--target", str(site), f"pyspark=={version}",
            ],
            check=True,
            timeout=INSTALL_TIMEOUT,
        )  # fmt: skip
        stamp.write_text(version)
    return python


def run(version: str) -> tuple[bool, str, float]:
    """Run the module under ``version``: whether it passed, pytest's summary line, seconds."""
    start = time.monotonic()
    python = venv_for(version)
    installed = subprocess.run(
        [str(python), "-c", "import pyspark; print(pyspark.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if installed != version:
        raise SystemExit(f"{python}: imports pyspark {installed}, not {version}")
    env = {**os.environ, "PYSPARK_PYTHON": str(python)}
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", MODULE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    summary = next((ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed)", ln)), "")
    if done.returncode != 0:
        sys.stdout.write(done.stdout[-20000:] + done.stderr[-4000:])
    return done.returncode == 0, summary.strip("= "), time.monotonic() - start


def main(argv: list[str]) -> int:
    versions = argv or list(MATRIX)
    failed = []
    for version in versions:
        ok, summary, seconds = run(version)
        print(f"pyspark {version:8} {'ok' if ok else 'FAILED':6} {seconds:6.0f} s  {summary}")
        sys.stdout.flush()
        if not ok:
            failed.append(version)
    if failed:
        print("failed on pyspark " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
