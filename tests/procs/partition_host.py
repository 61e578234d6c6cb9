"""A writer or reader that a partition test runs on one of its hosts (tests/test_partition.py).

``python -m tests.procs.partition_host write STORE NAME FLUSH``: opens STORE for writing, retrying
while another writer holds it (as a writer taking a broker over does), prints ``open <seconds
waited> <derived files given a new inode> <pid>`` (rocketstore.pipeline.engine.renewal), then takes
commands from standard input, one a line:

* ``put N``: N messages with bodies ``NAME-<seq>`` (keys the same, queue ``seq % 4``), in
  batch puts of up to 10; prints ``ack <seq> <offset>`` for each message of a put that
  returned, or ``fail <seq> <error class>: <message>`` for the first put that raised (``seq``
  its first message), then ``done``.
* ``stream``: puts as ``put`` does until one fails or a ``stop`` line comes; then ``done``,
  and then waits for ``stop`` if it has not come.
* ``write-back``: what this host's kernel does with dirty pages after a heal, made to happen
  now: the newest ConsumeQueue file of each queue and the newest IndexFile, as this writer
  has them mapped, are dirtied with the bytes it sees and written back (``msync``); prints
  ``written-back`` and, for each file, ``ok`` or the errno's name.
* ``pause-at STEP``: the next put stops itself (SIGSTOP) at its write step STEP (a failpoint of
  rocketstore.pipeline.files.failpoints), after its fence check, until the test sends SIGCONT: a
  writer paused between its check and its write; prints ``armed``.
* ``flush``: flushes the store; prints ``flushed`` or ``fail-flush <error class>: <message>``.
* ``close``: closes the store; prints ``closed`` or ``fail-close <error class>: <message>``.

``python -m tests.procs.partition_host config FILE`` writes those settings as a store.toml for the
command line. ``python -m tests.procs.partition_host read STORE``: opens STORE read-only and prints
``msg <queue> <offset> <body>`` for every message of every queue, then ``count <n>``.
``python -m tests.procs.partition_host view STORE``: the same view, held open for commands
(:func:`view`).

Output is flushed line by line, so the test sees each acknowledgement as it happens.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import StoreError, StoreLockedError
from rocketstore.pipeline.files import failpoints
from rocketstore.pipeline.format.message import Message

TOPIC = "Partitioned"
QUEUES = 4
OPEN_DEADLINE_S = 180.0
BATCH = 10
PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)


def config(flush: str) -> StoreConfig:
    # Small segments, so that a run crosses several and a take-over's fresh segment is cheap.
    return StoreConfig(
        mapped_file_size_commitlog=64 * 1024,
        mapped_file_size_consume_queue=6000 * 20,
        max_hash_slot_num=1024,
        max_index_num=65536,
        flush_disk_type=flush,
        flush_interval_commitlog=200,
    )


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def attempt(action: Callable[[], object], what: str, done: str) -> None:
    """Run ``action``; say ``done``, or ``fail-<what>`` with the error."""
    try:
        action()
    except (StoreError, OSError) as exc:
        say(f"fail-{what} {_error(exc)}")
    else:
        say(done)


def resident_pages(view: memoryview) -> list[int]:
    """The numbers of the pages of a mapping this host holds in memory (``mincore``): the only
    ones a kernel writes back, and the only ones read here without asking the file system,
    which answers a read of a file another writer replaced with an error (``SIGBUS``)."""
    holder = (ctypes.c_char * len(view)).from_buffer(view)
    try:
        pages = (len(view) + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(ctypes.c_void_p(ctypes.addressof(holder)), len(view), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return [i for i in range(pages) if vec[i] & 1]
    finally:
        del holder


def write_back(store: MessageStore) -> list[str]:
    """Write the derived files' tails back through this writer's own mappings (the module's
    ``write-back``); the outcome of each. Files not mapped now are left out: mapping one would
    map whatever file has the name now, not the one this writer wrote."""
    files = [cq.segments.files[-1] for cq in store.queues.values() if cq.segments.files]
    if store.index is not None and store.index.files:
        files.append(store.index.files[-1]._mf)
    outcomes = []
    for mf in files:
        if not mf.mapped:
            continue
        view = mf.buffer
        try:
            for page in resident_pages(view):
                at = page * PAGE
                view[at : at + PAGE] = bytes(view[at : at + PAGE])  # dirty, as this host has it
            mf.sync_range(0, mf.size)
        except OSError as exc:
            outcomes.append(errno.errorcode.get(exc.errno or 0, str(exc.errno)))
        else:
            outcomes.append("ok")
        finally:
            del view
    return outcomes


def write(store_dir: str, name: str, flush: str) -> int:
    started = time.monotonic()
    while True:
        try:
            store = MessageStore(store_dir, config(flush))
            break
        except StoreLockedError:
            if time.monotonic() - started > OPEN_DEADLINE_S:
                raise
            time.sleep(0.05)  # polling the lock: there is nothing to wait on across hosts
    say(f"open {time.monotonic() - started:.3f} {store.recovery.files_renewed} {os.getpid()}")
    seq = 0
    stop = threading.Event()

    def put_some(n: int) -> bool:
        """Put the next ``n`` messages as one batch: all acknowledged, or the batch failed."""
        nonlocal seq
        bodies = [f"{name}-{seq + i}" for i in range(n)]
        batch = [
            Message(TOPIC, body.encode(), queue_id=(seq + i) % QUEUES, keys=[body])
            for i, body in enumerate(bodies)
        ]
        try:
            result = store.put_batch(batch)
        except (StoreError, OSError) as exc:
            say(f"fail {seq} {_error(exc)}")
            return False
        for i, r in enumerate(result.results()):
            say(f"ack {seq + i} {r.commit_log_offset}")
        seq += n
        return True

    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "put":
            left = int(cmd[1])
            while left > 0 and put_some(min(BATCH, left)):
                left -= min(BATCH, left)
            say("done")
        elif cmd[0] == "stream":
            stop.clear()

            def watch() -> None:
                for more in sys.stdin:
                    if more.strip() == "stop":
                        stop.set()
                        return

            threading.Thread(target=watch, daemon=True).start()
            while not stop.is_set() and put_some(BATCH):
                pass
            say("done")
            stop.wait()
        elif cmd[0] == "pause-at":
            failpoints.arm(cmd[1], "stop")
            say("armed")
        elif cmd[0] == "write-back":
            say(" ".join(["written-back", *write_back(store)]))
        elif cmd[0] == "flush":
            attempt(store.flush, "flush", "flushed")
        elif cmd[0] == "close":
            attempt(store.close, "close", "closed")
            return 0
    return 0


def say_messages(store: MessageStore) -> None:
    """``msg <queue> <offset> <body>`` for every message of the view, then ``count <n>``."""
    n = 0
    for q in range(QUEUES):
        if (TOPIC, q) not in store.queues:
            continue
        offset = store.min_offset(TOPIC, q)
        while offset < store.max_offset(TOPIC, q):
            got = store.get_messages(TOPIC, q, offset, 256)
            for m in got.messages:
                say(f"msg {q} {m.queue_offset} {m.body.decode()}")
                n += 1
            offset = got.next_begin_offset
    say(f"count {n}")


def read(store_dir: str) -> int:
    with MessageStore(Path(store_dir), config("ASYNC_FLUSH"), read_only=True) as store:
        say_messages(store)
    return 0


def held_tails(store: MessageStore) -> list[str]:
    """Per queue, ``<queue>:<n>``: how many non-zero units the file the view holds for the
    queue's end (the inode it opened, whatever the name leads to now) has past the view's
    end, among the next 64."""
    out = []
    for q in range(QUEUES):
        cq = store.queues.get((TOPIC, q))
        if cq is None or not cq.loaded or not cq.segments.files:
            continue
        mf = cq.segments.files[-1]
        at = cq.max_offset * 20 - mf.base
        raw = mf.read(at, min(64 * 20, mf.size - at)) if at < mf.size else b""
        units = [raw[i : i + 20] for i in range(0, len(raw), 20)]
        out.append(f"{q}:{sum(1 for u in units if any(u))}")
    return out


def view(store_dir: str) -> int:
    """A read-only view held open: ``read`` prints its messages (as ``read`` does),
    ``tails`` what the files it holds have past its end (:func:`held_tails`), ``close``."""
    store = MessageStore(Path(store_dir), config("ASYNC_FLUSH"), read_only=True)
    say("open")
    for line in sys.stdin:
        cmd = line.split()
        if cmd == ["read"]:
            say_messages(store)
        elif cmd == ["tails"]:
            say(" ".join(["tails", *held_tails(store)]))
        elif cmd == ["close"]:
            store.close()
            say("closed")
            return 0
    return 0


SETTINGS = {
    "mappedFileSizeCommitLog": "mapped_file_size_commitlog",
    "mappedFileSizeConsumeQueue": "mapped_file_size_consume_queue",
    "maxHashSlotNum": "max_hash_slot_num",
    "maxIndexNum": "max_index_num",
}


def write_settings(path: str) -> int:
    cfg = config("ASYNC_FLUSH")
    Path(path).write_text("".join(f"{k} = {getattr(cfg, a)}\n" for k, a in SETTINGS.items()))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "config":
        sys.exit(write_settings(sys.argv[2]))
    if sys.argv[1] == "write":
        sys.exit(write(sys.argv[2], sys.argv[3], sys.argv[4]))
    if sys.argv[1] == "view":
        sys.exit(view(sys.argv[2]))
    sys.exit(read(sys.argv[2]))
