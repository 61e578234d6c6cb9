"""Appending one writer's rows of a micro-batch to one broker, exactly once (runs on executors).

**Replay detection.** Every message the sink writes gets a deterministic UNIQ_KEY::

     0       4            9          12         16   bytes, shown as 32 uppercase hex digits
     +-------+------------+----------+----------+
     | sink  | batch id   | slot     | sequence |
     +-------+------------+----------+----------+
      sink:     first 4 bytes of SHA-1 of the sink id (the streaming query id by default)
      batch id: Spark's micro-batch id (5 bytes)
      slot:     which writer of the batch wrote it (the broker for foreachBatch, the Spark
                partition for the data source writer; 3 bytes)
      sequence: the row's position among that writer's rows of the batch (4 bytes)

A writer appends its rows in a fixed order, and a crash can only cut the CommitLog after a
whole record, so what landed of a (batch, slot) before a crash is always a prefix of its rows.
The IndexFile indexes UNIQ_KEY, so a re-run finds the length of that prefix with a binary
search of O(log n) key look-ups and appends only the rest. The log itself is the progress
record: there is no separate file that a crash could leave behind the data.

**Where to look.** A (batch, slot) that was never tried is absent, and proving a key absent
means walking its chain in every index file: a cost that grows with the store. So each broker
keeps a note per sink, in its progress file, written by the flush that makes a batch's records
durable::

    sink.<sink fingerprint, hex>: [batch id B, CommitLog offset P, CommitLog offset Q]

where P is where the log ended when an attempt of batch B took the lock, before it wrote, and Q
is the bound that attempt searched from itself. Spark starts batch B+1 only after batch B has
committed, so every attempt of any later batch began after that attempt of B and wrote at or
after P: a batch later than B looks only at index entries from P on (and only at the index
files that reach P); another attempt or another slot of batch B itself looks from Q on. The note
only ever moves to a later batch, so a late, stray attempt of an old batch cannot pull P past a
newer batch's records. A note that is missing, damaged or names a later batch means a search of
the whole index, which is always correct.

A re-run whose rows differ from the first attempt's (a non-deterministic input) is detected
when the last landed row's body CRC does not match, and fails instead of mixing two attempts.

**Single writer.** The broker's lock is held for the whole append; a task waits for it (up to
``lockTimeoutMs``) while another writer holds it.

Thread-safety: one call per task; nothing is shared between calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import os
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import storehost
from rocketstore.pipeline.engine.retention.policy import RUN_INTERVAL_MS
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import SinkFailpoint, SinkReplayError, StoreError, StoreLockedError
from rocketstore.pipeline.format import encode

UNIQ_BYTES = 16
# Fault injection for the test suite, read by each append (on the executors, which inherit the
# driver's environment): never set in use, and not an option of the sink.
FAILPOINT_ENV = "ROCKETSTORE_TEST_FAILPOINT"


@dataclasses.dataclass(frozen=True)
class AppendStats:
    broker: str
    slot: int
    rows: int
    skipped: int
    appended: int
    bytes: int
    first_offset: int
    last_offset: int


def sink_fingerprint(sink_id: str) -> bytes:
    return hashlib.sha1(sink_id.encode("utf-8")).digest()[:4]


def uniq_keys(sink_fp: bytes, batch_id: int, slot: int, n: int, start: int = 0) -> pa.StringArray:
    """The UNIQ_KEYs of rows ``start .. start+n-1`` of one (batch, slot) (layout in the module
    doc)."""
    if not 0 <= batch_id < 1 << 40 or not 0 <= slot < 1 << 24 or start + n >= 1 << 32:
        raise StoreError(
            f"batch {batch_id}, slot {slot}, {start + n} rows: outside the sink's UNIQ_KEY layout"
        )
    raw = np.empty((n, UNIQ_BYTES), dtype=np.uint8)
    raw[:, :4] = np.frombuffer(sink_fp, dtype=np.uint8)
    raw[:, 4:9] = np.frombuffer(batch_id.to_bytes(5, "big"), dtype=np.uint8)
    raw[:, 9:12] = np.frombuffer(slot.to_bytes(3, "big"), dtype=np.uint8)
    raw[:, 12:] = np.arange(start, start + n, dtype=">u4").view(np.uint8).reshape(n, 4)
    return encode.hex_fixed(raw)


class LockWait:
    """A writer's wait for broker locks that other writers hold: up to ``timeout_ms`` in all
    (``lockTimeoutMs``), polling with a pause that doubles from 10 ms up to ``cap_s``.

    Not thread-safe: one per waiting call.
    """

    FIRST_PAUSE_S = 0.01

    def __init__(self, timeout_ms: int, cap_s: float) -> None:
        self.timeout_ms = timeout_ms
        self._deadline = time.monotonic() + timeout_ms / 1000
        self._cap_s = cap_s
        self._pause_s = self.FIRST_PAUSE_S

    def expired(self) -> bool:
        return time.monotonic() >= self._deadline

    def pause(self) -> None:
        time.sleep(self._pause_s)
        self._pause_s = min(self._pause_s * 2, self._cap_s)

    def progressed(self) -> None:
        """A lock was taken: the next wait starts from the shortest pause again."""
        self._pause_s = self.FIRST_PAUSE_S


def open_writer(path: Path, config: StoreConfig, timeout_ms: int) -> MessageStore:
    """Open a broker store for writing, waiting for its lock while another writer holds it.

    The store runs no background threads (an append holds it for one task): closing it
    flushes, and :func:`clean_when_due` runs retention.
    """
    # A lock-holder's append takes from milliseconds to minutes: back off up to 1 s.
    wait = LockWait(timeout_ms, cap_s=1.0)
    while True:
        try:
            return MessageStore(path, config, create=True, background=False)
        except StoreLockedError as exc:
            if wait.expired():
                raise StoreLockedError(
                    f"{exc}; gave up after waiting {timeout_ms} ms (lockTimeoutMs). Another "
                    "query or process is writing this broker"
                ) from None
        wait.pause()


# When this process last ran retention on each broker (monotonic seconds).
_last_clean: dict[str, float] = {}
_last_clean_lock = threading.Lock()


def clean_when_due(store: MessageStore) -> None:
    """One retention round on ``store`` if this process has not run one on it within the
    store's cleaning interval (10 s, RocketMQ's cleanResourceInterval): what a broker's cleaner
    thread does, for writers that hold a store for one task at a time."""
    key = str(store.path)
    now = time.monotonic()
    with _last_clean_lock:
        last = _last_clean.get(key)
        if last is not None and now - last < RUN_INTERVAL_MS / 1000:
            return
        _last_clean[key] = now
    store.clean()


def _valid_note(note: list[int] | None) -> list[int] | None:
    """``note`` if it has the sink's shape ``[batch, P, Q]``, else None (a search of it all)."""
    return note if note is not None and len(note) == 3 else None


