"""Reading a partition's queue range from the tier (sealed segments in an S3 bucket,
docs/tiering.md) into Arrow record batches: the tier's twin of
:func:`rocketstore.source.read.read_queue_range`, with the same output for the same messages.

A partition reads, chunk by chunk:

1. the queue's units ``[start, end)`` from the segment indexes
   (:class:`rocketstore.pipeline.tier.remote.RemoteQueue`: one ranged GET of units per
   segment, the index heads fetched once);
2. drops the units whose tags code is not a subscribed tag's hash (no record read for them);
3. fetches the records the rest name with ranged GETs of the CommitLog objects, records close
   together sharing one (:meth:`RemoteSegments.read_records`), so that one queue among many
   costs little more than its own bytes; decodes them with the native decoder (every record
   checked, CRC included) and checks each is its unit's;
4. builds the batches as the local read does (:class:`rocketstore.source.read.BatchBuilder`).

Offsets the tier's own retention removed (below its first segment, or a segment removed while
the partition read) are data loss, reported as the local read reports it
(``failOnDataLoss``). A range past what the tier holds is the planner's error.

Thread-safety: none; each partition read makes its own :class:`RemoteSegments`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from rocketstore.pipeline.errors import OffsetOutOfRangeError, SegmentGoneError
from rocketstore.pipeline.files.segmentread import locate
from rocketstore.pipeline.format import native
from rocketstore.pipeline.format.segmentindex import UNIT_SIZE
from rocketstore.pipeline.tier.remote import RemoteQueue, RemoteSegments
from rocketstore.source.planning import QueueRange
from rocketstore.source.read import BatchBuilder, ReadContext, check_owner, one_batch, report_lost


def read_tier_range(
    rng: QueueRange, ctx: ReadContext, tier: RemoteSegments
) -> Iterator[pa.RecordBatch]:
    """The messages of one partition whose offsets the tier holds (see the module docstring)."""
    queue = RemoteQueue(tier, rng.topic, rng.queue_id)
    size = tier.file_size()
    builder = BatchBuilder(ctx, rng.broker, lambda phys: tier.where(locate(phys, size)[0]))

    def unit_at(i: int) -> tuple[str, int]:
        found = queue.locate(i)
        if found is None:
            return tier.location, i
        base, row = found
        return tier.index(base).where, row.start + UNIT_SIZE * (i - row.first)

    pos = rng.start
    first = queue.min_offset()
    if first is None or first > pos:
        to = rng.end if first is None else min(first, rng.end)
        report_lost(ctx, rng, [(pos, to, "the tier's retention removed its segment")])
        pos = to
    while pos < rng.end:
        stop = min(rng.end, pos + ctx.chunk_units)
        units = queue.units(pos, stop)
        if len(units) != stop - pos:
            raise OffsetOutOfRangeError(
                f"{tier.location}: {rng.topic}/{rng.queue_id} offsets [{pos + len(units)}, "
                f"{stop}) were planned from the tier, which holds the queue up to "
                f"{queue.max_offset()}"
            )
        offsets = np.arange(pos, stop, dtype=np.int64)
        want = ctx.subscription.hash_filter(units["tags_code"].astype(np.int64))
        phys = units["offset"].astype(np.int64)[want]
        sizes = units["size"].astype(np.int64)[want]
        offsets = offsets[want]
        parts: list[pa.RecordBatch] = []
        bases, rel = locate(phys, size)
        for idx in np.split(np.arange(len(phys)), np.flatnonzero(np.diff(bases)) + 1):
            if not len(idx):
                continue
            base = int(bases[idx[0]])
            try:
                for start, raw, run in tier.read_records(base, rel[idx], sizes[idx]):
                    at = idx[run]
                    recs = native.decode(
                        raw,
                        rel[at] - start,
                        base + start,
                        path=tier.where(base),
                        sizes=sizes[at],
                        columns=ctx.columns,
                    )
                    check_owner(recs, rng, offsets[at], unit_at)
                    parts.append(recs)
            except SegmentGoneError:
                lost = offsets[idx]
                report_lost(
                    ctx,
                    rng,
                    [(int(lost[0]), int(lost[-1]) + 1, "the tier's retention removed its segment")],
                )
        if parts:
            batch = builder.build(one_batch(parts), rng.topic)
            if batch is not None:
                yield batch
        pos = stop
