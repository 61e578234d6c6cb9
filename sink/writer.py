"""One Spark task's share of a micro-batch: routed rows → per-broker appends (executors).

Shared by both faces of the sink. ``slot`` says whose rows these are: the ``foreachBatch``
sink shuffles every broker's rows into one task, so the broker is the writer's slot
(``slot=None``); the data source writer cannot shuffle, so each Spark partition is a slot and
appends to every broker its rows route to, one broker lock at a time, free brokers first.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import storehost
from rocketstore.pipeline.engine.root import StoreRoot, broker_name
from rocketstore.pipeline.errors import StoreError, StoreLockedError
from rocketstore.sink.append import AppendStats, LockWait, append, append_stream, open_writer
from rocketstore.sink.prefetch import prefetched
from rocketstore.sink.settings import SinkSettings

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
    """Append routed rows (schema :data:`rocketstore.sink.rows.ROUTED`) to their brokers.

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

    picked_rows: dict[int, pa.Table] = {}

    def rows_of(b: int) -> pa.Table:
        picked = np.flatnonzero(brokers == b)
        part = table.take(pa.array(picked)) if len(picked) != table.num_rows else table
        return message_table(part, mq[picked] % queues)

    def append_broker(b: int, timeout_ms: int) -> AppendStats:
        # Kept for another try when the broker's lock turns out to be taken.
        rows = picked_rows.get(b)
        if rows is None:
            rows = picked_rows[b] = rows_of(b)
        stats = append(
            root.broker_path(b),
            broker_config(settings.store_config, b),
            rows,
            sink_fp=sink_fp,
            batch_id=batch_id,
            slot=b if slot is None else slot,
            lock_timeout_ms=timeout_ms,
            chunk_rows=settings.chunk_rows,
            attempt=attempt,
        )
        del picked_rows[b]
        return stats

    targets = np.unique(brokers).tolist()
    if slot is None:
        return [append_broker(b, settings.lock_timeout_ms) for b in targets]
    return _append_free_first(targets, slot, settings.lock_timeout_ms, append_broker)


# Rows per put when a task appends as its rows come: Spark hands over Arrow batches of 10,000
# rows (spark.sql.execution.arrow.maxRecordsPerBatch), and a put of so few pays its fixed cost
# too often; a few of these are in memory at a time.
STREAM_ROWS = 1 << 17


def append_shuffled(
    settings: SinkSettings,
    queues: int,
    batches: Iterable[pa.RecordBatch],
    *,
    batch_id: int,
    sink_fp: bytes,
    attempt: int,
) -> list[AppendStats]:
    """One task of a shuffled ``foreachBatch`` micro-batch: routed rows (schema
    :data:`rocketstore.sink.rows.ROUTED`) of the brokers the shuffle sent to this task, broker
    after broker in ascending order, each broker's rows in ``__rs_row`` order, as the shuffle
    sorts them in the JVM (:mod:`rocketstore.sink.foreach`). Each broker's rows are appended
    as they come, Spark's next Arrow batch received (and shaped) in a thread of its own while
    the current one is put (:func:`rocketstore.sink.prefetch.prefetched`,
    :func:`rocketstore.sink.append.append_stream`); the slot is the broker, as in
    :func:`append_routed`, so either path finds what the other stored. Only brokers with rows
    are opened."""
    root = StoreRoot(settings.root)
    done: list[AppendStats] = []
    parts = prefetched(_by_broker(batches, queues))
    for broker, group in itertools.groupby(parts, key=lambda part: part[0]):
        stats = append_stream(
            root.broker_path(broker),
            broker_config(settings.store_config, broker),
            (table for _, table in group),
            sink_fp=sink_fp,
            batch_id=batch_id,
            slot=broker,
            lock_timeout_ms=settings.lock_timeout_ms,
            chunk_rows=settings.chunk_rows,
            attempt=attempt,
        )
        if stats is not None:
            done.append(stats)
    return done


