"""Source offsets: the next ConsumeQueue index of every message queue a query reads.

A message queue is ``(topic, brokerName, queueId)`` (:data:`QueueKey`). In a checkpoint, and in
the ``startingOffsets`` / ``endingOffsets`` options, offsets have the shape of RocketMQ's Spark
connector, queue ids as JSON object keys (strings)::

    {"orders": {"broker-0": {"0": 42, "1": 17}, "broker-1": {"0": 40}}}

An offset is the queue offset of the next message to read, so ``{"0": 42}`` has read messages
0..41 of queue 0. In options, ``-2`` means the queue's earliest offset and ``-1`` its latest.
``startingOffsets`` may also be ``group:NAME``: the offsets a RocketMQ consumer group committed
(see :mod:`rocketstore.pipeline.engine.groups`), read when the query first plans its offsets.

:func:`to_json` writes keys in a fixed order (topic, broker, queue id ascending): Spark compares
offsets by their JSON text, and the same offsets must always serialise the same way.

Pure functions and immutable values; thread-safe; no Spark.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from rocketstore.pipeline.errors import ConfigError, StoreError

QueueKey = tuple[str, str, int]  # (topic, brokerName, queueId)
Offsets = dict[QueueKey, int]

EARLIEST = -2
LATEST = -1
GROUP_PREFIX = "group:"
# RocketMQ's consumer group names (its client's Validators.checkGroup).
_GROUP_RE = re.compile(r"^[%|a-zA-Z0-9_-]{1,255}$")

EXAMPLE = '{"orders": {"broker-0": {"0": 42, "1": -2}}}'


def queue_name(key: QueueKey) -> str:
    """``topic/broker/queueId``, as messages name a queue."""
    return f"{key[0]}/{key[1]}/{key[2]}"


def sort_key(key: QueueKey) -> tuple[str, int, str, int]:
    """Broker order as the root numbers brokers (``broker-2`` before ``broker-10``)."""
    topic, broker, qid = key
    head, _, tail = broker.rpartition("-")
    number = int(tail) if tail.isdigit() else -1
    return topic, number, broker if number < 0 else head, qid


def to_json(offsets: Mapping[QueueKey, int]) -> dict[str, dict[str, dict[str, int]]]:
    """The nested JSON form, in a fixed key order."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for key in sorted(offsets, key=sort_key):
        topic, broker, qid = key
        out.setdefault(topic, {}).setdefault(broker, {})[str(qid)] = int(offsets[key])
    return out


def from_json(data: Any, what: str = "offsets") -> Offsets:
    """Parse the nested JSON form (already decoded); raises :class:`StoreError` naming ``what``
    when it is not that shape. Values are taken as they are (checkpointed offsets are >= 0;
    option values are checked by :func:`parse_option`)."""
    if not isinstance(data, dict):
        raise StoreError(f"{what}: expected a JSON object of topics, got {type(data).__name__}")
    out: Offsets = {}
    for topic, brokers in data.items():
        if not isinstance(brokers, dict):
            raise StoreError(f"{what}: topic {topic!r} must map to an object of brokers")
        for broker, queues in brokers.items():
            if not isinstance(queues, dict):
                raise StoreError(
                    f"{what}: {topic}/{broker} must map to an object of queue ids and offsets"
                )
            for qid, value in queues.items():
                if not (isinstance(qid, str) and qid.isdigit()):
                    raise StoreError(
                        f"{what}: queue id {qid!r} of {topic}/{broker} is not a number"
                    )
                if isinstance(value, bool) or not isinstance(value, int):
                    raise StoreError(
                        f"{what}: offset of {topic}/{broker}/{qid} must be an integer, got "
                        f"{value!r}"
                    )
                out[(topic, broker, int(qid))] = value
    return out


