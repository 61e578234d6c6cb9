"""The ``soak`` part: half an hour of steady puts with retention deleting files, two streaming
readers following them and ``verify`` every few minutes; does anything grow?

Four processes, each spawned (:mod:`bench.soak_workers`), and this one sampling them:

* **the writer** puts 100-message batches of 100-byte messages (a key and a tag each, 4
  queues) at a steady 4,000 msgs/s (a batch every 25 ms by the clock) into one broker store
  with small files (4 MiB CommitLog segments, 30,000-unit ConsumeQueue files, 100,000-entry
  IndexFiles) and its background flusher and cleaner running. Retention is RocketMQ's, with
  its clock moved on so that a segment expires 2 minutes after it was last written: from
  minute 2 on the cleaner deletes CommitLog segments, then the ConsumeQueue files and
  IndexFiles below them, every 10 s, for the rest of the run;
* **the reader** is the streaming source without Spark: the source's own stream reader
  (``latestOffset``, ``partitions``, ``read``, ``commit``, as Spark's driver and executors call
  them) from the earliest offsets, a micro-batch every second (a processing-time trigger). It
  checks that every micro-batch holds each queue's planned offsets exactly once, each with the
  body the writer put there;
* **the Spark query**: ``readStream.format("rocketstore")`` from the earliest offsets into the
  ``noop`` sink, ``trigger(processingTime="5 seconds")``, in a ``local[2]`` session; its rows
  are counted from its progress events. It is sampled as a tree: the Python driver, the JVM
  and the JVM's Python workers, summed (the JVM's own VmRSS apart);
* **verify**: every 3 minutes, a fresh process opens the store read-only and runs
  ``rocketstore.pipeline.tools.verify.check`` (a full scan, up to the writer's durable point); once more on the closed
  store at the end.

Every 10 s this process asks the writer and the readers for their counters and reads, for
each, ``/proc/PID/status`` (VmRSS, RssAnon, RssFile, threads), the entries of
``/proc/PID/fd`` and the lines of ``/proc/PID/maps``, and its CPU time from
``/proc/PID/stat``; the writer hands over the latency of every put of the interval
(``perf_counter`` around ``put_batch``) and, as a baseline, of building each batch (no store
involved: what the machine's load alone does); the store's directories are listed to count the
files retention deleted. After the run the writer is stopped (its count is final), the readers
drain until each has read every message written, and the last verify runs.

**Growth** of a figure is from minute 10 to the end: the median of the samples within 30 s of
minute 10 against the median of the last minute's (a median, so that one sample taken while a
segment rolls over or a file is open for a moment does not decide it). Target (issue 27): under
5 % for resident memory and descriptors, 0 errors (a failed put, a read that is not exactly
what was written, a reader that does not get every message, a verify problem). Runs shorter
than 30 minutes measure growth from a third of the run, and keep a sixth of the run.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import csv
import dataclasses
import datetime as dt
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Options, PartResult, Row, log, work_dir_notes
from bench.soak_workers import (
    TOPIC,
    Settings,
    make_root,
    reader_main,
    spark_main,
    verify_main,
    writer_main,
)

FULL_MINUTES = 30.0
QUICK_MINUTES = 2.0
SAMPLE_S = 10.0
WARMUP_S = 600.0  # growth is measured from minute 10
VERIFY_EVERY_S = 180.0
WINDOW_S = 60.0  # a figure "at" a time is the median of the samples in a minute around it
LATENCY_BLOCKS = 6  # p99 over time: the run cut in this many blocks
REPLY_TIMEOUT_S = 120.0
GROWTH_TARGET_PCT = 5.0
MIB = 1 << 20
READERS = ("reader", "spark")
PROCESSES = ("writer", *READERS)
STARTUP_TIMEOUT_S = 900.0  # a Spark session, started up to three times, on a loaded machine


class SoakError(Exception):
    """A worker died or stopped answering."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """How long, and when to sample and verify (seconds)."""

    duration_s: float
    sample_s: float
    warmup_s: float
    verify_every_s: float

    @classmethod
    def for_minutes(cls, minutes: float) -> Plan:
        duration = minutes * 60
        return cls(
            duration, SAMPLE_S, min(WARMUP_S, duration / 3), min(VERIFY_EVERY_S, duration / 4)
        )


# -- /proc ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProcSample:
    """One process (or a tree of them, summed) at one moment: memory in KiB, descriptors,
    mappings, threads, CPU seconds."""

    rss_kib: int = 0
    anon_kib: int = 0
    file_kib: int = 0
    fds: int = 0
    maps: int = 0
    threads: int = 0
    cpu_s: float = 0.0

    def __add__(self, other: ProcSample) -> ProcSample:
        return ProcSample(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self))
        )


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after ``pid (comm)``: state, ppid, ..."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2 :].split()


def proc_sample(pid: int) -> ProcSample:
    """Read ``/proc/PID/{status,fd,maps,stat}`` of a live process."""
    status: dict[str, str] = {}
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.strip()

    def kib(key: str) -> int:
        return int(status.get(key, "0 kB").split()[0])

    with open(f"/proc/{pid}/maps", "rb") as raw:
        maps = sum(1 for _ in raw)
    fields = _stat_fields(pid)
    return ProcSample(
        rss_kib=kib("VmRSS"),
        anon_kib=kib("RssAnon"),
        file_kib=kib("RssFile"),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        maps=maps,
        threads=int(status.get("Threads", "0")),
        cpu_s=(int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),  # utime + stime
    )


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (from the parent ids in ``/proc/*/stat``)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):  # ended meanwhile
                children[int(_stat_fields(int(name))[1])].append(int(name))
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, ()))
    return out


def tree_sample(pid: int) -> tuple[ProcSample, int, int]:
    """The processes of :func:`process_tree` summed; how many there were; the largest
    one's VmRSS in KiB (for the Spark query, the JVM's)."""
    total, count, largest = ProcSample(), 0, 0
    for p in process_tree(pid):
        try:
            one = proc_sample(p)
        except OSError:
            continue  # ended meanwhile (a Spark Python worker)
        total, count, largest = total + one, count + 1, max(largest, one.rss_kib)
    return total, count, largest


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, from ``/proc/stat``."""
    with open("/proc/stat", encoding="ascii") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # minus idle and iowait