def append_partition(
    settings: SinkSettings,
    queues: int,
    brokers: int,
    batches: Iterable[pa.RecordBatch],
    *,
    batch_id: int,
    sink_fp: bytes,
    slot: int,
    attempt: int,
) -> list[AppendStats]:
    """One task of the data source writer: routed rows of every broker, in the partition's
    order. The rows of broker ``slot % brokers`` (the task's lead) are appended as they come,
    the next Arrow batch received and routed in a thread of its own while the current part is
    put; the other brokers' rows are held, and appended once the input ends, as
    :func:`append_routed` does. The slot is the partition either way, and each broker gets the
    partition's rows in one order, so a re-run finds what any attempt stored.

    The lead broker's lock is tried once, without waiting, when its first rows are there:
    another task holding it sends the whole partition down :func:`append_routed`, which takes
    free brokers first.
    """
    lead = slot % brokers
    held: list[pa.RecordBatch] = []
    parts = prefetched(_lead_rows(batches, queues, lead, held))
    first = next(parts, None)

    def the_rest(lead_rows: Iterable[pa.Table]) -> list[AppendStats]:
        # ``held`` is complete only once the producer thread is done: after ``parts`` ends.
        routed = [b for t in lead_rows for b in t.to_batches()]
        return append_routed(
            settings,
            queues,
            routed + held,
            batch_id=batch_id,
            sink_fp=sink_fp,
            slot=slot,
            attempt=attempt,
        )

    if first is None:
        return the_rest([])
    path = StoreRoot(settings.root).broker_path(lead)
    try:
        store = open_writer(path, broker_config(settings.store_config, lead), 0)
    except StoreLockedError:
        return the_rest([first, *parts])
    with store:
        stats = append_stream(
            path,
            store.config,
            (_as_messages(t, queues) for t in itertools.chain([first], parts)),
            sink_fp=sink_fp,
            batch_id=batch_id,
            slot=slot,
            lock_timeout_ms=0,
            chunk_rows=settings.chunk_rows,
            attempt=attempt,
            store=store,
        )
    assert stats is not None  # ``first`` held rows
    return [stats, *the_rest([])]


def _lead_rows(
    batches: Iterable[pa.RecordBatch], queues: int, lead: int, held: list[pa.RecordBatch]
) -> Iterator[pa.Table]:
    """The routed rows of broker ``lead``, gathered into parts of at least
    :data:`STREAM_ROWS` rows; every other row goes to ``held``, in order."""
    mine: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        is_lead = batch.column("__rs_mq").to_numpy() // queues == lead
        if not bool(is_lead.all()):
            held.append(batch.filter(pa.array(~is_lead)))
            batch = batch.filter(pa.array(is_lead))
            if batch.num_rows == 0:
                continue
        mine.append(batch)
        count += batch.num_rows
        if count >= STREAM_ROWS:
            yield pa.Table.from_batches(mine).combine_chunks()
            mine, count = [], 0
    if mine:
        yield pa.Table.from_batches(mine).combine_chunks()


def _as_messages(routed: pa.Table, queues: int) -> pa.Table:
    mq = routed.column("__rs_mq").to_numpy().astype(np.int64)
    return message_table(routed, mq % queues)