def dumps(offsets: Mapping[QueueKey, int]) -> str:
    return json.dumps(to_json(offsets), separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts (or, for a batch, ends), as the options said.

    ``kind`` is ``earliest``, ``latest``, ``offsets`` (``values``: offsets, -2/-1 allowed),
    ``timestamp`` (``timestamp``: one time for every queue), ``timestamps`` (``values``: a time
    per queue, -2/-1 allowed) or ``group`` (``group``: a RocketMQ consumer group, whose
    committed offsets the planner reads when it needs them). Queues the spec does not name
    start at their earliest offset.
    """

    kind: str
    values: tuple[tuple[QueueKey, int], ...] = ()
    timestamp: int = 0
    group: str = ""

    @property
    def mapping(self) -> Offsets:
        return dict(self.values)


def parse_option(
    option: str,
    text: str,
    topics: Iterable[str],
    *,
    allow_earliest: bool = True,
    allow_group: bool = False,
) -> OffsetSpec:
    """Parse ``earliest``, ``latest``, offsets JSON or (``allow_group``) ``group:NAME`` for
    ``option``; raises :class:`ConfigError` naming the option and the accepted forms."""
    words = (
        ["earliest"] * allow_earliest + ["latest"] + ["group:NAME (a consumer group)"] * allow_group
    )
    accepted = (
        f"expected {', '.join(words)} or a JSON object like {EXAMPLE} (-2 = earliest, -1 = latest)"
    )
    word = text.strip().lower()
    if word.startswith(GROUP_PREFIX):
        name = text.strip()[len(GROUP_PREFIX) :].strip()
        if not allow_group:
            raise ConfigError(
                f"option {option}={text!r}: a consumer group is not allowed here; {accepted}"
            )
        if not _GROUP_RE.match(name):
            raise ConfigError(
                f"option {option}={text!r}: {name!r} is not a consumer group name (1-255 "
                "characters of letters, digits, %, |, _ and -)"
            )
        return OffsetSpec("group", group=name)
    if word in ("earliest", "latest"):
        if word == "earliest" and not allow_earliest:
            raise ConfigError(f"option {option}=earliest: not allowed here; {accepted}")
        return OffsetSpec(word)
    values = _parse_json_map(option, text, topics, accepted, minimum=EARLIEST)
    if not allow_earliest and any(v == EARLIEST for v in values.values()):
        raise ConfigError(f"option {option}={text!r}: -2 (earliest) is not allowed; {accepted}")
    return OffsetSpec("offsets", tuple(sorted(values.items(), key=lambda kv: sort_key(kv[0]))))


def parse_timestamps_option(option: str, text: str, topics: Iterable[str]) -> OffsetSpec:
    """``startingOffsetsByTimestamp``: JSON of the offsets shape whose values are store times in
    ms (or -2 / -1)."""
    accepted = (
        'expected a JSON object like {"orders": {"broker-0": {"0": 1700000000000}}} of store '
        "timestamps in milliseconds since the epoch (-2 = earliest, -1 = latest)"
    )
    values = _parse_json_map(option, text, topics, accepted, minimum=EARLIEST)
    return OffsetSpec("timestamps", tuple(sorted(values.items(), key=lambda kv: sort_key(kv[0]))))


def _parse_json_map(
    option: str, text: str, topics: Iterable[str], accepted: str, *, minimum: int
) -> Offsets:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"option {option}={text!r}: not valid JSON ({exc}); {accepted}") from None
    try:
        values = from_json(data, what=f"option {option}")
    except StoreError as exc:
        raise ConfigError(f"{exc}; {accepted}") from None
    known = set(topics)
    for (topic, broker, qid), value in values.items():
        if topic not in known:
            raise ConfigError(
                f"option {option}: topic {topic!r} is not one the query reads (option topic: "
                f"{', '.join(sorted(known))})"
            )
        if value < minimum:
            raise ConfigError(
                f"option {option}: {topic}/{broker}/{qid} = {value} is out of range; {accepted}"
            )
    return values
