"""Reading whole ConsumeQueues of an open store in bulk, through the native decoder.

For commands that read every message of a queue (``rocketstore dump``): the units are read a
page at a time and the records they point at decoded segment by segment in one native call
each (:func:`rocketstore.pipeline.format.native.decode`), instead of one :func:`rocketstore.pipeline.format.record.decode_record`
per message. What a reader gets is what :meth:`MessageStore.get_messages` gives without a
subscription: units whose record retention deleted are skipped; a unit that points where no
record starts, or at another queue's record, is reported against the ConsumeQueue file or the
CommitLog as there; a damaged record raises :class:`CorruptRecordError` naming its segment
and offset, and is never returned.

Not thread-safe beyond the store's own reading rules: call it from the thread that reads the
store.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from rocketstore.pipeline.engine import reads
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import (
    CorruptRecordError,
    NotVisibleError,
    OffsetOutOfRangeError,
    SegmentGoneError,
)
from rocketstore.pipeline.format import native

PAGE_UNITS = 1000


def queue_batches(
    store: MessageStore, topic: str, queue_id: int, *, page: int = PAGE_UNITS
) -> Iterator[pa.RecordBatch]:
    """Every message of one queue, in queue order, as batches of :func:`native.decode`'s
    columns (all groups), at most ``page`` messages each."""
    offset = store.min_offset(topic, queue_id)
    end = store.max_offset(topic, queue_id)
    while offset < end:
        try:
            parts, after = _page(store, topic, queue_id, offset, min(page, end - offset))
        except SegmentGoneError:
            # Retention deleted a file after the view listed it: what it held is skipped as
            # what retention deleted before (reads.past_retention), and the page read again.
            if not reads.past_retention(store.commitlog, store.queues.get((topic, queue_id))):
                raise
            offset = max(offset, store.min_offset(topic, queue_id))
            continue
        if not after:
            break
        if parts:
            yield pa.concat_batches(parts)
        offset = after


def _page(
    store: MessageStore, topic: str, queue_id: int, offset: int, count: int
) -> tuple[list[pa.RecordBatch], int]:
    """The batches of up to ``count`` units from ``offset``, and the queue offset after the
    last unit read (0 when none was)."""
    units = store.read_units(topic, queue_id, offset, count)
    if not len(units):
        return [], 0
    # A view that met retention's deletions reads from the min offset they moved it to.
    offset = max(offset, store.min_offset(topic, queue_id))
    queue_offsets = np.arange(offset, offset + len(units), dtype=np.int64)
    phys = units["offset"].astype(np.int64)
    live = phys >= store.commitlog.min_offset
    parts = [
        _decode_run(store, topic, queue_id, phys[run], queue_offsets[run])
        for run in _segment_runs(store, phys, live)
    ]
    return parts, offset + len(units)


def _segment_runs(
    store: MessageStore, phys: npt.NDArray[np.int64], live: npt.NDArray[np.bool_]
) -> Iterator[npt.NDArray[np.int64]]:
    """Indices of the live units, cut where the segment changes."""
    rows = np.flatnonzero(live)
    if len(rows) == 0:
        return
    seg = store.commitlog.segments.segment_size
    bases = phys[rows] - (phys[rows] - store.commitlog.min_offset) % seg
    cuts = np.flatnonzero(np.diff(bases)) + 1
    yield from np.split(rows, cuts)


def _decode_run(
    store: MessageStore,
    topic: str,
    queue_id: int,
    phys: npt.NDArray[np.int64],
    queue_offsets: npt.NDArray[np.int64],
) -> pa.RecordBatch:
    commitlog = store.commitlog
    cq = store.queues[(topic, queue_id)]

    def no_record(i: int) -> CorruptRecordError:
        path, pos = cq.unit_location(int(queue_offsets[i]))
        return CorruptRecordError(
            path,
            pos,
            f"unit {int(queue_offsets[i])} points at CommitLog offset {int(phys[i])}, where no "
            "record starts",
        )

    try:
        mf = commitlog.segments.find(int(phys[0]))
    except NotVisibleError:
        raise  # in a segment this host does not list yet: not the ConsumeQueue's fault
    except OffsetOutOfRangeError:
        raise no_record(0) from None
    beyond = np.flatnonzero(phys >= commitlog.max_offset)
    if len(beyond):
        raise no_record(int(beyond[0]))
    try:
        batch = native.decode(
            mf.buffer, phys - mf.base, mf.base, path=str(mf.path), limit=mf.wrote_position
        )
    except CorruptRecordError as exc:
        # A unit pointing into the middle of a record is the ConsumeQueue's fault; a record
        # that starts where the unit says but fails its checks is the CommitLog's.
        if not commitlog.starts_record(exc.offset):
            raise no_record(int(np.flatnonzero(phys == exc.offset)[0])) from None
        raise
    got = zip(
        batch.column("topic").to_pylist(),
        batch.column("queueId").to_pylist(),
        batch.column("queueOffset").to_pylist(),
        strict=True,
    )
    for i, (t, q, o) in enumerate(got):
        if (t, q, o) != (topic, queue_id, int(queue_offsets[i])):
            raise CorruptRecordError(
                str(mf.path),
                int(phys[i]),
                f"record says {t}/{q}/{o}, but unit {int(queue_offsets[i])} of "
                f"{topic}/{queue_id} points at it",
            )
    return batch
