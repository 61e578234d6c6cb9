"""The store benchmark: batch put throughput, query-by-key latency and batch put memory.

Five figures, each beside a baseline measured in the same process in the same run:

1. batch put of small messages (100-byte bodies, one key, one tag) in msgs/s, beside a raw
   mmap write of the same number of bytes;
2. batch put of 4 KiB bodies in MB/s, beside the same raw mmap write;
3. ``query_by_key`` latency percentiles on a store holding millions of index entries;
4. peak anonymous memory growth of a batch put, relative to the bytes the batch encoded to;
5. batch put throughput with the batch spread over 1,000 queues, beside the same batch over 4:
   the first batch into a fresh store (every queue's file created and its blocks reserved),
   and the next one (the queues exist; past the descriptor budget their mappings are evicted
   and mapped again).

The method and the figures are in ``bench/README.md``.
"""

from __future__ import annotations

import dataclasses
import gc
import mmap
import multiprocessing as mp
import os
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from bench.common import (
    MB,
    Options,
    PartResult,
    Row,
    log,
    median,
    percentiles,
    pinned_to_one_cpu,
    scratch_dir,
    spread,
    work_dir_notes,
)
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore

TOPIC = "BenchTopic"
TAGS = ("TagA", "TagB", "TagC")
QUEUES = 8
RAW_CHUNK = 64 * 1024 * 1024
SAMPLE_INTERVAL_S = 0.002

TARGET_SMALL_MSGS_PER_S = 1_500_000
TARGET_LARGE_RATIO = 0.7
TARGET_QUERY_P50_MS = 1.0
TARGET_MEMORY_RATIO = 1.0


@dataclasses.dataclass(frozen=True)
class Sizes:
    small_count: int = 1_000_000
    small_body: int = 100
    large_count: int = 100_000
    large_body: int = 4096
    query_messages: int = 2_500_000  # a key and a UNIQ_KEY each: twice as many index entries
    query_chunk: int = 250_000
    queries: int = 2000
    memory_count: int = 1_000_000
    spread_count: int = 200_000


FULL = Sizes()
QUICK = Sizes(
    small_count=20_000,
    large_count=2_000,
    query_messages=20_000,
    query_chunk=10_000,
    queries=200,
    memory_count=20_000,
    spread_count=20_000,
)
WIDE_QUEUES = 1000
NARROW_QUEUES = 4


# -- input -------------------------------------------------------------------------------------


def make_table(
    n: int, body_size: int, seed: int, first_key: int = 0, queues: int = QUEUES
) -> pa.Table:
    """``n`` messages of ``TOPIC``: random lowercase bodies, key ``order-<i>``, one of 3 tags,
    queue ``i % queues``. Built from numpy buffers, so it costs about a second per million."""
    if n * body_size > 2**31 - 1:
        raise ValueError(f"{n} bodies of {body_size} bytes exceed a binary array's 2 GiB")
    rng = np.random.default_rng(seed)
    body = rng.integers(97, 123, size=(n, body_size), dtype=np.uint8)
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(body_size)
    bodies = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(body)]
    )
    ids = np.arange(first_key, first_key + n, dtype=np.int64)
    keys = pc.binary_join_element_wise("order-", pa.array(ids).cast(pa.string()), "")
    tags = pc.take(pa.array(TAGS, pa.string()), pa.array((ids % len(TAGS)).astype(np.int32)))
    return pa.table(
        {
            "topic": pa.repeat(pa.scalar(TOPIC, pa.string()), n),
            "body": bodies,
            "queueId": pa.array((ids % queues).astype(np.int32)),
            "keys": keys,
            "tags": tags,
        }
    )


# -- timed operations --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PutTiming:
    wall_s: float
    cpu_s: float
    encoded_bytes: int


def timed_put(work_dir: Path, table: pa.Table) -> PutTiming:
    """One batch put into a fresh store (default config); only ``put_batch`` is timed."""
    with scratch_dir(work_dir, "store-") as path:
        store = MessageStore(path, StoreConfig())
        try:
            gc.collect()
            c0 = time.process_time()
            t0 = time.perf_counter()
            result = store.put_batch(table)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0
            if len(result) != table.num_rows:
                raise RuntimeError(f"put {len(result)} of {table.num_rows} messages")
            return PutTiming(wall, cpu, result.total_bytes)
        finally:
            store.close()


