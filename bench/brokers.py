"""The ``brokers`` part: a root of 64 broker directories against one of 8, in the same run.

A root's brokers are full stores; what should grow with their number is the work on the
brokers a micro-batch touched, not the planning around it. Measured, for roots of 8 and 64
brokers (a topic of 4 queues on each, 2,000 messages per broker; ``--quick``: 200):

* **planning** (in-process, no Spark): what the source's driver does at every trigger,
  ``latestOffset`` then ``partitions`` (:meth:`Planner.next_end`, :meth:`Planner.ranges`),
  with one planner kept across plans as Spark keeps it, when no broker, one broker or every
  broker had a writer append and close since the plan before (the writes are not timed).
  Reported per plan, with the brokers it read
  (:class:`~rocketstore.source.brokercache.PlanWork`). Every broker changed is the cost of
  reading them all, which is what every plan cost before brokers' bounds were kept.
* **sink** (``local[2]``): a ``foreachBatch`` micro-batch (:class:`CommitLogSink`, 6,400 rows
  of 100 B, ``--quick`` 640) whose rows route to 2 brokers, and one whose rows route to every
  broker; two untimed batches of each size first, then the sizes take turns in each run.
* **idle query**: a streaming query reading the root (``processingTime`` 500 ms, ``noop``
  sink) with nothing new to read: the CPU seconds per minute of this process and its
  descendants alive through the window (the JVM, the Python process that plans), measured
  once over 20 s (``--quick`` 5 s).
* **lag**: ``rocketstore lag ROOT --checkpoint`` of that query, a fresh process each run.

Targets: a plan at 64 brokers with one changed costs at most a quarter of one with all 64
changed (planning follows the brokers that changed), and a micro-batch at 64 brokers whose rows
route to 2 of them at most twice the same micro-batch at 8 brokers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import (
    PROJECT_DIR,
    Options,
    PartResult,
    Row,
    log,
    median,
    scratch_dir,
    spread,
    work_dir_notes,
)
from bench.session import local_session
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta, select_queues
from rocketstore.pipeline.engine.store import MessageStore

TOPIC = "BenchBrokers"
SIZES = (8, 64)
QUEUES = 4
CHANGED = ("none", "one", "all")
PLAN_TARGET = 0.25  # a plan with one broker changed, over one with all changed (64 brokers)
SINK_TARGET = 2.0  # a 2-broker micro-batch at 64 brokers, over the same at 8


def _table(first: int, n: int) -> pa.Table:
    ids = np.arange(first, first + n)
    return pa.table(
        {
            "topic": pa.array([TOPIC] * n, pa.string()),
            "body": pa.array([b"%08d" % i + b"x" * 92 for i in ids.tolist()], pa.binary()),
            "queueId": pa.array(ids % QUEUES, pa.int32()),
        }
    )


def _append(root: Path, brokers: range | list[int], first: int, n: int) -> None:
    """A writer opens each broker, appends ``n`` messages and closes it (as a sink task)."""
    for b in brokers:
        with MessageStore(root / f"broker-{b}", StoreConfig()) as store:
            store.put_batch(_table(first, n))


def build_root(root: Path, brokers: int, per_broker: int) -> None:
    StoreRoot(root).ensure_topic(TOPIC, TopicMeta(brokers, QUEUES))
    _append(root, range(brokers), 0, per_broker)


def planning(root: Path, brokers: int, plans: int) -> dict[str, Any]:
    """Seconds per plan and brokers read per plan, for each of :data:`CHANGED`."""
    from rocketstore.source import options
    from rocketstore.source.planning import Limit, Planner

    planner = Planner(options.parse({"path": str(root), "topic": TOPIC}, streaming=True))
    start = planner.initial_offsets()
    out: dict[str, Any] = {}
    first = 1 << 30
    for changed in CHANGED:
        which = {"none": [], "one": [brokers // 2], "all": list(range(brokers))}[changed]
        seconds: list[float] = []
        read = planner.work.read
        for _ in range(plans):
            _append(root, which, first, 8)
            first += 8
            t0 = time.perf_counter()
            end = planner.next_end(start, Limit(all_available=True))
            planner.ranges(start, end)
            seconds.append(time.perf_counter() - t0)
            start = end
        out[changed] = {
            "seconds": seconds,
            "brokers_read_per_plan": (planner.work.read - read) / plans,
        }
    return out


def _keys_for(brokers: int, wanted: set[int], n: int) -> list[str]:
    candidates = [f"customer-{i}" for i in range(200 * n)]
    mq = select_queues(pa.array(candidates), np.arange(len(candidates)), brokers * QUEUES)
    chosen = [k for k, b in zip(candidates, (mq // QUEUES).tolist(), strict=True) if b in wanted]
    return chosen[:n]


def sink_batches(spark: Any, work: Path, rows: int, runs: int) -> dict[int, dict[str, list[float]]]:
    """Per root size, wall seconds of a foreachBatch micro-batch whose rows route to 2 brokers
    and of one whose rows route to every broker; the sizes take turns within each run."""
    from rocketstore.sink import CommitLogSink

    sinks: dict[int, Any] = {}
    frames: dict[int, dict[str, Any]] = {}
    for brokers in SIZES:
        sinks[brokers] = CommitLogSink(
            str(work / f"sink-{brokers}"),
            topic=TOPIC,
            brokers=brokers,
            queues=QUEUES,
            sharding_key="keys",
            sink_id="bench",
        )
        frames[brokers] = {}
        for name, wanted in (("two", {0, brokers // 2}), ("all", set(range(brokers)))):
            keys = _keys_for(brokers, wanted, rows)
            df = spark.createDataFrame([(k, b"x" * 100) for k in keys], "keys string, body binary")
            frames[brokers][name] = df.repartition(2).cache()
            frames[brokers][name].count()
    batch = 0
    # Warm-up, not timed: the Python workers, the JIT, every broker's first files.
    for _ in range(2):
        for brokers in SIZES:
            sinks[brokers](frames[brokers]["all"], batch)
            batch += 1
    out: dict[int, dict[str, list[float]]] = {b: {"two": [], "all": []} for b in SIZES}
    for i in range(runs):
        order = SIZES[i % len(SIZES) :] + SIZES[: i % len(SIZES)]
        for brokers in order:
            for name, df in frames[brokers].items():
                t0 = time.perf_counter()
                sinks[brokers](df, batch)
                out[brokers][name].append(time.perf_counter() - t0)
                batch += 1
    return out


def idle_query(spark: Any, root: Path, checkpoint: Path, seconds: float) -> float:
    """CPU seconds per minute of this process tree while a streaming query of ``root`` has
    nothing new to read (the query is stopped afterwards; its checkpoint stays)."""
    query = (
        spark.readStream.format("rocketstore")
        .option("path", str(root))
        .option("topic", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p["numInputRows"] for p in query.recentProgress):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the query of {root} read nothing in 120 s")
            time.sleep(0.2)  # polling the query's progress
        # A batch is in recentProgress once it has committed: from here the query is idle.
        before, t0 = _tree_ticks(), time.perf_counter()
        time.sleep(seconds)  # the window measured
        after, elapsed = _tree_ticks(), time.perf_counter() - t0
        # Processes alive at both ends (this one, the JVM, the source's Python process): a
        # Python worker that ends meanwhile takes its ticks with it, which a sum over the tree
        # would count as negative time.
        ticks = sum(after[pid] - before[pid] for pid in after.keys() & before.keys())
        return ticks / os.sysconf("SC_CLK_TCK") / elapsed * 60
    finally:
        query.stop()


def _tree_ticks() -> dict[int, int]:
    """User and system ticks of this process and each of its descendants, by pid."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        parent[int(name)] = int(fields[1])
        ticks[int(name)] = int(fields[11]) + int(fields[12])
    children: dict[int, list[int]] = {}
    for child, ppid in parent.items():
        children.setdefault(ppid, []).append(child)
    mine, stack = {}, [os.getpid()]
    while stack:
        pid = stack.pop()
        mine[pid] = ticks.get(pid, 0)
        stack.extend(children.get(pid, ()))
    return mine


