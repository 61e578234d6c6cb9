"""Retention and disk pressure (rocketstore.pipeline.engine.retention.service), with an injected clock and a simulated disk.

The stores use a tiny geometry (64 KiB CommitLog segments, ConsumeQueue files of 50 units,
index files of 300 entries) so that a few hundred messages fill every kind of file several
times over. Segment ages are set with ``os.utime``; ``SimDisk`` plays a filesystem of a given
size that holds the store's files (their allocated blocks) plus some other data.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.retention import policy as retentionpolicy
from rocketstore.pipeline.engine.retention import report as retentionreport
from rocketstore.pipeline.engine.retention.policy import RetentionPolicy
from rocketstore.pipeline.engine.retention.service import RetentionService
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import DiskFullError, ReadOnlyStoreError, StoreError
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.layout import CQ_UNIT_SIZE
from tests.kit.files import snapshot

CFG = StoreConfig(
    mapped_file_size_commitlog=64 * 1024,
    mapped_file_size_consume_queue=20 * 50,
    max_hash_slot_num=101,
    max_index_num=300,
)
SEG = CFG.mapped_file_size_commitlog
HOUR = 3_600_000
TOPICS = (("TopicA", 0), ("TopicA", 1), ("TopicB", 0))


def local_ms(hour: int, minute: int = 30, day: int = 10) -> int:
    """Epoch ms of a local wall-clock time (what deleteWhen is compared with)."""
    return int(dt.datetime(2024, 3, day, hour, minute).timestamp() * 1000)


AT_04 = local_ms(4)
AT_10 = local_ms(10)
AT_16 = local_ms(16)


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        self.ms += 1
        return self.ms


class SimDisk:
    """A filesystem of ``capacity`` bytes holding the store plus ``other`` bytes."""

    def __init__(self, store: Path, capacity: int = 10 * 1024 * 1024, ratio: float = 0.5):
        self.store = store
        self.capacity = capacity
        self.other = 0
        self.calls = 0
        self.set_ratio(ratio)

    def store_bytes(self) -> int:
        return sum(p.stat().st_blocks * 512 for p in self.store.rglob("*") if p.is_file())

    def set_ratio(self, ratio: float) -> None:
        self.other = int(ratio * self.capacity) - self.store_bytes()
        assert self.other >= 0, "capacity too small for the store"

    def __call__(self, path: Path) -> float:
        self.calls += 1
        return (self.other + self.store_bytes()) / self.capacity

    def total(self, path: Path) -> int:
        return self.capacity


def body(i: int) -> bytes:
    return (f"message-{i:05d}-".encode() * 80)[:1000]


def fill(store: MessageStore, count: int, start: int = 0) -> None:
    batch = []
    for i in range(start, start + count):
        topic, qid = TOPICS[i % len(TOPICS)]
        batch.append(Message(topic, body(i), queue_id=qid, keys=f"k{i}", tags=f"t{i % 3}"))
        if len(batch) == 25:
            store.put_batch(batch)
            batch = []
    if batch:
        store.put_batch(batch)


def age_segments(store: MessageStore, now: int, hours: list[float]) -> None:
    """Give CommitLog segment ``i`` the modification time ``now - hours[i]`` (oldest first);
    segments past the list keep their time."""
    store.flush()
    for mf, h in zip(store.commitlog.segments.files, hours, strict=False):
        t = (now - int(h * HOUR)) / 1000
        os.utime(mf.path, (t, t))


def segment_names(store: MessageStore) -> list[str]:
    return [mf.path.name for mf in store.commitlog.segments.files]


def all_messages(store: MessageStore) -> dict[tuple[str, int, int], bytes]:
    """Every readable message by (topic, queueId, queueOffset)."""
    out: dict[tuple[str, int, int], bytes] = {}
    for info in store.queue_infos():
        off = info.min_offset
        while off < info.max_offset:
            r = store.get_messages(info.topic, info.queue_id, off, 32)
            assert r.status == "FOUND", (info, off, r.status)
            for m in r.messages:
                out[(m.topic, m.queue_id, m.queue_offset)] = m.body
            off = r.next_begin_offset
    return out


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[object]:
    opened: list[MessageStore] = []

    def make(count: int = 480, name: str = "store") -> MessageStore:
        s = MessageStore(tmp_path / name, CFG, clock_ms=Clock(AT_04 - 200 * HOUR))
        opened.append(s)
        fill(s, count)
        s.flush()
        return s

    yield make
    for s in opened:
        s.close()


def service(
    store: MessageStore, disk: SimDisk | None = None, **policy: object
) -> tuple[RetentionService, SimDisk]:
    disk = disk or SimDisk(store.path)
    pol = RetentionPolicy.from_config(store.config, **policy)
    svc = RetentionService(
        store, pol, clock_ms=lambda: AT_10, disk_usage=disk, disk_total=disk.total
    )
    return svc, disk


def run(svc: RetentionService, now: int, **kw: object) -> retentionreport.CleanReport:
    with svc.store.writer_lock():
        return svc.run(now, **kw)  # type: ignore[arg-type]


# -- policy -----------------------------------------------------------------------------------
def test_policy_from_config() -> None:
    cfg = StoreConfig(file_reserved_time=48, delete_when="04;16", disk_max_used_space_ratio=60)
    p = RetentionPolicy.from_config(cfg, max_files_per_run=3)
    assert p.file_reserved_time == 48
    assert p.delete_when == (4, 16)
    assert p.disk_max_used_space_ratio == pytest.approx(0.60)
    assert (p.clean_forcibly_ratio, p.warning_level_ratio) == (0.85, 0.90)
    assert p.max_files_per_run == 3
    assert p.is_delete_hour(AT_04) and p.is_delete_hour(AT_16) and not p.is_delete_hour(AT_10)
    with pytest.raises(StoreError):
        RetentionPolicy(max_files_per_run=0)
    with pytest.raises(StoreError):
        retentionpolicy.parse_delete_when("4;25")


def test_statvfs_defaults_measure_the_real_disk(tmp_path: Path) -> None:
    ratio = retentionpolicy.statvfs_used_ratio(tmp_path)
    assert 0.0 <= ratio <= 1.0
    assert retentionpolicy.statvfs_total_bytes(tmp_path) > 0


# -- expiry and the deleteWhen hours ----------------------------------------------------------
def test_expired_segments_go_only_at_delete_when_hours(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    assert len(names) >= 8
    # Five oldest segments 100 h old (> 72 h), the rest 1 h.
    age_segments(store, AT_04, [100] * 5 + [1] * (len(names) - 5))
    svc, _ = service(store)

    report = run(svc, AT_10)
    assert report.files == [] and segment_names(store) == names
    assert retentionpolicy.TRIGGER_DELETE_WHEN not in report.triggers

    report = run(svc, AT_04)
    cl = report.deleted("commitlog")
    assert [f.path.name for f in cl] == names[:5]
    assert {f.reason for f in cl} == {"expired"}
    assert all(f.bytes == SEG for f in cl)
    assert segment_names(store) == names[5:]
    assert store.commitlog.min_offset == int(names[5])
    assert report.commitlog_min_offset_before == 0
    assert report.commitlog_min_offset_after == int(names[5])
    assert report.triggers == [retentionpolicy.TRIGGER_DELETE_WHEN]
    assert report.complete
    # Nothing else is due: a second run at the same hour deletes nothing.
    assert run(svc, AT_04 + 60_000).files == []


def test_second_delete_when_hour_and_manual_clean(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_16, [100, 100, 1, 1, 1])
    svc, _ = service(store, delete_when=(4, 16))
    assert [f.path.name for f in run(svc, AT_16).deleted("commitlog")] == names[:2]

    store2 = make_store(name="manual")
    names2 = segment_names(store2)
    age_segments(store2, AT_10, [100, 100, 100, 1])
    svc2, _ = service(store2)
    assert run(svc2, AT_10).files == []
    report = run(svc2, AT_10, force_expired=True)
    assert [f.path.name for f in report.deleted("commitlog")] == names2[:3]
    assert {f.reason for f in report.deleted("commitlog")} == {"expired"}
    assert report.triggers == [retentionpolicy.TRIGGER_MANUAL]


def test_expiry_boundary_is_rocketmqs(make_store) -> None:
    store = make_store()
    mf = store.commitlog.segments.files[0]
    mtime = AT_04 - 72 * HOUR
    store.flush()
    os.utime(mf.path, (mtime / 1000, mtime / 1000))
    svc, _ = service(store)
    assert run(svc, AT_04 - 1).files == []  # 1 ms short of fileReservedTime
    assert [f.path for f in run(svc, AT_04).deleted("commitlog")] == [mf.path]


def test_a_fresh_segment_stops_the_round(make_store) -> None:
    """Never a segment in the middle: an expired segment after a fresh one waits."""
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_04, [100, 1, 100, 100])
    svc, _ = service(store)
    assert [f.path.name for f in run(svc, AT_04).deleted("commitlog")] == names[:1]
    assert segment_names(store) == names[1:]


def test_at_most_max_files_per_run(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_04, [100] * len(names))
    svc, _ = service(store, max_files_per_run=2)
    first = run(svc, AT_04)
    assert [f.path.name for f in first.deleted("commitlog")] == names[:2]
    assert not first.complete
    second = run(svc, AT_04)
    assert [f.path.name for f in second.deleted("commitlog")] == names[2:4]
    # The override for one call (the CLI's one-shot clean); the last segment always stays.
    rest = run(svc, AT_04, max_files=100)
    assert [f.path.name for f in rest.deleted("commitlog")] == names[4:-1]
    assert rest.complete
    assert segment_names(store) == names[-1:]


def test_the_segment_being_written_is_never_deleted(make_store) -> None:
    store = make_store(count=30)  # one segment
    assert len(store.commitlog.segments.files) == 1
    age_segments(store, AT_04, [1000])
    svc, disk = service(store)
    disk.set_ratio(0.99)
    report = run(svc, AT_04, force_expired=True, max_files=100)
    assert report.files == []
    assert len(store.commitlog.segments.files) == 1
    assert store.get_messages("TopicA", 0, 0).status == "FOUND"


# -- disk pressure ----------------------------------------------------------------------------
def test_expired_segments_go_at_any_hour_under_disk_pressure(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_10, [100, 100, 100, 1, 1])
    svc, disk = service(store)
    disk.set_ratio(0.74)
    assert run(svc, AT_10).files == []
    disk.set_ratio(0.80)  # above diskMaxUsedSpaceRatio (75 %), below the forcible 85 %
    report = run(svc, AT_10)
    assert report.triggers == [retentionpolicy.TRIGGER_DISK_RATIO]
    cl = report.deleted("commitlog")
    assert [f.path.name for f in cl] == names[:3]  # the fresh ones stay
    assert {f.reason for f in cl} == {"disk-pressure"}


def test_forced_deletion_above_85_percent_oldest_first_until_under(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_10, [1] * len(names))  # nothing expired
    svc, disk = service(store, max_files_per_run=100)
    disk.set_ratio(0.86)
    # Each full 64 KiB segment is 0.625 % of the 10 MiB disk: two bring 86 % to <= 85 %.
    report = run(svc, AT_10)
    assert retentionpolicy.TRIGGER_FORCIBLY in report.triggers
    cl = report.deleted("commitlog")
    assert [f.path.name for f in cl] == names[:2]
    assert {f.reason for f in cl} == {"forced"}
    assert report.disk_used_ratio_after <= 0.85 < report.disk_used_ratio
    assert report.bytes_freed == sum(f.allocated for f in report.files) >= 2 * SEG
    assert segment_names(store) == names[2:]
    # Below 85 % nothing unexpired goes any more.
    assert run(svc, AT_10).deleted("commitlog") == []


def test_forced_deletion_stops_at_the_last_segment(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_10, [1] * len(names))
    svc, disk = service(store, max_files_per_run=100)
    disk.set_ratio(0.99)  # other data alone keeps the disk above 85 %
    report = run(svc, AT_10)
    assert [f.path.name for f in report.deleted("commitlog")] == names[:-1]
    assert segment_names(store) == names[-1:]
    assert report.disk_used_ratio_after > 0.85


def test_expired_then_forced_reasons_in_one_round(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_10, [100, 100] + [1] * (len(names) - 2))
    svc, disk = service(store, max_files_per_run=100)
    disk.set_ratio(0.95)
    reasons = [f.reason for f in run(svc, AT_10).deleted("commitlog")]
    assert reasons[:2] == ["disk-pressure", "disk-pressure"]
    assert set(reasons[2:]) == {"forced"}


def test_forcible_cleaning_can_be_disabled(make_store) -> None:
    store = make_store()
    age_segments(store, AT_10, [1] * 8)
    svc, disk = service(store, clean_file_forcibly_enable=False)
    disk.set_ratio(0.95)
    assert run(svc, AT_10).files == []


# -- disk full ---------------------------------------------------------------------------------
def test_disk_full_above_90_percent_with_rocketmq_hysteresis(make_store) -> None:
    store = make_store(count=30)
    svc, disk = service(store)
    assert not svc.disk_full()
    svc.check_put()
    disk.set_ratio(0.89)
    svc.refresh()
    assert not svc.disk_full()
    disk.set_ratio(0.91)
    assert svc.refresh() > 0.90
    assert svc.disk_full()
    with pytest.raises(DiskFullError) as err:
        svc.check_put()
    msg = str(err.value)
    assert str(store.path) in msg and "91.0%" in msg and "90%" in msg
    assert err.value.threshold == 0.90 and err.value.used_ratio == pytest.approx(0.91, abs=1e-3)
    # Between 85 and 90 % the mark stays (RocketMQ clears it only at or below 85 %).
    disk.set_ratio(0.87)
    svc.refresh()
    assert svc.disk_full()
    disk.set_ratio(0.85)
    svc.refresh()
    assert not svc.disk_full()
    svc.check_put()


def test_disk_full_is_cached_and_refused_puts_lose_nothing(make_store) -> None:
    store = make_store(count=60)
    before = all_messages(store)
    svc, disk = service(store)
    disk.set_ratio(0.95)
    svc.refresh()
    calls = disk.calls
    for _ in range(1000):
        assert svc.disk_full()
    assert disk.calls == calls  # the put path never measures

    def guarded_put(m: Message) -> None:
        svc.check_put()
        store.put(m)

    with pytest.raises(DiskFullError):
        guarded_put(Message("TopicA", b"refused"))
    assert all_messages(store) == before


def test_run_clears_disk_full_once_forced_deletion_frees_space(make_store) -> None:
    store = make_store()
    age_segments(store, AT_10, [1] * 8)
    # A 4 MiB disk: each 64 KiB segment is 1.6 % of it, so a few segments bring it under 85 %.
    svc, disk = service(store, SimDisk(store.path, capacity=4 * 1024 * 1024), max_files_per_run=100)
    disk.set_ratio(0.905)
    svc.refresh()
    assert svc.disk_full()
    report = run(svc, AT_10)
    assert report.disk_used_ratio_after <= 0.85
    assert not report.disk_full and not svc.disk_full()
    assert report.to_json()["diskFull"] is False


# -- ConsumeQueues and index ---------------------------------------------------------------------
def _cq_first_units(store: MessageStore, key: tuple[str, int]) -> tuple[int, int]:
    cq = store.queues[key]
    u = cq.read(cq.min_offset, 1)[0]
    return int(u["offset"]), cq.min_offset


def test_consumequeue_and_index_files_follow_the_commitlog(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    cq_files_before = {k: [mf.path for mf in cq.segments.files] for k, cq in store.queues.items()}
    assert store.index is not None
    index_before = [f.path for f in store.index.files]
    assert all(len(v) >= 3 for v in cq_files_before.values()) and len(index_before) >= 3
    age_segments(store, AT_04, [100] * 5 + [1] * (len(names) - 5))
    svc, _ = service(store)
    mins_before = {(q.topic, q.queue_id): q.min_offset for q in store.queue_infos()}
    report = run(svc, AT_04)
    min_phy = store.commitlog.min_offset
    assert min_phy == int(names[5])

    deleted = {f.path for f in report.files}
    for key, cq in store.queues.items():
        files = cq.segments.files
        gone = [p for p in cq_files_before[key] if p not in {mf.path for mf in files}]
        assert gone == cq_files_before[key][: len(gone)] and len(gone) >= 1  # a prefix
        assert all(p in deleted and not p.exists() for p in gone)
        # Every deleted file lay wholly below the new min; the first kept one does not.
        last_unit = cq.read(files[0].base // CQ_UNIT_SIZE + cq.units_per_file - 1, 1)
        assert len(last_unit) == 0 or int(last_unit[0]["offset"]) >= min_phy or len(files) == 1
        # The min offset is the first unit still pointing at the CommitLog.
        first_phys, qmin = _cq_first_units(store, key)
        assert first_phys >= min_phy
        if qmin > files[0].base // CQ_UNIT_SIZE:
            prev = cq.segments.files[0]
            rel = (qmin - 1) * CQ_UNIT_SIZE - prev.base
            assert int.from_bytes(prev.buffer[rel : rel + 8], "big") < min_phy
    assert {(q.topic, q.queue_id): (q.before, q.after) for q in report.queues} == {
        k: (mins_before[k], store.queues[k].min_offset) for k in store.queues
    }
    assert {f.reason for f in report.files if f.kind != "commitlog"} == {"below-min-offset"}

    index_after = [f.path for f in store.index.files]
    assert index_after == index_before[len(index_before) - len(index_after) :]
    assert len(index_after) < len(index_before)
    assert all(p in deleted and not p.exists() for p in index_before[: -len(index_after)])
    # The first index file kept still indexes live data; the last is never deleted.
    assert store.index.files[0].end_phy_offset >= min_phy or len(index_after) == 1


def test_pulls_and_lookups_after_deletion(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_04, [100] * 4 + [1] * (len(names) - 4))
    before = all_messages(store)
    svc, _ = service(store)
    run(svc, AT_04)
    min_phy = store.commitlog.min_offset
    for info in store.queue_infos():
        lo = info.min_offset
        assert lo > 0
        for stale in (0, lo - 1):
            r = store.get_messages(info.topic, info.queue_id, stale)
            assert (r.status, r.next_begin_offset, r.min_offset) == ("OFFSET_TOO_SMALL", lo, lo)
        r = store.get_messages(info.topic, info.queue_id, lo, 1)
        assert r.status == "FOUND"
        m = r.messages[0]
        assert m.queue_offset == lo and m.commit_log_offset >= min_phy
    after = all_messages(store)
    # Exactly the messages stored at or past the new min offset remain, byte for byte.
    assert after == {k: v for k, v in before.items() if k[2] >= store.min_offset(k[0], k[1])}
    assert len(after) < len(before)
    # Key look-ups: a deleted message is gone, a kept one is found.
    gone = store.query_by_key("TopicA", "k0")
    assert gone == []
    newest = max(i for i in range(480) if TOPICS[i % 3] == ("TopicA", 0))
    assert [m.body for m in store.query_by_key("TopicA", f"k{newest}")] == [body(newest)]
    # Puts go on after deletion.
    fill(store, 60, start=480)
    assert len(all_messages(store)) == len(after) + 60


# -- dry run ------------------------------------------------------------------------------------
def test_plan_changes_nothing_and_matches_the_run(make_store, tmp_path: Path) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_04, [100] * 3 + [1] * (len(names) - 3))
    svc, disk = service(store, max_files_per_run=100)
    disk.set_ratio(0.87)  # expired ones first, then forced ones
    store.flush()
    snap = snapshot(store.path, skip={"lock", "abort"}, times=True)
    infos = store.queue_infos()
    with store.writer_lock():
        plan = svc.plan(AT_04)
    assert plan.dry_run and plan.to_json()["dryRun"] is True
    assert snapshot(store.path, skip={"lock", "abort"}, times=True) == snap
    assert store.queue_infos() == infos
    assert segment_names(store) == names
    assert not svc.disk_full()
    kinds = {f.kind for f in plan.files}
    assert kinds == {"commitlog", "consumequeue", "index"}
    assert [f.reason for f in plan.deleted("commitlog")][:3] == ["expired"] * 3
    assert "forced" in {f.reason for f in plan.deleted("commitlog")}

    report = run(svc, AT_04)
    assert not report.dry_run
    assert [(f.path, f.kind, f.reason, f.bytes) for f in report.files] == [
        (f.path, f.kind, f.reason, f.bytes) for f in plan.files
    ]
    assert report.queues == plan.queues
    assert report.commitlog_min_offset_after == plan.commitlog_min_offset_after
    assert report.disk_used_ratio_after == pytest.approx(plan.disk_used_ratio_after, abs=0.01)


def test_plan_on_a_read_only_store(make_store) -> None:
    store = make_store()
    age_segments(store, AT_04, [100] * 3)
    store.close()
    snap = snapshot(store.path, skip={"lock", "abort"}, times=True)
    with MessageStore(store.path, CFG, read_only=True) as ro:
        svc, _ = service(ro)
        plan = svc.plan(AT_04)
        assert [f.path.name for f in plan.deleted("commitlog")] == segment_names(ro)[:3]
        with pytest.raises(ReadOnlyStoreError):
            svc.run(AT_04)
    assert snapshot(store.path, skip={"lock", "abort"}, times=True) == snap


def test_report_json(make_store) -> None:
    store = make_store()
    age_segments(store, AT_04, [100, 100])
    svc, _ = service(store)
    report = run(svc, AT_04)
    data = json.loads(json.dumps(report.to_json()))
    assert data["dryRun"] is False and data["complete"] is True
    assert data["triggers"] == ["delete-when"]
    assert data["files"][0] == {
        "path": str(report.files[0].path),
        "kind": "commitlog",
        "bytes": SEG,
        "allocatedBytes": report.files[0].allocated,
        "reason": "expired",
        "mtime": report.files[0].mtime_ms,
    }
    assert data["bytes"] == sum(f["bytes"] for f in data["files"])
    assert data["bytesFreed"] == report.bytes_freed
    assert data["commitLogMinOffsetAfter"] == 2 * SEG
    assert {"topic", "queueId", "minOffsetBefore", "minOffsetAfter"} == set(data["queues"][0])
    assert data["deferred"] == []


# -- reopening and crashes ---------------------------------------------------------------------
def test_store_reopens_after_deletion_and_reads_the_rest_exactly(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_04, [100] * 5 + [1] * (len(names) - 5))
    svc, _ = service(store)
    run(svc, AT_04)
    expected = all_messages(store)
    infos = store.queue_infos()
    min_phy, max_phy = store.commitlog.min_offset, store.commitlog.max_offset
    path = store.path
    store.close()
    assert sorted(p.name for p in (path / "commitlog").iterdir()) == names[5:]
    for read_only in (True, False):
        with MessageStore(path, CFG, read_only=read_only) as again:
            assert (again.commitlog.min_offset, again.commitlog.max_offset) == (min_phy, max_phy)
            assert again.queue_infos() == infos
            assert all_messages(again) == expected
            if not read_only:
                assert again.recovery.bytes_truncated == 0
                assert again.recovery.records_redispatched == 0
                fill(again, 30, start=480)
                assert len(all_messages(again)) == len(expected) + 30


@pytest.mark.parametrize("how", ["progress", "consumequeue", "checkpoint"])
def test_every_recovery_start_copes_with_a_log_not_starting_at_zero(make_store, how: str) -> None:
    """Reopen after deletion with each of recovery's start points: the progress file, the
    derived files' newest record (a store without the progress file, as RocketMQ leaves it),
    and the checkpoint (a store left with ``abort``)."""
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_04, [100] * 5 + [1] * (len(names) - 5))
    run(service(store)[0], AT_04)
    expected = all_messages(store)
    infos = store.queue_infos()
    path = store.path
    store.close()
    if how != "progress":
        (path / "config" / "rocketstore.json").unlink()
    if how == "checkpoint":
        (path / "abort").touch()
    with MessageStore(path, CFG) as again:
        assert again.recovery.start_source == how
        assert again.recovery.bytes_truncated == 0
        assert segment_names(again) == names[5:]
        assert again.queue_infos() == infos
        assert all_messages(again) == expected


@pytest.mark.parametrize("deleted_before_crash", [1, 3])
def test_crash_during_commitlog_deletion_leaves_a_store_that_opens(
    make_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deleted_before_crash: int
) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_04, [100] * 5 + [1] * (len(names) - 5))
    expected = all_messages(store)
    svc, _ = service(store)
    real = type(store.commitlog.segments).delete_first
    count = 0

    def crashing(self: object) -> bool:
        nonlocal count
        if count == deleted_before_crash:
            raise KeyboardInterrupt("power cut")
        count += 1
        return real(self)  # type: ignore[arg-type]

    monkeypatch.setattr(type(store.commitlog.segments), "delete_first", crashing)
    with pytest.raises(KeyboardInterrupt):
        run(svc, AT_04)
    monkeypatch.undo()
    image = tmp_path / "crash-image"
    shutil.copytree(store.path, image)  # what the disk holds at the crash (abort included)
    with MessageStore(image, CFG) as again:
        assert again.recovery.abort_file_found
        assert segment_names(again) == names[deleted_before_crash:]
        again_svc, _ = service(again)
        report = run(again_svc, AT_04)
        assert segment_names(again) == names[5:]
        assert "commitlog" in {f.kind for f in report.files}
        assert_derived_files_agree(again)
        got = all_messages(again)
        assert got == {k: v for k, v in expected.items() if k[2] >= again.min_offset(k[0], k[1])}


def _crash_between_commitlog_and_queues(
    store: MessageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, segments: int = 5
) -> Path:
    names = segment_names(store)
    age_segments(store, AT_04, [100] * segments + [1] * (len(names) - segments))
    svc, _ = service(store)

    def crash(self: object, rnd: object, min_phy: int) -> None:
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(RetentionService, "_clean_derived", crash)
    with pytest.raises(KeyboardInterrupt):
        run(svc, AT_04)
    monkeypatch.undo()
    image = tmp_path / "crash-image"
    shutil.copytree(store.path, image)
    return image


def test_crash_between_commitlog_and_queues_is_finished_by_the_next_run(
    make_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    names = segment_names(store)
    expected = all_messages(store)
    image = _crash_between_commitlog_and_queues(store, tmp_path, monkeypatch)
    with MessageStore(image, CFG) as again:
        assert segment_names(again) == names[5:]
        # Whether recovery rebuilt the queues or left their old files behind, the next run (not
        # at a deleteWhen hour: derived files are cleaned anyway) leaves them consistent.
        svc, _ = service(again)
        report = run(svc, AT_10)
        assert report.deleted("commitlog") == []
        assert report.deleted("index")
        assert_derived_files_agree(again)
        got = all_messages(again)
        assert got == {k: v for k, v in expected.items() if k[2] >= again.min_offset(k[0], k[1])}


def assert_derived_files_agree(store: MessageStore) -> None:
    """No ConsumeQueue or index file that could go is left below the CommitLog's min offset,
    and every queue's min offset is its first unit still pointing at the CommitLog."""
    min_phy = store.commitlog.min_offset
    for cq in store.queues.values():
        files = cq.segments.files
        if len(files) > 1 and files[0].wrote_position == files[0].size:
            mf = files[0]
            last = int.from_bytes(mf.buffer[mf.size - CQ_UNIT_SIZE : mf.size - 12])
            assert last >= min_phy, (cq.topic, cq.queue_id, mf.path.name)
        if cq.max_offset > cq.min_offset:
            assert int(cq.read(cq.min_offset, 1)[0]["offset"]) >= min_phy
            rel = cq.min_offset * CQ_UNIT_SIZE - files[0].base
            if rel > 0:  # the unit before the min offset points below the CommitLog
                assert int.from_bytes(files[0].buffer[rel - CQ_UNIT_SIZE : rel - 12]) < min_phy
    if store.index is not None and len(store.index.files) > 1:
        assert store.index.files[0].end_phy_offset >= min_phy


