"""What a reader may see of a store that a writer on another host appends to.

On one host the writer and every reader share one page cache, and the writer writes each record
into the CommitLog before the ConsumeQueue unit and the index entry that point at it, so a
reader that finds a unit finds its record. A shared file system (GlusterFS, NFS, CephFS) keeps
no such order between files: a unit written with ``pwrite`` can reach another host before the
record it points at, which waits in the writer's dirty pages until the next ``msync``. And a
client may keep pages of a file it read before, so a host can go on seeing an old tail for a
while.

The rule on shared storage, as Kafka's high watermark:

* **The writer publishes.** A flush syncs the records, then the units and index entries, and
  only then writes the progress file (``config/rocketstore.json``, replaced whole by a rename)
  naming the CommitLog offset and each queue's length up to which all of it is on the servers.
  Under ``SYNC_FLUSH`` every put publishes before it returns; under ``ASYNC_FLUSH`` the
  background flush does, every ``flushIntervalCommitLog`` ms.
* **Readers read up to the published point.** Source planning, read-only opens (the CLI,
  ``verify``) and key look-ups offer no unit, entry or record past it.
* **Stale pages are not damage.** A record below the published point that does not check out
  on this host has not reached it yet (or a page of it was cached before it was written): the
  reader drops what it has cached of the file and reads it again, until it checks out or
  ``visibilityWaitMs`` has passed; only then is it reported as damage. Pages a mapping holds
  (any process's on this host) cannot be dropped, and a ceph-fuse client never refreshes
  them, so units read again are read past the page cache (:func:`read_direct`).
* **Unlisted files are not damage either.** A client may also answer a directory listing from
  its cache, so a file the writer created a moment ago (a CommitLog segment, a ConsumeQueue
  file, an IndexFile) can be missing from this host's listing while the published point, a
  unit, an index entry or a msgId already names an offset in it. A file past the last one
  listed is not visible yet: the reader lists the directory again, pausing, for up to
  ``visibilityWaitMs`` (:class:`rocketstore.pipeline.files.localsegments.LocalSegments`); after that it is
  :class:`~rocketstore.pipeline.errors.NotVisibleError`, and a read-only view ends at what it can see.

A published point can only be late, never ahead: a reader that sees an older progress file (a
client's cached name) sees less, not wrong data. A store with no progress file (RocketMQ wrote
it) publishes nothing; readers then fall back to checking each tail unit's record, as on one
host.

The setting ``sharedStorage`` chooses: ``shared`` applies the rule, ``local`` does not (each put
is visible at once), ``auto`` applies it where the store's file system is a network or FUSE
file system (:func:`is_shared`).

Thread-safety: stateless functions; :class:`Published` is immutable.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

from rocketstore.pipeline.files import filesystem
from rocketstore.pipeline.files.progress import FILE_NAME as PROGRESS_FILE
from rocketstore.pipeline.files.progress import FlushProgress

# File systems whose clients on different hosts do not share a page cache.
SHARED_TYPES = frozenset(
    {"nfs", "nfs4", "ceph", "lustre", "gpfs", "cifs", "smb3", "9p", "glusterfs", "beegfs"}
)
READ_ATTEMPTS = 3
FIRST_PAUSE_S = 0.005
MAX_PAUSE_S = 0.2

T = TypeVar("T")


def is_shared(path: Path, setting: str = "auto") -> bool:
    """Whether readers of the store at ``path`` read only what its writer published."""
    if setting != "auto":
        return setting == "shared"
    kind = filesystem.fs_type(path)
    return kind is not None and (kind in SHARED_TYPES or kind.startswith("fuse."))


class Published(NamedTuple):
    """The published point: every record below ``commitlog_end`` and the first ``queues[name]``
    units of each queue (``name`` is ``topic/queueId``) are on the servers."""

    commitlog_end: int
    queues: dict[str, int]

    def queue_length(self, topic: str, queue_id: int) -> int:
        """Units of a queue that may be read; 0 for a queue created after the point."""
        return self.queues.get(f"{topic}/{queue_id}", 0)


def published(store: Path) -> Published | None:
    """The store's published point, read afresh, or None when it has none (no progress file,
    or one that cannot be read)."""
    config = store / "config"
    # The writer replaces the file by a rename. A FUSE client keeps the name's old entry for
    # its entry timeout (1 s on GlusterFS) and reads the replaced file through it; listing the
    # directory refreshes its entries at once (GlusterFS: a publish seen in 4 ms, not 960).
    for _ in range(READ_ATTEMPTS):
        with contextlib.suppress(OSError):
            os.listdir(config)
        progress = FlushProgress.read(config)
        if progress is not None:
            break
        if not (config / PROGRESS_FILE).exists():
            return None
        # There but unreadable: a client that looked the name up just before a rename can
        # fail to open the replaced file; the next look-up finds the new one.
    else:
        return None
    return Published(progress.flushed_offset, progress.queues)


def drop_cached(path: Path, offset: int = 0, length: int = 0) -> None:
    """Ask the kernel to forget the cached pages of ``path`` (``length`` 0: to the end), so
    that the next read asks the file system again. Pages a live mapping still maps stay: close
    mappings of the file first."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


DIRECT_ALIGN = 4096  # O_DIRECT wants buffer, offset and length aligned to the block size


def read_direct(fd: int, position: int, n: int) -> bytes | None:
    """``n`` bytes at ``position`` of the file open at ``fd``, read past this host's page cache
    (``O_DIRECT`` set on the descriptor for the read), or None where the file system refuses
    direct reads. Pages that a mapping holds cannot be dropped (:func:`drop_cached`), and a
    ceph-fuse client never refreshes the pages its host maps when another host writes the
    file; a direct read asks the file system whatever maps them. Bytes past the file's end
    read as nothing (the caller pads)."""
    if n <= 0:
        return b""
    lo = position - position % DIRECT_ALIGN
    hi = -(-(position + n) // DIRECT_ALIGN) * DIRECT_ALIGN
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
    except OSError:
        return None
    try:
        with mmap.mmap(-1, hi - lo) as buf:  # anonymous, so page-aligned
            try:
                got = os.preadv(fd, [buf], lo)
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    return None
                raise
            return bytes(buf[position - lo : max(position - lo, min(got, position - lo + n))])
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)


def forget_last_files(directory: Path) -> None:
    """Drop this host's cached pages of the last two files of ``directory`` (the ones a
    writer appends to), where a mapping does not hold them. Only files named by a number
    count (not ``commitlog/rocketstore-writer-open``, nor a ``*.creating`` leftover)."""
    with contextlib.suppress(OSError):
        for path in sorted(f for f in directory.iterdir() if f.name.isdigit())[-2:]:
            drop_cached(path)


def wait_until_valid(
    read: Callable[[], T],
    is_stale: Callable[[BaseException], bool],
    refresh: Callable[[], None],
    wait_ms: int,
) -> T:
    """``read()``, and while it raises an error ``is_stale`` accepts (data below the published
    point that has not reached this host), ``refresh()`` (drop cached pages) and read again,
    pausing a little longer each time, for up to ``wait_ms``; then the last error goes out."""
    deadline = time.monotonic() + wait_ms / 1000
    pause = FIRST_PAUSE_S
    while True:
        try:
            return read()
        except Exception as exc:
            if not is_stale(exc) or time.monotonic() >= deadline:
                raise
        refresh()
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, MAX_PAUSE_S)
