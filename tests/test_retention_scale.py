"""Retention in a store of thousands of queues: a round's work follows what it deletes.

Counted, not timed: the queues a round loads. A queue that fits its first ConsumeQueue file has
nothing retention could delete (the last file never goes), so a round leaves it unloaded, and
it takes the CommitLog's new min offset into account when it loads. Many queues with files to
delete at once are dealt with a bounded batch a round (files deleted, queues looked at), and
the rounds end where one unbounded round would have.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.retention.policy import RetentionPolicy
from rocketstore.pipeline.engine.retention.report import CleanReport
from rocketstore.pipeline.engine.retention.service import RetentionService
from rocketstore.pipeline.engine.store import MessageStore
from tests.kit.manyqueues import build

CONFIG = StoreConfig(
    mapped_file_size_commitlog=64 << 10,
    mapped_file_size_consume_queue=400,  # 20 units a file
    max_hash_slot_num=1000,
    max_index_num=20_000,
)
HOUR_MS = 3_600_000


def age_first_segments(path: Path, count: int) -> None:
    """Make the first ``count`` CommitLog segments two hours old (the others stay new)."""
    old = time.time() - 2 * 3600
    for seg in sorted((path / "commitlog").iterdir())[:count]:
        os.utime(seg, (old, old))


def service(store: MessageStore, **limits: int) -> RetentionService:
    policy = RetentionPolicy.from_config(store.config, file_reserved_time=1, **limits)
    return RetentionService(store, policy, disk_usage=lambda _: 0.1)


def clean(svc: RetentionService) -> CleanReport:
    with svc.store.writer_lock():
        return svc.run(force_expired=True, max_files=1000)


def queue_state(path: Path) -> dict[tuple[str, int], tuple[list[str], int, int]]:
    """Each queue's files, min and max offset, every queue loaded."""
    with MessageStore(path, CONFIG, read_only=True) as store:
        return {
            key: ([mf.path.name for mf in cq.segments.files], cq.min_offset, cq.max_offset)
            for key, cq in sorted(store.queues.items())
        }


def test_a_round_loads_no_queue_that_fits_its_first_file(tmp_path: Path) -> None:
    path = build(tmp_path / "store", 500, 3, CONFIG)  # 2,000 queues of 3 units
    age_first_segments(path, 2)
    with MessageStore(path, CONFIG, background=False) as store:
        store.work.reset()
        report = clean(service(store))
        assert len(report.deleted("commitlog")) == 2 and report.deleted("consumequeue") == []
        assert store.work.queues_loaded == 0 and report.queues == []
        min_phy = store.commitlog.min_offset
        # Loaded now, a queue whose first units pointed into the deleted segments starts
        # after them, as if retention had corrected it.
        moved = 0
        for (topic, qid), cq in store.queues.items():
            first = store.read_units(topic, qid, cq.min_offset, 1)
            assert int(first["offset"][0]) >= min_phy
            moved += cq.min_offset > 0
        assert moved > 0
    state = queue_state(path)
    assert all(files == ["00000000000000000000"] for files, _, _ in state.values())


def test_many_queues_files_go_a_bounded_batch_a_round(tmp_path: Path) -> None:
    """1,000 queues of 3 files each lose their first file: 100 files and at most 200 queues
    loaded a round, ten rounds, and then the same files and offsets as one round without
    limits leaves."""
    path = build(tmp_path / "store", 250, 50, CONFIG)
    segments = len(list((path / "commitlog").iterdir()))
    age_first_segments(path, segments // 2)
    once = tmp_path / "once"
    shutil.copytree(path, once)
    with MessageStore(once, CONFIG, background=False) as store:
        report = clean(service(store, max_derived_files_per_run=10_000, max_queues_per_run=10_000))
        assert report.complete and len(report.deleted("consumequeue")) == 1000
    with MessageStore(path, CONFIG, background=False) as store:
        svc = service(store, max_derived_files_per_run=100, max_queues_per_run=200)
        rounds = 0
        while True:
            store.work.reset()
            report = clean(svc)
            rounds += 1
            assert len(report.deleted("consumequeue")) + len(report.deleted("index")) <= 100
            assert store.work.queues_loaded <= 200
            if report.complete:
                break
            assert rounds < 20
        assert rounds == 11  # ten of 100 files, and the one that finds nothing left
    assert queue_state(path) == queue_state(once)


@pytest.mark.parametrize("limit", [0, -1])
def test_the_queue_limit_is_positive(limit: int) -> None:
    with pytest.raises(Exception, match="max_queues_per_run"):
        RetentionPolicy(max_queues_per_run=limit)
