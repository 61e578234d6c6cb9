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

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.errors import OffsetOutOfRangeError, SegmentGoneError, StoreError
from rocketstore.pipeline.files import durability, failpoints, visibility
from rocketstore.pipeline.files.consumequeue.bytime import offset_by_time
from rocketstore.pipeline.files.consumequeue.ends import (
    end_at,
    ends_in_file,
    scan_end,
    unit_in_file,
    valid_below,
)
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.mappedfile import MappedFile
from rocketstore.pipeline.files.mappings import MappingCache
from rocketstore.pipeline.files.segmentread import unit_index, unit_position
from rocketstore.pipeline.files.segments import SegmentQueue
from rocketstore.pipeline.layout import CQ_UNIT_SIZE, PRE_BLANK_SIZE, UNIT, UNIT_DTYPE

# Bytes of blocks reserved past what a write needs (3,276 units): a batch over a thousand queues
# reserves 64 MiB at most, where whole files would take RocketMQ's 5.7 MiB each.
RESERVE_AHEAD = 64 * 1024

Units = npt.NDArray[np.void]
# Listings a read-only view's load tries before a file gone under it is an error.
RELISTS = 16


class Peek(NamedTuple):
    """A queue's bounds (queue offsets) and its first and last units, ``(commitLogOffset,
    size)`` each (None for an empty queue); the first is the unit at ``min_offset``."""

    min_offset: int
    max_offset: int
    first: tuple[int, int] | None
    last: tuple[int, int] | None
    files: int  # the queue's files (of its directory's listing; 1 when read at once)


def make_units(offsets: npt.ArrayLike, sizes: npt.ArrayLike, tags_codes: npt.ArrayLike) -> Units:
    units = np.empty(len(np.asarray(offsets)), dtype=UNIT_DTYPE)
    units["offset"] = offsets
    units["size"] = sizes
    units["tags_code"] = tags_codes
    return units


