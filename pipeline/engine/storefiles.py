"""The plain open of a store directory's files (for
:class:`~rocketstore.pipeline.engine.store.MessageStore`): the mapping cache, the checkpoint, the
CommitLog, the progress file, the ConsumeQueues (found, not loaded) and the index, each loaded
as it is on disk. Nothing is recovered here: the store recovers them next
(rocketstore.pipeline.engine.recovery).

Runs during open; not thread-safe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.queueset import QueueSet
from rocketstore.pipeline.files import filesystem, indexfile, mappedfile, mappings
from rocketstore.pipeline.files.checkpoint import StoreCheckpoint
from rocketstore.pipeline.files.commitlog import CommitLog
from rocketstore.pipeline.files.consumequeue import queue as consumequeue
from rocketstore.pipeline.files.indexservice import IndexService
from rocketstore.pipeline.files.mappedfile import WHOLE
from rocketstore.pipeline.files.mappings import MappingCache
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.files.segments import SegmentQueue


@dataclasses.dataclass
class StoreFiles:
    """A store directory's files, opened."""

    mappings: MappingCache
    checkpoint: StoreCheckpoint
    commitlog: CommitLog
    progress: FlushProgress | None
    queueset: QueueSet
    index: IndexService | None  # None when messageIndexEnable is off


def open_files(
    path: Path,
    cfg: StoreConfig,
    *,
    read_only: bool,
    shared: bool,
    listing_wait: int | None,
    clock_ms: Callable[[], int],
) -> StoreFiles:
    """Open the files of the store at ``path``. ``shared`` and ``listing_wait`` are what the
    shared-storage steps found (rocketstore.pipeline.engine.sharedopen.Sharing)."""
    mappings.raise_descriptor_limit()
    cache = MappingCache(cfg.max_mapped_files)
    # Where reading a hole through a mapping allocates (tmpfs), files get every block when
    # created, so that no reader can die of SIGBUS on a full disk (rocketstore.pipeline.files.filesystem).
    whole = not read_only and filesystem.reads_allocate(path)
    checkpoint = StoreCheckpoint.read(path / "checkpoint")
    # Read before any directory is listed: a writer on the go may flush and write it anew at
    # any moment, and what it names (segments, queues, queue files) must then be in the
    # listings, which only grow while retention leaves them alone, so that a read-only view's
    # files hold at least what its progress file says was durable.
    progress = FlushProgress.read(path / "config")
    commitlog = CommitLog(
        SegmentQueue(
            path / "commitlog",
            cfg.mapped_file_size_commitlog,
            read_only=read_only,
            cache=cache,
            ahead=WHOLE if whole else mappedfile.RESERVE_AHEAD,
            visibility_wait_ms=listing_wait,
        )
    )
    commitlog.load()
    # Each queue is loaded when first used (rocketstore.pipeline.engine.queueset), so that opening
    # a store of 40,000 queues costs a listing of their directories, not 40,000 loads.
    # One syncfs may stand for the queues' fsyncs on the file system consumequeue/ is on, which
    # a mount point or a symlink can make another than the store root's.
    queues_dir = path / "consumequeue"
    queueset = QueueSet(
        queues_dir,
        cfg.mapped_file_size_consume_queue,
        read_only=read_only,
        cache=cache,
        ahead=WHOLE if whole else consumequeue.RESERVE_AHEAD,
        visibility_wait_ms=listing_wait,
        syncfs=not read_only and not shared and filesystem.syncfs_replaces_fsyncs(queues_dir),
    )
    queueset.find(progress.queues if progress is not None else {})
    index: IndexService | None = None
    if cfg.message_index_enable:
        index = IndexService(
            path / "index",
            cfg.max_hash_slot_num,
            cfg.max_index_num,
            read_only=read_only,
            clock_ms=clock_ms,
            cache=cache,
            ahead=WHOLE if whole else indexfile.RESERVE_AHEAD,
        )
        index.load()
    return StoreFiles(cache, checkpoint, commitlog, progress, queueset, index)
