"""``config/consumerOffset.json``: the offsets RocketMQ consumer groups committed to a broker.

A RocketMQ 4.9 broker keeps, per consumer group, topic and queue, the offset the group has
committed (``ConsumerOffsetManager``). Clients commit with ``UPDATE_CONSUMER_OFFSET``: a push
consumer every ``persistConsumerOffsetInterval`` (5 s) and when it shuts down, a pull consumer
when its code says so. The broker holds the table in memory and writes all of it to this file
every ``flushConsumerOffsetInterval`` (5 s) and when it stops, so the file may be up to that
long behind a running broker, and is exact once the broker has stopped. ``rocketstore lag``
shows the groups' lag from it (:mod:`rocketstore.pipeline.tools.lag`), and the Spark source's
``startingOffsets=group:NAME`` starts from it (:mod:`rocketstore.source.planning`).

The file, as fastjson writes it (a tab per level; shown here with four spaces)::

    {
        "offsetTable":{
            "orders@billing":{0:42,1:17
            },
            "%RETRY%billing@billing":{0:0
            }
        }
    }

* ``offsetTable`` keys are ``topic@group``. Neither name can hold ``@`` (RocketMQ allows
  letters, digits, ``%``, ``|``, ``_`` and ``-``), so the split is unambiguous.
  ``%RETRY%<group>`` is the group's retry topic (messages its consumers sent back), which a
  push consumer subscribes to beside its topics.
* Each value maps a queue id to the queue offset of the next message the group reads: ``42``
  says it has consumed messages 0..41 of queue 0. The queue ids are bare integers, not strings:
  fastjson spells an integer map key as a number, so the file is not strict JSON. Quoted ids
  (a file written by hand) are accepted too.
* A negative offset is no offset: the broker answers a query for one as for a queue the group
  never committed. Such entries are left out here.
* Other top-level fields (a newer broker's ``dataVersion``) are ignored.

Reading follows the broker's loader (:mod:`rocketstore.pipeline.files.brokerconfig`): ``consumerOffset.json``,
or ``consumerOffset.json.bak`` when that is missing or empty (as while a broker rewrites it).
Unlike the broker, which also falls back on the ``.bak`` when the file does not parse, this
module refuses such a file (:class:`ConsumerOffsetsError`, naming the file, line and column):
the ``.bak`` is one rewrite older, and offsets taken from it would read messages again.

Read-only: nothing here writes, and no lock is needed. Pure functions; thread-safe.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.errors import ConsumerOffsetsError, NotFoundError
from rocketstore.pipeline.files.brokerconfig import load_bytes

FILE_NAME = "consumerOffset.json"
BAK_NAME = FILE_NAME + ".bak"
TOPIC_GROUP_SEPARATOR = "@"
RETRY_PREFIX = "%RETRY%"

QueueKey = tuple[str, str, int]  # (topic, brokerName, queueId), as the Spark source names one


@dataclasses.dataclass(frozen=True)
class ConsumerOffsets:
    """One broker directory's committed offsets, as :func:`read_consumer_offsets` found them.

    ``table`` maps group to topic to queue id to offset (each ``>= 0``), in the file's order.
    """

    path: Path  # the file they came from: consumerOffset.json, or the .bak when it was missing
    table: dict[str, dict[str, dict[int, int]]]

    @property
    def from_bak(self) -> bool:
        return self.path.name == BAK_NAME


def read_consumer_offsets(config_dir: str | os.PathLike[str]) -> ConsumerOffsets | None:
    """The committed offsets in a broker directory's ``config/`` directory, as a broker would
    load them; None when there are none (no file and no ``.bak``, or both empty).

    Raises :class:`ConsumerOffsetsError` for a file that is not RocketMQ's format, ``OSError``
    when one cannot be read."""
    found = load_bytes(Path(config_dir), FILE_NAME)
    return None if found is None else parse_consumer_offsets(*found)


def parse_consumer_offsets(path: Path, raw: bytes) -> ConsumerOffsets:
    """``raw``, the bytes of the file ``path``, as committed offsets; raises
    :class:`ConsumerOffsetsError` naming ``path`` and the line and column at fault."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConsumerOffsetsError(f"{path}: not UTF-8 at byte {exc.start}") from None
    fast = _fast_table(text)
    return ConsumerOffsets(path, _read_table(path, text) if fast is None else fast)


