"""Deterministic interleavings of two threads around a lock, without sleeps.

A test pauses one thread at a chosen point (inside a hook it installed) and runs a second
operation on another thread with :func:`run_aside`. That call returns once the second
operation has either finished or started to wait for the watched lock: a
:class:`SignallingLock` put in place of the real lock tells which. So a test can check "the
second operation did not run in the middle of the first" without guessing how long to wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")
SETTLE_LIMIT_S = 60  # a hang guard only: every wait returns as soon as its event is set


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...
    def release(self) -> None: ...


class SignallingLock:
    """A lock (``threading.Lock`` or ``RLock``) that sets :attr:`waiting` when a thread has to
    wait for it, before that thread blocks."""

    def __init__(self, inner: _Lock) -> None:
        self._inner = inner
        self.waiting = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._inner.acquire(False):
            return True
        if not blocking:
            return False
        self.waiting.set()
        return self._inner.acquire(True, timeout)

    def release(self) -> None:
        self._inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class Aside(Generic[T]):
    """An operation running on its own thread (see :func:`run_aside`)."""

    def __init__(self, fn: Callable[[], T], lock: SignallingLock) -> None:
        self._fn = fn
        self._lock = lock
        self.finished = threading.Event()
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="aside", daemon=True)

    def _run(self) -> None:
        try:
            self._result = self._fn()
        except BaseException as exc:
            self._error = exc
        finally:
            self.finished.set()
            self._lock.waiting.set()  # settles run_aside's wait when no one waited

    @property
    def blocked(self) -> bool:
        """Whether the operation is waiting for the lock (it has not finished)."""
        return not self.finished.is_set()

    def result(self) -> T:
        """Wait for the operation to finish; its result, or its exception raised here."""
        self._thread.join(SETTLE_LIMIT_S)
        assert not self._thread.is_alive(), "the operation aside never finished"
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


def run_aside(fn: Callable[[], T], lock: SignallingLock) -> Aside[T]:
    """Start ``fn`` on another thread; return once it finished or waits for ``lock``."""
    lock.waiting.clear()
    aside = Aside(fn, lock)
    aside._thread.start()
    assert lock.waiting.wait(SETTLE_LIMIT_S), "the operation aside neither finished nor waited"
    return aside