# -- the workers ------------------------------------------------------------------------------


class Worker:
    """A spawned worker of :mod:`bench.soak_workers` and its end of the pipe. ``tree``: it
    starts processes of its own (Spark's JVM and Python workers), sampled with it."""

    def __init__(self, name: str, target: Callable[..., None], *args: Any, tree: bool = False):
        ctx = mp.get_context("spawn")
        self.name = name
        self.tree = tree
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child, *args), name=f"soak-{name}")
        self.proc.start()
        child.close()
        self.pid = int(self.reply("ready", STARTUP_TIMEOUT_S))

    def request(self, what: str, value: object = None) -> None:
        self.conn.send((what, value))

    def reply(self, kind: str = "stats", timeout: float = REPLY_TIMEOUT_S) -> Any:
        try:
            if not self.conn.poll(timeout):
                raise SoakError(f"the {self.name} did not answer within {timeout:.0f} s")
            got, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.proc.join(5)
            raise SoakError(f"the {self.name} exited (code {self.proc.exitcode})") from exc
        if got != kind:
            raise SoakError(f"the {self.name} answered {got!r}, expected {kind!r}")
        return value

    def sample(self) -> dict[str, Any]:
        """The worker's columns of a sample row (CPU in seconds so far, made a share later)."""
        extra: dict[str, Any] = {}
        if self.tree:
            p, count, largest = tree_sample(self.pid)
            extra = {"procs": count, "largest_rss_mib": round(largest / 1024, 1)}
        else:
            p = proc_sample(self.pid)
        return {
            "rss_mib": round(p.rss_kib / 1024, 1),
            "anon_mib": round(p.anon_kib / 1024, 1),
            "file_mib": round(p.file_kib / 1024, 1),
            "fds": p.fds,
            "maps": p.maps,
            "threads": p.threads,
            **extra,
            "cpu_s": p.cpu_s,
        }

    def end(self) -> None:
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


# -- the store's files --------------------------------------------------------------------------


