"""A store rocketstore writes must look, file by file, like one RocketMQ 4.9.x writes, so that
RocketMQ's DefaultMessageStore loads it: names, exact sizes, blanks, units and index headers.

Expected values come from outside the code under test: the records through tests/kit/rawlog.py (an
independent reader), tags codes and key hashes from Java's own ``hashCode`` (tests/kit/javaref.py),
checked against what RocketMQ 4.9.4 itself wrote into the fixture stores."""

from __future__ import annotations

import itertools
import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.checkpoint import FILE_SIZE
from rocketstore.pipeline.format import record
from rocketstore.pipeline.layout import INDEX_HEADER, UNIT_DTYPE
from tests.kit.fixtures import fixture_dir
from tests.kit.javaref import KNOWN, index_key_hash
from tests.kit.rawlog import commitlog_records

TAGS = ("TagA", "TagB", "TagC")
CONFIG = StoreConfig(
    mapped_file_size_commitlog=64 * 1024,
    mapped_file_size_consume_queue=20 * 50,
    max_hash_slot_num=101,
    max_index_num=300,
)


def write_sample(path: Path, n: int = 2000) -> None:
    clock = iter(range(1_700_000_000_000, 1_700_000_000_000 + 10**7, 7))
    with MessageStore(path, CONFIG, clock_ms=lambda: next(clock)) as store:
        for start in range(0, n, 250):
            idx = list(range(start, min(n, start + 250)))
            store.put_batch(
                pa.table(
                    {
                        "topic": [("TopicA", "TopicB")[i % 2] for i in idx],
                        "body": [f"body-{i}-".encode() + b"x" * (i % 300) for i in idx],
                        "queueId": pa.array([(i // 2) % 4 for i in idx], pa.int32()),
                        "keys": [f"key-{i} grp-{i % 10}" for i in idx],
                        "tags": [TAGS[i % 3] for i in idx],
                        "bornHost": ["[::1]:5006" if i % 7 == 6 else "127.0.0.1:5000" for i in idx],
                    }
                )
            )


def test_file_names_and_sizes_are_rocketmq_s(tmp_path: Path) -> None:
    path = tmp_path / "store"
    write_sample(path)
    assert sorted(p.name for p in path.iterdir()) == [
        "checkpoint", "commitlog", "config", "consumequeue", "index", "lock",
    ]  # fmt: skip
    assert (path / "lock").read_bytes() == b"lock"
    assert (path / "checkpoint").stat().st_size == FILE_SIZE
    segs = sorted((path / "commitlog").iterdir())
    assert len(segs) > 3
    for i, seg in enumerate(segs):
        assert seg.name == f"{i * CONFIG.mapped_file_size_commitlog:020d}"
        assert seg.stat().st_size == CONFIG.mapped_file_size_commitlog
    for qdir in (path / "consumequeue").glob("*/*"):
        for j, f in enumerate(sorted(qdir.iterdir())):
            assert f.name == f"{j * CONFIG.mapped_file_size_consume_queue:020d}"
            assert f.stat().st_size == CONFIG.mapped_file_size_consume_queue
    index_files = sorted((path / "index").iterdir())
    assert len(index_files) > 1
    for f in index_files:
        assert len(f.name) == 17 and f.name.isdigit()
        assert f.stat().st_size == 40 + 4 * 101 + 20 * 300


def test_records_blanks_units_and_index_agree(tmp_path: Path) -> None:
    path = tmp_path / "store"
    write_sample(path)
    records = commitlog_records(path)
    assert len(records) == 2000
    by_offset = {}
    for phys, raw in records:
        m = record.decode_record(raw, 0, phys=phys)
        by_offset[phys] = m
        i = int(m.body.split(b"-")[1])
        assert m.topic == ("TopicA", "TopicB")[i % 2]
        assert m.queue_id == (i // 2) % 4 and m.queue_offset == i // 8
        assert (m.sys_flag & record.BORNHOST_V6_FLAG != 0) == (i % 7 == 6)
        assert m.keys == [f"key-{i}", f"grp-{i % 10}"]
    # Every ConsumeQueue unit points at its record, with RocketMQ's tagsCode.
    units_seen = 0
    for qdir in (path / "consumequeue").glob("*/*"):
        topic, qid = qdir.parent.name, int(qdir.name)
        units = np.concatenate(
            [np.frombuffer(f.read_bytes(), dtype=UNIT_DTYPE) for f in sorted(qdir.iterdir())]
        )
        units = units[units["size"] > 0]
        for offset, u in enumerate(units):
            m = by_offset[int(u["offset"])]
            assert (m.topic, m.queue_id, m.queue_offset) == (topic, qid, offset)
            assert int(u["size"]) == m.store_size
            assert int(u["tags_code"]) == KNOWN[m.tags or ""]
            units_seen += 1
    assert units_seen == 2000
    # Index headers chain: each file starts where the previous ended.
    headers = [
        INDEX_HEADER.unpack_from(f.read_bytes(), 0) for f in sorted((path / "index").iterdir())
    ]
    total_entries = sum(h[5] - 1 for h in headers)
    assert total_entries == 2000 * 3  # UNIQ_KEY + two keys each
    for prev, cur in itertools.pairwise(headers):
        assert prev[5] == 300  # full
        assert cur[2] >= prev[3] and cur[0] >= prev[1]


def expected_units(path: Path) -> dict[tuple[str, int], bytes]:
    """Every queue's ConsumeQueue bytes, built from the raw records alone: a 20-byte unit per
    record in queue offset order, ``[offset (long), size (int), tagsCode (long)]`` big-endian,
    tagsCode being Java's hashCode of the tag (0 without one)."""
    queues: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for phys, raw in commitlog_records(path):
        m = record.decode_record(raw, 0, phys=phys)
        unit = struct.pack(">qiq", phys, len(raw), KNOWN[m.tags or ""])
        queues.setdefault((m.topic, m.queue_id), []).append((m.queue_offset, unit))
    return {q: b"".join(u for _, u in sorted(units)) for q, units in queues.items()}


def index_entries(path: Path) -> list[tuple[int, int]]:
    """(keyHash, phyOffset) of every entry of every IndexFile, each checked to be reachable from
    its hash slot through the prevIndex chain, read with the documented layout only."""
    slots_n, entries_n = CONFIG.max_hash_slot_num, CONFIG.max_index_num
    found = []
    for f in sorted((path / "index").iterdir()):
        data = f.read_bytes()
        count = INDEX_HEADER.unpack_from(data, 0)[5]
        slots = struct.unpack_from(f">{slots_n}i", data, 40)
        entry = struct.Struct(">iqii")
        base = 40 + 4 * slots_n
        entries = [entry.unpack_from(data, base + 20 * i) for i in range(entries_n)]
        chained = set()
        for head in slots:
            i = head
            while i:
                chained.add(i)
                i = entries[i][3]
        assert chained == set(range(1, count)), f"{f}: entries outside the slot chains"
        for i in range(1, count):
            key_hash, phys = entries[i][0], entries[i][1]
            assert i in _chain(slots[key_hash % slots_n], entries)
            found.append((key_hash, phys))
    return found


def _chain(head: int, entries: list[tuple[int, int, int, int]]) -> set[int]:
    out = set()
    while head:
        out.add(head)
        head = entries[head][3]
    return out


def test_rebuilding_derived_files_gives_rocketmqs_units_and_index(tmp_path: Path) -> None:
    path = tmp_path / "store"
    write_sample(path)
    shutil.rmtree(path / "consumequeue")
    shutil.rmtree(path / "index")
    with MessageStore(path, CONFIG) as store:
        assert store.recovery.records_redispatched == 2000
    for (topic, qid), units in expected_units(path).items():
        files = sorted((path / "consumequeue" / topic / str(qid)).iterdir())
        data = b"".join(f.read_bytes() for f in files)
        assert data[: len(units)] == units
        assert not any(data[len(units) :])
    keys = []
    for phys, raw in commitlog_records(path):
        m = record.decode_record(raw, 0, phys=phys)
        keys += [(index_key_hash(m.topic, k), phys) for k in [m.uniq_key, *m.keys]]
    assert sorted(index_entries(path)) == sorted(keys)


@pytest.mark.fixtures
def test_tags_codes_are_the_ones_rocketmq_wrote() -> None:
    """The Java hashCodes this file expects are what RocketMQ 4.9.4 put into its units."""
    fixture = fixture_dir("basic")
    codes = {}
    for line in (fixture / "read.txt").read_text(encoding="utf-8").splitlines():
        if line.startswith("CQ TopicA 0 "):
            index = int(line.split()[3])
            codes[TAGS[(index * 8) % 3]] = int(line.rsplit("tagsCode=", 1)[1])
    assert codes == {tag: KNOWN[tag] for tag in TAGS}


def test_checkpoint_records_the_newest_store_time(tmp_path: Path) -> None:
    path = tmp_path / "store"
    write_sample(path, 300)
    physic, logics, index = struct.unpack(">qqq", (path / "checkpoint").read_bytes()[:24])
    newest = max(
        record.decode_record(raw, 0, phys=p).store_timestamp for p, raw in commitlog_records(path)
    )
    assert physic == logics == index == newest
