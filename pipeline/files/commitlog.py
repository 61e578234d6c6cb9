"""The CommitLog: every message of every topic, appended in one log of fixed-size segments.

Segments are ``commitlog/<20-digit base offset>``, ``mappedFileSizeCommitLog`` bytes each. The
record layout is documented in :mod:`rocketstore.pipeline.format.record`. A record never spans two segments: when
``size + 8 > remaining``, an 8-byte END_OF_FILE blank is written and the record starts the next
segment (RocketMQ's rule, which its loader relies on).

This class owns placement and raw bytes only; building records is :mod:`rocketstore.pipeline.format.encode`'s job,
and deriving ConsumeQueue/index entries is :mod:`rocketstore.pipeline.engine.dispatch`'s.

Thread-safety: none; the store's single writer calls the write methods. Reads may run from other
processes that map the files read-only; they must stop at the offset the writer reports.

Crash behaviour: bytes reach the page cache on write and the disk on :meth:`flush`. A crash can
leave a torn last record or zeros; recovery finds the last record whose magic, size and CRC hold.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.errors import CorruptRecordError, OffsetOutOfRangeError, StoreError
from rocketstore.pipeline.files import durability
from rocketstore.pipeline.files.mappedfile import MappedFile
from rocketstore.pipeline.files.segmentread import locate
from rocketstore.pipeline.files.segments import SegmentQueue
from rocketstore.pipeline.format import native, record


class CommitLog:
    """The log over ``segments`` (give them the store's mapping cache: a store of hundreds of
    segments must open and read under a small descriptor limit)."""

    def __init__(self, segments: SegmentQueue) -> None:
        self.directory = segments.directory
        self.segment_size = segments.segment_size
        self.segments = segments

    def load(self) -> None:
        self.segments.load()

    def close(self) -> None:
        self.segments.close()

    # -- bounds -----------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        """Physical offset of the first byte still held (RocketMQ's ``getMinOffset``)."""
        return self.segments.min_offset

    @property
    def max_offset(self) -> int:
        """Physical offset where the next record will be written."""
        return self.segments.max_offset

    def set_end(self, end: int) -> None:
        """Set the write position from a recovered end offset (segments past it are empty)."""
        self.segments.set_end(end)

    # -- placement --------------------------------------------------------------------------
    def plan(self, sizes: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], list[int]]:
        """Physical offsets for records of ``sizes`` appended in order, and the offsets of the
        END_OF_FILE blanks needed between them. Nothing is written."""
        n = len(sizes)
        phys = np.empty(n, dtype=np.int64)
        blanks: list[int] = []
        pos = self.max_offset
        seg = self.segment_size
        too_big = np.flatnonzero(sizes + record.BLANK_SIZE > seg)
        if len(too_big):
            i = int(too_big[0])
            raise StoreError(
                f"message {i} needs {int(sizes[i])} bytes; a CommitLog segment holds at most "
                f"{seg - record.BLANK_SIZE} (mappedFileSizeCommitLog={seg})"
            )
        ends = np.cumsum(sizes)
        done = 0
        while done < n:
            file_end = locate(pos, seg)[0] + seg
            base = int(ends[done - 1]) if done else 0
            # Record k fits while pos + (ends[k] - base) + 8 <= file_end.
            fit = int(
                np.searchsorted(
                    ends[done:], file_end - record.BLANK_SIZE - pos + base, side="right"
                )
            )
            if fit:
                phys[done : done + fit] = pos + np.concatenate(
                    ([0], ends[done : done + fit - 1] - base)
                )
                pos += int(ends[done + fit - 1]) - base
                done += fit
            if done < n:
                if locate(pos, seg)[1]:
                    blanks.append(pos)
                pos = file_end
        return phys, blanks

    # -- writing ----------------------------------------------------------------------------
    def prepare_segments(self, start: int, end: int) -> None:
        """Create every segment a write of ``[start, end)`` needs and reserve its blocks before
        any byte is written (the segment holding ``start`` included, when it is the next one)."""
        if not self.segments.files:
            self.segments.segment_for_write(start)
        self.segments.prepare(end, start)

    def write(self, phys: int, data: bytes | bytearray | memoryview) -> None:
        """Write bytes already encoded (records that start at ``phys``, in one segment)."""
        mf = self.segments.segment_for_write(phys)
        rel = phys - mf.base
        if rel + len(data) > mf.size:
            raise StoreError(f"{mf.path}: {len(data)} bytes at {rel} cross the segment end")
        mf.write_at(rel, data)

    def write_encoded(
        self,
        encoder: native.EncodeBatch,
        lo: int,
        hi: int,
        phys: npt.NDArray[np.int64],
        queue_offsets: npt.NDArray[np.int64],
        sizes: npt.NDArray[np.int64],
        store_ts: int,
    ) -> None:
        """Encode records ``lo:hi`` of a prepared batch straight into the segment that holds
        ``phys[lo]``; they must lie in that one segment, back to back."""
        start = int(phys[lo])
        mf = self.segments.segment_for_write(start)
        rel = start - mf.base
        end = rel + int(phys[hi - 1] + sizes[hi - 1]) - start
        if end > mf.size:
            raise StoreError(f"{mf.path}: records {lo}..{hi} at {rel} cross the segment end")
        mf.reserve(end)
        encoder.encode(mf.buffer, rel, lo, hi, phys, queue_offsets, sizes, store_ts)
        mf.wrote_position = max(mf.wrote_position, end)

    def write_blank(self, phys: int) -> None:
        mf = self.segments.segment_for_write(phys)
        rel = phys - mf.base
        remaining = mf.size - rel
        mf.write_at(rel, record.SIZE_MAGIC.pack(remaining, record.BLANK_MAGIC))
        mf.wrote_position = mf.size

    def flush(self) -> None:
        self.segments.flush()

    def fence_off(self) -> int:
        """End the log where it is and go on in the next segment that has no file yet; returns
        that segment's base, the new end (rocketstore.pipeline.engine.fencing: the dead region after an unclean
        take-over). The current segment gets an END_OF_FILE blank at the end, every segment
        file after it (created ahead, empty) one at its start; all of it synced before the
        return, the new segment's name included."""
        files = self.segments.files
        end = self.max_offset
        at_boundary = locate(end, self.segment_size)[1] == 0
        if not files or (at_boundary and end >= files[-1].base + files[-1].size):
            return end  # no file reaches past the end: nothing of an old writer's can land there
        at = end
        for mf in list(files):
            if mf.base + mf.size <= at:
                continue
            rel = at - mf.base
            mf.overwrite(rel, record.SIZE_MAGIC.pack(mf.size - rel, record.BLANK_MAGIC))
            mf.sync_range(rel, rel + record.BLANK_SIZE)
            mf.wrote_position = mf.flushed_position = mf.size
            at = mf.base + mf.size
        self.segments.segment_for_write(at)
        durability.fsync_dir(self.segments.directory)
        return at

    def has_data_after(self, end: int, probe: int = 4096) -> bool:
        """Whether anything follows ``end``: a later segment file, or non-zero bytes in the
        ``probe`` bytes after it (a writer leaves zeros past its last record)."""
        files = self.segments.files
        if any(mf.base > end for mf in files):
            return True
        for mf in files:
            if mf.base <= end < mf.base + mf.size:
                rel = end - mf.base
                return any(mf.buffer[rel : min(mf.size, rel + probe)])
        return False

    def cut(self, end: int, *, keep_later: bool = False) -> int:
        """Drop everything from ``end`` on: zero the rest of its segment, delete later segments
        (with ``keep_later``, leave them as they are: :meth:`fence_off` ends each with a blank
        at its start). Returns the number of bytes cleared or removed."""
        cleared = 0
        for mf in self.segments.files:
            if mf.base > end:
                cleared += 0 if keep_later else mf.size
            elif mf.base <= end < mf.base + mf.size:
                cleared += mf.size - (end - mf.base)
                mf.wrote_position = mf.size
        self.segments.truncate(end, keep_later=keep_later)
        return cleared

    # -- reading ----------------------------------------------------------------------------
    def _locate(self, phys: int) -> tuple[MappedFile, int]:
        if phys < self.min_offset or phys >= self.max_offset:
            raise OffsetOutOfRangeError(
                f"CommitLog offset {phys} outside [{self.min_offset}, {self.max_offset})"
            )
        mf = self.segments.find(phys)
        return mf, phys - mf.base

    def read(self, phys: int, *, check_crc: bool = True) -> record.MessageExt:
        """The message at ``phys``; :class:`CorruptRecordError` if it fails its checks."""
        mf, rel = self._locate(phys)
        return native.decode_one(
            mf.buffer, rel, mf.base, path=str(mf.path), limit=mf.wrote_position, check_crc=check_crc
        )

    def read_many(self, phys: npt.NDArray[np.int64]) -> list[record.MessageExt]:
        """The messages at ``phys`` (ascending), each checked as :meth:`read` checks it, with
        one native decode per segment: a decode call costs far more than a record does."""
        out: list[record.MessageExt] = []
        phys = np.asarray(phys, dtype=np.int64)
        i = 0
        while i < len(phys):
            mf, _ = self._locate(int(phys[i]))
            j = i + int(np.searchsorted(phys[i:], mf.base + mf.size))
            if int(phys[j - 1]) >= self.max_offset:
                self._locate(int(phys[j - 1]))  # raises, naming the offset
            batch = native.decode(
                mf.buffer,
                phys[i:j] - mf.base,
                mf.base,
                path=str(mf.path),
                limit=mf.wrote_position,
            )
            out.extend(native.messages(batch))
            i = j
        return out

    def raw(self, phys: int, size: int) -> memoryview:
        """Zero-copy view of ``size`` bytes at ``phys`` (valid until the store closes)."""
        mf, rel = self._locate(phys)
        if rel + size > mf.wrote_position:
            raise CorruptRecordError(
                str(mf.path), phys, f"record of {size} bytes runs past the data"
            )
        return mf.buffer[rel : rel + size]

    def starts_record(self, phys: int) -> bool:
        """Whether a record starts at ``phys``, intact or damaged: its magic code or its
        PHYSICALOFFSET field (which holds ``phys`` itself) is there. Tells a pointer into the
        middle of a record (the pointer is wrong) from a damaged record (the log is)."""
        try:
            mf, rel = self._locate(phys)
        except OffsetOutOfRangeError:
            return False
        if rel + record.OFF_SYSFLAG > mf.wrote_position:
            return False
        buf = mf.buffer
        magic = record.INT.unpack_from(buf, rel + record.OFF_MAGIC)[0]
        field = record.LONG.unpack_from(buf, rel + record.OFF_PHYSICALOFFSET)[0]
        return bool(magic == record.MAGIC or field == phys)

    def store_timestamp(self, phys: int, size: int) -> int:
        """STORETIMESTAMP of the record at ``phys``, or -1 if it is not there."""
        try:
            mf, rel = self._locate(phys)
        except OffsetOutOfRangeError:
            return -1
        if rel + size > mf.wrote_position or size < record.FIXED_SIZE_V4:
            return -1
        return record.store_timestamp_at(mf.buffer, rel)

    def store_timestamps(
        self, phys: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """:meth:`store_timestamp` of many records at once (-1 where one is not there): a
        gather from each segment's bytes, for a page that shows the times of 40,000 queues'
        first and last messages."""
        phys = np.asarray(phys, dtype=np.int64)
        sizes = np.asarray(sizes, dtype=np.int64)
        out = np.full(len(phys), -1, dtype=np.int64)
        ok = (phys >= self.min_offset) & (phys < self.max_offset) & (sizes >= record.FIXED_SIZE_V4)
        for mf in self.segments.files:
            rows = np.flatnonzero(ok & (phys >= mf.base) & (phys < mf.base + mf.size))
            rel = phys[rows] - mf.base
            inside = rel + sizes[rows] <= mf.wrote_position
            rows, rel = rows[inside], rel[inside]
            if not len(rows):
                continue
            data = np.frombuffer(mf.buffer, dtype=np.uint8)
            flags = data[(rel + record.OFF_SYSFLAG)[:, None] + np.arange(4)].view(">i4")[:, 0]
            born = np.where(flags & record.BORNHOST_V6_FLAG, 20, 8)
            at = rel + record.OFF_BORNHOST + born
            out[rows] = data[at[:, None] + np.arange(8)].view(">i8")[:, 0]
            del data
        return out

    def walks(
        self, start: int, *, check_crc: bool, until: int | None = None
    ) -> Iterator[native.Walk]:
        """The native record walk (:func:`rocketstore.pipeline.format.native.walk`) of each segment from ``start``
        (a record boundary) to the first invalid record: one :class:`~rocketstore.pipeline.format.native.Walk` per
        segment. A blank, or a record that ends exactly at the segment's end, moves on to the
        next segment; anything else ends the walk, and the last walk's ``end`` is where. With
        ``until``, no record at or past that offset is read (the walk ends there at most)."""
        for mf in self.segments.segments_from(start):
            if until is not None and mf.base >= until:
                return
            rel = max(0, start - mf.base)
            limit = mf.size if until is None else min(mf.size, until - mf.base)
            w = native.walk(mf.buffer, rel, limit, mf.base, check_crc=check_crc)
            yield w
            if w.stop == native.STOP_INVALID or (
                w.stop == native.STOP_END and w.end != mf.base + mf.size
            ):
                return

    def walk(self, start: int, *, check_crc: bool) -> Iterator[tuple[int, int]]:
        """(physical offset, size) of each record from ``start`` to the first invalid one.

        Blanks move on to the next segment. Stops (without raising) at zeros, a bad magic, a
        bad size or a CRC mismatch: this is the scan recovery uses to find the end of the log.
        The caller learns where it stopped from the last yielded record.
        """
        for w in self.walks(start, check_crc=check_crc):
            yield from zip(w.phys.tolist(), w.sizes.tolist(), strict=True)
