"""Reading the messages of an open store in CommitLog order, each segment walked once.

For commands that export every message whatever its queue (``rocketstore dump --order
log``): where :mod:`.queueread` reads one queue after another (and so reads each segment once
per queue that has records in it), this walks the log from its first record to the end the
store fixed when it opened (a read-only view's end; the published point on shared storage),
one native walk per segment, and decodes the records that a ConsumeQueue holds: every record
but a transaction's PREPARED or ROLLBACK half (:func:`record.consume_queue_mask`, the rule
dispatch follows). Of a store whose queues were dispatched to its end (any store a writer
closed or a flush published), that is the set :mod:`.queueread` reads, in log order.

Errors: a record that does not check out before the end raises :class:`CorruptRecordError`
naming its segment and offset, and nothing of it is returned; a segment that retention deleted
after the view listed it is skipped (its records were below the new min offset, as a queue's
read skips them).

Not thread-safe beyond the store's own reading rules: call it from the thread that reads the
store.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from rocketstore.pipeline.engine import reads
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import CorruptRecordError, SegmentGoneError
from rocketstore.pipeline.format import native, record

PAGE_RECORDS = 1000


def log_batches(
    store: MessageStore, topic: str | None = None, *, page: int = PAGE_RECORDS
) -> Iterator[pa.RecordBatch]:
    """Every message a queue holds (of ``topic``), in CommitLog order, as batches of
    :func:`native.decode`'s columns (all groups), at most ``page`` messages each."""
    log = store.commitlog
    end = log.max_offset
    at = log.min_offset
    for mf in list(log.segments.segments_from(at)):
        if mf.base >= end:
            return
        # Retention may have deleted it since the view listed it (a stat of the first ones
        # listed): gone, or going, with the records below the new min offset.
        log.segments.forget_deleted_head()
        if mf.base < log.min_offset:
            continue
        try:
            buffer = mf.buffer
        except SegmentGoneError:
            if not reads.past_retention(log):
                raise
            continue
        rel = max(0, at - mf.base)
        limit = min(mf.size, end - mf.base)
        # The structure is checked here; each record kept is checked whole (CRC too) when
        # decoded, and one no queue holds is not read further, as a queue's read would not.
        w = native.walk(buffer, rel, limit, mf.base, check_crc=False)
        keep = np.flatnonzero(record.consume_queue_mask(w.sys_flags))
        if topic is not None:
            codes = [i for i, t in enumerate(w.topics) if t == topic]
            keep = keep[np.isin(w.topic_codes[keep], codes)]
        positions = w.phys[keep] - mf.base
        for i in range(0, len(positions), page):
            yield native.decode(
                buffer, positions[i : i + page], mf.base, path=str(mf.path), limit=limit
            )
        whole = w.stop == native.STOP_BLANK or w.end in (mf.base + mf.size, end)
        if w.stop == native.STOP_INVALID or not whole:
            raise CorruptRecordError(
                str(mf.path), w.end, w.reason or "the log ends here, before its end"
            )
        at = mf.base + mf.size
