"""Dispatch ("reput"): derive ConsumeQueue units and IndexFile entries from CommitLog records.

A :class:`DispatchBatch` describes a run of records column by column. It comes either straight
from a batch put (:func:`from_prepared`, which already has every column) or from the CommitLog
bytes (:func:`from_commitlog`, used on open and after a crash, resuming at any record
boundary). Both feed :func:`apply`, so what a put dispatches is exactly what a rebuild from the
log would produce.

Rules (RocketMQ's): PREPARED and ROLLBACK transaction records get no ConsumeQueue unit;
ROLLBACK records get no index entries; a record's index keys are its UNIQ_KEY, then each
space-separated KEYS token.

Thread-safety: none; runs on the store's writer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline import record
from pipeline.commitlog import CommitLog
from pipeline.consumequeue import ConsumeQueue, make_units
from pipeline.encode import PreparedBatch, index_keys
from pipeline.index_service import IndexService
from pipeline.javahash import java_hash_array


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


def from_commitlog(
    log: CommitLog, start: int, end: int, *, check_crc: bool = False
) -> DispatchBatch:
    """Parse the records in ``[start, end)``; ``start`` must be a record boundary.

    ``end`` must be where a recovery scan stopped: records are read without re-checking their
    CRC unless asked.
    """
    phys: list[int] = []
    sizes: list[int] = []
    topics: dict[str, int] = {}
    codes: list[int] = []
    qids: list[int] = []
    qoffs: list[int] = []
    sysf: list[int] = []
    sts: list[int] = []
    tags: list[str | None] = []
    keys: list[str | None] = []
    uniq: list[str | None] = []
    pos = start
    while pos < end:
        mf = log.segments.find(pos)
        rel = pos - mf.base
        size, magic = record.SIZE_MAGIC.unpack_from(mf.buffer, rel)
        if magic == record.BLANK_MAGIC:
            pos = mf.base + mf.size
            continue
        m = record.decode_record(
            mf.buffer,
            rel,
            path=str(mf.path),
            phys=pos,
            limit=mf.size,
            check_crc=check_crc,
            with_body=False,
        )
        phys.append(pos)
        sizes.append(size)
        codes.append(topics.setdefault(m.topic, len(topics)))
        qids.append(m.queue_id)
        qoffs.append(m.queue_offset)
        sysf.append(m.sys_flag)
        sts.append(m.store_timestamp)
        tags.append(m.properties.get(record.PROPERTY_TAGS) or None)
        keys.append(m.properties.get(record.PROPERTY_KEYS) or None)
        uniq.append(m.properties.get(record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or None)
        pos += size
    topic_list = list(topics)
    topic_codes = np.array(codes, dtype=np.int32)
    sys_flags = np.array(sysf, dtype=np.int32)
    key_rows, key_hashes = index_keys(
        topic_list,
        topic_codes,
        pa.array(uniq, pa.string()),
        pa.array(keys, pa.string()),
        sys_flags,
    )
    return DispatchBatch(
        phys=np.array(phys, dtype=np.int64),
        sizes=np.array(sizes, dtype=np.int64),
        topics=topic_list,
        topic_codes=topic_codes,
        queue_ids=np.array(qids, dtype=np.int32),
        queue_offsets=np.array(qoffs, dtype=np.int64),
        tags_codes=java_hash_array(pa.array(tags, pa.string())).astype(np.int64),
        sys_flags=sys_flags,
        store_ts=np.array(sts, dtype=np.int64),
        key_rows=key_rows,
        key_hashes=key_hashes,
    )


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
