"""Retention for a store that was not closed cleanly, without opening it for writing.

A writable open of such a store recovers it first, and on a fenced store
(:mod:`rocketstore.pipeline.engine.fencing`) also gives the derived files new inodes
(:mod:`rocketstore.pipeline.engine.renewal`) and starts the log in a fresh segment: all of which take
free space. On a full volume that open fails, so neither ``rocketstore recover`` nor a clean
run through a writable open could free the space that would let it succeed. Here, instead:

1. the store's lock is taken (refused while any writer, a broker included, holds it); a
   writer that lost the store before and checks its fence meanwhile finds it held;
2. a read-only view of the store plans the round as ``rocketstore clean`` would run it
   (:meth:`~rocketstore.pipeline.engine.retention.service.RetentionService.plan` with ``force_expired``):
   expired CommitLog segments, and the oldest ones whatever their age while the disk is over
   85 % full, never the last; then the ConsumeQueue and index files wholly below the new min
   offset;
3. the view is closed, and the planned files are deleted in that order, oldest first, each
   deletion made durable, the lock confirmed before each.

It records no epoch (it writes no record): a writer that lost the store before may find its
lock free again afterwards and go on, and what was deleted is what that writer's own
retention could have deleted. Nothing is written into any file, and ``abort`` stays: the next writable open (``rocketstore
recover``) recovers from the files that are left, as after a crash in the middle of a
retention round. A crash here leaves the same: a contiguous run of segments, and derived files
that may point below the CommitLog's min offset, which recovery moves past.

Thread-safety: one call at a time per store (it holds the store's lock throughout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.retention.policy import (
    KIND_COMMITLOG,
    statvfs_total_bytes,
    statvfs_used_ratio,
)
from rocketstore.pipeline.engine.retention.report import CleanReport
from rocketstore.pipeline.engine.retention.service import RetentionService
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import FencedError, StoreLockedError
from rocketstore.pipeline.files import durability
from rocketstore.pipeline.files.lock import DirectoryLock


def was_closed_cleanly(store_dir: Path) -> bool:
    """Whether the last writer of ``store_dir`` closed it (no ``abort`` left)."""
    return not (store_dir / "abort").exists()


def clean_unrecovered(
    store_dir: Path,
    config: StoreConfig,
    *,
    max_files: int | None = None,
    disk_usage: Callable[[Path], float] = statvfs_used_ratio,
    disk_total: Callable[[Path], int] = statvfs_total_bytes,
) -> CleanReport:
    """Delete what a manual clean would, without recovering the store (see the module), and
    report what was deleted (the disk use after is the plan's estimate). Raises :class:`StoreLockedError` while a writer holds the store, and
    :class:`FencedError` if the lock is lost part-way (the files deleted until then stay
    deleted, in order)."""
    lock = DirectoryLock(store_dir)
    lock.acquire()
    try:
        with MessageStore(store_dir, config, read_only=True) as view:
            service = RetentionService(view, disk_usage=disk_usage, disk_total=disk_total)
            plan = service.plan(force_expired=True, max_files=max_files)
        for f in plan.files:
            try:
                lock.verify()
            except (StoreLockedError, OSError) as exc:
                raise FencedError(
                    f"{store_dir}: clean stopped before deleting {f.path}: its lock on the "
                    f"store was lost ({exc}); the files before it were deleted"
                ) from exc
            durability.remove(f.path)
        limit = service.policy.max_files_per_run if max_files is None else max_files
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
        return CleanReport(**fields, complete=len(plan.deleted(KIND_COMMITLOG)) < limit)
    finally:
        lock.release()
