"""Reading a damaged store through the store API: a damaged record is never returned.

Bytes are changed at seeded random places (the store of test_verify.py, copied per test), the
store is opened read-only, and every read is compared with what the intact store returned:

* ``get_message`` of a damaged record raises :class:`CorruptRecordError` naming its segment file
  and its offset; every other record reads back exactly as before.
* ``get_messages`` raises when its range holds a damaged record, and reading on from the next
  queue offset works: the messages before and after the damage all remain readable.
* ``query_by_key`` raises for a damaged record's key and finds every other message.
* Damaged ConsumeQueue units and IndexFile entries never make a read return a message that was
  not stored (a read may raise, or miss a message whose unit or entry is gone).
* ``verify`` blames exactly the records whose reads fail.

Only damage the store can detect is drawn for the CommitLog: RocketMQ 4.x checksums the body
alone, so a changed FLAG, timestamp, host or user property reads back changed, here as in
RocketMQ (see pipeline/tools/verify/check.py). Zeros in the topic or properties, as a write torn after the
body leaves, are the exception: no whole record has a NUL there.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import CorruptRecordError, OffsetOutOfRangeError
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.record import MessageExt
from rocketstore.pipeline.layout import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit.damage import (
    CONFIG,
    CROSS_CHECKED,
    STRUCTURAL,
    TOPICS,
    Built,
    build_store,
    copy_store,
    damage_records,
    flip,
    index_files,
    middle_records,
    open_ro,
    queue_units,
    segment_path,
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_store(tmp_path_factory.mktemp("pristine") / "store")


@pytest.fixture
def built(pristine: Built, tmp_path: Path) -> Built:
    """A fresh copy of the module's store, to damage."""
    return copy_store(pristine, tmp_path / "store")


@pytest.fixture(scope="module")
def reference(pristine: Built) -> dict[int, MessageExt]:
    """Every record as the intact store reads it, by CommitLog offset."""
    with open_ro(pristine.path) as store:
        out = {p: store.get_message(p) for p in pristine.offsets}
    for phys, m in out.items():
        put = pristine.messages[phys]
        assert (m.topic, m.body, m.queue_id, m.tags) == (
            put.topic,
            put.body,
            put.queue_id,
            put.tags,
        )
    return out


@pytest.fixture(scope="module")
def queue_contents(pristine: Built) -> dict[tuple[str, int], list[int]]:
    """CommitLog offsets of each queue's units, in queue order."""
    with open_ro(pristine.path) as store:
        return {
            key: store.read_units(*key, 0, cq.max_offset)["offset"].tolist()
            for key, cq in store.queues.items()
        }


def shared_keys() -> list[tuple[str, str]]:
    """The KEYS tokens many messages share (``grp-<i % 7>``), with each topic."""
    return [(t, f"grp-{g}") for t in TOPICS for g in range(7)]


def read_queue(
    store: MessageStore,
    topic: str,
    qid: int,
    reference: dict[int, MessageExt],
    rng: random.Random,
    *,
    strict: bool,
) -> tuple[list[MessageExt], list[CorruptRecordError | OffsetOutOfRangeError]]:
    """Pull a whole queue in random-size steps, stepping over a unit whose read fails.

    Every message returned must be one the intact store holds; with ``strict``, it must also be
    the unit's own message (topic, queue id and queue offset)."""
    got: list[MessageExt] = []
    errors: list[CorruptRecordError | OffsetOutOfRangeError] = []
    lo, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
    units = store.read_units(topic, qid, lo, hi - lo)
    offset = lo
    bad_at = -1  # queue offset of the unit whose read failed last
    while offset < hi:
        # Right after a failure, read exactly up to the failing unit, then step over it.
        count = bad_at - offset if bad_at > offset else rng.randrange(1, 40)
        if bad_at == offset:
            offset, bad_at = offset + 1, -1
            continue
        try:
            result = store.get_messages(topic, qid, offset, count)
        except (CorruptRecordError, OffsetOutOfRangeError) as exc:
            errors.append(exc)
            window = units["offset"][offset - lo : offset - lo + count].tolist()
            if isinstance(exc, CorruptRecordError) and "consumequeue" in exc.path:
                # A unit pointing where no record starts is blamed on the unit: its file and
                # its byte position there.
                queue_offset = (int(Path(exc.path).name) + exc.offset) // 20
                assert offset <= queue_offset < offset + count, (exc, offset, count)
                bad_at = queue_offset
            elif isinstance(exc, CorruptRecordError):
                assert exc.offset in window, (exc, offset, count)
                bad_at = offset + window.index(exc.offset)
            else:
                bounds = store.min_phy_offset, store.max_phy_offset
                bad_at = offset + next(
                    i for i, u in enumerate(window) if not bounds[0] <= u < bounds[1]
                )
            continue
        for k, m in enumerate(result.messages):
            assert m == reference[m.commit_log_offset]
            if strict:
                assert (m.topic, m.queue_id, m.queue_offset) == (topic, qid, offset + k)
        got.extend(result.messages)
        assert result.next_begin_offset > offset
        offset = result.next_begin_offset
    return got, errors


