"""Dispatch ("reput"): derive ConsumeQueue units and IndexFile entries from CommitLog records.

A batch put describes its records column by column as a :class:`DispatchBatch`
(:func:`from_prepared`) and writes it with :func:`apply`. On open and after a crash,
:func:`redispatch` derives the same units and entries from the CommitLog bytes in one native
pass per segment, resuming at any record boundary, and writes them the same way; the
differential and fixture tests hold the two to the same bytes.

Rules (RocketMQ's): PREPARED and ROLLBACK transaction records get no ConsumeQueue unit;
ROLLBACK records get no index entries; a record's index keys are its UNIQ_KEY, then each
space-separated KEYS token.

Thread-safety: none; runs on the store's writer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.errors import CorruptRecordError
from rocketstore.pipeline.files.commitlog import CommitLog
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue, make_units
from rocketstore.pipeline.files.indexservice import IndexService
from rocketstore.pipeline.format import native, record
from rocketstore.pipeline.format.encode import PreparedBatch
from rocketstore.pipeline.layout import CQ_UNIT_SIZE

INDEX_SLICE = 1 << 18  # index entries per IndexService.put of a batch


@dataclasses.dataclass
class QueueRuns:
    """A batch's rows split by (topic, queueId): ``rows[starts[i]:starts[i + 1]]`` are the
    rows of queue ``keys[i]``, each run keeping the rows' batch order. ``queues`` are the runs'
    ConsumeQueues once the writer has looked them up (so that the dispatch does not again)."""

    rows: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    keys: list[tuple[str, int]]
    queues: list[ConsumeQueue] | None = None

    def __len__(self) -> int:
        return len(self.keys)


@dataclasses.dataclass
class DispatchBatch:
    phys: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    topics: list[str]
    topic_codes: npt.NDArray[np.int32]
    queue_ids: npt.NDArray[np.int32]
    queue_offsets: npt.NDArray[np.int64]
    tags_codes: npt.NDArray[np.int64]
    sys_flags: npt.NDArray[np.int32]
    store_ts: npt.NDArray[np.int64]
    key_rows: npt.NDArray[np.int64]
    key_hashes: npt.NDArray[np.int32]
    # The rows that get ConsumeQueue units, split by queue (:func:`group_runs`), when the
    # caller already has them; else :func:`apply` splits them itself.
    runs: QueueRuns | None = None

    def __len__(self) -> int:
        return len(self.phys)

    @property
    def end(self) -> int:
        """Physical offset just past the last record (0 for an empty batch)."""
        return int(self.phys[-1] + self.sizes[-1]) if len(self.phys) else 0


def from_prepared(
    b: PreparedBatch,
    phys: npt.NDArray[np.int64],
    queue_offsets: npt.NDArray[np.int64],
    store_ts: int,
    runs: QueueRuns | None = None,
) -> DispatchBatch:
    return DispatchBatch(
        phys=phys,
        sizes=b.sizes,
        topics=b.topics,
        topic_codes=b.topic_codes,
        queue_ids=b.queue_ids,
        queue_offsets=queue_offsets,
        tags_codes=b.tags_codes,
        sys_flags=b.sys_flags,
        store_ts=np.full(b.n, store_ts, dtype=np.int64),
        key_rows=b.key_rows,
        key_hashes=b.key_hashes,
        runs=runs,
    )


def redispatch(
    log: CommitLog,
    start: int,
    end: int,
    queue: Callable[[str, int], ConsumeQueue],
    index: IndexService | None,
    *,
    check_crc: bool = False,
) -> tuple[int, int]:
    """Dispatch the records in ``[start, end)`` again, straight from the CommitLog: one native
    pass per segment (:func:`rocketstore.pipeline.format.native.dispatch_walk`) derives each queue's units and
    the index entries, written as :func:`apply` writes them (and as idempotently). ``start``
    must be a record boundary and ``end`` where a recovery scan stopped (records are not
    CRC-checked again unless asked). Memory is bounded by one segment's units and entries.

    Returns how many records were walked and the store time of the last that got a unit
    (-1 if none). Raises :class:`CorruptRecordError` if the records do not reach ``end``."""
    count, last_unit_ts, pos = 0, -1, start
    for mf in log.segments.segments_from(start):
        if pos >= end:
            break
        d = native.dispatch_walk(
            mf.buffer,
            pos - mf.base,
            mf.size,
            mf.base,
            end,
            check_crc=check_crc,
            index=index is not None,
        )
        for topic, queue_id, first, units in d.runs:
            queue(topic, queue_id).append(first, units)
        if index is not None and len(d.key_hashes):
            index.put(d.key_hashes, d.phys, d.store_ts)
        count += d.count
        if d.last_unit_ts >= 0:
            last_unit_ts = d.last_unit_ts
        pos = mf.base + mf.size if d.stop == native.STOP_BLANK else d.end
        if d.stop == native.STOP_INVALID or (d.stop == native.STOP_END and pos < mf.base + mf.size):
            break
    if pos < end:
        mf = log.segments.find(pos)
        raise CorruptRecordError(str(mf.path), pos, "not a valid record inside the recovered log")
    return count, last_unit_ts


def group_runs(
    topics: list[str],
    topic_codes: npt.NDArray[np.int32],
    queue_ids: npt.NDArray[np.int32],
    rows: npt.NDArray[np.int64],
) -> QueueRuns:
    """``rows`` split by (topic, queueId) as :class:`QueueRuns`: one stable sort, whatever the
    number of queues."""
    if not len(rows):
        return QueueRuns(rows, np.zeros(1, dtype=np.int64), [])
    t = topic_codes[rows]
    q = queue_ids[rows]
    width = int(q.max()) + 1
    # An int32 group id per row when it fits (it does for any real number of queues).
    dtype = np.int32 if (int(t.max()) + 1) * width < 1 << 31 else np.int64
    dense: npt.NDArray[Any] = t.astype(dtype, copy=False) * width
    dense += q
    # Small group ids sort by radix (linear time) as uint16; stability keeps message order.
    key = dense.astype(np.uint16) if int(dense.max()) < 1 << 16 else dense
    order = np.argsort(key, kind="stable")
    sorted_rows = rows[order]
    sorted_key = dense[order]
    bounds = np.flatnonzero(sorted_key[1:] != sorted_key[:-1]) + 1
    starts = np.concatenate(([0], bounds, [len(rows)])).astype(np.int64)
    firsts = sorted_rows[starts[:-1]]
    codes = topic_codes[firsts].tolist()
    qids = queue_ids[firsts].tolist()
    return QueueRuns(
        sorted_rows, starts, [(topics[c], qid) for c, qid in zip(codes, qids, strict=True)]
    )


def apply(
    batch: DispatchBatch, queue: Callable[[str, int], ConsumeQueue], index: IndexService | None
) -> None:
    """Write the batch's ConsumeQueue units and index entries. Idempotent: units and entries
    already present are skipped, so a range may be dispatched again after a crash."""
    if not len(batch):
        return
    runs = batch.runs
    if runs is None:
        rows = np.flatnonzero(record.consume_queue_mask(batch.sys_flags))
        runs = group_runs(batch.topics, batch.topic_codes, batch.queue_ids, rows)
    if len(runs):
        # Every unit of the batch in one array, run after run: a queue's units are a slice.
        r = runs.rows
        units = make_units(batch.phys[r], batch.sizes[r], batch.tags_codes[r])
        raw = units.view(np.uint8).data
        ends = (batch.phys[r] + batch.sizes[r])[runs.starts[1:] - 1].tolist()
        firsts = batch.queue_offsets[r[runs.starts[:-1]]].tolist()
        cqs = runs.queues or [queue(t, q) for t, q in runs.keys]
        starts = (runs.starts * CQ_UNIT_SIZE).tolist()
        for i, cq in enumerate(cqs):
            cq.append_bytes(firsts[i], raw[starts[i] : starts[i + 1]], ends[i])
    if index is None:
        return
    # In slices, so that the gathered offsets and times stay small beside the batch itself.
    for lo in range(0, len(batch.key_rows), INDEX_SLICE):
        rows = batch.key_rows[lo : lo + INDEX_SLICE]
        index.put(batch.key_hashes[lo : lo + INDEX_SLICE], batch.phys[rows], batch.store_ts[rows])
