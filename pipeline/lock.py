"""The store directory's exclusive lock and abort marker.

``lock`` is locked with a POSIX record lock on its first byte, exactly the lock RocketMQ's
``DefaultMessageStore`` takes (``FileChannel.tryLock(0, 1, false)``), so a Java broker and
rocketstore exclude each other. POSIX locks do not exclude a second open in the *same* process,
so opens are also registered in a process-wide table.

``abort`` exists while a writer has the store open; a crash leaves it behind, which tells the
next open that the last shutdown was not clean.

Thread-safe (the registry is guarded). The lock is released when the holder closes it or when
its process dies, however it dies.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
from pathlib import Path

from pipeline.errors import StoreLockedError

_registry: set[str] = set()
_registry_lock = threading.Lock()


class DirectoryLock:
    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir / "lock"
        self._key = str(store_dir.resolve())
        self._fd: int | None = None

    def acquire(self) -> None:
        with _registry_lock:
            if self._key in _registry:
                raise StoreLockedError(
                    f"{self.path.parent}: store is already open for writing in this process"
                )
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    raise StoreLockedError(
                        f"{self.path.parent}: store is locked by another process "
                        f"(a running broker or rocketstore writer holds {self.path})"
                    ) from None
                raise
            os.pwrite(fd, b"lock", 0)
            self._fd = fd
            _registry.add(self._key)

    def release(self) -> None:
        with _registry_lock:
            if self._fd is None:
                return
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)
            finally:
                os.close(self._fd)
                self._fd = None
                _registry.discard(self._key)


def is_locked_elsewhere(store_dir: Path) -> bool:
    """Whether another process holds the store's lock (a probe that takes no lock).

    Closing any descriptor of a file drops this process's POSIX locks on it, so the probe never
    opens the lock file of a store this process holds open itself.
    """
    with _registry_lock:
        if str(store_dir.resolve()) in _registry:
            return False
    path = store_dir / "lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        # lockf cannot ask who holds a lock; F_GETLK through fcntl with a struct flock can.
        flock = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 1, 0)
        res = fcntl.fcntl(fd, fcntl.F_GETLK, flock)
        return bool(struct.unpack("hhqqi", res)[0] != fcntl.F_UNLCK)
    finally:
        os.close(fd)
