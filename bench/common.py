"""What every benchmark part shares: options, machine facts, statistics, scratch space, the
table printer and the JSON writer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR.parent
DEFAULT_OUT_DIR = BENCH_DIR / "out"
T = TypeVar("T")
MB = 1_000_000  # MB/s in the tables is 10^6 bytes per second


@dataclasses.dataclass(frozen=True)
class Options:
    """Settings of one benchmark invocation (the command line, or a test)."""

    runs: int = 5
    quick: bool = False
    pin: bool = True
    out_dir: Path = DEFAULT_OUT_DIR
    # Scratch stores and files go here; it must be on the disk under test (the project's).
    work_dir: Path = DEFAULT_OUT_DIR / "tmp"
    seed: int = 20240611
    # How long the soak part and the tier part's upload run last (None: their defaults).
    minutes: float | None = None
    # The tier part's figures to run (None: all of them): remeasuring one after a change.
    figures: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError(f"runs must be >= 1, got {self.runs}")
        if self.minutes is not None and self.minutes <= 0:
            raise ValueError(f"minutes must be > 0, got {self.minutes}")


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of a part's table. ``median``, ``low`` and ``high`` are in ``unit``."""

    name: str
    unit: str
    median: float
    low: float | None = None
    high: float | None = None
    baseline: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None

    @classmethod
    def of(cls, name: str, unit: str, values: dict[str, float], **rest: Any) -> Row:
        """A row of the median, min and max of a :func:`spread`."""
        return cls(name, unit, values["median"], values["min"], values["max"], **rest)


@dataclasses.dataclass
class PartResult:
    """What a part hands back: rows for the table and everything for the JSON file."""

    part: str
    rows: list[Row]
    data: dict[str, Any]
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def targets_met(self) -> bool:
        return all(r.met is not False for r in self.rows)


# -- statistics --------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentiles(samples: Sequence[float], qs: Sequence[float]) -> dict[str, float]:
    """``{"p50": …}`` for each q in ``qs`` (linear interpolation between order statistics)."""
    arr = np.asarray(samples, dtype=np.float64)
    return {f"p{q:g}": float(np.percentile(arr, q)) for q in qs}


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": median(values), "min": float(min(values)), "max": float(max(values))}


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """(seconds, result) of ``fn()``, garbage collected first so that no earlier run's
    leftovers are collected inside the timing."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# -- machine -----------------------------------------------------------------------------------


def _first_line_with(path: str, prefix: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(PROJECT_DIR), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def machine_info() -> dict[str, Any]:
    """The facts a figure needs beside it to mean anything."""
    mem_kib = _first_line_with("/proc/meminfo", "MemTotal").split()[0]
    return {
        "nproc": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "cpu_model": _first_line_with("/proc/cpuinfo", "model name"),
        "mem_total_gib": round(int(mem_kib) / 2**20, 1) if mem_kib.isdigit() else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyarrow": pa.__version__,
        "arrow_memory_pool": pa.default_memory_pool().backend_name,
        "git_commit": _git_commit(),
    }


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"machine: {m['nproc']} vCPU ({m['cpu_model']}), {m['mem_total_gib']} GiB, "
        f"Linux {m['kernel']}; Python {m['python']}, numpy {m['numpy']}, "
        f"pyarrow {m['pyarrow']} ({m['arrow_memory_pool']} pool); commit {m['git_commit']}"
    )


# -- CPU time --------------------------------------------------------------------------------


def process_tree_cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (default this one) and all
    its descendants, reaped children included: for a Spark part, this process, its JVM and the
    JVM's Python workers. On a machine shared with other work it moves far less than wall time
    does. 0.0 where ``/proc`` is not there."""
    root = os.getpid() if pid is None else pid
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0.0
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        # After "pid (comm) ": state ppid ... utime stime cutime cstime at 11..14.
        fields = stat[stat.rindex(")") + 2 :].split()
        parent[int(name)] = int(fields[1])
        ticks[int(name)] = sum(int(x) for x in fields[11:15])
    children: dict[int, list[int]] = {}
    for child, ppid in parent.items():
        children.setdefault(ppid, []).append(child)
    total, stack = 0, [root]
    while stack:
        p = stack.pop()
        total += ticks.get(p, 0)
        stack.extend(children.get(p, ()))
    return total / tick


# -- CPU pinning -------------------------------------------------------------------------------


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _cpu_busy_ticks() -> dict[int, int]:
    busy: dict[int, int] = {}
    with open("/proc/stat", encoding="ascii") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                ticks = [int(x) for x in fields]
                busy[int(name[3:])] = sum(ticks) - ticks[3] - ticks[4]  # minus idle, iowait
    return busy


def idlest_cpu(cpus: set[int], window_s: float = 0.25) -> int:
    """The CPU of ``cpus`` that was least busy over the next ``window_s`` seconds."""
    try:
        first = _cpu_busy_ticks()
        time.sleep(window_s)
        second = _cpu_busy_ticks()
        return min(cpus, key=lambda c: (second.get(c, 0) - first.get(c, 0), -c))
    except (OSError, ValueError, IndexError):
        return max(cpus)


