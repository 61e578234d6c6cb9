"""The model behind tests/test_live_model.py: what the writer puts, what it acknowledged, and
what every reader saw, checked against one another.

Every message is numbered (``seq``) and everything about it follows from its number
(:func:`message`): its queue (most go to a few hot queues, the rest spread over many cold
ones), its body (which starts with the number), its key and tag. So a reader that reads a
message knows which one it is and where it belongs, and the checks need no copy of the data.

The writer (tests/procs/model_writer.py) appends two logs, one ``write`` a line each, which a
kill -9 leaves whole up to the line being written:

* ``intents``: ``<first seq> <count>`` before each put;
* ``acks``: ``{"first", "n", "qo"}`` after the put returned, with the queue offset it gave each
  message.

:class:`Model` takes the acknowledgements and every observation (a message read at a queue
offset, by whichever reader) and says what is wrong: an offset handed out twice, a reader that
saw at an offset a message other than the one acknowledged there, a message read in the wrong
queue or with the wrong bytes, an acknowledged message missing from where retention has not
removed it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.format.message import Message

# Small files, so that a minute of writing rolls and deletes many of each.
CONFIG = StoreConfig(
    mapped_file_size_commitlog=256 * 1024,
    mapped_file_size_consume_queue=20 * 64,
    max_hash_slot_num=211,
    max_index_num=2000,
    flush_interval_commitlog=100,
    file_reserved_time=1,
)
CONFIG_TOML = """\
mappedFileSizeCommitLog = 262144
mappedFileSizeConsumeQueue = 1280
maxHashSlotNum = 211
maxIndexNum = 2000
flushIntervalCommitLog = 100
fileReservedTime = 1
"""
FINAL = "final"  # the reader that reads the whole store once the writer closed it
HOT_TOPIC = "hot"
HOT_QUEUES = 16
COLD_TOPICS = 8
# Messages in ten that go to the hot queues: these fill ConsumeQueue file after file, while
# most cold queues hold a unit or two and are never loaded again after a restart.
HOT_SHARE = 7


@dataclasses.dataclass(frozen=True)
class Shape:
    """How many cold queues a run spreads over (the topics ``cold0`` ... of
    :data:`COLD_TOPICS`)."""

    cold_queues_per_topic: int

    @property
    def queues(self) -> int:
        return HOT_QUEUES + COLD_TOPICS * self.cold_queues_per_topic


def _mix(seq: int) -> int:
    """A well-spread 64-bit function of ``seq`` (splitmix64's finaliser)."""
    z = (seq * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def queue_of(seq: int, shape: Shape) -> tuple[str, int]:
    h = _mix(seq)
    if h % 10 < HOT_SHARE:
        return HOT_TOPIC, (h >> 8) % HOT_QUEUES
    topic = (h >> 8) % COLD_TOPICS
    return f"cold{topic}", (h >> 16) % shape.cold_queues_per_topic


def body_of(seq: int) -> bytes:
    return f"{seq}|".encode() + b"m" * (_mix(seq) % 300)


def message(seq: int, shape: Shape) -> Message:
    topic, queue_id = queue_of(seq, shape)
    return Message(topic, body_of(seq), queue_id=queue_id, keys=f"k{seq}", tags=f"t{seq % 3}")


def seq_of(body: bytes) -> int | None:
    """The number a body starts with; None for a body no writer of the model wrote."""
    head, sep, _ = body.partition(b"|")
    return int(head) if sep and head.isdigit() else None


def _lines(path: Path) -> Iterator[str]:
    """Whole lines of a log (a kill may leave the last one cut short: not a line)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    for line in text.split("\n")[:-1]:
        if line:
            yield line


def next_seq(intents: Path) -> int:
    """The first number no put has used yet, acknowledged or not."""
    end = 1
    for line in _lines(intents):
        first, n = map(int, line.split())
        end = max(end, first + n)
    return end


@dataclasses.dataclass
class Model:
    """What was acknowledged and what was seen (see the module docstring)."""

    shape: Shape
    acked: dict[tuple[str, int, int], int] = dataclasses.field(default_factory=dict)
    seen: dict[tuple[str, int, int], tuple[int, str]] = dataclasses.field(default_factory=dict)
    written: set[int] = dataclasses.field(default_factory=set)
    final: set[tuple[str, int, int]] = dataclasses.field(default_factory=set)  # read at the end
    problems: list[str] = dataclasses.field(default_factory=list)
    observations: int = 0

    def load_logs(self, intents: Path, acks: Path) -> None:
        """Every put's numbers, and the offsets of the acknowledged ones; an offset that two
        acknowledgements gave is a problem (an offset handed out twice)."""
        for line in _lines(intents):
            first, n = map(int, line.split())
            self.written.update(range(first, first + n))
        self.acked.clear()
        for line in _lines(acks):
            ack = json.loads(line)
            for i, offset in enumerate(ack["qo"]):
                seq = ack["first"] + i
                topic, queue_id = queue_of(seq, self.shape)
                key = (topic, queue_id, int(offset))
                other = self.acked.setdefault(key, seq)
                if other != seq:
                    self.problem(f"offset {key} handed out twice: to message {other} and {seq}")

    def problem(self, text: str) -> None:
        if len(self.problems) < 200:
            self.problems.append(text)

    def saw(self, reader: str, topic: str, queue_id: int, offset: int, body: bytes) -> None:
        """A reader read ``body`` at queue offset ``offset`` of ``topic``/``queue_id``."""
        self.observations += 1
        seq = seq_of(body)
        where = (topic, queue_id, offset)
        if seq is None or body != body_of(seq):
            self.problem(f"{reader}: a body no put wrote at {where}: {body[:40]!r}")
            return
        if queue_of(seq, self.shape) != (topic, queue_id):
            self.problem(f"{reader}: message {seq} read in {topic}/{queue_id}")
            return
        if reader == FINAL:
            self.final.add(where)
        before = self.seen.setdefault(where, (seq, reader))
        if before[0] != seq:
            self.problem(
                f"{reader}: message {seq} at {where}, where {before[1]} read message {before[0]}"
            )

    def saw_rows(self, reader: str, rows: Iterable[tuple[str, int, int, bytes]]) -> None:
        for topic, queue_id, offset, body in rows:
            self.saw(reader, topic, queue_id, offset, body)

    def check_seen(self) -> None:
        """Once the logs are loaded whole: every message read was put, and where a put was
        acknowledged, read at the offset the acknowledgement gave."""
        for where, (seq, reader) in self.seen.items():
            if seq not in self.written:
                self.problem(f"{reader}: message {seq} at {where}, which no put wrote")
            acked = self.acked.get(where)
            if acked is not None and acked != seq:
                self.problem(f"{reader}: message {seq} at {where}, acknowledged as {acked}")

    def check_complete(self, bounds: dict[tuple[str, int], tuple[int, int]]) -> int:
        """Every acknowledged message at or past its queue's min offset (``bounds``: each
        queue's min and max offset once the writer closed the store) was read at its offset
        by the final read (reader :data:`FINAL`). Returns how many acknowledged messages
        retention removed."""
        removed = 0
        for (topic, queue_id, offset), seq in self.acked.items():
            lo, hi = bounds.get((topic, queue_id), (0, 0))
            if offset < lo:
                removed += 1
            elif offset >= hi:
                self.problem(
                    f"acknowledged message {seq} at {topic}/{queue_id}/{offset} is "
                    f"past the queue's end {hi}"
                )
            elif (topic, queue_id, offset) not in self.final:
                self.problem(
                    f"acknowledged message {seq} at {topic}/{queue_id}/{offset} was never read"
                )
        return removed
