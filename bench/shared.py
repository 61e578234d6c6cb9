"""The ``shared`` part: the store on the shared file systems, against the local disk, in one run.

Two FUSE mounts of one file system stand for two hosts (each has its own client cache):
a replicated GlusterFS volume made by :mod:`tests.kit.gluster` (replica 3, bricks on 127.0.0.2
under the work directory), and a folder of CephFS mounted by two ceph-fuse clients of a
throwaway single-node Ceph (:mod:`tests.kit.ceph`, :mod:`tests.kit.cephfs`; Ceph's default
settings). Both are torn down at the end. A file system that cannot be made here (not root, no
FUSE, no packages, no ../shared) is left out, with the reason in the notes; the figures of the
others stand.

Figures, each the median of ``--runs`` runs:

1. **Put and flush**: a batch put of ``put_messages`` 100-byte messages followed by a flush
   (the time until the data is on the servers, which is what publishes it), into a fresh store
   through mount A, beside the same on the local disk (the work directory), run back to back.
   Reported as msgs/s and the ratio GlusterFS / local.
2. **Put to visible on the other host**: a writer through mount A puts one message at a time
   (``visibility_messages`` of them, a few ms apart); a reader thread polls the planner's view
   of the queue (:class:`rocketstore.source.brokerview.BrokerView`, ``sharedStorage=auto``, so the
   visibility rule applies) through mount B as fast as it can. For each message, the time from
   the put's return to the first poll that offers it: p50 and p99, under ``ASYNC_FLUSH`` (the
   background flush publishes every ``flushIntervalCommitLog`` = 500 ms) and ``SYNC_FLUSH``
   (each put publishes before it returns). The poll loop's own period is reported beside it.
   A poll still not back ``HANG_S`` after the run (a read through ceph-fuse that never
   returned: docs/cluster.md) is freed by aborting mount B, which is made again; the run is
   reported as hung and its delays are left out.

3. **Spark sink and source**: the data source writer (``writeStream.format("rocketstore")``,
   ``availableNow``, 2 brokers x 4 queues) storing ``spark_rows`` 100-byte rows from parquet
   into a store on mount A, beside the same into the local disk; then the streaming source
   (``format("rocketstore")`` into Spark's noop sink) reading that store back, the GlusterFS
   one through mount B (the other host, so the visibility rule is in play). Checkpoints stay
   on the local disk either way, so the figures are the store's. Rows/s and the ratio
   GlusterFS / local, the two run back to back in one ``local[2]`` session.

4. **Take-over**: a writer process holding a store through mount A is killed -9; a writer
   through mount B opens the store as soon as the lock is free. Seconds from the kill to the
   open's return (the lock's release seen through B, and the recovery).

The load average before and after is in the JSON and the notes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import (
    Options,
    PartResult,
    Row,
    log,
    median,
    percentiles,
    scratch_dir,
    work_dir_notes,
)
from rocketstore.pipeline.config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import StoreLockedError
from rocketstore.source.brokerview import BrokerView

# The shared file systems, by the name used in rows and the JSON.
NAMES = {"glusterfs": "GlusterFS", "cephfs": "CephFS"}
ROOT = Path(__file__).resolve().parent.parent

CONFIG = StoreConfig(
    mapped_file_size_commitlog=64 << 20,
    mapped_file_size_consume_queue=300_000 * 20,
    max_hash_slot_num=50_000,
    max_index_num=400_000,
)


@dataclasses.dataclass(frozen=True)
class Sizes:
    put_messages: int
    visibility_messages: int
    gap_s: float
    spark_rows: int


FULL = Sizes(put_messages=200_000, visibility_messages=300, gap_s=0.02, spark_rows=1_000_000)
QUICK = Sizes(put_messages=10_000, visibility_messages=40, gap_s=0.01, spark_rows=50_000)


def _table(first: int, n: int) -> pa.Table:
    ids = np.arange(first, first + n)
    return pa.table(
        {
            "topic": pa.array(["T"] * n, pa.string()),
            "body": pa.array([b"%099d" % i for i in ids.tolist()], pa.binary()),
            "queueId": pa.array(ids % 4, pa.int32()),
        }
    )


def put_and_flush(directory: Path, table: pa.Table) -> float:
    """Seconds for one batch put and the flush after it, into a fresh store."""
    with scratch_dir(directory, "put-") as path, MessageStore(path, CONFIG, background=False) as s:
        t0 = time.perf_counter()
        s.put_batch(table)
        s.flush()
        return time.perf_counter() - t0


HANG_S = 120.0  # a reader's poll this much past the run's end is stuck in the file system


def abort_mount(point: Path) -> None:
    """Abort the FUSE connection of the mount at ``point``: every request waiting on it fails
    with ENOTCONN (how an operator frees processes stuck on a FUSE mount; it must be mounted
    again after). Raises where ``point`` is no FUSE mount."""
    minor = os.minor(os.stat(point).st_dev)
    connections = Path("/sys/fs/fuse/connections")
    if not (connections / str(minor)).is_dir():
        subprocess.run(["mount", "-t", "fusectl", "fusectl", str(connections)], check=False)
    (connections / str(minor) / "abort").write_text("1")


def ack_to_visible(a: Path, b: Path, sizes: Sizes, flush: str) -> dict[str, Any]:
    """Milliseconds from each put's return (writer through ``a``) to the first poll through
    ``b`` that offers its message; the same store seen through both mounts. A reader stuck in
    the file system (its poll not back ``HANG_S`` after the run) is freed by aborting mount
    ``b`` (``hung`` in the result: the mount must be made again)."""
    name = f"vis-{flush.lower()}-{os.getpid()}-{time.monotonic_ns()}"
    config = dataclasses.replace(CONFIG, flush_disk_type=flush)
    n = sizes.visibility_messages
    acked = np.zeros(n)
    seen = np.full(n, np.nan)
    polls: list[float] = []
    done = threading.Event()

    def reader() -> None:
        view = BrokerView("b", b / name)
        last = 0
        while not done.is_set() and last < n:
            t0 = time.perf_counter()
            try:
                end = view.queue_bounds("T", 0).max
            except FileNotFoundError:
                end = 0  # the store's directories have not reached this mount yet
            now = time.perf_counter()
            polls.append(now - t0)
            if end > last:
                seen[last:end] = now
                last = end

    try:
        with MessageStore(a / name, config) as store:
            thread = threading.Thread(target=reader, name="bench-reader")
            thread.start()
            try:
                for i in range(n):
                    store.put_batch(_table(i * 4, 1))
                    acked[i] = time.perf_counter()
                    time.sleep(sizes.gap_s)  # pacing of the offered load, not synchronisation
                deadline = time.monotonic() + 30
                while np.isnan(seen).any() and time.monotonic() < deadline and thread.is_alive():
                    thread.join(0.05)
            finally:
                done.set()
                thread.join(HANG_S)
                hung = thread.is_alive()
                if hung:
                    abort_mount(b)
                    thread.join()
    finally:
        shutil.rmtree(a / name, ignore_errors=True)
    delays = (seen - acked) * 1000
    missing = int(np.isnan(delays).sum())
    got = delays[~np.isnan(delays)]
    return {
        "flush": flush,
        "messages": n,
        "unseen": missing,
        "hung": hung,
        **({k: v for k, v in percentiles(got.tolist(), (50, 99)).items()} if len(got) else {}),
        "max": float(got.max()) if len(got) else None,
        "poll_ms_p50": percentiles([p * 1000 for p in polls], (50,))["p50"] if polls else None,
    }


def remount(hosts: Any, point: Path) -> None:
    """Mount ``point`` of ``hosts`` again after :func:`abort_mount` (CephFS's hosts can: a
    client of its own; a GlusterFS volume of the test kit cannot, and the run stops)."""
    if not hasattr(hosts, "mount"):
        raise RuntimeError(f"reads through {point} hung, and this mount cannot be made again")
    subprocess.run(["umount", "-l", str(point)], check=False)
    hosts.mount(point)


class SparkPair:
    """The Spark sink and source timed against one store directory (see figure 3)."""

    def __init__(self, work: Path, rows: int) -> None:
        from bench.session import local_session
        from bench.spark_sink import make_input

        self.spark, self.owned = local_session("rocketstore-bench-shared")
        self.work = work
        self.input = work / "input"
        make_input(self.spark, self.input, rows)
        self.schema = self.spark.read.parquet(str(self.input)).schema
        self.runs = 0

    def sink(self, root: Path) -> tuple[float, int]:
        """Seconds and rows for the data source writer storing the input under ``root``."""
        self.runs += 1
        query = (
            self.spark.readStream.schema(self.schema)
            .parquet(str(self.input))
            .writeStream.format("rocketstore")
            .option("path", str(root))
            .option("topic", "bench")
            .option("brokers", 2)
            .option("queues", 4)
            .option("checkpointLocation", str(self.work / f"ck-sink-{self.runs}"))
            .trigger(availableNow=True)
        )
        return _timed(query.start)

    def source(self, root: Path) -> tuple[float, int]:
        """Seconds and rows for the streaming source reading every message under ``root``."""
        self.runs += 1
        query = (
            self.spark.readStream.format("rocketstore")
            .option("path", str(root))
            .option("topic", "bench")
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(self.work / f"ck-source-{self.runs}"))
            .trigger(availableNow=True)
        )
        return _timed(query.start)

    def close(self) -> None:
        if self.owned:
            self.spark.stop()


def _timed(start: Any) -> tuple[float, int]:
    t0 = time.perf_counter()
    query = start()
    query.awaitTermination()
    elapsed = time.perf_counter() - t0
    return elapsed, sum(int(p["numInputRows"]) for p in query.recentProgress)


def spark_figures(mounts: dict[str, Any], options: Options, rows: int) -> list[dict[str, float]]:
    """Per run, rows/s of the sink and the source on each shared file system (written through
    mount A, read through mount B) and on the local disk, run back to back, the order turning
    from run to run."""
    runs: list[dict[str, float]] = []
    with scratch_dir(options.work_dir, "shared-spark-") as work:
        pair = SparkPair(work, rows)

        def where_to(place: str, name: str) -> tuple[Path, Path]:
            if place == "local":
                return work / name, work / name
            return mounts[place].a / name, mounts[place].b / name

        places = ["local", *mounts]
        try:
            for place in places:  # warm-up, not timed: workers, plans, classes
                write, read = where_to(place, f"warm-{os.getpid()}")
                pair.sink(write)
                pair.source(read)
                shutil.rmtree(write, ignore_errors=True)
            for i in range(options.runs):
                got: dict[str, float] = {}
                for place in places[i % len(places) :] + places[: i % len(places)]:
                    write, read = where_to(place, f"spark-{os.getpid()}-{i}")
                    try:
                        seconds, n = pair.sink(write)
                        if n != rows:
                            raise RuntimeError(f"the sink stored {n} rows of {rows} ({place})")
                        got[f"sink_{place}"] = n / seconds
                        seconds, n = pair.source(read)
                        if n != rows:
                            raise RuntimeError(f"the source read {n} rows of {rows} ({place})")
                        got[f"source_{place}"] = n / seconds
                    finally:
                        shutil.rmtree(write, ignore_errors=True)
                log(f"shared: spark run {i + 1}/{options.runs} rows/s {got}")
                runs.append(got)
        finally:
            pair.close()
    return runs


HOLDER = """
import sys
from rocketstore.pipeline.engine.store import MessageStore
from bench.shared import CONFIG, _table
with MessageStore(sys.argv[1], CONFIG) as store:
    store.put_batch(_table(0, 10_000))
    store.flush()
    print("ready", flush=True)
    sys.stdin.read()  # holds the store until killed
