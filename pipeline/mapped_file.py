"""One fixed-size, memory-mapped segment file (RocketMQ's ``MappedFile``).

A segment is named by the 20-digit, zero-padded offset of its first byte in the whole log, so
that ``ls`` sorts segments in log order. Its length on disk is always exactly the configured
segment size: RocketMQ refuses to load a store whose files differ, so a new segment is created
full-size (sparse) and never grown or shrunk.

What lies past :attr:`wrote_position` is unspecified (zeros in a file we created). The write
position is not stored in the file: the owner (CommitLog, ConsumeQueue) derives it when loading.

Thread-safety: none. A segment belongs to one writer; concurrent readers in other processes map
the file read-only and see bytes as the page cache has them, so they must only trust data that a
higher layer says is complete.

Crash behaviour: writes land in the page cache; :meth:`flush` (``msync``) makes a range durable.
After a crash, any suffix of unflushed writes may be missing or torn.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from pipeline import failpoints
from pipeline.errors import NotAStoreError, StoreError

NAME_DIGITS = 20
PAGE = mmap.PAGESIZE


def segment_name(base_offset: int) -> str:
    return f"{base_offset:0{NAME_DIGITS}d}"


def parse_segment_name(path: Path) -> int | None:
    """Base offset encoded in a segment's name, or None if the name is not a segment name."""
    name = path.name
    if len(name) != NAME_DIGITS or not name.isdigit():
        return None
    return int(name)


TMP_SUFFIX = ".creating"


def _create_full_size(path: Path, size: int) -> None:
    """Create a sparse, full-size file at ``path`` (as RocketMQ's RandomAccessFile.setLength),
    atomically: sized under a temporary name, then renamed into place, so a crash can never
    leave a segment of the wrong size (which would make the store refuse to open). A crash
    leaves at most a ``*.creating`` file, which loaders ignore and writable opens remove."""
    if path.exists():
        raise StoreError(f"segment {path} already exists; refusing to overwrite it")
    failpoints.hit("segment-create")
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def remove_leftovers(directory: Path) -> None:
    """Delete ``*.creating`` files a crash left in ``directory``."""
    if directory.is_dir():
        for leftover in directory.glob("*" + TMP_SUFFIX):
            leftover.unlink(missing_ok=True)


class MappedFile:
    """A memory-mapped segment of ``size`` bytes whose first byte is log offset ``base``."""

    __slots__ = (
        "_fd",
        "_mm",
        "_view",
        "base",
        "flushed_position",
        "path",
        "read_only",
        "size",
        "wrote_position",
    )

    def __init__(self, path: Path, base: int, size: int, *, read_only: bool, create: bool = False):
        self.path = path
        self.base = base
        self.size = size
        self.read_only = read_only
        self.wrote_position = 0
        self.flushed_position = 0
        flags = os.O_RDONLY if read_only else os.O_RDWR
        if create:
            if read_only:
                raise StoreError(f"cannot create segment {path} in a read-only store")
            _create_full_size(path, size)
        try:
            self._fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open segment {path}: {exc.strerror}") from exc
        try:
            actual = os.fstat(self._fd).st_size
            if actual != size:
                raise NotAStoreError(
                    f"{path}: segment is {actual} bytes, expected exactly {size} "
                    "(check the mappedFileSize* settings match the store)"
                )
            access = mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            self._mm = mmap.mmap(self._fd, size, access=access)
        except BaseException:
            os.close(self._fd)
            raise
        self._view = memoryview(self._mm)

    # -- access -----------------------------------------------------------------------------
    @property
    def buffer(self) -> memoryview:
        """The whole mapping. Slices are zero-copy; do not keep them past :meth:`close`."""
        return self._view

    @property
    def end(self) -> int:
        """Log offset one past the last written byte."""
        return self.base + self.wrote_position

    @property
    def remaining(self) -> int:
        return self.size - self.wrote_position

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.size

    def write_at(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` to ``position`` (relative to the segment) and advance the write position."""
        if isinstance(data, memoryview) and (data.format != "B" or data.ndim != 1):
            data = data.cast("B")
        n = len(data)
        if position < 0 or position + n > self.size:
            raise StoreError(f"{self.path}: write of {n} bytes at {position} exceeds {self.size}")
        self._view[position : position + n] = data
        if position + n > self.wrote_position:
            self.wrote_position = position + n

    def flush(self) -> None:
        """Make everything written so far durable (``msync`` of the unflushed, page-aligned range)."""
        if self.read_only or self.flushed_position >= self.wrote_position:
            return
        start = (self.flushed_position // PAGE) * PAGE
        self._mm.flush(start, self.wrote_position - start)
        self.flushed_position = self.wrote_position

    def try_close(self) -> bool:
        """Close unless a zero-copy view of the mapping is still alive (then return False and
        stay open and usable). Retention uses it so that a segment a reader still holds is
        kept until a later attempt rather than left half-closed."""
        if self._mm.closed:
            return True
        try:
            self._view.release()
        except BufferError:
            return False
        try:
            self._mm.close()
        except BufferError:
            self._view = memoryview(self._mm)
            return False
        os.close(self._fd)
        return True

    def close(self) -> None:
        if self._mm.closed:
            return
        self._view.release()
        self._mm.close()
        os.close(self._fd)

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote_position}/{self.size})"
