"""What each console page shows, gathered from a store root through the store's own readers
(the overview's, sampled, in :mod:`.overview`), and the :class:`Console` they all read.

Every function opens the brokers it needs read-only (:class:`MessageStore` with
``read_only=True``, as the CLI's reading commands do: no lock, nothing written) and closes them
before returning, so a page never holds a store open between requests and never keeps a writer
from deleting expired files. While writers append, a page shows the store as its read-only open
found it (the store's visibility rule applies on shared storage); the next refresh shows more.
With the tier on, the pages of messages read both tiers
(:class:`~rocketstore.pipeline.tools.bothtiers.BothTiers`, as the CLI does), through one S3
client kept for the console's life.

Thread-safety: each call opens its own stores, so calls may run in parallel threads (Starlette
runs them in its thread pool); the returned values are plain data.

Reuses: :meth:`MessageStore.queue_infos` (``rocketstore queues``), :meth:`~MessageStore.get_messages`
(``get``), :meth:`~MessageStore.query_by_key` (``query-key``), :meth:`~MessageStore.get_by_msg_id`
(``query-msgid``), :meth:`~MessageStore.get_message` (``query-offset``),
:func:`rocketstore.pipeline.tools.lag.consumer_lag` and :func:`~rocketstore.pipeline.tools.lag.group_lag`
(``lag``); body formats through :mod:`rocketstore.pipeline.format.bodyformat` and the root's schema
registry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.console import rates
from rocketstore.pipeline.engine.groups import broker_offsets
from rocketstore.pipeline.engine.reads import MAX_TIMESTAMP
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import NotFoundError, OffsetOutOfRangeError, StoreError
from rocketstore.pipeline.format import bodyformat, record
from rocketstore.pipeline.tools.bothtiers import BothTiers

if TYPE_CHECKING:
    from rocketstore.pipeline.tier.objects import ObjectStore
from rocketstore.pipeline.tools.lag import (
    CommittedOffsets,
    QueueLag,
    consumer_lag,
    group_lag,
    group_topics,
    read_committed_offsets,
    read_once,
    store_bounds,
)
from rocketstore.pipeline.tools.metrics import DEFAULT_PER_QUEUE_LIMIT

HOUR_MS = 3_600_000
BODY_CAP = 4096  # bytes of a body shown on a message's page
PREVIEW_CHARS = 100  # characters of a body shown in a list
TOPIC_SAMPLE = 240  # units read per queue for a topic's messages-per-minute chart


@functools.cache
def _objects(config: StoreConfig) -> ObjectStore:
    """The console's S3 client for the bucket ``config`` names, made once."""
    from rocketstore.pipeline.tier.objects import shared_store

    return shared_store(config)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclasses.dataclass(frozen=True)
class Console:
    """What the console serves: a store root (or one store directory), the settings to open
    its brokers with, and the Spark checkpoints named on the command line."""

    root: Path
    config: StoreConfig
    checkpoints: tuple[Path, ...] = ()
    per_queue_limit: int = (
        DEFAULT_PER_QUEUE_LIMIT  # of /metrics (rocketstore.pipeline.tools.metrics)
    )

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

    @contextlib.contextmanager
    def open_both(self, path: Path) -> Iterator[BothTiers]:
        """One broker opened read-only with its tier, when the settings turn it on: the pages
        of messages read both tiers as the CLI's reading commands do. One S3 client for the
        console's life (boto3's are thread-safe; making one costs ~0.4 s)."""
        with MessageStore(path, self.config, read_only=True) as store:
            if not self.config.tier_on:  # nothing of the tier's S3 side loads
                yield BothTiers(store, None)
                return
            from rocketstore.pipeline.tier.remote import open_tier

            yield BothTiers(store, open_tier(path, self.config, _objects(self.config)))


# -- topic -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class QueueRow:
    broker: str
    queue_id: int
    min_offset: int
    max_offset: int
    oldest: int | None  # of the local files' messages
    newest: int | None
    in_bucket: int = 0  # messages only the tier holds (below the local files)

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
        with console.open_both(path) as both:
            for span in both.spans(name):
                info = span.info
                # Rates from the local files' units (the bucket's part is counted, not drawn).
                low, high = span.local if span.local is not None else (info.max_offset,) * 2
                s = rates.sample_queue(both.store, name, info.queue_id, low, high, TOPIC_SAMPLE)
                samples.append((broker, low, s))
                cold = span.tier_only
                rows.append(
                    QueueRow(
                        broker,
                        info.queue_id,
                        info.min_offset,
                        info.max_offset,
                        int(s.times.min()) if len(s.times) else None,
                        int(s.times.max()) if len(s.times) else None,
                        cold[1] - cold[0] if cold is not None else 0,
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
    with console.open_both(path) as both:
        span = both.span(topic_name, queue_id)
        if span is None:
            queues = sorted({s.info.queue_id for s in both.spans(topic_name)})
            raise NotFoundError(
                f"topic {topic_name!r} has no queue {queue_id} on {name} "
                f"(its queues there: {', '.join(map(str, queues)) or 'none'})"
            )
        low, high = span.info.min_offset, span.info.max_offset
        if when is not None:
            offset = both.offset_by_time(topic_name, queue_id, when)
        start = low if offset is None else offset
        result = both.get_messages(topic_name, queue_id, start, count, None)
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
        with console.open_both(path) as both:
            for m in both.query_by_key(
                topic_name, key, begin=0, end=MAX_TIMESTAMP, max_count=count
            ):
                out.append(Found(name, m))
    out.sort(key=lambda f: f.message.store_timestamp, reverse=True)
    return out[:count]


def _at(both: BothTiers, offset: int) -> record.MessageExt:
    """The message a record starting at CommitLog ``offset`` holds, in the bucket below the
    local files; :class:`NotFoundError` when none starts there (as ``query-offset`` checks)."""
    cold = both.tier_message_at(offset)
    if cold is not None:
        return cold
    store = both.store
    low, high = both.log_start(), store.max_phy_offset
    if not low <= offset < high:
        raise NotFoundError(
            f"CommitLog offset {offset} is outside the log, which holds [{low}, {high})"
        )
    if not store.commitlog.starts_record(offset):
        raise NotFoundError(f"no record starts at CommitLog offset {offset}")
    return store.get_message(offset)


def by_offset(console: Console, broker: tuple[str, Path], offset: int) -> Found:
    name, path = broker
    with console.open_both(path) as both:
        return Found(name, _at(both, offset))


def by_msg_id(console: Console, msg_id: str) -> Found:
    """The message an offset msgId names, in whichever broker's log holds a record with that
    id at its offset (each broker numbers its own log)."""
    _, offset = record.parse_msg_id(msg_id)
    for name, path in console.brokers():
        with console.open_both(path) as both:
            try:
                found = _at(both, offset)
                if found.commit_log_offset < both.store.min_phy_offset:
                    return Found(name, found)  # only the bucket holds it
                return Found(name, both.store.get_by_msg_id(msg_id))
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
