"""The recovery benchmark: opening a store after kill -9 and after a clean close, and what
SYNC_FLUSH costs a put.

Two groups of figures, each beside a baseline measured in the same run:

1. **Recovery time.** A writer process fills a store (default configuration: 1 GiB CommitLog
   segments, ``ASYNC_FLUSH``) to about 2 GiB with batch puts of 1 KiB bodies and is killed with
   SIGKILL while it is putting. A fresh process then times ``MessageStore(path)``: the abnormal
   recovery (``abort`` is present). It closes the store, and another fresh process times the
   open again: the normal recovery after a clean close. Baseline: reading the last 64 MiB of
   the CommitLog with ``os.preadv``. Each later run starts a writer on the same store, lets it put
   for a random 0.6-1.1 s (so the kill falls anywhere in the background flusher's 500 ms cycle)
   and kills it again.
2. **Put throughput under SYNC_FLUSH** with batches of 1, 100 and 10 000 messages of 100-byte
   bodies, in msgs/s, beside the same puts under ASYNC_FLUSH and beside a raw baseline: per
   batch, ``write`` of the bytes the batch encoded to and ``fdatasync``.

The method and the figures are in ``bench/README.md``.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing as mp
import os
import random
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.common import (
    MB,
    Options,
    PartResult,
    Row,
    log,
    median,
    scratch_dir,
    spread,
    work_dir_notes,
)
from bench.store import make_table
from rocketstore.pipeline.config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig
from rocketstore.pipeline.engine.store import MessageStore

GiB = 1024**3
MiB = 1024**2
TOPIC = "RecoveryBench"
QUEUES = 8
READ_CHUNK = 8 * MiB
CHILD_TIMEOUT_S = 600.0

TARGET_RECOVERY_S = 3.0


@dataclasses.dataclass(frozen=True)
class Sizes:
    fill_bytes: int = 2 * GiB  # CommitLog bytes the first writer puts before it may be killed
    fill_batch: int = 8192  # messages per put while filling
    fill_body: int = 1024
    kill_after_s: tuple[float, float] = (0.6, 1.1)  # of putting, drawn per run
    tail_bytes: int = 64 * MiB  # baseline: the last this many bytes of the CommitLog
    put_body: int = 100
    # (messages per batch, messages per timed run)
    put_runs: tuple[tuple[int, int], ...] = ((1, 2000), (100, 50_000), (10_000, 500_000))


FULL = Sizes()
QUICK = Sizes(
    fill_bytes=24 * MiB,
    fill_batch=1024,
    kill_after_s=(0.1, 0.3),
    tail_bytes=8 * MiB,
    put_runs=((1, 100), (100, 2000), (10_000, 20_000)),
)


# -- child processes -------------------------------------------------------------------------------


def _fill_table(bodies: pa.Array, first_key: int) -> pa.Table:
    """One put of the writer: the prepared bodies, keys ``order-<first_key + i>``."""
    n = len(bodies)
    ids = np.arange(first_key, first_key + n, dtype=np.int64)
    return pa.table(
        {
            "topic": pa.repeat(pa.scalar(TOPIC, pa.string()), n),
            "body": bodies,
            "queueId": pa.array((ids % QUEUES).astype(np.int32)),
            "keys": pc.binary_join_element_wise("order-", pa.array(ids).cast(pa.string()), ""),
        }
    )


def _writer_child(
    conn: Connection, path: str, batch: int, body: int, first_key: int, seed: int
) -> None:
    """Open the store and put batches until killed, reporting each put that returned."""
    try:
        rng = np.random.default_rng(seed)
        raw = rng.integers(97, 123, size=batch * body, dtype=np.uint8)
        offsets = np.arange(batch + 1, dtype=np.int32) * np.int32(body)
        bodies = pa.Array.from_buffers(
            pa.binary(), batch, [None, pa.py_buffer(offsets), pa.py_buffer(raw)]
        )
        store = MessageStore(path, StoreConfig())  # ASYNC_FLUSH, 1 GiB segments
        conn.send(("opened", store.max_phy_offset))
        key = first_key
        while True:
            table = _fill_table(bodies, key)
            t0 = time.perf_counter()
            result = store.put_batch(table)
            elapsed = time.perf_counter() - t0
            key += batch
            end = int(result.commit_log_offsets[-1]) + int(result.sizes[-1])
            conn.send(("put", end, elapsed, key))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


def _open_child(conn: Connection, path: str) -> None:
    """Time ``MessageStore(path)`` in a fresh process, then close it (timed apart)."""
    try:
        gc.collect()
        t0 = time.perf_counter()
        store = MessageStore(path, StoreConfig())
        open_s = time.perf_counter() - t0
        report = store.recovery.to_json()
        end = store.max_phy_offset
        t1 = time.perf_counter()
        store.close()
        conn.send(
            (
                "done",
                {
                    "open_s": open_s,
                    "close_s": time.perf_counter() - t1,
                    "commitlog_end": end,
                    "recovery": report,
                },
            )
        )
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        conn.close()


def _recv(
    conn: Connection, proc: Any, what: str, timeout: float = CHILD_TIMEOUT_S
) -> tuple[Any, ...]:
    deadline = time.monotonic() + timeout
    while not conn.poll(0.2):
        if not proc.is_alive():
            raise RuntimeError(f"recovery benchmark process died before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"recovery benchmark process: no {what} within {timeout:.0f} s")
    msg: tuple[Any, ...] = conn.recv()
    if msg[0] == "error":
        raise RuntimeError(f"recovery benchmark process failed: {msg[1]}")
    return msg


# -- 1: recovery time --------------------------------------------------------------------------


@dataclasses.dataclass
class Crash:
    """What a killed writer got acknowledged."""

    opened_end: int
    acked_end: int  # end of the last put that returned before the kill
    puts: int
    put_s_median: float
    next_key: int
    kill_after_s: float


def write_then_kill(
    path: Path, sizes: Sizes, fill_to: int, first_key: int, kill_after_s: float, seed: int
) -> Crash:
    """A writer that puts (past ``fill_to`` first) for ``kill_after_s`` s, killed mid-put."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_writer_child,
        args=(child, str(path), sizes.fill_batch, sizes.fill_body, first_key, seed),
    )
    proc.start()
    child.close()
    try:
        _, opened_end = _recv(parent, proc, "the open")
        acked_end, key, puts, times = opened_end, first_key, 0, []
        deadline: float | None = None  # set once the store holds fill_to bytes
        next_report = fill_to // 8
        while True:
            if deadline is None:
                if not parent.poll(CHILD_TIMEOUT_S):
                    raise RuntimeError("recovery benchmark writer stopped putting")
            elif not parent.poll(max(0.0, deadline - time.monotonic())):
                break  # time to kill
            try:
                msg = parent.recv()
            except EOFError:
                raise RuntimeError("recovery benchmark writer died") from None
            if msg[0] == "error":
                raise RuntimeError(f"recovery benchmark writer failed: {msg[1]}")
            _, acked_end, elapsed, key = msg
            puts += 1
            times.append(elapsed)
            if deadline is None and acked_end >= fill_to:
                deadline = time.monotonic() + kill_after_s
            elif deadline is None and acked_end >= next_report:
                log(f"recovery: filling: {acked_end / GiB:.2f} GiB of {fill_to / GiB:.2f}")
                next_report += fill_to // 8
        proc.kill()  # SIGKILL, inside a put: the writer puts back to back
        proc.join()
        # Puts that returned just before the kill, still in the pipe, were acknowledged too.
        while parent.poll(0):
            try:
                msg = parent.recv()
            except EOFError:
                break
            if msg[0] == "put":
                _, acked_end, elapsed, key = msg
                puts += 1
                times.append(elapsed)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    return Crash(opened_end, acked_end, puts, median(times), key, kill_after_s)


