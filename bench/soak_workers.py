"""The processes of the soak part (:mod:`bench.soak`): the writer, the two streaming readers
(the source's stream reader driven without Spark, and a real Spark query) and one ``verify``,
each in a process of its own (spawned), so that each one's memory, descriptors and mappings
can be read from ``/proc`` apart from the others and from the process sampling them.

The workers talk to the sampling process over a pipe, one request at a time:

* ``("go", None)`` (writer, once, first): every worker is ready, start putting;
* ``("sample", None)``: reply ``("stats", {...})`` with the counters so far and what was
  measured since the last sample (the writer's put latencies), then start a new interval;
* ``("stop", None)`` (writer): close the store, reply ``("stats", {...})`` with the final
  counters, exit;
* ``("drain", written)`` (the readers): read until ``written`` messages have been read,
  reply ``("stats", {...})``, exit.

Every error is recorded (with its traceback) and reaches the sampling process with the next
sample. The readers go on after a failed read as Spark would (the reader reads the micro-batch
again, the Spark query is started again from its checkpoint); a worker that cannot go on says
so (``stopped``) and keeps answering. The writer and the reader wait
between their steps on the pipe (``Connection.poll`` with the time left until the next step is
due), so a request is answered at once and the pacing is a clock's, never a sleep's; Spark
paces its query itself.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import json
import os
import re
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.retention.policy import HOUR_MS
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.layout import CQ_UNIT_SIZE
from rocketstore.pipeline.tools.verify.check import verify_read_only

TOPIC = "soak"
BROKER = "broker-0"
QUEUES = 4
BODY_BYTES = 100
SEQ_DIGITS = 16  # each body starts with its message's sequence number, zero-padded
TAGS = ("TagA", "TagB", "TagC")
# Retention counts in whole hours (fileReservedTime). The writer's retention clock runs this
# many hours minus the soak's retention ahead of the wall clock, so a segment expires
# ``retention_s`` after it was last written; deleteWhen names every hour, so expired segments
# go in the next round (every 10 s), as they would at 04:00 on a broker.
RESERVED_HOURS = 1
EVERY_HOUR = ";".join(f"{h:02d}" for h in range(24))
# A writer more than this far behind its schedule starts a new one instead of bursting to
# catch up (the offered load stays steady; the slip is counted).
MAX_BEHIND_S = 1.0
DRAIN_LIMIT_S = 120.0
READ_ATTEMPTS = 3
SPARK_STARTS = 3
SPARK_RESTARTS = 3
START_LIMIT_S = 180.0


@dataclasses.dataclass(frozen=True)
class Settings:
    """The offered load and the store's geometry (small files, so that all three kinds of
    file roll over and are deleted many times in a run)."""

    rate: int = 4_000  # messages per second
    batch: int = 100  # messages per put
    retention_s: int = 120
    trigger_s: float = 1.0  # the reader's processing-time trigger
    spark_trigger_s: float = 5.0  # the Spark query's
    segment_bytes: int = 4 << 20  # CommitLog: one segment every ~4 s at 4,000 msgs/s
    cq_units: int = 30_000  # ConsumeQueue files of 30,000 units: one per queue every ~30 s
    index_slots: int = 25_000
    index_entries: int = 100_000  # two entries a message: one IndexFile every ~12 s

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            mapped_file_size_commitlog=self.segment_bytes,
            mapped_file_size_consume_queue=self.cq_units * CQ_UNIT_SIZE,
            max_hash_slot_num=self.index_slots,
            max_index_num=self.index_entries,
            file_reserved_time=RESERVED_HOURS,
            delete_when=EVERY_HOUR,
        )

    @property
    def retention_lead_ms(self) -> int:
        """How far the writer's retention clock runs ahead of the wall clock."""
        return RESERVED_HOURS * HOUR_MS - self.retention_s * 1000

    @property
    def period_s(self) -> float:
        return self.batch / self.rate


