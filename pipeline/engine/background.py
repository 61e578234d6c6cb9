"""A store's background work: a task run every N milliseconds on a daemon thread.

A writable store runs two (RocketMQ has a service for each):

* the flusher, every ``flushIntervalCommitLog`` ms: under ASYNC_FLUSH it is what makes puts
  durable (``FlushRealTimeService``); under SYNC_FLUSH puts flush the CommitLog themselves and
  it keeps the ConsumeQueues, the index and the progress file flushed
  (``FlushConsumeQueueService``);
* the cleaner, every 10 s: retention and the disk-full check (``CleanCommitLogService``),
  so deletion never runs on the put path.

Each task takes the store's lock itself. The thread waits on an event between rounds, so
:meth:`stop` returns promptly. A task that fails is kept and re-raised to the writer by
:meth:`raise_if_failed` on its next put: a store that cannot flush must not keep
acknowledging writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rocketstore.pipeline.errors import StoreError


class PeriodicTask:
    def __init__(self, interval_ms: int, flush: Callable[[], object], *, name: str) -> None:
        self._interval = interval_ms / 1000
        self._flush = flush
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._flush()
            except BaseException as exc:  # kept for the writer; the thread must not die silently
                self._error = exc
                return

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise StoreError(
                f"{self._thread.name} failed and stopped ({self._error!r}); the store takes no "
                "more puts until it is closed and opened again"
            ) from self._error

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
