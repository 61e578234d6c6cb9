"""Recovery's reading of the CommitLog: where the walk starts, where the valid records end,
and whether valid records follow that end (see :mod:`rocketstore.pipeline.engine.recovery`, which runs
these in that order).

Reads only: nothing here changes a file. Runs during open, before any put; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence

from rocketstore.pipeline.errors import OffsetOutOfRangeError
from rocketstore.pipeline.files.checkpoint import StoreCheckpoint
from rocketstore.pipeline.files.commitlog import CommitLog
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.format import native, record


def record_end(log: CommitLog, phys: int, size: int | None) -> int | None:
    """End of the record at ``phys`` if a valid record (CRC included) starts there and has
    ``size`` bytes when given."""
    try:
        mf = log.segments.find(phys)
    except OffsetOutOfRangeError:
        return None
    w = native.walk(mf.buffer, phys - mf.base, mf.size, mf.base, check_crc=True, max_records=1)
    if not len(w) or (size is not None and int(w.sizes[0]) != size):
        return None
    return phys + int(w.sizes[0])


def find_end(
    log: CommitLog, start: int, *, check_crc: bool, dead: Sequence[tuple[int, int]] = ()
) -> tuple[int, list[native.Walk]]:
    """Walk from ``start`` (a record boundary) to the first invalid record. Returns its offset
    and the walks (kept, so that re-dispatching them needs no second scan).

    A walk that meets a blank goes on in the next segment; if that holds nothing valid, the end
    is the blank's position, where RocketMQ's recovery also leaves it. A dead region ``[x, s)``
    (rocketstore.pipeline.engine.fencing) is never read: a walk that reaches ``x`` goes on at ``s`` when that
    segment exists, and otherwise ends at ``x``.
    """
    walks: list[native.Walk] = []
    at = start
    for x, s in dead:
        if s <= at:
            continue
        if x >= at:
            part = list(log.walks(at, check_crc=check_crc, until=x))
            walks += part
            end = _last_end(part, at)
            if end != x and not _blank_reaches(log, end, x):
                return end, walks
            at = x
        if not any(mf.base == s for mf in log.segments.files):
            return at, walks
        at = s
    part = list(log.walks(at, check_crc=check_crc))
    return _last_end(part, at), walks + part


def _last_end(walks: list[native.Walk], start: int) -> int:
    ends = [int(w.phys[-1] + w.sizes[-1]) for w in walks if len(w)]
    return ends[-1] if ends else start


def _blank_reaches(log: CommitLog, end: int, x: int) -> bool:
    """Whether the walk stopped at ``end`` only because an END_OF_FILE blank there sends it to a
    segment at or before ``x`` (a dead region that begins at a segment's start)."""
    try:
        mf = log.segments.find(end)
    except OffsetOutOfRangeError:
        return False
    rel = end - mf.base
    if rel + record.BLANK_SIZE > mf.size:
        return mf.base + mf.size == x
    _, magic = record.SIZE_MAGIC.unpack_from(mf.buffer, rel)
    return magic == record.BLANK_MAGIC and mf.base + mf.size == x


def resumes_after(log: CommitLog, end: int) -> int | None:
    """The offset of a whole, valid record after ``end`` that a cut at ``end`` would drop, if
    there is one in the same segment: the log is then damaged in its middle (another writer's
    bytes over this one's), not torn at its tail, and cutting would lose what follows.

    A crash leaves at most one record cut short, then zeros; a power cut loses whole pages,
    which read as zeros. So only the bytes up to the first page (from ``end``, page-aligned)
    that is all zeros are searched; a candidate must carry the magic code, its own offset as
    PHYSICALOFFSET and a matching body CRC.
    """
    try:
        mf = log.segments.find(end)
    except OffsetOutOfRangeError:
        return None
    buf = mf.buffer
    rel = end - mf.base
    stop = rel
    while stop < mf.size:
        nxt = min(mf.size, (stop // _PAGE + 1) * _PAGE)
        if not any(buf[stop:nxt]):
            break
        stop = nxt
    at = rel + 1
    while at < stop:
        hit = bytes(buf[at:stop]).find(_MAGIC_BYTES)
        if hit < 0:
            break
        cand = at + hit - 4
        at += hit + 1
        if cand <= rel or cand + record.FIXED_SIZE_V4 > mf.size:
            continue
        if len(native.walk(buf, cand, mf.size, mf.base, check_crc=True, max_records=1)):
            return mf.base + cand
    return None


_PAGE = 4096
_MAGIC_BYTES = (record.MAGIC & 0xFFFFFFFF).to_bytes(4, "big")


def third_last_start(log: CommitLog) -> int:
    """RocketMQ's normal-recovery start: the third-last segment, or an earlier one when that
    one does not begin with a record. A put that failed after its prepare step created the
    segments ahead (a full disk) leaves them empty, and a walk must not start past the end."""
    files = log.segments.files
    if not files:
        return 0
    i = max(0, len(files) - 3)
    while i > 0 and record_end(log, files[i].base, None) is None:
        i -= 1
    return files[i].base


def checkpoint_start(log: CommitLog, checkpoint: StoreCheckpoint) -> int:
    """RocketMQ's abnormal-recovery start: the newest segment whose first message was stored
    before the checkpoint's time (less 3 s of slack); the first segment if none is."""
    files = log.segments.files
    if not files:
        return 0
    limit = checkpoint.min_timestamp
    for mf in reversed(files):
        if mf.size < 8:
            continue
        size, magic = record.SIZE_MAGIC.unpack_from(mf.buffer, 0)
        if magic != record.MAGIC or size < record.FIXED_SIZE_V4 or size > mf.size:
            continue
        if 0 < record.store_timestamp_at(mf.buffer, 0) <= limit:
            return mf.base
    return files[0].base


def trusted_progress(
    log: CommitLog, progress: FlushProgress | None, dead: Sequence[tuple[int, int]]
) -> int | None:
    """The offset the progress file says everything was flushed up to, when the log bears it
    out (the record it names as the last ends exactly there) and no dead region holds it; None
    when there is no such file or it cannot be trusted.

    Retention may have deleted the segment holding that record before a newer flush point
    was recorded (a crash right after a round): everything before the log's first record was
    then flushed, and that record is where the walk starts."""
    if progress is None or not log.segments.files:
        return None
    flushed, last = progress.flushed_offset, progress.last_record_offset
    if any(x < flushed <= s or x <= last < s for x, s in dead):
        return None  # written by a writer fenced off there (rocketstore.pipeline.engine.fencing)
    if flushed == log.min_offset:
        return flushed
    if 0 <= last < flushed < log.min_offset:
        return log.min_offset
    if not (log.min_offset <= last < flushed):
        return None
    return flushed if record_end(log, last, flushed - last) == flushed else None