def message_places(store: MessageStore) -> dict[tuple[str, int, int], tuple[int, bytes]]:
    """Every readable message's CommitLog offset and body by (topic, queueId, queueOffset)."""
    out: dict[tuple[str, int, int], tuple[int, bytes]] = {}
    for info in store.queue_infos():
        for off in range(info.min_offset, info.max_offset):
            (m,) = store.get_messages(info.topic, info.queue_id, off, 1).messages
            out[(m.topic, m.queue_id, m.queue_offset)] = (m.commit_log_offset, m.body)
    return out


# 5 segments leave each queue's first file wholly stale and the next partly; 6, the first two.
@pytest.mark.parametrize("segments", [5, 6])
@pytest.mark.parametrize("read_only", [True, False], ids=["view", "writer"])
def test_min_offsets_past_units_whose_commitlog_is_gone(
    make_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, segments: int, read_only: bool
) -> None:
    """Opened after a crash left queue files whose units point below the CommitLog (before any
    retention run repairs them), each queue starts at its first unit whose record is still
    there, and reads from that min offset on return every message, none skipped."""
    store = make_store()
    before = message_places(store)
    image = _crash_between_commitlog_and_queues(store, tmp_path, monkeypatch, segments)
    with MessageStore(image, CFG, read_only=read_only) as again:
        min_phy = again.commitlog.min_offset
        live = {k: v for k, v in before.items() if v[0] >= min_phy}
        stale_files = 0
        for info in again.queue_infos():
            offsets = [k[2] for k in live if k[:2] == (info.topic, info.queue_id)]
            assert (info.min_offset, info.max_offset) == (min(offsets), max(offsets) + 1), info
            cq = again.queues[(info.topic, info.queue_id)]
            stale_files = max(stale_files, info.min_offset // cq.units_per_file)
            got = {}
            off = info.min_offset
            while off < info.max_offset:
                r = again.get_messages(info.topic, info.queue_id, off, 32)
                assert r.status == "FOUND" and r.messages[0].queue_offset == off, (info, off)
                for m in r.messages:
                    got[(m.topic, m.queue_id, m.queue_offset)] = (m.commit_log_offset, m.body)
                off = r.next_begin_offset
            assert got == {k: v for k, v in live.items() if k[:2] == (info.topic, info.queue_id)}
        assert stale_files == segments - 4  # the files the crash left wholly below the log


def test_a_segment_a_reader_still_maps_is_deferred(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_04, [100, 100, 100])
    svc, _ = service(store)
    first = store.get_messages("TopicA", 0, 0, 1).messages[0]
    view = store.commitlog.raw(first.commit_log_offset, first.store_size)
    report = run(svc, AT_04)
    assert report.files == [] and not report.complete
    assert [p.name for p in report.deferred] == names[:1]
    assert segment_names(store) == names
    assert bytes(view[4:8]) == bytes(store.commitlog.raw(first.commit_log_offset, 8)[4:8])
    assert store.get_message(first.commit_log_offset).body == first.body  # still usable
    view.release()
    report = run(svc, AT_04)
    assert [f.path.name for f in report.deleted("commitlog")] == names[:3]


def test_closed_store_is_refused(make_store) -> None:
    store = make_store(count=10)
    svc, _ = service(store)
    store.close()
    with pytest.raises(StoreError):
        svc.plan(AT_04)


def test_a_queue_whose_messages_are_all_gone(make_store) -> None:
    """A queue that only had old messages is left empty (min == max), keeps its last file and
    its offsets, and takes new messages at the offset it had reached."""
    store = make_store(count=0)
    store.put_batch([Message("OldTopic", body(i), keys=f"old{i}") for i in range(120)])
    fill(store, 480)
    names = segment_names(store)
    age_segments(store, AT_04, [100] * 5 + [1] * (len(names) - 5))
    report = run(service(store)[0], AT_04)
    old = store.queues[("OldTopic", 0)]
    assert len(old.segments.files) == 1  # the last file stays
    assert (old.min_offset, old.max_offset) == (120, 120)
    assert ("OldTopic", 0, 0, 120) in {
        (q.topic, q.queue_id, q.before, q.after) for q in report.queues
    }
    assert store.get_messages("OldTopic", 0, 0).status == "OFFSET_TOO_SMALL"
    assert store.get_messages("OldTopic", 0, 120).status == "OFFSET_OVERFLOW_ONE"
    assert store.query_by_key("OldTopic", "old5") == []
    # Offset by time: a time before everything kept gives each queue's new min offset.
    for info in store.queue_infos():
        if info.max_offset > info.min_offset:
            assert store.offset_by_time(info.topic, info.queue_id, 0) == info.min_offset
    r = store.put(Message("OldTopic", b"new"))
    assert r.queue_offset == 120
    path = store.path
    store.close()
    with MessageStore(path, CFG, read_only=True) as again:
        got = again.get_messages("OldTopic", 0, 120)
        assert [m.body for m in got.messages] == [b"new"] and again.min_offset("OldTopic", 0) == 120


def test_a_clean_reopen_after_retention_rebuilds_nothing(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_04, [100] * 5 + [1] * (len(names) - 5))
    run(service(store)[0], AT_04)
    path = store.path
    store.close()
    with MessageStore(path, CFG) as again:
        assert again.recovery.queues_rebuilt == []
        assert not again.recovery.index_rebuilt
        assert again.recovery.records_redispatched == 0


def test_a_queue_emptied_by_retention_keeps_its_offsets_across_a_reopen(make_store) -> None:
    store = make_store(count=0)
    store.put_batch([Message("OldTopic", body(i)) for i in range(120)])
    fill(store, 480)
    names = segment_names(store)
    age_segments(store, AT_04, [100] * 5 + [1] * (len(names) - 5))
    run(service(store)[0], AT_04)
    assert (store.min_offset("OldTopic", 0), store.max_offset("OldTopic", 0)) == (120, 120)
    path = store.path
    store.close()
    with MessageStore(path, CFG) as again:
        assert (again.min_offset("OldTopic", 0), again.max_offset("OldTopic", 0)) == (120, 120)
        assert again.put(Message("OldTopic", b"new")).queue_offset == 120


def test_derived_files_per_run_limit_resumes_next_run(make_store) -> None:
    store = make_store()
    names = segment_names(store)
    age_segments(store, AT_04, [100] * 6 + [1] * (len(names) - 6))
    svc, _ = service(store, max_derived_files_per_run=2)
    first = run(svc, AT_04)
    assert len(first.deleted("commitlog")) == 6
    assert len(first.files) - 6 == 2 and not first.complete
    runs = 1
    while True:
        report = run(svc, AT_10)  # no CommitLog segment is due at 10:00; derived files are
        runs += 1
        assert report.deleted("commitlog") == [] and len(report.files) <= 2
        if report.complete:
            break
        assert runs < 50
    assert runs > 2
    assert_derived_files_agree(store)
    assert run(svc, AT_10).files == []


def test_runs_from_a_background_thread_while_puts_go_on(make_store) -> None:
    """The store's writer lock around run() is all it takes: puts from another thread go on
    while forced deletion keeps the disk under 85 %, and every kept message reads back."""
    store = make_store(count=200)
    svc, disk = service(store, max_files_per_run=3)
    # A 2 MiB disk with ~1.6 MiB of other data: the store may hold about 160 KiB.
    disk.capacity = 2 * 1024 * 1024
    disk.other = int(0.80 * disk.capacity)
    stop = threading.Event()
    errors: list[BaseException] = []
    deleted: list[retentionreport.FileDeletion] = []
    rounds = threading.Condition()
    finished = [0]  # retention runs completed so far

    def cleaner() -> None:
        # Runs back to back, as often as the writer lock lets it, beside the puts.
        try:
            while not stop.is_set():
                deleted.extend(run(svc, AT_10).deleted("commitlog"))
                with rounds:
                    finished[0] += 1
                    rounds.notify_all()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        with rounds:
            rounds.notify_all()

    t = threading.Thread(target=cleaner)
    t.start()
    try:
        for start in range(200, 1400, 50):
            fill(store, 50, start=start)
            # The puts never get more than one batch ahead of retention: wait for a run that
            # started after this batch (the one under way may have started before it).
            with rounds:
                target = finished[0] + 2
                assert rounds.wait_for(lambda goal=target: finished[0] >= goal or bool(errors), 60)
    finally:
        stop.set()
        t.join()
    assert errors == []
    assert len(deleted) >= 5 and {f.reason for f in deleted} == {"forced"}
    run(svc, AT_10)
    assert len(store.commitlog.segments.files) <= 4
    assert_derived_files_agree(store)
    got = all_messages(store)
    assert got and all(v == body(int(v[8:13])) for v in got.values())
    assert len(got) == sum(q.max_offset - q.min_offset for q in store.queue_infos())