def messages(first: int, n: int) -> pa.Table:
    """Messages ``first .. first + n - 1``: message ``i`` goes to queue ``i % QUEUES``, its
    body is ``i`` in decimal, zero-padded, then filler, its key ``k-<i>``, and a tag."""
    seq = np.arange(first, first + n, dtype=np.int64)
    powers = 10 ** np.arange(SEQ_DIGITS - 1, -1, -1, dtype=np.int64)
    body = np.full((n, BODY_BYTES), ord("x"), dtype=np.uint8)
    body[:, :SEQ_DIGITS] = (seq[:, None] // powers) % 10 + ord("0")
    offsets = np.arange(0, BODY_BYTES * (n + 1), BODY_BYTES, dtype=np.int32)
    return pa.table(
        {
            "topic": pa.array([TOPIC] * n, pa.string()),
            "body": pa.Array.from_buffers(
                pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(body)]
            ),
            "queueId": pa.array(seq % QUEUES, pa.int32()),
            "keys": pa.array([f"k-{i}" for i in seq.tolist()], pa.string()),
            "tags": pa.array(TAGS, pa.string()).take(pa.array(seq % len(TAGS))),
        }
    )


def body_sequence(bodies: pa.Array) -> npt.NDArray[np.int64]:
    """The sequence number at the start of each body (see :func:`messages`)."""
    n = len(bodies)
    _, offsets_buf, data_buf = bodies.buffers()
    assert offsets_buf is not None and data_buf is not None
    starts = np.frombuffer(offsets_buf, dtype=np.int32)[bodies.offset : bodies.offset + n]
    data = np.frombuffer(data_buf, dtype=np.uint8)
    digits = data[starts[:, None] + np.arange(SEQ_DIGITS)].astype(np.int64) - ord("0")
    powers = 10 ** np.arange(SEQ_DIGITS - 1, -1, -1, dtype=np.int64)
    return np.asarray(digits @ powers, dtype=np.int64)


def make_root(root: Path) -> Path:
    """The store root of one broker and one topic; returns the broker's directory."""
    StoreRoot(root).ensure_topic(TOPIC, TopicMeta(1, QUEUES))
    return root / BROKER


def _failure() -> str:
    return traceback.format_exc(limit=8)


# -- the writer -----------------------------------------------------------------------------