def raw_mmap_write(work_dir: Path, source: npt.NDArray[np.uint8]) -> float:
    """Seconds to create a file of ``len(source)`` bytes, map it and copy ``source`` in.

    First-touch writes into a fresh sparse file in 64 MiB chunks, like a store's new segment;
    nothing is flushed (an ASYNC_FLUSH put flushes nothing either). Unmapping is not timed.
    """
    size = len(source)
    src = source.data  # a memoryview of the buffer
    with scratch_dir(work_dir, "raw-") as d:
        gc.collect()
        t0 = time.perf_counter()
        fd = os.open(d / "raw", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size, access=mmap.ACCESS_WRITE) as mm, memoryview(mm) as view:
                for off in range(0, size, RAW_CHUNK):
                    view[off : off + RAW_CHUNK] = src[off : off + RAW_CHUNK]
                elapsed = time.perf_counter() - t0
        finally:
            os.close(fd)
    return elapsed


# -- 1 and 2: put throughput beside raw mmap ---------------------------------------------------


def measure_put(label: str, table: pa.Table, body_size: int, options: Options) -> dict[str, Any]:
    """``options.runs`` paired runs of a batch put and a raw mmap write of the same bytes.

    An untimed warm-up put comes first (it also tells the encoded size). Within a run the
    two are timed back to back, alternating which goes first.
    """
    n = table.num_rows
    log(f"store: {label}: warm-up put of {n:,} messages")
    encoded = timed_put(options.work_dir, table).encoded_bytes
    source = np.full(encoded, 0x5A, dtype=np.uint8)  # written, so its pages are resident
    runs: list[dict[str, float]] = []
    for i in range(options.runs):
        raw_s = 0.0
        put: PutTiming | None = None
        for what in ("raw", "store") if i % 2 == 0 else ("store", "raw"):
            if what == "raw":
                raw_s = raw_mmap_write(options.work_dir, source)
            else:
                put = timed_put(options.work_dir, table)
        assert put is not None
        if put.encoded_bytes != encoded:
            raise RuntimeError(f"encoded size moved between runs: {put.encoded_bytes} != {encoded}")
        runs.append(
            {
                "store_s": put.wall_s,
                "store_cpu_s": put.cpu_s,
                "raw_s": raw_s,
                "store_msgs_per_s": n / put.wall_s,
                "store_msgs_per_cpu_s": n / put.cpu_s,
                "store_mb_per_s": encoded / put.wall_s / MB,
                "raw_mb_per_s": encoded / raw_s / MB,
                "store_over_raw": raw_s / put.wall_s,
            }
        )
        log(
            f"store: {label}: run {i + 1}/{options.runs}: {n / put.wall_s:,.0f} msgs/s, "
            f"{encoded / put.wall_s / MB:,.1f} MB/s; raw mmap {encoded / raw_s / MB:,.1f} MB/s"
        )
    del source
    keys = (
        "store_msgs_per_s",
        "store_msgs_per_cpu_s",
        "store_mb_per_s",
        "raw_mb_per_s",
        "store_over_raw",
        "store_s",
    )
    return {
        "messages": n,
        "body_bytes": body_size,
        "input_table_bytes": table.nbytes,
        "encoded_bytes": encoded,
        "runs": runs,
        **{k: spread([r[k] for r in runs]) for k in keys},
        "cpu_over_wall": median([r["store_cpu_s"] / r["store_s"] for r in runs]),
    }


# -- 5: a batch over 1,000 queues beside one over 4 -------------------------------------------


def two_puts(work_dir: Path, table: pa.Table) -> tuple[float, float]:
    """Seconds of a first and a second batch put of ``table`` into one fresh store."""
    with scratch_dir(work_dir, "store-") as path, MessageStore(path, StoreConfig()) as store:
        took = []
        for _ in range(2):
            gc.collect()
            t0 = time.perf_counter()
            store.put_batch(table)
            took.append(time.perf_counter() - t0)
    return took[0], took[1]