def search_bound(note: list[int] | None, batch_id: int) -> int:
    """The CommitLog offset from which an attempt of ``batch_id`` may have written, by the
    broker's note (see the module doc); 0 when the note cannot tell."""
    note = _valid_note(note)
    if note is None:
        return 0
    batch, later, same = note
    if batch < batch_id:
        return later
    if batch == batch_id:
        return same
    return 0


class _Note:
    """A broker's note for one sink, read when an attempt of ``batch_id`` takes the lock (see
    the module doc): ``since`` is where that attempt searches from."""

    def __init__(self, store: MessageStore, sink_fp: bytes, batch_id: int) -> None:
        self.store, self.batch_id = store, batch_id
        self.name = "sink." + sink_fp.hex()
        self.note = _valid_note(store.note(self.name))
        self.since = search_bound(self.note, batch_id)

    def record_attempt(self) -> None:
        """Before the attempt writes: move the note to this batch, never back."""
        if self.note is None or self.note[0] < self.batch_id:
            self.store.set_note(
                self.name, [self.batch_id, self.store.commitlog.max_offset, self.since]
            )


def landed_prefix(
    store: MessageStore,
    topics: pa.Array | pa.ChunkedArray,
    uniq: pa.StringArray,
    min_offset: int = 0,
) -> int:
    """How many leading rows (by UNIQ_KEY) are already in the store, looking at records from
    ``min_offset`` on (see the module doc). ``topics`` stays an Arrow column: the search reads
    a few dozen of its values, never all."""
    n = len(uniq)

    def present(i: int) -> bool:
        topic = topics[i].as_py()
        found = store.query_by_key(topic, uniq[i].as_py(), max_count=1, min_offset=min_offset)
        return bool(found)

    if n == 0 or not present(0):
        return 0
    if present(n - 1):
        return n
    lo, hi = 0, n - 1  # present(lo), not present(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if present(mid):
            lo = mid
        else:
            hi = mid
    return hi


