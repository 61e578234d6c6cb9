"""A bound on how many files a process keeps mapped, and so on its descriptors.

CPython's ``mmap.mmap`` keeps a ``dup`` of the file's descriptor for as long as the mapping
lives, so every mapped segment holds one descriptor. A store with thousands of ConsumeQueues, or
hundreds of CommitLog segments, would run into ``ulimit -n`` if it kept them all mapped. Every
segment of a store (CommitLog, ConsumeQueue, IndexFile) is therefore mapped on first use and
registered with the store's :class:`MappingCache`, which unmaps the least recently used ones
(mapped again when next used) past two bounds:

* the store's own, ``maxMappedFiles``;
* the process's: at most :func:`descriptor_budget` mappings alive across every cache of the
  process, half the soft ``RLIMIT_NOFILE`` (read again at each mapping, so a limit lowered
  later is honoured), leaving the other half to everything else a process holds (Spark's
  sockets, the files a put opens for a moment, pyarrow). Under ``ulimit -n 256`` that is 128.

A cache only ever unmaps its own segments (each store's files belong to its single writer or
reader thread), so a process with many stores open stays under the process bound as long as
each store can give some back; a segment whose bytes are still referenced (a zero-copy view is
alive) cannot be unmapped and is skipped, so either bound can be exceeded for as long as such
views live.

Thread-safety: the process-wide count is guarded by a lock; a :class:`MappingCache` itself is
not thread-safe and is used under its store's discipline (the writer's lock, or one reader
thread).
"""

from __future__ import annotations

import resource
import threading
from collections import OrderedDict
from typing import Protocol

# The process bound never goes below this, however low the descriptor limit: a store needs a
# few files mapped at once (a CommitLog segment, a ConsumeQueue file, an IndexFile) to work.
MIN_BUDGET = 8

_lock = threading.Lock()
_alive = 0  # mappings registered by every cache of this process


class Unmappable(Protocol):
    def unmap(self) -> bool: ...


def descriptor_budget() -> int:
    """How many mappings the process may keep: half its soft descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_BUDGET, soft // 2)


def alive() -> int:
    """Mappings registered by every cache of this process (for tests and diagnostics)."""
    return _alive


def _count(delta: int) -> int:
    global _alive
    with _lock:
        _alive += delta
        return _alive


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
        recently used others while more than this cache's limit, or more than the process's
        budget, are mapped."""
        key = id(f)
        total = _count(1) if key not in self._mapped else _alive
        self._mapped[key] = f
        budget = descriptor_budget()
        if len(self._mapped) > self.limit or total > budget:
            self._shrink(keep=key, budget=budget)

    def touch(self, f: Unmappable) -> None:
        key = id(f)
        if key in self._mapped:
            self._mapped.move_to_end(key)

    def forget(self, f: Unmappable) -> None:
        """``f`` was unmapped or closed."""
        if self._mapped.pop(id(f), None) is not None:
            _count(-1)

    def _shrink(self, keep: int, budget: int) -> None:
        for key in list(self._mapped):
            if len(self._mapped) <= self.limit and _alive <= budget:
                return
            f = self._mapped.get(key)
            # unmap() calls forget() itself when it succeeds.
            if key != keep and f is not None and f.unmap():
                self.evictions += 1
