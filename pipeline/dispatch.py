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
from pipeline.errors import CorruptRecordError
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
    """Parse the records in ``[start, end)``; ``start`` must be a record boundary and ``end``
    where a recovery scan stopped (records are not CRC-checked again unless asked)."""
    scanned: list[tuple[int, record.ScannedRecord]] = []
    for phys, fields in log.scan(start, check_crc=check_crc):
        if phys >= end:
            break
        scanned.append((phys, fields))
    last = scanned[-1][0] + scanned[-1][1][0] if scanned else start
    if last < end:
        mf = log.segments.find(last)
        raise CorruptRecordError(str(mf.path), last, "not a valid record inside the recovered log")
    return from_scanned(scanned)


def from_scanned(scanned: list[tuple[int, record.ScannedRecord]]) -> DispatchBatch:
    """A dispatch batch from records already scanned (by recovery's walk)."""
    topics: dict[bytes, int] = {}
    codes: list[int] = []
    tags: list[str | None] = []
    keys: list[str | None] = []
    uniq: list[str | None] = []
    keys_name, tags_name, uniq_name = (
        record.PROPERTY_KEYS.encode(),
        record.PROPERTY_TAGS.encode(),
        record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode(),
    )
    for _, (_, _, _, _, _, topic, props) in scanned:
        tag = key = uq = None
        for item in props.split(b"\x02"):
            name, sep, value = item.partition(b"\x01")
            if sep and value:
                if name == tags_name:
                    tag = value.decode("utf-8", "replace")
                elif name == keys_name:
                    key = value.decode("utf-8", "replace")
                elif name == uniq_name:
                    uq = value.decode("utf-8", "replace")
        codes.append(topics.setdefault(topic, len(topics)))
        tags.append(tag)
        keys.append(key)
        uniq.append(uq)
    n = len(scanned)
    columns = np.array([fields[:5] for _, fields in scanned], dtype=np.int64).reshape(n, 5)
    topic_list = [t.decode("utf-8", "replace") for t in topics]
    topic_codes = np.array(codes, dtype=np.int32)
    sys_flags = columns[:, 3].astype(np.int32)
    key_rows, key_hashes = index_keys(
        topic_list,
        topic_codes,
        pa.array(uniq, pa.string()),
        pa.array(keys, pa.string()),
        sys_flags,
    )
    return DispatchBatch(
        phys=np.array([p for p, _ in scanned], dtype=np.int64),
        sizes=columns[:, 0].copy(),
        topics=topic_list,
        topic_codes=topic_codes,
        queue_ids=columns[:, 1].astype(np.int32),
        queue_offsets=columns[:, 2].copy(),
        tags_codes=java_hash_array(pa.array(tags, pa.string())).astype(np.int64),
        sys_flags=sys_flags,
        store_ts=columns[:, 4].copy(),
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
