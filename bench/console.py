"""The ``console`` part: how fast ``rocketstore console`` serves its overview of a big root.

A root of 4 brokers holding 10 million messages (2.5 million each: 2 topics of 8 queues a
broker, 100-byte bodies, written with ``put_batch`` in the default geometry; ``--quick``: 100
thousand) is written into the scratch directory. ``rocketstore console ROOT --port 0`` runs as a
subprocess; each run asks for the overview page (``GET /``) on a fresh connection and times the
first byte of the page (its head, which the console sends before it reads the store) and the
whole page (``perf_counter`` from the request's send). The
same runs time ``rocketstore queues`` on each broker (one process per broker, one after the
other: what a person runs to see the same counts) as the baseline. The first request is a warm
up (the console's imports, matplotlib's font cache) and is not counted. The page of the first
topic (32 queues, 240 sampled messages each) is timed in the same runs, without a target.

Targets (issue 30): first byte under 1 s, full page under 2 s.
"""

from __future__ import annotations

import http.client
import os
import queue
import re
import signal
import subprocess
import sys
import threading
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
    scratch_dir,
    spread,
    work_dir_notes,
)

TARGET_FIRST_BYTE_S = 1.0
TARGET_PAGE_S = 2.0
BROKERS = 4
TOPICS = ("orders", "clicks")
QUEUES = 8
BATCH = 100_000
SCRIPT = "import sys; from rocketstore.pipeline.cli import main; sys.exit(main())"


def write_root(root: Path, per_broker: int) -> None:
    """``per_broker`` messages in each of :data:`BROKERS` brokers, spread over the topics and
    queues, with ``topics.json`` as the sink records it."""
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
    from rocketstore.pipeline.engine.store import MessageStore

    meta = StoreRoot(root)
    for topic in TOPICS:
        meta.ensure_topic(topic, TopicMeta(BROKERS, QUEUES))
    body = pa.array([b"b" * 100] * BATCH, pa.binary())
    queue_ids = pa.array(np.arange(BATCH, dtype=np.int32) % QUEUES)
    for b in range(BROKERS):
        with MessageStore(root / f"broker-{b}", StoreConfig(), background=False) as store:
            written = 0
            while written < per_broker:
                n = min(BATCH, per_broker - written)
                topic = TOPICS[(written // BATCH) % len(TOPICS)]
                store.put_batch(
                    pa.table(
                        {"topic": pa.array([topic] * n), "body": body[:n], "queueId": queue_ids[:n]}
                    )
                )
                written += n
        log(f"console: broker-{b}: {per_broker:,} messages written")


class Console:
    """``rocketstore console ROOT --port 0`` in a subprocess, until :meth:`stop`."""

    def __init__(self, root: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, "console", str(root), "--port", "0"],
            cwd=PROJECT_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line)

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 120
        seen = []
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            seen.append(line)
            m = re.search(r"at http://([0-9.]+):(\d+)/", line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                return
        self.proc.kill()
        raise RuntimeError(f"the console did not start: {''.join(seen)}")

    def get(self, path: str) -> tuple[float, float, int]:
        """Seconds to the page's first byte (of its body, not the headers) and to the whole
        page, and the page's size."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.connect()
            t0 = time.perf_counter()
            conn.request("GET", path)
            response = conn.getresponse()  # returns once the status line and headers are read
            head = response.read1(65536)  # the first bytes of the page itself
            first = time.perf_counter() - t0
            body = head + response.read()
            full = time.perf_counter() - t0
            if response.status != 200:
                raise RuntimeError(f"GET {path}: {response.status} {body[-300:]!r}")
            return first, full, len(body)
        finally:
            conn.close()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def queues_seconds(root: Path) -> float:
    """``rocketstore queues`` on every broker of ``root``, one after the other."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR)}
    t0 = time.perf_counter()
    for b in range(BROKERS):
        subprocess.run(
            [sys.executable, "-c", SCRIPT, "queues", str(root / f"broker-{b}")],
            cwd=PROJECT_DIR,
            env=env,
            stdout=subprocess.DEVNULL,
            check=True,
        )
    return time.perf_counter() - t0


def run(options: Options) -> PartResult:
    per_broker = 25_000 if options.quick else 2_500_000
    notes = work_dir_notes(options.work_dir, "console")
    with scratch_dir(options.work_dir, "console-") as work:
        root = work / "root"
        t0 = time.perf_counter()
        write_root(root, per_broker)
        write_s = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        console = Console(root)
        try:
            console.get("/")  # warm up: imports, font cache
            console.get(f"/topic/{TOPICS[0]}")
            samples: list[tuple[float, float, int]] = []
            topic_pages: list[tuple[float, float, int]] = []
            baseline: list[float] = []
            for i in range(options.runs):
                log(f"console: run {i + 1}/{options.runs}")
                samples.append(console.get("/"))
                topic_pages.append(console.get(f"/topic/{TOPICS[0]}"))
                baseline.append(queues_seconds(root))
        finally:
            console.stop()
    first = spread([s[0] for s in samples])
    full = spread([s[1] for s in samples])
    queues = spread(baseline)
    topic = spread([s[1] for s in topic_pages])
    data: dict[str, Any] = {
        "brokers": BROKERS,
        "messages": BROKERS * per_broker,
        "root_bytes": size,
        "write_seconds": write_s,
        "first_byte_seconds": first,
        "page_seconds": full,
        "page_bytes": samples[-1][2],
        "queues_seconds": queues,
        "topic_page_seconds": topic,
        "targets": {"first_byte_s": TARGET_FIRST_BYTE_S, "page_s": TARGET_PAGE_S},
    }
    base = f"rocketstore queues x{BROKERS} {queues['median'] * 1000:.0f} ms"
    label = f"{BROKERS} brokers, {BROKERS * per_broker:,} messages"

    def ms_row(name: str, spread: dict[str, float], target_s: float | None = None) -> Row:
        """A timing row in ms; with a target, beside ``rocketstore queues`` and checked."""
        checked: dict[str, Any] = {}
        if target_s is not None:
            checked = {
                "baseline": base,
                "ratio": spread["median"] / queues["median"] if queues["median"] else None,
                "target": f"< {target_s * 1000:.0f} ms",
                "met": spread["median"] < target_s,
            }
        ms = (spread["median"] * 1000, spread["min"] * 1000, spread["max"] * 1000)
        return Row(name, "ms", *ms, **checked)

    rows = [
        ms_row(f"overview first byte ({label})", first, TARGET_FIRST_BYTE_S),
        ms_row(f"overview full page ({samples[-1][2] // 1024} KiB)", full, TARGET_PAGE_S),
        ms_row(f"topic page, {TOPICS[0]} ({BROKERS * QUEUES} queues, sampled)", topic),
    ]
    notes.append(
        f"root of {size / 1e9:.2f} GB (apparent size: segments are preallocated) written in "
        f"{write_s:.0f} s; the overview sends its head (up to <main>) before it reads the "
        "store, so the first byte is the head and the full page the work"
    )
    return PartResult("console", rows, data, notes)
