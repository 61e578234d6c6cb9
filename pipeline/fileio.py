"""Writing a whole buffer through a file descriptor.

``os.write`` and ``os.pwrite`` may write fewer bytes than asked (a full disk can end a write
part-way before it fails outright, a signal can interrupt a large one) and report it only in
their return value. The store's small descriptor writes (the progress file, the checkpoint,
the lock file) go through :func:`pwrite_all`, which keeps writing until the whole buffer is
down or the system call raises. :func:`io_error` puts the file and bytes a failed call was
writing into its error.

Thread-safety: none needed (no state); concurrent writers to one range of a file are the
caller's concern.
"""

from __future__ import annotations

import errno
import os


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
