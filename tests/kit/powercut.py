"""A power-cut file layer for tests, in the manner of RocksDB's FaultInjectionTestFS.

:class:`PowerCut` replaces the four barriers of :mod:`rocketstore.pipeline.files.durability` (``msync``,
``fsync``, ``fsync_dir``, ``syncfs``) with recorders and performs none of them. It remembers,
for every file under a root, its content as of its last barrier (an ``msync`` makes only its
range durable, an ``fsync`` the whole file and its size, a ``syncfs`` of the root's file system
every file) and, for every directory, which names were in it at its last ``fsync_dir`` (or
``syncfs``). :meth:`PowerCut.cut` then does what losing power does to everything
that was not synced: each file goes back to its last synced content (a file never synced is
empty), and every name created, renamed or deleted in a directory since that directory's last
fsync is undone (a new file disappears, a deleted one returns, a file renamed over another gives
the old one back). Directories are treated the same way as files within their parent.

Files are told apart by inode while they live. The recorder also wraps ``durability.replace``
and ``durability.remove`` (still performing them): a file they delete or replace loses its
identity there, so an inode number reused later starts a new file.

``fail_at`` makes barrier number ``fail_at`` (1-based) the moment of the cut: that barrier does
not happen, :class:`PowerLost` is raised, and from then on barriers are ignored, so whatever the
writer does after it is lost as well.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
from pathlib import Path

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files import durability


class PowerLost(BaseException):
    """The simulated power cut (a BaseException: the store must not handle it)."""


class _File:
    __slots__ = ("content", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.content = bytearray()  # as of the last barrier; a file never synced is empty


_DIR = "dir"


class PowerCut:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.barriers = 0  # barriers seen (counting the failed one)
        self.fail_at: int | None = None
        self.dead = False
        self._files: dict[int, _File] = {}
        self._dirs: dict[Path, dict[str, _File | str]] = {}
        self._originals = (
            durability.msync,
            durability.fsync,
            durability.fsync_dir,
            durability.syncfs,
            durability.replace,
            durability.remove,
        )
        self.baseline()

    # -- installing ---------------------------------------------------------------------------
    def install(self) -> PowerCut:
        durability.msync = self.msync
        durability.fsync = self.fsync
        durability.fsync_dir = self.fsync_dir
        durability.syncfs = self.syncfs
        durability.replace = self.replace
        durability.remove = self.remove
        return self

    def uninstall(self) -> None:
        (
            durability.msync,
            durability.fsync,
            durability.fsync_dir,
            durability.syncfs,
            durability.replace,
            durability.remove,
        ) = self._originals

    def __enter__(self) -> PowerCut:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def baseline(self) -> None:
        """Take everything under the root, as it is now, as durable."""
        self._files.clear()
        self._dirs.clear()
        for directory, _, names in os.walk(self.root):
            d = Path(directory)
            for name in names:
                f = self._file(d / name)
                if f is not None:
                    f.content = bytearray((d / name).read_bytes())
            self._dirs[d] = self._listing(d)

    # -- the barriers -------------------------------------------------------------------------
    def _barrier(self) -> bool:
        """Count a barrier; False when it must not take effect."""
        if self.dead:
            return False
        self.barriers += 1
        if self.fail_at is not None and self.barriers >= self.fail_at:
            self.dead = True
            raise PowerLost(f"power cut at barrier {self.barriers}")
        return True

    def msync(self, mm: mmap.mmap, start: int, length: int, path: Path) -> None:
        if not self._barrier() or not self._inside(path):
            return
        f = self._file(path)
        if f is None:
            return
        size = len(mm)
        if len(f.content) < size:
            f.content.extend(bytes(size - len(f.content)))
        end = min(size, start + length)
        f.content[start:end] = mm[start:end]

    def fsync(self, fd: int, path: Path) -> None:
        if not self._barrier() or not self._inside(path):
            return
        f = self._file(path)
        if f is None:
            return
        # Read by name: the descriptor may be write-only.
        f.content = bytearray(Path(path).read_bytes())

    def fsync_dir(self, path: Path) -> None:
        if not self._barrier() or not self._inside(path):
            return
        self._dirs[Path(path)] = self._listing(Path(path))

    def syncfs(self, fd: int, path: Path) -> None:
        if not self._barrier() or os.fstat(fd).st_dev != os.stat(self.root).st_dev:
            return
        self.baseline()  # everything under the root, on the file system synced, is durable

    # -- names ----------------------------------------------------------------------------------
    def replace(self, tmp: Path, path: Path) -> None:
        self._forget(path)
        self._originals[4](tmp, path)
        f = self._files.get(os.stat(path).st_ino)
        if f is not None:
            f.path = path

    def remove(self, path: Path) -> None:
        self._forget(path)
        self._originals[5](path)

    def _forget(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._files.pop(os.stat(path).st_ino, None)

    # -- the cut ------------------------------------------------------------------------------
    def cut(self) -> None:
        """Lose power: put every file and directory under the root back as last synced, then
        take the result as the new durable state. The writer must be gone (its mappings
        closed) first."""
        self._restore(self.root)
        self.dead = False
        self.fail_at = None
        self.baseline()

    def _restore(self, directory: Path) -> None:
        durable = self._dirs.get(directory, {})
        for entry in os.scandir(directory):
            if entry.name not in durable or not self._same(Path(entry.path), durable[entry.name]):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
        for name, what in durable.items():
            path = directory / name
            if what == _DIR:
                path.mkdir(exist_ok=True)
                self._restore(path)
            else:
                assert isinstance(what, _File)
                with open(path, "r+b" if path.exists() else "wb") as fh:
                    fh.truncate(0)
                    fh.write(what.content)

    def _same(self, path: Path, what: _File | str) -> bool:
        if what == _DIR:
            return path.is_dir()
        return path.is_file() and self._files.get(os.stat(path).st_ino) is what

    # -- bookkeeping ---------------------------------------------------------------------------
    def _inside(self, path: Path) -> bool:
        return Path(path).is_relative_to(self.root)

    def _file(self, path: Path) -> _File | None:
        """The live file at ``path`` (tracked from now on if it was not)."""
        try:
            ino = os.stat(path).st_ino
        except FileNotFoundError:
            return None
        f = self._files.get(ino)
        if f is None:
            f = self._files[ino] = _File(path)
        f.path = path
        return f

    def _listing(self, directory: Path) -> dict[str, _File | str]:
        out: dict[str, _File | str] = {}
        for entry in os.scandir(directory):
            if entry.is_dir(follow_symlinks=False):
                out[entry.name] = _DIR
            else:
                f = self._file(Path(entry.path))
                if f is not None:
                    out[entry.name] = f
        return out


def abandon(store: MessageStore) -> None:
    """What a crash leaves of a writer in this process: nothing more is written, flushed or
    cleaned up (``abort`` stays), but its mappings and lock are released."""
    for task in (store._cleaner, store._flusher):
        if task is not None:
            task.stop()
    store.commitlog.close()
    for cq in store.queues.values():
        cq.close()
    if store.index is not None:
        store.index.close()
    if store._lock is not None:
        store._lock.release()
    store._closed = True