def _read_table(path: Path, text: str) -> dict[str, dict[str, dict[int, int]]]:
    """The offset table of the file ``path`` holding ``text``, read by :class:`_Reader`, which
    names the line and column of whatever is wrong."""
    reader = _Reader(path, text)
    document = reader.document()
    table: dict[str, dict[str, dict[int, int]]] = {}
    found = document.find("offsetTable")
    if found is None:
        return table
    entries = reader.expect_object(found, "offsetTable")
    for key, key_at, queues, _ in entries.items:
        topic, at, group = (
            key.partition(TOPIC_GROUP_SEPARATOR) if isinstance(key, str) else ("", "", "")
        )
        if not (topic and at and group) or TOPIC_GROUP_SEPARATOR in group:
            raise reader.error(key_at, f"offsetTable key {json.dumps(key)} is not topic@group")
        where = f"offsetTable.{key}"
        committed: dict[int, int] = {}
        for qid, qid_at, offset, offset_at in reader.expect_object((key_at, queues), where).items:
            if isinstance(qid, str) and qid.isascii() and qid.isdigit():
                qid = int(qid)  # a quoted id, as a file written by hand may have it
            if isinstance(qid, str) or qid < 0:
                raise reader.error(
                    qid_at, f"{where}: queue id {json.dumps(qid)} is not a number >= 0"
                )
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise reader.error(
                    offset_at, f"{where}.{qid}: offset is {_kind(offset)}, expected an integer"
                )
            if offset >= 0:
                committed[qid] = offset
        table.setdefault(group, {})[topic] = committed
    return table


# -- a store root --------------------------------------------------------------------------------


def broker_offsets(root: str | os.PathLike[str]) -> dict[str, ConsumerOffsets]:
    """Every broker directory's committed offsets in a store root (or one store directory), by
    brokerName; brokers without the file are left out."""
    found: dict[str, ConsumerOffsets] = {}
    for name, path in StoreRoot(root).brokers():
        offsets = read_consumer_offsets(path / "config")
        if offsets is not None:
            found[name] = offsets
    return found


def group_offsets(
    brokers: dict[str, ConsumerOffsets], group: str, topics: Iterable[str] | None = None
) -> dict[QueueKey, int]:
    """What ``group`` committed in ``brokers`` (see :func:`broker_offsets`), for ``topics``
    (default: every topic it committed), by ``(topic, brokerName, queueId)``. Empty when it
    committed nothing there."""
    wanted = None if topics is None else set(topics)
    out: dict[QueueKey, int] = {}
    for broker, offsets in brokers.items():
        for topic, queues in offsets.table.get(group, {}).items():
            if wanted is None or topic in wanted:
                for queue_id, offset in queues.items():
                    out[(topic, broker, queue_id)] = offset
    return out


def groups_of(
    brokers: dict[str, ConsumerOffsets], topics: Iterable[str] | None = None
) -> list[str]:
    """The groups with offsets in ``brokers`` (for one of ``topics``, when given), sorted."""
    wanted = None if topics is None else set(topics)
    return sorted(
        {
            group
            for offsets in brokers.values()
            for group, by_topic in offsets.table.items()
            if wanted is None or wanted & set(by_topic)
        }
    )