@pytest.mark.parametrize("seed", range(6))
def test_damaged_records_raise_and_everything_else_reads(
    built: Built,
    reference: dict[int, MessageExt],
    queue_contents: dict[tuple[str, int], list[int]],
    seed: int,
) -> None:
    rng = random.Random(seed)
    damaged = set(
        damage_records(built, rng, rng.randrange(1, 5), STRUCTURAL, middle_records(built))
    )
    with open_ro(built.path) as store:
        # By offset.
        for phys in built.offsets:
            if phys in damaged:
                with pytest.raises(CorruptRecordError) as info:
                    store.get_message(phys)
                assert info.value.path == str(segment_path(built.path, phys))
                assert info.value.offset == phys
            else:
                assert store.get_message(phys) == reference[phys]
        # By queue: everything but the damaged records, each where it belongs.
        for (topic, qid), offsets in queue_contents.items():
            got, errors = read_queue(store, topic, qid, reference, rng, strict=True)
            assert [m.commit_log_offset for m in got] == [p for p in offsets if p not in damaged]
            assert sorted(e.offset for e in errors) == sorted(p for p in offsets if p in damaged)
            assert all(isinstance(e, CorruptRecordError) for e in errors)
        # By key: each damaged record's own key raises; a sample of the others finds its
        # message; the keys every seventh message shares find only intact messages.
        sample = set(rng.sample(sorted(reference), 120)) | damaged
        for phys in sorted(sample):
            m = reference[phys]
            if phys in damaged:
                with pytest.raises(CorruptRecordError) as info:
                    store.query_by_key(m.topic, m.keys[0])
                assert info.value.offset == phys
                continue
            rollback = record.transaction_type(m.sys_flag) == record.TRANSACTION_ROLLBACK_TYPE
            assert store.query_by_key(m.topic, m.keys[0]) == ([] if rollback else [m])
        for topic, key in shared_keys():
            try:
                shared = store.query_by_key(topic, key)
            except CorruptRecordError as exc:
                assert exc.offset in damaged
            else:
                assert shared
                assert all(x == reference[x.commit_log_offset] for x in shared)
                assert all(x.topic == topic and key in x.keys for x in shared)
        # And verify blames exactly the records that cannot be read.
        report = verify(store)
    assert {p.offset for p in report.problems} == damaged


def test_a_record_torn_after_its_body_is_never_returned(
    built: Built,
    reference: dict[int, MessageExt],
    queue_contents: dict[tuple[str, int], list[int]],
) -> None:
    """Zeros over the last bytes of a record's properties, as a write torn there leaves: its
    body CRC still matches, yet every read refuses it, by offset, by queue and by key, and
    reads everything else as before."""
    phys = next(p for p in middle_records(built) if p in built.dispatched)
    seg = segment_path(built.path, phys)
    with open(seg, "r+b") as f:
        f.seek(phys % CONFIG.mapped_file_size_commitlog + built.sizes[phys] - 6)
        f.write(bytes(6))
    m = reference[phys]
    with open_ro(built.path) as store:
        with pytest.raises(CorruptRecordError, match="NUL byte in the properties") as info:
            store.get_message(phys)
        assert (info.value.path, info.value.offset) == (str(seg), phys)
        for other in built.offsets:
            if other != phys:
                assert store.get_message(other) == reference[other]
        got, errors = read_queue(
            store, m.topic, m.queue_id, reference, random.Random(2), strict=True
        )
        offsets = queue_contents[(m.topic, m.queue_id)]
        assert [x.commit_log_offset for x in got] == [p for p in offsets if p != phys]
        assert [e.offset for e in errors] == [phys]
        with pytest.raises(CorruptRecordError):
            store.query_by_key(m.topic, m.keys[0])
        report = verify(store)
    assert [(p.kind, p.offset) for p in report.problems] == [("commitlog-torn", phys)]


