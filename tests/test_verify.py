"""pipeline/tools/verify/check.py: the full consistency scan.

A clean store (ours, and the stores RocketMQ 4.9.4 wrote) verifies without a problem. Then bytes
are changed at seeded random places of CommitLog records, ConsumeQueue units and IndexFiles, and
the report must name each damaged record at its start and each damaged unit at its position,
with nothing else blamed on the CommitLog when the CommitLog is intact.

The store damaged here (tests/kit/damage.py, which test_corruption.py damages too) is small
but rolls every file type and mixes topics, queues, transactions and the optional fields.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.layout import (
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_SLOT_SIZE,
    UNIT_DTYPE,
)
from rocketstore.pipeline.tools.verify import check as verify_module
from rocketstore.pipeline.tools.verify.check import (
    MAX_PROBLEMS_PER_KIND,
    Problem,
    VerifyReport,
    verify,
)
from tests.kit.damage import (
    CONFIG,
    CROSS_CHECKED,
    MESSAGES,
    SEG,
    STRUCTURAL,
    Built,
    build_store,
    copy_store,
    damage_records,
    flip,
    index_files,
    make_messages,
    middle_records,
    open_ro,
    queue_units,
    read_at,
    record_fields,
    segment_path,
)
from tests.kit.fixtures import FIXTURE_CONFIG, fixture_dir


@pytest.fixture(autouse=True, params=[None, 3], ids=["chunk-default", "chunk-3"])
def chunk_records(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test also runs with the log walked and checked 3 records at a time, so the
    stretches checked one after another meet inside segments, next to damage and blanks."""
    if request.param is not None:
        monkeypatch.setattr(verify_module, "CHUNK_RECORDS", request.param)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_store(tmp_path_factory.mktemp("pristine") / "store")


@pytest.fixture
def built(pristine: Built, tmp_path: Path) -> Built:
    """A fresh copy of the module's store, to damage."""
    return copy_store(pristine, tmp_path / "store")


def run_verify(path: Path, config: StoreConfig = CONFIG) -> VerifyReport:
    with open_ro(path, config) as store:
        return verify(store)


def at(report: VerifyReport, path: Path, offset: int) -> list[Problem]:
    return [p for p in report.problems if p.path == str(path) and p.offset == offset]


# -- clean stores ------------------------------------------------------------------------------


def test_clean_store_verifies_ok(pristine: Built) -> None:
    seen: list[tuple[int, int]] = []
    with open_ro(pristine.path) as store:
        report = verify(store, progress=lambda done, total: seen.append((done, total)))
    assert report.ok, [str(p) for p in report.problems]
    assert report.problems == [] and report.suppressed == 0
    assert report.records == MESSAGES
    assert report.record_bytes == sum(pristine.sizes.values())
    assert report.blanks >= 1  # segments rolled
    assert report.segments == len(list((pristine.path / "commitlog").iterdir()))
    assert report.units == len(pristine.dispatched)
    assert report.index_files > 1 and report.index_entries > MESSAGES
    assert report.damaged_records == 0
    # Progress: byte counts that never go back and end at the total.
    assert seen and all(t == seen[0][1] for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1][0] == seen[-1][1]
    data = report.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["ok"] is True and data["counters"]["records"] == MESSAGES


def test_a_writable_store_verifies_while_open(tmp_path: Path) -> None:
    with MessageStore(tmp_path / "s", CONFIG) as store:
        assert verify(store).ok  # empty
        store.put_batch(make_messages(50, 1))
        report = verify(store)
        assert report.ok, [str(p) for p in report.problems]
        assert report.records == 50


def test_store_without_key_index(tmp_path: Path) -> None:
    config = dataclasses.replace(CONFIG, message_index_enable=False)
    with MessageStore(tmp_path / "s", config) as store:
        store.put_batch(make_messages(120, 2))
    report = run_verify(tmp_path / "s", config)
    assert report.ok and report.index_files == 0 and report.records == 120


