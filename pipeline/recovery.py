"""Finding the true end of a store's data when it is opened, and making the derived files agree.

On every open the CommitLog's end is found by walking records (magic, size, CRC) from a point
known to be good, and the ConsumeQueues and index are brought in line with it:

1. Start point. The newest record the ConsumeQueues or the index point at is checked (its magic
   and size must match); if it holds, the walk starts right after it, so a cleanly closed store
   reopens after checking only its last records. Otherwise the walk starts at the third-last
   segment, as RocketMQ's normal recovery does.
2. The walk stops at the first record that fails a check: that is the end.
3. Units and index entries past the end are dropped (writable opens only); records after the
   newest dispatched one are dispatched again.

Scope: this covers clean shutdowns and a writer that stopped between a CommitLog write and its
dispatch. Abnormal-shutdown recovery from the checkpoint, torn pre-allocated segments and
damaged ConsumeQueue/index files are handled by the durability work (see the module
``docs`` in README, "Recovery"); a store left with an ``abort`` file is opened with the same
steps, which is safe but not yet RocketMQ's full abnormal procedure.

Runs on the store's writer, during open, before any put; not thread-safe.
"""

from __future__ import annotations

import dataclasses

from pipeline import record
from pipeline.commitlog import CommitLog
from pipeline.consumequeue import ConsumeQueue
from pipeline.errors import CorruptRecordError, OffsetOutOfRangeError
from pipeline.index_service import IndexService


@dataclasses.dataclass
class RecoveryReport:
    abort_file_found: bool = False
    scan_start: int = 0
    commitlog_end: int = 0
    bytes_truncated: int = 0
    units_dropped: int = 0
    redispatch_from: int = 0
    records_redispatched: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "abortFileFound": self.abort_file_found,
            "scanStart": self.scan_start,
            "commitLogEnd": self.commitlog_end,
            "bytesTruncated": self.bytes_truncated,
            "unitsDropped": self.units_dropped,
            "redispatchFrom": self.redispatch_from,
            "recordsRedispatched": self.records_redispatched,
        }


def _record_end(log: CommitLog, phys: int, size: int | None) -> int | None:
    """End of the record at ``phys`` if a record really starts there (and has ``size``)."""
    try:
        mf = log.segments.find(phys)
    except OffsetOutOfRangeError:
        return None
    rel = phys - mf.base
    if rel + 8 > mf.size:
        return None
    total, magic = record.SIZE_MAGIC.unpack_from(mf.buffer, rel)
    if magic != record.MAGIC or (size is not None and total != size) or rel + total > mf.size:
        return None
    try:
        record.decode_record(
            mf.buffer,
            rel,
            path=str(mf.path),
            phys=phys,
            limit=mf.size,
            check_crc=True,
            with_body=False,
        )
    except CorruptRecordError:
        return None
    return phys + int(total)


def dispatched_end(log: CommitLog, queues: list[ConsumeQueue], index: IndexService | None) -> int:
    """Physical offset just past the newest record the derived files know about, verified
    against the CommitLog; the CommitLog's min offset when they know none."""
    best = log.min_offset
    for cq in queues:
        if cq.max_offset > cq.min_offset:
            last = cq.read(cq.max_offset - 1, 1)
            if len(last):
                end = _record_end(log, int(last[0]["offset"]), int(last[0]["size"]))
                if end is not None:
                    best = max(best, end)
    if index is not None and index.files and index.files[-1].entry_count > 0:
        end = _record_end(log, index.end_phy_offset, None)
        if end is not None:
            best = max(best, end)
    return best


def find_end(log: CommitLog, start: int, *, check_crc: bool) -> int:
    """Walk from ``start`` (a record boundary) to the first invalid record; returns its offset."""
    end = start
    for phys, size in log.walk(start, check_crc=check_crc):
        end = phys + size
    # A walk that ended on a blank continues at the next segment; `end` then sits at the blank.
    # If the segment after the blank holds nothing valid, the end is the blank's position, which
    # is where RocketMQ's recovery also leaves it.
    return end


def third_last_start(log: CommitLog) -> int:
    files = log.segments.files
    if not files:
        return 0
    return files[max(0, len(files) - 3)].base
