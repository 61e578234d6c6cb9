"""The native core benchmark: what the per-message work in compiled code buys, beside baselines
measured in the same run.

1. **Single puts**: ``MessageStore.put`` of one 100-byte message per call (key, tag, ConsumeQueue
   and index), in msgs/s, beside one ``os.write`` per message of the same record bytes into a
   page-cache file: the cheapest way to hand one message to the kernel from Python.
2. **Clean open**: ``MessageStore(path)`` of a cleanly closed store holding many messages, beside
   the same open of a store of 10k messages: the open must not grow with the store.
3. **Rebuild**: the ConsumeQueues and the index deleted, the open that rebuilds them from the
   CommitLog, in records/s, beside reading the CommitLog's bytes with ``os.preadv``.

The method and the figures are in ``bench/README.md``.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import (
    MB,
    PROJECT_DIR,
    ROCKETMQ_KIT,
    Options,
    PartResult,
    Row,
    java_classes,
    log,
    pinned_to_one_cpu,
    scratch_dir,
    spread,
    work_dir_notes,
)
from bench.store import QUEUES, TAGS, TOPIC, make_table
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message

TARGET_SINGLE_MSGS_PER_S = 100_000
# Issue 43: single puts at >= 0.6x RocketMQ's own store's rate, <= 2x its CPU a message.
TARGET_ROCKETMQ_RATIO = 0.6
TARGET_ROCKETMQ_CPU = 2.0
TARGET_OPEN_MS = 50.0
TARGET_OPEN_RATIO = 1.2
TARGET_REBUILD_RECORDS_PER_S = 3_000_000
BUILD_CHUNK = 500_000
READ_CHUNK = 8 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Sizes:
    single_puts: int = 200_000
    big_store: int = 8_000_000
    small_store: int = 10_000


FULL = Sizes()
QUICK = Sizes(single_puts=5_000, big_store=100_000, small_store=2_000)


# Message i's body: bytes 97 + (i + k) % 26 for k < 100, so one of 26 (bench/java/StorePut.java
# makes the same).
BODIES = [bytes(97 + (i + k) % 26 for k in range(100)) for i in range(26)]
JAVA_PUT = PROJECT_DIR / "bench" / "java" / "StorePut.java"
# Puts before the timed ones, for the JIT (100,000, 300,000 and 1,000,000 gave the same rate
# here, within the run-to-run spread).
JAVA_WARMUP = 500_000
# RocketMQ's broker script runs its store with these (runbroker.sh: G1, a heap touched at
# start), the heap scaled from its 8 GiB to what the puts here need.
JAVA_PUT_FLAGS = "-server -Xms2g -Xmx2g -XX:+UseG1GC -XX:G1HeapRegionSize=16m -XX:+AlwaysPreTouch"


def single_message(i: int) -> Message:
    return Message(
        TOPIC,
        BODIES[i % len(BODIES)],
        queue_id=i % QUEUES,
        keys=[f"order-{i}"],
        tags=TAGS[i % len(TAGS)],
    )


def put_singles(path: Path, n: int) -> tuple[float, float, int]:
    """``n`` single puts into a fresh store at ``path``, each message built in the loop:
    (seconds, CPU seconds of the whole process, the last record's size)."""
    store = MessageStore(path, StoreConfig())
    try:
        store.put(single_message(n))  # creates the queue's file: not timed
        gc.collect()
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i in range(n):
            done = store.put(single_message(i))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        store.close()
    return seconds, cpu, done.store_size


def rocketmq_singles(path: Path, classes: Path, n: int) -> tuple[float, float, int]:
    """RocketMQ 4.9.4's DefaultMessageStore.putMessage, one message a call, in its own JVM
    (bench/java/StorePut.java: ``n`` puts after :data:`JAVA_WARMUP` for the JIT, dispatch
    included):
    (seconds, CPU seconds of the whole JVM, the record's size). The JVM may use every CPU
    (the broker's dispatch runs on a thread of its own), whatever this process is pinned to."""
    launch = (
        '. "$1/env.sh" && exec java $JOPTS_BASE ' + JAVA_PUT_FLAGS + " "
        "-Dlogback.configurationFile=$ROCKETMQ_HOME/conf/logback_quiet.xml "
        '-cp "$2:$CP" StorePut "$3" "$4" "$5" "$6"'
    )
    everything = set(range(os.cpu_count() or 1))
    done = subprocess.run(
        ["bash", "-c", launch, "-", str(ROCKETMQ_KIT), str(classes), str(path),
         str(max(n, JAVA_WARMUP)), str(n), str(QUEUES)],
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=lambda: os.sched_setaffinity(0, everything),
    )  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("PUT "):
            _, _, seconds, cpu, size = line.split()
            return float(seconds), float(cpu), int(size)
    raise RuntimeError(f"StorePut printed no result: {(done.stdout + done.stderr)[-2000:]}")


def measure_single(sizes: Sizes, options: Options) -> dict[str, Any]:
    """Runs of three, their order turning: ``n`` single puts into a fresh store, ``n``
    ``os.write`` calls of the record those puts wrote, and ``n`` puts into RocketMQ's own store
    (left out without the kit, see :data:`~bench.common.ROCKETMQ_KIT`)."""
    n = sizes.single_puts
    with scratch_dir(options.work_dir, "size-") as path, MessageStore(path, StoreConfig()) as s:
        record = b"x" * s.put(single_message(n // 2)).store_size
    with scratch_dir(options.work_dir, "java-") as work:
        classes, why = java_classes(work, JAVA_PUT)
        if why:
            log(f"core: {why}")
        order = ["store", "raw", *(["rocketmq"] if classes else [])]
        runs: list[dict[str, float]] = []
        for i in range(options.runs):
            got: dict[str, float] = {}
            for what in order[i % len(order) :] + order[: i % len(order)]:
                if what == "store":
                    with scratch_dir(options.work_dir, "single-") as path:
                        put_s, put_cpu, size = put_singles(path, n)
                    got |= {"put_msgs_per_s": n / put_s, "put_cpu_us": put_cpu / n * 1e6}
                    got["record_bytes"] = size
                elif what == "raw":
                    with scratch_dir(options.work_dir, "write-") as d:
                        fd = os.open(d / "raw", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                        try:
                            gc.collect()
                            t0 = time.perf_counter()
                            for _ in range(n):
                                os.write(fd, record)
                            write_s = time.perf_counter() - t0
                        finally:
                            os.close(fd)
                    got["write_msgs_per_s"] = n / write_s
                else:
                    assert classes is not None
                    with scratch_dir(options.work_dir, "rocketmq-") as path:
                        rmq_s, rmq_cpu, rmq_size = rocketmq_singles(path, classes, n)
                    got |= {"rocketmq_msgs_per_s": n / rmq_s, "rocketmq_cpu_us": rmq_cpu / n * 1e6}
                    got["rocketmq_record_bytes"] = rmq_size
            got["put_over_write"] = got["put_msgs_per_s"] / got["write_msgs_per_s"]
            if classes:
                got["put_over_rocketmq"] = got["put_msgs_per_s"] / got["rocketmq_msgs_per_s"]
            runs.append(got)
            log(
                f"core: single put run {i + 1}: {got['put_msgs_per_s']:,.0f} msgs/s "
                f"({got['put_cpu_us']:.1f} us CPU); os.write {got['write_msgs_per_s']:,.0f}/s"
                + (
                    f"; RocketMQ's store {got['rocketmq_msgs_per_s']:,.0f}/s "
                    f"({got['rocketmq_cpu_us']:.1f} us CPU)"
                    if classes
                    else ""
                )
            )
    return {
        "messages": n,
        "runs": runs,
        "rocketmq": why or "in the same run",
        **{k: spread([r[k] for r in runs]) for k in runs[0]},
    }


def build_store(path: Path, n: int, seed: int) -> int:
    """A store of ``n`` 100-byte messages with keys and tags, closed cleanly; its log size."""
    with MessageStore(path, StoreConfig()) as store:
        for start in range(0, n, BUILD_CHUNK):
            store.put_batch(make_table(min(BUILD_CHUNK, n - start), 100, seed + start, start))
        return store.max_phy_offset


def time_open(path: Path) -> tuple[float, MessageStore]:
    gc.collect()
    t0 = time.perf_counter()
    store = MessageStore(path, StoreConfig())
    return time.perf_counter() - t0, store


def read_log(path: Path, log_bytes: int) -> float:
    """Seconds to read the CommitLog's first ``log_bytes`` bytes (what it holds, not the
    segments' unwritten tails) with ``os.preadv`` in 8 MiB chunks."""
    buf = bytearray(READ_CHUNK)
    left = log_bytes
    t0 = time.perf_counter()
    for seg in sorted((path / "commitlog").iterdir()):
        fd = os.open(seg, os.O_RDONLY)
        try:
            off = 0
            while left > 0:
                got = os.preadv(fd, [buf], off)
                if got <= 0:
                    break
                off += got
                left -= got
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def measure_open_and_rebuild(sizes: Sizes, options: Options) -> dict[str, Any]:
    with (
        scratch_dir(options.work_dir, "big-") as big,
        scratch_dir(options.work_dir, "small-") as small,
    ):
        log(f"core: building stores of {sizes.big_store:,} and {sizes.small_store:,} messages")
        log_bytes = build_store(big, sizes.big_store, options.seed)
        build_store(small, sizes.small_store, options.seed + 1)
        opens: list[dict[str, float]] = []
        for i in range(options.runs):
            pair = {}
            for name, path in (
                (("big", big), ("small", small))
                if i % 2 == 0
                else (
                    ("small", small),
                    ("big", big),
                )
            ):
                seconds, store = time_open(path)
                store.close()
                pair[name] = seconds * 1000
            opens.append(
                {
                    "big_ms": pair["big"],
                    "small_ms": pair["small"],
                    "ratio": pair["big"] / pair["small"],
                }
            )
            log(f"core: clean open run {i + 1}: {pair['big']:.1f} ms vs {pair['small']:.1f} ms")
        rebuilds: list[dict[str, float]] = []
        for i in range(options.runs):
            shutil.rmtree(big / "consumequeue")
            shutil.rmtree(big / "index")
            read_s = read_log(big, log_bytes)
            seconds, store = time_open(big)
            try:
                done = store.recovery.records_redispatched
            finally:
                store.close()
            if done != sizes.big_store:
                raise RuntimeError(f"rebuild re-dispatched {done} of {sizes.big_store} records")
            rebuilds.append(
                {
                    "records_per_s": done / seconds,
                    "seconds": seconds,
                    "read_mb_per_s": log_bytes / read_s / MB,
                    "rebuild_over_read": read_s / seconds,
                }
            )
            log(f"core: rebuild run {i + 1}: {done / seconds:,.0f} records/s ({seconds:.2f} s)")
    return {
        "big_store": sizes.big_store,
        "small_store": sizes.small_store,
        "log_bytes": log_bytes,
        "opens": opens,
        "rebuilds": rebuilds,
        **{f"open_{k}": spread([r[k] for r in opens]) for k in opens[0]},
        **{f"rebuild_{k}": spread([r[k] for r in rebuilds]) for k in rebuilds[0]},
    }


def _rocketmq_rows(single: dict[str, Any]) -> list[Row]:
    """Ours against RocketMQ's own store in the same run (issue 43's target), when the kit is
    there."""
    if "put_over_rocketmq" not in single:
        return []
    ratio = single["put_over_rocketmq"]["median"]
    cpu, rmq_cpu = single["put_cpu_us"]["median"], single["rocketmq_cpu_us"]["median"]
    return [
        Row.of(
            f"single put, CPU a message ({single['record_bytes']['median']:.0f} B records)",
            "us",
            single["put_cpu_us"],
            baseline=f"RocketMQ 4.9.4's store {single['rocketmq_msgs_per_s']['median']:,.0f}/s, "
            f"{rmq_cpu:.1f} us CPU ({single['rocketmq_record_bytes']['median']:.0f} B records)",
            ratio=ratio,
            target=f">= {TARGET_ROCKETMQ_RATIO}x its msgs/s, <= {TARGET_ROCKETMQ_CPU}x its CPU",
            met=ratio >= TARGET_ROCKETMQ_RATIO and cpu <= TARGET_ROCKETMQ_CPU * rmq_cpu,
        )
    ]


def _rows(single: dict[str, Any], opened: dict[str, Any]) -> list[Row]:
    s = single["put_msgs_per_s"]
    big = opened["open_big_ms"]
    ratio = opened["open_ratio"]["median"]
    r = opened["rebuild_records_per_s"]
    return [
        Row(
            "single put, 100 B + key + tag",
            "msgs/s",
            s["median"],
            s["min"],
            s["max"],
            baseline=f"os.write per message {single['write_msgs_per_s']['median']:,.0f}/s",
            ratio=single["put_over_write"]["median"],
            target=f">= {TARGET_SINGLE_MSGS_PER_S:,} msgs/s",
            met=s["median"] >= TARGET_SINGLE_MSGS_PER_S,
        ),
        *_rocketmq_rows(single),
        Row(
            f"clean open, {opened['big_store']:,} messages",
            "ms",
            big["median"],
            big["min"],
            big["max"],
            baseline=f"{opened['small_store']:,} messages "
            f"{opened['open_small_ms']['median']:.1f} ms",
            ratio=ratio,
            target=f"< {TARGET_OPEN_MS:g} ms, ratio <= {TARGET_OPEN_RATIO}",
            met=big["median"] < TARGET_OPEN_MS and ratio <= TARGET_OPEN_RATIO,
        ),
        Row(
            f"rebuild ConsumeQueues + index ({opened['log_bytes'] / MB:,.0f} MB log)",
            "records/s",
            r["median"],
            r["min"],
            r["max"],
            baseline=f"preadv {opened['rebuild_read_mb_per_s']['median']:,.0f} MB/s",
            ratio=opened["rebuild_rebuild_over_read"]["median"],
            target=f">= {TARGET_REBUILD_RECORDS_PER_S:,} records/s",
            met=r["median"] >= TARGET_REBUILD_RECORDS_PER_S,
        ),
    ]


def run(options: Options) -> PartResult:
    sizes = QUICK if options.quick else FULL
    notes = work_dir_notes(options.work_dir, "core")
    with pinned_to_one_cpu(options.pin) as cpu:
        single = measure_single(sizes, options)
        opened = measure_open_and_rebuild(sizes, options)
    notes.append(f"pinned to CPU {cpu} (all threads)" if cpu is not None else "not pinned")
    data = {
        "sizes": dataclasses.asdict(sizes),
        "pinned_cpu": cpu,
        "targets": {
            "single_put_msgs_per_s": TARGET_SINGLE_MSGS_PER_S,
            "single_put_over_rocketmq": TARGET_ROCKETMQ_RATIO,
            "single_put_cpu_over_rocketmq": TARGET_ROCKETMQ_CPU,
            "open_ms": TARGET_OPEN_MS,
            "open_ratio": TARGET_OPEN_RATIO,
            "rebuild_records_per_s": TARGET_REBUILD_RECORDS_PER_S,
        },
        "single": single,
        "open": opened,
    }
    return PartResult("core", _rows(single, opened), data, notes)
