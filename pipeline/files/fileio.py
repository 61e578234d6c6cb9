"""Writing a whole buffer through a file descriptor.

``os.write`` and ``os.pwrite`` may write fewer bytes than asked (a full disk can end a write
part-way before it fails outright, a signal can interrupt a large one) and report it only in
their return value. The store's small descriptor writes (the progress file, the checkpoint,
the lock file) go through :func:`pwrite_all`, which keeps writing until the whole buffer is
down or the system call raises. :func:`io_error` puts the file and bytes a failed call was
writing into its error.

Reading only what a sparse file holds: :func:`data_extents` finds the ranges that may hold data
(``SEEK_DATA``/``SEEK_HOLE``), so that a copy of a 400 MiB IndexFile or a scan of a
6,000,000-byte ConsumeQueue file holding a few units reads those ranges, not the holes.

Thread-safety: none needed (no state); concurrent writers to one range of a file are the
caller's concern.
"""

from __future__ import annotations

import errno
import os

PAGE = 4096


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    """Write all of ``data`` at ``position`` of ``fd``; ``OSError`` if the system refuses.

    A write that returns 0 for a non-empty buffer (no progress, no error) is reported as
    ``ENOSPC`` rather than retried forever."""
    view = memoryview(data).cast("B")
    while len(view):
        done = os.pwrite(fd, view, position)
        if done <= 0:
            raise OSError(errno.ENOSPC, f"write at {position} made no progress")
        view, position = view[done:], position + done


def io_error(exc: OSError, what: str) -> OSError:
    """``exc`` with ``what`` (the call, the bytes and the file) in its text. A system call
    names neither, and the store's errors show the ``repr`` of their cause, which leaves out
    ``filename``: an operator must see which file and which bytes a real I/O error hit. Same
    ``errno``, so the same ``OSError`` subclass, for callers that sort errors by it."""
    return OSError(exc.errno, f"{exc.strerror or exc}: {what}")


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The ranges ``[start, end)`` of the first ``size`` bytes of ``fd`` that may hold data, by
    ``SEEK_DATA``/``SEEK_HOLE``, each starting at a :data:`PAGE` boundary; everything outside
    them reads as zeros. A file system that cannot tell (``EINVAL``, ``EOPNOTSUPP``) gives
    ``[(0, size)]``, and so does one that answers as if there were no holes."""
    extents: list[tuple[int, int]] = []
    at = 0
    while at < size:
        try:
            start = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # nothing but a hole from ``at`` to the end
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return [(0, size)]
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if start < at or end <= start:
            # An answer that does not move on: GlusterFS's FUSE client answered SEEK_DATA and
            # SEEK_HOLE both with the offset asked, over and over. Take the whole file.
            return [(0, size)]
        start -= start % PAGE
        extents.append((start, end))
        at = end
    return extents


def data_end(fd: int, size: int) -> int:
    """Bytes from the start of the first ``size`` bytes of ``fd`` past which there are only
    holes (:func:`data_extents`): 0 for a file of holes alone, ``size`` where the file system
    cannot tell."""
    extents = data_extents(fd, size)
    return extents[-1][1] if extents else 0