def measure_spread(sizes: Sizes, options: Options) -> dict[str, Any]:
    """``options.runs`` paired runs of :func:`two_puts` of the same messages, spread over
    ``WIDE_QUEUES`` queues and over ``NARROW_QUEUES``, alternating which goes first."""
    n = sizes.spread_count
    tables = {
        q: make_table(n, 100, options.seed + 5, queues=q) for q in (WIDE_QUEUES, NARROW_QUEUES)
    }
    runs: list[dict[str, float]] = []
    for i in range(options.runs):
        order = (WIDE_QUEUES, NARROW_QUEUES) if i % 2 == 0 else (NARROW_QUEUES, WIDE_QUEUES)
        got = {q: two_puts(options.work_dir, tables[q]) for q in order}
        run: dict[str, float] = {}
        for k, which in enumerate(("first", "next")):
            wide, narrow = got[WIDE_QUEUES][k], got[NARROW_QUEUES][k]
            run[f"{which}_wide_msgs_per_s"] = n / wide
            run[f"{which}_narrow_msgs_per_s"] = n / narrow
            run[f"{which}_wide_over_narrow"] = narrow / wide
        runs.append(run)
        log(
            f"store: spread: run {i + 1}/{options.runs}: over {WIDE_QUEUES} queues "
            f"{run['first_wide_msgs_per_s']:,.0f} then {run['next_wide_msgs_per_s']:,.0f} "
            f"msgs/s, over {NARROW_QUEUES} {run['first_narrow_msgs_per_s']:,.0f} then "
            f"{run['next_narrow_msgs_per_s']:,.0f} msgs/s"
        )
    return {"messages": n, "runs": runs, **{k: spread([r[k] for r in runs]) for k in runs[0]}}


# -- 3: query-by-key latency -------------------------------------------------------------------


def measure_query(sizes: Sizes, options: Options) -> dict[str, Any]:
    """Build one store of ``sizes.query_messages`` messages with batch puts, then time
    ``sizes.queries`` random existing-key lookups per run (after an untimed warm-up)."""
    n = sizes.query_messages
    rng = np.random.default_rng(options.seed + 3)
    with scratch_dir(options.work_dir, "query-") as path:
        store = MessageStore(path, StoreConfig())
        try:
            log(f"store: query: building a store of {n:,} messages")
            offsets = np.empty(n, dtype=np.int64)  # CommitLog offset of message i
            t0 = time.perf_counter()
            for start in range(0, n, sizes.query_chunk):
                count = min(sizes.query_chunk, n - start)
                put = store.put_batch(make_table(count, 100, options.seed + start, first_key=start))
                offsets[start : start + count] = put.commit_log_offsets
            build_s = time.perf_counter() - t0
            assert store.index is not None
            entries = sum(f.entry_count for f in store.index.files)
            index_files = len(store.index.files)

            def query(i: int) -> tuple[float, bool]:
                key = f"order-{i}"
                t = time.perf_counter_ns()
                found = store.query_by_key(TOPIC, key)
                elapsed_ms = (time.perf_counter_ns() - t) / 1e6
                return elapsed_ms, len(found) == 1 and key in found[0].keys

            def get(i: int) -> float:
                t = time.perf_counter_ns()
                store.get_message(int(offsets[i]))
                return (time.perf_counter_ns() - t) / 1e6

            for i in rng.integers(0, n, size=min(200, sizes.queries)).tolist():
                get(i)
                query(i)
            runs: list[dict[str, float]] = []
            for r in range(options.runs):
                ids = rng.integers(0, n, size=sizes.queries).tolist()
                gc.collect()
                baseline = [get(i) for i in ids]
                latencies: list[float] = []
                wrong = 0
                for i in ids:
                    ms, ok = query(i)
                    latencies.append(ms)
                    wrong += not ok
                if wrong:
                    raise RuntimeError(f"{wrong} of {sizes.queries} queries missed their message")
                stats = percentiles(latencies, (50, 90, 99))
                stats["max"] = max(latencies)
                stats["mean"] = float(np.mean(latencies))
                stats["get_p50"] = percentiles(baseline, (50,))["p50"]
                stats["p50_over_get_p50"] = stats["p50"] / stats["get_p50"]
                runs.append(stats)
                log(
                    f"store: query: run {r + 1}/{options.runs}: p50 {stats['p50']:.3f} ms, "
                    f"p90 {stats['p90']:.3f} ms, p99 {stats['p99']:.3f} ms; "
                    f"get_message p50 {stats['get_p50']:.3f} ms"
                )
        finally:
            store.close()
    return {
        "messages": n,
        "index_entries": entries,
        "index_files": index_files,
        "build_s": build_s,
        "build_msgs_per_s": n / build_s,
        "queries_per_run": sizes.queries,
        "runs": runs,
        **{f"{k}_ms": spread([r[k] for r in runs]) for k in ("p50", "p90", "p99", "max")},
        "get_message_p50_ms": spread([r["get_p50"] for r in runs]),
        "p50_over_get_p50": spread([r["p50_over_get_p50"] for r in runs]),
    }


