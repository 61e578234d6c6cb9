"""Whether a store directory's files have the sizes a configuration gives them.

RocketMQ's files have fixed sizes: every CommitLog segment ``mappedFileSizeCommitLog`` bytes,
every ConsumeQueue file ``mappedFileSizeConsumeQueue``, every IndexFile
``40 + 4*maxHashSlotNum + 20*maxIndexNum``. A store opened with other settings cannot be read
or written; :func:`check_file_sizes` says so before a writable open changes anything (the
``abort`` file, leftovers, empty trailing segments), so that a refused open leaves the store
exactly as it was and the next open with the right settings is a normal one, not a crash
recovery.

Only reads directory listings (segments through the read seam's local face,
:class:`~rocketstore.pipeline.files.localsegments.LocalSegments`) and file sizes; never opens
a file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import NotAStoreError
from rocketstore.pipeline.files.indexservice import list_index_files
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.mappedfile import listed_size


def _dirs(directory: Path) -> Iterator[os.DirEntry[str]]:
    """Subdirectories of ``directory``; none if it is missing."""
    try:
        with os.scandir(directory) as entries:
            yield from (e for e in entries if e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return


def _segments(directory: str | Path) -> Iterator[tuple[str, int]]:
    """(name, size) of each segment file of ``directory`` (-1: gone since the listing)."""
    files = LocalSegments(directory)
    return ((files.where(base), files.size_of(base)) for base in files.listed())


def _files(path: Path, index: bool) -> Iterator[tuple[str, int, str]]:
    """(file, size, kind) of every CommitLog segment and IndexFile of the store at ``path``
    (IndexFiles only with ``index``: a store that keeps no index never opens them), and of the
    files of the first ConsumeQueue found: settings that differ from the store's show in every
    file of a kind, and a store of 40,000 queues is not listed whole to open it (each queue's
    files are checked when it loads)."""
    for name, size in _segments(path / "commitlog"):
        yield name, size, "commitlog"
    for topic in _dirs(path / "consumequeue"):
        found = False
        for queue in _dirs(Path(topic.path)):
            for name, size in _segments(queue.path):
                found = True
                yield name, size, "consumequeue"
            if found:
                break
        if found:
            break
    for p in list_index_files(path / "index") if index else ():
        yield str(p), listed_size(p), "index"


def check_file_sizes(path: Path, config: StoreConfig) -> None:
    """Raise :class:`NotAStoreError`, naming the first file of the wrong size, the setting and
    where the settings came from, unless every non-empty fixed-size file of the store looked
    at (see :func:`_files`) has the size ``config`` gives it. Empty files (a crash between
    creating and sizing one) are left to recovery."""
    expected = {
        "commitlog": (
            config.mapped_file_size_commitlog,
            f"mappedFileSizeCommitLog={config.mapped_file_size_commitlog}",
        ),
        "consumequeue": (
            config.mapped_file_size_consume_queue,
            f"mappedFileSizeConsumeQueue={config.mapped_file_size_consume_queue}",
        ),
        "index": (
            config.index_file_size,
            f"maxHashSlotNum={config.max_hash_slot_num} and maxIndexNum={config.max_index_num} "
            f"({config.index_file_size} bytes)",
        ),
    }
    for name, size, kind in _files(path, config.message_index_enable):
        want, setting = expected[kind]
        # Empty (being sized) and gone (retention, since the listing) files say nothing.
        if size > 0 and size != want:
            raise NotAStoreError(
                f"{name}: {kind} file is {size} bytes, but {setting} (from "
                f"{config.origin}); the store was written with other settings: open it with "
                "those (--config FILE, or the sink's and source's option config)"
            )
