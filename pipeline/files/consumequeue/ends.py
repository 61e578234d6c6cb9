"""Where a ConsumeQueue's units end, found from its files when the queue loads.

A queue's end is not stored anywhere: it is the first invalid unit (``commitLogOffset < 0`` or
``size <= 0``; normally all zeros) of the last file that holds any, as RocketMQ finds it. The
last flush's record of the queue's length (:mod:`rocketstore.pipeline.files.progress`) usually
settles it with one look at two units (:func:`end_at`); otherwise the files are scanned
(:func:`scan_end`), from the recorded length when the units below it are valid
(:func:`valid_below`).

Without loading the queue, :func:`ends_in_file` and :func:`unit_in_file` look at the units
around a recorded length with a read or two through the read seam
(:mod:`rocketstore.pipeline.files.segmentread`; a tool that shows 40,000 queues must not load
them all).

:func:`end_at` and :func:`scan_end` set the write and flush positions of the queue's files to
the end they find and return the end of the last unit's record (``commitLogOffset + size``),
which the queue keeps as its ``max_physic_offset``. Used by
:class:`~rocketstore.pipeline.files.consumequeue.queue.ConsumeQueue`; they read the queue's files and write
nothing to them; not thread-safe (the queue's files belong to one owner).
"""

from __future__ import annotations

import numpy as np

from rocketstore.pipeline.errors import OffsetOutOfRangeError, SegmentGoneError, StoreError
from rocketstore.pipeline.files.mappedfile import MappedFile
from rocketstore.pipeline.files.segmentread import SegmentDir, unit_index, unit_position
from rocketstore.pipeline.files.segments import SegmentQueue
from rocketstore.pipeline.layout import CQ_UNIT_SIZE, PRE_BLANK_SIZE, UNIT, UNIT_DTYPE

# Units a scan for a queue's end reads first, and at most at once (it reads 4 times more each
# time): a queue of a few units costs one small read, a full file a few large ones.
_SCAN_FIRST = 256
_SCAN_MOST = 64 * 1024
# Bytes from a file's start read at once by ends_in_file (else two reads).
PEEK_BYTES = 4096


def valid_unit(unit: tuple[int, int, int]) -> bool:
    return unit[0] >= 0 and unit[1] > 0


def scan_end(files: list[MappedFile], units_per_file: int, known: int = 0) -> int | None:
    """Find the end by reading units: the first invalid unit of the last file whose first
    unit is valid (trailing files that have none, pre-allocated or emptied by a crash, do
    not hold the end). Units below ``known`` are known to be valid (what the last flush
    recorded): the scan starts there. It reads forward in growing chunks and stops at the
    first invalid unit, so it costs what the queue holds past ``known``, not its files'
    capacity. Returns the end of the last unit's record, None for a queue with no unit."""
    i = len(files) - 1
    while i > 0 and not valid_unit(UNIT.unpack(files[i].read(0, CQ_UNIT_SIZE))):
        i -= 1
    for j in range(i + 1, len(files)):
        files[j].wrote_position = files[j].flushed_position = 0
    if not files:
        return None
    mf = files[i]
    per_file = units_per_file
    k = min(per_file, max(0, known - unit_index(mf.base, 0)))
    count, chunk = per_file, _SCAN_FIRST
    while k < per_file:
        n = min(chunk, per_file - k)
        units = np.empty(n, dtype=UNIT_DTYPE)
        mf.read_into(k * CQ_UNIT_SIZE, units.view(np.uint8).data)
        invalid = np.flatnonzero((units["offset"] < 0) | (units["size"] <= 0))
        if len(invalid):
            count = k + int(invalid[0])
            break
        k, chunk = k + n, min(chunk * 4, _SCAN_MOST)
    mf.wrote_position = mf.flushed_position = count * CQ_UNIT_SIZE
    if count > 0:
        offset, size, _ = UNIT.unpack(mf.read((count - 1) * CQ_UNIT_SIZE, CQ_UNIT_SIZE))
        return int(offset + size)
    return None


