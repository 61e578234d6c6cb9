"""``rocketstore``: read and feed a RocketMQ-format store directory from the shell.

Commands (``rocketstore COMMAND --help`` for each)::

    dump STORE [--topic T]                      every message, one JSON object per line
    queues STORE [--topic T]                    ConsumeQueue bounds per topic and queue
    get STORE --topic T --queue Q --offset N    messages of one queue (tag filter: --tags)
    query-key STORE --topic T --key K           messages by KEYS token or UNIQ_KEY
    query-time STORE --topic T --queue Q --timestamp MS
    query-offset STORE OFFSET                   the message at a CommitLog offset
    query-msgid STORE MSGID                     the message an offset msgId names
    produce STORE [FILE|-]                      store JSON lines, print one result per line
    verify STORE                                check every record, unit and index entry
    recover STORE                               run recovery, print its report
    clean STORE [--dry-run]                     delete expired files now (retention)
    lag ROOT --checkpoint DIR                   a Spark query's committed offsets and lag
    config                                      the effective store settings

Contract:

* Every command that takes STORE also takes ``--config FILE`` (``.toml`` or a broker.conf
  properties file); the store must be opened with the geometry it was written with.
* Reading commands open the store read-only: they take no lock and write nothing, so they work
  on a store a writer has open and on read-only directories. ``produce`` opens it for writing
  and fails at once when another writer holds the lock.
* ``dump`` and ``produce`` write JSON lines. The other commands print an aligned table for
  people, or JSON lines with ``--json``.
* Exit status: 0 on success; 1 when ``produce`` refused at least one line; 2 for a usage,
  configuration or store error, reported as one line ``rocketstore: error: ...`` on stderr.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import dataclasses
import json
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from pipeline import native, queueread, record
from pipeline.config import StoreConfig
from pipeline.errors import InvalidMessageError, StoreError
from pipeline.message import Message
from pipeline.record import MessageExt
from pipeline.store import MAX_TIMESTAMP, MessageStore, PutResult

PROG = "rocketstore"
DUMP_PAGE = 1000
INT32_MAX = 2**31 - 1
PRODUCE_FIELDS = ("topic", "body", "bodyBase64", "queueId", "keys", "tags", "properties", "flag")
RESERVED_CHARS = re.compile("[\x01\x02]")
# A generated UNIQ_KEY is 32 hex characters (see pipeline.encode.UniqKeyGenerator).
UNIQ_KEY_LEN = 32


# -- output ------------------------------------------------------------------------------------


def _json_line(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _emit(obj: object) -> None:
    sys.stdout.write(_json_line(obj) + "\n")


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns padded to their widest cell; all-integer columns right-aligned."""
    cells = [list(header)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    numeric = [
        bool(rows) and all(isinstance(r[i], int) and not isinstance(r[i], bool) for r in rows)
        for i in range(len(header))
    ]
    for r in cells:
        parts = [
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric, strict=True)
        ]
        sys.stdout.write("  ".join(parts).rstrip() + "\n")


