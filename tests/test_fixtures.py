"""The stores Apache RocketMQ 4.9.4 wrote are the ground truth: we must read them exactly as the
real store read them back (their read.txt), and re-encode and re-dispatch them byte for byte."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format import record
from rocketstore.pipeline.layout import INDEX_HEADER, UNIT_DTYPE
from tests.kit.fixtures import FIXTURE_CONFIG, fixture_dir
from tests.kit.rawlog import commitlog_records
from tests.kit.readtxt import expected_lines, render

CLEAN = ["basic", "transactions"]
pytestmark = pytest.mark.fixtures


@pytest.mark.parametrize("name", CLEAN)
def test_read_only_open_reproduces_read_txt(name: str) -> None:
    fixture = fixture_dir(name)
    expected = expected_lines(fixture)
    with MessageStore(fixture / "store", FIXTURE_CONFIG, read_only=True) as store:
        got = render(store, expected)
    assert got == expected


@pytest.mark.parametrize("name", CLEAN)
def test_writable_open_changes_nothing_and_reopens_exactly(name: str, fixture_copy) -> None:
    fixture = fixture_dir(name)
    expected = expected_lines(fixture)
    path = fixture_copy(name)
    before = {p.relative_to(path): p.read_bytes() for p in (path / "commitlog").iterdir()}
    with MessageStore(path, FIXTURE_CONFIG) as store:
        assert store.recovery.bytes_truncated == 0
        assert store.recovery.units_dropped == 0
        assert store.recovery.records_redispatched == 0
        lines = render(store, expected)
    # Closing writes our own checkpoint; everything else must read back as RocketMQ read it.
    assert [ln for ln in lines if not ln.startswith("CHECKPOINT")] == [
        ln for ln in expected if not ln.startswith("CHECKPOINT")
    ]
    after = {p.relative_to(path): p.read_bytes() for p in (path / "commitlog").iterdir()}
    assert after == before
    with MessageStore(path, FIXTURE_CONFIG, read_only=True) as store:
        again = render(store, expected)
    assert [ln for ln in again if not ln.startswith("CHECKPOINT")] == [
        ln for ln in expected if not ln.startswith("CHECKPOINT")
    ]


def test_crashed_store_messages_read_back() -> None:
    """The halted writer's store, read without repair: every queue, unit, message and look-up
    matches. The checkpoint's logics time in read.txt is what RocketMQ's abnormal recovery wrote
    after re-dispatching, so it is compared by the recovery tests, not here."""
    fixture = fixture_dir("crashed")
    expected = expected_lines(fixture)
    with MessageStore(fixture / "store", FIXTURE_CONFIG, read_only=True) as store:
        assert store.abort_file_found
        got = render(store, expected)
    pairs = [(e, g) for e, g in zip(expected, got, strict=True) if not e.startswith("CHECKPOINT")]
    assert [g for _, g in pairs] == [e for e, _ in pairs]


@pytest.mark.parametrize("name", ["basic", "transactions", "crashed"])
def test_reencoding_every_record_gives_the_same_bytes(name: str) -> None:
    store = fixture_dir(name) / "store"
    count = 0
    for phys, raw in commitlog_records(store):
        m = record.decode_record(raw, 0, phys=phys)
        again = record.encode_record(
            topic=m.topic,
            body=m.body,
            properties=m.properties,
            queue_id=m.queue_id,
            queue_offset=m.queue_offset,
            physical_offset=phys,
            born_timestamp=m.born_timestamp,
            store_timestamp=m.store_timestamp,
            born_host=m.born_host,
            store_host=m.store_host,
            sys_flag=m.sys_flag,
            flag=m.flag,
            reconsume_times=m.reconsume_times,
            prepared_transaction_offset=m.prepared_transaction_offset,
        )
        assert again == raw, f"{name}: record at {phys} re-encodes differently"
        count += 1
    assert count == {"basic": 5000, "transactions": 300, "crashed": 3000}[name]


@pytest.mark.parametrize("name", CLEAN)
def test_dispatch_rebuilds_consume_queues_and_index_byte_for_byte(name: str, fixture_copy) -> None:
    """Delete every ConsumeQueue and index file; dispatching the CommitLog again must produce
    RocketMQ's files exactly (index file names are creation times, so contents are compared
    in order)."""
    original = fixture_dir(name) / "store"
    path = fixture_copy(name)
    shutil.rmtree(path / "consumequeue")
    shutil.rmtree(path / "index")
    with MessageStore(path, FIXTURE_CONFIG) as store:
        assert store.recovery.records_redispatched == (5000 if name == "basic" else 300)
    for cq in sorted((original / "consumequeue").rglob("*")):
        if cq.is_file():
            rebuilt = path / cq.relative_to(original)
            assert rebuilt.read_bytes() == cq.read_bytes(), f"{rebuilt} differs"
    ours = sorted((path / "index").iterdir())
    theirs = sorted((original / "index").iterdir())
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert len(a.name) == 17 and a.name.isdigit()
        assert a.read_bytes() == b.read_bytes(), f"index {a.name} differs from {b.name}"


def test_consume_queue_units_point_at_their_records() -> None:
    store = fixture_dir("basic") / "store"
    records = dict(commitlog_records(store))
    for f in (store / "consumequeue").rglob("*"):
        if not f.is_file():
            continue
        units = np.frombuffer(f.read_bytes(), dtype=UNIT_DTYPE)
        topic, qid = f.parent.parent.name, int(f.parent.name)
        for u in units[units["size"] > 0]:
            raw = records[int(u["offset"])]
            assert len(raw) == int(u["size"])
            m = record.decode_record(raw, 0, phys=int(u["offset"]))
            assert (m.topic, m.queue_id) == (topic, qid)


def test_index_headers_are_rocketmq_layout() -> None:
    store = fixture_dir("basic") / "store"
    files = sorted((store / "index").iterdir())
    for f in files:
        assert f.stat().st_size == FIXTURE_CONFIG.index_file_size
        begin_ts, end_ts, begin_phy, end_phy, slots_used, count = INDEX_HEADER.unpack_from(
            f.read_bytes(), 0
        )
        assert begin_ts <= end_ts and begin_phy <= end_phy
        assert 1 <= count <= FIXTURE_CONFIG.max_index_num
        assert 0 < slots_used <= FIXTURE_CONFIG.max_hash_slot_num


def test_crashed_store_recovers_abnormally_to_read_txt(fixture_copy) -> None:
    """Opening the halted writer's store runs abnormal recovery, as RocketMQ did before writing
    read.txt: the zero-filled pre-allocated segment goes, the checkpoint's logics time becomes
    the newest re-dispatched message's, and everything reads back line for line."""
    expected = expected_lines(fixture_dir("crashed"))
    path = fixture_copy("crashed")
    assert (path / "commitlog" / "00000000000002097152").exists()
    with MessageStore(path, FIXTURE_CONFIG) as store:
        report = store.recovery
        assert report.abort_file_found and report.start_source == "checkpoint"
        assert report.commitlog_end == 1402213
        assert report.records_redispatched > 0
        assert render(store, expected) == expected
    assert not (path / "commitlog" / "00000000000002097152").exists()
    assert not (path / "abort").exists()
    # Recovery is idempotent: a second open has nothing to do and reads the same.
    with MessageStore(path, FIXTURE_CONFIG) as store:
        assert store.recovery.bytes_truncated == 0
        assert store.recovery.units_dropped == 0
        lines = render(store, expected)
    reopened = [
        x.replace("abortFileBeforeLoad=true", "abortFileBeforeLoad=false") for x in expected
    ]
    assert [x for x in lines if not x.startswith("CHECKPOINT")] == [
        x for x in reopened if not x.startswith("CHECKPOINT")
    ]