# -- 4: peak memory of a put -------------------------------------------------------------------

_STATUS_FIELDS = ("RssAnon", "RssFile", "RssShmem")


def read_status(pid: int | str = "self") -> dict[str, int]:
    """RssAnon, RssFile and RssShmem of a process from ``/proc/<pid>/status``, in bytes."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            name, _, rest = line.partition(b":")
            key = name.decode()
            if key in _STATUS_FIELDS:
                out[key] = int(rest.split()[0]) * 1024
    return out


def _memory_child(conn: Connection, n: int, body: int, seed: int, work_dir: str) -> None:
    """Runs in a fresh process: build the input, wait for the sampler, put, report."""
    try:
        table = make_table(n, body, seed)
        pool = pa.default_memory_pool()
        with scratch_dir(Path(work_dir), "memory-") as path:
            store = MessageStore(path, StoreConfig())
            try:
                gc.collect()
                arrow_before = pool.bytes_allocated()
                arrow_max_before = pool.max_memory()
                conn.send(("ready", None))
                conn.recv()  # the parent has its baseline and is sampling
                t0 = time.perf_counter()
                result = store.put_batch(table)
                wall = time.perf_counter() - t0
                report = {
                    "put_s": wall,
                    "encoded_bytes": result.total_bytes,
                    "input_table_bytes": table.nbytes,
                    "arrow_bytes_before": arrow_before,
                    "arrow_max_before": arrow_max_before,
                    "arrow_max_after": pool.max_memory(),
                }
                conn.send(("done", report))
            finally:
                store.close()
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        conn.close()


def _recv(conn: Connection, proc: Any, what: str) -> tuple[str, Any]:
    while not conn.poll(0.5):
        if not proc.is_alive():
            raise RuntimeError(f"memory benchmark process died before {what}")
    kind, payload = conn.recv()
    if kind == "error":
        raise RuntimeError(f"memory benchmark process failed: {payload}")
    return str(kind), payload


def memory_run(n: int, body: int, seed: int, work_dir: Path) -> dict[str, Any]:
    """One batch put in a fresh process, its /proc status sampled from this one."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_memory_child, args=(child, n, body, seed, str(work_dir)))
    proc.start()
    child.close()
    try:
        _recv(parent, proc, "the put")
        pid = proc.pid
        assert pid is not None
        before = read_status(pid)
        peak = dict(before)
        samples = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal samples
            while not stop.is_set():
                try:
                    now = read_status(pid)
                except OSError:
                    return
                for k, v in now.items():
                    peak[k] = max(peak[k], v)
                samples += 1
                time.sleep(SAMPLE_INTERVAL_S)

        sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
        sampler.start()
        parent.send("go")
        try:
            _, report = _recv(parent, proc, "the end of the put")
        finally:
            stop.set()
            sampler.join()
        proc.join(timeout=120)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    encoded = int(report["encoded_bytes"])
    exact = report["arrow_max_after"] > report["arrow_max_before"]
    arrow_growth = report["arrow_max_after"] - report["arrow_bytes_before"] if exact else None
    return {
        **report,
        "rss_before": before,
        "rss_peak": peak,
        "samples": samples,
        "rss_anon_growth": peak["RssAnon"] - before["RssAnon"],
        "rss_file_growth": peak["RssFile"] - before["RssFile"],
        "rss_anon_growth_over_encoded": (peak["RssAnon"] - before["RssAnon"]) / encoded,
        "arrow_pool_growth": arrow_growth,
        "arrow_pool_growth_over_encoded": None if arrow_growth is None else arrow_growth / encoded,
    }