def append(
    path: Path,
    config: StoreConfig,
    rows: pa.Table,
    *,
    sink_fp: bytes,
    batch_id: int,
    slot: int,
    lock_timeout_ms: int,
    chunk_rows: int = 1_000_000,
    attempt: int = 0,
) -> AppendStats:
    """Append ``rows`` (message columns, in their final order) as (batch, slot) to the broker
    store at ``path``, skipping the prefix an earlier attempt already stored.

    Every row is validated before any is written: a bad row fails the call with
    :class:`~rocketstore.pipeline.errors.InvalidMessageError` naming the column, the reason and the count.
    """
    with open_writer(path, config, lock_timeout_ms) as store:
        note = _Note(store, sink_fp, batch_id)
        return _append_all(store, note, rows, sink_fp, batch_id, slot, chunk_rows, attempt)


def _append_all(
    store: MessageStore,
    note: _Note,
    rows: pa.Table,
    sink_fp: bytes,
    batch_id: int,
    slot: int,
    chunk_rows: int,
    attempt: int,
) -> AppendStats:
    """:func:`append`, on a store already open with its lock held and its ``note`` read."""
    n = rows.num_rows
    path = store.path
    # Built once the lock is held: a writer that finds the broker taken and tries another
    # first (rocketstore.sink.writer) has not spent this work in vain.
    uniq = uniq_keys(sink_fp, batch_id, slot, n)
    rows = rows.append_column("uniqKey", uniq)
    topics = rows.column("topic")
    done = landed_prefix(store, topics, uniq, note.since)
    if done:
        _check_same_rows(store, rows, topics, done - 1, path, note.since)
    note.record_attempt()
    rest = rows.slice(done)
    if rest.num_rows > chunk_rows:
        # Validate everything before the first chunk goes in, so a bad row cannot leave
        # half a batch behind.
        encode.prepare(
            rest,
            store.config,
            encode.UniqKeyGenerator(),
            store.clock_ms(),
            storehost.store_host(store.config),
        )
    put = _Puts(store, attempt)
    for start in range(0, rest.num_rows, chunk_rows):
        put(rest.slice(start, chunk_rows))
    clean_when_due(store)
    return AppendStats(path.name, slot, n, done, n - done, put.bytes, put.first, put.last)


class _Puts:
    """Batch puts of one append, with what they stored and the test suite's failpoint."""

    def __init__(self, store: MessageStore, attempt: int) -> None:
        self.store, self.attempt = store, attempt
        self.first = self.last = -1
        self.bytes = self.count = 0

    def __call__(self, part: pa.Table) -> None:
        result = self.store.put_batch(part)
        if len(result):
            if self.first < 0:
                self.first = int(result.commit_log_offsets[0])
            self.last = int(result.commit_log_offsets[-1])
        self.bytes += result.total_bytes
        self.count += 1
        _failpoint(self.count, self.attempt, self.store)


