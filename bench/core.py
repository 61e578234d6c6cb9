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
import time
from pathlib import Path
from typing import Any

from bench.common import (
    MB,
    Options,
    PartResult,
    Row,
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


def single_messages(n: int) -> list[Message]:
    return [
        Message(
            TOPIC,
            bytes((97 + (i + k) % 26) for k in range(100)),
            queue_id=i % QUEUES,
            keys=[f"order-{i}"],
            tags=TAGS[i % len(TAGS)],
        )
        for i in range(n)
    ]


def measure_single(sizes: Sizes, options: Options) -> dict[str, Any]:
    """Paired runs: ``n`` single puts into a fresh store, and ``n`` ``os.write`` calls of the
    records those puts wrote, alternating which goes first."""
    messages = single_messages(sizes.single_puts)
    with scratch_dir(options.work_dir, "size-") as path, MessageStore(path, StoreConfig()) as s:
        record = b"x" * s.put(messages[len(messages) // 2]).store_size
    runs: list[dict[str, float]] = []
    for i in range(options.runs):
        put_s = write_s = 0.0
        for what in ("store", "raw") if i % 2 == 0 else ("raw", "store"):
            if what == "store":
                with scratch_dir(options.work_dir, "single-") as path:
                    store = MessageStore(path, StoreConfig())
                    try:
                        store.put(messages[0])  # creates the queue's file: not timed
                        gc.collect()
                        t0 = time.perf_counter()
                        for m in messages:
                            store.put(m)
                        put_s = time.perf_counter() - t0
                    finally:
                        store.close()
            else:
                with scratch_dir(options.work_dir, "write-") as d:
                    fd = os.open(d / "raw", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    try:
                        gc.collect()
                        t0 = time.perf_counter()
                        for _ in messages:
                            os.write(fd, record)
                        write_s = time.perf_counter() - t0
                    finally:
                        os.close(fd)
        n = len(messages)
        runs.append(
            {
                "put_msgs_per_s": n / put_s,
                "write_msgs_per_s": n / write_s,
                "put_over_write": write_s / put_s,
            }
        )
        log(f"core: single put run {i + 1}: {n / put_s:,.0f} msgs/s; os.write {n / write_s:,.0f}/s")
    return {
        "messages": len(messages),
        "runs": runs,
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
            "open_ms": TARGET_OPEN_MS,
            "open_ratio": TARGET_OPEN_RATIO,
            "rebuild_records_per_s": TARGET_REBUILD_RECORDS_PER_S,
        },
        "single": single,
        "open": opened,
    }
    return PartResult("core", _rows(single, opened), data, notes)
