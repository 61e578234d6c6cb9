"""``verify`` runs started from the console's health page.

One run at a time per console: :meth:`Health.start` starts a background thread that opens
each broker read-only in turn and runs :func:`rocketstore.pipeline.tools.verify.check.verify_read_only` on
it (the function ``rocketstore verify`` calls), recording progress as it goes. A page reads
:meth:`Health.snapshot`, a copy taken under the lock, and refreshes while the run lasts.

Thread-safety: every field is read and written under one lock; the run's thread is the only
one that opens stores for it. Verifying a store a writer appends to is safe (verify reads a
snapshot up to the end it finds when it starts). The thread is a daemon: stopping the console
abandons a run, which holds nothing a store needs back (read-only, no lock).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rocketstore.pipeline.console.views import Console
from rocketstore.pipeline.errors import StoreError
from rocketstore.pipeline.tools.metrics import VerifyResult
from rocketstore.pipeline.tools.verify.check import Problem, verify_read_only
from rocketstore.pipeline.tools.verify.tier import verify_tier

MAX_PROBLEMS_SHOWN = 500


@dataclasses.dataclass
class BrokerResult:
    broker: str
    ok: bool
    records: int
    units: int
    index_entries: int
    seconds: float
    problems: list[Problem]
    suppressed: int
    error: str | None = None


@dataclasses.dataclass
class RunState:
    """A copy of a run's state: ``done``/``total`` are bytes of the current broker's log."""

    number: int
    running: bool
    started: float
    finished: float | None
    broker: str | None
    done: int
    total: int
    brokers_done: int
    brokers_total: int
    results: list[BrokerResult]

    @property
    def percent(self) -> int:
        if not self.brokers_total:
            return 100
        part = self.done / self.total if self.total else 0.0
        return min(100, int(100 * (self.brokers_done + part) / self.brokers_total))

    @property
    def problems(self) -> int:
        return sum(len(r.problems) + r.suppressed + (r.error is not None) for r in self.results)

    def result(self) -> VerifyResult:
        """The run as ``/metrics`` exports it: problems per broker verified so far."""
        return VerifyResult(
            self.running,
            self.finished,
            {
                r.broker: len(r.problems) + r.suppressed + (r.error is not None)
                for r in self.results
            },
        )


class Health:
    """The console's verify runs (see the module docstring)."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._lock = threading.Lock()
        self._state: RunState | None = None
        self._thread: threading.Thread | None = None

    def snapshot(self) -> RunState | None:
        """The current or last run's state (a copy), ``None`` before the first."""
        with self._lock:
            return (
                None
                if self._state is None
                else dataclasses.replace(self._state, results=list(self._state.results))
            )

    def start(self) -> int:
        """Start a run unless one is running; returns the number of the run in progress."""
        with self._lock:
            if self._state is not None and self._state.running:
                return self._state.number
            brokers = self._console.brokers()
            number = 1 if self._state is None else self._state.number + 1
            self._state = RunState(number, True, time.time(), None, None, 0, 0, 0, len(brokers), [])
            self._thread = threading.Thread(
                target=self._run, args=(brokers,), name=f"console-verify-{number}", daemon=True
            )
            self._thread.start()
            return number

    def last_result(self) -> VerifyResult | None:
        """The current or last run for ``/metrics``; ``None`` before the first."""
        state = self.snapshot()
        return None if state is None else state.result()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the run in progress to end; whether none is running."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def _progress(self, broker: str) -> Callable[[int, int], None]:
        def tick(done: int, total: int) -> None:
            with self._lock:
                assert self._state is not None
                self._state.broker, self._state.done, self._state.total = broker, done, total

        return tick

    def _run(self, brokers: list[tuple[str, Path]]) -> None:
        for name, path in brokers:
            result: BrokerResult
            try:
                config = self._console.config
                report = verify_read_only(
                    path, config, progress=self._progress(name), max_per_kind=100
                )
                if config.tier_on:  # the bucket's objects too, as `rocketstore verify` does
                    verify_tier(path, config, report, progress=self._progress(f"{name} (bucket)"))
                result = BrokerResult(
                    name,
                    report.ok,
                    report.records,
                    report.units,
                    report.index_entries,
                    report.seconds,
                    report.problems[:MAX_PROBLEMS_SHOWN],
                    report.suppressed + max(0, len(report.problems) - MAX_PROBLEMS_SHOWN),
                )
            except (StoreError, OSError) as exc:
                result = BrokerResult(name, False, 0, 0, 0, 0.0, [], 0, str(exc))
            with self._lock:
                assert self._state is not None
                self._state.results.append(result)
                self._state.brokers_done += 1
        with self._lock:
            assert self._state is not None
            self._state.running = False
            self._state.finished = time.time()
            self._state.broker = None
