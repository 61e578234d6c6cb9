"""Writing a whole buffer through a file descriptor.

``os.write`` and ``os.pwrite`` may write fewer bytes than asked (a full disk can end a write
part-way before it fails outright, a signal can interrupt a large one) and report it only in
their return value. The store's small descriptor writes (the progress file, the checkpoint,
the lock file) go through :func:`pwrite_all`, which keeps writing until the whole buffer is
down or the system call raises.

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