def _by_broker(batches: Iterable[pa.RecordBatch], queues: int) -> Iterator[tuple[int, pa.Table]]:
    """The routed batches as message columns, with their broker, gathered into parts of at
    least :data:`STREAM_ROWS` rows of one broker; refuses brokers out of ascending order or a
    broker's rows out of ``__rs_row`` order, which would break the replay order (see
    rocketstore.sink.append)."""
    broker: int | None = None
    last = -1
    held: list[pa.RecordBatch] = []
    held_mq: list[npt.NDArray[np.int64]] = []
    count = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        rows = batch.column("__rs_row").to_numpy()
        mq = batch.column("__rs_mq").to_numpy().astype(np.int64)
        brokers = mq // queues
        if (broker is not None and int(brokers[0]) < broker) or bool(
            np.any(brokers[1:] < brokers[:-1])
        ):
            raise StoreError(
                f"{broker_name(int(brokers[0]))}: the shuffled rows of a micro-batch came with "
                "their brokers out of order; the sink cannot append them in replay order"
            )
        cuts = [0, *(np.flatnonzero(brokers[1:] != brokers[:-1]) + 1).tolist(), len(brokers)]
        for lo, hi in itertools.pairwise(cuts):
            if int(brokers[lo]) != broker:
                if held:
                    assert broker is not None
                    yield broker, _gathered(held, held_mq, queues)
                    held, held_mq, count = [], [], 0
                broker, last = int(brokers[lo]), -1
            run = rows[lo:hi]
            if int(run[0]) <= last or bool(np.any(run[1:] <= run[:-1])):
                raise StoreError(
                    f"{broker_name(broker)}: the shuffled rows of a micro-batch came out of row "
                    "order; the sink cannot append them in replay order"
                )
            last = int(run[-1])
            held.append(batch.slice(lo, hi - lo))
            held_mq.append(mq[lo:hi])
            count += hi - lo
            if count >= STREAM_ROWS:
                yield broker, _gathered(held, held_mq, queues)
                held, held_mq, count = [], [], 0
    if held:
        assert broker is not None
        yield broker, _gathered(held, held_mq, queues)


def _gathered(
    held: list[pa.RecordBatch], held_mq: list[npt.NDArray[np.int64]], queues: int
) -> pa.Table:
    table = pa.Table.from_batches(held).combine_chunks()
    return message_table(table, np.concatenate(held_mq) % queues)


def message_table(part: pa.Table, queue_ids: npt.NDArray[np.int64]) -> pa.Table:
    """Routed rows as the message columns a put takes, with their queue in the broker."""
    return pa.table(
        {
            "topic": part.column("topic"),
            "body": part.column("body"),
            "queueId": pa.array(queue_ids.astype(np.int32)),
            "keys": part.column("keys"),
            "tags": part.column("tags"),
            "properties": part.column("properties"),
            "flag": part.column("flag"),
        }
    )


def _append_free_first(
    targets: list[int],
    slot: int,
    timeout_ms: int,
    append_broker: Callable[[int, int], AppendStats],
) -> list[AppendStats]:
    """Append to each broker of ``targets``, taking whichever broker's lock is free first.

    The data source writer's tasks all write to every broker. Taken in one fixed order, the
    tasks of a batch would queue behind each other on the first broker and then on the next;
    starting at broker ``slot`` and passing over a locked broker for a free one keeps every
    task appending while there is a broker nobody holds. Only when every broker left is held
    does the task wait, up to ``timeout_ms`` in all. The order affects nothing stored: each
    broker gets this slot's rows as one append, whenever it comes.
    """
    start = slot % len(targets)
    pending = targets[start:] + targets[:start]
    done: list[AppendStats] = []
    # The holder is most often another task of the same micro-batch, whose append takes well
    # under a second: polling at most every 0.2 s keeps the wait close to its end.
    wait = LockWait(timeout_ms, cap_s=0.2)
    while pending:
        for b in list(pending):
            try:
                done.append(append_broker(b, 0))
            except StoreLockedError:
                continue
            pending.remove(b)
            wait.progressed()
        if not pending:
            break
        if wait.expired():
            names = ", ".join(broker_name(b) for b in pending)
            raise StoreLockedError(
                f"{names}: still locked after waiting {timeout_ms} ms (lockTimeoutMs). Another "
                "query or process is writing these brokers"
            )
        wait.pause()
    return done


def broker_config(config: StoreConfig, broker: int) -> StoreConfig:
    """Broker ``b`` of a root stamps a port ``10 * b`` above listenPort (set or defaulted) into
    a new directory's records: a msgId is the store host and port plus the CommitLog offset, so
    the brokers of a root must differ in port, as stock brokers sharing a host do (each takes
    its port, the one above and the one two below). A directory that has records keeps the
    store host they carry unless brokerIP1/listenPort are set (rocketstore.pipeline.engine.storehost)."""
    return dataclasses.replace(config, listen_port_offset=storehost.PORT_STEP * broker)


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


__all__ = [
    "STATS_SCHEMA",
    "append_partition",
    "append_routed",
    "append_shuffled",
    "broker_name",
    "stats_batch",
]
