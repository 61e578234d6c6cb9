"""The store directory's exclusive lock and abort marker.

``lock`` is locked with a write lock on its first byte, the byte RocketMQ's
``DefaultMessageStore`` locks (``FileChannel.tryLock(0, 1, false)``, a classic POSIX record
lock), so a Java broker and rocketstore exclude each other. Where the kernel has them (Linux
3.15+), the lock is an *open file description* lock (``F_OFD_SETLK``): it conflicts with
classic record locks of any process, RocketMQ's included, but belongs to the descriptor rather
than to the process, so a descriptor of ``lock`` that something else in this process opens and
closes (a probe, a copy of the directory) cannot drop it. Without them, it is the classic
POSIX lock, which the process loses when *any* descriptor of the file it holds is closed: the
probe below therefore runs under the registry's lock, so that it never overlaps an acquire. (It
does so with OFD locks too: a FUSE filesystem's server cannot tell the two kinds apart, and
may drop either when another descriptor of the file is closed.)

Neither kind of lock excludes a second open in the *same* process (a classic lock is the
process's; a second open file description of ours would conflict, but the registry answers
first and more clearly), so opens are also registered in a process-wide table.

``abort`` exists while a writer has the store open; a crash leaves it behind, which tells the
next open that the last shutdown was not clean. Beside it, ``commitlog/rocketstore-writer-open``
(:data:`BROKER_STOP`, empty) exists from the same moment until a clean close, and keeps a stock
RocketMQ 4.9 broker off the store in the meantime: a broker checks the lock only after it has
loaded and recovered the directory, but its loading refuses a ``commitlog/`` holding a file
that is not a whole segment (``MappedFileQueue.doLoad``: "length not matched message store
config value"), and the broker exits. So a broker cannot recover a store a rocketstore writer
has open, and cannot take a turn after a rocketstore writer's unclean end until a rocketstore
writer (``rocketstore recover``) has recovered it, recorded its epoch and closed it cleanly
(rocketstore.pipeline.engine.fencing: a broker records no epoch). rocketstore lists only segment
names in ``commitlog/`` and never reads the file. Being empty, it needs no block of a full
disk.

Thread-safe (the registry is guarded). The lock is released when the holder closes it or when
its process dies, however it dies. A child forked while the lock is held closes its inherited
descriptor at once (an open file description lock would otherwise live on in the child after
the parent died) and does not hold the store.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import threading
from pathlib import Path

from rocketstore.pipeline.errors import StoreLockedError
from rocketstore.pipeline.files import durability
from rocketstore.pipeline.files.fileio import pwrite_all

BROKER_STOP = "rocketstore-writer-open"

# struct flock: l_type, l_whence, l_start, l_len, l_pid (native layout and padding).
_FLOCK = "hhqqi"
_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
# Whether to try open file description locks; tests turn it off to run the classic fallback.
_OFD = _OFD_SETLK is not None

_registry: dict[str, DirectoryLock] = {}
_registry_lock = threading.Lock()


def _flock(kind: int) -> bytes:
    """A ``struct flock`` for the first byte of the file (``l_pid`` 0, as OFD locks need)."""
    return struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 1, 0)


class DirectoryLock:
    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir / "lock"
        self._key = str(store_dir.resolve())
        self._fd: int | None = None
        # "ofd" or "posix" while held: which kind of lock this process took.
        self.kind: str | None = None
        self._made_stop = False  # whether mark_open created BROKER_STOP

    def acquire(self) -> None:
        with _registry_lock:
            if self._key in _registry:
                raise StoreLockedError(
                    f"{self.path.parent}: store is already open for writing in this process"
                )
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                kind = self._lock(fd)
                pwrite_all(fd, b"lock", 0)
            except BaseException:
                os.close(fd)  # an OFD lock goes with its descriptor; a classic one with any
                raise
            self._fd, self.kind = fd, kind
            _registry[self._key] = self

    def _lock(self, fd: int) -> str:
        """Take the write lock on ``fd``'s first byte; which kind was taken."""
        try:
            if _OFD and _OFD_SETLK is not None:
                try:
                    fcntl.fcntl(fd, _OFD_SETLK, _flock(fcntl.F_WRLCK))
                    return "ofd"
                except OSError as exc:
                    if exc.errno != errno.EINVAL:  # EINVAL: a kernel without OFD locks
                        raise
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            return "posix"
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise StoreLockedError(
                    f"{self.path.parent}: store is locked by another process "
                    f"(a running broker or rocketstore writer holds {self.path})"
                ) from None
            raise

    def verify(self) -> None:
        """Take the held lock again on its own descriptor: a no-op while this process holds it.

        On a shared file system the servers can give a lock away (a client cut off by the
        network) and the client can reopen the descriptor without it after the heal; asking
        again goes to the servers. Raises :class:`StoreLockedError` when another process holds
        the lock, ``OSError`` when the file system cannot answer (``ENOTCONN``). A descriptor
        the file system has marked as having lost its locks (``EBADFD``) is replaced by a new
        one that takes the lock. If nobody holds it, this takes it back: whether another writer
        held it meanwhile is for the epochs to tell (rocketstore.pipeline.engine.fencing)."""
        fd = self._fd
        if fd is None:
            raise OSError(errno.EBADF, f"{self.path}: the lock is not held")
        if self.kind != "ofd" or _OFD_SETLK is None:
            self._lock(fd)
            return
        try:
            fcntl.fcntl(fd, _OFD_SETLK, _flock(fcntl.F_WRLCK))
            return
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise StoreLockedError(f"{self.path}: locked by another process") from None
            if exc.errno != errno.EBADFD:
                raise
        # EBADFD: GlusterFS's word for a descriptor whose locks a server may have dropped (a
        # brick that went away and came back). Whether anyone else holds the lock is then
        # asked on a new descriptor: taken there, it is ours again, and the old one goes.
        fresh = os.open(self.path, os.O_RDWR)
        try:
            self._lock(fresh)
        except BaseException:
            os.close(fresh)
            raise
        with _registry_lock:
            self._fd = fresh
        os.close(fd)

    def mark_open(self) -> None:
        """Create ``abort`` and :data:`BROKER_STOP` (each kept if there), both durable before
        anything else is written: after a crash or a power cut, the next open, and any broker,
        must know that the store was not closed. Needs the lock held and ``commitlog/``."""
        stop = self.path.parent / "commitlog" / BROKER_STOP
        self._made_stop = not stop.exists()
        for path in (self.path.parent / "abort", stop):
            path.touch()
            durability.fsync_dir(path.parent)

    def mark_closed(self) -> None:
        """Remove :data:`BROKER_STOP` and ``abort``, in that order and each durably: the close
        was clean. Only a writer that still owns the store and flushed everything may call it."""
        durability.remove(self.path.parent / "commitlog" / BROKER_STOP)
        durability.remove(self.path.parent / "abort")

    def release_refused(self) -> None:
        """Release after an open that was refused: :data:`BROKER_STOP` goes if that open made
        it (``abort`` stays, as it stays after a crash: a refusal may come after a write)."""
        if self._made_stop and self._fd is not None:
            with contextlib.suppress(OSError):
                durability.remove(self.path.parent / "commitlog" / BROKER_STOP)
        self.release()

    def release(self) -> None:
        with _registry_lock:
            fd = self._fd
            if fd is None:
                return
            self._fd = None
            _registry.pop(self._key, None)
            try:
                if self.kind == "ofd" and _OFD_SETLK is not None:
                    fcntl.fcntl(fd, _OFD_SETLK, _flock(fcntl.F_UNLCK))
                else:
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
            finally:
                self.kind = None
                os.close(fd)


def _forget_in_child() -> None:
    """After ``fork``, in the child: let go of the parent's locks without touching them."""
    global _registry_lock
    _registry_lock = threading.Lock()  # another thread may have held it at the fork
    for held in _registry.values():
        if held._fd is not None:
            # Closing the child's copy leaves the parent's lock as it is, of either kind (the
            # child holds no classic lock; an OFD lock lives while the parent's copy is open).
            os.close(held._fd)
            held._fd, held.kind = None, None
    _registry.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def is_locked_elsewhere(store_dir: Path) -> bool:
    """Whether another process holds the store's lock (a probe that takes no lock).

    Closing any descriptor of a file drops this process's classic POSIX locks on it, so the
    probe never opens the lock file of a store this process holds open itself, and it runs
    under the registry's lock, so that an acquire in another thread cannot come between its
    check and its close.
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
            # It reports classic and OFD locks alike.
            res = fcntl.fcntl(fd, fcntl.F_GETLK, _flock(fcntl.F_WRLCK))
            return bool(struct.unpack(_FLOCK, res)[0] != fcntl.F_UNLCK)
        finally:
            os.close(fd)
