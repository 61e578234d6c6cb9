"""The files a partition read opens: CommitLog segments mapped read-only (each once, all
closed together), and any segment file looked up by its base offset.

A file retention deleted after planning is reported as gone (None), never as damage. On
shared storage a file past the last one this host lists is not gone but not visible yet: it is
looked for in the directory listed again for up to ``visibilityWaitMs``
(:class:`rocketstore.pipeline.files.segments.SegmentListing`).

Used by one partition read at a time (:mod:`rocketstore.source.read`); not thread-safe.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rocketstore.pipeline.files import visibility
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.files.segments import SegmentListing

T = TypeVar("T")


class MappedSegment:
    """A CommitLog segment mapped read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_RDONLY)
        try:
            self.mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            # mmap holds a dup of its own until closed (a descriptor per segment this read
            # touches); the file stays readable if retention unlinks it meanwhile.
            os.close(fd)

    def close(self) -> None:
        # A view that escaped (it should not) keeps the mapping until it is collected.
        with contextlib.suppress(BufferError):
            self.mm.close()


def segment_file(listing: SegmentListing, base: int, use: Callable[[Path], T]) -> T | None:
    """``use(path)`` of the segment file at ``base`` of ``listing``'s directory, opened by its
    name; one that is not there is looked for in the listing (past the last file listed, in
    the directory listed again: :meth:`SegmentListing.get`, which raises
    :class:`~rocketstore.pipeline.errors.NotVisibleError` when the wait ends). None when it is gone
    (deleted by retention)."""
    path = listing.directory / segment_name(base)
    try:
        return use(path)
    except FileNotFoundError:
        pass
    if listing.get(base) is None:
        return None
    try:
        return use(path)
    except FileNotFoundError:
        return None


def listed_size(entries: list[tuple[int, Path]]) -> int:
    """The size of a directory's segment files, from the newest listed that is there and sized:
    retention deletes the oldest, maybe between the listing and this look, and never the
    newest (a writer that creates a file and then sizes it, as RocketMQ does, may leave the
    newest empty for a moment). 0 when none is."""
    for _, path in reversed(entries):
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        if size > 0:
            return size
    return 0


def _oldest_existing(entries: list[tuple[int, Path]]) -> tuple[int, int] | None:
    """(base, size) of the oldest listed segment still there: retention deletes the oldest
    segments, and may do so between the listing and a look at the file."""
    for base, path in entries:
        try:
            return base, path.stat().st_size
        except FileNotFoundError:
            continue
    return None


class SegmentCache:
    """The segments one partition read touches, mapped once each, closed together.
    ``wait_ms``: how long a segment past this host's listing is waited for (see
    :class:`SegmentListing`; None on one host)."""

    def __init__(self, directory: Path, wait_ms: int | None = None) -> None:
        self.directory = directory
        self.listing = SegmentListing(directory, wait_ms)
        oldest = _oldest_existing(self.listing.entries)
        self.min_offset = oldest[0] if oldest else 0
        self._size = oldest[1] if oldest else None
        self._open: dict[int, MappedSegment | None] = {}

    @property
    def segment_size(self) -> int:
        """The oldest listed segment's size; 0 when there is none (on shared storage, only
        once the directory listed again for the wait still shows none)."""
        if self._size is None:
            self.listing.first()  # lists again (and waits, on shared storage)
            oldest = _oldest_existing(self.listing.entries)
            self._size = oldest[1] if oldest else 0
        return self._size

    def get(self, base: int) -> MappedSegment | None:
        """The segment at ``base``, or None when it does not exist (deleted by retention)."""
        if base not in self._open:
            self._open[base] = segment_file(self.listing, base, MappedSegment)
        return self._open[base]

    def close(self) -> list[Path]:
        """Unmap every segment; returns their paths."""
        closed = [seg.path for seg in self._open.values() if seg is not None]
        for seg in self._open.values():
            if seg is not None:
                seg.close()
        self._open.clear()
        return closed

    def drop(self) -> None:
        """Unmap every segment and drop their cached pages, so that the next look reads them
        from the file system (rocketstore.pipeline.files.visibility)."""
        for path in self.close():
            visibility.drop_cached(path)

    def path_of(self, phys: int) -> Path:
        """The path of the segment that holds CommitLog offset ``phys``."""
        size = self.segment_size or 1
        return self.directory / segment_name(phys - phys % size)
