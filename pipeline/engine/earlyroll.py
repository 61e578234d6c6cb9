"""Sealing in time: with the tier on, the writer ends its CommitLog segment early when the
segment's first record is older than ``tieredStoreGroupCommitTimeout`` ms, so that a reader
with only the bucket sees every record within about that long (docs/tiering.md#the-local-side).

The segment is ended as RocketMQ ends a full one: an 8-byte END_OF_FILE blank at the write
position, claiming the rest of the segment, and the next segment is created at once, where
the next record goes. Every
RocketMQ reader and broker already skips such a blank (its loader moves to the next file), so
the store stays a 4.9 store; CommitLog offsets stay file offsets, and the rest of the
segment's range is never written (the file is sparse there). The store calls :meth:`check` at
each put (before the put's records are placed), at each flush and so at close.

Owns: the blank it writes, through the store's :class:`CommitLog`; the first-record time of
the current segment (cached). Thread-safety: none; called under the store's writer lock.
Crash behaviour: the blank is written like any record, in the page cache, and made durable by
the flush that follows; a crash before that loses it with the records before it, and recovery
finds the end of the records (the next roll check writes a blank again). Requires: a writable
store, ``appender.dispatched_end`` moved past the blank by the caller's flush.
"""

from __future__ import annotations

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.appender import Appender
from rocketstore.pipeline.files.commitlog import CommitLog
from rocketstore.pipeline.files.segmentread import locate
from rocketstore.pipeline.format import native


class EarlyRoll:
    """Rolls ``commitlog`` early (see the module docstring); a no-op with the tier off."""

    def __init__(self, config: StoreConfig, commitlog: CommitLog, appender: Appender) -> None:
        self.timeout_ms = config.tiered_store_group_commit_timeout if config.tier_on else None
        self.commitlog = commitlog
        self.appender = appender
        self._first: tuple[int, int] | None = None  # (segment base, its first record's time)
        self.rolled = 0  # segments ended early, for tests and figures

    def check(self, now_ms: int) -> bool:
        """End the current segment now when its first record is too old; whether it did."""
        if self.timeout_ms is None:
            return False
        end = self.commitlog.max_offset
        base, position = locate(end, self.commitlog.segment_size)
        if position == 0:
            return False  # at a segment's start: nothing in it waits
        first = self._first_time(base)
        if first is None or now_ms - first < self.timeout_ms:
            return False
        self.commitlog.write_blank(end)
        # The next segment is created now, as a full segment's roll creates it: a recovery
        # (ours, or a stock broker's) that finds a blank in the last file ends the log at the
        # blank and would write over it, changing a segment the tier may hold already; with a
        # later file it moves on to that file's start.
        self.commitlog.segments.segment_for_write(base + self.commitlog.segment_size)
        # The blank is written and dispatched (it has no units): the next flush records the
        # segment's end, which is what makes the segment sealed for the uploader.
        self.appender.dispatched_end = base + self.commitlog.segment_size
        self.rolled += 1
        return True

    def _first_time(self, base: int) -> int | None:
        """The store time of the first record of the segment at ``base`` (None: it has none,
        as a segment that starts with a blank)."""
        if self._first is not None and self._first[0] == base:
            return self._first[1]
        mf = self.commitlog.segments.segment_for_write(base)
        walked = native.walk(mf.buffer, 0, mf.size, base, check_crc=False, max_records=1)
        if not len(walked):
            return None
        self._first = (base, int(walked.store_ts[0]))
        return self._first[1]