def test_damaged_last_record_is_not_returned(
    built: Built, reference: dict[int, MessageExt]
) -> None:
    """Damage to the newest record looks like a torn write: recovery ends the log before it,
    so reading it is out of range (or corrupt), never garbage."""
    last = built.offsets[-1]
    damage_records(built, random.Random(9), 1, STRUCTURAL, [last])
    with open_ro(built.path) as store:
        with pytest.raises((CorruptRecordError, OffsetOutOfRangeError)):
            store.get_message(last)
        for phys in built.offsets[:-1]:
            assert store.get_message(phys) == reference[phys]


@pytest.mark.parametrize("seed", range(6))
def test_damaged_units_never_return_foreign_data(
    built: Built, reference: dict[int, MessageExt], seed: int
) -> None:
    rng = random.Random(400 + seed)
    units = list(queue_units(built.path))
    chosen = rng.sample(units, rng.randrange(1, 5))
    for f, pos, _ in chosen:
        for k in rng.sample(range(20), rng.randrange(1, 3)):
            flip(f, pos + k, rng)
    with open_ro(built.path) as store:
        for topic, qid in sorted(store.queues):
            read_queue(store, topic, qid, reference, rng, strict=False)
        for phys in built.offsets:
            assert store.get_message(phys) == reference[phys]


@pytest.mark.parametrize("seed", range(6))
def test_damaged_index_never_returns_wrong_messages(
    built: Built, reference: dict[int, MessageExt], seed: int
) -> None:
    rng = random.Random(500 + seed)
    size = (
        INDEX_HEADER_SIZE
        + INDEX_SLOT_SIZE * CONFIG.max_hash_slot_num
        + INDEX_ENTRY_SIZE * CONFIG.max_index_num
    )
    for f in rng.sample(index_files(built.path), 2):
        for pos in rng.sample(range(size), rng.randrange(1, 6)):
            flip(f, pos, rng)
    with open_ro(built.path) as store:
        wanted = [(m.topic, m.keys[0]) for m in rng.sample(list(reference.values()), 150)]
        for topic, key in wanted + shared_keys():
            try:
                found = store.query_by_key(topic, key)
            except CorruptRecordError:
                continue  # a damaged entry pointing into the middle of a record
            for x in found:
                assert x == reference[x.commit_log_offset]
                assert x.topic == topic and key in x.keys


def test_header_fields_without_checksum_read_back_changed(
    built: Built, reference: dict[int, MessageExt]
) -> None:
    """QUEUEOFFSET is not covered by any checksum: get_message returns the changed value (as
    RocketMQ would); only verify, comparing with the ConsumeQueue, sees it."""
    phys = next(p for p in middle_records(built) if p in built.dispatched)
    damage_records(built, random.Random(11), 1, ("queue_offset",), [phys])
    with open_ro(built.path) as store:
        m = store.get_message(phys)
        assert m.queue_offset != reference[phys].queue_offset
        assert m.body == reference[phys].body
        report = verify(store)
    assert [(p.kind, p.offset) for p in report.problems] == [("commitlog-record-mismatch", phys)]


@pytest.mark.parametrize("what", ["unit-offset", "record-queue-offset"])
def test_pull_returns_only_the_queues_own_messages(
    built: Built, reference: dict[int, MessageExt], what: str
) -> None:
    units = list(queue_units(built.path))
    f, pos, phys = units[5]
    if what == "unit-offset":
        other = next(u for u in units if u[0].parent != f.parent)[2]
        with open(f, "r+b") as fh:
            fh.seek(pos)
            fh.write(other.to_bytes(8, "big"))
    else:
        damage_records(built, random.Random(1), 1, CROSS_CHECKED[1:2], [phys])
    topic, qid = f.parent.parent.name, int(f.parent.name)
    index = int(f.name) // 20 + pos // 20
    with open_ro(built.path) as store:
        try:
            result = store.get_messages(topic, qid, index, 1)
        except CorruptRecordError:
            return
        m = result.messages[0]
        assert (m.topic, m.queue_id, m.queue_offset) == (topic, qid, index)


def test_verify_after_damage_to_every_file_type(built: Built) -> None:
    """One store with damage everywhere: the scan finishes and names each damaged file."""
    rng = random.Random(77)
    damaged = damage_records(built, rng, 3, STRUCTURAL, middle_records(built))
    f, pos, _ = rng.choice(list(queue_units(built.path)))
    flip(f, pos + 9, rng)  # the unit's size
    idx = index_files(built.path)[1]
    flip(idx, 36, rng)  # indexCount
    with open_ro(built.path) as store:
        report = verify(store)
    paths = {p.path for p in report.problems}
    assert {str(segment_path(built.path, p)) for p in damaged} <= paths
    assert str(f) in paths and str(idx) in paths
    assert report.damaged_records == len(damaged)
