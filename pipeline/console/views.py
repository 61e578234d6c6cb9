"""What each console page shows, gathered from a store root through the store's own readers.

Every function opens the brokers it needs read-only (:class:`MessageStore` with
``read_only=True``, as the CLI's reading commands do: no lock, nothing written) and closes them
before returning, so a page never holds a store open between requests and never keeps a writer
from deleting expired files. While writers append, a page shows the store as its read-only open
found it (the store's visibility rule applies on shared storage); the next refresh shows more.

Thread-safety: each call opens its own stores, so calls may run in parallel threads (Starlette
runs them in its thread pool); the returned values are plain data.

Reuses: :meth:`MessageStore.queue_infos` (``rocketstore queues``), :meth:`~MessageStore.get_messages`
(``get``), :meth:`~MessageStore.query_by_key` (``query-key``), :meth:`~MessageStore.get_by_msg_id`
(``query-msgid``), :meth:`~MessageStore.get_message` (``query-offset``),
:func:`rocketstore.pipeline.lag.consumer_lag` and :func:`~rocketstore.pipeline.lag.group_lag`
(``lag``); body formats through :mod:`rocketstore.pipeline.bodyformat` and the root's schema
registry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline import bodyformat, record
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.console import rates
from rocketstore.pipeline.errors import NotFoundError, OffsetOutOfRangeError, StoreError
from rocketstore.pipeline.groups import broker_offsets
from rocketstore.pipeline.lag import (
    CommittedOffsets,
    QueueLag,
    consumer_lag,
    group_lag,
    group_topics,
    read_committed_offsets,
    read_once,
    store_bounds,
)
from rocketstore.pipeline.metrics import DEFAULT_PER_QUEUE_LIMIT
from rocketstore.pipeline.reads import MAX_TIMESTAMP
from rocketstore.pipeline.results import QueueEnds
from rocketstore.pipeline.retention_policy import statvfs_used_ratio
from rocketstore.pipeline.root import StoreRoot, TopicMeta
from rocketstore.pipeline.store import MessageStore

HOUR_MS = 3_600_000
BODY_CAP = 4096  # bytes of a body shown on a message's page
PREVIEW_CHARS = 100  # characters of a body shown in a list
SIZE_SAMPLE = 16  # units read per queue to estimate a topic's bytes and time span
HOUR_SAMPLE = 120  # units read per queue for the last hour's write rate
# A broker of more queues than this is drawn from each queue's first and last units alone
# (WIDE_SAMPLE), all at once (see overview): 8,192 units sampled a broker at most, not 16 and
# 120 a queue of 40,000.
WIDE_QUEUES = 512
WIDE_SAMPLE = 2
TOPIC_SAMPLE = 240  # units read per queue for a topic's messages-per-minute chart


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclasses.dataclass(frozen=True)
class Console:
    """What the console serves: a store root (or one store directory), the settings to open
    its brokers with, and the Spark checkpoints named on the command line."""

    root: Path
    config: StoreConfig
    checkpoints: tuple[Path, ...] = ()
    per_queue_limit: int = DEFAULT_PER_QUEUE_LIMIT  # of /metrics (rocketstore.pipeline.metrics)

    def brokers(self) -> list[tuple[str, Path]]:
        """The root's brokers that hold a store, ``(name, directory)`` in broker order: the
        only directories a request can reach."""
        return [(n, p) for n, p in StoreRoot(self.root).brokers() if (p / "commitlog").is_dir()]

    def topic_meta(self) -> tuple[dict[str, TopicMeta], str | None]:
        """``topics.json`` (empty for a single store directory), and a note when it is
        unreadable."""
        try:
            return StoreRoot(self.root).topics(), None
        except StoreError as exc:
            return {}, str(exc)

    @contextlib.contextmanager
    def open(self, path: Path) -> Iterator[MessageStore]:
        """One broker opened read-only (no lock, nothing written), closed on exit."""
        with MessageStore(path, self.config, read_only=True) as store:
            yield store


# -- overview ----------------------------------------------------------------------------------


@dataclasses.dataclass
class BrokerRow:
    name: str
    path: Path
    queues: int
    messages: int
    commitlog_bytes: int
    store_bytes: int
    min_phy: int
    max_phy: int
    oldest: int | None
    newest: int | None
    disk_ratio: float


@dataclasses.dataclass
class TopicRow:
    name: str
    body_format: str
    brokers: set[str]
    queues: int
    messages: int
    bytes: float
    oldest: int | None
    newest: int | None
    sampled: bool


@dataclasses.dataclass
class Overview:
    brokers: list[BrokerRow]
    topics: list[TopicRow]
    edges: npt.NDArray[np.int64]
    rate: list[tuple[str, npt.NDArray[np.float64]]]
    rate_sampled: bool
    disk_max_ratio: float
    file_reserved_hours: int
    delete_when: str
    horizon: int
    note: str | None
    generated: int
    size_sample: int = SIZE_SAMPLE  # units a queue sampled at most, for bytes and spans
    hour_sample: int = HOUR_SAMPLE  # ... for the last hour's rate


def _dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (their apparent sizes), 0 if it is missing."""
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a file retention deleted meanwhile
                total += os.stat(os.path.join(parent, name), follow_symlinks=False).st_size
    return total


