"""An ordered run of equal-size segment files forming one log (RocketMQ's ``MappedFileQueue``).

Used by the CommitLog (variable-size records) and by each ConsumeQueue (20-byte units). The
queue maps a log offset to the segment that holds it by arithmetic on the segment size, creates
the next segment when the last one is full, and truncates or drops segments past an offset.

Files whose names are not 20-digit offsets are ignored (RocketMQ ignores them too). Segments
must be contiguous; a gap is reported as :class:`NotAStoreError` naming the missing file.

With a :class:`~rocketstore.pipeline.files.mappings.MappingCache` the segments are listed and sized when loaded
and mapped on first use (see :mod:`rocketstore.pipeline.files.mappings`); without one they are mapped when loaded.

Finding the file that holds an offset is where the visibility rule for shared storage meets
directory listings: a read-only queue lists and opens its segments through
:class:`~rocketstore.pipeline.files.localsegments.LocalSegments` (the local face of the read
seam, :mod:`rocketstore.pipeline.files.segmentread`), so an offset past the segments listed is
looked for as every other reader looks for it, for up to ``visibilityWaitMs``, before
:class:`NotVisibleError`. A writer opens and creates its own files (read-write, checked for
identity: :mod:`rocketstore.pipeline.files.mappedfile`) from the same listing.

Every file created or deleted here is made durable with an fsync of the directory
(:mod:`rocketstore.pipeline.files.durability`); bytes zeroed by :meth:`SegmentQueue.truncate` are synced at once.

Thread-safety: none; one writer per store. Read-only queues never create or change files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from rocketstore.pipeline.errors import (
    NotAStoreError,
    NotVisibleError,
    OffsetOutOfRangeError,
    SegmentGoneError,
    StoreError,
)
from rocketstore.pipeline.files import durability
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.mappedfile import RESERVE_AHEAD, MappedFile, segment_name
from rocketstore.pipeline.files.mappings import MappingCache
from rocketstore.pipeline.files.segmentread import locate


def _without_empty_tail(
    found: list[tuple[int, Path]],
) -> tuple[list[tuple[int, Path]], list[Path], os.stat_result | None]:
    """``found`` without the empty files at its end, those files, and the status of the last
    file kept (None: gone since the listing, or none kept)."""
    kept = list(found)
    empty: list[Path] = []
    while kept:
        try:
            st = os.stat(kept[-1][1])
        except FileNotFoundError:
            return kept, empty, None
        if st.st_size != 0:
            return kept, empty, st
        empty.insert(0, kept.pop()[1])
    return kept, empty, None


class SegmentQueue:
    def __init__(
        self,
        directory: Path,
        segment_size: int,
        *,
        read_only: bool,
        cache: MappingCache | None = None,
        ahead: int = RESERVE_AHEAD,
        visibility_wait_ms: int | None = None,
        deferred: bool = False,
    ) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.read_only = read_only
        self.cache = cache
        self.ahead = ahead
        # Files and directories created here become durable at the next flush, not when
        # created (see MappedFile's ``deferred``): for ConsumeQueues, of which a put can create
        # thousands at once. ``new_dirs``: directories created since, whose parents need an
        # fsync.
        self.deferred = deferred
        self.new_dirs: list[Path] = []
        # Ranges a truncation zeroed and did not sync (see truncate).
        self.unsynced: list[tuple[MappedFile, int, int]] = []
        # None: this host's listing is the directory (the writer's own store, or one host). A
        # number (read-only views on shared storage): a look-up past the segments listed
        # lists the directory again for up to that many ms (see the module docstring).
        self.visibility_wait_ms = visibility_wait_ms
        self.files: list[MappedFile] = []
        self.empty_removed: list[Path] = []
        self._listing: LocalSegments | None = None

    # -- loading ----------------------------------------------------------------------------
    def load(self) -> None:
        """Open every segment in the directory, in offset order. Write positions start at full;
        the owner sets the last segments' positions after scanning them."""
        leftovers: list[Path] = []
        self._listing = self._local()
        self._listing.relist(leftovers)
        if not self.read_only:
            for leftover in leftovers:
                durability.remove(leftover)
        found, empty, last_stat = _without_empty_tail(self._listing.entries)
        # A crash between creating a file and sizing it (possible with RocketMQ's writer; ours
        # creates segments atomically) leaves an empty file at the end: it holds no data, so
        # it is dropped (removed by a writable open) instead of refusing the store.
        self.empty_removed += empty
        if not self.read_only:
            for path in empty:
                durability.remove(path)
        expected: int | None = None
        for base, path in found:
            if base % self.segment_size != 0:
                raise NotAStoreError(
                    f"{path}: segment offset {base} is not a multiple of the segment size "
                    f"{self.segment_size} (check mappedFileSize* settings)"
                )
            if expected is not None and base != expected:
                raise NotAStoreError(
                    f"{self.directory}: segment {segment_name(expected)} is missing "
                    f"(found {path.name} after it)"
                )
            try:
                # The last file's size is known from the listing's check (most queues have
                # one file): no second stat.
                known = last_stat if path is found[-1][1] else None
                self._open(base, path, self.segment_size, known)
            except SegmentGoneError:
                if self.files:
                    raise  # not the oldest: retention deletes from the head only
                # Deleted by retention since the listing: the queue now starts further on.
                continue
            expected = base + self.segment_size

    def _local(self) -> LocalSegments:
        return LocalSegments(
            self.directory,
            self.visibility_wait_ms,
            segment_size=self.segment_size,
            cache=self.cache,
        )

    def _local_listing(self) -> LocalSegments:
        """The listing the queue was loaded from (one not read yet, before a load)."""
        if self._listing is None:
            self._listing = self._local()
        return self._listing

    def _open(
        self, base: int, path: Path, written: int, stat: os.stat_result | None = None
    ) -> None:
        if self.read_only:
            # A view reads its files as every other reader does (the read seam); one without a
            # mapping cache maps each file as it opens it, as a writer's files are.
            mf = self._local_listing().open(base, whole=self.cache is None, stat=stat)
        else:
            mf = MappedFile(
                path,
                base,
                self.segment_size,
                read_only=False,
                cache=self.cache,
                ahead=self.ahead,
                stat=stat,
            )
        mf.wrote_position = mf.flushed_position = written
        self.files.append(mf)

    def close(self) -> None:
        for mf in self.files:
            mf.close()
        self.files = []

    # -- lookup -----------------------------------------------------------------------------
    @property
    def first(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    @property
    def min_offset(self) -> int:
        """Offset of the first byte held (0 for an empty queue)."""
        return self.files[0].base if self.files else 0

    @property
    def max_offset(self) -> int:
        """Offset one past the last written byte (0 for an empty queue).

        Trailing segments with nothing written (pre-allocated ones) do not move the end."""
        for mf in reversed(self.files):
            if mf.wrote_position:
                return mf.end
        return self.files[0].base if self.files else 0

    def find(self, offset: int) -> MappedFile:
        """The segment holding ``offset``; raises :class:`OffsetOutOfRangeError` outside them.

        With ``visibility_wait_ms``, an offset past the segments held is looked for in the
        directory listed again (:meth:`LocalSegments.has`); the segments found there are taken
        in with nothing written (their owner sets the end it trusts, :meth:`set_end`), and
        one still unlisted after the wait raises :class:`NotVisibleError`."""
        files = self.files
        if files:
            first = files[0].base
            idx = (offset - first) // self.segment_size  # index_of, inlined: the hot path
            if offset >= first and idx < len(files):
                return files[idx]
            if offset >= first and self.visibility_wait_ms is not None:
                return self._find_listed_since(offset)
            raise OffsetOutOfRangeError(
                f"{self.directory}: offset {offset} outside [{first}, "
                f"{files[-1].base + self.segment_size})"
            )
        if offset >= 0 and self.visibility_wait_ms is not None:
            return self._find_listed_since(offset)
        raise OffsetOutOfRangeError(f"{self.directory}: offset {offset}: no segments")

    def index_of(self, offset: int) -> int:
        """The place in :attr:`files` of the segment holding ``offset`` (not checked against
        their number): the files are a contiguous run of bases."""
        return (offset - self.files[0].base) // self.segment_size  # bases: multiples of it

    def _find_listed_since(self, offset: int) -> MappedFile:
        """:meth:`find` of an offset past the segments held, in a listing read again."""
        listing = self._local_listing()
        base, _ = locate(offset, self.segment_size)
        listing.has(base)  # lists the directory again, waiting for the segment; may raise
        expected = self.files[-1].base + self.segment_size if self.files else None
        for b, path in _without_empty_tail(listing.entries)[0]:
            if expected is None and b <= base and b % self.segment_size == 0:
                expected = b  # a queue that held no segment starts at the first listed
            if b != expected:
                continue  # held already, or past a gap: only a contiguous run is taken in
            self._open(b, path, 0)
            expected = b + self.segment_size
        if self.files and self.files[0].base <= offset < self.files[-1].base + self.segment_size:
            return self.files[self.index_of(offset)]
        raise NotVisibleError(
            f"{self.directory}: offset {offset}: no segment of this host's listing holds it "
            "(the segment file is listed empty, or after a gap)"
        )

    def segments_from(self, offset: int) -> Iterator[MappedFile]:
        if not self.files:
            return
        yield from self.files[max(0, self.index_of(offset)) :]

    def delete_first(self) -> bool:
        """Retention: close, forget and unlink the first segment, which must not be the last
        (the one being written). Returns False, changing nothing, while a zero-copy view of the
        segment is still alive. A file already gone from the directory is not an error."""
        if self.read_only:
            raise StoreError(f"{self.directory}: cannot delete segments of a read-only store")
        if len(self.files) < 2:
            raise StoreError(f"{self.directory}: refusing to delete the last segment")
        mf = self.files[0]
        if not mf.release():
            return False
        del self.files[0]
        durability.remove(mf.path)
        return True

    def exists(self, mf: MappedFile) -> bool:
        """Whether the directory still holds ``mf``'s file (retention may have deleted it since
        it was opened)."""
        return self._local_listing().size_of(mf.base) >= 0

    def forget_deleted_head(self) -> bool:
        """A read-only view: forget the first segments that retention deleted since the view
        listed them (those it holds open go too: retention deletes the oldest first, so a
        later one gone means they are as well), and the view's min offset moves past them, as
        if they had gone before it opened. Returns whether any was forgotten. Never the last
        listed segment."""
        gone = 0
        while self.read_only and gone < len(self.files) - 1 and not self.exists(self.files[gone]):
            gone += 1
        for mf in self.files[:gone]:
            mf.close()
        del self.files[:gone]
        return gone > 0

    # -- writing ----------------------------------------------------------------------------
    def segment_for_write(self, offset: int) -> MappedFile:
        """The segment ``offset`` falls in, creating it (and only it) when it is the next one.
        A segment created ahead by :meth:`prepare` is returned as it is."""
        base, _ = locate(offset, self.segment_size)
        last = self.last
        if last is not None and last.base >= base:
            return self.find(offset)
        if last is not None and base != last.base + self.segment_size:
            raise OffsetOutOfRangeError(
                f"{self.directory}: cannot write at {offset}: last segment is {last.path.name}"
            )
        if last is not None:
            last.wrote_position = self.segment_size
        return self._create(base)

    def _create(self, base: int) -> MappedFile:
        self.new_dirs += durability.make_dirs(self.directory, sync=not self.deferred)
        mf = MappedFile(
            Path(self._local_listing().where(base)),
            base,
            self.segment_size,
            read_only=self.read_only,
            create=True,
            cache=self.cache,
            ahead=self.ahead,
            deferred=self.deferred,
        )
        self.files.append(mf)
        return mf

    def prepare(self, end: int, start: int | None = None) -> None:
        """Create, ahead of writing, every missing segment up to the one holding offset
        ``end - 1``, and reserve the blocks of ``[start, end)`` (``start`` defaults to the
        current end), so that a write of that range needs no new file and no new block: a full
        disk or a missing descriptor fails here, before anything is written. Write positions do
        not change: segments created here count as empty until written."""
        if start is None:
            start = self.max_offset
        while self.files and self.files[-1].base + self.segment_size < end:
            self._create(self.files[-1].base + self.segment_size)
        for mf in self.segments_from(start):
            if mf.base >= end:
                break
            mf.reserve(end - mf.base)

    def set_end(self, end: int) -> None:
        """Take ``end`` as the offset one past the last written byte, in memory only (after
        recovery found it, or to hide what a read-only view must not see)."""
        for mf in self.files:
            if mf.base + mf.size <= end:
                mf.wrote_position = mf.flushed_position = mf.size
            elif mf.base <= end:
                mf.wrote_position = mf.flushed_position = end - mf.base
            else:
                mf.wrote_position = mf.flushed_position = 0

    def flush(self) -> None:
        """Make what was written durable, and with ``deferred`` the files and directories
        created since the last flush (their directory entries: an fsync of each directory
        that gained one)."""
        self.sync_truncated()
        fresh = False
        for mf in reversed(self.files):
            fresh = fresh or mf.fresh
            if mf.wrote_position == 0:
                # Created ahead by prepare(), nothing written yet: its name is made durable
                # below; should its size not be after a power cut, loaders drop the empty file.
                mf.fresh = False
                continue
            if mf.flushed_position >= mf.wrote_position and not mf.fresh:
                break
            mf.flush()  # an fsync of a new file makes its size durable too
            mf.fresh = False
        if fresh:
            durability.fsync_dir(self.directory)
        for directory in self.new_dirs:
            durability.fsync_dir(directory.parent)
        self.new_dirs = []

    def sync_truncated(self, *, synced: bool = False) -> None:
        """Sync what truncations zeroed and left unsynced (``synced``: a sync of the whole file
        system just did)."""
        pending, self.unsynced = self.unsynced, []
        if not synced:
            for mf, start, end in pending:
                if mf in self.files:
                    mf.sync_range(start, end)

    def mark_flushed(self) -> None:
        """Everything written and created here was made durable by a sync of the whole file
        system (:func:`rocketstore.pipeline.files.durability.syncfs`)."""
        for mf in reversed(self.files):
            if mf.flushed_position >= mf.wrote_position and not mf.fresh:
                break
            mf.mark_flushed()
        self.new_dirs = []
        self.unsynced = []

    def truncate(
        self,
        offset: int,
        *,
        sync: bool = True,
        keep_later: bool = False,
        written_to: int | None = None,
    ) -> int:
        """Forget everything at or after ``offset``: later segments are deleted, the one holding
        ``offset`` is zeroed from there on. Returns the number of bytes dropped. The zeroed
        bytes are synced now, or with ``sync`` False by :meth:`sync_truncated` or the next
        :meth:`flush`, which the caller must run before anything is written past them.

        ``keep_later``: later segments stay, with nothing written (a take-over fences them off:
        their names must not be created anew while a writer that made them may still write,
        see rocketstore.pipeline.engine.fencing). ``written_to``: where the bytes on disk
        reach, when that is past the write positions (a ConsumeQueue whose end was taken back
        in memory only, rocketstore.pipeline.files.consumequeue.queue): zeroed up to there."""
        dropped = 0
        if keep_later:
            for mf in self.files:
                if mf.base >= offset:
                    dropped += mf.wrote_position
                    mf.wrote_position = mf.flushed_position = 0
        keep = [mf for mf in self.files if mf.base < offset or keep_later]
        # The newest first: a crash part-way must leave segments without a gap between them
        # (a gap makes the store refuse to open), and the next open cuts the rest.
        for mf in reversed(self.files[len(keep) :]):
            dropped += mf.wrote_position
            mf.close()
            if not self.read_only:
                durability.remove(mf.path)
        self.files = keep
        last = next((mf for mf in reversed(keep) if mf.base < offset), None)
        reach = -1 if last is None else last.wrote_position
        if last is not None and written_to is not None:
            reach = min(last.size, max(reach, written_to - last.base))
        if last is not None and last.base + reach > offset:
            pos = offset - last.base
            dropped += reach - pos
            if not self.read_only:
                zero_range(last, pos, reach)
                # Synced before anything is written: after a power cut the cut-off bytes must
                # not come back behind records written later, where recovery would take them
                # for new ones.
                if sync:
                    last.sync_range(pos, reach)
                else:
                    self.unsynced.append((last, pos, reach))
            last.wrote_position = pos
            last.flushed_position = min(last.flushed_position, pos)
        return dropped


_ZEROS = bytes(1 << 20)


def zero_range(mf: MappedFile, start: int, end: int) -> None:
    """Zero ``[start, end)`` of a segment in 1 MiB steps, stopping at the first step that is
    already all zeros.

    Writers fill a segment front to back, so what lies past a cut is one run of bytes written
    before a crash, followed by zeros; the untouched rest of a sparse segment is not rewritten
    (zeroing it would write up to a GiB of zeros into holes). The zeros go through the file,
    not the mapping: a step may reach into holes, and a full disk must be an error, not SIGBUS.
    """
    while start < end:
        n = min(end - start, len(_ZEROS))
        if mf.read(start, n) == _ZEROS[:n]:
            break
        mf.overwrite(start, _ZEROS[:n])
        start += n
