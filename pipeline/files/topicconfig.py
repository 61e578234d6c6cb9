"""``config/topics.json``: the topics a stock RocketMQ broker serves from a store directory.

A RocketMQ 4.9 broker run with ``autoCreateTopicEnable=false`` (as production brokers are)
serves exactly the topics its store's ``config/topics.json`` names: a topic whose ConsumeQueues
are on disk but which the file leaves out is recovered and then never found by clients ("No
route info of this topic"). This module keeps that file for the directories rocketstore writes.

The file is the broker's ``TopicConfigManager`` state as fastjson writes it: pretty-printed with
a tab per level, ``"key":value`` without spaces, the fields of each object in alphabetical
order, no newline at the end::

    {
        "dataVersion":{
            "counter":3,
            "timestamp":1700000000000
        },
        "topicConfigTable":{
            "TopicA":{
                "order":false,
                "perm":6,
                "readQueueNums":4,
                "topicFilterType":"SINGLE_TAG",
                "topicName":"TopicA",
                "topicSysFlag":0,
                "writeQueueNums":4
            },
            ...
        }
    }

* ``dataVersion``: ``timestamp`` (ms) of the last change and a ``counter`` raised by one at each
  change (RocketMQ's ``DataVersion.nextVersion``); the name server compares versions to notice
  that a broker's topics changed.
* ``topicConfigTable``: topic name to its ``TopicConfig``. ``readQueueNums``: consumers are
  routed to queue ids ``0 .. readQueueNums - 1``; ``writeQueueNums``: producers send to ids
  ``0 .. writeQueueNums - 1``; ``perm``: ``PermName`` bits (4 read, 2 write, 1 inherit, 8
  priority; 6 is read and write); ``topicFilterType`` ``SINGLE_TAG`` or ``MULTI_TAG``;
  ``topicSysFlag`` (unit flags); ``order``. A field an entry leaves out has ``TopicConfig``'s
  default (16 queues each way, perm 6, ``SINGLE_TAG``, 0, false), the map key is the name.

A running broker adds its system topics (``SCHEDULE_TOPIC_XXXX``, ``SELF_TEST_TOPIC``,
``OFFSET_MOVED_EVENT``, ``RMQ_SYS_TRANS_HALF_TOPIC``, its cluster's and its own name, the
``%RETRY%`` topic of each consumer group, ...) and whatever an administrator created.
:func:`ensure_topics` merges into what is there: it adds a topic the file lacks with ``perm`` 6
and the queue count asked for, raises the read and write queue counts of a topic it names to at
least that count, and changes nothing else: other topics, ``perm``, flags and fields it does not
know (a newer broker's) stay as they were. It never lowers a count and writes nothing when
nothing changes.

Reading follows the broker (``ConfigManager.load``): ``topics.json``, or ``topics.json.bak``
when ``topics.json`` is missing or empty (a broker's own rewrite deletes the file before it
renames the new one into place, so a crash there leaves only the ``.bak``). Unlike the broker,
which falls back on the ``.bak`` when ``topics.json`` is not valid JSON and so forgets what the
damaged file held, this module refuses such a file (:class:`TopicConfigError`, naming the file,
line and column) and never writes over it: someone must look at it.

Crash behaviour: a change is written the way RocketMQ's ``MixAll.string2File`` writes (the new
state in ``topics.json.tmp``, the previous one kept as ``topics.json.bak``, a rename into place),
with fsyncs of the files and the directory added, since rocketstore promises durability, and
with a rename over the old file instead of RocketMQ's delete-then-rename: the previous
``topics.json`` is first copied whole to ``topics.json.bak`` (through ``topics.json.bak.tmp``
and a rename), then the new one renamed over ``topics.json``. After a crash or power cut at any
point, ``topics.json`` is whole and holds the old or the new state, and (once there was a
previous version) ``topics.json.bak`` is whole and holds the previous state or the one before.

Thread- and process-safety: :func:`read_topics` needs no lock (a rename is atomic). A change is
a read-modify-write of the file: one writer at a time per directory, which the store
directory's lock gives (:mod:`rocketstore.pipeline.files.lock`: held by a writable
:class:`~rocketstore.pipeline.engine.store.MessageStore`, and by a running broker); callers within one process
serialise themselves. A :class:`TopicsKeeper` is not thread-safe.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rocketstore.pipeline.errors import TopicConfigError
from rocketstore.pipeline.files import durability
from rocketstore.pipeline.files.brokerconfig import load_bytes

FILE_NAME = "topics.json"
BAK_NAME = FILE_NAME + ".bak"

PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
# What rocketstore gives a topic it adds, and what the admin API and the stock tools default to.
DEFAULT_PERM = PERM_READ | PERM_WRITE
# TopicConfig's defaults: what a broker assumes for a field an entry leaves out.
DEFAULT_QUEUE_NUMS = 16
DEFAULT_FILTER_TYPE = "SINGLE_TAG"


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclasses.dataclass(frozen=True)
class TopicConfig:
    """One entry of ``topicConfigTable``, fields as RocketMQ's ``TopicConfig`` has them."""

    topic_name: str
    read_queue_nums: int = DEFAULT_QUEUE_NUMS
    write_queue_nums: int = DEFAULT_QUEUE_NUMS
    perm: int = DEFAULT_PERM
    topic_filter_type: str = DEFAULT_FILTER_TYPE
    topic_sys_flag: int = 0
    order: bool = False

    @property
    def perm_text(self) -> str:
        """``perm`` as RocketMQ's ``PermName.perm2String`` spells it (``RW-`` for 6)."""
        return "".join(
            letter if self.perm & bit else "-"
            for bit, letter in ((PERM_READ, "R"), (PERM_WRITE, "W"), (PERM_INHERIT, "X"))
        )

    def to_json(self) -> dict[str, Any]:
        """The entry as the file spells it (RocketMQ's names, fastjson's order)."""
        return {
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }


