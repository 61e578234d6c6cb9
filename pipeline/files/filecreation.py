"""Creating a store's fixed-size files (segments of the CommitLog and the ConsumeQueues,
IndexFiles): full size from the start, exclusively (a file another writer created first is
never taken over), and durably or deferred; the ``*.creating`` leftovers a crash can leave;
and, for the error when creation fails, which resource ran out.

Crash behaviour: see :func:`create_full_size` and :func:`create_deferred`. Thread-safety: the
functions keep no state but a counter that makes temporary names unique.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import resource
from pathlib import Path

from rocketstore.pipeline.errors import SegmentCreateError, StoreError
from rocketstore.pipeline.files import durability, failpoints, filesystem

TMP_SUFFIX = ".creating"
_tmp_serial = itertools.count()


def free_space(path: Path) -> str:
    """How much space the file system holding ``path`` has left, for error messages."""
    try:
        st = os.statvfs(path)
    except OSError:
        return "free space unknown"
    return f"{st.f_bavail * st.f_frsize:,} bytes free"


def limit_note(exc: OSError, directory: Path) -> str:
    """The resource ``exc`` ran out of, for error messages: the free space of the file system
    holding ``directory``, or the process limit (``ulimit -f``, ``ulimit -n``) it hit."""
    if exc.errno == errno.EFBIG:
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if soft != resource.RLIM_INFINITY:
            return f"the process may write files of at most {soft:,} bytes (ulimit -f)"
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return f"the process may hold {soft:,} file descriptors (ulimit -n)"
    return free_space(directory)


def create_full_size(path: Path, size: int, *, allocate_all: bool = False) -> tuple[int, int, int]:
    """Create a full-size file at ``path`` (as RocketMQ's RandomAccessFile.setLength), sparse
    unless ``allocate_all``, atomically, durably and exclusively: sized (and allocated) under a
    temporary name of its own and fsynced, then put in place by
    :func:`rocketstore.pipeline.files.durability.place_new`, which fails when ``path`` exists
    (another writer created it first: the loser never writes into the winner's file). Neither
    a crash nor a power cut can leave a segment of the wrong size (which would make the store
    refuse to open), and a full disk leaves no file. A crash leaves at most a ``*.creating``
    file, which loaders ignore and writable opens remove. Returns the file's identity
    (:func:`rocketstore.pipeline.files.filesystem.file_identity`): the file this writer created,
    whatever the name leads to later."""
    if path.exists():
        raise StoreError(f"segment {path} already exists; refusing to overwrite it")
    failpoints.hit("segment-create")
    # A name of this writer's own: two writers creating the same segment at once (one of
    # them fenced off and not knowing it yet) must not size each other's file.
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{next(_tmp_serial)}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(fd, size)
        if allocate_all:
            os.posix_fallocate(fd, 0, size)
        durability.fsync(fd, tmp)
        identity = filesystem.file_identity(fd)
    except OSError as exc:
        os.close(fd)
        fd = -1
        tmp.unlink(missing_ok=True)
        raise SegmentCreateError(
            f"{path}: cannot create a file of {size:,} bytes: {exc.strerror or exc} "
            f"({limit_note(exc, path.parent)})"
        ) from exc
    finally:
        if fd >= 0:
            os.close(fd)
    try:
        durability.place_new(tmp, path)
    except FileExistsError:
        tmp.unlink(missing_ok=True)
        raise SegmentCreateError(
            f"{path}: created by another writer meanwhile; this writer does not write into it"
        ) from None
    return identity


def create_deferred(
    path: Path, size: int, *, allocate_all: bool = False
) -> tuple[int, tuple[int, int, int]]:
    """Create a full-size sparse file at ``path`` exclusively (``O_EXCL``: a file another
    writer created first is never taken over), returning its descriptor, open for reading and
    writing, and its ``st_dev``/``st_ino`` identity. Nothing is synced: the caller makes the
    file and its directory entry durable before it relies on them (a ConsumeQueue's flush).
    A crash between the creation and the sizing leaves an empty file, which loaders drop."""
    failpoints.hit("segment-create")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise SegmentCreateError(
            f"segment {path} already exists (created by another writer?); refusing to write into it"
        ) from None
    except OSError as exc:
        raise SegmentCreateError(
            f"{path}: cannot create the file: {exc.strerror or exc} "
            f"({limit_note(exc, path.parent)})"
        ) from exc
    try:
        os.ftruncate(fd, size)
        if allocate_all:
            os.posix_fallocate(fd, 0, size)
        identity = filesystem.file_identity(fd)
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise SegmentCreateError(
            f"{path}: cannot create a file of {size:,} bytes: {exc.strerror or exc} "
            f"({limit_note(exc, path.parent)})"
        ) from exc
    return fd, identity


def remove_leftovers(directory: Path) -> None:
    """Delete ``*.creating`` files a crash left in ``directory``."""
    if directory.is_dir():
        for leftover in directory.glob("*" + TMP_SUFFIX):
            durability.remove(leftover)
