"""A bound on how many lazily mapped files are mapped at once (``maxMappedFiles``).

A store with thousands of ConsumeQueues would otherwise keep a mapping (and, before segments
closed their descriptors, two descriptors) per file for as long as it is open. The store's
ConsumeQueue and IndexFile segments are mapped on first use and registered here; when more than
``limit`` are mapped, the least recently used are unmapped (they are mapped again when next
used). A segment whose bytes are still referenced (a zero-copy view is alive) cannot be unmapped
and is skipped, so the bound can be exceeded for as long as such views live. The CommitLog's
segments are not counted: a few large files, always mapped.

Thread-safety: none; used under the store's single-writer discipline (the writer's lock, or one
reader thread).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class Unmappable(Protocol):
    def unmap(self) -> bool: ...


class MappingCache:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"mapping limit must be >= 1, not {limit}")
        self.limit = limit
        self._mapped: OrderedDict[int, Unmappable] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._mapped)

    def admit(self, f: Unmappable) -> None:
        """``f`` was just mapped: count it as the most recently used, and unmap the least
        recently used others while more than ``limit`` are mapped."""
        self._mapped[id(f)] = f
        if len(self._mapped) > self.limit:
            self._shrink(keep=id(f))

    def touch(self, f: Unmappable) -> None:
        key = id(f)
        if key in self._mapped:
            self._mapped.move_to_end(key)

    def forget(self, f: Unmappable) -> None:
        """``f`` was unmapped or closed."""
        self._mapped.pop(id(f), None)

    def _shrink(self, keep: int) -> None:
        for key in list(self._mapped):
            if len(self._mapped) <= self.limit:
                return
            f = self._mapped.get(key)
            # unmap() calls forget() itself when it succeeds.
            if key != keep and f is not None and f.unmap():
                self.evictions += 1