@dataclasses.dataclass(frozen=True)
class TopicsFile:
    """What a directory's topic configuration says, as :func:`read_topics` found it."""

    path: Path  # the file it came from: topics.json, or topics.json.bak when that was missing
    timestamp: int  # dataVersion
    counter: int
    topics: dict[str, TopicConfig]  # in the file's order


def queue_counts(queues: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Per topic, the queue count that covers every ``(topic, queue_id)`` given: one more than
    the highest queue id, as a broker must be told to serve them all."""
    counts: dict[str, int] = {}
    for topic, queue_id in queues:
        counts[topic] = max(counts.get(topic, 0), queue_id + 1)
    return counts


def read_topics(config_dir: Path) -> TopicsFile | None:
    """The topic configuration of a store's ``config/`` directory, as a broker would load it;
    None when there is none (no ``topics.json`` and no ``.bak``, or both empty).

    Raises :class:`TopicConfigError` for a file that is not RocketMQ's format."""
    loaded = _load(Path(config_dir))
    return None if loaded is None else loaded.parsed


def ensure_topics(
    config_dir: Path,
    queues: Mapping[str, int],
    *,
    clock_ms: Callable[[], int] = _wall_clock_ms,
) -> bool:
    """Make ``config_dir/topics.json`` name every topic of ``queues`` (topic to the queue count
    it needs, see :func:`queue_counts`) with read and write queue counts of at least that many;
    True when the file was changed, False when it already did (then nothing is written).

    A change bumps ``dataVersion`` (``timestamp`` from ``clock_ms``) and is written crash-safely
    (see the module). Needs the store directory's lock or equivalent (one writer at a time).
    Raises :class:`TopicConfigError` (writing nothing) when the file there is not RocketMQ's
    format, ``ValueError`` for a count below 1 or an empty topic name, ``OSError`` when a write
    fails (the old ``topics.json`` then stays, whole)."""
    for topic, count in queues.items():
        if not topic:
            raise ValueError("a topic name must not be empty")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"topic {topic!r}: queue count must be an integer >= 1, got {count!r}")
    config_dir = Path(config_dir)
    loaded = _load(config_dir)
    if loaded is None:
        document: dict[str, Any] = {"dataVersion": {"counter": 0}, "topicConfigTable": {}}
        known: dict[str, TopicConfig] = {}
    else:
        document, known = loaded.document, loaded.parsed.topics
    table: dict[str, Any] = document.setdefault("topicConfigTable", {})
    changed = False
    for topic, count in queues.items():
        have = known.get(topic)
        if have is None:
            table[topic] = TopicConfig(topic, count, count).to_json()
            changed = True
            continue
        entry = table[topic]
        for field, value in (
            ("readQueueNums", have.read_queue_nums),
            ("writeQueueNums", have.write_queue_nums),
        ):
            if value < count:
                entry[field] = count
                changed = True
    if not changed:
        return False
    version = document.setdefault("dataVersion", {})
    version["counter"] = int(version.get("counter", 0)) + 1
    version["timestamp"] = clock_ms()
    durability.make_dirs(config_dir)
    if loaded is not None and loaded.previous is not None:
        durability.write_file(config_dir / BAK_NAME, loaded.previous)
    durability.write_file(config_dir / FILE_NAME, _encode(document))
    return True


