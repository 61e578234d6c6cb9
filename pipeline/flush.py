"""The background flusher: flushes a store every ``flushIntervalCommitLog`` milliseconds.

Under ASYNC_FLUSH it is what makes puts durable (RocketMQ's ``FlushRealTimeService``); under
SYNC_FLUSH puts flush the CommitLog themselves and it keeps the ConsumeQueues, the index and
the progress file flushed (RocketMQ's ``FlushConsumeQueueService``).

The flusher runs the store's ``flush`` (which takes the store's lock) on a daemon thread and
waits on an event between rounds, so :meth:`stop` returns promptly. A flush that fails is kept
and re-raised to the writer by :meth:`raise_if_failed` on its next put: a store that cannot
flush must not keep acknowledging writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pipeline.errors import StoreError


class FlushService:
    def __init__(self, interval_ms: int, flush: Callable[[], None], *, name: str) -> None:
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
            raise StoreError(f"background flush failed: {self._error}") from self._error

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