def timed_open(path: Path) -> dict[str, Any]:
    """``MessageStore(path)`` timed in a fresh process (spawned, so nothing is inherited)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_open_child, args=(child, str(path)))
    proc.start()
    child.close()
    try:
        _, report = _recv(parent, proc, "the timed open")
        proc.join(timeout=CHILD_TIMEOUT_S)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    result: dict[str, Any] = report
    return result


def commitlog_files(path: Path) -> list[Path]:
    return sorted(p for p in (path / "commitlog").iterdir() if p.name.isdigit())


def tail_read_s(path: Path, end: int, nbytes: int) -> float:
    """Seconds to read the ``nbytes`` of the CommitLog before ``end`` with ``os.preadv``."""
    files = commitlog_files(path)
    segment = os.stat(files[0]).st_size
    start = max(int(files[0].name), end - nbytes)
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    gc.collect()
    t0 = time.perf_counter()
    pos = start
    while pos < end:
        base = pos - pos % segment
        fd = os.open(path / "commitlog" / f"{base:020d}", os.O_RDONLY)
        try:
            stop = min(end, base + segment)
            while pos < stop:
                n = os.preadv(fd, [view[: min(READ_CHUNK, stop - pos)]], pos - base)
                if n <= 0:
                    raise RuntimeError(f"short read at CommitLog offset {pos}")
                pos += n
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def measure_recovery(sizes: Sizes, options: Options) -> dict[str, Any]:
    rng = random.Random(options.seed)
    runs: list[dict[str, Any]] = []
    with scratch_dir(options.work_dir, "recovery-") as path:
        key = 0
        for r in range(options.runs):
            kill_after = rng.uniform(*sizes.kill_after_s)
            if r == 0:
                log(f"recovery: building a {sizes.fill_bytes / GiB:.2f} GiB store (ASYNC_FLUSH)")
            t0 = time.perf_counter()
            crash = write_then_kill(
                path,
                sizes,
                sizes.fill_bytes if r == 0 else 0,
                key,
                kill_after,
                options.seed + r,
            )
            write_s = time.perf_counter() - t0
            key = crash.next_key
            abnormal = timed_open(path)
            if abnormal["recovery"].get("abortFileFound") is not True:
                raise RuntimeError(f"no abnormal recovery after the kill: {abnormal['recovery']}")
            if abnormal["commitlog_end"] < crash.acked_end:
                raise RuntimeError(
                    f"recovery lost acknowledged data: end {abnormal['commitlog_end']} < "
                    f"{crash.acked_end}"
                )
            clean = timed_open(path)
            if clean["recovery"].get("abortFileFound") is not False:
                raise RuntimeError(f"the clean reopen found an abort file: {clean['recovery']}")
            if clean["commitlog_end"] != abnormal["commitlog_end"]:
                raise RuntimeError(
                    f"clean reopen moved the end: {abnormal['commitlog_end']} -> "
                    f"{clean['commitlog_end']}"
                )
            end = int(clean["commitlog_end"])
            tail = tail_read_s(path, end, sizes.tail_bytes)
            rec = abnormal["recovery"]
            scanned = int(rec.get("commitLogEnd", end)) - int(rec.get("scanStart", end))
            runs.append(
                {
                    "commitlog_bytes": end,
                    "writer_s": write_s,
                    "writer_puts": crash.puts,
                    "put_s_median": crash.put_s_median,
                    "kill_after_s": crash.kill_after_s,
                    "acked_end": crash.acked_end,
                    "abnormal_open_s": abnormal["open_s"],
                    "abnormal_close_s": abnormal["close_s"],
                    "abnormal_report": rec,
                    "abnormal_scanned_bytes": scanned,
                    "clean_open_s": clean["open_s"],
                    "clean_close_s": clean["close_s"],
                    "clean_report": clean["recovery"],
                    "tail_read_s": tail,
                    "abnormal_over_tail": abnormal["open_s"] / tail,
                    "clean_over_tail": clean["open_s"] / tail,
                }
            )
            log(
                f"recovery: run {r + 1}/{options.runs}: {end / GiB:.2f} GiB CommitLog; "
                f"after kill -9 {abnormal['open_s']:.3f} s (re-scanned {scanned / MB:,.1f} MB, "
                f"{rec.get('recordsRedispatched', '?')} records re-dispatched); clean "
                f"{clean['open_s']:.3f} s; pread of the last {sizes.tail_bytes // MiB} MiB "
                f"{tail:.3f} s"
            )
    keys = ("abnormal_open_s", "clean_open_s", "tail_read_s", "abnormal_over_tail")
    return {
        "fill_bytes": sizes.fill_bytes,
        "fill_batch": sizes.fill_batch,
        "fill_body": sizes.fill_body,
        "tail_bytes": sizes.tail_bytes,
        "runs": runs,
        **{k: spread([run[k] for run in runs]) for k in (*keys, "clean_over_tail")},
        "abnormal_scanned_bytes": spread([run["abnormal_scanned_bytes"] for run in runs]),
        "commitlog_bytes": spread([run["commitlog_bytes"] for run in runs]),
    }


# -- 2: put throughput under SYNC_FLUSH ------------------------------------------------------------


def timed_puts(work_dir: Path, mode: str, tables: list[pa.Table]) -> tuple[float, list[int]]:
    """Wall seconds of putting ``tables`` one by one into a fresh store, and each batch's
    encoded bytes. Opening and closing are not timed."""
    with scratch_dir(work_dir, f"put-{mode.lower()}-") as path:
        store = MessageStore(path, StoreConfig(flush_disk_type=mode))
        try:
            sizes: list[int] = []
            gc.collect()
            t0 = time.perf_counter()
            for table in tables:
                sizes.append(store.put_batch(table).total_bytes)
            elapsed = time.perf_counter() - t0
        finally:
            store.close()
    return elapsed, sizes


def raw_sync_writes(work_dir: Path, batch_bytes: list[int]) -> float:
    """Seconds to append each batch's bytes to a fresh file with ``write`` + ``fdatasync``."""
    view = memoryview(b"\x5a" * max(batch_bytes))
    with scratch_dir(work_dir, "raw-sync-") as d:
        gc.collect()
        t0 = time.perf_counter()
        fd = os.open(d / "raw", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for n in batch_bytes:
                done = 0
                while done < n:
                    done += os.write(fd, view[done:n])
                os.fdatasync(fd)
            elapsed = time.perf_counter() - t0
        finally:
            os.close(fd)
    return elapsed


def measure_puts(sizes: Sizes, options: Options) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for batch, count in sizes.put_runs:
        table = make_table(count, sizes.put_body, options.seed + batch)
        tables = [table.slice(i, batch) for i in range(0, count, batch)]
        log(f"recovery: puts of {batch:,}: warm-up ({count:,} messages, ASYNC_FLUSH)")
        _, batch_bytes = timed_puts(options.work_dir, ASYNC_FLUSH, tables)
        runs: list[dict[str, float]] = []
        for i in range(options.runs):
            order = ("sync", "async", "raw") if i % 2 == 0 else ("raw", "async", "sync")
            got: dict[str, float] = {}
            for what in order:
                if what == "raw":
                    got["raw_s"] = raw_sync_writes(options.work_dir, batch_bytes)
                else:
                    mode = SYNC_FLUSH if what == "sync" else ASYNC_FLUSH
                    elapsed, encoded = timed_puts(options.work_dir, mode, tables)
                    if encoded != batch_bytes:
                        raise RuntimeError(f"batch sizes moved between runs ({mode})")
                    got[f"{what}_s"] = elapsed
            run = {
                **got,
                "sync_msgs_per_s": count / got["sync_s"],
                "async_msgs_per_s": count / got["async_s"],
                "raw_msgs_per_s": count / got["raw_s"],
            }
            run["sync_over_raw"] = run["sync_msgs_per_s"] / run["raw_msgs_per_s"]
            run["async_over_raw"] = run["async_msgs_per_s"] / run["raw_msgs_per_s"]
            run["sync_over_async"] = run["sync_msgs_per_s"] / run["async_msgs_per_s"]
            runs.append(run)
            log(
                f"recovery: puts of {batch:,}: run {i + 1}/{options.runs}: SYNC "
                f"{run['sync_msgs_per_s']:,.0f} msgs/s, ASYNC {run['async_msgs_per_s']:,.0f}, "
                f"raw write+fdatasync {run['raw_msgs_per_s']:,.0f}"
            )
        keys = (
            "sync_msgs_per_s",
            "async_msgs_per_s",
            "raw_msgs_per_s",
            "sync_over_raw",
            "async_over_raw",
            "sync_over_async",
        )
        out.append(
            {
                "batch": batch,
                "messages": count,
                "body_bytes": sizes.put_body,
                "encoded_bytes": sum(batch_bytes),
                "runs": runs,
                **{k: spread([run[k] for run in runs]) for k in keys},
            }
        )
    return out


# -- the part ----------------------------------------------------------------------------------


def _rows(recovery: dict[str, Any], puts: list[dict[str, Any]]) -> list[Row]:
    rows: list[Row] = []
    size = recovery["commitlog_bytes"]
    gib = f"{size['min'] / GiB:.1f}-{size['max'] / GiB:.1f} GiB"
    tail_mib = recovery["tail_bytes"] // MiB
    tail = recovery["tail_read_s"]["median"]
    for key, label in (
        ("abnormal_open_s", f"open after kill -9 (abnormal recovery), {gib} CommitLog"),
        ("clean_open_s", f"open after clean close (normal recovery), {gib}"),
    ):
        v = recovery[key]
        rows.append(
            Row(
                label,
                "s",
                v["median"],
                v["min"],
                v["max"],
                baseline=f"pread last {tail_mib} MiB {tail:.3g} s",
                ratio=recovery[key.replace("_open_s", "_over_tail")]["median"],
                target=f"< {TARGET_RECOVERY_S:g} s",
                met=v["median"] < TARGET_RECOVERY_S,
            )
        )
    for p in puts:
        raw = p["raw_msgs_per_s"]["median"]
        for mode in ("sync", "async"):
            v = p[f"{mode}_msgs_per_s"]
            rows.append(
                Row(
                    f"put batch of {p['batch']:,} x {p['body_bytes']} B, "
                    f"{'SYNC' if mode == 'sync' else 'ASYNC'}_FLUSH",
                    "msgs/s",
                    v["median"],
                    v["min"],
                    v["max"],
                    baseline=f"raw write+fdatasync {raw:,.0f} msgs/s",
                    ratio=p[f"{mode}_over_raw"]["median"],
                )
            )
    return rows


def run(options: Options) -> PartResult:
    sizes = QUICK if options.quick else FULL
    notes = work_dir_notes(options.work_dir, "recovery")
    recovery = measure_recovery(sizes, options)
    puts = measure_puts(sizes, options)
    scanned = recovery["abnormal_scanned_bytes"]
    notes.append(
        f"after kill -9, recovery re-scanned {scanned['median'] / MB:,.1f} MB of CommitLog "
        f"(median; {scanned['min'] / MB:,.1f} .. {scanned['max'] / MB:,.1f}); opens timed in "
        "fresh processes, page cache warm (a process crash, not a power cut)"
    )
    notes.append(
        "puts: SYNC/ASYNC "
        + ", ".join(f"{p['sync_over_async']['median']:.2f} (batch {p['batch']:,})" for p in puts)
        + "; not pinned; ratio = store msgs/s over the raw write+fdatasync baseline"
    )
    data = {
        "sizes": dataclasses.asdict(sizes),
        "targets": {"recovery_s": TARGET_RECOVERY_S},
        "recovery": recovery,
        "puts": puts,
    }
    return PartResult("recovery", _rows(recovery, puts), data, notes)