def lag_seconds(root: Path, checkpoint: Path, runs: int) -> list[float]:
    argv = [
        sys.executable,
        "-c",
        "import sys; from rocketstore.pipeline.cli import main; sys.exit(main())",
        "lag",
        str(root),
        "--checkpoint",
        str(checkpoint),
    ]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR)}
    out = []
    for _ in range(runs + 1):  # the first warms the page and bytecode caches
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out[1:]


def run(options: Options) -> PartResult:
    per_broker = 200 if options.quick else 2_000
    plans = 5 if options.quick else 20
    rows = 640 if options.quick else 6_400
    idle_s = 5.0 if options.quick else 20.0
    notes = work_dir_notes(options.work_dir, "brokers")
    data: dict[str, Any] = {"per_broker": per_broker, "plans_per_run": plans, "sink_rows": rows}
    spark, owned = local_session("rocketstore-bench-brokers")
    try:
        with scratch_dir(options.work_dir, "brokers-") as work:
            for brokers in SIZES:
                root = work / f"root-{brokers}"
                build_root(root, brokers, per_broker)
                runs = [planning(root, brokers, plans) for _ in range(options.runs)]
                log(f"brokers: planning at {brokers} brokers done")
                data[str(brokers)] = {
                    "plan_s": {c: spread([median(r[c]["seconds"]) for r in runs]) for c in CHANGED},
                    "brokers_read_per_plan": {
                        c: median([r[c]["brokers_read_per_plan"] for r in runs]) for c in CHANGED
                    },
                    "plan_runs": runs,
                }
            sink = sink_batches(spark, work, rows, options.runs)
            log("brokers: sink done")
            for brokers in SIZES:
                root, checkpoint = work / f"root-{brokers}", work / f"ck-{brokers}"
                idle = idle_query(spark, root, checkpoint, idle_s)
                lag = lag_seconds(root, checkpoint, options.runs)
                log(f"brokers: idle query and lag at {brokers} brokers done")
                data[str(brokers)].update(
                    {
                        "sink_s": {name: spread(v) for name, v in sink[brokers].items()},
                        "sink_runs": sink[brokers],
                        "idle_cpu_s_per_min": idle,
                        "lag_s": spread(lag),
                    }
                )
    finally:
        if owned:
            spark.stop()
    return PartResult("brokers", _rows(data), data, notes)