@pytest.mark.fixtures
@pytest.mark.parametrize("name", ["basic", "transactions"])
def test_rocketmq_written_stores_verify_clean(name: str) -> None:
    with MessageStore(fixture_dir(name) / "store", FIXTURE_CONFIG, read_only=True) as store:
        report = verify(store)
    assert report.ok, [str(p) for p in report.problems]
    assert report.records == {"basic": 5000, "transactions": 300}[name]
    assert report.units == {"basic": 5000, "transactions": 277}[name]
    assert report.index_entries == 3 * report.records


def test_expired_units_and_entries_are_not_problems(built: Built) -> None:
    """After retention deleted the first CommitLog segment, units and index entries that point
    below the new minimum offset are expired, not dangling."""
    first = built.path / "commitlog" / segment_name(0)
    first.unlink()
    report = run_verify(built.path)
    assert report.ok, [str(p) for p in report.problems]
    assert report.records == len([p for p in built.offsets if p >= SEG])


# -- CommitLog damage --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_damaged_records_are_reported_at_their_start(built: Built, seed: int) -> None:
    rng = random.Random(seed)
    damaged = damage_records(built, rng, rng.randrange(1, 5), STRUCTURAL, middle_records(built))
    report = run_verify(built.path)
    expected = {(str(segment_path(built.path, p)), p) for p in damaged}
    # Exactly the damaged records, each once, and nothing else (units and entries that point at
    # a damaged record are not blamed for it).
    assert sorted((p.path, p.offset) for p in report.problems) == sorted(expected), [
        str(p) for p in report.problems
    ]
    assert all(p.kind.startswith("commitlog-") for p in report.problems)
    assert report.damaged_records == len(damaged)
    assert report.records == MESSAGES - len(damaged)


@pytest.mark.parametrize("seed", range(6))
def test_damaged_header_fields_are_found_by_cross_checks(built: Built, seed: int) -> None:
    """QUEUEID, QUEUEOFFSET and the topic have no checksum: the ConsumeQueue unit that points at
    the record disagrees with it, and the record is blamed because no unit backs what it says."""
    rng = random.Random(100 + seed)
    pool = [p for p in middle_records(built) if p in built.dispatched]
    damaged = damage_records(built, rng, rng.randrange(1, 4), CROSS_CHECKED, pool)
    report = run_verify(built.path)
    for phys in damaged:
        found = at(report, segment_path(built.path, phys), phys)
        assert found, (phys, [str(p) for p in report.problems])
        assert found[0].kind in ("commitlog-record-mismatch", "commitlog-topic")


def test_each_kind_of_structural_damage_has_its_kind(built: Built) -> None:
    recs = middle_records(built)
    a, b, c, d = recs[10], recs[40], recs[80], recs[120]
    seg = segment_path(built.path, a)
    flip(seg, a % SEG + 4, random.Random(1))  # magic
    seg_b = segment_path(built.path, b)
    with open(seg_b, "r+b") as f:  # PHYSICALOFFSET
        f.seek(b % SEG + 28)
        f.write((b + 1).to_bytes(8, "big"))
    seg_c = segment_path(built.path, c)
    with open(seg_c, "r+b") as f:  # BODYCRC
        f.seek(c % SEG + 8)
        crc = int.from_bytes(f.read(4), "big")
        f.seek(c % SEG + 8)
        f.write((crc ^ 1).to_bytes(4, "big"))
    seg_d = segment_path(built.path, d)
    with open(seg_d, "r+b") as f:  # TOTALSIZE one too big: the field lengths no longer add up
        f.seek(d % SEG)
        f.write((built.sizes[d] + 1).to_bytes(4, "big"))
    report = run_verify(built.path)
    kinds = {p.offset: p.kind for p in report.problems}
    assert kinds == {
        a: "commitlog-bad-magic",
        b: "commitlog-physical-offset",
        c: "commitlog-crc",
        d: "commitlog-size",
    }


