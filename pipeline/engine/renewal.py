"""New inodes for the derived files a fenced writer may still have dirty pages of.

A writer cut off by a network partition while busy keeps dirty pages of its mapped files in its
host's page cache (and writes queued in its file system client). When the network heals, its
kernel writes them back, also after another writer has taken the store over and written the
same files. The CommitLog has the dead region for that (:mod:`rocketstore.pipeline.engine.fencing`);
the derived files are rewritten in place by every writer, so a late page would land over the
new writer's ConsumeQueue units or index entries.

The late pages are written to the file the old writer *opened*: its descriptors and mappings
name an inode, and a GlusterFS client reopens them after the heal by that inode's gfid. So at
an unclean take-over on shared storage the new writer, before it recovers or writes anything,
gives every derived file the old writer may have dirtied a new inode: a copy of its bytes under
a temporary name, fsynced, renamed over it. The old inode loses its last name and, once the
servers closed the old writer's descriptors (they do when they give its lock away), its gfid;
the late write-back then fails (``ESTALE`` or ``ENOENT``: ``tests/test_netcluster.py``,
``tests/test_partition.py``) instead of reaching the new file. Which files: those that can
hold a page written after the last flush the progress file records (:func:`derived_tails`),
and the ``checkpoint``. A writer replaces its other files by a rename (the progress file,
``topics.json``) or writes them only when it opens the store (``lock``, the epochs file), and
the CommitLog has its dead region.

Crash behaviour: each file is copied whole (the same bytes; its holes, as ``SEEK_DATA`` finds
them, and its runs of zeros are left as holes) and
renamed over the old one only after the copy is durable, so at every point each path names
either the old inode or an identical new one. A crash leaves at most a temporary file (``*`` +
``.creating``, removed by the next writable open; ``checkpoint.tmp``, rewritten before use),
and the ``abort`` file, so the next writer renews the files again before its recovery, which
sees the same bytes it would have seen without the renewal. Nothing here depends on the epoch
record, which :meth:`~rocketstore.pipeline.engine.store.MessageStore._take_epoch` writes after
recovery: a late page that lands before a file is renewed is copied into it, as a page that
arrived before a crash would be there, and recovery treats it that way.

Called by :class:`~rocketstore.pipeline.engine.store.MessageStore` on a writable open that finds
``abort`` on shared storage, before the files are loaded. Not thread-safe (the caller holds
the store's lock).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from rocketstore.pipeline.engine import fencing
from rocketstore.pipeline.errors import RenewalError
from rocketstore.pipeline.files import durability, failpoints, visibility
from rocketstore.pipeline.files.filecreation import TMP_SUFFIX
from rocketstore.pipeline.files.fileio import PAGE, data_extents, pwrite_all
from rocketstore.pipeline.files.indexfile import read_header
from rocketstore.pipeline.files.indexservice import list_index_files
from rocketstore.pipeline.files.localsegments import list_segments
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.files.segmentread import unit_position

_STEP = 1 << 20  # bytes read at a time; a multiple of PAGE
_ZEROS = bytes(_STEP)


def renew_file(path: Path, tmp: Path | None = None) -> None:
    """Give ``path`` a new inode holding the same bytes: copied to ``tmp`` (default ``path`` +
    ``.creating``) with holes for runs of zeros, fsynced, renamed over ``path``, the directory
    fsynced. Raises :class:`RenewalError` naming the file and the step, with ``path`` as it was
    and ``tmp`` removed."""
    tmp = tmp if tmp is not None else path.with_name(path.name + TMP_SUFFIX)
    step = f"open of {path}"
    try:
        # The bytes on the servers, not pages this host kept of a write-back that failed.
        visibility.drop_cached(path)
        src = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(src).st_size
            step = f"copy of {path} to {tmp}"
            dst = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(dst, size)
                for start, end in data_extents(src, size):
                    for at in range(start, end, _STEP):
                        chunk = _read_exactly(src, min(_STEP, end - at), at, path)
                        if chunk != _ZEROS[: len(chunk)]:
                            _write_pages(dst, chunk, at)
                step = f"fsync of {tmp}"
                durability.fsync(dst, tmp)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        failpoints.hit("derived-renew")
        step = f"rename of {tmp} over {path}"
        durability.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # the file system may be gone: the error says why
            tmp.unlink(missing_ok=True)
        raise RenewalError(
            f"{path}: cannot give the file a new inode after an unclean take-over "
            f"({exc.strerror or exc}: {step}); the file is as it was"
        ) from exc


def _write_pages(fd: int, chunk: bytes, at: int) -> None:
    """Write the pages of ``chunk`` (at file offset ``at``, a multiple of :data:`PAGE`) that
    are not all zeros, a run of them at a time: the copy gets a block only where the original
    holds data, so it takes no more space than the original did."""
    view = memoryview(chunk)
    run: int | None = None
    for p in range(0, len(view), PAGE):
        page = view[p : p + PAGE]
        zero = page == _ZEROS[: len(page)]
        if not zero and run is None:
            run = p
        elif zero and run is not None:
            pwrite_all(fd, view[run:p], at + run)
            run = None
    if run is not None:
        pwrite_all(fd, view[run:], at + run)


def _read_exactly(fd: int, n: int, at: int, path: Path) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        got = os.pread(fd, n, at)
        if not got:
            raise OSError(errno.EIO, f"{path} ended at byte {at} while it was being copied")
        parts.append(got)
        n -= len(got)
        at += len(got)
    return b"".join(parts)


def derived_tails(store_dir: Path, cq_file_size: int, progress: FlushProgress | None) -> list[Path]:
    """The ConsumeQueue and index files a writer may have written since the last flush the
    progress file records, i.e. the ones it can hold dirty pages of, in directory order:

    * of each queue, every file that ends after the queue's recorded length (all of a queue the
      file does not name);
    * of ``index/``, the last file that begins before the recorded CommitLog offset, and
      every file after it (spares created ahead included): a file's slots are written anywhere
      in it, and a header that had not reached the servers still reads as an older one.

    Without a progress file, all of them. Files a flush made durable before the recorded point
    are left out: a writer never rewrites a page it flushed before it writes past it."""
    found: list[Path] = []
    lengths = progress.queues if progress is not None else {}
    cq_root = store_dir / "consumequeue"
    topics = sorted(p for p in cq_root.iterdir() if p.is_dir()) if cq_root.is_dir() else []
    for topic in topics:
        for qdir in sorted(q for q in topic.iterdir() if q.is_dir() and q.name.isdigit()):
            length = lengths.get(f"{topic.name}/{qdir.name}")
            # The file holding the unit at the recorded length, and those after it.
            past = 0 if length is None else unit_position(length, cq_file_size)[0]
            found += [p for base, p in list_segments(qdir) if base >= past]
    files = list_index_files(store_dir / "index")
    if files:
        first = 0
        if progress is not None:
            for i, p in enumerate(files):
                header = read_header(p)
                if header is not None and 0 < header.begin_phy_offset < progress.flushed_offset:
                    first = i
        found += files[first:]
    return found


def renew_derived(store_dir: Path, cq_file_size: int, progress: FlushProgress | None) -> int:
    """Renew (:func:`renew_file`) the ``checkpoint`` and every file :func:`derived_tails`
    names; returns how many files were renewed. See the module for when and why."""
    renewed = 0
    checkpoint = store_dir / "checkpoint"
    try:
        if checkpoint.is_file():
            # The name StoreCheckpoint.write uses for a new checkpoint: it truncates a leftover.
            renew_file(checkpoint, checkpoint.with_name(checkpoint.name + ".tmp"))
            renewed += 1
        for path in derived_tails(store_dir, cq_file_size, progress):
            renew_file(path)
            renewed += 1
    except RenewalError as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            raise RenewalError(f"{exc}{fencing.no_space_hint(store_dir)}") from cause
        raise
    return renewed