def _preview(body: bytes, limit: int = 40) -> str:
    """Body as printable text (control characters escaped), cut at ``limit`` characters."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(body)} bytes, not UTF-8>"
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


MESSAGE_COLUMNS = (
    "topic",
    "queueId",
    "queueOffset",
    "commitLogOffset",
    "storeTimestamp",
    "tags",
    "keys",
    "msgId",
    "body",
)


def _message_row(m: MessageExt) -> list[object]:
    return [
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.commit_log_offset,
        m.store_timestamp,
        m.tags,
        " ".join(m.keys),
        m.msg_id,
        _preview(m.body),
    ]


def _print_messages(messages: Sequence[MessageExt], as_json: bool) -> None:
    if as_json:
        for m in messages:
            _emit(m.to_json())
    elif messages:
        _print_table(MESSAGE_COLUMNS, [_message_row(m) for m in messages])


def _print_message_detail(m: MessageExt, as_json: bool) -> None:
    """One message: every field, one per line (or one JSON line)."""
    if as_json:
        _emit(m.to_json())
        return
    fields = m.to_json()
    fields["body"] = f"{_preview(m.body, 200)} ({len(m.body)} bytes)"
    props = fields.pop("properties")
    rows: list[list[object]] = [[name, value] for name, value in fields.items()]
    rows.append(["properties", ""])
    rows.extend([f"  {name}", value] for name, value in props.items())
    _print_table(("field", "value"), rows)


def _note(text: str) -> None:
    sys.stderr.write(f"{PROG}: {text}\n")


# -- reading commands ---------------------------------------------------------------------------


def _open(args: argparse.Namespace, *, write: bool = False) -> MessageStore:
    return MessageStore(args.store, StoreConfig.load(args.config), read_only=not write)


def cmd_dump(args: argparse.Namespace) -> int:
    with _open(args) as store:
        infos = store.queue_infos(args.topic)
        if args.topic is not None and not infos:
            _note(f"note: no queue of topic {args.topic!r} in {args.store}")
        for info in infos:
            for batch in queueread.queue_batches(store, info.topic, info.queue_id, page=DUMP_PAGE):
                for m in native.messages(batch):
                    _emit(m.to_json())
    return 0


def cmd_queues(args: argparse.Namespace) -> int:
    with _open(args) as store:
        infos = store.queue_infos(args.topic)
    if args.topic is not None and not infos:
        _note(f"note: no queue of topic {args.topic!r} in {args.store}")
    header = ("topic", "queueId", "minOffset", "maxOffset", "maxPhysicOffset")
    rows = [[i.topic, i.queue_id, i.min_offset, i.max_offset, i.max_physic_offset] for i in infos]
    if args.json:
        for row in rows:
            _emit(dict(zip(header, row, strict=True)))
    elif rows:
        _print_table(header, rows)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    with _open(args) as store:
        r = store.get_messages(args.topic, args.queue, args.offset, args.max, args.tags)
    summary = {
        "status": r.status,
        "nextBeginOffset": r.next_begin_offset,
        "minOffset": r.min_offset,
        "maxOffset": r.max_offset,
    }
    if args.json:
        _emit({**summary, "messages": [m.to_json() for m in r.messages]})
    else:
        sys.stdout.write("   ".join(f"{k}: {v}" for k, v in summary.items()) + "\n")
        _print_messages(r.messages, False)
    return 0


def cmd_query_key(args: argparse.Namespace) -> int:
    with _open(args) as store:
        found = store.query_by_key(
            args.topic, args.key, begin=args.begin, end=args.end, max_count=args.max
        )
    _print_messages(found, args.json)
    return 0


def cmd_query_time(args: argparse.Namespace) -> int:
    with _open(args) as store:
        offset = store.offset_by_time(args.topic, args.queue, args.timestamp)
    header = ("topic", "queueId", "timestamp", "offset")
    row = [args.topic, args.queue, args.timestamp, offset]
    if args.json:
        _emit(dict(zip(header, row, strict=True)))
    else:
        _print_table(header, [row])
    return 0


def cmd_query_offset(args: argparse.Namespace) -> int:
    with _open(args) as store:
        m = store.get_message(args.offset)
    _print_message_detail(m, args.json)
    return 0


def cmd_query_msgid(args: argparse.Namespace) -> int:
    with _open(args) as store:
        m = store.get_by_msg_id(args.msgid)
    _print_message_detail(m, args.json)
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    """Open the store for writing (which runs recovery), print the report, close it cleanly."""
    with MessageStore(
        args.store, StoreConfig.load(args.config), create=False, full_check=True
    ) as store:
        report = store.recovery.to_json()
    if args.json:
        _emit(report)
    else:
        _print_table(("field", "value"), [[k, v] for k, v in report.items()])
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Scan every record and index structure; print each problem; exit 1 if there is any."""
    from pipeline.verify import verify

    def progress(done: int, total: int) -> None:
        if args.progress and total:
            sys.stderr.write(f"\rverifying: {100 * done // total:3d} %")
            sys.stderr.flush()

    with _open(args) as store:
        report = verify(store, progress=progress, max_per_kind=None if args.all else 100)
    if args.progress:
        sys.stderr.write("\n")
    if args.json:
        _emit(report.to_json())
    else:
        if report.problems:
            _print_table(
                ("kind", "file", "offset", "detail"),
                [[p.kind, p.path, p.offset, p.detail] for p in report.problems],
            )
        state = "ok" if report.ok else f"{len(report.problems) + report.suppressed} problem(s)"
        print(
            f"{state}: {report.records} records, {report.units} units, "
            f"{report.index_entries} index entries checked in {report.seconds:.2f}s"
        )
    return 0 if report.ok else 1


