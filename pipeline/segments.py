"""An ordered run of equal-size segment files forming one log (RocketMQ's ``MappedFileQueue``).

Used by the CommitLog (variable-size records) and by each ConsumeQueue (20-byte units). The
queue maps a log offset to the segment that holds it by arithmetic on the segment size, creates
the next segment when the last one is full, and truncates or drops segments past an offset.

Files whose names are not 20-digit offsets are ignored (RocketMQ ignores them too). Segments
must be contiguous; a gap is reported as :class:`NotAStoreError` naming the missing file.

With a :class:`~pipeline.mappings.MappingCache` the segments are listed and sized when loaded
and mapped on first use (see :mod:`pipeline.mappings`); without one they are mapped when loaded.

Every file created or deleted here is made durable with an fsync of the directory
(:mod:`pipeline.durability`); bytes zeroed by :meth:`SegmentQueue.truncate` are synced at once.

Thread-safety: none; one writer per store. Read-only queues never create or change files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pipeline import durability
from pipeline.errors import NotAStoreError, OffsetOutOfRangeError, StoreError
from pipeline.mapped_file import (
    RESERVE_AHEAD,
    MappedFile,
    parse_segment_name,
    remove_leftovers,
    segment_name,
)
from pipeline.mappings import MappingCache


class SegmentQueue:
    def __init__(
        self,
        directory: Path,
        segment_size: int,
        *,
        read_only: bool,
        cache: MappingCache | None = None,
        ahead: int = RESERVE_AHEAD,
    ) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.read_only = read_only
        self.cache = cache
        self.ahead = ahead
        self.files: list[MappedFile] = []
        self.empty_removed: list[Path] = []

    # -- loading ----------------------------------------------------------------------------
    def load(self) -> None:
        """Open every segment in the directory, in offset order. Write positions start at full;
        the owner sets the last segments' positions after scanning them."""
        if not self.directory.is_dir():
            return
        if not self.read_only:
            remove_leftovers(self.directory)
        found: list[tuple[int, Path]] = []
        for entry in self.directory.iterdir():
            base = parse_segment_name(entry)
            if base is not None and entry.is_file():
                found.append((base, entry))
        found.sort()
        # A crash between creating a file and sizing it (possible with RocketMQ's writer; ours
        # creates segments atomically) leaves an empty file at the end: it holds no data, so
        # it is dropped (removed by a writable open) instead of refusing the store.
        while found and found[-1][1].stat().st_size == 0:
            _, empty = found.pop()
            self.empty_removed.append(empty)
            if not self.read_only:
                durability.remove(empty)
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
            mf = MappedFile(
                path,
                base,
                self.segment_size,
                read_only=self.read_only,
                cache=self.cache,
                ahead=self.ahead,
            )
            mf.wrote_position = mf.flushed_position = self.segment_size
            self.files.append(mf)
            expected = base + self.segment_size

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
        """The segment holding ``offset``; raises :class:`OffsetOutOfRangeError` outside them."""
        if not self.files:
            raise OffsetOutOfRangeError(f"{self.directory}: offset {offset}: no segments")
        first = self.files[0].base
        idx = (offset - first) // self.segment_size
        if offset < first or idx >= len(self.files):
            raise OffsetOutOfRangeError(
                f"{self.directory}: offset {offset} outside [{first}, "
                f"{self.files[-1].base + self.segment_size})"
            )
        return self.files[idx]

    def segments_from(self, offset: int) -> Iterator[MappedFile]:
        if not self.files:
            return
        start = max(0, (offset - self.files[0].base) // self.segment_size)
        yield from self.files[start:]

    def delete_first(self) -> bool:
        """Retention: close, forget and unlink the first segment, which must not be the last
        (the one being written). Returns False, changing nothing, while a zero-copy view of the
        segment is still alive. A file already gone from the directory is not an error."""
        if self.read_only:
            raise StoreError(f"{self.directory}: cannot delete segments of a read-only store")
        if len(self.files) < 2:
            raise StoreError(f"{self.directory}: refusing to delete the last segment")
        mf = self.files[0]
        if not mf.unmap():
            return False
        del self.files[0]
        durability.remove(mf.path)
        return True

    # -- writing ----------------------------------------------------------------------------
    def segment_for_write(self, offset: int) -> MappedFile:
        """The segment ``offset`` falls in, creating it (and only it) when it is the next one.
        A segment created ahead by :meth:`prepare` is returned as it is."""
        base = offset - offset % self.segment_size
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
        durability.make_dirs(self.directory)
        mf = MappedFile(
            self.directory / segment_name(base),
            base,
            self.segment_size,
            read_only=self.read_only,
            create=True,
            cache=self.cache,
            ahead=self.ahead,
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
        for mf in reversed(self.files):
            if mf.wrote_position == 0:
                continue  # created ahead by prepare(), nothing written yet
            if mf.flushed_position >= mf.wrote_position:
                break
            mf.flush()

    def truncate(self, offset: int) -> int:
        """Forget everything at or after ``offset``: later segments are deleted, the one holding
        ``offset`` is zeroed from there on. Returns the number of bytes dropped."""
        dropped = 0
        keep = [mf for mf in self.files if mf.base < offset]
        # The newest first: a crash part-way must leave segments without a gap between them
        # (a gap makes the store refuse to open), and the next open cuts the rest.
        for mf in reversed(self.files[len(keep) :]):
            dropped += mf.wrote_position
            mf.close()
            if not self.read_only:
                durability.remove(mf.path)
        self.files = keep
        last = self.last
        if last is not None and last.end > offset:
            pos = offset - last.base
            dropped += last.wrote_position - pos
            if not self.read_only:
                zero_range(last, pos, last.wrote_position)
                # Synced now: after a power cut the cut-off bytes must not come back behind
                # records written later, where recovery would take them for new ones.
                last.sync_range(pos, last.wrote_position)
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
