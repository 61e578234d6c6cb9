"""Dispatch ("reput"): derive ConsumeQueue units and IndexFile entries from CommitLog records.

A :class:`DispatchBatch` describes a run of records column by column. It comes either straight
from a batch put (:func:`from_prepared`, which already has every column) or from the CommitLog
bytes through the native record walk (:func:`from_walks`, :func:`from_commitlog`, used on open
and after a crash, resuming at any record boundary). Both feed :func:`apply`, so what a put dispatches is exactly what a rebuild from the
log would produce.

Rules (RocketMQ's): PREPARED and ROLLBACK transaction records get no ConsumeQueue unit;
ROLLBACK records get no index entries; a record's index keys are its UNIQ_KEY, then each
space-separated KEYS token.

Thread-safety: none; runs on the store's writer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline import native, record
from pipeline.commitlog import CommitLog
from pipeline.consumequeue import ConsumeQueue, make_units
from pipeline.encode import PreparedBatch
from pipeline.errors import CorruptRecordError
from pipeline.index_service import IndexService


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

    def __len__(self) -> int:
        return len(self.phys)

    def select(self, rows: npt.NDArray[np.bool_]) -> DispatchBatch:
        """The batch's records where ``rows`` is set (a prefix, as used here), with their
        index entries."""
        keep = np.flatnonzero(rows)
        renumber = np.full(len(self.phys), -1, dtype=np.int64)
        renumber[keep] = np.arange(len(keep))
        entries = rows[self.key_rows]
        return DispatchBatch(
            phys=self.phys[keep],
            sizes=self.sizes[keep],
            topics=self.topics,
            topic_codes=self.topic_codes[keep],
            queue_ids=self.queue_ids[keep],
            queue_offsets=self.queue_offsets[keep],
            tags_codes=self.tags_codes[keep],
            sys_flags=self.sys_flags[keep],
            store_ts=self.store_ts[keep],
            key_rows=renumber[self.key_rows[entries]],
            key_hashes=self.key_hashes[entries],
        )

    @property
    def end(self) -> int:
        """Physical offset just past the last record (0 for an empty batch)."""
        return int(self.phys[-1] + self.sizes[-1]) if len(self.phys) else 0


def from_prepared(
    b: PreparedBatch,
    phys: npt.NDArray[np.int64],
    queue_offsets: npt.NDArray[np.int64],
    store_ts: int,
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
    )


def from_walks(walks: Iterable[native.Walk]) -> DispatchBatch:
    """A dispatch batch from native record walks (see :meth:`CommitLog.walks`), in order."""
    parts = [w for w in walks if len(w)]
    if not parts:
        return DispatchBatch(
            *(np.zeros(0, np.int64),) * 2,
            [],
            np.zeros(0, np.int32),
            np.zeros(0, np.int32),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0, np.int32),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0, np.int32),
        )
    topics: dict[str, int] = {}
    codes = []
    key_rows = []
    first_row = 0
    for w in parts:
        remap = np.array([topics.setdefault(t, len(topics)) for t in w.topics], dtype=np.int32)
        codes.append(remap[w.topic_codes])
        key_rows.append(w.key_rows + first_row)
        first_row += len(w)

    def cat(name: str) -> Any:
        return np.concatenate([getattr(w, name) for w in parts])

    return DispatchBatch(
        phys=cat("phys"),
        sizes=cat("sizes"),
        topics=list(topics),
        topic_codes=np.concatenate(codes),
        queue_ids=cat("queue_ids"),
        queue_offsets=cat("queue_offsets"),
        tags_codes=cat("tags_codes"),
        sys_flags=cat("sys_flags"),
        store_ts=cat("store_ts"),
        key_rows=np.concatenate(key_rows),
        key_hashes=cat("key_hashes"),
    )


def from_commitlog(
    log: CommitLog, start: int, end: int, *, check_crc: bool = False
) -> DispatchBatch:
    """Parse the records in ``[start, end)``; ``start`` must be a record boundary and ``end``
    where a recovery scan stopped (records are not CRC-checked again unless asked)."""
    walks = []
    for w in log.walks(start, check_crc=check_crc):
        walks.append(w)
        if w.end >= end:
            break
    batch = from_walks(walks)
    keep = batch.phys < end
    if not keep.all():
        batch = batch.select(keep)
    last = batch.end if len(batch) else start
    if last < end:
        mf = log.segments.find(last)
        raise CorruptRecordError(str(mf.path), last, "not a valid record inside the recovered log")
    return batch


def group_rows(
    topic_codes: npt.NDArray[np.int32],
    queue_ids: npt.NDArray[np.int32],
    rows: npt.NDArray[np.int64],
) -> list[npt.NDArray[np.int64]]:
    """``rows`` split by (topic, queueId), each group keeping the rows' original order."""
    if not len(rows):
        return []
    t = topic_codes[rows].astype(np.int64)
    q = queue_ids[rows].astype(np.int64)
    dense = t * (int(q.max()) + 1) + q
    # Small group ids sort by radix (linear time) as uint16; stability keeps message order.
    key = dense.astype(np.uint16) if int(dense.max()) < 1 << 16 else dense
    order = np.argsort(key, kind="stable")
    sorted_rows = rows[order]
    sorted_key = dense[order]
    bounds = np.flatnonzero(sorted_key[1:] != sorted_key[:-1]) + 1
    return np.split(sorted_rows, bounds)


def consume_queue_mask(sys_flags: npt.NDArray[np.int32]) -> npt.NDArray[np.bool_]:
    tx = sys_flags & record.TRANSACTION_MASK
    return np.asarray(
        (tx == record.TRANSACTION_NOT_TYPE) | (tx == record.TRANSACTION_COMMIT_TYPE), dtype=bool
    )


def apply(
    batch: DispatchBatch, queue: Callable[[str, int], ConsumeQueue], index: IndexService | None
) -> None:
    """Write the batch's ConsumeQueue units and index entries. Idempotent: units and entries
    already present are skipped, so a range may be dispatched again after a crash."""
    if not len(batch):
        return
    rows = np.flatnonzero(consume_queue_mask(batch.sys_flags))
    for part in group_rows(batch.topic_codes, batch.queue_ids, rows):
        first = int(part[0])
        cq = queue(batch.topics[int(batch.topic_codes[first])], int(batch.queue_ids[first]))
        units = make_units(batch.phys[part], batch.sizes[part], batch.tags_codes[part])
        cq.append(int(batch.queue_offsets[first]), units)
    if index is not None and len(batch.key_rows):
        index.put(batch.key_hashes, batch.phys[batch.key_rows], batch.store_ts[batch.key_rows])