"""


def take_over(a: Path, b: Path) -> float:
    """Seconds from a kill -9 of the writer holding a fresh store through ``a`` to the return
    of a writer's open of it through ``b`` (see figure 4)."""
    name = f"takeover-{os.getpid()}-{time.monotonic_ns()}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(a / name)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the writer through {a} did not start ({holder.wait()})")
        t0 = time.perf_counter()
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        while True:
            try:
                with MessageStore(b / name, CONFIG, background=False):
                    return time.perf_counter() - t0
            except StoreLockedError:
                if time.perf_counter() - t0 > 120:
                    raise RuntimeError(
                        f"the lock of {b / name} was not released in 120 s"
                    ) from None
                time.sleep(0.01)  # polling interval: each try asks for the lock itself
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
        shutil.rmtree(a / name, ignore_errors=True)


@contextlib.contextmanager
def shared_mounts(work: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
    """Two hosts' mounts (``.a``, ``.b``) of each shared file system that can be made here, by
    name; what cannot be made is said in ``notes``."""
    from tests.kit.ceph import cluster, unavailable
    from tests.kit.cephfs import hosts
    from tests.kit.gluster import GlusterUnavailable, volume

    with contextlib.ExitStack() as stack:
        mounts: dict[str, Any] = {}
        try:
            mounts["glusterfs"] = stack.enter_context(volume(work))
        except GlusterUnavailable as exc:
            notes.append(f"GlusterFS left out: {exc}")
        why = unavailable() or (None if Path("/dev/fuse").exists() else "no /dev/fuse")
        if why is None:
            ceph = stack.enter_context(cluster())
            if ceph.env.get("CEPHFS_MOUNT"):
                mounts["cephfs"] = stack.enter_context(hosts(ceph, work))
            else:
                notes.append("CephFS left out: the Ceph started without a file system")
        else:
            notes.append(f"CephFS left out: {why}")
        yield mounts


def run(options: Options) -> PartResult:
    sizes = QUICK if options.quick else FULL
    load_start = os.getloadavg()
    notes = work_dir_notes(options.work_dir, "shared")
    table = _table(0, sizes.put_messages)
    puts: list[dict[str, float]] = []
    vis: dict[str, dict[str, list[dict[str, Any]]]] = {}
    takeovers: dict[str, list[float]] = {}
    with shared_mounts(options.work_dir, notes) as mounts:
        if not mounts:
            return PartResult("shared", [], {"skipped": notes}, notes)
        places = ["local", *mounts]
        for i in range(options.runs):
            pair = {}
            for place in places[i % len(places) :] + places[: i % len(places)]:
                directory = options.work_dir if place == "local" else mounts[place].a
                pair[place] = put_and_flush(directory, table)
            puts.append(pair)
            log(f"shared: put+flush seconds {pair}")
        for fs, m in mounts.items():
            vis[fs] = {ASYNC_FLUSH: [], SYNC_FLUSH: []}
            for flush in (ASYNC_FLUSH, SYNC_FLUSH):
                for _ in range(options.runs):
                    r = ack_to_visible(m.a, m.b, sizes, flush)
                    vis[fs][flush].append(r)
                    log(f"shared: {fs} {flush} ack->visible {r}")
                    if r["hung"]:
                        remount(m, m.b)
            takeovers[fs] = [take_over(m.a, m.b) for _ in range(options.runs)]
            log(f"shared: {fs} take-over seconds {takeovers[fs]}")
        spark = spark_figures(mounts, options, sizes.spark_rows)
    load_end = os.getloadavg()
    n = sizes.put_messages
    loc = [n / p["local"] for p in puts]
    rows = [Row("put+flush, local disk", "msgs/s", median(loc), min(loc), max(loc))]
    for fs in mounts:
        g = [n / p[fs] for p in puts]
        rows.append(
            Row(f"put+flush, {NAMES[fs]} mount", "msgs/s", median(g), min(g), max(g),
                baseline="local disk", ratio=median([p["local"] / p[fs] for p in puts]))
        )  # fmt: skip
    for fs in mounts:
        for flush, runs in vis[fs].items():
            hung = sum(r["hung"] for r in runs)
            if hung:
                notes.append(
                    f"{NAMES[fs]} {flush}: {hung} of {len(runs)} runs hung (a read through mount "
                    "B never returned; the mount was aborted and made again; docs/cluster.md); "
                    "their delays are left out"
                )
            for q in ("p50", "p99"):
                values = [r[q] for r in runs if q in r and not r["hung"]]
                if values:
                    rows.append(
                        Row(f"put -> visible on mount B, {NAMES[fs]}, {flush}, {q}", "ms",
                            median(values), min(values), max(values))
                    )  # fmt: skip
        t = takeovers[fs]
        rows.append(Row(f"take-over after kill -9, {NAMES[fs]}", "s", median(t), min(t), max(t)))
    for face in ("sink", "source"):
        loc = [r[f"{face}_local"] for r in spark]
        rows.append(Row(f"Spark {face}, local disk", "rows/s", median(loc), min(loc), max(loc)))
        for fs in mounts:
            g = [r[f"{face}_{fs}"] for r in spark]
            ratios = [r[f"{face}_{fs}"] / r[f"{face}_local"] for r in spark]
            rows.append(
                Row(f"Spark {face}, {NAMES[fs]}", "rows/s", median(g), min(g), max(g),
                    baseline="local disk", ratio=median(ratios))
            )  # fmt: skip
    notes.append(f"load average before {load_start[0]:.2f}, after {load_end[0]:.2f}")
    data = {"sizes": dataclasses.asdict(sizes), "file_systems": list(mounts), "puts": puts,
            "visibility": vis, "takeover_s": takeovers, "spark": spark,
            "load_start": load_start, "load_end": load_end}  # fmt: skip
    return PartResult("shared", rows, data, notes)