def _span(
    old: int | None, new: int | None, times: npt.NDArray[np.int64]
) -> tuple[int | None, int | None]:
    if len(times) == 0:
        return old, new
    lo, hi = int(times.min()), int(times.max())
    return (lo if old is None else min(old, lo)), (hi if new is None else max(new, hi))


def overview(console: Console) -> Overview:
    """Brokers and topics with their counts, bytes and time spans, disk use, and the write
    rate of the last hour per broker. Bytes and the time spans come from a sample of each
    queue's units (:data:`SIZE_SAMPLE`, and :data:`HOUR_SAMPLE` for the rate); counts are
    exact (the queues' bounds). A broker of more than :data:`WIDE_QUEUES` queues is drawn from
    each queue's first and last units only (:func:`_wide`): what a page costs stays bounded
    however many queues there are."""
    now = now_ms()
    edges, _ = rates.bucket_edges(now - HOUR_MS, now - 1)
    meta, note = console.topic_meta()
    brokers: list[BrokerRow] = []
    topics: dict[str, TopicRow] = {}
    series: list[tuple[str, npt.NDArray[np.float64]]] = []
    rate_sampled = False
    sample = (SIZE_SAMPLE, HOUR_SAMPLE)
    for name, path in console.brokers():
        with console.open(path) as store:
            ends = store.queue_ends()
            row = BrokerRow(
                name,
                path,
                len(ends),
                0,
                0,
                0,
                store.min_phy_offset,
                store.max_phy_offset,
                None,
                None,
                statvfs_used_ratio(path),
            )
            broker = _Broker(store, row, topics, meta, edges)
            if len(ends) > WIDE_QUEUES:
                per_minute, sampled = _wide(broker, ends)
                sample = (WIDE_SAMPLE, WIDE_SAMPLE)
            else:
                per_minute, sampled = _sampled(broker, ends)
            rate_sampled |= sampled
        row.commitlog_bytes = _dir_bytes(path / "commitlog")
        # Every ConsumeQueue file is the configured size: counted, not listed and stat-ed.
        cq_bytes = sum(e.files for e in ends) * console.config.mapped_file_size_consume_queue
        row.store_bytes = row.commitlog_bytes + cq_bytes + _dir_bytes(path / "index")
        brokers.append(row)
        series.append((name, per_minute))
    for name, tm in meta.items():  # topics created in topics.json with nothing stored yet
        if name not in topics:
            topics[name] = TopicRow(name, tm.body_format, set(), 0, 0, 0.0, None, None, False)
    cfg = console.config
    return Overview(
        brokers,
        sorted(topics.values(), key=lambda r: r.name),
        edges,
        series,
        rate_sampled,
        cfg.disk_max_used_space_ratio / 100,
        cfg.file_reserved_time,
        cfg.delete_when,
        now - cfg.file_reserved_time * HOUR_MS,
        note,
        now,
        *sample,
    )