class FileWatch:
    """The store's files by kind, listed at each sample: which went since the last listing
    (retention deleted them), how many are there and how much disk they hold."""

    def __init__(self, broker: Path) -> None:
        self.broker = broker
        self.seen: dict[str, set[str]] = {"commitlog": set(), "consumequeue": set(), "index": set()}
        self.deleted: collections.Counter[str] = collections.Counter()

    def _listing(self) -> dict[str, list[Path]]:
        queues = self.broker / "consumequeue" / TOPIC
        cq = [p for q in sorted(queues.iterdir()) for p in q.iterdir()] if queues.is_dir() else []
        return {
            "commitlog": list((self.broker / "commitlog").iterdir()),
            "consumequeue": cq,
            "index": list((self.broker / "index").iterdir()),
        }

    def update(self) -> dict[str, float]:
        live = 0
        allocated = 0
        for kind, paths in self._listing().items():
            names = {str(p) for p in paths}
            self.deleted[kind] += len(self.seen[kind] - names)
            self.seen[kind] = names
            live += len(names)
            for p in paths:
                with contextlib.suppress(FileNotFoundError):  # deleted since the listing
                    allocated += p.stat().st_blocks * 512
        return {
            "deleted_commitlog": self.deleted["commitlog"],
            "deleted_consumequeue": self.deleted["consumequeue"],
            "deleted_index": self.deleted["index"],
            "live_files": live,
            "store_mib": round(allocated / MIB, 1),
        }


# -- the run ----------------------------------------------------------------------------------


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    arr = np.asarray(values)
    return {
        "p50": round(float(np.percentile(arr, 50)), 3),
        "p99": round(float(np.percentile(arr, 99)), 3),
        "max": round(float(arr.max()), 3),
    }


@dataclasses.dataclass
class Run:
    """What a soak collected."""

    samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    latencies: list[list[float]] = dataclasses.field(default_factory=list)  # per sample
    builds: list[list[float]] = dataclasses.field(default_factory=list)  # per sample
    verifies: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    written: int = 0
    read: dict[str, int] = dataclasses.field(default_factory=dict)  # per reader
    spark_start_failures: list[str] = dataclasses.field(default_factory=list)
    drain_s: float = 0.0

    def error(self, t: float, source: str, text: str) -> None:
        log(f"soak: {source} error at {t:.0f} s: {text.strip().splitlines()[-1]}")
        self.errors.append({"t_s": round(t, 1), "source": source, "text": text})


