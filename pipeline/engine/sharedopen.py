"""The shared-storage steps of opening a store (:class:`~rocketstore.pipeline.engine.store.MessageStore`).

A store directory on a file system other hosts use (GlusterFS, NFS, any FUSE mount; or what
``sharedStorage`` says) may have a writer on another host, alive on the other side of a
partition. The plain open reads the files, recovers and starts writing; these steps go around
it, in this order:

1. **Before any file is read** (:func:`before_files`). A read-only view lists a directory
   again for a file its listing lacks, for up to ``visibilityWaitMs``
   (rocketstore.pipeline.files.segments), and drops this host's cached tails of the files a writer
   appends to (each queue's when it loads). A writer that fences (rocketstore.pipeline.engine.fencing:
   on shared storage, or once any writer fenced the store) and finds the abort file gives the
   derived files new inodes, which the writer before it cannot reach with a late write-back
   (rocketstore.pipeline.engine.renewal).
2. **Recovery** (:func:`dead_regions`): the CommitLog's dead regions, which recovery never
   takes for records, from the epochs file.
3. **After recovery**, a writer records its epoch (``MessageStore._take_epoch``,
   rocketstore.pipeline.engine.fencing.take_over); a read-only view ends at what the writer published
   (:class:`PublishedView`, rocketstore.pipeline.files.visibility).

Runs during open, before any put; not thread-safe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import fencing, renewal
from rocketstore.pipeline.files import storedir, visibility
from rocketstore.pipeline.files.commitlog import CommitLog
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue
from rocketstore.pipeline.files.progress import FlushProgress


@dataclasses.dataclass(frozen=True)
class Sharing:
    """What the steps before the files found, for the rest of the open."""

    shared: bool  # readers see only what a flush published (rocketstore.pipeline.files.visibility)
    # How long a read-only view waits for a file its listing lacks; None: this host's listing
    # is the directory.
    listing_wait: int | None
    fenced: bool  # this writable open fences off the writers before it
    renewed: int  # derived files given a new inode


def before_files(path: Path, config: StoreConfig, *, read_only: bool, abort_found: bool) -> Sharing:
    """Step 1 (see the module), before the open reads any file of the store at ``path``."""
    shared = visibility.is_shared(path, config.shared_storage)
    listing_wait: int | None = None
    if read_only and shared:
        listing_wait = config.visibility_wait_ms
        # Each queue's tails are forgotten when the queue is loaded (ConsumeQueue).
        storedir.forget_cached_tails(path, queues=False)
    # The writer before may be alive on the other side of a partition, with dirty pages of
    # the derived files it had mapped: they get new inodes, which its late write-back
    # cannot reach, before anything here reads them (rocketstore.pipeline.engine.renewal).
    renewed = 0
    fenced = not read_only and fencing.applies(path, shared)
    if (fenced and abort_found) or (not read_only and shared):
        # Recovery and the renewal must read the files from the servers, not as this host
        # cached them: a writer here whose write-back failed (its host cut off) left pages
        # clean in the cache with bytes the servers never got; and a ceph-fuse client keeps
        # pages it read while another host wrote the file through a mapping, stale for as long
        # as they stay cached (a taker after a clean close saw a queue 125 units long that the
        # last flush recorded 500 long, and refused to open).
        storedir.forget_cached_tails(path)
    if fenced and abort_found:
        renewed = renewal.renew_derived(
            path,
            config.mapped_file_size_consume_queue,
            FlushProgress.read(path / "config"),
        )
    return Sharing(shared, listing_wait, fenced, renewed)


def dead_regions(path: Path, *, full_check: bool) -> tuple[list[tuple[int, int]], bool]:
    """Step 2: the CommitLog's dead regions, and whether recovery must build the index anew.

    After an unclean take-over the writer fenced off may have had pages of the ConsumeQueues
    and the index on their way. The derived files it could reach got new inodes
    (rocketstore.pipeline.engine.renewal); a full recovery (``full_check``: `rocketstore recover`)
    still checks every unit and builds the index anew from the log, whatever arrived."""
    epochs = fencing.read_epochs(path)
    suspect = full_check and bool(epochs) and epochs[-1].dead is not None
    return fencing.dead_regions(epochs), suspect


@dataclasses.dataclass(frozen=True)
class PublishedView:
    """Where a read-only view of a store on shared storage ends: at what its writer published
    and this host can read (rocketstore.pipeline.files.visibility). The log ends at the published
    offset or the last record that checked out here, whichever is first; each queue at its
    published length or its last unit whose record is in that log, whichever is first."""

    point: visibility.Published
    end: int  # the view's CommitLog end

    @classmethod
    def hide_unpublished(
        cls, path: Path, commitlog: CommitLog, queues: Iterable[ConsumeQueue]
    ) -> PublishedView | None:
        """Cut the view of the log and of the loaded ``queues`` at the published point; None
        when nothing is published (RocketMQ wrote the store): as on one host."""
        point = visibility.published(path)
        if point is None:
            return None
        end = min(commitlog.max_offset, max(point.commitlog_end, commitlog.min_offset))
        commitlog.set_end(end)
        view = cls(point, end)
        for cq in queues:
            if cq.loaded:
                view.hide(cq)
        return view

    def hide(self, cq: ConsumeQueue) -> None:
        """End the view of ``cq`` (loaded) at the published point."""
        cq.hide_past(self.end, self.point.queue_length(cq.topic, cq.queue_id))