def cmd_clean(args: argparse.Namespace) -> int:
    """Delete what retention allows now (or, with --dry-run, show it) and print the report."""
    from pipeline.retention import CleanPlan, RetentionService

    config = StoreConfig.load(args.config)
    with MessageStore(args.store, config, read_only=args.dry_run, create=False) as store:
        service = RetentionService(store)
        report: CleanPlan
        if args.dry_run:
            report = service.plan(force_expired=True, max_files=args.max_files)
        else:
            with store.writer_lock():
                report = service.run(force_expired=True, max_files=args.max_files)
    if args.json:
        _emit(report.to_json())
        return 0
    if report.files:
        _print_table(
            ("file", "kind", "bytes", "reason"),
            [[str(f.path), f.kind, f.bytes, f.reason] for f in report.files],
        )
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"{verb} {len(report.files)} file(s), {report.bytes} bytes; "
        f"disk {report.disk_used_ratio:.1%} used"
    )
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    config = StoreConfig.load(args.config)
    settings = config.to_rocketmq()
    if args.json:
        _emit({"settings": settings, "ignoredKeys": list(config.ignored_keys)})
        return 0
    _print_table(("setting", "value"), [[k, _cell(v)] for k, v in settings.items()])
    if config.ignored_keys:
        sys.stdout.write(f"ignored (not store settings): {', '.join(config.ignored_keys)}\n")
    return 0


# -- lag ----------------------------------------------------------------------------------------

QueueKey = tuple[str, str, int]  # (topic, brokerName, queueId), as the Spark source names a queue


@dataclasses.dataclass(frozen=True)
class CommittedOffsets:
    """What a Spark checkpoint says a query has read: ``offsets`` are the next queue offsets
    to read after ``batch_id``, the last committed micro-batch (``None``: nothing committed)."""

    batch_id: int | None
    offsets: dict[QueueKey, int]


@dataclasses.dataclass(frozen=True)
class QueueLag:
    """One message queue: ``committed`` is ``None`` when the checkpoint does not name it yet
    (the source will start it at its min offset), ``max_offset`` ``None`` when the store has
    no such queue."""

    topic: str
    broker: str
    queue_id: int
    committed: int | None
    min_offset: int | None
    max_offset: int | None

    @property
    def lag(self) -> int | None:
        """Messages the query has still to read (``None`` when the store lacks the queue)."""
        if self.max_offset is None:
            return None
        start = self.committed if self.committed is not None else self.min_offset or 0
        return self.max_offset - start


def _batch_files(directory: Path) -> dict[int, Path]:
    """Spark's metadata log files by batch id (``.N.crc`` and temporary files skipped)."""
    if not directory.is_dir():
        return {}
    return {int(p.name): p for p in directory.iterdir() if p.name.isdigit()}


def _as_offsets(value: object) -> dict[QueueKey, int] | None:
    """``value`` as rocketstore source offsets (``{topic: {broker: {queueId: offset}}}``), or
    ``None`` when it has another shape (another source's offset, the batch metadata)."""
    if not isinstance(value, dict) or not value:
        return None
    out: dict[QueueKey, int] = {}
    for topic, brokers in value.items():
        if not isinstance(brokers, dict):
            return None
        for broker, queues in brokers.items():
            if not isinstance(queues, dict):
                return None
            for qid, offset in queues.items():
                if not (str(qid).isdigit() and isinstance(offset, int)):
                    return None
                if isinstance(offset, bool):
                    return None
                out[(str(topic), str(broker), int(qid))] = offset
    return out


def read_committed_offsets(checkpoint: str | os.PathLike[str]) -> CommittedOffsets:
    """The rocketstore source offsets of the last committed batch of a Spark checkpoint.

    A checkpoint holds ``offsets/N`` (written when batch N is planned: a version line, a batch
    metadata line, then one line per source, ``-`` for a source without an offset) and
    ``commits/N`` (written once batch N's output is committed). The committed progress is the
    offsets file of the highest N that has a commit file. Lines of other sources are skipped;
    the offsets of several rocketstore sources in one query are merged.

    Raises :class:`StoreError` when ``checkpoint`` is not a Spark checkpoint directory or its
    offsets hold no rocketstore source offsets.
    """
    text = os.fspath(checkpoint)
    root = Path(text.removeprefix("file://") if text.startswith("file://") else text)
    offsets_dir = root / "offsets"
    if not offsets_dir.is_dir():
        raise StoreError(f"{root}: not a Spark streaming checkpoint (no offsets/ directory)")
    planned = _batch_files(offsets_dir)
    committed = sorted(set(_batch_files(root / "commits")) & set(planned))
    if not committed:
        return CommittedOffsets(None, {})
    batch = committed[-1]
    path = planned[batch]
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or not lines[0].startswith("v"):
        raise StoreError(f"{path}: not a Spark offsets file (no version line)")
    found: dict[QueueKey, int] = {}
    seen_source = False
    for line in lines[1:]:
        try:
            value = json.loads(line)
        except ValueError:
            continue  # "-": a source with no offset in this batch
        offsets = _as_offsets(value)
        if offsets is not None:
            seen_source = True
            found.update(offsets)
    if not seen_source:
        raise StoreError(
            f"{path}: no rocketstore source offsets (is this the checkpoint of a query reading "
            "with format('rocketstore')?)"
        )
    return CommittedOffsets(batch, found)