class Soak:
    """The writer, the readers and the verifies of one run, and their sampling."""

    def __init__(self, run_dir: Path, plan: Plan, settings: Settings) -> None:
        self.plan = plan
        self.settings = settings
        root = run_dir / "root"
        self.broker = make_root(root)
        self.run = Run()
        self.watch = FileWatch(self.broker)
        self.verifier = concurrent.futures.ProcessPoolExecutor(
            1, mp_context=mp.get_context("spawn"), max_tasks_per_child=1
        )
        self.verifying: tuple[float, concurrent.futures.Future[dict[str, Any]]] | None = None
        self.next_verify = plan.verify_every_s
        self.workers: dict[str, Worker] = {}
        self.workers["writer"] = Worker("writer", writer_main, str(self.broker), settings)
        self.workers["reader"] = Worker("reader", reader_main, str(root), settings)
        checkpoint = str(run_dir / "checkpoint")
        self.workers["spark"] = Worker(
            "spark", spark_main, str(root), checkpoint, settings, tree=True
        )

    def close(self) -> None:
        self.verifier.shutdown(cancel_futures=True)
        for w in self.workers.values():
            w.end()

    def main(self) -> Run:
        """Sample every ``plan.sample_s`` until ``plan.duration_s`` or a worker fails, then
        stop the writer, drain the readers and verify the closed store."""
        self.workers["writer"].request("go")
        t0 = time.monotonic()
        cpu = {name: w.sample()["cpu_s"] for name, w in self.workers.items()}
        ticks = machine_ticks()
        for i in range(1, int(self.plan.duration_s // self.plan.sample_s) + 1):
            due = t0 + i * self.plan.sample_s
            # Wakes at the tick, or at once when a worker dies.
            sentinels = [w.proc.sentinel for w in self.workers.values()]
            if wait(sentinels, max(0.0, due - time.monotonic())):
                dead = [n for n, w in self.workers.items() if not w.proc.is_alive()]
                raise SoakError(f"the {', '.join(dead)} exited before the end")
            t = time.monotonic() - t0
            row: dict[str, Any] = {"t_s": round(t, 1), "load1": round(os.getloadavg()[0], 2)}
            now_ticks = machine_ticks()
            row["machine_busy_pct"] = round(
                100 * (now_ticks[0] - ticks[0]) / max(1, now_ticks[1] - ticks[1]), 1
            )
            ticks = now_ticks
            for w in self.workers.values():
                w.request("sample")
            for name, w in self.workers.items():
                got = w.sample()
                used = got.pop("cpu_s")
                # A Spark worker that ended takes its CPU time with it: never below 0.
                got["cpu_pct"] = round(max(0.0, 100 * (used - cpu[name]) / self.plan.sample_s), 1)
                cpu[name] = used
                row.update({f"{name}_{key}": value for key, value in got.items()})
            stats = {name: w.reply() for name, w in self.workers.items()}
            self._note(t, row, stats)
            row.update(self.watch.update())
            # Each mapped segment holds a descriptor: what the writer holds beyond its files.
            row["writer_fds_beyond_files"] = row["writer_fds"] - row["live_files"]
            row["verify"] = self._verify(t)
            row["errors"] = len(self.run.errors)
            self.run.samples.append(row)
            log(_progress_line(row))
            # Every error is counted; the run ends early only when a worker cannot go on.
            gave_up = [name for name, s in stats.items() if s["stopped"]]
            if gave_up:
                log(f"soak: stopping early: the {', '.join(gave_up)} stopped")
                break
        self._finish(time.monotonic() - t0)
        return self.run

    def _note(self, t: float, row: dict[str, Any], stats: dict[str, dict[str, Any]]) -> None:
        """The workers' counters into the row; their errors into the run."""
        ws = stats["writer"]
        self.run.latencies.append(ws["latencies_ms"])
        self.run.builds.append(ws["build_ms"])
        lat = _percentiles(ws["latencies_ms"])
        self.run.written = ws["written"]
        row.update(
            written=ws["written"],
            puts=len(ws["latencies_ms"]),
            put_p50_ms=lat["p50"],
            put_p99_ms=lat["p99"],
            put_max_ms=lat["max"],
            writer_slips=ws["slips"],
        )
        for name in READERS:
            s = stats[name]
            self.run.read[name] = s["read"]
            row[f"{name}_read"] = s["read"]
            row[f"{name}_backlog"] = ws["written"] - s["read"]
            row[f"{name}_batches"] = len(s["batch_ms"])
            row[f"{name}_batch_max_ms"] = _percentiles(s["batch_ms"])["max"]
        for key, value in stats["reader"]["heap"].items():
            row[f"reader_{key}"] = value
        for name, s in stats.items():
            for text in s["errors"]:
                self.run.error(t, name, text)
            self.run.spark_start_failures.extend(s.get("start_failures", []))

    def _verify(self, t: float) -> str:
        """Collect a verify that finished, start one when due; the outcome for the sample."""
        outcome = ""
        if self.verifying is not None and self.verifying[1].done():
            outcome = self._verify_result(t, *self.verifying)
            self.verifying = None
        if self.verifying is None and t >= self.next_verify:
            future = self.verifier.submit(verify_main, str(self.broker), self.settings)
            self.verifying = (t, future)
            self.next_verify += self.plan.verify_every_s
        return outcome

    def _verify_result(
        self, t: float, started: float, future: concurrent.futures.Future[dict[str, Any]]
    ) -> str:
        """Record a finished verify; returns its outcome in a word or two."""
        try:
            report = future.result()
        except Exception as exc:  # the scan itself failed: an error like any other
            self.run.error(t, "verify", f"{type(exc).__name__}: {exc}")
            self.run.verifies.append(
                {"t_s": round(started, 1), "ok": False, "exception": repr(exc)}
            )
            return "failed"
        report["t_s"] = round(started, 1)
        self.run.verifies.append(report)
        if not report["ok"]:
            for p in report["problems"]:
                self.run.error(
                    t, "verify", f"{p['path']} @ {p['offset']}: {p['kind']}: {p['detail']}"
                )
            return f"{len(report['problems'])} problems"
        return "ok"

    def _finish(self, t: float) -> None:
        writer = self.workers["writer"]
        writer.request("stop")
        final = writer.reply()
        self.run.written = final["written"]
        for text in final["errors"]:
            self.run.error(t, "writer", text)
        started = time.monotonic()
        for name in READERS:
            self.workers[name].request("drain", self.run.written)
        for name in READERS:
            final = self.workers[name].reply(timeout=REPLY_TIMEOUT_S * 2)
            self.run.read[name] = final["read"]
            for text in final["errors"]:
                self.run.error(t, name, text)
        self.run.drain_s = time.monotonic() - started
        if self.verifying is not None:
            self._verify_result(t, *self.verifying)
        future = self.verifier.submit(verify_main, str(self.broker), self.settings)
        self._verify_result(t, t, future)


def soak(run_dir: Path, plan: Plan, settings: Settings) -> Run:
    """Run the writer, the readers and the verifies for ``plan.duration_s``; sample them."""
    run = Soak(run_dir, plan, settings)
    try:
        return run.main()
    finally:
        run.close()


def _progress_line(row: dict[str, Any]) -> str:
    minutes, seconds = divmod(int(row["t_s"]), 60)
    procs = "  ".join(
        f"{name} {row[f'{name}_rss_mib']:.1f} MiB {row[f'{name}_fds']} fd {row[f'{name}_maps']} maps"
        for name in PROCESSES
    )
    return (
        f"soak {minutes:2d}:{seconds:02d}  {procs}  written {row['written']:,} backlog "
        f"{row['reader_backlog']:,}/{row['spark_backlog']:,}  put p99 {row['put_p99_ms']} ms  "
        f"deleted {row['deleted_commitlog']}/{row['deleted_consumequeue']}/{row['deleted_index']}"
        f"  load {row['load1']}" + (f"  verify {row['verify']}" if row["verify"] else "")
    )


# -- the figures ------------------------------------------------------------------------------


def _median_near(samples: list[dict[str, Any]], key: str, lo: float, hi: float) -> float | None:
    values = [s[key] for s in samples if lo <= s["t_s"] <= hi]
    return float(np.median(values)) if values else None


def growth(samples: list[dict[str, Any]], key: str, plan: Plan) -> dict[str, Any]:
    """``key`` at the end of the warm-up and at the end (each the median of the samples in a
    minute around it), the growth between them, the largest value after the warm-up, and the
    least-squares slope after the warm-up (per 10 minutes)."""
    end_t = samples[-1]["t_s"] if samples else 0.0
    base = _median_near(samples, key, plan.warmup_s - WINDOW_S / 2, plan.warmup_s + WINDOW_S / 2)
    end = _median_near(samples, key, end_t - WINDOW_S, end_t)
    after = [(s["t_s"], s[key]) for s in samples if s["t_s"] >= plan.warmup_s]
    slope = None
    if len(after) >= 3:
        ts, vs = np.asarray(after, dtype=np.float64).T
        slope = float(np.polyfit(ts, vs, 1)[0]) * 600
    pct = None if base is None or end is None or base == 0 else 100 * (end - base) / base
    return {
        "at_warmup": base,
        "at_end": end,
        "growth_pct": None if pct is None else round(pct, 2),
        "max_after_warmup": max((v for _, v in after), default=None),
        "slope_per_10min": None if slope is None else round(slope, 3),
    }


def latency_over_time(run: Run, plan: Plan) -> list[dict[str, Any]]:
    """Put latency percentiles per block of the run (:data:`LATENCY_BLOCKS` blocks)."""
    block_s = plan.duration_s / LATENCY_BLOCKS
    blocks: dict[int, list[float]] = collections.defaultdict(list)
    for sample, values in zip(run.samples, run.latencies, strict=True):
        index = min(LATENCY_BLOCKS - 1, int((sample["t_s"] - 1e-6) // block_s))
        blocks[index].extend(values)
    return [
        {"from_min": round(i * block_s / 60, 1), "to_min": round((i + 1) * block_s / 60, 1)}
        | _percentiles(blocks[i])
        | {"puts": len(blocks[i])}
        for i in sorted(blocks)
    ]


# The reader's heap figures (soak_workers.heap_figures): sample key, row label, unit.
HEAP_ROWS = (
    ("malloc_heap_mib", "malloc heaps", "MiB"),
    ("malloc_used_mib", "malloc in use", "MiB"),
    ("arrow_mib", "Arrow pool in use", "MiB"),
    ("py_objects", "Python objects", "objects"),
)


def summarise(run: Run, plan: Plan, settings: Settings) -> dict[str, Any]:
    keys = ["rss_mib", "anon_mib", "file_mib", "fds", "maps", "threads"]
    out: dict[str, Any] = {
        name: {
            key: growth(run.samples, f"{name}_{key}", plan)
            for key in keys + (["procs", "largest_rss_mib"] if name == "spark" else [])
        }
        for name in PROCESSES
    }
    out["store"] = {key: growth(run.samples, key, plan) for key in ("store_mib", "live_files")}
    out["writer"]["fds_beyond_files"] = growth(run.samples, "writer_fds_beyond_files", plan)
    # Where the reader's anonymous memory is (soak_workers.heap_figures).
    for key, _label, _unit in HEAP_ROWS:
        out["reader"][key] = growth(run.samples, f"reader_{key}", plan)
    every = [v for values in run.latencies for v in values]
    builds = [v for values in run.builds for v in values]
    last = run.samples[-1] if run.samples else {}
    loads = [s["load1"] for s in run.samples]
    out.update(
        {
            "put_latency_ms": _percentiles(every),
            "build_latency_ms": _percentiles(builds),
            "put_latency_over_time": latency_over_time(run, plan),
            "written": run.written,
            "read": run.read,
            "offered_msgs_per_s": settings.rate,
            "achieved_msgs_per_s": round(run.written / max(1.0, last.get("t_s", 1.0)), 1),
            "writer_slips": last.get("writer_slips", 0),
            "drain_s": round(run.drain_s, 1),
            "deleted": {
                kind: last.get(f"deleted_{kind}", 0)
                for kind in ("commitlog", "consumequeue", "index")
            },
            "verifies": len(run.verifies),
            "verifies_ok": sum(1 for v in run.verifies if v.get("ok")),
            "verify_s": [v.get("wall_s") for v in run.verifies],
            # Scans started over because retention deleted a file under them (verify_read_only).
            "verify_restarts": [v.get("restarts", 0) for v in run.verifies],
            "errors": len(run.errors),
            "spark_start_failures": run.spark_start_failures,
            "load1": {"min": min(loads), "median": float(np.median(loads)), "max": max(loads)}
            if loads
            else None,
            "machine_busy_pct_median": float(
                np.median([s["machine_busy_pct"] for s in run.samples])
            )
            if run.samples
            else None,
        }
    )
    return out


def _growth_row(name: str, label: str, unit: str, g: dict[str, Any], target: bool) -> Row:
    pct = g["growth_pct"]
    baseline = (
        f"{g['at_warmup']:g} -> {g['at_end']:g} {unit} (max {g['max_after_warmup']:g})"
        if g["at_end"] is not None and g["at_warmup"] is not None
        else "no samples"
    )
    met = None if not target or pct is None else pct < GROWTH_TARGET_PCT
    return Row(
        f"{name} {label} growth",
        "%",
        float("nan") if pct is None else pct,
        baseline=baseline,
        target=f"< {GROWTH_TARGET_PCT:g} %" if target else "",
        met=met,
    )


def rows(summary: dict[str, Any], run: Run) -> list[Row]:
    out: list[Row] = []
    for name in PROCESSES:
        g = summary[name]
        out.append(_growth_row(name, "VmRSS", "MiB", g["rss_mib"], True))
        out.append(_growth_row(name, "RssAnon", "MiB", g["anon_mib"], False))
        if name == "spark":
            out.append(_growth_row(name, "JVM VmRSS", "MiB", g["largest_rss_mib"], False))
        out.append(_growth_row(name, "descriptors", "fds", g["fds"], True))
        out.append(_growth_row(name, "mappings", "maps", g["maps"], False))
        if name == "reader":
            for key, label, unit in HEAP_ROWS:
                out.append(_growth_row(name, label, unit, g[key], False))
    out.append(_growth_row("store", "disk use", "MiB", summary["store"]["store_mib"], False))
    out.append(_growth_row("store", "files", "files", summary["store"]["live_files"], False))
    beyond = summary["writer"]["fds_beyond_files"]
    out.append(_growth_row("writer", "descriptors beyond the store's files", "fds", beyond, False))
    lat = summary["put_latency_ms"]
    build = summary["build_latency_ms"]
    worst = max(
        (b for b in summary["put_latency_over_time"] if b["p99"] is not None),
        key=lambda b: b["p99"],
        default=None,
    )
    if lat["p99"] is not None:
        out.append(
            Row(
                "put latency p99, whole run",
                "ms",
                lat["p99"],
                baseline=f"p50 {lat['p50']} ms; building a batch: p50 {build['p50']}, "
                f"p99 {build['p99']} ms",
            )
        )
    if worst is not None:
        out.append(
            Row(
                "put latency p99, worst block",
                "ms",
                worst["p99"],
                baseline=f"minutes {worst['from_min']:g}-{worst['to_min']:g}",
            )
        )
    out.append(
        Row(
            "messages written",
            "msgs/s",
            summary["achieved_msgs_per_s"],
            baseline=f"{run.written:,} in all; offered {summary['offered_msgs_per_s']:,}/s",
        )
    )
    for name, what in (("reader", "read and checked"), ("spark", "read by the Spark query")):
        got = run.read.get(name, 0)
        out.append(
            Row(f"messages {what}", "msgs", got, target="all written", met=got == run.written)
        )
    d = summary["deleted"]
    out.append(
        Row(
            "files retention deleted",
            "files",
            sum(d.values()),
            baseline=f"{d['commitlog']} segments, {d['consumequeue']} CQ files, {d['index']} IndexFiles",
            target="> 0",
            met=d["commitlog"] > 0,
        )
    )
    out.append(
        Row(
            "verify runs clean",
            "runs",
            summary["verifies_ok"],
            baseline=f"of {summary['verifies']}; started over {sum(summary['verify_restarts'])} "
            "time(s) when retention deleted under a scan",
            target="all",
            met=summary["verifies"] > 0 and summary["verifies_ok"] == summary["verifies"],
        )
    )
    out.append(Row("errors", "", len(run.errors), target="0", met=not run.errors))
    return out


def write_samples(
    directory: Path, run: Run, summary: dict[str, Any], extra: dict[str, Any]
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if run.samples:
        with open(directory / "samples.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(run.samples[0]))
            writer.writeheader()
            writer.writerows(run.samples)
    payload = {
        **extra,
        "summary": summary,
        "samples": run.samples,
        "verifies": run.verifies,
        "errors": run.errors,
    }
    (directory / "samples.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


def run(options: Options) -> PartResult:
    minutes = options.minutes or (QUICK_MINUTES if options.quick else FULL_MINUTES)
    plan = Plan.for_minutes(minutes)
    # A short run keeps less, so that retention deletes files for most of it too.
    settings = Settings(retention_s=int(min(Settings.retention_s, plan.duration_s / 6)))
    notes = work_dir_notes(options.work_dir, "soak")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = options.out_dir / f"soak-{stamp}"
    run_dir = Path(tempfile.mkdtemp(prefix="soak-", dir=options.work_dir))
    log(f"soak: {minutes:g} minutes, store and checkpoint in {run_dir}, samples to {out_dir}")
    try:
        result = soak(run_dir, plan, settings)
    except SoakError as exc:
        result = Run()
        result.error(0.0, "soak", str(exc))
    summary = summarise(result, plan, settings)
    extra = {"plan": dataclasses.asdict(plan), "settings": dataclasses.asdict(settings)}
    write_samples(out_dir, result, summary, extra)
    if result.errors:
        notes.append(f"store kept for a look: {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    blocks = ", ".join(
        f"{b['from_min']:g}-{b['to_min']:g} min {b['p99']} ms"
        for b in summary["put_latency_over_time"]
    )
    notes.append(f"put p99 over time: {blocks}")
    if summary["load1"] is not None:
        load = summary["load1"]
        notes.append(
            f"load average {load['min']:.1f} .. {load['max']:.1f} (median {load['median']:.1f}); "
            f"machine CPU busy {summary['machine_busy_pct_median']:.0f} % (median)"
        )
    if result.spark_start_failures:
        notes.append(
            f"the Spark query failed to start {len(result.spark_start_failures)} time(s) and was "
            f"started again: {result.spark_start_failures[0][:200]}"
        )
    notes.append(f"samples: {out_dir / 'samples.csv'}")
    return PartResult(
        "soak",
        rows(summary, result),
        {**extra, "summary": summary, "errors": result.errors, "samples_dir": str(out_dir)},
        notes,
    )
