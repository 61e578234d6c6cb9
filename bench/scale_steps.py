"""The steps of the scale benchmark (:mod:`bench.scale`), each run in a fresh process.

``python -m bench.scale_steps STEP ARGS...`` prints one JSON object on its last line. Every
step starts cold, as a user's command does: nothing of the store is in this process before it.

* ``put DIR QUEUES TOTAL BATCH``: a fresh store; ``TOTAL`` messages of 100 bytes with a key each,
  in batches of ``BATCH``, over ``QUEUES / 4`` topics of 4 queues (message ``i`` goes to topic
  ``i % topics``, queue ``(i // topics) % 4``), then close. The tables are built before the clock
  starts. With ``--kill-after N`` the step prints ``batch`` after each put and the caller kills
  it (SIGKILL) after the ``N``-th: a crash during puts.
* ``open DIR [ro]``: ``MessageStore(DIR)`` (read-only with ``ro``), timed, then closed.
* ``floor-create DIR QUEUES``: what one file per queue costs at the least, in RocketMQ's layout:
  ``DIR/<topic>/<queueId>/`` made, a file created, sized to 6,000,000 bytes (``ftruncate``), its
  first 20-byte unit written (``pwrite``) and closed.
* ``floor-list DIR``: every ``consumequeue/<topic>/<queueId>`` directory of a store listed and
  every file in them stat-ed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.pipeline.engine.store import MessageStore

BODY = 100
QUEUES_PER_TOPIC = 4
CQ_FILE = 6_000_000  # RocketMQ's mappedFileSizeConsumeQueue
UNIT = b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x64" + bytes(8)  # offset 0, size 100


def topic_name(t: int) -> str:
    return f"T{t:05d}"


def make_batch(start: int, n: int, queues: int) -> pa.Table:
    """Messages ``start .. start + n`` spread over ``queues`` queues (see the module)."""
    topics = max(1, queues // QUEUES_PER_TOPIC)
    ids = np.arange(start, start + n, dtype=np.int64)
    rng = np.random.default_rng(start)
    body = rng.integers(97, 123, size=(n, BODY), dtype=np.uint8)
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(BODY)
    bodies = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(body)]
    )
    names = pa.array([topic_name(t) for t in range(topics)], pa.string())
    return pa.table(
        {
            "topic": pc.take(names, pa.array(ids % topics)),
            "body": bodies,
            "queueId": pa.array(((ids // topics) % QUEUES_PER_TOPIC).astype(np.int32)),
            "keys": pc.binary_join_element_wise("key-", pa.array(ids).cast(pa.string()), ""),
        }
    )


def put(path: Path, queues: int, total: int, batch: int, kill_after: int | None) -> dict[str, Any]:
    shutil.rmtree(path, ignore_errors=True)
    tables = [make_batch(b, min(batch, total - b), queues) for b in range(0, total, batch)]
    store = MessageStore(path)
    t0 = time.perf_counter()
    for n, table in enumerate(tables, 1):
        store.put_batch(table)
        if kill_after is not None:
            print("batch", n, flush=True)
    store.close()
    return {"put_close_s": time.perf_counter() - t0, "work": store.work.snapshot()}


def open_store(path: Path, read_only: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    store = MessageStore(path, read_only=read_only)
    opened = time.perf_counter() - t0
    work = store.work.snapshot()
    report = store.recovery.to_json()
    t1 = time.perf_counter()
    store.close()
    return {
        "open_s": opened,
        "close_s": time.perf_counter() - t1,
        "work": work,
        "recovery_ms": report["durationMs"],
        "records_redispatched": report["recordsRedispatched"],
        "abort_found": report["abortFileFound"],
    }


def floor_create(path: Path, queues: int) -> dict[str, Any]:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    topics = max(1, queues // QUEUES_PER_TOPIC)
    t0 = time.perf_counter()
    for t in range(topics):
        topic = path / topic_name(t)
        os.mkdir(topic)
        for q in range(QUEUES_PER_TOPIC):
            qdir = topic / str(q)
            os.mkdir(qdir)
            fd = os.open(qdir / "00000000000000000000", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            os.ftruncate(fd, CQ_FILE)
            os.pwrite(fd, UNIT, 0)
            os.close(fd)
    return {"seconds": time.perf_counter() - t0, "files": topics * QUEUES_PER_TOPIC}


def floor_list(path: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    files = 0
    with os.scandir(path / "consumequeue") as topics:
        for topic in topics:
            with os.scandir(topic.path) as qdirs:
                for qdir in qdirs:
                    with os.scandir(qdir.path) as entries:
                        for entry in entries:
                            entry.stat()
                            files += 1
    return {"seconds": time.perf_counter() - t0, "files": files}


def main(argv: Sequence[str]) -> int:
    step, *args = argv
    if step == "put":
        kill_after = None
        if "--kill-after" in args:
            at = args.index("--kill-after")
            kill_after = int(args[at + 1])
            del args[at : at + 2]
        out: dict[str, Any] = put(
            Path(args[0]), int(args[1]), int(args[2]), int(args[3]), kill_after
        )
    elif step == "open":
        out = open_store(Path(args[0]), read_only=args[1:] == ["ro"])
    elif step == "floor-create":
        out = floor_create(Path(args[0]), int(args[1]))
    elif step == "floor-list":
        out = floor_list(Path(args[0]))
    else:
        print(f"unknown step {step}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
