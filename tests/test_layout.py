"""A store rocketstore writes must look, file by file, like one RocketMQ 4.9.x writes, so that
RocketMQ's DefaultMessageStore loads it: names, exact sizes, blanks, units and index headers."""

from __future__ import annotations

import itertools
import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
from rawlog import commitlog_records

from pipeline import record
from pipeline.checkpoint import FILE_SIZE
from pipeline.config import StoreConfig
from pipeline.consumequeue import UNIT_DTYPE
from pipeline.indexfile import HEADER
from pipeline.javahash import java_hash
from pipeline.store import MessageStore

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
                        "tags": [("TagA", "TagB", "TagC")[i % 3] for i in idx],
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
            assert int(u["tags_code"]) == java_hash(m.tags or "")
            units_seen += 1
    assert units_seen == 2000
    # Index headers chain: each file starts where the previous ended.
    headers = [HEADER.unpack_from(f.read_bytes(), 0) for f in sorted((path / "index").iterdir())]
    total_entries = sum(h[5] - 1 for h in headers)
    assert total_entries == 2000 * 3  # UNIQ_KEY + two keys each
    for prev, cur in itertools.pairwise(headers):
        assert prev[5] == 300  # full
        assert cur[2] >= prev[3] and cur[0] >= prev[1]


def test_rebuilding_derived_files_reproduces_them(tmp_path: Path) -> None:
    path = tmp_path / "store"
    write_sample(path)
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    shutil.rmtree(copy / "consumequeue")
    shutil.rmtree(copy / "index")
    with MessageStore(copy, CONFIG) as store:
        assert store.recovery.records_redispatched == 2000
    for f in (path / "consumequeue").rglob("*"):
        if f.is_file():
            assert (copy / f.relative_to(path)).read_bytes() == f.read_bytes()
    ours = [f.read_bytes() for f in sorted((copy / "index").iterdir())]
    theirs = [f.read_bytes() for f in sorted((path / "index").iterdir())]
    assert ours == theirs


def test_checkpoint_records_the_newest_store_time(tmp_path: Path) -> None:
    path = tmp_path / "store"
    write_sample(path, 300)
    physic, logics, index = struct.unpack(">qqq", (path / "checkpoint").read_bytes()[:24])
    newest = max(
        record.decode_record(raw, 0, phys=p).store_timestamp for p, raw in commitlog_records(path)
    )
    assert physic == logics == index == newest