def measure_memory(sizes: Sizes, options: Options) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for i in range(options.runs):
        run = memory_run(sizes.memory_count, 100, options.seed, options.work_dir)
        runs.append(run)
        log(
            f"store: memory: run {i + 1}/{options.runs}: peak RssAnon +"
            f"{run['rss_anon_growth'] / MB:,.1f} MB = "
            f"{run['rss_anon_growth_over_encoded']:.2f} x encoded "
            f"({run['samples']} samples)"
        )
    out: dict[str, Any] = {
        "messages": sizes.memory_count,
        "encoded_bytes": runs[0]["encoded_bytes"],
        "input_table_bytes": runs[0]["input_table_bytes"],
        "sample_interval_s": SAMPLE_INTERVAL_S,
        "runs": runs,
    }
    for key in ("rss_anon_growth", "rss_anon_growth_over_encoded", "rss_file_growth"):
        out[key] = spread([r[key] for r in runs])
    arrow = [r["arrow_pool_growth"] for r in runs if r["arrow_pool_growth"] is not None]
    if arrow:
        out["arrow_pool_growth"] = spread(arrow)
        out["arrow_pool_growth_over_encoded"] = spread(
            [r["arrow_pool_growth_over_encoded"] for r in runs if r["arrow_pool_growth"]]
        )
    return out


# -- the part ----------------------------------------------------------------------------------


def _count(n: int) -> str:
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1_000_000:g}M"
    if n >= 1000 and n % 100 == 0:
        return f"{n / 1000:g}k"
    return str(n)


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def _rows(
    sizes: Sizes,
    small: dict[str, Any],
    large: dict[str, Any],
    query: dict[str, Any],
    memory: dict[str, Any],
    wide: dict[str, Any],
) -> list[Row]:
    return [
        *_put_rows(sizes, small, large),
        *_query_rows(query),
        _memory_row(sizes, memory),
        *_spread_rows(wide),
        *_arrow_rows(sizes, memory),
    ]


def _spread_row(
    name: str, unit: str, v: dict[str, float], scale: float | None = None, **kw: Any
) -> Row:
    """A row of a spread's median, min and max (divided by ``scale`` when given)."""
    if scale is None:
        return Row(name, unit, v["median"], v["min"], v["max"], **kw)
    return Row(name, unit, v["median"] / scale, v["min"] / scale, v["max"] / scale, **kw)


def _put_rows(sizes: Sizes, small: dict[str, Any], large: dict[str, Any]) -> list[Row]:
    """The small puts' throughput (against its target) and per CPU-second; both sizes'
    bandwidth against the raw mmap write (the large one against its target)."""
    s_label = f"put {_count(sizes.small_count)} x {_size(sizes.small_body)}"
    msgs = small["store_msgs_per_s"]
    rows = [
        _spread_row(
            f"{s_label}: throughput",
            "msgs/s",
            msgs,
            target=f">= {TARGET_SMALL_MSGS_PER_S:,} msgs/s",
            met=msgs["median"] >= TARGET_SMALL_MSGS_PER_S,
        ),
        _spread_row(f"{s_label}: per CPU-second", "msgs/CPU-s", small["store_msgs_per_cpu_s"]),
    ]
    for label, m, target in (
        (s_label, small, None),
        (f"put {_count(sizes.large_count)} x {_size(sizes.large_body)}", large, TARGET_LARGE_RATIO),
    ):
        rows.append(
            _spread_row(
                f"{label}: bandwidth ({m['encoded_bytes'] / MB:,.0f} MB)",
                "MB/s",
                m["store_mb_per_s"],
                baseline=f"raw mmap {m['raw_mb_per_s']['median']:,.0f} MB/s",
                ratio=m["store_over_raw"]["median"],
                target="" if target is None else f"ratio >= {target}",
                met=None if target is None else m["store_over_raw"]["median"] >= target,
            )
        )
    return rows


def _query_rows(query: dict[str, Any]) -> list[Row]:
    """``query_by_key``'s percentiles; p50 against ``get_message``'s and its target."""
    q_label = f"query_by_key ({_count(query['index_entries'])} index entries)"
    get_p50 = query["get_message_p50_ms"]["median"]
    rows = []
    for p in ("p50", "p90", "p99"):
        v = query[f"{p}_ms"]
        rows.append(
            _spread_row(
                f"{q_label}: {p}",
                "ms",
                v,
                baseline=f"get_message p50 {get_p50:.3g} ms" if p == "p50" else "",
                ratio=query["p50_over_get_p50"]["median"] if p == "p50" else None,
                target=f"< {TARGET_QUERY_P50_MS:g} ms" if p == "p50" else "",
                met=v["median"] < TARGET_QUERY_P50_MS if p == "p50" else None,
            )
        )
    return rows


