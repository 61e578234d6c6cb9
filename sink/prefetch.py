"""Receiving the next Arrow batch while the current one is stored (runs on executors).

A sink task's time goes to two things that can run at once: Spark handing it rows (the socket
read and Arrow decoding of the next batch, and routing them) and the native put of the rows it
already has, which releases the GIL. :func:`prefetched` runs the first in a thread of its own,
a bounded number of items ahead of the second.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar, cast

T = TypeVar("T")

_END = object()


def prefetched(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Yield what ``items`` yields, produced by a thread of its own at most ``depth`` items
    ahead (so at most ``depth + 2`` items are in memory: the queue's, the one the thread holds
    and the one the caller holds). An exception raised by ``items`` is raised here, in order,
    after the items before it.

    Thread-safety: ``items`` is only ever advanced by the one producer thread. When the caller
    stops early (an exception, or ``close``), the producer stops at its next item; it is a
    daemon thread, so one blocked in ``items`` never keeps the process alive.
    """
    box: queue.Queue[tuple[bool, object]] = queue.Queue(depth)
    stop = threading.Event()

    def offer(entry: tuple[bool, object]) -> bool:
        # Waits for room, but gives up once the consumer has gone.
        while not stop.is_set():
            try:
                box.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer((True, item)):
                    return
            offer((True, _END))
        except BaseException as exc:  # handed to the consumer, which raises it
            offer((False, exc))

    thread = threading.Thread(target=produce, name="rocketstore-prefetch", daemon=True)
    thread.start()
    finished = False
    try:
        while True:
            ok, item = box.get()
            if not ok:
                assert isinstance(item, BaseException)
                raise item
            if item is _END:
                finished = True
                return
            yield cast(T, item)
    finally:
        stop.set()
        if finished:
            thread.join()
