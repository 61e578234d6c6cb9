"""The gate between Spark's micro-batches and a job's store sink, so that a job stops between
micro-batches and never in the middle of an append
(:func:`rocketstore.jobs.common.stop_between_batches`).

Driver side: the gate lives in the job's process; over Spark Connect the server runs a copy of
the bare sink (see :class:`SinkGate`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class StopRequested(RuntimeError):
    """Raised into a micro-batch that reached a closed :class:`SinkGate`."""

    MARK = "rocketstore-job-stop-requested"


class SinkGate:
    """The ``foreachBatch`` function the jobs give Spark: it hands each micro-batch to
    ``sink`` (a ``CommitLogSink``), until :meth:`close`.

    Why a gate: Spark has no "stop after this micro-batch", and stopping a query while its sink
    appends leaves part of the batch in the store until a restart completes it. Thread-safe:
    Spark calls it on its callback thread, the job closes it from the main thread.

    Over Spark Connect (``remote``) the client pickles the function and the server runs the
    copy: a gate pickles as its bare sink, since closing it could not reach that copy.
    """

    def __init__(self, sink: Any, *, remote: bool = False) -> None:
        self.sink = sink
        self.remote = remote
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _itself, (self.sink,)

    @property
    def history(self) -> Any:
        """The sink's per-batch summaries (``BatchSummary``); empty when ``remote``, where the
        server's copy of the sink keeps them."""
        return self.sink.history

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        with self._cond:
            if self._closed:
                raise StopRequested(f"{StopRequested.MARK}: the job is stopping (batch {batch_id})")
            self._busy = True
        try:
            self.sink(df, batch_id)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def close(self, timeout: float) -> bool:
        """Let no micro-batch start appending from now on, and wait up to ``timeout`` seconds
        for the one appending; returns whether none is appending any more."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: not self._busy, timeout)


def _itself(obj: Any) -> Any:
    return obj