class ConsumeQueue:
    """One queue's files, loaded when first needed.

    A store with tens of thousands of queues must not list, stat and read each of them to
    open: :meth:`defer` takes the queue's length as the last flush recorded it (what a writer
    appends after), and the directory is only listed, and the files looked at, when something
    reads or writes the queue (:attr:`segments`); a writer's queue the open did not find is
    made by its first write, with nothing to list. ``on_load`` then runs once (the store checks
    the queue against the CommitLog there and hides what a read-only view must not see), and
    ``on_dirty`` whenever the queue gets something to flush after a flush, so that a flush
    visits only the queues written since the last one.
    """

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
        on_load: Callable[[ConsumeQueue], None] | None = None,
        on_dirty: Callable[[ConsumeQueue], None] | None = None,
    ):
        self.topic = topic
        self.queue_id = queue_id
        self.name = f"{topic}/{queue_id}"  # as the progress file names it
        self._root = root
        self._directory: Path | None = None
        self.file_size = file_size
        self.units_per_file = unit_index(0, file_size)
        self.read_only = read_only
        self._segment_args = (cache, ahead, visibility_wait_ms)
        self._segments: SegmentQueue | None = None
        # The length the last flush recorded, taken as the end until the files are looked at
        # (see defer); None once loaded, or for a queue that was never deferred.
        self._recorded: int | None = None
        self.expected_length: int | None = None
        # Whether the store found the queue's directory when it opened (see defer): a writer's
        # queue it did not find may have no directory yet (see _made_here).
        self._found = False
        self._on_load = on_load
        self._on_dirty = on_dirty
        self._dirty = False
        self.min_logic_offset = 0  # byte offset of the first unit still pointing at live data
        self.max_physic_offset = -1  # end (offset + size) of the last unit's record
        # Where the units on disk ended before a rewind (rewind_after_physical), until trim.
        self._disk_end = 0

    @property
    def directory(self) -> Path:
        """``consumequeue/<topic>/<queueId>`` (made when first asked: a store that opens
        40,000 queues and writes to a few does not build 40,000 paths)."""
        d = self._directory
        if d is None:
            d = self._directory = self._root.joinpath(self.topic, str(self.queue_id))
        return d

    def _files(self) -> LocalSegments:
        """The queue's files through the read seam, not listed (for a look at one file
        without loading the queue)."""
        d = self._directory
        where = d if d is not None else f"{self._root}/{self.topic}/{self.queue_id}"
        return LocalSegments(where, segment_size=self.file_size)

    # -- loading ----------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._segments is not None

    @property
    def segments(self) -> SegmentQueue:
        """The queue's files, listed (and the queue's end found) now if they were not yet."""
        return self._loaded(write=False)

    def _for_write(self) -> SegmentQueue:
        """:attr:`segments`, for a write: a writer's queue the store did not find when it
        opened gets its directory made here instead of listed (see :meth:`_made_here`); a
        read of a queue that does not exist makes nothing."""
        return self._loaded(write=True)

    def _loaded(self, *, write: bool) -> SegmentQueue:
        seg = self._segments
        if seg is None:
            self._load(self._recorded, write=write)
            # The load's own checks may have listed the directory once more (a view meeting
            # retention): the files are the ones it ended with.
            seg = self._segments
            assert seg is not None
        return seg

    def _segment_queue(self, *, read_only: bool) -> SegmentQueue:
        cache, ahead, wait_ms = self._segment_args
        return SegmentQueue(
            self.directory,
            self.file_size,
            read_only=read_only,
            cache=cache,
            ahead=ahead,
            visibility_wait_ms=wait_ms,
            deferred=True,
        )

    def _new_segments(self) -> SegmentQueue:
        self._segments = self._segment_queue(read_only=self.read_only)
        return self._segments

    def listing(self) -> SegmentQueue:
        """The queue's files as its directory lists them now, read-only, without loading the
        queue (no end is looked for, nothing is checked, :attr:`loaded` stays as it was): for
        a scan that reads every unit itself. The caller closes it. Write positions are the
        files' sizes; only :attr:`SegmentQueue.files` is meant to be used."""
        seg = self._segment_queue(read_only=True)
        if seg.visibility_wait_ms is not None:
            visibility.forget_last_files(self.directory)
        seg.load()
        if seg.cache is not None:
            seg.cache.work.queues_listed += 1
        return seg

    def defer(self, length: int | None) -> None:
        """Load the queue when first used, taking ``length`` (the last flush's record) as its
        end as :meth:`load` does; until then :attr:`max_offset` of a writer's queue is
        ``length`` itself, and nothing of the queue's directory is read. ``expected_length``
        keeps ``length`` for the checks made when the queue loads."""
        self._found = True
        if self._segments is None:
            self._recorded = self.expected_length = length

    def load(self, length: int | None = None) -> None:
        """Load the queue now (see :meth:`_load`)."""
        if self._segments is not None:
            self._segments.close()
            self._segments = None
        self._load(length)

    def _load(self, length: int | None, *, write: bool = False) -> SegmentQueue:
        """List the files and find the end of the queue: the first invalid unit of the last file
        that has any (RocketMQ scans the last three files the same way).

        ``length`` is the queue's length as the last flush recorded it: when the unit before it
        is valid and the one at it is not, that is the end, and no file is scanned (so loading
        does not grow with the queue). A read-only view whose listing retention overtook (a
        file gone before it was read) lists the directory again, up to :data:`RELISTS` times
        (retention deletes a queue's oldest files, never its last)."""
        for _ in range(RELISTS if self.read_only else 0):
            try:
                return self._load_listed(length)
            except SegmentGoneError:
                continue
        return self._load_listed(length, write)

    def _load_listed(self, length: int | None, write: bool = False) -> SegmentQueue:
        self._recorded = None
        seg = self._new_segments()
        try:
            if self._segment_args[2] is not None:
                # A read-only view on shared storage: read the tails from the servers, not as
                # this host cached them (rocketstore.pipeline.files.visibility).
                visibility.forget_last_files(self.directory)
            if write and self._made_here(seg):
                # Nothing to list or scan: the queue is new and empty.
                if seg.cache is not None:
                    seg.cache.work.queues_made += 1
                self.min_logic_offset = 0
                if self._on_load is not None:
                    self._on_load(self)
                return seg
            if seg.cache is not None:
                seg.cache.work.queues_loaded += 1
            seg.load()
            # Most queues have one file: finding the end and the checks below read a few of
            # its units through one descriptor.
            with seg.files[-1].borrowed() if seg.files else contextlib.nullcontext():
                end = None if length is None else end_at(seg, length, self.file_size)
                if end is None:
                    known = valid_below(seg, length)  # may list the directory again
                    end = scan_end(seg.files, self.units_per_file, known)
                if end is not None:
                    self.max_physic_offset = end
                self.min_logic_offset = seg.min_offset
                if self._on_load is not None:
                    self._on_load(self)
        except BaseException:
            # Refused, or a file gone under it (retention on a live store): looked at again
            # when next used, from a new listing.
            seg.close()
            if self._segments is seg:
                self._segments, self._recorded = None, length
            raise
        return seg

    def _made_here(self, seg: SegmentQueue) -> bool:
        """Whether this load made the queue's directory, which so holds no file: a writer's
        queue the store did not find when it opened (the first batch over 40,000 new queues
        then lists none of them). Only the one writer of a store creates its files, and it
        holds the store's lock; the directories made are left to the next flush to make
        durable, as a new file's are."""
        if self.read_only or self._found:
            return False
        directory = self.directory
        parents = durability.make_dirs(directory.parent, sync=False)
        try:
            os.mkdir(directory)
        except FileExistsError:
            # Made since the open, so by this writer: by a load that failed after making it,
            # whose flush never came. Its name and its topic's are made durable with the queue.
            seg.new_dirs += [directory.parent, directory]
            return False
        seg.new_dirs += [*parents, directory]
        return True

    def units_past(self, length: int) -> bool:
        """Whether a valid unit lies at queue offset ``length`` (written after the flush that
        recorded ``length``), read with one ``pread`` and without loading the queue."""
        if self._segments is not None:
            return self.max_offset > length
        return unit_in_file(self._files(), *unit_position(length, self.file_size))

    def peek(self, min_commitlog_offset: int, log_end: int) -> Peek | None:
        """The bounds and first and last units of a read-only queue not loaded yet, as loading
        it would find them, from the length the last flush recorded and one read of its only
        file (two for a long file), without loading it; None when that does not settle them
        (the caller loads the queue). A tool that shows the bounds of 40,000 queues so costs
        40,000 small reads, not 40,000 loads.

        Settled: a queue whose recorded length fits its first file (``00000000000000000000``,
        then its only file with units), whose unit before that length is valid and the one at
        it not (as :func:`~rocketstore.pipeline.files.consumequeue.ends.end_at` checks), whose first unit
        points at a record the CommitLog still holds (as :meth:`correct_min_offset` checks) and
        whose last ends by ``log_end`` (the view's end: the writer may have appended since);
        not on shared storage, where a read-only view looks at its files as the visibility
        rule says."""
        length = self._recorded
        if (
            self._segments is not None
            or not self.read_only
            or self._segment_args[2] is not None
            or length is None
            or not 0 < length < self.units_per_file
        ):
            return None
        units = ends_in_file(self._files(), length, min_commitlog_offset)
        if units is None:
            return None
        cache = self._segment_args[0]
        if cache is not None:
            cache.work.queues_peeked += 1
        first, last = units
        if sum(last) > log_end:
            return None
        return Peek(0, length, first, last, 1)

    def ends(self, min_commitlog_offset: int, log_end: int) -> Peek:
        """The queue's bounds and first and last units: :meth:`peek`, or else the queue's own
        (loading it)."""
        peeked = None if self.loaded else self.peek(min_commitlog_offset, log_end)
        if peeked is not None:
            return peeked
        lo, hi = self.min_offset, self.max_offset
        units = self.read(lo, 1), self.read(hi - 1, 1) if hi > lo else None
        first, last = (
            (int(u["offset"][0]), int(u["size"][0])) if u is not None and len(u) else None
            for u in units
        )
        return Peek(lo, hi, first, last, len(self.segments.files))

    def correct_min_offset(self, min_commitlog_offset: int) -> None:
        """Skip leading units whose messages the CommitLog no longer holds (RocketMQ's
        ``correctMinOffset``). A read-only view whose first file retention deleted meanwhile
        forgets it (:meth:`forget_deleted_head`) and looks at the next."""
        while True:
            try:
                if self.segments.first is not None:
                    self.min_logic_offset = self.corrected_min_logic_offset(min_commitlog_offset)
                return
            except SegmentGoneError:
                if not self.forget_deleted_head():
                    raise

    def corrected_min_logic_offset(self, min_commitlog_offset: int, first_file: int = 0) -> int:
        """The min logic offset :meth:`correct_min_offset` sets, computed as if the files before
        ``files[first_file]`` were gone (retention's dry run). Changes nothing.

        RocketMQ looks at the first file only. Here leading full files whose last unit points
        below ``min_commitlog_offset`` (so every unit of theirs does) are passed over first: a
        crash between retention's deleting CommitLog segments and its deleting the queue files
        they made stale leaves several, and a min offset inside them would send a reader from
        it to the first live unit without a word (offsets skipped that a model says exist)."""
        files = self.segments.files
        while first_file < len(files) - 1:
            mf = files[first_file]
            if mf.wrote_position < mf.size:
                break
            offset, _, _ = UNIT.unpack(mf.read(mf.size - CQ_UNIT_SIZE, CQ_UNIT_SIZE))
            if offset >= min_commitlog_offset:
                break
            first_file += 1
        first = files[first_file]
        if first.wrote_position >= CQ_UNIT_SIZE:
            offset, size, _ = UNIT.unpack(first.read(0, CQ_UNIT_SIZE))
            if offset >= min_commitlog_offset and 0 < size != PRE_BLANK_SIZE:
                return first.base  # the usual case: nothing of this file was deleted
        units = self._file_units(first_file, first.wrote_position // CQ_UNIT_SIZE)
        live = np.flatnonzero(
            (units["offset"] >= min_commitlog_offset)
            & (units["size"] > 0)
            & (units["size"] != PRE_BLANK_SIZE)
        )
        if len(live):
            return first.base + int(live[0]) * CQ_UNIT_SIZE
        return first.end

    def forget_deleted_head(self) -> bool:
        """A read-only view: forget the queue's first files that retention deleted since the
        view listed them (see :meth:`SegmentQueue.forget_deleted_head`); its min offset moves
        to the first file left. Returns whether any was forgotten."""
        seg = self._segments
        if seg is None or not self.read_only:
            return False
        if seg.forget_deleted_head():
            self.min_logic_offset = max(self.min_logic_offset, seg.min_offset)
            return True
        if seg.files and not seg.exists(seg.files[0]):
            # Even the last file it listed is gone (the writer made newer ones since, and
            # retention deleted the rest): the queue is listed again when next used.
            seg.close()
            self._segments = None
            return True
        return False

    def close(self) -> None:
        if self._segments is not None:
            self._segments.close()

    def destroy(self) -> None:
        """Delete every file of this queue (to rebuild it from the CommitLog)."""
        self.segments.truncate(0)
        self.segments.close()
        self.max_physic_offset = -1
        self.min_logic_offset = 0
        self._mark_dirty()

    @property
    def recorded(self) -> int | None:
        """The length :meth:`defer` took as the end, while the queue is not loaded."""
        return self._recorded if self._segments is None else None

    def mark_dirty_again(self) -> None:
        """A flush of this queue failed: it still has something to flush (its set keeps it)."""
        self._dirty = True

    def _mark_dirty(self) -> None:
        if not self._dirty and self._on_dirty is not None:
            self._dirty = True
            self._on_dirty(self)

    def _file_units(self, i: int, count: int | None = None) -> Units:
        """The first ``count`` units (default: every unit) of file ``i``, read whole."""
        mf = self.segments.files[i]
        out = np.empty(self.units_per_file if count is None else count, dtype=UNIT_DTYPE)
        mf.read_into(0, out.view(np.uint8).data)
        return out

    # -- bounds -----------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        """Queue offset of the first readable unit."""
        if self._segments is None:
            self._load(self._recorded)
        return unit_index(self.min_logic_offset, 0)

    @property
    def max_offset(self) -> int:
        """Queue offset one past the last unit (the next unit to be written). A writer's queue
        not loaded yet ends where the last flush recorded (see :meth:`defer`)."""
        if self._segments is None and self._recorded is not None and not self.read_only:
            return self._recorded
        return unit_index(self.segments.max_offset, 0)

    def unit_location(self, queue_offset: int) -> tuple[str, int]:
        """(file, byte position in it) of a unit, for error messages."""
        base, position = unit_position(queue_offset, self.file_size)
        try:
            mf = self.segments.find(base)
        except OffsetOutOfRangeError:
            return str(self.directory), queue_offset * CQ_UNIT_SIZE
        return mf.where, position

    # -- reading ----------------------------------------------------------------------------
    def read(self, start: int, count: int) -> Units:
        """Copies of units ``[start, min(start + count, max_offset))``; empty past the end."""
        start = max(start, self.min_offset)
        stop = min(start + max(count, 0), self.max_offset)
        if stop <= start:
            return np.empty(0, dtype=UNIT_DTYPE)
        out = np.empty(stop - start, dtype=UNIT_DTYPE)
        raw = out.view(np.uint8).data
        pos = start
        while pos < stop:
            base, position = unit_position(pos, self.file_size)
            mf = self.segments.find(base)
            n = min(stop, unit_index(base, self.file_size)) - pos
            at = (pos - start) * CQ_UNIT_SIZE
            mf.read_into(position, raw[at : at + n * CQ_UNIT_SIZE])
            pos += n
        return out

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
        return offset_by_time(
            self.segments.files,
            self.min_offset,
            self.max_offset,
            timestamp,
            min_physic_offset,
            store_time,
        )

    # -- writing ----------------------------------------------------------------------------
    def append(self, start: int, units: Units) -> None:
        """Write ``units`` as queue offsets ``start, start+1, …`` (see :meth:`append_bytes`)."""
        if len(units):
            last = units[-1]
            data = np.ascontiguousarray(units).view(np.uint8).data
            self.append_bytes(start, data, int(last["offset"]) + int(last["size"]))

    def append_bytes(self, start: int, data: memoryview, record_end: int) -> None:
        """Write the units in ``data`` (20 bytes each, on-disk order) as queue offsets
        ``start, start+1, …``; ``record_end`` is where the last one's record ends.

        Units already present (``start < max_offset``, a re-dispatch) are skipped, as RocketMQ
        skips them; a gap (``start > max_offset``) in a non-empty queue is refused, because a
        consumer would read holes as the end of the queue.
        """
        failpoints.hit("consumequeue-append")
        seg = self._for_write()
        files = seg.files
        if files:
            # The usual case, kept short (a batch over 40,000 queues comes here 40,000
            # times): the units go at the end of the last file and fit it.
            last = files[-1]
            rel = start * CQ_UNIT_SIZE - last.base
            if (
                rel == last.wrote_position
                and rel + len(data) <= last.size
                and (rel > 0 or len(files) == 1 or files[-2].is_full)
            ):
                last.append_at(rel, data)
                self.max_physic_offset = record_end
                if not self._dirty:
                    self._mark_dirty()
                return
        have = self.max_offset
        if start < have:
            skip = (have - start) * CQ_UNIT_SIZE
            if skip >= len(data):
                return
            data, start = data[skip:], have
        if start > have:
            if seg.files:
                raise StoreError(
                    f"{self.directory}: unit for queue offset {start} would leave a gap after "
                    f"{have}"
                )
            self._fill_pre_blank(start)
        pos = start * CQ_UNIT_SIZE
        written = 0
        while written < len(data):
            mf = seg.segment_for_write(pos)
            rel = pos - mf.base
            n = min(len(data) - written, self.file_size - rel)
            mf.write_at(rel, data[written : written + n])
            written += n
            pos += n
        self.max_physic_offset = record_end
        if not self._dirty:
            self._mark_dirty()

    def prepare(self, start: int, count: int) -> None:
        """Create the files units ``[start, start + count)`` will go to and reserve their
        blocks (pre-blank units before a first unit past 0 included), so that :meth:`append`
        of them creates nothing and touches no page without a block. Raises ``OSError`` or
        :class:`SegmentCreateError` having written nothing."""
        end = (start + count) * CQ_UNIT_SIZE
        seg = self._for_write()
        if seg.files:
            # The usual case: the units fit the last file's blocks as they are.
            last = seg.files[-1]
            if last.base + last.wrote_position <= start * CQ_UNIT_SIZE and last.has_blocks(
                end - last.base
            ):
                return
        begin = max(start, self.max_offset) * CQ_UNIT_SIZE
        if end <= begin:
            return
        if not seg.files or seg.files[-1].base + self.file_size < end:
            self._mark_dirty()  # files created here are made durable by the next flush
        if not seg.files:
            seg.segment_for_write(begin)
        seg.prepare(end, begin)

    def tail_for(self, queue_offset: int) -> MappedFile | None:
        """The last file, if unit ``queue_offset`` is the next one and fits it as it is (the
        single-put path writes the unit there itself), else None."""
        last = self._for_write().last
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
        self._mark_dirty()

    def _fill_pre_blank(self, start: int) -> None:
        pos = start * CQ_UNIT_SIZE
        mf = self.segments.segment_for_write(pos)
        blanks = start - unit_index(mf.base, 0)
        if blanks:
            mf.write_at(
                0, make_units([0] * blanks, [PRE_BLANK_SIZE] * blanks, [0] * blanks).tobytes()
            )
        self.min_logic_offset = pos

    def resume_at(self, offset: int, below: int) -> None:
        """Make this queue, which holds no unit, end at queue offset ``offset``: the file holding
        it gets units from its start up to it that point below the CommitLog's first record
        (at ``below - 1``), as a queue's units do once retention deleted their records. No
        offset below ``offset`` is readable or handed out again, and the next unit written is
        ``offset``. Not RocketMQ's pre-blank units, which a stock broker's recovery would take
        for a record ending at 2 GiB, and stop dispatching to the queue below that."""
        if below <= 0 or self.max_offset > self.min_offset:
            raise StoreError(f"{self.directory}: cannot resume a queue that holds units")
        pos = offset * CQ_UNIT_SIZE
        mf = self.segments.segment_for_write(pos)
        n = offset - unit_index(mf.base, 0)
        if n:
            mf.write_at(0, make_units([below - 1] * n, [1] * n, [0] * n).tobytes())
        self.min_logic_offset = pos
        self.max_physic_offset = below
        self._mark_dirty()

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

    def truncate_after_physical(self, phys_end: int, *, sync: bool = True) -> int:
        """Drop units whose record does not end by ``phys_end``; returns how many were dropped.
        With ``sync`` False the zeroed bytes are made durable by :meth:`sync_truncated` (or the
        next flush) instead of now: recovery cuts thousands of queues and syncs them at once,
        before anything is written after them."""
        self.rewind_after_physical(phys_end)
        return self.trim(sync=sync)

    def rewind_after_physical(self, phys_end: int) -> None:
        """Take the queue's end back to its first unit whose record does not end by
        ``phys_end``, in memory only: the units past it stay on disk, and the next appends
        write over them, until :meth:`trim` drops what was not written again. Recovery
        dispatches the records past a crash's start point this way, so that a reader in
        another process, beside the recovery, finds the units it may already have been
        offered where they were (the same bytes, written again), never zeros in their place."""
        have = self.max_offset
        lo = self.first_past(phys_end)
        if lo >= have:
            return
        self._disk_end = max(self._disk_end, have * CQ_UNIT_SIZE)
        self.segments.set_end(lo * CQ_UNIT_SIZE)
        self._mark_dirty()
        last = self.read(lo - 1, 1) if lo > self.min_offset else None
        self.max_physic_offset = (
            int(last[0]["offset"]) + int(last[0]["size"]) if last is not None and len(last) else -1
        )

    def trim(self, *, sync: bool = True) -> int:
        """After :meth:`rewind_after_physical` and the appends that followed it: zero the units
        past the queue's end that were not written again, and delete its files past the end;
        returns how many units that dropped. ``sync``: as :meth:`truncate_after_physical`'s."""
        disk_end, self._disk_end = self._disk_end, 0
        if not disk_end:
            return 0  # nothing taken back (and a queue not loaded stays so)
        end = self.segments.max_offset
        if disk_end <= end:
            return 0
        self.segments.truncate(end, sync=sync, written_to=disk_end)
        return (disk_end - end) // CQ_UNIT_SIZE

    def hide_past(self, phys_end: int, length: int | None = None) -> None:
        """A read-only view: units whose record does not end by ``phys_end`` (the view's log
        end), and those at queue offset ``length`` and past, are not there (see
        :meth:`hide_from`). Files retention deleted since the view listed them are forgotten
        (:meth:`forget_deleted_head`) on the way."""
        while True:
            try:
                past = self.first_past(phys_end)
                self.hide_from(past if length is None else min(length, past))
                return
            except SegmentGoneError:
                if not self.forget_deleted_head():
                    raise

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
        """Make what was written and created since the last flush durable."""
        self._dirty = False
        if self._segments is not None:
            self._segments.flush()

    @property
    def truncated_unsynced(self) -> bool:
        """Whether bytes a truncation zeroed are not durable yet (see
        :meth:`truncate_after_physical`)."""
        return self._segments is not None and bool(self._segments.unsynced)

    def sync_truncated(self, *, synced: bool = False) -> None:
        """Make the bytes truncations zeroed durable now (``synced``: a sync of the whole file
        system just did)."""
        if self._segments is not None:
            self._segments.sync_truncated(synced=synced)

    def flushed_by_sync(self) -> None:
        """What :meth:`flush` would have made durable was, by a sync of the whole file system
        (:func:`rocketstore.pipeline.files.durability.syncfs`)."""
        self._dirty = False
        if self._segments is not None:
            self._segments.mark_flushed()