def test_adjacent_damaged_records_are_each_reported(built: Built) -> None:
    recs = middle_records(built)
    i = next(k for k in range(50, len(recs) - 3) if recs[k + 2] - recs[k] < SEG // 2)
    run = [recs[i], recs[i + 1], recs[i + 2]]
    rng = random.Random(3)
    for phys in run:  # magic and size both gone, then body
        seg = segment_path(built.path, phys)
        for pos in (0, 1, 2, 3, 4, 5, 6, 7):
            flip(seg, phys % SEG + pos, rng)
    report = run_verify(built.path)
    assert sorted(p.offset for p in report.problems) == run, [str(p) for p in report.problems]


def test_a_zeroed_record_is_a_hole(built: Built) -> None:
    phys = middle_records(built)[200]
    seg = segment_path(built.path, phys)
    with open(seg, "r+b") as f:
        f.seek(phys % SEG)
        f.write(bytes(built.sizes[phys]))
    report = run_verify(built.path)
    assert [(p.kind, p.offset) for p in report.problems] == [("commitlog-hole", phys)], [
        str(p) for p in report.problems
    ]


def blank_offsets(path: Path) -> list[int]:
    out = []
    for seg in sorted((path / "commitlog").iterdir()):
        data = seg.read_bytes()
        pos = 0
        while pos + 8 <= len(data):
            size, magic = record.SIZE_MAGIC.unpack_from(data, pos)
            if magic == record.BLANK_MAGIC:
                out.append(int(seg.name) + pos)
                break
            if magic != record.MAGIC:
                break
            pos += size
    return out


def test_damaged_blank_and_garbage_after_it(built: Built) -> None:
    first, second = blank_offsets(built.path)[:2]
    seg = segment_path(built.path, first)
    flip(seg, first % SEG + 5, random.Random(2))  # the blank's magic
    seg2 = segment_path(built.path, second)
    flip(seg2, SEG - 1, random.Random(2))  # the padding after the second blank
    report = run_verify(built.path)
    got = sorted((p.kind, p.path, p.offset) for p in report.problems)
    assert got == [
        ("commitlog-bad-magic", str(seg), first),
        ("commitlog-garbage-after-blank", str(seg2), second + (SEG - 1 - second % SEG)),
    ], [str(p) for p in report.problems]
    assert report.records == MESSAGES  # the walk went on in the next segments


def test_blank_with_wrong_size(built: Built) -> None:
    blank = blank_offsets(built.path)[0]
    seg = segment_path(built.path, blank)
    with open(seg, "r+b") as f:
        f.seek(blank % SEG)
        f.write((SEG - blank % SEG - 1).to_bytes(4, "big"))
    report = run_verify(built.path)
    assert [(p.kind, p.offset) for p in report.problems] == [("commitlog-blank", blank)]


def test_garbage_after_the_end_of_the_log(built: Built) -> None:
    end = built.offsets[-1] + built.sizes[built.offsets[-1]]
    seg = segment_path(built.path, end)
    with open(seg, "r+b") as f:
        f.seek(end % SEG + 100)
        f.write(b"\x01garbage")
    report = run_verify(built.path)
    assert [(p.kind, p.path, p.offset) for p in report.problems] == [
        ("commitlog-garbage-after-end", str(seg), end + 100)
    ]


def test_damaged_last_record_is_reported_at_its_start(built: Built) -> None:
    last = built.offsets[-1]
    rng = random.Random(5)
    damage_records(built, rng, 1, STRUCTURAL, [last])
    report = run_verify(built.path)
    assert [(p.path, p.offset) for p in report.problems] == [
        (str(segment_path(built.path, last)), last)
    ], [str(p) for p in report.problems]


def test_record_without_unit(built: Built) -> None:
    """A unit zeroed in the middle of a queue: a hole in the queue, and the record it pointed at
    has no unit (both reported at that unit's position)."""
    f, pos, _ = next(u for i, u in enumerate(queue_units(built.path)) if i == 30)
    with open(f, "r+b") as fh:
        fh.seek(pos)
        fh.write(bytes(20))
    report = run_verify(built.path)
    assert {(p.kind, p.path, p.offset) for p in report.problems} == {
        ("cq-hole", str(f), pos),
        ("cq-missing-unit", str(f), pos),
    }, [str(p) for p in report.problems]


def test_a_topic_that_is_not_utf8_is_a_damaged_record(built: Built) -> None:
    """The walk reads any topic bytes; verify still rejects a topic that is not UTF-8 and
    goes on at the next record. The record's unit points into the damage: not reported."""
    phys = next(p for p in middle_records(built) if p in built.dispatched)
    seg = segment_path(built.path, phys)
    topic_at = record_fields(read_at(seg, phys % SEG, built.sizes[phys]))["topic"][0]
    with open(seg, "r+b") as f:
        f.seek(phys % SEG + topic_at)
        f.write(b"\xff")
    report = run_verify(built.path)
    assert [(p.kind, p.path, p.offset) for p in report.problems] == [
        ("commitlog-topic", str(seg), phys)
    ], [str(p) for p in report.problems]
    assert report.damaged_records == 1 and report.records == MESSAGES - 1


def test_a_record_torn_after_its_body_is_damaged(built: Built) -> None:
    """Zeros over the end of a record's properties (a write the disk kept only up to there):
    the body CRC matches and the lengths add up, but the NULs give the tear away."""
    phys = next(p for p in middle_records(built) if p in built.dispatched)
    seg = segment_path(built.path, phys)
    props_at = record_fields(read_at(seg, phys % SEG, built.sizes[phys]))["props_length"][1]
    assert built.sizes[phys] - props_at > 5
    with open(seg, "r+b") as f:
        f.seek(phys % SEG + built.sizes[phys] - 5)
        f.write(bytes(5))
    report = run_verify(built.path)
    assert [(p.kind, p.path, p.offset) for p in report.problems] == [
        ("commitlog-torn", str(seg), phys)
    ], [str(p) for p in report.problems]
    assert "NUL byte in the properties" in report.problems[0].detail
    assert report.damaged_records == 1 and report.records == MESSAGES - 1


def test_an_empty_uniq_key_has_no_entry(tmp_path: Path) -> None:
    """A stored UNIQ_KEY with an empty value is dropped when properties are read, so dispatch
    gives it no index entry; verify expects none either."""
    path = tmp_path / "s"
    uniq = "U" * 32
    with MessageStore(path, CONFIG) as store:
        store.put_batch([Message("T", b"x", keys="a b", uniq_key=uniq) for _ in range(5)])
    # Same length: UNIQ_KEY's value emptied, the bytes freed taken by a property "Z".
    stored = b"UNIQ_KEY\x01" + uniq.encode()
    emptied = b"UNIQ_KEY\x01\x02Z\x01" + b"z" * 29
    seg = path / "commitlog" / segment_name(0)
    data = seg.read_bytes()
    assert data.count(stored) == 5
    seg.write_bytes(data.replace(stored, emptied, 2))
    # Without its derived files, opening the store dispatches the log again.
    shutil.rmtree(path / "index")
    shutil.rmtree(path / "consumequeue")
    MessageStore(path, CONFIG).close()
    report = run_verify(path)
    assert report.ok, [str(p) for p in report.problems]
    assert report.index_entries == 5 * 2 + 3  # KEYS "a" and "b" of all, 3 UNIQ_KEYs left


# -- ConsumeQueue damage -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_damaged_units_are_reported_at_their_position(built: Built, seed: int) -> None:
    rng = random.Random(200 + seed)
    units = list(queue_units(built.path))
    chosen = rng.sample(units, rng.randrange(1, 5))
    for f, pos, _ in chosen:
        for k in rng.sample(range(20), rng.randrange(1, 3)):
            flip(f, pos + k, rng)
    report = run_verify(built.path)
    for f, pos, _ in chosen:
        assert at(report, f, pos), (f, pos, [str(p) for p in report.problems])
    # The CommitLog is intact: nothing may be blamed on it.
    assert not [p for p in report.problems if p.kind.startswith("commitlog-")], [
        str(p) for p in report.problems
    ]


def test_unit_pointing_at_another_queues_record(built: Built) -> None:
    units = list(queue_units(built.path))
    f, pos, _ = units[5]
    other = next(u for u in units if u[0].parent != f.parent)
    with open(f, "r+b") as fh:
        fh.seek(pos)
        fh.write(other[2].to_bytes(8, "big"))
    report = run_verify(built.path)
    kinds = {(p.kind, p.path, p.offset) for p in report.problems}
    assert ("cq-unit-wrong-queue", str(f), pos) in kinds
    assert not [p for p in report.problems if p.kind.startswith("commitlog-")]


def test_swapped_units_are_blamed_not_their_records(built: Built) -> None:
    f, pos, _ = next(u for i, u in enumerate(queue_units(built.path)) if i == 20)
    with open(f, "r+b") as fh:
        fh.seek(pos)
        a, b = fh.read(20), fh.read(20)
        fh.seek(pos)
        fh.write(b + a)
    report = run_verify(built.path)
    assert sorted((p.kind, p.path, p.offset) for p in report.problems) == [
        ("cq-unit-wrong-queue", str(f), pos),
        ("cq-unit-wrong-queue", str(f), pos + 20),
    ], [str(p) for p in report.problems]


def test_unit_size_and_tags_code(built: Built) -> None:
    units = list(queue_units(built.path))
    (f1, p1, _), (f2, p2, _) = units[3], units[60]
    with open(f1, "r+b") as fh:
        fh.seek(p1 + 8)
        size = int.from_bytes(fh.read(4), "big")
        fh.seek(p1 + 8)
        fh.write((size + 1).to_bytes(4, "big"))
    with open(f2, "r+b") as fh:
        fh.seek(p2 + 12)
        fh.write((12345).to_bytes(8, "big"))
    report = run_verify(built.path)
    assert {(p.kind, p.path, p.offset) for p in report.problems} == {
        ("cq-unit-size-mismatch", str(f1), p1),
        ("cq-unit-tags-code", str(f2), p2),
    }


def test_garbage_after_the_end_of_a_queue(built: Built) -> None:
    f = max(
        (p for p in (built.path / "consumequeue").rglob("*") if p.is_file()),
        key=lambda p: (p.parent, p.name),
    )
    units = np.fromfile(f, dtype=UNIT_DTYPE)
    end = int(np.flatnonzero(units["size"] > 0)[-1]) + 1
    if end >= len(units):
        pytest.skip("the last file of this queue is full")
    with open(f, "r+b") as fh:
        fh.seek(end * 20 + 13)
        fh.write(b"\x05")
    report = run_verify(built.path)
    assert [(p.kind, p.path, p.offset) for p in report.problems] == [
        ("cq-garbage-after-end", str(f), end * 20)
    ]


# -- IndexFile damage --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_damaged_index_files_are_reported(built: Built, seed: int) -> None:
    """Every byte of an index file is checked, but for entry 1's timeDiff."""
    rng = random.Random(300 + seed)
    files = index_files(built.path)
    size = (
        INDEX_HEADER_SIZE
        + INDEX_SLOT_SIZE * CONFIG.max_hash_slot_num
        + INDEX_ENTRY_SIZE * CONFIG.max_index_num
    )
    entry1_time = (
        INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * CONFIG.max_hash_slot_num + INDEX_ENTRY_SIZE + 12
    )
    # Entry 1's timeDiff has nothing to compare against (RocketMQ computes it from the previous
    # file's end time, which retention may have deleted): only its sign is checked.
    positions = [p for p in range(size) if not entry1_time <= p < entry1_time + 4]
    chosen = rng.sample(files, rng.randrange(1, 3))
    for f in chosen:
        for pos in rng.sample(positions, rng.randrange(1, 4)):
            flip(f, pos, rng)
    report = run_verify(built.path)
    for f in chosen:
        assert [p for p in report.problems if p.path == str(f)], (f, report.problems)
    assert not [p for p in report.problems if p.kind.startswith(("commitlog-", "cq-"))]


def test_index_entry_faults_are_reported_at_the_entry(built: Built) -> None:
    f = index_files(built.path)[0]
    entries_at = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * CONFIG.max_hash_slot_num
    e7, e9, e11 = (entries_at + INDEX_ENTRY_SIZE * n for n in (7, 9, 11))
    with open(f, "r+b") as fh:
        fh.seek(e7)  # keyHash
        kh = int.from_bytes(fh.read(4), "big")
        fh.seek(e7)
        fh.write(((kh + CONFIG.max_hash_slot_num) % 2**31).to_bytes(4, "big"))
        fh.seek(e9 + 4)  # phyOffset into the middle of a record
        phy = int.from_bytes(fh.read(8), "big")
        fh.seek(e9 + 4)
        fh.write((phy + 3).to_bytes(8, "big"))
        fh.seek(e11 + 12)  # timeDiff
        td = int.from_bytes(fh.read(4), "big")
        fh.seek(e11 + 12)
        fh.write((td + 5).to_bytes(4, "big"))
    report = run_verify(built.path)
    got = {(p.kind, p.offset) for p in report.problems if p.kind != "index-missing-entry"}
    assert got == {
        ("index-entry-hash", e7),
        ("index-entry-points-nowhere", e9),
        ("index-entry-time", e11),
    }, [str(p) for p in report.problems]
    # The keys those two entries stood for are now missing from the index.
    missing = [p for p in report.problems if p.kind == "index-missing-entry"]
    assert len(missing) == 2
    assert all(p.path == str(f) and INDEX_HEADER_SIZE <= p.offset < entries_at for p in missing)


def test_a_zeroed_index_file_is_not_full(built: Built) -> None:
    """Only the newest index file may be partly filled: a zeroed older one is reported."""
    f = index_files(built.path)[1]
    f.write_bytes(bytes(f.stat().st_size))
    report = run_verify(built.path)
    assert ("index-header", str(f), 36) in {(p.kind, p.path, p.offset) for p in report.problems}


def test_index_chain_faults(built: Built) -> None:
    f = index_files(built.path)[0]
    slots_at = INDEX_HEADER_SIZE
    entries_at = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * CONFIG.max_hash_slot_num
    with MessageStore(built.path, CONFIG, read_only=True) as store:
        assert store.index is not None
        entries = store.index.files[0].entries()
        slots = store.index.files[0].slots()
    # An entry whose prevIndex points up, and a slot head beyond indexCount.
    n = next(k for k in range(2, len(entries) + 1) if entries[k - 1]["prev_index"] > 0)
    empty_slot = int(np.flatnonzero(slots == 0)[0]) if (slots == 0).any() else None
    with open(f, "r+b") as fh:
        fh.seek(entries_at + INDEX_ENTRY_SIZE * n + 16)
        fh.write((n + 1).to_bytes(4, "big"))
        if empty_slot is not None:
            fh.seek(slots_at + INDEX_SLOT_SIZE * empty_slot)
            fh.write((10_000).to_bytes(4, "big"))
    report = run_verify(built.path)
    got = {(p.kind, p.offset) for p in report.problems}
    assert ("index-chain", entries_at + INDEX_ENTRY_SIZE * n) in got
    if empty_slot is not None:
        assert ("index-slot", slots_at + INDEX_SLOT_SIZE * empty_slot) in got
        assert ("index-header", 32) in got  # hashSlotCount no longer matches the used slots


def test_a_damaged_begin_timestamp_is_reported_once(built: Built) -> None:
    """Every entry's timeDiff is relative to beginTimestamp: when it is wrong, the header is
    reported and the entries are not."""
    f = index_files(built.path)[0]
    with open(f, "r+b") as fh:
        fh.write((12345).to_bytes(8, "big"))
    report = run_verify(built.path)
    assert [(p.kind, p.offset) for p in report.problems] == [("index-header", 0)]


def test_problems_are_capped_per_kind_and_file(built: Built) -> None:
    f = index_files(built.path)[0]
    entries_at = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * CONFIG.max_hash_slot_num
    data = bytearray(f.read_bytes())
    count = int.from_bytes(data[36:40], "big")
    for n in range(2, count):
        pos = entries_at + INDEX_ENTRY_SIZE * n + 12
        td = int.from_bytes(data[pos : pos + 4], "big")
        data[pos : pos + 4] = (td + 7).to_bytes(4, "big")
    f.write_bytes(bytes(data))
    report = run_verify(built.path)
    assert {p.kind for p in report.problems} == {"index-entry-time"}
    assert len(report.problems) == MAX_PROBLEMS_PER_KIND
    assert report.suppressed == count - 2 - MAX_PROBLEMS_PER_KIND
    assert not report.ok
    assert report.to_json()["problemsSuppressed"] == report.suppressed
    with open_ro(built.path) as store:
        everything = verify(store, max_per_kind=None)
    assert len(everything.problems) == count - 2 and everything.suppressed == 0


def test_verify_command_exit_status_and_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rocketstore.pipeline.cli import main

    built = tmp_path / "store"
    with MessageStore(built, CONFIG) as store:
        store.put_batch([Message("TopicA", b"payload-%d" % i, keys=[f"k{i}"]) for i in range(50)])
        first = store.queue_infos("TopicA")[0]
        phys = int(store.read_units("TopicA", first.queue_id, 0, 1)[0]["offset"])
    conf = tmp_path / "store.toml"
    conf.write_text(
        f"mappedFileSizeCommitLog = {CONFIG.mapped_file_size_commitlog}\n"
        f"mappedFileSizeConsumeQueue = {CONFIG.mapped_file_size_consume_queue}\n"
        f"maxHashSlotNum = {CONFIG.max_hash_slot_num}\nmaxIndexNum = {CONFIG.max_index_num}\n"
    )
    assert main(["verify", str(built), "--config", str(conf)]) == 0
    assert capsys.readouterr().out.startswith("ok: 50 records")
    seg = built / "commitlog" / f"{0:020d}"
    raw = bytearray(seg.read_bytes())
    raw[phys + 90] ^= 0xFF  # a body byte: the CRC no longer matches
    seg.write_bytes(bytes(raw))
    assert main(["verify", str(built), "--config", str(conf), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(p["kind"], p["offset"]) for p in report["problems"]] == [("commitlog-crc", phys)]


def test_every_problem_kind_is_documented_for_operators() -> None:
    """The kinds are stable strings that ``verify --json`` gives: each one the scan can report
    is listed in docs/operations.md (the local files) or docs/cli.md (the tier's objects)."""
    root = Path(__file__).resolve().parent.parent
    source = "".join(p.read_text() for p in (root / "pipeline/tools/verify").glob("*.py"))
    kinds = set(re.findall(r'"((?:commitlog|cq|index|tier)-[a-z0-9-]+)"', source))
    assert len(kinds) >= 30, sorted(kinds)  # the pattern still finds them
    docs = (root / "docs/operations.md").read_text() + (root / "docs/cli.md").read_text()
    assert sorted(k for k in kinds if f"`{k}`" not in docs) == []
