"""Recovery on open after simulated crashes: torn tails, partial dispatch, stale or damaged
progress files, pre-allocated segments; idempotence; index truncation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.indexfile import IndexFile
from rocketstore.pipeline.files.progress import FILE_NAME
from rocketstore.pipeline.format import record
from rocketstore.pipeline.layout import UNIT_DTYPE
from rocketstore.pipeline.tools.verify.check import verify

CONFIG = StoreConfig(
    mapped_file_size_commitlog=64 * 1024,
    mapped_file_size_consume_queue=20 * 50,
    max_hash_slot_num=101,
    max_index_num=300,
)


def batch(start: int, n: int) -> pa.Table:
    idx = range(start, start + n)
    return pa.table(
        {
            "topic": ["T"] * n,
            "body": [f"body-{i}".encode() * (1 + i % 5) for i in idx],
            "queueId": pa.array([i % 3 for i in idx], pa.int32()),
            "keys": [f"k{i}" for i in idx],
            "tags": [("A", "B")[i % 2] for i in idx],
        }
    )


def write(path: Path, n: int, per_batch: int = 50) -> list[int]:
    offsets: list[int] = []
    with MessageStore(path, CONFIG) as store:
        for s in range(0, n, per_batch):
            offsets += store.put_batch(batch(s, min(per_batch, n - s))).commit_log_offsets.tolist()
    return offsets


def crash(path: Path) -> None:
    """What a kill -9 leaves: the abort file."""
    (path / "abort").touch()


def stored_messages(store: MessageStore) -> list[tuple[str, int, int, bytes]]:
    """Every message the store reads, queue by queue: (topic, queue, queue offset, body)."""
    out = []
    for q in store.queue_infos():
        got = store.get_messages(q.topic, q.queue_id, q.min_offset, q.max_offset)
        out += [(m.topic, m.queue_id, m.queue_offset, m.body) for m in got.messages]
    return out


@pytest.mark.parametrize("damage", ["body", "tail"])
def test_torn_last_record_is_cut_exactly(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "s"
    offsets = write(path, 400)
    with MessageStore(path, CONFIG, read_only=True) as store:
        before = stored_messages(store)
        last = store.get_message(offsets[-1])
        end = store.max_phy_offset
    crash(path)
    seg = (
        path
        / "commitlog"
        / f"{(offsets[-1] // CONFIG.mapped_file_size_commitlog) * CONFIG.mapped_file_size_commitlog:020d}"
    )
    data = bytearray(seg.read_bytes())
    rel = offsets[-1] % CONFIG.mapped_file_size_commitlog
    if damage == "body":
        data[rel + 88] ^= 0xFF  # the first body byte (IPv4 hosts): a torn write the CRC catches
    else:
        # The disk kept the record only up to 8 bytes before its end: the CRC still matches,
        # the zeros in its properties give the tear away.
        data[rel + last.store_size - 8 : rel + last.store_size] = bytes(8)
    seg.write_bytes(bytes(data))
    (path / "config" / FILE_NAME).unlink()  # force RocketMQ's rule: scan from the checkpoint
    with MessageStore(path, CONFIG) as store:
        r = store.recovery
        assert r.start_source == "checkpoint"
        assert r.commitlog_end == offsets[-1] < end
        assert r.bytes_truncated > 0
        assert stored_messages(store) == [
            x for x in before if x[3] != last.body or x[2] != last.queue_offset
        ]
        # The lost message's queue offset is given to the next put.
        again = store.put_batch(batch(399, 1))
        assert int(again.queue_offsets[0]) == last.queue_offset
        assert int(again.commit_log_offsets[0]) == offsets[-1]


def test_partial_dispatch_is_completed_and_recovery_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "s"
    write(path, 300)
    with MessageStore(path, CONFIG, read_only=True) as store:
        before = stored_messages(store)
    # A crash between two queues' units: queue 1 lost its last 7 units, queue 0 kept all.
    qdir = path / "consumequeue" / "T" / "1"
    files = sorted(qdir.iterdir())
    units = np.concatenate([np.frombuffer(f.read_bytes(), dtype=UNIT_DTYPE) for f in files])
    count = int(np.count_nonzero(units["size"] > 0))
    per_file = CONFIG.mapped_file_size_consume_queue // 20
    for i in range(count - 7, count):
        f = files[i // per_file]
        raw = bytearray(f.read_bytes())
        raw[(i % per_file) * 20 : (i % per_file) * 20 + 20] = bytes(20)
        f.write_bytes(bytes(raw))
    crash(path)
    # The crash came before the flush that would have recorded this batch as dispatched.
    (path / "config" / FILE_NAME).unlink()
    with MessageStore(path, CONFIG) as store:
        assert store.recovery.records_redispatched > 0
        assert stored_messages(store) == before
    with MessageStore(path, CONFIG) as store:
        r = store.recovery
        assert (r.bytes_truncated, r.units_dropped, r.records_redispatched) == (0, 0, 0)
        assert stored_messages(store) == before


def test_damaged_progress_file_falls_back_to_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "s"
    write(path, 200)
    progress = path / "config" / FILE_NAME
    data = json.loads(progress.read_text())
    data["flushedOffset"] += 1  # no longer matches its checksum
    progress.write_text(json.dumps(data))
    crash(path)
    with MessageStore(path, CONFIG) as store:
        assert store.recovery.start_source == "checkpoint"
        assert len(stored_messages(store)) == 200


def test_notes_are_kept_by_the_flush_after_them(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with MessageStore(path, CONFIG, create=True) as store:
        store.put_batch(batch(0, 10))
        store.flush()
        store.set_note("sink.ab", [3, 270, 0])
        assert "notes" not in json.loads((path / "config" / FILE_NAME).read_text())
        store.put_batch(batch(10, 10))
        store.flush()
        data = json.loads((path / "config" / FILE_NAME).read_text())
        assert data["notes"] == {"sink.ab": [3, 270, 0]}
    with MessageStore(path, CONFIG) as store:
        assert store.note("sink.ab") == [3, 270, 0]
        assert store.note("sink.cd") is None
        for i in range(MessageStore.MAX_NOTES + 1):
            store.set_note(f"n{i}", [i])
        # 66 names set, 64 kept: the two set least recently went
        assert store.note("sink.ab") is None and store.note("n0") is None
        assert store.note("n1") == [1] and store.note(f"n{MessageStore.MAX_NOTES}") == [64]


def test_a_damaged_note_voids_the_progress_file(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with MessageStore(path, CONFIG, create=True) as store:
        store.set_note("sink.ab", [3, 270, 0])
        store.put_batch(batch(0, 200))
    progress = path / "config" / FILE_NAME
    data = json.loads(progress.read_text())
    data["notes"]["sink.ab"][1] = 0  # a bound moved by hand no longer matches the checksum
    progress.write_text(json.dumps(data))
    crash(path)
    with MessageStore(path, CONFIG) as store:
        assert store.recovery.start_source == "checkpoint"
        assert store.note("sink.ab") is None
        assert len(stored_messages(store)) == 200


def test_progress_pointing_past_the_log_is_not_trusted(tmp_path: Path, fixture_copy=None) -> None:
    path = tmp_path / "s"
    write(path, 200)
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    with MessageStore(copy, CONFIG) as store:  # the copy goes on and records a later progress
        store.put_batch(batch(200, 100))
    shutil.copy(copy / "config" / FILE_NAME, path / "config" / FILE_NAME)
    crash(path)
    with MessageStore(path, CONFIG) as store:
        assert store.recovery.start_source == "checkpoint"
        assert len(stored_messages(store)) == 200


def test_zero_filled_preallocated_segment_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "s"
    write(path, 200)
    segs = sorted((path / "commitlog").iterdir())
    nxt = path / "commitlog" / f"{int(segs[-1].name) + CONFIG.mapped_file_size_commitlog:020d}"
    nxt.write_bytes(bytes(CONFIG.mapped_file_size_commitlog))
    crash(path)
    with MessageStore(path, CONFIG) as store:
        assert store.recovery.bytes_truncated >= CONFIG.mapped_file_size_commitlog
        assert len(stored_messages(store)) == 200
    assert not nxt.exists()


@pytest.mark.parametrize("keep", [1, 2, 57, 120, 199])
def test_index_truncation_equals_a_file_built_without_the_dropped_entries(
    tmp_path: Path, keep: int
) -> None:
    rng = np.random.default_rng(keep)
    n = 200
    hashes = rng.integers(0, 2**31 - 1, n).astype(np.int32)
    hashes[::7] = hashes[0]  # long chains in one slot
    phys = np.arange(n, dtype=np.int64) * 100
    times = 1_700_000_000_000 + np.arange(n, dtype=np.int64) * 333
    a = IndexFile(tmp_path / "a", 13, 300, read_only=False, create=True)
    b = IndexFile(tmp_path / "b", 13, 300, read_only=False, create=True)
    a.put(hashes, phys, times)
    b.put(hashes[:keep], phys[:keep], times[:keep])
    a.truncate_from(int(phys[keep]), lambda p: int(times[p // 100]))
    a.flush()
    b.flush()
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    a.close()
    b.close()


def test_read_only_open_of_a_crashed_store_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s"
    offsets = write(path, 100)
    crash(path)
    files = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    with MessageStore(path, CONFIG, read_only=True) as store:
        assert store.recovery.abort_file_found
        assert store.get_message(offsets[-1]).body.startswith(b"body-99")
    assert {p: p.read_bytes() for p in path.rglob("*") if p.is_file()} == files
    assert record.MAGIC  # the module is used for offsets above


def test_damaged_consume_queue_is_rebuilt_by_a_full_check(tmp_path: Path) -> None:
    """A clean close vouches for the queues, so a normal open checks only their last units
    and costs the same whatever the store's size; ``full_check`` (``rocketstore recover``)
    checks every unit and rebuilds a queue damaged at rest."""
    path = tmp_path / "s"
    write(path, 300)
    with MessageStore(path, CONFIG, read_only=True) as store:
        before = stored_messages(store)
    f = sorted((path / "consumequeue" / "T" / "2").iterdir())[0]
    raw = bytearray(f.read_bytes())
    raw[20 * 3 : 20 * 3 + 8] = (12345).to_bytes(8, "big")  # unit 3 points into the middle
    f.write_bytes(bytes(raw))
    with MessageStore(path, CONFIG) as store:
        assert store.recovery.queues_rebuilt == []
    with MessageStore(path, CONFIG, full_check=True) as store:
        assert store.recovery.queues_rebuilt == ["T/2"]
        assert not store.recovery.index_rebuilt
        assert stored_messages(store) == before


def test_missing_or_damaged_index_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "s"
    offsets = write(path, 300)
    original = [p.read_bytes() for p in sorted((path / "index").iterdir())]
    last = sorted((path / "index").iterdir())[-1]
    raw = bytearray(last.read_bytes())
    raw[24:32] = (offsets[-1] + 1).to_bytes(8, "big")  # endPhyOffset no longer a record start
    last.write_bytes(bytes(raw))
    with MessageStore(path, CONFIG) as store:
        assert store.recovery.index_rebuilt
        assert [m.commit_log_offset for m in store.query_by_key("T", "k7")] == [offsets[7]]
    assert [p.read_bytes() for p in sorted((path / "index").iterdir())] == original


def test_deleted_consume_queue_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "s"
    write(path, 300)
    with MessageStore(path, CONFIG, read_only=True) as store:
        before = stored_messages(store)
    shutil.rmtree(path / "consumequeue" / "T" / "1")
    with MessageStore(path, CONFIG) as store:
        assert store.recovery.queues_rebuilt == ["T/1"]
        assert stored_messages(store) == before


def test_recover_command_reports_and_is_idempotent(tmp_path: Path, capsys) -> None:
    from rocketstore.pipeline.cli import main

    path = tmp_path / "s"
    write(path, 120)
    conf = tmp_path / "store.toml"
    conf.write_text(
        "mappedFileSizeCommitLog = 65536\nmappedFileSizeConsumeQueue = 1000\n"
        "maxHashSlotNum = 101\nmaxIndexNum = 300\n"
    )
    nxt = path / "commitlog" / f"{65536:020d}"
    nxt.write_bytes(bytes(65536))
    crash(path)
    assert main(["recover", str(path), "--config", str(conf), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["abortFileFound"] is True and first["bytesTruncated"] >= 65536
    assert main(["recover", str(path), "--config", str(conf), "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["abortFileFound"] is False
    assert (second["bytesTruncated"], second["unitsDropped"], second["recordsRedispatched"]) == (
        0,
        0,
        0,
    )
    assert main(["recover", str(tmp_path / "absent"), "--config", str(conf)]) == 2


def test_slots_naming_uncounted_entries_are_mended_after_a_crash(tmp_path: Path) -> None:
    """A crash between writing index entries and slots and writing the header that counts
    them (a process killed, or one that died of SIGBUS, mid-put) leaves slots naming entries
    past the count. Recovery must point them back at counted entries: otherwise the next
    entry put in such a slot names itself as ``prevIndex`` and verify reports it."""
    path = tmp_path / "s"
    write(path, 100)
    (index_path,) = sorted((path / "index").iterdir())
    header = index_path.read_bytes()[:40]
    progress = (path / "config" / FILE_NAME).read_bytes()
    with MessageStore(path, CONFIG) as store:
        store.put_batch(batch(100, 20))
    raw = bytearray(index_path.read_bytes())
    raw[:40] = header  # the header as it was before the last put's entries
    index_path.write_bytes(bytes(raw))
    # The last flush the crash let through was the one before that put.
    (path / "config" / FILE_NAME).write_bytes(progress)
    crash(path)
    with MessageStore(path, CONFIG) as store:
        assert store.recovery.index_slots_repaired > 0
        report = verify(store, max_per_kind=None)
        assert report.ok, [str(p) for p in report.problems]
        for i in range(120):
            found = store.query_by_key("T", f"k{i}")
            assert [m.body for m in found] == [f"body-{i}".encode() * (1 + i % 5)], i
        store.put_batch(batch(120, 20))
    with MessageStore(path, CONFIG) as store:
        report = verify(store, max_per_kind=None)
        assert report.ok, [str(p) for p in report.problems]
        assert [m.body for m in store.query_by_key("T", "k131")] == [b"body-131" * 2]