def consumer_lag(
    root: str | os.PathLike[str],
    committed: dict[QueueKey, int],
    config: StoreConfig,
    topics: Sequence[str] | None = None,
) -> list[QueueLag]:
    """Per message queue of ``topics`` (default: the topics ``committed`` names), the committed
    offset beside the queue's bounds in the store root (or single store directory) ``root``.

    Every queue of those topics in any broker is listed, and every queue the checkpoint names
    even if the store no longer has it. Brokers are opened read-only (no lock, nothing written).
    """
    from pipeline.root import StoreRoot

    wanted = set(topics) if topics else {t for t, _, _ in committed}
    bounds: dict[QueueKey, tuple[int, int]] = {}
    store_root = StoreRoot(root)
    brokers = store_root.brokers()
    if not brokers:
        raise StoreError(
            f"{root}: neither a store root (broker-N directories) nor a RocketMQ store directory"
        )
    for name, path in brokers:
        if not (path / "commitlog").is_dir():
            continue  # a broker directory no task has written yet
        with MessageStore(path, config, read_only=True) as store:
            for info in store.queue_infos():
                if info.topic in wanted:
                    bounds[(info.topic, name, info.queue_id)] = (info.min_offset, info.max_offset)
    keys = set(bounds) | {k for k in committed if k[0] in wanted}

    def order(key: QueueKey) -> tuple[str, int, str, int]:
        topic, broker, qid = key
        number = broker.rpartition("-")[2]
        return topic, int(number) if number.isdigit() else -1, broker, qid

    rows = []
    for key in sorted(keys, key=order):
        low, high = bounds.get(key, (None, None))
        rows.append(QueueLag(key[0], key[1], key[2], committed.get(key), low, high))
    return rows


def cmd_lag(args: argparse.Namespace) -> int:
    progress = read_committed_offsets(args.checkpoint)
    topics = [args.topic] if args.topic else None
    if topics is None and not progress.offsets:
        raise StoreError(
            f"{args.checkpoint}: the query has not committed a batch yet; name the topic it "
            "reads with --topic to see the whole backlog"
        )
    rows = consumer_lag(args.store, progress.offsets, StoreConfig.load(args.config), topics)
    header = ("topic", "brokerName", "queueId", "committedOffset", "maxOffset", "lag")
    table = [[r.topic, r.broker, r.queue_id, r.committed, r.max_offset, r.lag] for r in rows]
    if args.json:
        for row in table:
            _emit({**dict(zip(header, row, strict=True)), "batchId": progress.batch_id})
        return 0
    if table:
        _print_table(header, table)
    batch = (
        "no batch committed yet"
        if progress.batch_id is None
        else (f"batch {progress.batch_id} committed")
    )
    total = sum(r.lag for r in rows if r.lag is not None)
    print(f"{batch}; total lag {total} message(s) in {len(rows)} queue(s)")
    return 0


# -- produce ------------------------------------------------------------------------------------


