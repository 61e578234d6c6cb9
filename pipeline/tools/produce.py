"""``rocketstore produce``: JSON lines in, messages stored in batches, one result line out each.

The input's lines are read as they arrive and stored in batches that close at ``--batch-size``
lines or ``--linger-ms`` after a batch's first line, and each batch's results are printed, in
input order, as soon as it is stored, so a producer piping into the command sees its
acknowledgements while it still writes.

A line that cannot be stored gets a result naming the line and the input field at fault; the
other lines are still stored. Everything that can be checked per line is checked here, in the
input's own words (fields, JSON types, byte sizes), before the store sees the batch.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import math
import os
import re
import select
import sys
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.results import PutResult
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import InvalidMessageError, ProgressNotRecordedError, StoreError
from rocketstore.pipeline.files.segmentread import locate
from rocketstore.pipeline.format import batchcolumns, record
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.format.record import MessageExt
from rocketstore.pipeline.tools.output import json_line

INT32_MAX = 2**31 - 1
FIELDS = ("topic", "body", "bodyBase64", "queueId", "keys", "tags", "properties", "flag")
# The property separators, and NUL, which readers take for a torn write (record.torn_tail).
RESERVED_CHARS = re.compile("[\x00-\x02]")
# A generated UNIQ_KEY is 32 hex characters (see rocketstore.pipeline.format.encode.UniqKeyGenerator).
UNIQ_KEY_LEN = 32
# The store speaks of Arrow columns and batch rows; the input's fields have the same names.
_COLUMN = re.compile(r"column '(\w+)'")
_ROW_SUFFIX = re.compile(r" \(\d+ row\(s\), first at row \d+\)$|^row \d+: ")


class Refused(Exception):
    """One input line that cannot be stored; ``status`` is a PutMessageStatus name."""

    def __init__(self, reason: str, status: str = "MESSAGE_ILLEGAL") -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def _json_type(value: object) -> str:
    """The JSON name of a decoded value's type, as the input line spelled it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _text(value: object, field: str, *, any_char: bool = False) -> str:
    """``value`` as a string that UTF-8 can encode and that, unless ``any_char``, holds no NUL
    and neither property separator (code points 0, 1 and 2)."""
    if not isinstance(value, str):
        raise Refused(f"field {field!r} must be a string, got {_json_type(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(f"field {field!r} is not valid Unicode (a lone surrogate escape)") from None
    if not any_char and RESERVED_CHARS.search(value):
        raise Refused(
            f"field {field!r} contains a reserved character (\\u0000, \\u0001 or \\u0002)"
        )
    return value


def _int(obj: dict[str, Any], field: str, low: int, high: int) -> int:
    value = obj.get(field)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise Refused(f"field {field!r} must be an integer, got {_json_type(value)}")
    if not low <= value <= high:
        raise Refused(f"field {field!r} is {value}, outside {low}..{high}")
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


def _body(obj: dict[str, Any], max_size: int) -> bytes:
    if (obj.get("body") is None) == (obj.get("bodyBase64") is None):
        raise Refused("give exactly one of the fields 'body' (text) and 'bodyBase64'")
    if obj.get("body") is not None:
        field = "body"
        body = _text(obj["body"], "body", any_char=True).encode("utf-8")
        size = f"is {len(body)} bytes as UTF-8"
    else:
        field = "bodyBase64"
        try:
            body = base64.b64decode(
                _text(obj["bodyBase64"], "bodyBase64", any_char=True), validate=True
            )
        except binascii.Error as exc:
            raise Refused(f"field 'bodyBase64' is not valid base64: {exc}") from None
        size = f"decodes to {len(body)} bytes"
    if len(body) > max_size:
        raise Refused(f"field {field!r} {size}; at most maxMessageSize={max_size} are accepted")
    return body


def parse_line(raw: bytes, max_body: int = StoreConfig.max_message_size) -> Message:
    """The message one input line describes; :class:`Refused` says why it cannot be one.

    Checks what the store would otherwise report in its own terms or not per message (JSON,
    fields and their types, ranges, the topic's characters, reserved characters, the body's and
    the properties' sizes); the store's own validation still runs on the batch.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(f"not UTF-8 (byte {exc.start + 1}: {exc.reason})") from None
    try:
        # Without its line break, so that a position in the error is the line's column.
        obj = json.loads(text.rstrip("\r\n"))
    except json.JSONDecodeError as exc:
        raise Refused(f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise Refused(f"expected a JSON object, got {_json_type(obj)}")
    unknown = [k for k in obj if k not in FIELDS]
    if unknown:
        raise Refused(f"unknown field(s) {unknown}; accepted: {', '.join(FIELDS)}")
    if obj.get("topic") is None:
        raise Refused("field 'topic' is missing")
    topic = _text(obj["topic"], "topic")
    problem = batchcolumns.topic_problem(topic)
    if problem:
        raise Refused(f"field 'topic' ({topic!r}) {problem}")
    body = _body(obj, max_body)
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
            raise Refused(f"field 'properties' must be an object, got {_json_type(props_in)}")
        for name, value in props_in.items():
            if not name:
                raise Refused("field 'properties' has an empty property name")
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


# Bytes asked of the input per read: a fast producer's lines arrive many at a time.
READ_SIZE = 1 << 16


class InputLines:
    """The non-blank lines of an input, each with its line number (blank lines count too),
    read from the input's file descriptor by the thread that asks for them.

    Nothing reads ahead on a thread of its own: when the command stops early (a put failed
    while the producer still holds its end of the pipe open), no read is left blocked on the
    input, so closing it (a FILE) or the interpreter's own close of ``sys.stdin`` at exit never
    waits for a read that may never return. At most one read of ``READ_SIZE`` bytes is taken
    from the input beyond the line last returned. The descriptor is never closed here.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._lines: deque[tuple[int, bytes]] = deque()
        self._partial: list[bytes] = []  # the pieces of a line whose end has not been read
        self._count = 0
        self._ended = False
        self._error: OSError | None = None

    def get(self, timeout: float | None = None) -> tuple[int, bytes] | None:
        """The next non-blank line (without its line break) and its number, waiting for it as
        long as ``timeout`` seconds (default: without limit); None at the end of the input or
        when the time is up. A read error ends the input: it is raised here once the lines
        read before it have all been returned, and again on every later call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._lines:
            if self._error is not None:
                raise self._error
            if self._ended:
                return None
            wait_ms = None
            if deadline is not None:
                wait_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
            if not self._poll.poll(wait_ms):
                return None
            self._read()
        return self._lines.popleft()

    def _read(self) -> None:
        """One read from the input (which poll found ready), split into lines."""
        try:
            chunk = os.read(self._fd, READ_SIZE)
        except BlockingIOError:
            return  # a non-blocking descriptor that another reader emptied first: wait again
        except OSError as exc:
            self._error, self._ended = exc, True
            return
        if not chunk:
            self._ended = True
            if self._partial:  # the last line has no line break
                self._add(b"".join(self._partial))
                self._partial = []
            return
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            self._partial.append(chunk)
            return
        if self._partial:
            pieces[0] = b"".join([*self._partial, pieces[0]])
        self._partial = [pieces[-1]] if pieces[-1] else []
        for raw in pieces[:-1]:
            self._add(raw)

    def _add(self, raw: bytes) -> None:
        self._count += 1
        if raw.strip():
            self._lines.append((self._count, raw))


def batches(source: InputLines, size: int, linger_s: float) -> Iterator[list[tuple[int, bytes]]]:
    """Input lines grouped: a batch closes at ``size`` lines or ``linger_s`` after its first
    line arrived (lines already waiting by then still join it, up to ``size``). A read error
    is raised after the batch holding the lines read before it."""
    while True:
        first = source.get()
        if first is None:
            return
        batch = [first]
        deadline = time.monotonic() + linger_s
        failure: OSError | None = None
        while len(batch) < size:
            try:
                line = source.get(max(0.0, deadline - time.monotonic()))
            except OSError as exc:
                failure = exc  # the lines before it are stored and answered first
                break
            if line is None:
                break
            batch.append(line)
        yield batch
        if failure is not None:
            raise failure


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
            reason = _COLUMN.sub(r"field '\1'", _ROW_SUFFIX.sub("", exc.reason))
            out[line] = _refusal(line, reason)
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
    with MessageStore(args.store, StoreConfig.effective(args.config), read_only=True) as ro:
        seg = ro.config.mapped_file_size_commitlog
        pos, end = start, ro.max_phy_offset
        while pos < end and len(found) < limit:
            if not ro.commitlog.starts_record(pos):
                pos = locate(pos, seg)[0] + seg  # an END_OF_FILE blank: the next segment
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
    """Store the input's lines; exit status 1 when any line was refused, 2 when a put failed
    (the results printed up to then say which lines are stored)."""
    config = StoreConfig.effective(args.config)
    # Unbuffered: InputLines reads the descriptor itself, and a buffer would hold lines back.
    file = None if args.input == "-" else open(args.input, "rb", buffering=0)  # noqa: SIM115
    try:
        lines = InputLines(sys.stdin.fileno() if file is None else file.fileno())
        return _produce(args, config, lines)
    except ProgressNotRecordedError as exc:
        # Raised by the store's close only (a put's own flush leaves it to the next round):
        # every line reported stored is flushed; only the record of how far is behind.
        sys.stderr.write(f"rocketstore: warning: {exc}\n")
        return 1
    finally:
        if file is not None:
            file.close()


def _produce(args: argparse.Namespace, config: StoreConfig, lines: InputLines) -> int:
    """Store ``lines``; exit status 1 when any line was refused, 2 when a put failed."""
    refused = 0
    with MessageStore(args.store, config) as store:
        for batch in batches(lines, args.batch_size, args.linger_ms / 1000):
            results: dict[int, dict[str, Any]] = {}
            good: list[tuple[int, Message]] = []
            for line, raw in batch:
                try:
                    good.append((line, parse_line(raw, config.max_message_size)))
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
                sys.stdout.write(json_line(results[line]) + "\n")
            sys.stdout.flush()
            if failed is not None:
                # The store refuses writes after such a failure until it is reopened. The store
                # failed, not the input: the status of an error, as when it cannot be opened.
                sys.stderr.write(
                    f"rocketstore: error: a put failed at line {batch[0][0]}-"
                    f"{batch[-1][0]}: {failed}; the results above say which lines are "
                    "stored; no line after them is\n"
                )
                return 2
    return 1 if refused else 0