@dataclasses.dataclass
class _Broker:
    """What the overview gathers of one broker: its store (open), its row, the page's topic
    rows (shared by the brokers), ``topics.json`` and the last hour's bucket edges."""

    store: MessageStore
    row: BrokerRow
    topics: dict[str, TopicRow]
    meta: dict[str, TopicMeta]
    edges: npt.NDArray[np.int64]

    def topic(self, name: str) -> TopicRow:
        t = self.topics.get(name)
        if t is None:
            fmt = self.meta[name].body_format if name in self.meta else "binary"
            t = self.topics[name] = TopicRow(name, fmt, set(), 0, 0, 0.0, None, None, False)
        t.brokers.add(self.row.name)
        return t


def _sampled(b: _Broker, ends: list[QueueEnds]) -> tuple[npt.NDArray[np.float64], bool]:
    """A broker's queues, each sampled on its own (:data:`SIZE_SAMPLE`, :data:`HOUR_SAMPLE`
    units): into its row and the topic rows; returns the broker's messages per minute of the
    last hour and whether they are estimated."""
    store, row, edges = b.store, b.row, b.edges
    per_minute = np.zeros(len(edges) - 1)
    rate_sampled = False
    for e in ends:
        info = e.info
        depth = info.max_offset - info.min_offset
        row.messages += depth
        span = rates.sample_queue(
            store, info.topic, info.queue_id, info.min_offset, info.max_offset, SIZE_SAMPLE
        )
        t = b.topic(info.topic)
        t.queues += 1
        t.messages += depth
        t.bytes += depth * span.mean_size
        t.sampled |= span.sampled
        t.oldest, t.newest = _span(t.oldest, t.newest, span.times)
        row.oldest, row.newest = _span(row.oldest, row.newest, span.times)
        if len(span.times) and span.times.max() >= edges[0]:
            start = rates.offset_at(
                store, info.topic, info.queue_id, info.min_offset, info.max_offset, int(edges[0])
            )
            hour = rates.sample_queue(
                store, info.topic, info.queue_id, start, info.max_offset, HOUR_SAMPLE
            )
            rate_sampled |= hour.sampled
            per_minute += rates.counts(hour, start, edges)
    return per_minute, rate_sampled


def _wide(b: _Broker, ends: list[QueueEnds]) -> tuple[npt.NDArray[np.float64], bool]:
    """:func:`_sampled` for a broker of many queues: each queue is sampled at its first and
    last units, which its bounds were read with (:meth:`MessageStore.queue_ends`), and their
    store times are read all at once; the time spans are exact (a queue's first and last
    messages are its oldest and newest), bytes and the rate estimated between them."""
    store, row, edges = b.store, b.row, b.edges
    n = len(ends)
    low = np.array([e.info.min_offset for e in ends], dtype=np.int64)
    depth = np.array([e.info.max_offset for e in ends], dtype=np.int64) - low
    units = np.zeros((2, 2, n), dtype=np.int64)  # (first, last) x (offset, size) x queue
    for i, e in enumerate(ends):
        if e.first is not None and e.last is not None:
            units[0, :, i] = e.first
            units[1, :, i] = e.last
    times = [store.commitlog.store_timestamps(units[j, 0], units[j, 1]) for j in (0, 1)]
    live = [(t >= 0) & (depth > 0) for t in times]
    at = [low, np.maximum(low, low + depth - 1)]
    one = depth == 1
    sizes = (units[0, 1] * live[0] + units[1, 1] * (live[1] & ~one)).astype(np.float64)
    read = live[0].astype(np.int64) + (live[1] & ~one)
    mean = np.divide(sizes, read, out=np.zeros(n), where=read > 0)
    # Per topic, all at once: queues, messages, bytes, oldest and newest store time.
    names, topic_of = np.unique([e.info.topic for e in ends], return_inverse=True)
    count = np.bincount(topic_of, minlength=len(names))
    messages = np.bincount(topic_of, weights=depth, minlength=len(names))
    weight = np.bincount(topic_of, weights=depth * mean, minlength=len(names))
    wider = np.bincount(topic_of, weights=depth > WIDE_SAMPLE, minlength=len(names)) > 0
    never = np.iinfo(np.int64).max
    oldest = np.full(len(names), never, dtype=np.int64)
    newest = np.full(len(names), -1, dtype=np.int64)
    for j in (0, 1):
        np.minimum.at(oldest, topic_of[live[j]], times[j][live[j]])
        np.maximum.at(newest, topic_of[live[j]], times[j][live[j]])
    row.messages += int(depth.sum())
    for k, topic in enumerate(names.tolist()):
        t = b.topic(topic)
        t.queues += int(count[k])
        t.messages += int(messages[k])
        t.bytes += float(weight[k])
        t.sampled |= bool(wider[k])
        if newest[k] >= 0:
            spans = np.array([oldest[k], newest[k]], dtype=np.int64)
            t.oldest, t.newest = _span(t.oldest, t.newest, spans)
            row.oldest, row.newest = _span(row.oldest, row.newest, spans)
    newest = np.where(live[1], times[1], np.where(live[0], times[0], -1))
    hour = (depth > 0) & (newest >= edges[0])
    per_minute = rates.ends_counts(
        low[hour],
        (at[0][hour], at[1][hour]),
        (np.where(live[0], times[0], -1)[hour], np.where(live[1], times[1], -1)[hour]),
        depth[hour],
        edges,
    )
    return per_minute, bool(np.any(depth[hour] > WIDE_SAMPLE))


