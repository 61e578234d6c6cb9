"""Reading a partition's queue range from the tier (sealed segments in an S3 bucket,
docs/tiering.md) into Arrow record batches: the tier's twin of
:func:`rocketstore.source.read.read_queue_range`, with the same output for the same messages.

A partition reads, chunk by chunk:

1. the queue's units ``[start, end)`` from the segment indexes
   (:class:`rocketstore.pipeline.tier.remote.RemoteQueue`: one ranged GET of units per
   segment, the index heads fetched once; a partition of one segment's ranges asks for all
   its queues' units at once, :meth:`RemoteSegments.units_of`, one GET for rows side by side);
2. drops the units whose tags code is not a subscribed tag's hash (no record read for them);
3. fetches the records the rest name with ranged GETs of the CommitLog objects, records close
   together sharing one (:meth:`RemoteSegments.read_records`), so that one queue among many
   costs little more than its own bytes; decodes them with the native decoder (every record
   checked, CRC included; each range's records of a GET decoded apart, so no batch is
   regrouped afterwards) and checks each is its unit's;
4. builds the batches as the local read does (:class:`rocketstore.source.read.BatchBuilder`).

Offsets the tier's own retention removed (below its first segment, or a segment removed while
the partition read) are data loss, reported as the local read reports it
(``failOnDataLoss``). A range past what the tier holds is the planner's error.

Thread-safety: none; each partition read makes its own :class:`RemoteSegments`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import OffsetOutOfRangeError, SegmentGoneError
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.segmentread import locate
from rocketstore.pipeline.format import native
from rocketstore.pipeline.format.segmentindex import UNIT_DTYPE, UNIT_SIZE
from rocketstore.pipeline.tier.remote import RemoteQueue, RemoteSegments
from rocketstore.source.planning import KeyRange, QueueRange
from rocketstore.source.read import (
    BatchBuilder,
    ReadContext,
    check_owner,
    key_matches,
    one_batch,
    read_key,
    read_queue_range,
    report_lost,
)
from rocketstore.source.tiers import tier_segments


def read_range(rng: QueueRange, ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """One partition's queue range from where the planner found it: the broker directory,
    or the tier (``rng.cold``); a directory's offsets that retention deleted after planning
    are read from the tier, which was given every segment before retention could delete it."""
    if not rng.tier:
        yield from read_queue_range(rng, ctx)
        return
    config = ctx.config or StoreConfig()

    def from_tier(part: QueueRange) -> Iterator[pa.RecordBatch]:
        return read_tier_range(part, ctx, tier_segments(config, rng.tier))

    if rng.cold:
        yield from from_tier(rng)
    else:
        yield from read_queue_range(rng, ctx, from_tier)


def read_ranges(ranges: Sequence[QueueRange], ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """A partition's queue ranges: the tier's ranges of one segment together
    (:func:`read_tier_segment`: the planner put them side by side), the others one by one."""
    i = 0
    while i < len(ranges):
        rng = ranges[i]
        j = i + 1
        if rng.cold:
            same = (rng.broker, rng.tier, rng.segment)
            while (
                j < len(ranges)
                and ranges[j].cold
                and ((ranges[j].broker, ranges[j].tier, ranges[j].segment) == same)
            ):
                j += 1
        if rng.cold and rng.segment >= 0:
            tier = tier_segments(ctx.config or StoreConfig(), rng.tier)
            yield from read_tier_segment(ranges[i:j], ctx, tier)
        else:
            for one in ranges[i:j]:
                yield from read_range(one, ctx)
        i = j


def read_tier_segment(
    pieces: Sequence[QueueRange], ctx: ReadContext, tier: RemoteSegments
) -> Iterator[pa.RecordBatch]:
    """Queue ranges of one segment of the tier (``segment``), of one broker: the units of
    each from the segment's index, then the records they all name in one pass over the object
    in CommitLog order (records close together share a GET, so a segment whose queues are
    interleaved is fetched about once, not once per queue), each record decoded, checked to be
    its unit's, and handed to its range's batches. Offsets the tier's retention removed are
    data loss, as in :func:`read_tier_range`."""
    base = pieces[0].segment
    index = tier.index(base)
    sub = ctx.subscription
    phys_parts, size_parts, offset_parts, owner_parts = [], [], [], []
    rows = [index.row(rng.topic, rng.queue_id) for rng in pieces]
    asks = [(row, rng.start, rng.end) for row, rng in zip(rows, pieces, strict=True) if row]
    found = iter(tier.units_of(base, asks))
    for k, (rng, row) in enumerate(zip(pieces, rows, strict=True)):
        units = next(found) if row is not None else np.empty(0, dtype=UNIT_DTYPE)
        if len(units) != rng.count:
            raise OffsetOutOfRangeError(
                f"{tier.location}: {rng.topic}/{rng.queue_id} offsets [{rng.start}, {rng.end}) "
                f"were planned from segment {base} of the tier, which holds "
                f"{len(units)} of them"
            )
        want = sub.hash_filter(units["tags_code"].astype(np.int64))
        phys_parts.append(units["offset"].astype(np.int64)[want])
        size_parts.append(units["size"].astype(np.int64)[want])
        offset_parts.append(np.arange(rng.start, rng.end, dtype=np.int64)[want])
        owner_parts.append(np.full(int(want.sum()), k, dtype=np.int64))
    phys = np.concatenate(phys_parts)
    order = np.argsort(phys, kind="stable")
    phys, sizes = phys[order], np.concatenate(size_parts)[order]
    offsets, owners = np.concatenate(offset_parts)[order], np.concatenate(owner_parts)[order]
    rel = phys - base
    builder = BatchBuilder(ctx, pieces[0].broker, lambda _phys: tier.where(base))
    read_to = [rng.start for rng in pieces]  # per range: below this, handed out

    def unit_at(k: int) -> Callable[[int], tuple[str, int]]:
        row = index.row(pieces[k].topic, pieces[k].queue_id)
        return lambda i: (
            index.where,
            0 if row is None else row.start + UNIT_SIZE * (i - row.first),
        )

    try:
        for start, raw, run in tier.read_records(base, rel, sizes):
            # Each range's records of the run decoded on their own (in CommitLog order): the
            # decoder makes each range's batch directly, where decoding the run at once and
            # grouping its rows by range afterwards copied every record a second time.
            # Grouped with one stable sort (a radix sort for 16-bit keys), not a mask a range:
            # a segment's partition may hold thousands of ranges.
            mine = owners[run].astype(np.uint16 if len(pieces) <= 1 << 16 else np.int64)
            order = np.argsort(mine, kind="stable")
            cuts = np.flatnonzero(np.diff(mine[order])) + 1
            for idx in np.split(run[order], cuts):
                k = int(owners[idx[0]])
                part = _decode_run(tier, base, start, raw, rel[idx], sizes[idx], ctx)
                at = offsets[idx]
                check_owner(part, pieces[k], at, unit_at(k))
                read_to[k] = int(at[-1]) + 1
                batch = builder.build(part, pieces[k].topic)
                if batch is not None:
                    yield batch
    except SegmentGoneError:
        for k, rng in enumerate(pieces):
            if read_to[k] < rng.end:
                why = "the tier's retention removed its segment"
                report_lost(ctx, rng, [(read_to[k], rng.end, why)])


def read_part(part: KeyRange | Sequence[QueueRange], ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """One partition as :meth:`Planner.batch_parts` plans them: a key look-up or queue ranges."""
    if isinstance(part, KeyRange):
        return read_key_range(part, ctx)
    return read_ranges(part, ctx)


def read_key_range(kr: KeyRange, ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """One broker's messages with the key ``kr.key`` (:func:`read_key`), across both tiers:
    those below the broker directory's first segment from the tier, the rest from the
    directory's IndexFiles; in CommitLog order."""
    if not kr.tier:
        yield from read_key(kr, ctx)
        return
    tier = tier_segments(ctx.config or StoreConfig(), kr.tier)
    local = Path(kr.broker_path)
    listed = LocalSegments(local / "commitlog").listed() if local.is_dir() else []
    below = listed[0] if listed else tier.end()
    yield from _tier_key(kr, ctx, tier, below)
    if listed:
        yield from read_key(kr, ctx)


