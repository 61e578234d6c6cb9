"""A bound on how many files a process keeps mapped or open, and a count of the work done.

Every file of a store (CommitLog segment, ConsumeQueue file, IndexFile) is opened and mapped
on first use and registered with the store's :class:`MappingCache`. A file can hold two
resources: a mapping (``mmap.mmap`` keeps a ``dup`` of the descriptor for as long as the
mapping lives) and a descriptor of its own, kept so that a writer writes, reads and syncs the
file it opened rather than whatever its name points at later
(:mod:`rocketstore.pipeline.files.mappedfile`). A store with tens of thousands of ConsumeQueues
cannot keep them all, so the cache releases the least recently used files (mapped or opened
again when next used) past two bounds:

* the store's own, ``maxMappedFiles``, on mappings (which also keeps a store far below
  ``vm.max_map_count``);
* the process's: at most :func:`descriptor_budget` descriptors held across every cache of the
  process (mappings and own descriptors alike), three quarters of the soft ``RLIMIT_NOFILE``
  (read again now and then, so a limit lowered later is honoured), leaving the rest to
  everything else a process holds (Spark's sockets, pyarrow). Under ``ulimit -n 256`` that is
  128. A file that may not keep a descriptor opens one for each read or write and closes it
  (:meth:`MappingCache.has_room`). A store's first open raises the soft limit to the hard
  one, as the JVM does (:func:`raise_descriptor_limit`).

A cache only ever releases its own files (each store's files belong to its single writer or
reader thread), so a process with many stores open stays under the process bound as long as
each store can give some back; a mapping whose bytes are still referenced (a zero-copy view is
alive) cannot be dropped and is skipped, so either bound can be exceeded for as long as such
views live.

:class:`WorkCounts` counts what a store did to its files (mapped, opened, created, synced,
queues loaded), so that tests can assert that an operation's work follows what it touched
rather than how many queues exist, and tools can show it.

Thread-safety: the process-wide count is guarded by a lock; a :class:`MappingCache` itself is
not thread-safe and is used under its store's discipline (the writer's lock, or one reader
thread).
"""

from __future__ import annotations

import dataclasses
import resource
import threading
from collections import OrderedDict
from typing import Protocol

# Descriptors left to the rest of a process at least (a limit of 256 leaves half).
RESERVED_MIN = 128
_raised = False
# How often (in descriptors asked for) :meth:`MappingCache.has_room` reads the limit again.
BUDGET_EVERY = 256
# The process bound never goes below this, however low the descriptor limit: a store needs a
# few files open at once (a CommitLog segment, a ConsumeQueue file, an IndexFile) to work.
MIN_BUDGET = 8

_lock = threading.Lock()
_alive = 0  # descriptors (mappings and own descriptors) held by every cache of this process


class Releasable(Protocol):
    def release(self) -> bool: ...


