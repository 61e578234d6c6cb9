"""Every durability barrier of the store: ``msync`` of a mapping, ``fsync`` of a file, ``fsync``
of a directory, and the directory operations that need one.

The store never calls ``mmap.flush``, ``os.fsync``, ``os.fdatasync`` or ``syncfs`` itself, nor
renames or deletes a store file itself: it calls :func:`msync`, :func:`fsync`,
:func:`fsync_dir`, :func:`syncfs`, :func:`replace`, :func:`place_new` and :func:`remove` here
(or :func:`write_file` and :class:`FileSystemSync`, built on them), looked up on this module
at call time. A test replaces those names with a recorder (``tests/kit/powercut.py``)
that remembers what each barrier made durable and can then simulate a power cut; in production
they are these plain functions, so the indirection costs one attribute look-up per barrier and
nothing per write.

When a directory needs an fsync (POSIX makes a new, renamed or deleted name durable only then):

* a file created, renamed into place or deleted: its directory;
* a directory created: its parent (:func:`make_dirs` does it for each level it creates).

Thread-safety: the functions hold no state; a :class:`FileSystemSync` is used under its
owner's lock.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import weakref
from pathlib import Path

from rocketstore.pipeline.errors import StoreClosedError
from rocketstore.pipeline.files.fileio import io_error, pwrite_all

# syncfs(2) has no wrapper in os; ctypes releases the GIL around the call.
_libc_syncfs = ctypes.CDLL(None, use_errno=True).syncfs
_libc_syncfs.argtypes = [ctypes.c_int]
_libc_syncfs.restype = ctypes.c_int


def _msync(mm: mmap.mmap, start: int, length: int, path: Path) -> None:
    """Write ``[start, start + length)`` of a shared mapping of ``path`` to disk (``start``
    page-aligned)."""
    mm.flush(start, length)


def _fsync(fd: int, path: Path) -> None:
    """Write an open file's data and size to disk (``path`` names it, for a recorder)."""
    os.fsync(fd)


def _fsync_dir(path: Path) -> None:
    """Make the names in directory ``path`` durable (created, renamed and deleted entries)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


msync = _msync
fsync = _fsync
fsync_dir = _fsync_dir


def fsync_path(path: Path) -> None:
    """Write a file that is not open (a segment whose mapping was dropped) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd, path)
    finally:
        os.close(fd)


def make_dirs(path: Path, *, sync: bool = True) -> list[Path]:
    """``mkdir -p`` that makes each directory it creates durable (fsyncs its parent), or with
    ``sync`` False leaves that to the caller: returns the directories it created, outermost
    first, whose parents then need an fsync."""
    if path.is_dir():
        return []
    missing: list[Path] = []
    at = path
    while not at.is_dir():
        missing.append(at)
        at = at.parent
    missing.reverse()
    for directory in missing:
        # Another writer may create the same directory at the same moment (exist_ok).
        directory.mkdir(exist_ok=True)
        if sync:
            fsync_dir(directory.parent)
    return missing


def _replace(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` (already fsynced) over ``path`` and make the rename durable."""
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _remove(path: Path) -> None:
    """Delete a file (gone already is fine) and make the deletion durable."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def _place_new(tmp: Path, path: Path) -> None:
    """Give the file ``tmp`` (already fsynced) the name ``path``, which must not exist
    (``FileExistsError`` otherwise), and make that durable. Unlike a plain rename it never
    replaces a file another writer created meanwhile: the file is linked to its name, which
    fails when the name exists, then its temporary name is dropped; at no moment does the name
    lead to anything but the whole file. Where the file system has no hard links (some FUSE
    file systems), the name is checked and the file renamed over it: exclusive only against a
    writer that is not racing this one."""
    try:
        os.link(tmp, path)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
            raise
        if path.exists():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from exc
        replace(tmp, path)
        return
    os.unlink(tmp)
    fsync_dir(path.parent)


def _syncfs(fd: int, path: Path) -> None:
    """Make every written page and every name of the file system holding the open directory
    ``fd`` (``path`` names it, for errors and a recorder) durable at once (``syncfs(2)``): one
    call instead of one fsync per file, for a flush that wrote thousands of files. Only for
    file systems whose sync reaches the disk, on kernels that report write-back errors from it
    (:func:`rocketstore.pipeline.files.filesystem.syncfs_replaces_fsyncs`). Raises OSError when
    a write-back on that file system failed since ``fd`` was opened (or since a syncfs of
    ``fd`` last said so): hold ``fd`` across the writes it vouches for (:class:`FileSystemSync`)."""
    if _libc_syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{os.strerror(err)}: syncfs of the file system of {path}")


replace = _replace
remove = _remove
place_new = _place_new
syncfs = _syncfs


class FileSystemSync:
    """:func:`syncfs` of the file system ``directory`` is on, through one descriptor of
    ``directory`` held from construction to :meth:`close`.

    Since Linux 5.8 syncfs reports a write-back error once to each open file, counting from
    when that file was opened: a descriptor opened for each sync misses an error that another
    process's syncfs reported first (seen on Linux 6.18, tests/test_syncfs.py), and the lost
    pages would pass for durable. Held from the store's open, the descriptor reports every
    write-back error on that file system since then, whoever saw it first, and one from
    before that nobody was told of; it cannot tell whose file lost the write. A failure to
    open ``directory`` is an ``OSError`` naming it.

    Not thread-safe (used under the store's lock). A holder never closed (an open that was
    refused) closes its descriptor when it is collected.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory
        try:
            self._fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise io_error(exc, f"open of {directory} for its file system's syncfs") from exc
        self._closer = weakref.finalize(self, os.close, self._fd)

    def sync(self) -> None:
        """:func:`syncfs` of the file system (see the class docstring for what it reports)."""
        if not self._closer.alive:
            # The descriptor's number may belong to another file by now.
            raise StoreClosedError(f"{self.path}: syncfs after its descriptor was closed")
        syncfs(self._fd, self.path)

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        self._closer()


def write_file(path: Path, data: bytes, tmp: Path | None = None) -> None:
    """Replace ``path`` with ``data``, whole or not at all: written to ``tmp`` (default
    ``path`` + ``.tmp``), fsynced, renamed over ``path``, its directory fsynced. A crash at
    any point leaves the old file or the new one, never a torn one; an ``OSError`` leaves the
    old file in place and ``tmp`` removed (a half-written copy would only hold blocks a full
    disk needs). Concurrent writers of one ``path`` must use distinct ``tmp`` names."""
    tmp = tmp if tmp is not None else path.with_name(path.name + ".tmp")
    step = f"write of bytes [0, {len(data)}) of {tmp}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            pwrite_all(fd, data, 0)
            step = f"fsync of {tmp}"
            fsync(fd, tmp)
        finally:
            os.close(fd)
        step = f"rename of {tmp} over {path}"
        replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise io_error(exc, step) from exc
