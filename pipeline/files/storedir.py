"""A store directory before any of its files is opened: is it one, and how this host should
treat its files (written in place on a copy-on-write file system, read afresh on shared
storage). Used by :class:`~rocketstore.pipeline.engine.store.MessageStore` while it opens; each call
stands alone and is safe from any thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from rocketstore.pipeline.errors import NotAStoreError
from rocketstore.pipeline.files import filesystem, visibility

STORE_ENTRIES = ("commitlog", "consumequeue", "index", "config", "checkpoint", "abort", "lock")
_log = logging.getLogger(__name__)


def check_directory(p: Path, *, read_only: bool, create: bool) -> None:
    """Refuse what is not a store directory (a file, a non-empty directory without any of
    :data:`STORE_ENTRIES`, a read-only open without ``commitlog/``); make a missing one for a
    writer that may create it."""
    if p.exists() and not p.is_dir():
        raise NotAStoreError(f"{p} is a file, not a store directory")
    if not p.exists():
        if read_only or not create:
            raise NotAStoreError(f"{p}: no such store directory")
        # Two writers may create a new broker directory at once (tasks of one micro-batch);
        # the loser goes on to the lock, which decides between them.
        p.mkdir(parents=True, exist_ok=True)
        return
    entries = {e.name for e in p.iterdir()}
    if entries and not entries & set(STORE_ENTRIES):
        raise NotAStoreError(
            f"{p} is not a RocketMQ store directory (it has none of "
            f"{', '.join(STORE_ENTRIES)}) and is not empty; refusing to write into it"
        )
    if read_only and "commitlog" not in entries:
        raise NotAStoreError(f"{p} is not a RocketMQ store directory (no commitlog/)")


def write_in_place(p: Path) -> None:
    """On a copy-on-write file system, have new store files written in place, so that the
    blocks reserved for them are the blocks their mapped writes use (rocketstore.pipeline.files.filesystem)."""
    if filesystem.fs_type(p) not in filesystem.NOCOW_CAPABLE:
        return
    for sub in ("commitlog", "consumequeue", "index"):
        try:
            filesystem.set_nocow(p / sub)
        except OSError as e:
            _log.warning(
                "%s: cannot set NOCOW (%s); on a full disk a write through a mapping of "
                "a file created here can fail with SIGBUS",
                p / sub,
                e,
            )


def forget_cached_tails(p: Path, *, queues: bool = True) -> None:
    """Drop this host's cached pages of the files a writer appends to (the last CommitLog
    segments, the index's last files and, with ``queues``, each queue's), so that a read-only
    view, or a writer taking over after an unclean end, reads them from the file system, not
    as this host saw them before (rocketstore.pipeline.files.visibility). A read-only view forgets a
    queue's when it loads the queue instead (rocketstore.pipeline.files.consumequeue.queue)."""
    with contextlib.suppress(OSError):
        os.listdir(p)  # refreshes the client's attributes of the checkpoint
    dirs = [p / "commitlog", p / "index"]
    if queues:
        with contextlib.suppress(OSError):
            for topic in (p / "consumequeue").iterdir():
                with contextlib.suppress(OSError):
                    dirs.extend(q for q in topic.iterdir() if q.name.isdigit())
    for directory in dirs:
        visibility.forget_last_files(directory)
