"""Local retention with the tier on (docs/tiering.md#the-local-side): a CommitLog segment goes
only below ``uploadedEnd``, whatever the disk; a full disk with a stalled tier refuses puts
naming the backlog. The simulated disk and clock are test_retention.py's way, rebuilt here
small (a test module imports no other)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.retention.policy import RetentionPolicy
from rocketstore.pipeline.engine.retention.service import RetentionService
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import DiskFullError
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.localstate import TierState

SEG = 64 * 1024
OFF = StoreConfig(mapped_file_size_commitlog=SEG, max_hash_slot_num=101, max_index_num=300)
ON = dataclasses.replace(OFF, tiered_storage_level="NOT_IN_DISK", object_store_bucket="unused")
HOUR = 3_600_000
NOW = 1_900_000_000_000


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[[StoreConfig], MessageStore]]:
    """Opens a store of long-expired segments in tmp_path; closed after the test."""
    opened: list[MessageStore] = []

    def open_one(config: StoreConfig) -> MessageStore:
        opened.append(filled(tmp_path / "s", config))
        return opened[-1]

    yield open_one
    for store in opened:
        store.close()


def filled(path: Path, config: StoreConfig, count: int = 300) -> MessageStore:
    store = MessageStore(path, config)
    for i in range(count):
        store.put(Message(f"T{i % 2}", bytes([i % 250]) * 1000, queue_id=i % 2))
    store.flush()
    old = (NOW - 1000 * HOUR) / 1000  # every segment long expired
    for mf in store.commitlog.segments.files:
        os.utime(mf.path, (old, old))
    return store


def names(store: MessageStore) -> list[int]:
    return [mf.base for mf in store.commitlog.segments.files]


def clean(store: MessageStore, ratio: float = 0.5) -> RetentionService:
    svc = RetentionService(
        store,
        RetentionPolicy.from_config(store.config, max_files_per_run=100),
        clock_ms=lambda: NOW,
        disk_usage=lambda _p: ratio,
        disk_total=lambda _p: 10 * 1024 * 1024,
    )
    with store.writer_lock():
        svc.run(NOW, force_expired=True)
    return svc


def test_tier_off_deletes_expired_segments_as_before(make: Any) -> None:
    store = make(OFF)
    bases = names(store)
    assert len(bases) >= 4
    clean(store)
    assert names(store) == bases[-1:]


def test_nothing_uploaded_nothing_deleted_then_only_below_uploaded_end(make: Any) -> None:
    store = make(ON)
    bases = names(store)
    clean(store)
    assert names(store) == bases  # expired, forced: the bucket holds none of it
    clean(store, ratio=0.99)
    assert names(store) == bases
    # The first two segments uploaded: those two go, the rest stays.
    localstate.write(store.path, TierState("id", bases[2]))
    clean(store)
    assert names(store) == bases[2:]
    localstate.write(store.path, TierState("id", bases[-1] + 10))  # re-read each round
    clean(store)
    assert names(store) == bases[-1:]


def test_a_damaged_tier_record_deletes_nothing(make: Any) -> None:
    store = make(ON)
    bases = names(store)
    localstate.path_of(store.path).write_text("{not json")
    clean(store)
    assert names(store) == bases


def test_a_full_disk_with_a_stalled_tier_names_the_backlog(make: Any) -> None:
    store = make(ON)
    bases = names(store)
    svc = clean(store, ratio=0.95)
    assert names(store) == bases
    with pytest.raises(DiskFullError, match="upload backlog is") as caught:
        svc.check_put()
    text = str(caught.value)
    assert f"{len(bases) - 1} segments" in text and "uploadedEnd 0" in text
    assert "rocketstore tier upload" in text


def test_after_upload_they_are_deleted(ceph: Any, bucket: str, make: Any) -> None:
    """The whole way: a real upload moves uploadedEnd, and retention then deletes below it."""
    from rocketstore.pipeline.tier.upload import Uploader

    config = ON.with_overrides(ceph.settings(bucket))
    store = make(config)
    bases = names(store)
    clean(store)
    assert names(store) == bases
    store.flush()
    report = Uploader(store.path, config).run_once()
    assert report.uploaded == bases[:-1]
    clean(store)
    assert names(store) == bases[-1:]
