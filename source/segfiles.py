"""The CommitLog segments a partition read decodes: opened through the read seam
(:mod:`rocketstore.pipeline.files.segmentread`), mapped read-only, each once, all closed
together.

A segment retention deleted after planning is reported as gone (None), never as damage. On
shared storage a segment past the last one this host lists is not gone but not visible yet:
it is looked for in the directory listed again for up to ``visibilityWaitMs``
(:class:`rocketstore.pipeline.files.localsegments.LocalSegments`).

Used by one partition read at a time (:mod:`rocketstore.source.read`); not thread-safe.
"""

from __future__ import annotations

from pathlib import Path

from rocketstore.pipeline.errors import SegmentGoneError
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.segmentread import OpenSegments, SegmentFile, locate


class SegmentCache:
    """The segments one partition read touches, mapped once each, closed together.
    ``wait_ms``: how long a segment past this host's listing is waited for (see
    :class:`LocalSegments`; None on one host)."""

    def __init__(self, directory: Path, wait_ms: int | None = None) -> None:
        self.files = LocalSegments(directory, wait_ms)
        self._open = OpenSegments(self.files, whole=True)
        self._gone: set[int] = set()
        # Retention deletes the oldest segments, maybe between the listing and this look.
        self.min_offset = next((b for b in self.files.listed() if self.files.size_of(b) >= 0), 0)

    @property
    def segment_size(self) -> int:
        """The size of the directory's segments; 0 when there is none (on shared storage, only
        once the directory listed again for the wait still shows none)."""
        size = self.files.file_size()
        if not size and self.files.first() is not None:  # lists again (and waits) for none
            size = self.files.file_size()
        return size

    def get(self, base: int) -> SegmentFile | None:
        """The segment at ``base``, or None when it does not exist (deleted by retention)."""
        if base in self._gone:
            return None
        try:
            return self._open.get(base)
        except SegmentGoneError:
            self._gone.add(base)
            return None

    def close(self) -> None:
        """Unmap every segment."""
        self._open.close()

    def drop(self) -> None:
        """Unmap every segment and drop their cached pages, so that the next look reads them
        from the file system (rocketstore.pipeline.files.visibility)."""
        bases = self._open.bases()
        self._open.close()
        for base in bases:
            self.files.forget_cached(base)

    def path_of(self, phys: int) -> str:
        """The name of the segment that holds CommitLog offset ``phys``."""
        return self.files.where(locate(phys, self.segment_size or 1)[0])