def _memory_label(sizes: Sizes) -> str:
    return f"put {_count(sizes.memory_count)} x 100 B"


def _memory_row(sizes: Sizes, memory: dict[str, Any]) -> Row:
    """The put's peak RssAnon growth against the bytes it encoded, and its target."""
    ratio = memory["rss_anon_growth_over_encoded"]["median"]
    return _spread_row(
        f"{_memory_label(sizes)}: peak RssAnon growth",
        "MB",
        memory["rss_anon_growth"],
        MB,
        baseline=f"encoded {memory['encoded_bytes'] / MB:,.0f} MB",
        ratio=ratio,
        target=f"ratio <= {TARGET_MEMORY_RATIO:g}",
        met=ratio <= TARGET_MEMORY_RATIO,
    )


def _spread_rows(wide: dict[str, Any]) -> list[Row]:
    """The first and the next batch over :data:`WIDE_QUEUES` queues against
    :data:`NARROW_QUEUES`."""
    rows = []
    for which, what in (("first", "first batch"), ("next", "next batch")):
        narrow = wide[f"{which}_narrow_msgs_per_s"]["median"]
        rows.append(
            _spread_row(
                f"put {_count(wide['messages'])} x 100 B over {WIDE_QUEUES:,} queues: {what}",
                "msgs/s",
                wide[f"{which}_wide_msgs_per_s"],
                baseline=f"over {NARROW_QUEUES} queues {narrow:,.0f} msgs/s",
                ratio=wide[f"{which}_wide_over_narrow"]["median"],
            )
        )
    return rows


def _arrow_rows(sizes: Sizes, memory: dict[str, Any]) -> list[Row]:
    """The Arrow pool's peak growth, when the runs measured it."""
    if "arrow_pool_growth" not in memory:
        return []
    return [
        _spread_row(
            f"{_memory_label(sizes)}: peak Arrow pool growth",
            "MB",
            memory["arrow_pool_growth"],
            MB,
            baseline=f"encoded {memory['encoded_bytes'] / MB:,.0f} MB",
            ratio=memory["arrow_pool_growth_over_encoded"]["median"],
        )
    ]


def run(options: Options) -> PartResult:
    sizes = QUICK if options.quick else FULL
    notes = work_dir_notes(options.work_dir, "store")

    with pinned_to_one_cpu(options.pin) as cpu:
        log(f"store: pinned to CPU {cpu}" if cpu is not None else "store: not pinned")
        table = make_table(sizes.small_count, sizes.small_body, options.seed)
        small = measure_put("small", table, sizes.small_body, options)
        del table
        table = make_table(sizes.large_count, sizes.large_body, options.seed + 1)
        large = measure_put("large", table, sizes.large_body, options)
        del table
        wide = measure_spread(sizes, options)
    query = measure_query(sizes, options)
    memory = measure_memory(sizes, options)

    notes.append(
        f"puts pinned to CPU {cpu} (all threads)" if cpu is not None else "puts not pinned"
    )
    notes.append(
        f"throughput: cpu/wall of the put {small['cpu_over_wall']:.2f} (small), "
        f"{large['cpu_over_wall']:.2f} (large); query store built at "
        f"{query['build_msgs_per_s']:,.0f} msgs/s"
    )
    notes.append(
        "memory: peak growth sampled every ~2 ms from /proc/<pid>/status of a fresh process; "
        f"peak RssFile growth (mapped store files) {memory['rss_file_growth']['median'] / MB:,.0f}"
        " MB, not counted"
    )
    data = {
        "sizes": dataclasses.asdict(sizes),
        "pinned_cpu": cpu,
        "targets": {
            "small_put_msgs_per_s": TARGET_SMALL_MSGS_PER_S,
            "large_put_over_raw": TARGET_LARGE_RATIO,
            "query_p50_ms": TARGET_QUERY_P50_MS,
            "memory_over_encoded": TARGET_MEMORY_RATIO,
        },
        "put_small": small,
        "put_large": large,
        "query": query,
        "memory": memory,
        "spread": wide,
    }
    return PartResult("store", _rows(sizes, small, large, query, memory, wide), data, notes)
