"""Two writers of one store on shared storage, for the fencing tests: writer A in the test's
process puts bodies ``A-<i>`` and loses its lock the way a shared file system's servers drop
it (:func:`lose_lock`); writer B (:class:`Taker`) takes the store over from another process,
as from another host, and puts bodies ``B-<i>``. :func:`bodies` reads back what is stored,
:func:`expected` what should be."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files import lock as lock_module
from rocketstore.pipeline.format.message import Message
from tests.kit import ROOT

SEGMENT = 64 * 1024
CONFIG = StoreConfig(
    mapped_file_size_commitlog=SEGMENT,
    mapped_file_size_consume_queue=20 * 1024,
    max_hash_slot_num=64,
    max_index_num=4096,
    shared_storage="shared",
)
TOPIC = "Fenced"
QUEUES = 2

# The new writer: takes the store over, puts bodies "B-<i>", prints each acknowledged offset,
# then waits for a line before closing (holding the lock meanwhile).
TAKER = textwrap.dedent(
    f"""
    import sys
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.format.message import Message
    from rocketstore.pipeline.engine.store import MessageStore

    cfg = StoreConfig(mapped_file_size_commitlog={SEGMENT}, mapped_file_size_consume_queue=20480,
                      max_hash_slot_num=64, max_index_num=4096, shared_storage="shared")
    store = MessageStore(sys.argv[1], cfg)
    for i in range(int(sys.argv[2])):
        body = f"B-{{i}}".encode()
        r = store.put(Message("{TOPIC}", body, queue_id=i % {QUEUES}, keys=[f"b{{i}}"]))
        print(r.commit_log_offset, flush=True)
    print("ready", flush=True)
    sys.stdin.readline()
    store.close()
    """
)


class Taker:
    """The writer on the other host."""

    def __init__(self, path: Path, messages: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", TAKER, str(path), str(messages)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        assert self.proc.stdout is not None
        self.offsets: list[int] = []
        for line in self.proc.stdout:
            if line.strip() == "ready":
                break
            self.offsets.append(int(line))
        else:
            raise AssertionError(f"taker failed: {self.proc.communicate()[1]}")

    def close(self) -> None:
        _, err = self.proc.communicate("\n", timeout=60)
        assert self.proc.returncode == 0, err


def lose_lock(store: MessageStore) -> None:
    """Drop the store's lock on its own descriptor, as a file system's servers do."""
    held = store._lock
    assert held is not None and held._fd is not None
    if held.kind == "ofd":
        assert lock_module._OFD_SETLK is not None
        fcntl.fcntl(held._fd, lock_module._OFD_SETLK, lock_module._flock(fcntl.F_UNLCK))
    else:
        fcntl.lockf(held._fd, fcntl.LOCK_UN, 1, 0)


def abandon(store: MessageStore) -> None:
    """Leave a store the way a writer that dies does: no flush, no close, the lock let go."""
    for task in (store._cleaner, store._flusher):
        if task is not None:
            task.stop()
    assert store._lock is not None
    store._lock.release()
    store._closed = True


def put_a(store: MessageStore, lo: int, hi: int) -> dict[int, bytes]:
    """Bodies "A-<i>" put by the first writer; what it acknowledged, by offset."""
    acked = {}
    for i in range(lo, hi):
        body = f"A-{i}".encode()
        r = store.put(Message(TOPIC, body, queue_id=i % QUEUES, keys=[f"a{i}"]))
        acked[r.commit_log_offset] = body
    return acked


def bodies(path: Path, config: StoreConfig = CONFIG) -> list[bytes]:
    """Every message of every queue, through the ConsumeQueues, in queue order."""
    with MessageStore(path, config, read_only=True) as store:
        out = []
        for q in range(QUEUES):
            offset = store.min_offset(TOPIC, q)
            while offset < store.max_offset(TOPIC, q):
                got = store.get_messages(TOPIC, q, offset, 64)
                out += [m.body for m in got.messages]
                offset = got.next_begin_offset
        return out


def expected(a_count: int, b_count: int) -> list[bytes]:
    by_queue: list[list[bytes]] = [[] for _ in range(QUEUES)]
    for i in range(a_count):
        by_queue[i % QUEUES].append(f"A-{i}".encode())
    for i in range(b_count):
        by_queue[i % QUEUES].append(f"B-{i}".encode())
    return [b for q in by_queue for b in q]
