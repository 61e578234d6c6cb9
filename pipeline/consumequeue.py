"""One ConsumeQueue: the per-(topic, queueId) index of a topic's messages in the CommitLog.

Files live at ``consumequeue/<topic>/<queueId>/<20-digit base byte offset>``, each
``mappedFileSizeConsumeQueue`` bytes (300 000 units by default). Unit ``i`` of the queue (its
*queue offset*) is at byte ``20 * i`` of the queue's log::

     0                               8               12                              20
    +-------------------------------+---------------+-------------------------------+
    | commitLogOffset (long)        | size (int)    | tagsCode (long)               |
    +-------------------------------+---------------+-------------------------------+

``tagsCode`` is the Java hash of the TAGS property, sign-extended (0 without tags). A unit is
valid when ``commitLogOffset >= 0`` and ``size > 0``; the first invalid unit (normally all
zeros) ends the queue. A queue whose first file starts past queue offset 0 (after retention) may
hold "pre-blank" units ``[0, Integer.MAX_VALUE, 0]`` before its first real unit, as RocketMQ
writes them.

Thread-safety: none (one writer per store). Crash behaviour: units are derived data; the
dispatcher re-creates any unit missing after a crash from the CommitLog.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline import failpoints
from rocketstore.pipeline.config import CQ_UNIT_SIZE
from rocketstore.pipeline.errors import OffsetOutOfRangeError, StoreError
from rocketstore.pipeline.mapped_file import MappedFile
from rocketstore.pipeline.mappings import MappingCache
from rocketstore.pipeline.segments import SegmentQueue

UNIT_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
UNIT = struct.Struct(">qiq")  # the same 20 bytes, for one unit
assert UNIT_DTYPE.itemsize == CQ_UNIT_SIZE
PRE_BLANK_SIZE = 0x7FFFFFFF
# Bytes of blocks reserved past what a write needs (3,276 units): a batch over a thousand queues
# reserves 64 MiB at most, where whole files would take RocketMQ's 5.7 MiB each.
RESERVE_AHEAD = 64 * 1024

Units = npt.NDArray[np.void]


def make_units(offsets: npt.ArrayLike, sizes: npt.ArrayLike, tags_codes: npt.ArrayLike) -> Units:
    units = np.empty(len(np.asarray(offsets)), dtype=UNIT_DTYPE)
    units["offset"] = offsets
    units["size"] = sizes
    units["tags_code"] = tags_codes
    return units


class ConsumeQueue:
    def __init__(
        self,
        root: Path,
        topic: str,
        queue_id: int,
        file_size: int,
        *,
        read_only: bool,
        cache: MappingCache | None = None,
        ahead: int = RESERVE_AHEAD,
        visibility_wait_ms: int | None = None,
    ):
        self.topic = topic
        self.queue_id = queue_id
        self.directory = root / topic / str(queue_id)
        self.file_size = file_size
        self.units_per_file = file_size // CQ_UNIT_SIZE
        self.segments = SegmentQueue(
            self.directory,
            file_size,
            read_only=read_only,
            cache=cache,
            ahead=ahead,
            visibility_wait_ms=visibility_wait_ms,
        )
        self.min_logic_offset = 0  # byte offset of the first unit still pointing at live data
        self.max_physic_offset = -1  # end (offset + size) of the last unit's record

    # -- loading ----------------------------------------------------------------------------
    def load(self, length: int | None = None) -> None:
        """Map the files and find the end of the queue: the first invalid unit of the last file
        that has any (RocketMQ scans the last three files the same way).

        ``length`` is the queue's length as the last flush recorded it: when the unit before it
        is valid and the one at it is not, that is the end, and no file is scanned (so a clean
        open does not grow with the queue)."""
        self.segments.load()
        if length is not None and self._end_at(length):
            return
        files = self.segments.files
        # Trailing files with no valid unit at all (pre-allocated, or emptied by a crash) do not
        # hold the end; step back to the last file that has units.
        for i in range(len(files) - 1, -1, -1):
            units = self._file_units(i)
            valid = (units["offset"] >= 0) & (units["size"] > 0)
            invalid = np.flatnonzero(~valid)
            count = int(invalid[0]) if len(invalid) else len(units)
            files[i].wrote_position = files[i].flushed_position = count * CQ_UNIT_SIZE
            if count > 0 or i == 0:
                for j in range(i + 1, len(files)):
                    files[j].wrote_position = files[j].flushed_position = 0
                if count > 0:
                    last = units[count - 1]
                    self.max_physic_offset = int(last["offset"]) + int(last["size"])
                break
        self.min_logic_offset = self.segments.min_offset

    def _end_at(self, length: int) -> bool:
        """Take ``length`` as the end if the units around it say so; False sets no position.

        A read-only view on shared storage whose listing does not reach ``length`` lists the
        directory again for the file holding it (:meth:`SegmentQueue.find`); one that stays
        unlisted leaves the queue to end where this host's files do."""
        files = self.segments.files
        pos = length * CQ_UNIT_SIZE
        if pos <= 0 or (files and pos <= files[0].base):
            return False
        try:
            mf = self.segments.find(pos - CQ_UNIT_SIZE)
        except OffsetOutOfRangeError:
            return False
        files = self.segments.files
        at = (mf.base - files[0].base) // self.file_size
        rel = pos - mf.base
        last = UNIT.unpack_from(mf.buffer, rel - CQ_UNIT_SIZE)
        if last[0] < 0 or last[1] <= 0:
            return False
        following = (
            (mf, rel)
            if rel < self.file_size
            else ((files[at + 1], 0) if at + 1 < len(files) else (None, 0))
        )
        if following[0] is not None:
            offset, size, _ = UNIT.unpack_from(following[0].buffer, following[1])
            if offset >= 0 and size > 0:
                return False
        for i, f in enumerate(files):
            f.wrote_position = f.flushed_position = f.size if i < at else rel if i == at else 0
        self.max_physic_offset = last[0] + last[1]
        self.min_logic_offset = self.segments.min_offset
        return True

    def correct_min_offset(self, min_commitlog_offset: int) -> None:
        """Skip leading units whose messages the CommitLog no longer holds (RocketMQ's
        ``correctMinOffset``)."""
        if self.segments.first is not None:
            self.min_logic_offset = self.corrected_min_logic_offset(min_commitlog_offset)

    def corrected_min_logic_offset(self, min_commitlog_offset: int, first_file: int = 0) -> int:
        """The min logic offset :meth:`correct_min_offset` sets, computed as if the files before
        ``files[first_file]`` were gone (retention's dry run). Changes nothing."""
        first = self.segments.files[first_file]
        if first.wrote_position >= CQ_UNIT_SIZE:
            offset, size, _ = UNIT.unpack_from(first.buffer, 0)
            if offset >= min_commitlog_offset and 0 < size != PRE_BLANK_SIZE:
                return first.base  # the usual case: nothing of this file was deleted
        units = self._file_units(first_file)[: first.wrote_position // CQ_UNIT_SIZE]
        live = np.flatnonzero(
            (units["offset"] >= min_commitlog_offset)
            & (units["size"] > 0)
            & (units["size"] != PRE_BLANK_SIZE)
        )
        if len(live):
            return first.base + int(live[0]) * CQ_UNIT_SIZE
        return first.end

    def close(self) -> None:
        self.segments.close()

    def destroy(self) -> None:
        """Delete every file of this queue (to rebuild it from the CommitLog)."""
        self.segments.truncate(0)
        self.segments.close()
        self.max_physic_offset = -1
        self.min_logic_offset = 0

    def _file_units(self, i: int) -> Units:
        mf = self.segments.files[i]
        return np.frombuffer(mf.buffer, dtype=UNIT_DTYPE, count=self.units_per_file)

    # -- bounds -----------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        """Queue offset of the first readable unit."""
        return self.min_logic_offset // CQ_UNIT_SIZE

    @property
    def max_offset(self) -> int:
        """Queue offset one past the last unit (the next unit to be written)."""
        return self.segments.max_offset // CQ_UNIT_SIZE

    def unit_location(self, queue_offset: int) -> tuple[str, int]:
        """(file, byte position in it) of a unit, for error messages."""
        pos = queue_offset * CQ_UNIT_SIZE
        try:
            mf = self.segments.find(pos)
        except OffsetOutOfRangeError:
            return str(self.directory), pos
        return str(mf.path), pos - mf.base

    # -- reading ----------------------------------------------------------------------------
    def read(self, start: int, count: int) -> Units:
        """Copies of units ``[start, min(start + count, max_offset))``; empty past the end."""
        start = max(start, self.min_offset)
        stop = min(start + max(count, 0), self.max_offset)
        if stop <= start:
            return np.empty(0, dtype=UNIT_DTYPE)
        parts: list[Units] = []
        pos = start
        while pos < stop:
            mf = self.segments.find(pos * CQ_UNIT_SIZE)
            first_unit = mf.base // CQ_UNIT_SIZE
            n = min(stop, first_unit + self.units_per_file) - pos
            view = np.frombuffer(
                mf.buffer, dtype=UNIT_DTYPE, count=n, offset=(pos - first_unit) * CQ_UNIT_SIZE
            )
            parts.append(view.copy())
            pos += n
        # np.concatenate would turn the big-endian fields native; the units must stay on-disk.
        return parts[0] if len(parts) == 1 else np.concatenate(parts).astype(UNIT_DTYPE)

    def offset_by_time(
        self, timestamp: int, min_physic_offset: int, store_time: Callable[[int, int], int]
    ) -> int:
        """RocketMQ's ``getOffsetInQueueByTime``.

        RocketMQ picks the first file modified at or after ``timestamp`` (else the last) and
        binary-searches it by the messages' store times: the unit whose time equals
        ``timestamp``, else the nearer neighbour (left on a tie), clamped to the file's units.
        File modification times do not survive copies, so the file is chosen by the store time
        of its last unit, which is when RocketMQ last wrote it, give or take dispatch latency.
        ``store_time(commitLogOffset, size)`` returns a message's store timestamp.
        """
        files = self.segments.files
        if not files or self.max_offset <= self.min_offset:
            return 0
        chosen = None
        for mf in files:
            if mf.wrote_position == 0:
                continue
            last_unit = np.frombuffer(
                mf.buffer, dtype=UNIT_DTYPE, count=1, offset=mf.wrote_position - CQ_UNIT_SIZE
            )[0]
            chosen = mf
            if store_time(int(last_unit["offset"]), int(last_unit["size"])) >= timestamp:
                break
        if chosen is None:
            return 0
        base_unit = chosen.base // CQ_UNIT_SIZE
        low = max(self.min_offset - base_unit, 0)
        high = chosen.wrote_position // CQ_UNIT_SIZE - 1
        units = np.frombuffer(chosen.buffer, dtype=UNIT_DTYPE, count=high + 1)
        left_off = right_off = target = -1
        left_val = right_val = -1
        while high >= low:
            mid = (low + high) // 2
            phy = int(units[mid]["offset"])
            if phy < min_physic_offset:
                low = mid + 1
                left_off = mid
                continue
            t = store_time(phy, int(units[mid]["size"]))
            if t < 0:
                return 0
            if t == timestamp:
                target = mid
                break
            if t > timestamp:
                high = mid - 1
                right_off, right_val = mid, t
            else:
                low = mid + 1
                left_off, left_val = mid, t
        if target != -1:
            found = target
        elif left_val == -1:
            found = right_off
        elif right_val == -1:
            found = left_off
        else:
            found = (
                right_off if abs(timestamp - left_val) > abs(timestamp - right_val) else left_off
            )
        return base_unit + found

    # -- writing ----------------------------------------------------------------------------
    def append(self, start: int, units: Units) -> None:
        """Write ``units`` as queue offsets ``start, start+1, …``.

        Units already present (``start < max_offset``, a re-dispatch) are skipped, as RocketMQ
        skips them; a gap (``start > max_offset``) in a non-empty queue is refused, because a
        consumer would read holes as the end of the queue.
        """
        failpoints.hit("consumequeue-append")
        have = self.max_offset
        if start < have:
            skip = have - start
            if skip >= len(units):
                return
            units, start = units[skip:], have
        if start > have:
            if self.segments.files:
                raise StoreError(
                    f"{self.directory}: unit for queue offset {start} would leave a gap after "
                    f"{have}"
                )
            self._fill_pre_blank(start)
        data = np.ascontiguousarray(units).view(np.uint8).data
        pos = start * CQ_UNIT_SIZE
        written = 0
        while written < len(data):
            mf = self.segments.segment_for_write(pos)
            rel = pos - mf.base
            n = min(len(data) - written, self.file_size - rel)
            mf.write_at(rel, memoryview(data)[written : written + n])
            written += n
            pos += n
        if len(units):
            self.max_physic_offset = int(units[-1]["offset"]) + int(units[-1]["size"])

    def prepare(self, start: int, count: int) -> None:
        """Create the files units ``[start, start + count)`` will go to and reserve their
        blocks (pre-blank units before a first unit past 0 included), so that :meth:`append`
        of them creates nothing and touches no page without a block. Raises ``OSError`` or
        :class:`SegmentCreateError` having written nothing."""
        end = (start + count) * CQ_UNIT_SIZE
        begin = max(start, self.max_offset) * CQ_UNIT_SIZE
        if end <= begin:
            return
        if not self.segments.files:
            self.segments.segment_for_write(begin)
        self.segments.prepare(end, begin)

    def tail_for(self, queue_offset: int) -> MappedFile | None:
        """The last file, if unit ``queue_offset`` is the next one and fits it as it is (the
        single-put path writes the unit there itself), else None."""
        last = self.segments.last
        if (
            last is None
            or last.base + last.wrote_position != queue_offset * CQ_UNIT_SIZE
            or last.wrote_position + CQ_UNIT_SIZE > last.size
        ):
            return None
        return last

    def appended_one(self, last: MappedFile, record_end: int) -> None:
        """Take note of one unit written at the end of ``last`` (see :meth:`tail_for`) for the
        record ending at CommitLog offset ``record_end``."""
        last.wrote_position += CQ_UNIT_SIZE
        self.max_physic_offset = record_end

    def _fill_pre_blank(self, start: int) -> None:
        pos = start * CQ_UNIT_SIZE
        mf = self.segments.segment_for_write(pos)
        blanks = (pos - mf.base) // CQ_UNIT_SIZE
        if blanks:
            mf.write_at(
                0, make_units([0] * blanks, [PRE_BLANK_SIZE] * blanks, [0] * blanks).tobytes()
            )
        self.min_logic_offset = pos

    def first_past(self, phys_end: int) -> int:
        """The first queue offset whose record does not end by ``phys_end`` (the end of the
        queue if every record does)."""
        lo, hi = self.min_offset, self.max_offset
        if hi > lo:
            last = self.read(hi - 1, 1)[0]
            if int(last["offset"]) + int(last["size"]) <= phys_end:
                return hi  # the usual case on open: the queue ends before the cut
        # Units are in CommitLog order, so the ones past it are a suffix: binary search it.
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.read(mid, 1)[0]
            if int(u["offset"]) + int(u["size"]) <= phys_end:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def truncate_after_physical(self, phys_end: int) -> int:
        """Drop units whose record does not end by ``phys_end``; returns how many were dropped."""
        have = self.max_offset
        lo = self.first_past(phys_end)
        if lo >= have:
            return 0
        self.segments.truncate(lo * CQ_UNIT_SIZE)
        last = self.read(lo - 1, 1) if lo > self.min_offset else None
        self.max_physic_offset = (
            int(last[0]["offset"]) + int(last[0]["size"]) if last is not None and len(last) else -1
        )
        return have - lo

    def hide_from(self, length: int) -> None:
        """A read-only view: units at queue offset ``length`` and past are not there (nothing
        on disk changes). For what a writer on another host has not published yet."""
        if length >= self.max_offset:
            return
        length = max(length, self.min_offset)
        self.segments.set_end(length * CQ_UNIT_SIZE)
        last = self.read(length - 1, 1) if length > self.min_offset else None
        self.max_physic_offset = (
            int(last[0]["offset"]) + int(last[0]["size"]) if last is not None and len(last) else -1
        )

    def flush(self) -> None:
        self.segments.flush()