class Refused(Exception):
    """One input line that cannot be stored; ``status`` is a PutMessageStatus name."""

    def __init__(self, reason: str, status: str = "MESSAGE_ILLEGAL") -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def _text(value: object, field: str, *, any_char: bool = False) -> str:
    """``value`` as a string that UTF-8 can encode and that, unless ``any_char``, holds neither
    property separator (code points 1 and 2)."""
    if not isinstance(value, str):
        raise Refused(f"{field!r} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(f"{field!r} is not valid Unicode (a lone surrogate escape)") from None
    if not any_char and RESERVED_CHARS.search(value):
        raise Refused(f"{field!r} contains a reserved character (\\u0001 or \\u0002)")
    return value


def _int(obj: dict[str, Any], field: str, low: int, high: int) -> int:
    value = obj.get(field)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise Refused(f"{field!r} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise Refused(f"{field!r}={value} is outside {low}..{high}")
    return value


def _properties_length(keys: str, tags: str, props: dict[str, str]) -> int:
    """Bytes of the PROPERTIES field the store will write (KEYS, TAGS, UNIQ_KEY, user's)."""
    reserved = {record.PROPERTY_KEYS: keys, record.PROPERTY_TAGS: tags}
    pairs = {k: v for k, v in props.items() if k not in reserved or v}
    pairs.update({k: v for k, v in reserved.items() if v})
    if not pairs.get(record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX):
        pairs[record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = "0" * UNIQ_KEY_LEN
    sizes = [len(k.encode()) + 1 + len(v.encode()) for k, v in pairs.items()]
    return sum(sizes) + len(sizes) - 1


def parse_line(raw: bytes) -> Message:
    """The message one input line describes; :class:`Refused` says why it cannot be one.

    Checks what the store cannot report precisely per message (JSON, types, ranges, reserved
    characters, the properties size); the store's own validation still runs on the batch.
    """
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise Refused(f"not UTF-8 (byte {exc.start}: {exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise Refused(f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise Refused(f"expected a JSON object, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in PRODUCE_FIELDS]
    if unknown:
        raise Refused(f"unknown field(s) {unknown}; accepted: {', '.join(PRODUCE_FIELDS)}")
    topic = _text(obj.get("topic"), "topic")
    if (obj.get("body") is None) == (obj.get("bodyBase64") is None):
        raise Refused("give exactly one of 'body' (text) and 'bodyBase64'")
    if obj.get("body") is not None:
        body = _text(obj["body"], "body", any_char=True).encode("utf-8")
    else:
        try:
            body = base64.b64decode(
                _text(obj["bodyBase64"], "bodyBase64", any_char=True), validate=True
            )
        except binascii.Error as exc:
            raise Refused(f"'bodyBase64' is not valid base64: {exc}") from None
    keys_in = obj.get("keys")
    keys: list[str] | str | None
    if isinstance(keys_in, list):
        keys = [_text(k, "keys") for k in keys_in]
    else:
        keys = None if keys_in is None else _text(keys_in, "keys")
    tags = None if obj.get("tags") is None else _text(obj["tags"], "tags")
    props_in = obj.get("properties")
    props: dict[str, str] = {}
    if props_in is not None:
        if not isinstance(props_in, dict):
            raise Refused(f"'properties' must be an object, got {type(props_in).__name__}")
        for name, value in props_in.items():
            if not name:
                raise Refused("'properties' has an empty property name")
            props[_text(name, "properties")] = _text(value, f"properties.{name}")
    joined = " ".join(keys) if isinstance(keys, list) else keys or ""
    size = _properties_length(joined, tags or "", props)
    if size > record.MAX_PROPERTIES_LENGTH:
        raise Refused(
            f"properties are {size} bytes encoded; at most {record.MAX_PROPERTIES_LENGTH} allowed",
            "PROPERTIES_SIZE_EXCEEDED",
        )
    return Message(
        topic=topic,
        body=body,
        queue_id=_int(obj, "queueId", 0, INT32_MAX),
        keys=keys,
        tags=tags,
        properties=props or None,
        flag=_int(obj, "flag", -INT32_MAX - 1, INT32_MAX),
    )


_ROW_SUFFIX = re.compile(r" \(\d+ row\(s\), first at row \d+\)$|^row \d+: ")

# What the reader thread hands over: a line, the error that stopped it, or None at the end.
Item = tuple[int, bytes] | BaseException | None


def _read_lines(stream: IO[bytes], sink: queue.Queue[Item]) -> None:
    """Reader thread: (line number, bytes) per non-blank line, then None (or the error)."""
    try:
        for n, raw in enumerate(iter(stream.readline, b""), start=1):
            if raw.strip():
                sink.put((n, raw))
        sink.put(None)
    except BaseException as exc:
        sink.put(exc)


def _batches(
    source: queue.Queue[Item], size: int, linger_s: float
) -> Iterator[list[tuple[int, bytes]]]:
    """Input lines grouped: a batch closes at ``size`` lines or ``linger_s`` after its first
    line arrived (lines already waiting by then still join it, up to ``size``)."""
    while True:
        item = source.get()
        batch: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + linger_s
        while True:
            if item is None or isinstance(item, BaseException):
                if batch:
                    yield batch
                if item is None:
                    return
                raise item
            batch.append(item)
            if len(batch) >= size:
                break
            remaining = deadline - time.monotonic()
            try:
                item = source.get(timeout=remaining) if remaining > 0 else source.get_nowait()
            except queue.Empty:
                break
        yield batch


def _refusal(line: int, reason: str, status: str = "MESSAGE_ILLEGAL") -> dict[str, Any]:
    return {"line": line, "status": status, "error": f"line {line}: {reason}"}


class BatchFailed(Exception):
    """A put failed for another reason than a refused message: ``results`` holds the lines
    already answered (refusals), ``pending`` the lines of the failed put, whose records start
    at CommitLog offset ``start`` if any landed."""

    def __init__(
        self,
        results: dict[int, dict[str, Any]],
        pending: list[tuple[int, Message]],
        start: int,
        cause: BaseException,
    ) -> None:
        super().__init__(str(cause))
        self.results = results
        self.pending = pending
        self.start = start
        self.cause = cause


def _store(store: MessageStore, batch: list[tuple[int, Message]]) -> dict[int, dict[str, Any]]:
    """Put a batch, dropping each message the store refuses and retrying the rest.

    The store validates a whole batch before writing anything and names the first bad
    message's position; when that position is unusable, messages are put one at a time.
    Any other failure raises :class:`BatchFailed`.
    """
    out: dict[int, dict[str, Any]] = {}
    pending = list(batch)
    while pending:
        start = store.max_phy_offset
        try:
            result = store.put_batch([m for _, m in pending])
        except (StoreError, OSError) as exc:
            if not isinstance(exc, InvalidMessageError):
                raise BatchFailed(out, pending, start, exc) from exc
            if len(pending) > 1 and not 0 <= exc.index < len(pending):
                for item in pending:
                    out.update(_store(store, [item]))
                return out
            line, _ = pending.pop(exc.index if len(pending) > 1 else 0)
            out[line] = _refusal(line, _ROW_SUFFIX.sub("", exc.reason))
            continue
        for (line, _), r in zip(pending, result.results(), strict=True):
            out[line] = _stored(line, r)
        break
    return out


def _stored(line: int, r: PutResult | MessageExt) -> dict[str, Any]:
    return {
        "line": line,
        "status": "PUT_OK",
        "msgId": r.msg_id,
        "commitLogOffset": r.commit_log_offset,
        "queueOffset": r.queue_offset,
        "storeTimestamp": r.store_timestamp,
        "uniqKey": r.uniq_key,
    }


def _records_from(args: argparse.Namespace, start: int, limit: int) -> list[MessageExt]:
    """Up to ``limit`` records from CommitLog offset ``start`` on, as a read-only open finds
    the log now (what recovery keeps)."""
    found: list[MessageExt] = []
    with MessageStore(args.store, StoreConfig.load(args.config), read_only=True) as ro:
        seg = ro.config.mapped_file_size_commitlog
        pos, end = start, ro.max_phy_offset
        while pos < end and len(found) < limit:
            if not ro.commitlog.starts_record(pos):
                pos = (pos // seg + 1) * seg  # an END_OF_FILE blank: the next segment
                continue
            msg = ro.get_message(pos)
            found.append(msg)
            pos += msg.store_size
    return found


def _landed(args: argparse.Namespace, failed: BatchFailed) -> dict[int, dict[str, Any]]:
    """Results for the lines of a failed put: the records it left in the CommitLog (a prefix
    of the put, in order) are stored, the other lines are not. When the log cannot be read
    back, the lines are reported as UNKNOWN."""
    out = dict(failed.results)
    reason = f"{type(failed.cause).__name__}: {failed.cause}"
    try:
        found = _records_from(args, failed.start, len(failed.pending))
    except (StoreError, OSError) as exc:
        for line, _ in failed.pending:
            out[line] = {
                "line": line,
                "status": "UNKNOWN",
                "error": f"line {line}: the put failed ({reason}) and the log could not be "
                f"read back ({exc}): run `rocketstore recover`, then look for it",
            }
        return out
    for k, (line, m) in enumerate(failed.pending):
        if k < len(found) and (found[k].topic, found[k].body) == (m.topic, m.body):
            out[line] = _stored(line, found[k])
        else:
            out[line] = {
                "line": line,
                "status": "NOT_STORED",
                "error": f"line {line}: not stored: the put failed: {reason}",
            }
    return out


def cmd_produce(args: argparse.Namespace) -> int:
    refused = 0
    stream = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")  # noqa: SIM115
    try:
        with _open(args, write=True) as store:
            lines: queue.Queue[Item] = queue.Queue(maxsize=4 * args.batch_size)
            reader = threading.Thread(target=_read_lines, args=(stream, lines), daemon=True)
            reader.start()
            for batch in _batches(lines, args.batch_size, args.linger_ms / 1000):
                results: dict[int, dict[str, Any]] = {}
                good: list[tuple[int, Message]] = []
                for line, raw in batch:
                    try:
                        good.append((line, parse_line(raw)))
                    except Refused as exc:
                        results[line] = _refusal(line, exc.reason, exc.status)
                failed: BatchFailed | None = None
                try:
                    results.update(_store(store, good))
                except BatchFailed as exc:
                    failed = exc
                    results.update(_landed(args, exc))
                for line, _ in batch:
                    refused += results[line]["status"] != "PUT_OK"
                    sys.stdout.write(_json_line(results[line]) + "\n")
                sys.stdout.flush()
                if failed is not None:
                    # The store refuses writes after such a failure until it is reopened.
                    _note(
                        f"error: a put failed at line {batch[0][0]}-{batch[-1][0]}: "
                        f"{failed}; the results above say which lines are stored; no line "
                        "after them was read"
                    )
                    return 1
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    return 1 if refused else 0


# -- command line -------------------------------------------------------------------------------


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Read and write a message store directory in Apache RocketMQ 4.9's "
        "on-disk format (CommitLog, ConsumeQueue, IndexFile).",
        epilog="Exit status: 0 ok, 1 produce refused some lines, 2 usage/config/store error.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    conf = argparse.ArgumentParser(add_help=False)
    conf.add_argument(
        "--config",
        metavar="FILE",
        help="store settings: a .toml file or a broker.conf properties file, RocketMQ names "
        "(default: RocketMQ's defaults); must match the geometry the store was written with",
    )
    store = argparse.ArgumentParser(add_help=False, parents=[conf])
    store.add_argument("store", metavar="STORE", help="the broker store directory")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    queue_args = argparse.ArgumentParser(add_help=False)
    queue_args.add_argument("--topic", required=True, help="topic")
    queue_args.add_argument("--queue", required=True, type=_count(0), help="queue id")

    def command(
        name: str,
        func: Callable[[argparse.Namespace], int],
        summary: str,
        details: str,
        parents: list[argparse.ArgumentParser],
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=summary, description=f"{summary}. {details}", parents=parents)
        p.set_defaults(func=func)
        return p

    p = command(
        "dump",
        cmd_dump,
        "Print every message reachable through the ConsumeQueues",
        "One JSON object per line (MessageExt fields, body in base64), topics sorted, queues "
        "ascending, queue offsets ascending.",
        [store],
    )
    p.add_argument("--topic", help="only this topic")
    p = command(
        "queues",
        cmd_queues,
        "Print each queue's bounds",
        "Per topic and queue: topic, queueId, minOffset, maxOffset, maxPhysicOffset.",
        [store, as_json],
    )
    p.add_argument("--topic", help="only this topic")
    p = command(
        "get",
        cmd_get,
        "Print messages of one queue from a queue offset",
        "First the status (RocketMQ's GetMessageStatus), nextBeginOffset (where to continue) "
        "and the queue's minOffset/maxOffset, then the messages. With --json, one object "
        "holding those fields and a 'messages' list.",
        [store, queue_args, as_json],
    )
    p.add_argument("--offset", required=True, type=int, help="queue offset to start at")
    p.add_argument("--max", type=_count(1), default=32, help="most messages (default 32)")
    p.add_argument("--tags", metavar="EXPR", help="tag filter, e.g. 'TagA || TagB' (default *)")
    p = command(
        "query-key",
        cmd_query_key,
        "Print messages of a topic by key",
        "Messages whose KEYS contain the key, or whose UNIQ_KEY is it, newest first "
        "(at most maxMsgsNumBatch).",
        [store, as_json],
    )
    p.add_argument("--topic", required=True, help="topic")
    p.add_argument("--key", required=True, help="a KEYS token or a UNIQ_KEY")
    p.add_argument(
        "--begin",
        type=int,
        default=0,
        metavar="MS",
        help="earliest store timestamp, ms since the epoch (default 0)",
    )
    p.add_argument(
        "--end",
        type=int,
        default=MAX_TIMESTAMP,
        metavar="MS",
        help="latest store timestamp, ms since the epoch (default: no limit)",
    )
    p.add_argument("--max", type=_count(1), help="most messages (default maxMsgsNumBatch)")
    p = command(
        "query-time",
        cmd_query_time,
        "Print the queue offset of a store time",
        "The offset of the message stored at that time, else the nearest one, clamped to "
        "the queue (RocketMQ's getOffsetInQueueByTime).",
        [store, queue_args, as_json],
    )
    p.add_argument(
        "--timestamp",
        required=True,
        type=int,
        metavar="MS",
        help="store timestamp, ms since the epoch",
    )
    p = command(
        "query-offset",
        cmd_query_offset,
        "Print the message at a CommitLog offset",
        "Every field of the message; the full body with --json (base64).",
        [store, as_json],
    )
    p.add_argument("offset", metavar="OFFSET", type=_count(0), help="CommitLog (physical) offset")
    p = command(
        "query-msgid",
        cmd_query_msgid,
        "Print the message an offset msgId names",
        "Every field of the message; the full body with --json (base64).",
        [store, as_json],
    )
    p.add_argument("msgid", metavar="MSGID", help="offset msgId (32 or 56 hex characters)")
    p = command(
        "produce",
        cmd_produce,
        "Store messages read as JSON lines",
        'Input lines: {"topic", "body" (text) or "bodyBase64", optional "queueId", '
        '"keys" (string or list), "tags", "properties" (object), "flag"}; blank lines '
        "are skipped. Prints one JSON result per line in input order, as each batch is "
        'stored: {"line", "status": "PUT_OK", "msgId", "commitLogOffset", '
        '"queueOffset", "storeTimestamp", "uniqKey"}, or a refusal '
        '("MESSAGE_ILLEGAL" or "PROPERTIES_SIZE_EXCEEDED") with an "error" naming the '
        "line. Refused lines do not stop the others; exit status 1 if any was refused. "
        "Opens the store for writing (creating it if absent).",
        [store],
    )
    p.add_argument(
        "input",
        nargs="?",
        default="-",
        metavar="FILE",
        help="input file (default -, standard input)",
    )
    p.add_argument(
        "--batch-size",
        type=_count(1),
        default=1000,
        help="store a batch at this many lines (default 1000)",
    )
    p.add_argument(
        "--linger-ms",
        type=_count(0),
        default=100,
        help="or this long after a batch's first line (default 100)",
    )
    command(
        "recover",
        cmd_recover,
        "Run recovery now and print what it did",
        "Opens the store for writing, which finds the end of the CommitLog (checking magic, "
        "size and CRC), cuts what follows it, drops ConsumeQueue units and index entries "
        "past it, rebuilds damaged or missing ConsumeQueues and index from the CommitLog and "
        "dispatches what is missing; then closes it cleanly. Safe to run again: the second "
        "run has nothing to do. Fails at once if a writer holds the store.",
        [store, as_json],
    )
    p = command(
        "verify",
        cmd_verify,
        "Check every record, ConsumeQueue unit and index entry",
        "Walks the whole CommitLog (magic, sizes, physical offsets, body CRCs), going on past "
        "a damaged record; checks every ConsumeQueue unit against its record and every index "
        "entry against its record's keys. Prints each problem with its file and offset; exit "
        "status 1 if there is any. Read-only: safe while a writer runs.",
        [store, as_json],
    )
    p.add_argument(
        "--all", action="store_true", help="list every problem (default: 100 per kind and file)"
    )
    p.add_argument("--progress", action="store_true", help="show progress on stderr")
    p = command(
        "clean",
        cmd_clean,
        "Delete expired and surplus files now, as retention would",
        "Deletes CommitLog segments older than fileReservedTime hours whatever the hour "
        "(as a manual clean does), the oldest ones even if not expired while the disk is "
        "over 85 % full, then the ConsumeQueue and index files whose messages are gone, and "
        "advances the queues' min offsets. Never deletes the segment being written. With "
        "--dry-run nothing is changed and the store is opened read-only.",
        [store, as_json],
    )
    p.add_argument("--dry-run", action="store_true", help="show what would be deleted")
    p.add_argument(
        "--max-files",
        type=_count(1),
        default=None,
        help="most CommitLog segments to delete (default: the policy's per-round limit)",
    )
    p = command(
        "lag",
        cmd_lag,
        "Print a Spark query's committed offsets and its lag per queue",
        "Reads the offsets of the last committed micro-batch from the Spark checkpoint of a "
        "query that reads the store with format('rocketstore') (offsets/N of the highest N "
        "with a commits/N), and prints per message queue: topic, brokerName, queueId, "
        "committedOffset (the next queue offset the query reads), maxOffset (the queue's end in "
        "the store) and lag (maxOffset - committedOffset), like RocketMQ's consumerProgress. "
        "Queues the checkpoint does not name yet count from their minOffset, where the source "
        "starts a new queue. STORE is a store root (broker-N directories) or one RocketMQ store "
        "directory; it is opened read-only.",
        [store, as_json],
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="the reading query's checkpointLocation (a local or mounted path)",
    )
    p.add_argument("--topic", help="only this topic (default: the topics the checkpoint names)")
    command(
        "config",
        cmd_config,
        "Print the effective store settings",
        "Every setting by its RocketMQ name, then the keys of a broker.conf that are not "
        "store settings (ignored).",
        [conf, as_json],
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``rocketstore`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has already reported
        return exc.code if isinstance(exc.code, int) else 2
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep the interpreter's final
        # flush from complaining too.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (StoreError, OSError) as exc:
        sys.stderr.write(f"{PROG}: error: {_describe(exc)}\n")
        return 2
    except KeyboardInterrupt:
        return 130


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