def _rows(data: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    small, big = data[str(SIZES[0])], data[str(SIZES[-1])]
    for brokers in SIZES:
        d = data[str(brokers)]
        for changed in CHANGED:
            s = d["plan_s"][changed]
            label = {"none": "no broker", "one": "1 broker", "all": f"all {brokers}"}[changed]
            read = d["brokers_read_per_plan"][changed]
            checked = brokers == SIZES[-1] and changed == "one"
            ratio = s["median"] / d["plan_s"]["all"]["median"]
            out.append(
                Row(
                    f"plan, {brokers} brokers, {label} changed ({read:g} read)",
                    "ms",
                    s["median"] * 1000,
                    s["min"] * 1000,
                    s["max"] * 1000,
                    baseline=f"all {brokers} changed" if changed != "all" else "",
                    ratio=ratio if changed != "all" else None,
                    target=f"<= {PLAN_TARGET:g} x" if checked else "",
                    met=(ratio <= PLAN_TARGET) if checked else None,
                )
            )
    for name, label in (("two", "rows to 2 brokers"), ("all", "rows to every broker")):
        s = big["sink_s"][name]
        base = small["sink_s"][name]["median"]
        ratio = s["median"] / base
        target = name == "two"
        out.append(
            Row(
                f"foreachBatch micro-batch, {SIZES[-1]} brokers, {label}",
                "s",
                s["median"],
                s["min"],
                s["max"],
                baseline=f"{SIZES[0]} brokers",
                ratio=ratio,
                target=f"<= {SINK_TARGET:g} x" if target else "",
                met=(ratio <= SINK_TARGET) if target else None,
            )
        )
    idle = big["idle_cpu_s_per_min"]
    out.append(
        Row(
            f"idle streaming query, {SIZES[-1]} brokers",
            "CPU s / min",
            idle,
            baseline=f"{SIZES[0]} brokers {small['idle_cpu_s_per_min']:.1f}",
            ratio=idle / small["idle_cpu_s_per_min"],
        )
    )
    lag = big["lag_s"]
    out.append(
        Row(
            f"rocketstore lag --checkpoint, {SIZES[-1]} brokers",
            "s",
            lag["median"],
            lag["min"],
            lag["max"],
            baseline=f"{SIZES[0]} brokers",
            ratio=lag["median"] / small["lag_s"]["median"],
        )
    )
    return out