def require_group(
    root: str | os.PathLike[str],
    brokers: dict[str, ConsumerOffsets],
    group: str,
    topics: Iterable[str] | None = None,
) -> dict[QueueKey, int]:
    """:func:`group_offsets`, or :class:`NotFoundError` naming the groups that are there when
    ``group`` committed nothing for ``topics``: a misspelt name must not pass for a group that
    has yet to consume."""
    wanted = None if topics is None else sorted(set(topics))
    found = group_offsets(brokers, group, wanted)
    if found:
        return found
    files = (
        f"config/{FILE_NAME} of {root}" if brokers else f"{root} (no broker has config/{FILE_NAME})"
    )
    scope = "" if wanted is None else f" for topic {', '.join(wanted)}"
    others = groups_of(brokers, wanted)
    raise NotFoundError(
        f"consumer group {group!r} has no committed offsets{scope} in {files}; groups there"
        f"{scope}: {', '.join(others) or '(none)'}"
    )


# -- fastjson's dialect --------------------------------------------------------------------------

# A JSON string, or a bare integer object key with what precedes and follows it: scanned left to
# right, a string is consumed whole, so a key-like run inside one is never taken for a key.
_STRING_OR_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?\d+)(\s*:)', re.DOTALL)


def _quote_key(match: re.Match[str]) -> str:
    if match.group(2) is None:
        return match.group()
    return f'{match.group(1)}"{match.group(2)}"{match.group(3)}'


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


class _Pairs(list[tuple[str, object]]):
    """An object's members in the file's order, repeated keys and all."""


def _last(pairs: _Pairs, key: str) -> object:
    found: object = None
    for k, v in pairs:
        if k == key:
            found = v
    return found


def _fast_table(text: str) -> dict[str, dict[str, dict[int, int]]] | None:
    """The offset table of a well-formed file, read by the C JSON decoder once fastjson's bare
    integer keys are quoted: at tens of thousands of queues a broker's file takes a tenth of
    the time :class:`_Reader` takes. ``None`` for anything out of the ordinary (not JSON once
    the keys are quoted, a value of the wrong kind, a bad key, even one a later repeat of its
    key replaces): the reader then reads the file again and reports where it goes wrong."""
    try:
        document = json.loads(
            _STRING_OR_BARE_KEY.sub(_quote_key, text),
            object_pairs_hook=_Pairs,
            parse_constant=_no_constant,
        )
    except ValueError:
        return None
    if not isinstance(document, _Pairs):
        return None
    entries = _last(document, "offsetTable")
    if entries is None and all(k != "offsetTable" for k, _ in document):
        return {}
    if not isinstance(entries, _Pairs):
        return None
    table: dict[str, dict[str, dict[int, int]]] = {}
    for key, queues in entries:
        topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
        if (
            not (topic and group)
            or TOPIC_GROUP_SEPARATOR in group
            or not isinstance(queues, _Pairs)
        ):
            return None
        committed: dict[int, int] = {}
        for qid, offset in queues:
            if not (qid.isascii() and qid.isdigit()) or type(offset) is not int:
                return None
            if offset >= 0:
                committed[int(qid)] = offset
        table.setdefault(group, {})[topic] = committed
    return table


@dataclasses.dataclass(frozen=True)
class _Object:
    """A parsed object: ``(key, its position, value, its position)`` in the file's order (a
    key that repeats is kept each time; the last one wins, as in fastjson)."""

    items: list[tuple[str | int, int, object, int]]

    def find(self, key: str) -> tuple[int, object] | None:
        """The position of ``key`` and its value (the last, if it repeats); None without it."""
        found = None
        for k, at, v, _ in self.items:
            if k == key:
                found = (at, v)
        return found


_WHITESPACE = " \t\r\n"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")
# A string as JSON spells it: no raw control characters, every backslash escaping something.
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\.)*"', re.DOTALL)
_INTEGER_KEY = re.compile(r"-?\d+")
_LITERALS: dict[str, object] = {"true": True, "false": False, "null": None}


