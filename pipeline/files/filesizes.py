"""Whether a store directory's files have the sizes a configuration gives them.

RocketMQ's files have fixed sizes: every CommitLog segment ``mappedFileSizeCommitLog`` bytes,
every ConsumeQueue file ``mappedFileSizeConsumeQueue``, every IndexFile
``40 + 4*maxHashSlotNum + 20*maxIndexNum``. A store opened with other settings cannot be read
or written; :func:`check_file_sizes` says so before a writable open changes anything (the
``abort`` file, leftovers, empty trailing segments), so that a refused open leaves the store
exactly as it was and the next open with the right settings is a normal one, not a crash
recovery.

Only reads directory listings and file sizes; never opens a file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import NotAStoreError
from rocketstore.pipeline.files.indexservice import NAME_LENGTH as INDEX_NAME_LENGTH
from rocketstore.pipeline.files.mappedfile import parse_segment_name


def _entries(directory: Path, *, dirs: bool = False) -> Iterator[os.DirEntry[str]]:
    """Regular files (or, with ``dirs``, subdirectories) of ``directory``; none if it is
    missing."""
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                if (e.is_dir if dirs else e.is_file)(follow_symlinks=False):
                    yield e
    except FileNotFoundError:
        return


def _segments(directory: Path) -> Iterator[os.DirEntry[str]]:
    return (e for e in _entries(directory) if parse_segment_name(Path(e.name)) is not None)


def _files(path: Path, index: bool) -> Iterator[tuple[os.DirEntry[str], str]]:
    """(file, kind) of every CommitLog segment and IndexFile of the store at ``path``
    (IndexFiles only with ``index``: a store that keeps no index never opens them), and of the
    files of the first ConsumeQueue found: settings that differ from the store's show in every
    file of a kind, and a store of 40,000 queues is not listed whole to open it (each queue's
    files are checked when it loads)."""
    for entry in _segments(path / "commitlog"):
        yield entry, "commitlog"
    cq_root = path / "consumequeue"
    for topic in _entries(cq_root, dirs=True):
        found = False
        for queue in _entries(Path(topic.path), dirs=True):
            for entry in _segments(Path(queue.path)):
                found = True
                yield entry, "consumequeue"
            if found:
                break
        if found:
            break
    for entry in _entries(path / "index") if index else ():
        if len(entry.name) == INDEX_NAME_LENGTH and entry.name.isdigit():
            yield entry, "index"


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
    for entry, kind in _files(path, config.message_index_enable):
        size = entry.stat(follow_symlinks=False).st_size
        want, setting = expected[kind]
        if size and size != want:
            raise NotAStoreError(
                f"{entry.path}: {kind} file is {size} bytes, but {setting} (from "
                f"{config.origin}); the store was written with other settings: open it with "
                "those (--config FILE, or the sink's and source's option config)"
            )
