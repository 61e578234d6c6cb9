"""A small store that rolls every file type, and ways to damage it at seeded random places:
the store that tests/test_verify.py and tests/test_corruption.py damage.

:func:`build_store` writes 64 KiB CommitLog segments (so END_OF_FILE blanks appear),
ConsumeQueue files of 50 units, index files of 300 entries over 101 slots; it mixes topics and
queues, IPv6 born hosts, tags, keys, user properties, empty bodies and PREPARED / COMMIT /
ROLLBACK transactions, and returns what a test knows about it (:class:`Built`).
"""

from __future__ import annotations

import dataclasses
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.message import Message, messages_to_table
from rocketstore.pipeline.layout import UNIT_DTYPE

CONFIG = StoreConfig(
    mapped_file_size_commitlog=64 * 1024,
    mapped_file_size_consume_queue=20 * 50,
    max_hash_slot_num=101,
    max_index_num=300,
)
SEG = CONFIG.mapped_file_size_commitlog
MESSAGES = 700
TOPICS = ("TopicA", "TopicB")
START_MS = 1_700_000_000_000

# Byte ranges of a record that the store's own checks cover (magic, sizes, CRC, PHYSICALOFFSET):
# damage there makes every read of the record fail.
STRUCTURAL = ("head", "physical", "body_length", "body", "topic_length", "props_length")

# Covered only by cross-checks against the ConsumeQueue (no checksum protects them).
CROSS_CHECKED = ("queue_id", "queue_offset", "topic")


class Clock:
    def __init__(self) -> None:
        self.now = START_MS

    def __call__(self) -> int:
        return self.now


@dataclasses.dataclass
class Built:
    """What a test knows about the store it damages."""

    path: Path
    offsets: list[int]  # every record, in log order
    sizes: dict[int, int]
    dispatched: set[int]  # records with a ConsumeQueue unit
    last_of_queue: set[int]  # the newest record of each queue
    messages: dict[int, Message]


def make_messages(n: int, seed: int) -> list[Message]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        roll = rng.random()
        sys_flag = (
            record.TRANSACTION_PREPARED_TYPE
            if roll < 0.05
            else record.TRANSACTION_COMMIT_TYPE
            if roll < 0.08
            else record.TRANSACTION_ROLLBACK_TYPE
            if roll < 0.10
            else 0
        )
        out.append(
            Message(
                topic=TOPICS[i % 2],
                body=rng.randbytes(rng.choice((0, 1, 40, 120, 300))),
                queue_id=rng.randrange(3),
                keys=[f"key-{i}", f"grp-{i % 7}"],
                tags=rng.choice((None, "TagA", "TagB", "TagC")),
                properties={"p": str(i)} if i % 3 == 0 else None,
                sys_flag=sys_flag,
                born_host="[::1]:5000" if i % 9 == 0 else None,
            )
        )
    return out


def build_store(path: Path, n: int = MESSAGES, seed: int = 7) -> Built:
    messages = make_messages(n, seed)
    rng = random.Random(seed)
    clock = Clock()
    offsets: list[int] = []
    sizes: dict[int, int] = {}
    by_offset: dict[int, Message] = {}
    with MessageStore(path, CONFIG, clock_ms=clock) as store:
        i = 0
        while i < n:
            batch = messages[i : i + rng.randrange(1, 60)]
            clock.now += rng.randrange(0, 2500)
            result = store.put_batch(batch if i % 2 else messages_to_table(batch))
            for m, off, size in zip(
                batch, result.commit_log_offsets.tolist(), result.sizes.tolist(), strict=True
            ):
                offsets.append(off)
                sizes[off] = size
                by_offset[off] = m
            i += len(batch)
        dispatched: set[int] = set()
        last: set[int] = set()
        for (topic, qid), cq in store.queues.items():
            units = store.read_units(topic, qid, 0, cq.max_offset)
            dispatched.update(units["offset"].tolist())
            last.add(int(units[-1]["offset"]))
    return Built(path, offsets, sizes, dispatched, last, by_offset)


def copy_store(b: Built, path: Path) -> Built:
    shutil.copytree(b.path, path)
    return dataclasses.replace(b, path=path)


def open_ro(path: Path, config: StoreConfig = CONFIG) -> MessageStore:
    return MessageStore(path, config, read_only=True)


def segment_path(store: Path, phys: int) -> Path:
    return store / "commitlog" / segment_name(phys - phys % SEG)


def read_at(path: Path, pos: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(pos)
        return f.read(n)


def flip(path: Path, pos: int, rng: random.Random) -> None:
    """Change the byte at ``pos`` (XOR with a random non-zero mask)."""
    with open(path, "r+b") as f:
        f.seek(pos)
        old = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([old ^ rng.randrange(1, 256)]))


def record_fields(raw: bytes) -> dict[str, tuple[int, int]]:
    """Byte range of each field of an encoded record, relative to its start."""
    sys_flag = int.from_bytes(raw[36:40], "big", signed=True)
    born = 20 if sys_flag & record.BORNHOST_V6_FLAG else 8
    stored = 20 if sys_flag & record.STOREHOSTADDRESS_V6_FLAG else 8
    body_len_at = 48 + born + 8 + stored + 12
    body_len = int.from_bytes(raw[body_len_at : body_len_at + 4], "big")
    body_at = body_len_at + 4
    topic_len_at = body_at + body_len
    topic_at = topic_len_at + 1
    props_len_at = topic_at + raw[topic_len_at]
    return {
        "head": (0, 12),  # TOTALSIZE, MAGIC, BODYCRC
        "queue_id": (12, 16),
        "queue_offset": (20, 28),
        "physical": (28, 36),
        "body_length": (body_len_at, body_len_at + 4),
        "body": (body_at, topic_len_at),
        "topic_length": (topic_len_at, topic_at),
        "topic": (topic_at, props_len_at),
        "props_length": (props_len_at, props_len_at + 2),
    }


def damage_records(
    b: Built, rng: random.Random, count: int, fields: tuple[str, ...], pool: list[int]
) -> list[int]:
    """Change 1-3 bytes inside ``fields`` of ``count`` records drawn from ``pool``."""
    chosen = sorted(rng.sample(pool, count))
    for phys in chosen:
        seg = segment_path(b.path, phys)
        rel = phys % SEG
        ranges = record_fields(read_at(seg, rel, b.sizes[phys]))
        positions = [p for name in fields for p in range(*ranges[name])]
        for pos in rng.sample(positions, min(len(positions), rng.randrange(1, 4))):
            flip(seg, rel + pos, rng)
    return chosen


def middle_records(b: Built) -> list[int]:
    """Records whose damage recovery does not take for a torn end of the log."""
    return [p for p in b.offsets[:-1] if p not in b.last_of_queue]


def queue_units(path: Path) -> Iterator[tuple[Path, int, int]]:
    """(ConsumeQueue file, position, CommitLog offset) of every unit in use."""
    for f in sorted((path / "consumequeue").rglob("*")):
        if f.is_file():
            units = np.fromfile(f, dtype=UNIT_DTYPE)
            for k in np.flatnonzero(units["size"] > 0).tolist():
                yield f, k * 20, int(units[k]["offset"])


def index_files(path: Path) -> list[Path]:
    return sorted((path / "index").iterdir())