class _Reader:
    """A recursive-descent reader of JSON plus the bare integer object keys fastjson writes,
    reporting errors by line and column of ``path``."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.text = text
        self.pos = 0

    def error(self, pos: int, message: str) -> ConsumerOffsetsError:
        line = self.text.count("\n", 0, pos) + 1
        column = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return ConsumerOffsetsError(
            f"{self.path}: line {line}, column {column} (character {pos}): {message}"
        )

    def expect_object(self, entry: tuple[int, object], where: str) -> _Object:
        """The value of ``entry`` (its key's position, the value) as an object, or an error
        at its key."""
        at, value = entry
        if not isinstance(value, _Object):
            raise self.error(at, f"{where} is {_kind(value)}, expected an object")
        return value

    def document(self) -> _Object:
        self._skip()
        start = self.pos
        value = self._value()
        if not isinstance(value, _Object):
            raise self.error(start, f"the file holds {_kind(value)}, expected an object")
        self._skip()
        if self.pos != len(self.text):
            raise self.error(self.pos, "text after the end of the object")
        return value

    def _skip(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in _WHITESPACE:
            pos += 1
        self.pos = pos

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _value(self) -> object:
        char = self._peek()
        if char == "{":
            return self._object()
        if char == "[":
            return self._array()
        if char == '"':
            return self._string()
        if char == "-" or char.isdigit():
            return self._number()
        for word, value in _LITERALS.items():
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return value
        raise self.error(
            self.pos, "end of file, expected a value" if not char else "expected a value"
        )

    def _string(self) -> str:
        match = _STRING.match(self.text, self.pos)
        if match is None:
            # Find where it goes wrong: the first control character, or the end of the file.
            end = self.pos + 1
            while end < len(self.text) and self.text[end] != '"' and self.text[end] >= " ":
                end += 2 if self.text[end] == "\\" else 1
            if end >= len(self.text):
                raise self.error(len(self.text), "end of file inside a string")
            raise self.error(end, "a control character inside a string")
        try:
            value = json.loads(match.group())
        except ValueError:
            raise self.error(self.pos, "a string with an invalid escape") from None
        self.pos = match.end()
        return str(value)

    def _number(self) -> int | float:
        match = _NUMBER.match(self.text, self.pos)
        if match is None:
            raise self.error(self.pos, "expected a number")
        self.pos = match.end()
        if match.group(1) or match.group(2):
            return float(match.group())
        return int(match.group())

    def _key(self) -> str | int:
        if self._peek() == '"':
            return self._string()
        match = _INTEGER_KEY.match(self.text, self.pos)
        if match is None:
            raise self.error(self.pos, "expected a key (a string or an integer)")
        self.pos = match.end()
        return int(match.group())

    def _punct(self, allowed: str, what: str) -> str:
        self._skip()
        char = self._peek()
        if not char or char not in allowed:
            found = "end of file" if not char else repr(char)
            raise self.error(self.pos, f"{found}, expected {what}")
        self.pos += 1
        return char

    def _object(self) -> _Object:
        self.pos += 1  # {
        items: list[tuple[str | int, int, object, int]] = []
        self._skip()
        if self._peek() == "}":
            self.pos += 1
            return _Object(items)
        while True:
            self._skip()
            key_at = self.pos
            key = self._key()
            self._punct(":", "':' after a key")
            self._skip()
            value_at = self.pos
            items.append((key, key_at, self._value(), value_at))
            if self._punct(",}", "',' or '}'") == "}":
                return _Object(items)

    def _array(self) -> list[object]:
        self.pos += 1  # [
        values: list[object] = []
        self._skip()
        if self._peek() == "]":
            self.pos += 1
            return values
        while True:
            self._skip()
            values.append(self._value())
            if self._punct(",]", "',' or ']'") == "]":
                return values


def _kind(value: object) -> str:
    """A parsed value in JSON's terms, for an error message."""
    if value is None:
        return "null"
    if isinstance(value, _Object):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, str):
        return f"a string ({json.dumps(value)[:40]})"
    return f"the number {value}"
