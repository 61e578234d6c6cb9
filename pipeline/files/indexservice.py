"""The ``index/`` directory: a run of IndexFiles, the newest one written, looked up newest first.

Only the last file takes new entries; when it is full a new one is created, named by the local
time of its creation (``yyyyMMddHHmmssSSS``) and starting where the previous one ended (RocketMQ's
``IndexService``).

A put's prepare step (:meth:`IndexService.prepare`) creates, before the first byte of the
CommitLog is written, every file the put's entries will need: the next files are created as
*spares*, with a header of zeros, and started (their header written) only when the file before
them is full. A spare left by a crash is taken up again by the next writable open; read-only
opens and RocketMQ (which starts a zero header like any other) ignore it.

Thread-safety: none (one writer per store).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.errors import SegmentGoneError, StoreError
from rocketstore.pipeline.files import durability
from rocketstore.pipeline.files.filecreation import remove_leftovers
from rocketstore.pipeline.files.indexfile import RESERVE_AHEAD, IndexFile
from rocketstore.pipeline.files.mappedfile import listed_size
from rocketstore.pipeline.files.mappings import MappingCache
from rocketstore.pipeline.format.javahash import index_key_hash

NAME_LENGTH = 17


def list_index_files(directory: Path) -> list[Path]:
    """The IndexFiles of ``directory`` as this host lists it now, oldest first (their names are
    their creation times); none when there is no such directory. Anything else there, a
    ``*.creating`` leftover included, is not an IndexFile. The one listing of IndexFiles: they
    are not offset-named segments (:mod:`rocketstore.pipeline.files.segmentread`), but looked
    up by key, newest first."""
    try:
        with os.scandir(directory) as entries:
            found = [
                Path(e.path)
                for e in entries
                if len(e.name) == NAME_LENGTH and e.name.isdigit() and e.is_file()
            ]
    except (FileNotFoundError, NotADirectoryError):
        return []
    found.sort()
    return found


def index_file_name(ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` in local time, as RocketMQ's ``timeMillisToHumanString``."""
    t = time.localtime(ms // 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{ms % 1000:03d}"


class IndexService:
    def __init__(
        self,
        directory: Path,
        slot_num: int,
        index_num: int,
        *,
        read_only: bool,
        clock_ms: Callable[[], int],
        cache: MappingCache | None = None,
        ahead: int = RESERVE_AHEAD,
    ) -> None:
        self.cache = cache
        self.ahead = ahead
        self.directory = directory
        self.slot_num = slot_num
        self.index_num = index_num
        self.read_only = read_only
        self.clock_ms = clock_ms
        self.files: list[IndexFile] = []
        self.spares: list[IndexFile] = []  # created ahead, not started (see the module doc)

    def load(self) -> None:
        """Open the index files in the directory, oldest first.

        Read-only, a newest file that is full is followed by another as soon as a later record
        has keys, and a shared file system's client may not list that one yet
        (rocketstore.pipeline.files.segments): the directory is listed once more for it. Not waited for, unlike a
        segment past the published point: nothing says a later record has keys."""
        if not self.directory.is_dir():
            return
        if not self.read_only:
            remove_leftovers(self.directory)
        self._take_listed()
        if self.read_only and self.files and self.files[-1].is_full:
            self._take_listed()
        # Trailing files never started are spares a put created ahead; the first file of the
        # directory is kept as it is, whatever its header says.
        while len(self.files) > 1 and self.files[-1].unstarted:
            spare = self.files.pop()
            if self.read_only:
                spare.close()
            else:
                self.spares.insert(0, spare)

    def _take_listed(self) -> None:
        """Open the files of a listing of the directory named after the newest one held."""
        after = self.files[-1].path.name if self.files else ""
        names = [p for p in list_index_files(self.directory) if p.name > after]
        # A stock broker creates an IndexFile empty and sizes it as it maps it: a view of a live
        # broker can list a newest file of 0 bytes, and a broker that died between the two
        # leaves one. It holds nothing, so it is left out (and removed by a writable open), as
        # an empty last segment is (rocketstore.pipeline.files.segments); ours are created full-size.
        while names and listed_size(names[-1]) == 0:
            empty = names.pop()
            if not self.read_only:
                durability.remove(empty)
        for path in names:
            try:
                opened = IndexFile(
                    path,
                    self.slot_num,
                    self.index_num,
                    read_only=self.read_only,
                    cache=self.cache,
                    ahead=self.ahead,
                )
            except SegmentGoneError:
                if self.files and not self.read_only:
                    raise  # not the oldest: retention deletes from the oldest file on
                # Deleted by retention since the listing, and so (oldest first) is every file
                # a view opened before it: those are forgotten too.
                for older in self.files:
                    older.close()
                self.files.clear()
                continue
            self.files.append(opened)

    def close(self) -> None:
        for f in self.files + self.spares:
            f.close()
        self.files = []
        self.spares = []

    def prepare(self, entries: int) -> None:
        """Create every file ``entries`` more entries will need and reserve their blocks, so
        that :meth:`put` of them writes no new file and touches no page without a block.
        Raises ``OSError`` or :class:`SegmentCreateError` with nothing written."""
        if entries <= 0:
            return
        if not self.files:
            self._new_file()
        last = self.files[-1]
        room = last.index_num - last.index_count
        last.reserve(min(entries, room))
        entries -= room
        per_file = self.index_num - 1
        for spare in self.spares:
            if entries <= 0:
                return
            spare.reserve(min(entries, per_file))
            entries -= per_file
        while entries > 0:
            spare = self._create(self._next_name(), 0, 0)
            spare.reserve(min(entries, per_file))
            self.spares.append(spare)
            entries -= per_file

    def delete_first(self) -> None:
        """Retention: close, forget and unlink the oldest file, which must not be the last (the
        one being written). A file already gone from the directory is not an error."""
        if self.read_only:
            raise StoreError(f"{self.directory}: cannot delete index files of a read-only store")
        if len(self.files) < 2:
            raise StoreError(f"{self.directory}: refusing to delete the last index file")
        f = self.files.pop(0)
        f.close()
        durability.remove(f.path)

    @property
    def end_phy_offset(self) -> int:
        """CommitLog offset of the newest indexed message (0 when nothing is indexed)."""
        return self.files[-1].end_phy_offset if self.files else 0

    @property
    def end_timestamp(self) -> int:
        return self.files[-1].end_timestamp if self.files else 0

    def _next_name(self) -> str:
        durability.make_dirs(self.directory)
        ms = self.clock_ms()
        name = index_file_name(ms)
        newest = self.spares[-1] if self.spares else self.files[-1] if self.files else None
        # Two files created in one millisecond would collide; names must also sort in order.
        while (newest is not None and name <= newest.path.name) or (self.directory / name).exists():
            ms += 1
            name = index_file_name(ms)
        return name

    def _create(self, name: str, prev_end_phy: int, prev_end_ts: int) -> IndexFile:
        return IndexFile(
            self.directory / name,
            self.slot_num,
            self.index_num,
            read_only=False,
            create=True,
            prev_end_phy=prev_end_phy,
            prev_end_ts=prev_end_ts,
            cache=self.cache,
            ahead=self.ahead,
        )

    def _new_file(self) -> IndexFile:
        """Start the next file: a spare when there is one, else a file created now."""
        prev = self.files[-1] if self.files else None
        # The full file is made durable before the next one is started, and the next one's
        # header (where it begins) with it: after a power cut, a started file never follows a
        # partial one, and recovery's cut of the index (by beginPhyOffset) finds the right file.
        if prev is not None:
            prev.flush()
        end_phy = prev.end_phy_offset if prev else 0
        end_ts = prev.end_timestamp if prev else 0
        f = self.spares.pop(0) if self.spares else self._create(self._next_name(), end_phy, end_ts)
        f.start(end_phy, end_ts)
        f.flush()
        self.files.append(f)
        return f

    def put(
        self,
        key_hashes: npt.NDArray[np.int32],
        phy_offsets: npt.NDArray[np.int64],
        store_timestamps: npt.NDArray[np.int64],
    ) -> int:
        """Index entries in order, rolling files as they fill.

        Entries of messages before the newest indexed one are skipped, as RocketMQ skips them,
        so re-dispatching a range already indexed adds nothing (entries of the newest indexed
        message itself may be added again, as in RocketMQ; look-ups de-duplicate them).
        Returns the number of entries added.
        """
        if not len(key_hashes):
            return 0
        keep = phy_offsets >= self.end_phy_offset
        if not keep.all():
            key_hashes, phy_offsets, store_timestamps = (
                key_hashes[keep],
                phy_offsets[keep],
                store_timestamps[keep],
            )
        added = 0
        while added < len(key_hashes):
            f = self.files[-1] if self.files and not self.files[-1].is_full else self._new_file()
            added += f.put(key_hashes[added:], phy_offsets[added:], store_timestamps[added:])
        return added

    def destroy(self) -> None:
        """Delete every index file (to rebuild the index from the CommitLog)."""
        for f in self.files + self.spares:
            f.close()
            durability.remove(f.path)
        self.files = []
        self.spares = []

    def _drop_files_from(self, phys: int) -> int:
        """Forget the files that begin at ``phys`` or later; returns their entries."""
        dropped = 0
        while self.files and self.files[-1].begin_phy_offset >= phys:
            f = self.files.pop()
            dropped += f.entry_count
            f.close()
            if not self.read_only:
                durability.remove(f.path)
        return dropped

    def truncate_from(self, phys: int, store_time: Callable[[int], int]) -> int:
        """Forget entries of messages at ``phys`` or later: files that start there are deleted,
        the file holding the boundary is cut (see :meth:`IndexFile.truncate_from`)."""
        dropped = self._drop_files_from(phys)
        if self.files:
            dropped += self.files[-1].truncate_from(phys, store_time)
        return dropped

    def mend(self, phys: int, store_time: Callable[[int], int]) -> tuple[int, int]:
        """After a crash: forget entries of messages at ``phys`` or later, and make the last
        file consistent whatever pages of it reached storage (see :meth:`IndexFile.mend`).
        Only the last file needs it: a full file is flushed before the next one starts.
        Returns (entries dropped, slot heads rewritten)."""
        dropped = self._drop_files_from(phys)
        if not self.files:
            return dropped, 0
        lost, rewritten = self.files[-1].mend(phys, store_time)
        return dropped + lost, rewritten

    def candidates(
        self, topic: str, key: str, begin: int, end: int, min_phys: int = 0
    ) -> Iterator[int]:
        """CommitLog offsets (at least ``min_phys``) whose entry hash matches ``topic#key``
        within ``[begin, end]``, newest first, each at most once. Collisions included: the
        caller checks the message."""
        key_hash = index_key_hash(topic, key)
        seen: set[int] = set()
        for f in reversed(self.files):
            if f.end_phy_offset < min_phys:
                break  # files are in log order: this one and every older one end before it
            if f.is_time_matched(begin, end):
                try:
                    found = f.candidates(key_hash, begin, end, min_phys)
                except SegmentGoneError:
                    if not self.read_only:
                        raise
                    break  # retention deleted it, and every older one, since the view's listing
                for phy, _ in found:
                    if phy not in seen:
                        seen.add(phy)
                        yield phy
            if f.begin_timestamp < begin:
                break

    def flush(self) -> None:
        if self.files:
            self.files[-1].flush()