class TopicsKeeper:
    """:func:`ensure_topics` for a directory a writer holds open: it remembers the counts it
    has made sure of, so a call that brings nothing new costs a comparison, not a read of the
    file. That memory is right while the writer holds the directory's lock (nobody else may
    change the file meanwhile); a failed call is forgotten and tried again by the next one.
    Not thread-safe: the writer calls it under its own lock."""

    def __init__(self, config_dir: Path, *, clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        self.config_dir = Path(config_dir)
        self.clock_ms = clock_ms
        self._ensured: dict[str, int] = {}

    def update(self, queues: Iterable[tuple[str, int]]) -> bool:
        """Ensure the topics of these ``(topic, queue_id)`` pairs (e.g. the keys of a store's
        ConsumeQueue map); True when ``topics.json`` was changed."""
        counts = queue_counts(queues)
        if all(self._ensured.get(topic, 0) >= n for topic, n in counts.items()):
            return False
        changed = ensure_topics(self.config_dir, counts, clock_ms=self.clock_ms)
        for topic, n in counts.items():
            self._ensured[topic] = max(self._ensured.get(topic, 0), n)
        return changed


# -- the file ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Loaded:
    document: dict[str, Any]  # the whole JSON object, unknown fields included
    parsed: TopicsFile
    previous: bytes | None  # topics.json as read, to keep as the .bak; None if it came from .bak


def _load(config_dir: Path) -> _Loaded | None:
    found = load_bytes(config_dir, FILE_NAME)
    if found is None:
        return None
    path, raw = found
    document = _decode(path, raw)
    previous = raw if path.name == FILE_NAME else None
    return _Loaded(document, _parse(path, document), previous)


def _decode(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopicConfigError(
            f"{path}: not UTF-8 at byte {exc.start}; rocketstore leaves it as it is: repair it "
            f"or move it away (a broker would fall back on {BAK_NAME})"
        ) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TopicConfigError(
            f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno} (character "
            f"{exc.pos}): {exc.msg}; rocketstore leaves it as it is: repair it or move it away "
            f"(a broker would fall back on {BAK_NAME})"
        ) from None
    if not isinstance(document, dict):
        raise TopicConfigError(
            f"{path}: holds {_kind(document)}, not a JSON object with a topicConfigTable"
        )
    return document


_JSON_KINDS = {dict: "object", list: "array", str: "string", bool: "boolean"}


def _kind(value: object) -> str:
    """A decoded JSON value described in JSON's terms, for an error message."""
    if value is None:
        return "null"
    return f"a JSON {_JSON_KINDS.get(type(value), 'number')} ({json.dumps(value)[:40]})"


def _parse(path: Path, document: dict[str, Any]) -> TopicsFile:
    """The typed view of a decoded file; :class:`TopicConfigError` names the first field of the
    wrong type."""

    def field(where: str, obj: dict[str, Any], name: str, kind: type, default: Any) -> Any:
        value = obj.get(name, default)
        # bool is an int in Python, not in JSON: "perm": true is as wrong as "perm": "6".
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            want = {int: "an integer", str: "a string", bool: "true or false", dict: "an object"}
            raise TopicConfigError(
                f"{path}: {where}{name} is {_kind(value)}, expected {want[kind]}"
            )
        return value

    version = field("", document, "dataVersion", dict, {})
    table = field("", document, "topicConfigTable", dict, {})
    topics: dict[str, TopicConfig] = {}
    for name in table:
        entry = field("topicConfigTable.", table, name, dict, None)
        at = f"topicConfigTable.{name}."
        topics[name] = TopicConfig(
            topic_name=name,
            read_queue_nums=field(at, entry, "readQueueNums", int, DEFAULT_QUEUE_NUMS),
            write_queue_nums=field(at, entry, "writeQueueNums", int, DEFAULT_QUEUE_NUMS),
            perm=field(at, entry, "perm", int, DEFAULT_PERM),
            topic_filter_type=field(at, entry, "topicFilterType", str, DEFAULT_FILTER_TYPE),
            topic_sys_flag=field(at, entry, "topicSysFlag", int, 0),
            order=field(at, entry, "order", bool, False),
        )
    return TopicsFile(
        path=path,
        timestamp=field("dataVersion.", version, "timestamp", int, 0),
        counter=field("dataVersion.", version, "counter", int, 0),
        topics=topics,
    )


def _encode(document: dict[str, Any]) -> bytes:
    # fastjson's pretty format: a tab per level, no space after the colon, no final newline.
    return json.dumps(document, indent="\t", separators=(",", ":"), ensure_ascii=False).encode()