def append_stream(
    path: Path,
    config: StoreConfig,
    parts: Iterator[pa.Table],
    *,
    sink_fp: bytes,
    batch_id: int,
    slot: int,
    lock_timeout_ms: int,
    chunk_rows: int = 1_000_000,
    attempt: int = 0,
    store: MessageStore | None = None,
) -> AppendStats | None:
    """Append the rows of ``parts`` (message columns, in their final order, as they arrive) as
    (batch, slot), each part put as soon as it is there: with ``parts`` a
    :func:`rocketstore.sink.prefetch.prefetched` iterator, the next part is received while this one is
    stored. Returns None when ``parts`` is empty (the broker's lock is not taken then). With
    ``store`` (``path`` already open, its lock held by the caller) the rows go into it, which
    stays open.

    The first attempt of a (batch, slot) finds its first row's UNIQ_KEY absent and streams
    every row through. A re-run that finds it present needs the whole row count to search what
    landed, so it collects the rest and appends as :func:`append` does. Each part is validated
    before it is put, so an invalid row fails the task after the parts before its own: those
    stay, and a re-run with the row fixed or filtered out (the rows before it unchanged) skips
    them and goes on, exactly once.
    """
    first = next(parts, None)
    if first is None:
        return None
    held = contextlib.nullcontext(store) if store else open_writer(path, config, lock_timeout_ms)
    with held as store:
        key = uniq_keys(sink_fp, batch_id, slot, 1)[0].as_py()
        topic = first.column("topic")[0].as_py()
        note = _Note(store, sink_fp, batch_id)
        if store.query_by_key(topic, key, max_count=1, min_offset=note.since):
            rows = pa.concat_tables([first, *parts])
            return _append_all(store, note, rows, sink_fp, batch_id, slot, chunk_rows, attempt)
        note.record_attempt()
        put = _Puts(store, attempt)
        n = 0
        for part in itertools.chain([first], parts):
            for start in range(0, part.num_rows, chunk_rows):
                piece = part.slice(start, chunk_rows)
                k = piece.num_rows
                put(piece.append_column("uniqKey", uniq_keys(sink_fp, batch_id, slot, k, n)))
                n += k
        clean_when_due(store)
    return AppendStats(path.name, slot, n, 0, n, put.bytes, put.first, put.last)


def _check_same_rows(
    store: MessageStore, rows: pa.Table, topics: pa.ChunkedArray, i: int, path: Path, since: int
) -> None:
    key = rows.column("uniqKey")[i].as_py()
    stored = store.query_by_key(topics[i].as_py(), key, max_count=1, min_offset=since)[0]
    body = rows.column("body")[i].as_py() or b""
    if zlib.crc32(stored.body) != zlib.crc32(body):
        raise SinkReplayError(
            f"{path}: micro-batch re-run brought a different row {i} (UNIQ_KEY {key}) than the "
            "attempt that already stored it; the sink's input must be deterministic on replay "
            "(a replayable source, no rand() or current_timestamp() before the sink)"
        )


def _failpoint(chunks: int, attempt: int, store: MessageStore) -> None:
    """Test-only fault injection from ``$ROCKETSTORE_TEST_FAILPOINT``, on a task's first attempt
    only.

    ``after_chunk:N:FILE`` raises after N chunks; ``once_after_chunk:N:FILE`` does so in the
    first task to get there only (in any process on any host that sees FILE: it fires when it
    creates FILE); ``hang_after_chunk:N:FILE`` flushes and blocks forever, for a test that kills
    the whole process while a batch is half done. Each first appends a line to FILE, so that a
    test sees that it fired. ``@PATH`` reads the spec from the file PATH, when it exists.
    """
    spec = os.environ.get(FAILPOINT_ENV)
    if spec and spec.startswith("@"):
        # Indirect, for a long-lived server whose environment is fixed at start (Spark
        # Connect): the spec is read from the named file, and no file means no failpoint.
        try:
            with open(spec[1:], encoding="utf-8") as f:
                spec = f.read().strip()
        except FileNotFoundError:
            return
    if not spec or attempt != 0:
        return
    kind, _, rest = spec.partition(":")
    count, _, marker = rest.partition(":")
    kinds = ("after_chunk", "once_after_chunk", "hang_after_chunk")
    if kind not in kinds or not count.isdigit() or not marker:
        raise SinkFailpoint(f"{FAILPOINT_ENV}={spec!r}: expected KIND:N:FILE")
    if chunks != int(count):
        return
    if kind == "once_after_chunk":
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            return
    if kind == "hang_after_chunk":
        store.flush()  # what this attempt stored is on disk before the test kills the process
    with open(marker, "a", encoding="utf-8") as fired:
        fired.write(f"{kind} pid={os.getpid()} broker={store.path.name} chunks={chunks}\n")
    if kind != "hang_after_chunk":
        raise SinkFailpoint(f"failpoint {spec}: task stopped after {chunks} chunk(s)")
    while True:
        time.sleep(3600)