def _tier_key(
    kr: KeyRange, ctx: ReadContext, tier: RemoteSegments, below: int
) -> Iterator[pa.RecordBatch]:
    """The tier's messages with the key, stored below CommitLog offset ``below``: every
    candidate record read, decoded with every check, and matched (a collision is no hit)."""
    columns = ctx.columns | native.Columns.KEYS | native.Columns.UNIQ_KEY
    parts: list[pa.RecordBatch] = []
    found = tier.key_candidates(kr.topic, kr.key, begin=kr.begin, end=kr.end, before=below)
    for entry, phys in found:
        raw = tier.record_bytes(entry, phys)
        recs = native.decode(
            raw, np.zeros(1, np.int64), phys, path=tier.where(entry.base), columns=columns
        )
        parts.append(recs.filter(key_matches(recs, kr)))
    if not parts:
        return
    size = tier.file_size()
    builder = BatchBuilder(ctx, kr.broker, lambda phys: tier.where(locate(phys, size)[0]))
    batch = builder.build(one_batch(parts[::-1]), kr.topic)  # oldest first
    if batch is not None:
        yield batch


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
                    recs = _decode_run(tier, base, start, raw, rel[at], sizes[at], ctx)
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


def _decode_run(
    tier: RemoteSegments,
    base: int,
    start: int,
    raw: bytes,
    rel: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    ctx: ReadContext,
) -> pa.RecordBatch:
    """The records at positions ``rel`` of segment ``base`` from ``raw``, the object's bytes
    from ``start`` (one GET of :meth:`RemoteSegments.read_records`), decoded with every
    check."""
    return native.decode(
        raw, rel - start, base + start, path=tier.where(base), sizes=sizes, columns=ctx.columns
    )
