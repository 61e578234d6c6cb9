"""One Spark task's share of a micro-batch: routed rows → per-broker appends (executors).

Shared by both faces of the sink. ``slot_by_broker`` says whose rows these are: the
``foreachBatch`` sink shuffles every broker's rows into one task, so the broker is the writer's
slot; the data source writer cannot shuffle, so each Spark partition is a slot and appends to
every broker its rows route to, one broker lock at a time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import StoreConfig
from pipeline.root import StoreRoot, broker_name
from sink.append import AppendStats, append
from sink.settings import SinkSettings

STATS_SCHEMA = pa.schema(
    [
        ("broker", pa.string()),
        ("slot", pa.int32()),
        ("rows", pa.int64()),
        ("skipped", pa.int64()),
        ("appended", pa.int64()),
        ("bytes", pa.int64()),
        ("firstOffset", pa.int64()),
        ("lastOffset", pa.int64()),
    ]
)


def append_routed(
    settings: SinkSettings,
    queues: int,
    batches: Iterable[pa.RecordBatch],
    *,
    batch_id: int,
    sink_fp: bytes,
    slot: int | None,
    attempt: int,
) -> list[AppendStats]:
    """Append routed rows (schema :data:`sink.rows.ROUTED`) to their brokers.

    ``slot=None`` means one slot per broker (the foreachBatch layout); rows are then put in
    ``__rs_row`` order, which is the same on every replay of the batch.
    """
    got = list(batches)
    if not got:
        # An empty micro-batch, or a broker none of this batch's rows route to.
        return []
    table = pa.Table.from_batches(got)
    if table.num_rows == 0:
        return []
    if slot is None:
        order = table.column("__rs_row").to_numpy()
        # A one-partition batch, or a shuffle from one input partition, arrives in order:
        # sorting it anyway would copy every body.
        if len(order) > 1 and not bool(np.all(order[1:] > order[:-1])):
            table = table.take(pc.sort_indices(table, [("__rs_row", "ascending")]))
    mq = table.column("__rs_mq").to_numpy().astype(np.int64)
    brokers = mq // queues
    root = StoreRoot(settings.root)
    stats = []
    for b in np.unique(brokers).tolist():
        picked = np.flatnonzero(brokers == b)
        part = table.take(pa.array(picked)) if len(picked) != table.num_rows else table
        rows = pa.table(
            {
                "topic": part.column("topic"),
                "body": part.column("body"),
                "queueId": pa.array((mq[picked] % queues).astype(np.int32)),
                "keys": part.column("keys"),
                "tags": part.column("tags"),
                "properties": part.column("properties"),
                "flag": part.column("flag"),
            }
        )
        stats.append(
            append(
                root.broker_path(b),
                broker_config(settings.store_config, b),
                rows,
                sink_fp=sink_fp,
                batch_id=batch_id,
                slot=b if slot is None else slot,
                lock_timeout_ms=settings.lock_timeout_ms,
                chunk_rows=settings.chunk_rows,
                attempt=attempt,
            )
        )
    return stats


def broker_config(config: StoreConfig, broker: int) -> StoreConfig:
    """Broker ``b`` of a root stores with ``listenPort + b``: a msgId is the store host and
    port plus the CommitLog offset, so brokers on one host must differ in port, as RocketMQ
    brokers sharing a machine do."""
    return dataclasses.replace(config, listen_port=config.listen_port + broker)


def stats_batch(stats: list[AppendStats]) -> Iterator[pa.RecordBatch]:
    if not stats:
        return
    cols = {
        "broker": [s.broker for s in stats],
        "slot": [s.slot for s in stats],
        "rows": [s.rows for s in stats],
        "skipped": [s.skipped for s in stats],
        "appended": [s.appended for s in stats],
        "bytes": [s.bytes for s in stats],
        "firstOffset": [s.first_offset for s in stats],
        "lastOffset": [s.last_offset for s in stats],
    }
    yield pa.RecordBatch.from_pydict(cols, schema=STATS_SCHEMA)


__all__ = ["STATS_SCHEMA", "append_routed", "broker_name", "stats_batch"]