def end_at(seg: SegmentQueue, length: int, file_size: int) -> int | None:
    """Take ``length`` as the end if the units around it say so, returning the end of the last
    unit's record; None sets no position.

    A read-only view on shared storage whose listing does not reach ``length`` lists the
    directory again for the file holding it (:meth:`SegmentQueue.find`); one that stays
    unlisted leaves the queue to end where this host's files do."""
    files = seg.files
    if length <= 0 or (files and length <= unit_index(files[0].base, 0)):
        return None
    base, position = unit_position(length - 1, file_size)
    try:
        mf = seg.find(base)
    except OffsetOutOfRangeError:
        return None
    files = seg.files
    at = seg.index_of(base)
    rel = position + CQ_UNIT_SIZE  # where the file's units end
    if rel < file_size:
        # The last unit and the one after it, in one read.
        pair = mf.read(position, 2 * CQ_UNIT_SIZE)
        last = UNIT.unpack_from(pair, 0)
        following: tuple[int, int, int] | None = UNIT.unpack_from(pair, CQ_UNIT_SIZE)
    else:
        last = UNIT.unpack(mf.read(position, CQ_UNIT_SIZE))
        after = files[at + 1] if at + 1 < len(files) else None
        following = UNIT.unpack(after.read(0, CQ_UNIT_SIZE)) if after is not None else None
    if last[0] < 0 or last[1] <= 0:
        return None
    if following is not None and following[0] >= 0 and following[1] > 0:
        return None
    for i, f in enumerate(files):
        f.wrote_position = f.flushed_position = f.size if i < at else rel if i == at else 0
    return int(last[0] + last[1])


def valid_below(seg: SegmentQueue, length: int | None) -> int:
    """``length`` when the unit before it is valid (the queue holds at least what the last
    flush recorded: a scan for its end may start there), else 0."""
    if not length:
        return 0
    base, position = unit_position(length - 1, seg.segment_size)
    try:
        mf = seg.find(base)
    except OffsetOutOfRangeError:
        return 0
    return length if valid_unit(UNIT.unpack(mf.read(position, CQ_UNIT_SIZE))) else 0


def unit_in_file(files: SegmentDir, base: int, position: int) -> bool:
    """Whether a valid unit lies at byte ``position`` of the queue's file at ``base`` (one
    read; a missing file holds none)."""
    try:
        raw = files.read(base, position, CQ_UNIT_SIZE)
    except SegmentGoneError:
        return False
    return valid_unit(UNIT.unpack(raw))


def ends_in_file(
    files: SegmentDir, length: int, min_commitlog_offset: int
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The first and last units, ``(commitLogOffset, size)`` each, of a queue of ``length``
    units held by its first file (base 0), read with one read (two for a long file); None
    unless the file is there with its full size (``files`` checks it), the unit before
    ``length`` is valid and the one at it not (as :func:`end_at` checks), and the first unit
    points at a record at or past ``min_commitlog_offset`` that is no pre-blank."""
    end = (length + 1) * CQ_UNIT_SIZE
    try:
        if end <= PEEK_BYTES:
            raw = files.read(0, 0, end)
            first, pair = raw[:CQ_UNIT_SIZE], raw[-2 * CQ_UNIT_SIZE :]
        else:
            first = files.read(0, 0, CQ_UNIT_SIZE)
            pair = files.read(0, end - 2 * CQ_UNIT_SIZE, 2 * CQ_UNIT_SIZE)
    except StoreError:
        return None  # gone, or not of its full size: loading it says what is wrong
    last_offset, last_size, _ = UNIT.unpack_from(pair, 0)
    next_offset, next_size, _ = UNIT.unpack_from(pair, CQ_UNIT_SIZE)
    offset, size, _ = UNIT.unpack(first)
    if (
        last_offset < 0
        or last_size <= 0
        or (next_offset >= 0 and next_size > 0)
        or offset < min_commitlog_offset
        or not 0 < size != PRE_BLANK_SIZE
    ):
        return None
    return (offset, size), (last_offset, last_size)