@dataclasses.dataclass
class WorkCounts:
    """What a store did to its files since it was opened (or since :meth:`reset`)."""

    mapped: int = 0  # files mapped (first time or again after a release)
    opened: int = 0  # descriptors opened for writes, reads or syncs of unmapped files
    released: int = 0  # files whose mapping or descriptor the cache dropped (the bound)
    created: int = 0  # segment files created
    synced: int = 0  # msync / fsync / fdatasync calls on segment files
    synced_all: int = 0  # syncfs calls (one makes every dirty file of the file system durable)
    queues_loaded: int = 0  # ConsumeQueues whose directory was listed and files looked at
    queues_made: int = 0  # a writer's new queues, whose directory it made (nothing to list)
    queues_listed: int = 0  # ConsumeQueue directories listed without loading the queue
    queues_peeked: int = 0  # queues whose bounds were read from one file without loading it

    def reset(self) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, 0)

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def descriptor_budget() -> int:
    """How many descriptors the process's caches may hold: its soft descriptor limit less a
    quarter of it, or less 128, whichever leaves more to the rest of the process (half of a
    limit of 256)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_BUDGET, soft - max(RESERVED_MIN, soft // 4))


def raise_descriptor_limit() -> None:
    """Raise this process's soft descriptor limit to its hard limit, once, as the JVM does at
    start (``-XX:+MaxFDLimit``, its default): a store with more queues than the soft limit
    allows descriptors would otherwise open and close a file for every write to most of
    them. A limit lowered later (``ulimit -n`` in a test, ``setrlimit``) is honoured."""
    global _raised
    if _raised:
        return
    _raised = True
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):
        pass  # not allowed here (a container's seccomp, say): the soft limit stays


def alive() -> int:
    """Descriptors held by every cache of this process (for tests and diagnostics)."""
    return _alive


def _count(delta: int) -> int:
    global _alive
    with _lock:
        _alive += delta
        return _alive


class MappingCache:
    """The files of one store that hold a mapping or a descriptor, least recently used
    first, and the store's :class:`WorkCounts`."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"mapping limit must be >= 1, not {limit}")
        self.limit = limit
        self._held: OrderedDict[int, Releasable] = OrderedDict()
        self._mapped = 0
        self._descriptors = 0
        self.evictions = 0
        self.work = WorkCounts()
        self._budget = descriptor_budget()
        self._asked = 0

    def __len__(self) -> int:
        """Files mapped now."""
        return self._mapped

    @property
    def descriptors(self) -> int:
        """Descriptors held now: one per mapping, one per file's own descriptor."""
        return self._mapped + self._descriptors

    def has_room(self) -> bool:
        """Whether a file may keep a descriptor it opens now (the process is under its
        budget). A file that may not uses the descriptor for one call and closes it, so that a
        store writing to more files than the budget allows does not close one file's
        descriptor for every file it opens. The budget is read again every
        :data:`BUDGET_EVERY` calls."""
        self._asked += 1
        if self._asked >= BUDGET_EVERY:
            self._asked = 0
            self._budget = descriptor_budget()
        return _alive < self._budget

    def took(self, f: Releasable, *, mapping: bool) -> None:
        """``f`` just mapped itself (``mapping``) or opened its own descriptor: count it as
        the most recently used, and release the least recently used others while more than
        this cache's mapping limit, or more than the process's budget, are held."""
        if mapping:
            self._mapped += 1
            self.work.mapped += 1
        else:
            self._descriptors += 1
            self.work.opened += 1
        total = _count(1)
        key = id(f)
        self._held[key] = f
        self._held.move_to_end(key)
        budget = self._budget = descriptor_budget()
        if self._mapped > self.limit or total > budget:
            self._shrink(keep=key, budget=budget)

    def touch(self, f: Releasable) -> None:
        key = id(f)
        if key in self._held:
            self._held.move_to_end(key)

    def gave_back(self, f: Releasable, *, mapping: bool, holds_more: bool) -> None:
        """``f`` dropped its mapping (``mapping``) or its descriptor; ``holds_more``: it still
        holds the other."""
        if mapping:
            self._mapped -= 1
        else:
            self._descriptors -= 1
        _count(-1)
        if not holds_more:
            self._held.pop(id(f), None)

    def _shrink(self, keep: int, budget: int) -> None:
        """Release files from the least recently used end until both bounds hold (or nothing
        more can be released): each step looks at one file, so a release costs the same in a
        store of 40 files as in one of 40,000."""
        kept: list[tuple[int, Releasable]] = []
        while self._held and (self._mapped > self.limit or _alive > budget):
            key, f = self._held.popitem(last=False)
            if key == keep:
                kept.append((key, f))
                continue
            # release() calls gave_back() itself for what it drops.
            if f.release():
                self.evictions += 1
                self.work.released += 1
            else:
                kept.append((key, f))  # a zero-copy view holds its mapping
        for key, f in kept:
            self._held[key] = f