# -- topic -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class QueueRow:
    broker: str
    queue_id: int
    min_offset: int
    max_offset: int
    oldest: int | None
    newest: int | None

    @property
    def depth(self) -> int:
        return self.max_offset - self.min_offset


@dataclasses.dataclass
class TopicView:
    name: str
    body_format: str
    queues: list[QueueRow]
    edges: npt.NDArray[np.int64]
    width_ms: int
    series: list[tuple[str, npt.NDArray[np.float64]]]
    sampled: bool
    units_read: int
    generated: int

    @property
    def messages(self) -> int:
        return sum(q.depth for q in self.queues)


def topic(console: Console, name: str) -> TopicView:
    """Every queue of topic ``name`` on every broker, and its messages per minute (per
    broker) over the whole span the store holds, from up to :data:`TOPIC_SAMPLE` units a
    queue. :class:`NotFoundError` when no broker has it and ``topics.json`` does not name it."""
    meta, _ = console.topic_meta()
    samples: list[tuple[str, int, rates.QueueSample]] = []
    rows: list[QueueRow] = []
    for broker, path in console.brokers():
        with console.open(path) as store:
            for info in store.queue_infos(name):
                s = rates.sample_queue(
                    store, name, info.queue_id, info.min_offset, info.max_offset, TOPIC_SAMPLE
                )
                samples.append((broker, info.min_offset, s))
                rows.append(
                    QueueRow(
                        broker,
                        info.queue_id,
                        info.min_offset,
                        info.max_offset,
                        int(s.times.min()) if len(s.times) else None,
                        int(s.times.max()) if len(s.times) else None,
                    )
                )
    if not rows and name not in meta:
        raise NotFoundError(f"no topic {name!r} in this root")
    times = [t for r in rows for t in (r.oldest, r.newest) if t is not None]
    now = now_ms()
    # Up to now (a quiet topic shows its silence), and at least half an hour wide.
    end = max([now, *times])
    start = min([end - HOUR_MS // 2, *times])
    edges, width = rates.bucket_edges(start, end)
    by_broker: dict[str, npt.NDArray[np.float64]] = {}
    for broker, low, s in samples:
        counted = rates.counts(s, low, edges)
        by_broker[broker] = by_broker.get(broker, np.zeros(len(counted))) + counted
    return TopicView(
        name,
        meta[name].body_format if name in meta else "binary",
        rows,
        edges,
        width,
        sorted(by_broker.items()),
        any(s.sampled for _, _, s in samples),
        sum(len(s.offsets) for _, _, s in samples),
        now,
    )


# -- messages ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Found:
    """A message and the broker whose store holds it."""

    broker: str
    message: record.MessageExt


@dataclasses.dataclass
class Browse:
    """A page of one queue: ``next_offset`` continues it (``None`` at the end for now)."""

    broker: str
    queue_id: int
    offset: int
    min_offset: int
    max_offset: int
    status: str
    messages: list[Found]
    next_offset: int | None


def topic_names(console: Console) -> list[str]:
    """Every topic with a queue in a broker or named in ``topics.json``, sorted."""
    names = set(console.topic_meta()[0])
    for _, path in console.brokers():
        with console.open(path) as store:
            names.update(store.topics())
    return sorted(names)


def browse(
    console: Console,
    broker: tuple[str, Path],
    topic_name: str,
    queue_id: int,
    *,
    offset: int | None,
    when: int | None,
    count: int,
) -> Browse:
    """Up to ``count`` messages of one queue from queue ``offset`` (default: the queue's
    first), or from the offset of store time ``when`` (as ``query-time`` finds it), as
    ``rocketstore get`` reads them. :class:`NotFoundError` for a queue the broker lacks."""
    name, path = broker
    with console.open(path) as store:
        queues = [i.queue_id for i in store.queue_infos(topic_name)]
        if queue_id not in queues:
            raise NotFoundError(
                f"topic {topic_name!r} has no queue {queue_id} on {name} "
                f"(its queues there: {', '.join(map(str, queues)) or 'none'})"
            )
        low, high = store.min_offset(topic_name, queue_id), store.max_offset(topic_name, queue_id)
        if when is not None:
            offset = store.offset_by_time(topic_name, queue_id, when)
        start = low if offset is None else offset
        result = store.get_messages(topic_name, queue_id, start, count)
    found = [Found(name, m) for m in result.messages]
    more = result.next_begin_offset if result.next_begin_offset < result.max_offset else None
    return Browse(
        name,
        queue_id,
        start,
        low,
        high,
        result.status,
        found,
        more if found or result.status == "NO_MATCHED_MESSAGE" else None,
    )


def by_key(console: Console, topic_name: str, key: str, count: int) -> list[Found]:
    """Messages of ``topic_name`` with ``key`` (a KEYS token or UNIQ_KEY) in every broker's
    IndexFile, newest first per broker, as ``query-key`` finds them."""
    out: list[Found] = []
    for name, path in console.brokers():
        with console.open(path) as store:
            for m in store.query_by_key(
                topic_name, key, begin=0, end=MAX_TIMESTAMP, max_count=count
            ):
                out.append(Found(name, m))
    out.sort(key=lambda f: f.message.store_timestamp, reverse=True)
    return out[:count]


def _at(store: MessageStore, offset: int) -> record.MessageExt:
    """The message a record starting at CommitLog ``offset`` holds; :class:`NotFoundError`
    when none starts there (as ``query-offset`` checks)."""
    low, high = store.min_phy_offset, store.max_phy_offset
    if not low <= offset < high:
        raise NotFoundError(
            f"CommitLog offset {offset} is outside the log, which holds [{low}, {high})"
        )
    if not store.commitlog.starts_record(offset):
        raise NotFoundError(f"no record starts at CommitLog offset {offset}")
    return store.get_message(offset)


def by_offset(console: Console, broker: tuple[str, Path], offset: int) -> Found:
    name, path = broker
    with console.open(path) as store:
        return Found(name, _at(store, offset))


def by_msg_id(console: Console, msg_id: str) -> Found:
    """The message an offset msgId names, in whichever broker's log holds a record with that
    id at its offset (each broker numbers its own log)."""
    _, offset = record.parse_msg_id(msg_id)
    for name, path in console.brokers():
        with console.open(path) as store:
            try:
                _at(store, offset)
                return Found(name, store.get_by_msg_id(msg_id))
            except OffsetOutOfRangeError:
                continue
            except NotFoundError:
                continue
    raise NotFoundError(f"no broker of this root holds a message with msgId {msg_id}")


@dataclasses.dataclass(frozen=True)
class Body:
    """A body as the page shows it: ``kind`` is ``avro``, ``json``, ``text`` or ``hex``;
    ``text`` is at most about :data:`BODY_CAP` bytes' worth (``truncated`` says when cut)."""

    kind: str
    text: str
    size: int
    truncated: bool
    note: str | None = None


def _text_or_hex(body: bytes, note: str | None = None) -> Body:
    shown = body[:BODY_CAP]
    cut = len(body) > BODY_CAP
    try:
        # A cut may split a character: decode what is whole.
        text = shown.decode("utf-8") if not cut else shown.decode("utf-8", errors="ignore")
        if all(c.isprintable() or c in "\n\r\t" for c in text):
            return Body("text", text, len(body), cut, note)
    except UnicodeDecodeError:
        pass
    return Body("hex", shown.hex(" ", 1), len(body), cut, note)


def decode_body(console: Console, msg: record.MessageExt, body_format: str) -> Body:
    """The body decoded as its topic's body format with the schema its message names
    (``rsSchema``, registered in the root), pretty-printed; text or hex for ``binary`` or when
    it does not decode (with a note saying why)."""
    if body_format not in ("avro", "json"):
        return _text_or_hex(msg.body)
    fp = msg.properties.get(bodyformat.SCHEMA_PROPERTY)
    if not fp or not all(c in "0123456789abcdefABCDEF" for c in fp) or len(fp) > 32:
        return _text_or_hex(msg.body, f"no valid {bodyformat.SCHEMA_PROPERTY} property")
    root = StoreRoot(console.root)
    try:
        schema = bodyformat.BodySchema.from_document(root.load_schema(fp))
        table = bodyformat.decode_bodies(
            [msg.body],
            [fp],
            body_format,
            schema,
            lambda f: bodyformat.BodySchema.from_document(root.load_schema(f)),
            lambda _: ("commitlog", msg.commit_log_offset),
        )
    except (StoreError, ValueError, KeyError) as exc:
        return _text_or_hex(msg.body, f"not decoded as {body_format}: {exc}")
    text = json.dumps(table.to_pylist()[0], indent=2, default=str, ensure_ascii=False)
    cut = len(text.encode()) > BODY_CAP
    return Body(body_format, text[:BODY_CAP], len(msg.body), cut)


def preview(body: bytes) -> str:
    """The start of a body as one line of text (``\\xNN`` for bytes that are not)."""
    head = body[: PREVIEW_CHARS * 4].decode("utf-8", errors="backslashreplace")
    line = "".join(c if c.isprintable() else "·" for c in head[:PREVIEW_CHARS])
    return line + ("…" if len(head) > PREVIEW_CHARS or len(body) > PREVIEW_CHARS * 4 else "")


def fmt_time(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "—"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


# -- consumers ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Consumer:
    """A Spark query (by checkpoint) or a RocketMQ consumer group, and its lag per queue
    (``rows``: what ``rocketstore lag`` prints for it), or why it could not be read."""

    kind: str  # "query" or "group"
    name: str
    rows: list[QueueLag]
    state: str
    error: str | None = None

    @property
    def total(self) -> int:
        return sum(r.lag for r in self.rows if r.lag is not None)


def consumers(console: Console) -> tuple[list[Consumer], str | None]:
    """Each checkpoint's query, then each consumer group, as ``rocketstore lag ROOT
    --checkpoint DIR`` computes them (the same functions, every broker read once for all of
    them); and a note when the groups' offset files could not be read."""
    found: list[Consumer | CommittedOffsets] = []
    for checkpoint in console.checkpoints:
        try:
            progress = read_committed_offsets(checkpoint)
        except (StoreError, OSError) as exc:
            found.append(Consumer("query", str(checkpoint), [], "unreadable", str(exc)))
            continue
        if progress.batch_id is None:
            found.append(Consumer("query", str(checkpoint), [], "no batch committed yet"))
            continue
        found.append(progress)
    note = None
    brokers = None
    try:
        brokers = broker_offsets(console.root)
    except (StoreError, OSError) as exc:
        note = str(exc)
    shown = {t for p in found if isinstance(p, CommittedOffsets) for t, _, _ in p.offsets}
    if brokers is not None:
        shown |= group_topics(brokers, None, None)
    read = read_once(store_bounds(console.config, shown))
    out: list[Consumer] = []
    for checkpoint, item in zip(console.checkpoints, found, strict=True):
        if isinstance(item, Consumer):
            out.append(item)
            continue
        rows = consumer_lag(console.root, item.offsets, console.config, read_bounds=read)
        out.append(Consumer("query", str(checkpoint), rows, f"batch {item.batch_id} committed"))
    if brokers is not None:
        try:
            for g in group_lag(console.root, console.config, brokers=brokers, read_bounds=read):
                out.append(Consumer("group", g.group, g.queues, "config/consumerOffset.json"))
        except (StoreError, OSError) as exc:
            note = str(exc)
    return out, note


def lag_labels(rows: Sequence[QueueLag]) -> list[str]:
    return [f"{r.topic} {r.broker}/{r.queue_id}" for r in rows]
