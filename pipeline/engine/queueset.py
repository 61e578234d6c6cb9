"""The ConsumeQueues of one store directory: found at open, loaded when first used, flushed
when written.

A broker directory can hold tens of thousands of queues (RocketMQ's layout exists for that:
one CommitLog for every topic). Opening, writing and flushing must therefore cost what the
work touches, not what exists:

* **Open** lists ``consumequeue/<topic>/`` directories only, and gives each queue the length
  the last flush recorded (:mod:`rocketstore.pipeline.files.progress`) without reading its files
  (:meth:`ConsumeQueue.defer`); a queue's files are listed and checked when it is first read
  or written, and then ``on_load`` runs (the store's checks against the CommitLog).
* **Flush** visits the queues written since the last flush (each queue tells the set when it
  gets something to flush). Past :data:`SYNCFS_MIN_QUEUES` of them, where the file system the
  root is on takes one ``syncfs`` for an fsync of every file and directory created or written
  (:func:`rocketstore.pipeline.files.filesystem.syncfs_replaces_fsyncs`: a local disk, a
  kernel that reports write-back errors from syncfs), one call does: a micro-batch spread
  over 10,000 topics costs one call instead of 40,000 fsyncs. Elsewhere (shared storage above
  all, where a file system sync is not sent to the servers) each queue is fsynced, its new
  files' directory entries with it.

Owns the descriptor of the root that syncfs goes through (a
:class:`rocketstore.pipeline.files.durability.FileSystemSync`), from the store's open to its
close, so that a flush fails on every write-back error on that file system since the open.
Thread-safety: none; used under the store's lock.
Crash behaviour: what a flush has not made durable is re-derived by recovery from the durable
dispatch point, as for every derived file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from rocketstore.pipeline.files import durability
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue
from rocketstore.pipeline.files.mappings import MappingCache

# Below this many queues to flush, fsyncs of each are cheaper than a sync of the whole file
# system (which also writes out whatever else is dirty on it).
SYNCFS_MIN_QUEUES = 64


def _subdirs(directory: Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            yield from (e for e in entries if e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return


class QueueSet:
    def __init__(
        self,
        root: Path,
        file_size: int,
        *,
        read_only: bool,
        cache: MappingCache,
        ahead: int,
        visibility_wait_ms: int | None,
        syncfs: bool,
    ) -> None:
        """``syncfs``: whether a flush of many queues may use one syncfs of the file system
        ``root`` is on (see the module docstring); its descriptor is opened now."""
        self.root = root
        self.file_size = file_size
        self.read_only = read_only
        self.cache = cache
        self.ahead = ahead
        self.visibility_wait_ms = visibility_wait_ms
        # Opened before anything is written: the errors it reports are those since it opened.
        self._fs_sync = durability.FileSystemSync(root) if syncfs else None
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._dirty: list[ConsumeQueue] = []
        # Run when a queue's files are first looked at (set by the store once it is open).
        self.on_load: Callable[[ConsumeQueue], None] | None = None

    def find(self, lengths: Mapping[str, int]) -> None:
        """Take in every queue directory under the root, each to be loaded when first used
        with the length ``lengths`` records for it (``topic/queueId``; none: found by reading
        its files then)."""
        for topic in sorted(_subdirs(self.root), key=lambda e: e.name):
            for qdir in sorted(_subdirs(Path(topic.path)), key=lambda e: e.name):
                if qdir.name.isdigit():
                    length = lengths.get(f"{topic.name}/{qdir.name}")
                    self.queue(topic.name, int(qdir.name)).defer(length)

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue ``topic``/``queue_id``, made (with no files yet) when it is new."""
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(
                self.root,
                topic,
                queue_id,
                self.file_size,
                read_only=self.read_only,
                cache=self.cache,
                ahead=self.ahead,
                visibility_wait_ms=self.visibility_wait_ms,
                on_load=self._loaded,
                on_dirty=self._written,
            )
            self.queues[(topic, queue_id)] = cq
        return cq

    def _written(self, cq: ConsumeQueue) -> None:
        self._dirty.append(cq)

    def _loaded(self, cq: ConsumeQueue) -> None:
        if self.on_load is not None:
            self.on_load(cq)

    @property
    def dirty(self) -> int:
        """Queues with something to flush."""
        return len(self._dirty)

    def flush(self) -> list[ConsumeQueue]:
        """Make everything written to or created in a queue since the last flush durable (see
        the module docstring), and return those queues. A failure leaves every such queue to
        the next flush."""
        dirty, self._dirty = self._dirty, []
        try:
            if self._fs_sync is not None and len(dirty) >= SYNCFS_MIN_QUEUES:
                self.cache.work.synced_all += 1
                self._fs_sync.sync()
                for cq in dirty:
                    cq.flushed_by_sync()
            else:
                for cq in dirty:
                    cq.flush()
        except BaseException:
            for cq in dirty:
                cq.mark_dirty_again()
            self._dirty = [*dirty, *self._dirty]
            raise
        return dirty

    def sync_truncated(self, queues: list[ConsumeQueue]) -> None:
        """Make what truncations of ``queues`` zeroed durable, at once where one ``syncfs``
        can (recovery cut them, and nothing may be written after them before this)."""
        cut = [cq for cq in queues if cq.truncated_unsynced]
        if self._fs_sync is not None and len(cut) >= SYNCFS_MIN_QUEUES:
            self.cache.work.synced_all += 1
            self._fs_sync.sync()
            for cq in cut:
                cq.sync_truncated(synced=True)
        else:
            for cq in cut:
                cq.sync_truncated()

    def push_out(self) -> None:
        """Write out what the queues hold dirty, ignoring failures (see the store's flush: a
        page left dirty on a shared file system reaches the servers whenever the kernel writes
        it back, perhaps over files another writer took over meanwhile)."""
        keep = []
        for cq in self._dirty:
            try:
                cq.flush()
            except Exception:  # each is tried; the store reports the CommitLog's failure
                cq.mark_dirty_again()
                keep.append(cq)
        self._dirty = keep

    def close(self) -> Iterator[Callable[[], None]]:
        """Each queue's close, then the syncfs descriptor's, for the store to run (and report)
        one by one."""
        yield from (cq.close for cq in self.queues.values())
        if self._fs_sync is not None:
            yield self._fs_sync.close