@dataclasses.dataclass
class _Counters:
    """A worker's counters; its lists are per interval: each report hands them over and
    starts them afresh."""

    errors: list[str] = dataclasses.field(default_factory=list)
    stopped: bool = False  # it gave up: the run cannot go on

    def report(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for f in dataclasses.fields(self):
            if isinstance(getattr(self, f.name), list):
                setattr(self, f.name, [])
        return out


@dataclasses.dataclass
class _WriterState(_Counters):
    written: int = 0
    puts: int = 0
    slips: int = 0  # times the writer fell more than MAX_BEHIND_S behind and started afresh
    latencies_ms: list[float] = dataclasses.field(default_factory=list)
    # Building each batch (no store involved), timed the same way: what the machine's load
    # alone does to a millisecond of this process's work.
    build_ms: list[float] = dataclasses.field(default_factory=list)


def writer_main(conn: Connection, broker: str, settings: Settings) -> None:
    """Put ``settings.batch`` messages every ``settings.period_s`` into the store at
    ``broker`` (opened with its background flusher and cleaner, as any writer), timing each
    ``put_batch`` with ``perf_counter``, until told to stop."""
    state = _WriterState()
    store: MessageStore | None = None
    try:
        store = MessageStore(broker, settings.store_config())
        assert store.retention is not None
        # The retention service's clock is injectable for exactly this: its cleaner thread
        # reads it each round (see RESERVED_HOURS). The store's own clock, which stamps the
        # records and names the IndexFiles, stays the wall clock.
        lead = settings.retention_lead_ms
        store.retention.clock_ms = lambda: time.time_ns() // 1_000_000 + lead
    except Exception:
        state.errors.append(_failure())
        state.stopped = True
    conn.send(("ready", os.getpid()))
    # The run starts when every worker is ready (the Spark session takes a while).
    if conn.recv()[0] != "go" and store is not None:
        _close(store, state)
        store = None
    due = time.monotonic()
    while True:
        if conn.poll(max(0.0, due - time.monotonic()) if store is not None else None):
            request, _ = conn.recv()
            if request == "stop":
                break
            conn.send(("stats", state.report()))
            continue
        if store is None:
            continue
        now = time.monotonic()
        if now < due:
            continue
        t0 = time.perf_counter()
        table = messages(state.written, settings.batch)
        state.build_ms.append((time.perf_counter() - t0) * 1000)
        try:
            t0 = time.perf_counter()
            store.put_batch(table)
            state.latencies_ms.append((time.perf_counter() - t0) * 1000)
        except Exception:
            state.errors.append(_failure())
            state.stopped = True
            _close(store, state)
            store = None
            continue
        state.written += settings.batch
        state.puts += 1
        due += settings.period_s
        if now - due > MAX_BEHIND_S:
            due = now
            state.slips += 1
    if store is not None:
        _close(store, state)
    conn.send(("stats", state.report()))


def _close(store: MessageStore, state: _WriterState) -> None:
    try:
        store.close()
    except Exception:
        state.errors.append(_failure())


# -- the reader -----------------------------------------------------------------------------


@dataclasses.dataclass
class _ReaderState(_Counters):
    read: int = 0
    batches: int = 0
    batch_ms: list[float] = dataclasses.field(default_factory=list)
    heap: dict[str, float] = dataclasses.field(default_factory=dict)


def heap_figures() -> dict[str, float]:
    """Where this process's anonymous memory goes, for telling a leak from an allocator that
    keeps what was freed: glibc malloc's heaps over every arena (``malloc_info``: bytes
    obtained from the system, and of those the bytes not free), Arrow's pool (bytes
    allocated), and the count of Python objects the collector tracks."""
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(prefix="malloc-info-") as out:
        fp = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        xml = Path(out.name).read_text()
    # The totals follow the last </heap>: free chunks by kind, then the system's bytes.
    tail = xml[xml.rfind("</heap>") :]
    free = sum(
        int(n) for n in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"', tail)
    )
    current = int(re.search(r'<system type="current" size="(\d+)"', tail).group(1))  # type: ignore[union-attr]
    mmapped = int(re.search(r'<total type="mmap" count="\d+" size="(\d+)"', tail).group(1))  # type: ignore[union-attr]
    mib = 1 << 20
    return {
        "malloc_heap_mib": round((current + mmapped) / mib, 2),
        "malloc_used_mib": round((current + mmapped - free) / mib, 2),
        "arrow_mib": round(pa.total_allocated_bytes() / mib, 2),
        "py_objects": float(len(gc.get_objects())),
    }


class _Stream:
    """The streaming source as Spark drives it, without Spark: the source's own stream reader
    (:class:`rocketstore.source.format.RocketStoreStreamReader`), its offsets passed through JSON as
    Spark's offset log passes them, every partition read with the reader's ``read``."""

    def __init__(self, root: str) -> None:
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        from rocketstore.source.format import RocketStoreStreamReader, spark_schema

        opts = {"path": root, "topic": TOPIC, "startingOffsets": "earliest"}
        self.reader = RocketStoreStreamReader(opts, spark_schema(opts))
        self.limit = ReadAllAvailable()
        self.start: dict[str, Any] = self.reader.initialOffset()

    def micro_batch(self) -> int:
        """Plan and read one micro-batch; returns its messages (0: nothing new). Checks that
        each queue's messages are exactly its offsets ``[start, end)``, each the message the
        writer put there."""
        end = json.loads(json.dumps(self.reader.latestOffset(self.start, self.limit)))
        if end == self.start:
            return 0
        got: dict[int, list[npt.NDArray[np.int64]]] = {}
        for partition in self.reader.partitions(self.start, end):
            for batch in self.reader.read(partition):
                queue = np.asarray(batch.column("queueId"), dtype=np.int64)
                offset = np.asarray(batch.column("queueOffset"), dtype=np.int64)
                wrong = body_sequence(batch.column("body")) != offset * QUEUES + queue
                if wrong.any():
                    i = int(np.flatnonzero(wrong)[0])
                    raise AssertionError(
                        f"queue {queue[i]} offset {offset[i]} holds another message's body"
                    )
                for q in np.unique(queue).tolist():
                    got.setdefault(q, []).append(offset[queue == q])
        total = 0
        for qid, stop in end[TOPIC][BROKER].items():
            begin = self.start.get(TOPIC, {}).get(BROKER, {}).get(qid, 0)
            seen = np.concatenate(got.pop(int(qid), [np.empty(0, np.int64)]))
            if not np.array_equal(seen, np.arange(begin, stop)):
                raise AssertionError(
                    f"queue {qid}: read {len(seen)} messages for offsets [{begin}, {stop})"
                )
            total += len(seen)
        if got:
            raise AssertionError(f"read messages of queues {sorted(got)} it did not plan")
        self.reader.commit(end)
        self.start = end
        return total


def reader_main(conn: Connection, root: str, settings: Settings) -> None:
    """Follow the topic with a micro-batch every ``settings.trigger_s`` (a processing-time
    trigger), from the earliest offsets, until told to drain. A micro-batch that fails is an
    error, and is planned and read again at the next trigger, as Spark runs a failed task
    again; after :data:`READ_ATTEMPTS` failures in a row the reader gives up."""
    state = _ReaderState()
    stream: _Stream | None = None
    failures = 0
    try:
        stream = _Stream(root)
    except Exception:
        state.errors.append(_failure())
        state.stopped = True
    conn.send(("ready", os.getpid()))
    due = time.monotonic()
    target: int | None = None
    drain_by = 0.0
    while True:
        if target is not None and (stream is None or state.read >= target):
            break
        if target is not None and time.monotonic() > drain_by:
            state.errors.append(
                f"drain: read {state.read} of {target} messages in {DRAIN_LIMIT_S:.0f} s"
            )
            break
        if conn.poll(max(0.0, due - time.monotonic()) if stream is not None else None):
            request, value = conn.recv()
            if request == "drain":
                target, drain_by = int(value), time.monotonic() + DRAIN_LIMIT_S
            else:
                state.heap = heap_figures()
                conn.send(("stats", state.report()))
            continue
        now = time.monotonic()
        if stream is None or now < due:
            continue
        due = max(due + settings.trigger_s, now)
        try:
            t0 = time.perf_counter()
            got = stream.micro_batch()
        except Exception:
            state.errors.append(_failure())
            failures += 1
            if failures == READ_ATTEMPTS:
                stream, state.stopped = None, True
            continue
        failures = 0
        if got:
            state.batch_ms.append((time.perf_counter() - t0) * 1000)
            state.read += got
            state.batches += 1
    conn.send(("stats", state.report()))


# -- the Spark query ------------------------------------------------------------------------


@dataclasses.dataclass
class _SparkState(_ReaderState):
    # Starts of the query that failed before its first trigger (Spark gives the source's Python
    # process 10 s to connect back, which a heavily loaded machine can miss); each is retried.
    start_failures: list[str] = dataclasses.field(default_factory=list)
    triggered: bool = False  # a trigger ran: the source is up
    ended: str | None = None  # why the query ended


class _SparkQuery:
    """The soak's Spark query: its starts and restarts, and what its listener counted. Every
    field is read and written under ``counted`` (the listener's events come on a py4j thread,
    the supervisor runs on one of its own)."""

    def __init__(self, root: str, checkpoint: str, settings: Settings) -> None:
        self.root, self.checkpoint, self.settings = root, checkpoint, settings
        self.state = _SparkState()
        self.counted = threading.Condition()
        self.queries: list[Any] = []  # the query now running is the last
        self.draining = False

    def progressed(self, p: Any) -> None:
        """A progress event: a trigger ran, and its rows are counted."""
        with self.counted:
            self.state.triggered = True
            if p.numInputRows:
                self.state.read += int(p.numInputRows)
                self.state.batches += 1
                self.state.batch_ms.append(float(p.durationMs.get("triggerExecution", 0)))
            self.counted.notify_all()

    def idled(self) -> None:
        with self.counted:
            self.state.triggered = True
            self.counted.notify_all()

    def terminated(self, exception: Any) -> None:
        with self.counted:
            self.state.ended = str(exception) if exception else "stopped"
            if self.state.triggered and exception:
                self.state.errors.append(f"the query ended: {exception}")
            self.counted.notify_all()

    def launch(self, spark: Any) -> bool:
        """Start the query, up to :data:`SPARK_STARTS` times, until a trigger runs."""
        state = self.state
        for _ in range(SPARK_STARTS):
            with self.counted:
                state.triggered, state.ended = False, None
            query = (
                spark.readStream.format("rocketstore")
                .option("path", self.root)
                .option("topic", TOPIC)
                .option("startingOffsets", "earliest")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", self.checkpoint)
                .trigger(processingTime=f"{self.settings.spark_trigger_s} seconds")
                .start()
            )
            self.queries.append(query)
            with self.counted:
                self.counted.wait_for(
                    lambda: state.triggered or state.ended is not None, START_LIMIT_S
                )
                if state.triggered:
                    return True
                state.start_failures.append(state.ended or f"no trigger in {START_LIMIT_S:.0f} s")
            query.stop()
        with self.counted:
            state.errors.append(f"the query did not start: {state.start_failures}")
        return False

    def supervise(self, spark: Any) -> None:
        """Start the query again each time it fails, until the drain or the last restart."""
        for restart in range(SPARK_RESTARTS + 1):
            with self.counted:
                self.counted.wait_for(lambda: self.draining or self.state.ended is not None)
                if self.draining:
                    return
                if restart == SPARK_RESTARTS:
                    break
            try:
                if not self.launch(spark):
                    break
            except Exception:
                with self.counted:
                    self.state.errors.append(_failure())
                break
        with self.counted:
            self.state.stopped = True

    def drain(self, target: int) -> None:
        """Stop restarting, and wait until ``target`` messages were read (or the query
        stopped for good, or :data:`DRAIN_LIMIT_S` passed: an error)."""
        state = self.state
        with self.counted:
            self.draining = True
            self.counted.notify_all()
            self.counted.wait_for(lambda: state.read >= target or state.stopped, DRAIN_LIMIT_S)
            if state.read < target:
                state.errors.append(
                    f"drain: read {state.read} of {target} messages in {DRAIN_LIMIT_S:.0f} s"
                )


def _listener(q: _SparkQuery) -> Any:
    """A listener handing the query's events to ``q`` (pyspark is imported here, in the Spark
    worker's process alone)."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class ReadCounter(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            q.progressed(event.progress)

        def onQueryIdle(self, event: Any) -> None:
            q.idled()

        def onQueryTerminated(self, event: Any) -> None:
            q.terminated(event.exception)

    return ReadCounter()


def spark_main(conn: Connection, root: str, checkpoint: str, settings: Settings) -> None:
    """The real streaming source in a ``local[2]`` Spark session:
    ``readStream.format("rocketstore")`` from the earliest offsets into the ``noop`` sink with
    a processing-time trigger of ``settings.spark_trigger_s``. Rows are counted from the
    query's progress events (a listener, so none is missed however many batches pass). Ready
    once the query's first trigger ran (an idle or a progress event). A query that fails is
    an error, and is started again from its checkpoint (as a deployment restarts a failed
    query; ``local[2]`` runs no task twice), up to :data:`SPARK_RESTARTS` times."""
    from bench.session import local_session

    q = _SparkQuery(root, checkpoint, settings)
    state = q.state
    spark: Any = None
    supervisor: threading.Thread | None = None
    try:
        spark, _ = local_session("rocketstore-soak")
        spark.streams.addListener(_listener(q))
        if q.launch(spark):
            supervisor = threading.Thread(target=q.supervise, args=(spark,), daemon=True)
            supervisor.start()
        else:
            state.stopped = True
    except Exception:
        state.errors.append(_failure())
        state.stopped = True
    conn.send(("ready", os.getpid()))
    while True:
        request, value = conn.recv()
        if request == "drain":
            break
        with q.counted:
            conn.send(("stats", state.report()))
    q.drain(int(value))
    if supervisor is not None:
        supervisor.join()
    try:
        if q.queries:
            q.queries[-1].stop()
        if spark is not None:
            spark.stop()
    except Exception:
        state.errors.append(_failure())
    with q.counted:
        conn.send(("stats", state.report()))


# -- verify ---------------------------------------------------------------------------------


def verify_main(broker: str, settings: Settings) -> dict[str, Any]:
    """``rocketstore.pipeline.tools.verify.check`` on a read-only open of the store, while the writer writes it (the
    scan stops at the durable point the writer last recorded); its report, problems capped."""
    t0 = time.perf_counter()
    report = verify_read_only(broker, settings.store_config())
    out = report.to_json()
    out["problems"] = out["problems"][:10]
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out