@contextlib.contextmanager
def pinned_to_one_cpu(enabled: bool = True) -> Iterator[int | None]:
    """Pin every thread of this process (and threads started meanwhile) to one CPU, the one
    least busy just before (on a shared machine, another process may be hogging the other).

    Yields the CPU, or None when pinning is off or impossible. Affinity is per thread on Linux,
    so the threads that already exist (Arrow's pool, for one) are pinned one by one.
    """
    if not enabled or not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = {tid: os.sched_getaffinity(tid) for tid in _thread_ids()}
    cpu = idlest_cpu(os.sched_getaffinity(0))
    for tid in before:
        with contextlib.suppress(OSError):  # a thread may have ended meanwhile
            os.sched_setaffinity(tid, {cpu})
    try:
        yield cpu
    finally:
        everything = set().union(*before.values())
        for tid in _thread_ids():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, before.get(tid, everything))


@contextlib.contextmanager
def processes_pinned(pids: list[int], cpus: set[int]) -> Iterator[None]:
    """Every thread of the processes ``pids`` (threads they start meanwhile inherit it) kept
    to ``cpus`` for the block, their affinity put back after. A process that ended is skipped."""
    before: dict[int, set[int]] = {}
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):
                before[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        for tid, was in before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, was)


# -- scratch space -----------------------------------------------------------------------------


def check_work_dir(work_dir: Path) -> str | None:
    """A warning when the scratch directory is not on the project's filesystem."""
    work_dir.mkdir(parents=True, exist_ok=True)
    if os.stat(work_dir).st_dev != os.stat(PROJECT_DIR).st_dev:
        return (
            f"scratch directory {work_dir} is not on the filesystem of {PROJECT_DIR}; "
            "figures describe that other filesystem"
        )
    return None


def work_dir_notes(work_dir: Path, part: str) -> list[str]:
    """The notes a part starts with: :func:`check_work_dir`'s warning, if any, also logged."""
    warning = check_work_dir(work_dir)
    if warning is None:
        return []
    log(f"{part}: warning: {warning}")
    return [warning]


@contextlib.contextmanager
def scratch_dir(work_dir: Path, prefix: str) -> Iterator[Path]:
    """A fresh directory under ``work_dir``, removed afterwards however the block ends."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=work_dir))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- output ------------------------------------------------------------------------------------


def fmt_number(value: float) -> str:
    a = abs(value)
    if a >= 100_000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:,.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def format_table(result: PartResult, runs: int) -> str:
    headers = (
        "measurement",
        "median",
        f"min .. max ({runs} run{'s' if runs != 1 else ''})",
        "baseline",
        "ratio",
        "target",
    )
    lines: list[tuple[str, ...]] = []
    for r in result.rows:
        rng = ""
        if r.low is not None and r.high is not None:
            rng = f"{fmt_number(r.low)} .. {fmt_number(r.high)}"
        target = r.target
        if r.met is not None:
            target = f"{target}  {'met' if r.met else 'MISSED'}"
        lines.append(
            (
                r.name,
                f"{fmt_number(r.median)} {r.unit}".strip(),
                rng,
                r.baseline,
                "" if r.ratio is None else f"{r.ratio:.3f}",
                target,
            )
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]

    def render(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [render(headers), render(tuple("-" * w for w in widths))]
    out.extend(render(line) for line in lines)
    out.extend(f"  note: {n}" for n in result.notes)
    return "\n".join(out)


def _json_default(obj: object) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def write_json(out_dir: Path, result: PartResult, payload: dict[str, Any]) -> Path:
    """Write ``<part>-<UTC timestamp>.json`` and a ``<part>-latest.json`` copy; returns the first."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    text = json.dumps(payload, indent=2, default=_json_default) + "\n"
    path = out_dir / f"{result.part}-{stamp}.json"
    path.write_text(text, encoding="utf-8")
    (out_dir / f"{result.part}-latest.json").write_text(text, encoding="utf-8")
    return path


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def log(message: str) -> None:
    """Progress on stderr, so stdout carries only the results."""
    print(message, file=sys.stderr, flush=True)


# The stock RocketMQ 4.9.4 kit beside the checkout (../shared/rocketmq-4.9.4, README there): its
# jars are the baselines that run RocketMQ's own store in-process (bench/java/).
ROCKETMQ_KIT = Path(__file__).resolve().parent.parent.parent / "shared" / "rocketmq-4.9.4"


def java_classes(work: Path, source: Path) -> tuple[Path | None, str | None]:
    """``source`` (a class of bench/java/) compiled against the kit's jars into ``work/java``:
    (the classes' folder, None), or (None, why not)."""
    if not (ROCKETMQ_KIT / "env.sh").is_file():
        return None, f"no RocketMQ kit at {ROCKETMQ_KIT}: {source.stem}'s figures are left out"
    classes = work / "java"
    classes.mkdir(parents=True, exist_ok=True)
    compile_ = '. "$1/env.sh" && exec javac -nowarn -cp "$CP" -d "$2" "$3"'
    done = subprocess.run(
        ["bash", "-c", compile_, "-", str(ROCKETMQ_KIT), str(classes), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return None, f"{source.name} did not compile ({done.stderr.strip()[-300:]})"
    return classes, None
