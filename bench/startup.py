"""The ``startup`` part: how long the ``rocketstore`` command takes to answer, and its memory.

Each run starts a fresh interpreter as the console script does (``from rocketstore.pipeline.cli import
main``), with this checkout first on the path, and times it from ``fork`` to exit with
``perf_counter``. Its peak RSS is the ``VmHWM`` the child reports from ``/proc/self/status`` as
it exits (``wait4``'s ``ru_maxrss`` would count the benchmark process it was forked from). Measured: ``rocketstore --help``,
and ``rocketstore queues`` on a tiny store (one broker, ten messages, small segments) in a
scratch directory. Baseline: the bare interpreter (``python -c pass``), timed in the same runs.
Targets: ``--help`` under 100 ms, ``queues`` under 250 ms.

Process start-up is sensitive to what else the machine runs: read the figures beside the load
average the JSON records.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import PROJECT_DIR, Options, PartResult, Row, log, scratch_dir, spread

TARGET_HELP_S = 0.100
TARGET_QUEUES_S = 0.250
SCRIPT = "import sys; from rocketstore.pipeline.cli import main; sys.exit(main())"
# The same, reporting its peak RSS on stderr as it exits.
MEASURED = (
    "import atexit, sys\n"
    "def hwm():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            sys.stderr.write(line)\n"
    "atexit.register(hwm)\n" + SCRIPT
)
TINY_CONFIG = "mappedFileSizeCommitLog = 65536\nmaxHashSlotNum = 100\nmaxIndexNum = 400\n"


def timed(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB, 0 when not reported) of one run of ``argv``, which must
    exit 0."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR)}
    t0 = time.perf_counter()
    done = subprocess.run(
        argv, cwd=PROJECT_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    elapsed = time.perf_counter() - t0
    err = done.stderr.decode(errors="replace")
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {err}")
    hwm = [line.split()[1] for line in err.splitlines() if line.startswith("VmHWM:")]
    return elapsed, int(hwm[0]) if hwm else 0


def tiny_store(work: Path) -> tuple[Path, Path]:
    conf = work / "tiny.toml"
    conf.write_text(TINY_CONFIG)
    lines = work / "in.jsonl"
    lines.write_text(
        "".join(f'{{"topic": "T", "body": "m{i}", "queueId": {i % 2}}}\n' for i in range(10))
    )
    store = work / "store"
    subprocess.run(
        [sys.executable, "-c", SCRIPT, "produce", str(store), str(lines), "--config", str(conf)],
        cwd=PROJECT_DIR,
        env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
        capture_output=True,
        check=True,
    )
    return store, conf


def run(options: Options) -> PartResult:
    runs = options.runs
    with scratch_dir(options.work_dir, "startup-") as work:
        store, conf = tiny_store(work)
        cases = {
            "python": [sys.executable, "-c", "pass"],
            "help": [sys.executable, "-c", MEASURED, "--help"],
            "queues": [sys.executable, "-c", MEASURED, "queues", str(store), "--config", str(conf)],
        }
        for argv in cases.values():  # warm the page cache and the bytecode caches
            timed(argv)
        samples: dict[str, list[tuple[float, int]]] = {name: [] for name in cases}
        load_before = os.getloadavg()
        for i in range(runs):
            log(f"startup: run {i + 1}/{runs}")
            for name, argv in cases.items():
                samples[name].append(timed(argv))
        load_after = os.getloadavg()
    data: dict[str, Any] = {
        "runs": runs,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "targets": {"help_s": TARGET_HELP_S, "queues_s": TARGET_QUEUES_S},
    }
    for name, got in samples.items():
        data[name] = {
            "seconds": spread([s for s, _ in got]),
            "max_rss_kib": spread([float(r) for _, r in got]),
            "runs": [{"seconds": s, "max_rss_kib": r} for s, r in got],
        }
    bare = data["python"]["seconds"]["median"]
    rows = []
    for name, label, target in (
        ("help", "rocketstore --help", TARGET_HELP_S),
        ("queues", "rocketstore queues, tiny store", TARGET_QUEUES_S),
    ):
        s = data[name]["seconds"]
        rss = data[name]["max_rss_kib"]["median"] / 1024
        rows.append(
            Row(
                f"{label} (peak RSS {rss:.0f} MiB)",
                "ms",
                s["median"] * 1000,
                s["min"] * 1000,
                s["max"] * 1000,
                baseline=f"python -c pass {bare * 1000:.0f} ms",
                ratio=s["median"] / bare if bare else None,
                target=f"< {target * 1000:.0f} ms",
                met=s["median"] < target,
            )
        )
    notes = [
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; fresh interpreters "
        "with warm page and bytecode caches"
    ]
    return PartResult("startup", rows, data, notes)
