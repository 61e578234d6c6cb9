"""verify and read-only views of a live store whose retention deletes the oldest files.

A read-only open lists the store's files once and maps them when it first reads them; between
the two, the writer's retention may delete the oldest. That is not damage. A scan holds the
oldest segments it listed mapped from its start; a file it loses all the same raises
:class:`SegmentGoneError`, and :func:`verify_read_only` opens the store again and starts over.
Every deletion here is made by the store's own retention (:class:`RetentionService`, its disk
ratio pushed over the forced-clean level), as in a running writer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketstore.pipeline.cli import main
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.retention.policy import RetentionPolicy
from rocketstore.pipeline.engine.retention.service import RetentionService
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import SegmentGoneError
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools.verify import load, state
from rocketstore.pipeline.tools.verify.check import verify, verify_read_only

CONFIG = StoreConfig(
    mapped_file_size_commitlog=16 * 1024,
    mapped_file_size_consume_queue=20 * 64,
    max_hash_slot_num=101,
    max_index_num=400,
)
MESSAGES = 1_200  # about 12 CommitLog segments of 16 KiB
FULL_DISK = 0.95  # over cleanForciblyRatio: retention deletes the oldest files, expired or not


def body(i: int) -> bytes:
    return b"m%05d-" % i + b"x" * 100


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[MessageStore]:
    store = MessageStore(tmp_path / "store", CONFIG, background=False)
    for first in range(0, MESSAGES, 100):
        store.put_batch([Message("T", body(i), keys=[f"k{i}"]) for i in range(first, first + 100)])
    store.flush()
    yield store
    store.close()


def segments(store: MessageStore) -> list[str]:
    return sorted(p.name for p in (store.path / "commitlog").iterdir() if p.name.isdigit())


def delete_oldest(store: MessageStore) -> list[str]:
    """One round of the store's retention on a full disk, one CommitLog segment at most;
    the names of the CommitLog segments it deleted."""
    before = segments(store)
    service = RetentionService(
        store,
        RetentionPolicy.from_config(store.config, max_files_per_run=1),
        disk_usage=lambda _path: FULL_DISK,
        disk_total=lambda _path: 1 << 30,
    )
    with store.writer_lock():
        service.run()
    gone = sorted(set(before) - set(segments(store)))
    assert gone, "retention deleted nothing"
    return gone


def test_a_view_reading_a_segment_retention_deleted_says_so(writer: MessageStore) -> None:
    view = MessageStore(writer.path, CONFIG, read_only=True)
    try:
        gone = delete_oldest(writer)
        with pytest.raises(SegmentGoneError, match=gone[0]):
            verify(view)
    finally:
        view.close()


def test_verify_read_only_opens_again_and_checks_what_is_left(writer: MessageStore) -> None:
    before = len(segments(writer))
    delete_oldest(writer)
    report = verify_read_only(writer.path, CONFIG)
    assert report.ok, report.problems[:5]
    assert report.restarts == 0
    assert report.segments == len(segments(writer)) < before
    assert 0 < report.records < MESSAGES


def test_a_scan_holds_the_oldest_segments_it_listed(writer: MessageStore) -> None:
    """Retention runs once while the scan is under way (from its first progress tick): the
    scan holds the oldest segments mapped from its start (the ones retention deletes first),
    reads the deleted one all the same and is whole, without starting over."""
    rounds: list[list[str]] = []

    def progress(done: int, total: int) -> None:
        if not rounds:
            rounds.append(delete_oldest(writer))

    report = verify_read_only(writer.path, CONFIG, progress=progress)
    assert len(rounds) == 1
    assert report.ok, report.problems[:5]
    assert report.restarts == 0
    assert report.segments == len(segments(writer)) + 1
    assert rounds[0][0] not in segments(writer)


def scan_with_retention_before(
    writer: MessageStore, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A scan during which retention runs once, just before the scan's queue loader takes
    ``step``: the scan is whole, without starting over, and the oldest queue file is gone."""
    original = getattr(load.QueueLoader, step)
    rounds: list[list[str]] = []

    def delete_first(self: load.QueueLoader) -> None:
        rounds.append(delete_oldest(writer))
        original(self)

    monkeypatch.setattr(load.QueueLoader, step, delete_first)
    report = verify_read_only(writer.path, CONFIG)
    assert len(rounds) == 1 and not (writer.path / "consumequeue" / "T" / "0" / ("0" * 20)).exists()
    assert report.ok, report.problems[:5]
    assert report.restarts == 0 and report.records == MESSAGES


def test_a_scan_whose_queue_files_retention_deleted_before_it_listed_them(
    writer: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention runs after the scan took hold of the oldest segments and before it listed the
    queues' files: the records of the deleted segment are still read, their units' file is
    gone with them, and that is not a missing unit."""
    scan_with_retention_before(writer, monkeypatch, "list_files")


def test_a_scan_holds_the_queue_files_it_listed(
    writer: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention runs after the scan listed the queues' files and before it read them: the
    scan holds each queue's files but its last (those retention deletes) mapped from the
    listing on, reads the deleted ones all the same, and is whole, without starting over."""
    scan_with_retention_before(writer, monkeypatch, "load")


def test_a_scan_that_loses_a_file_starts_over(
    writer: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, in a store of more segments than a scan holds (here: none held): the scan
    loses the oldest segment, and the second one is whole."""
    monkeypatch.setattr(state, "PINNED_SEGMENTS", 0)
    rounds: list[list[str]] = []

    def progress(done: int, total: int) -> None:
        if not rounds:
            rounds.append(delete_oldest(writer))

    report = verify_read_only(writer.path, CONFIG, progress=progress)
    assert len(rounds) == 1
    assert report.ok, report.problems[:5]
    assert report.restarts == 1
    assert report.segments == len(segments(writer))
    assert rounds[0][0] not in segments(writer)


def test_verify_gives_up_after_its_attempts_naming_the_file(
    writer: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deleting under every scan: after ``attempts`` scans verify fails, naming the
    store and the file, and says what to do."""
    monkeypatch.setattr(state, "PINNED_SEGMENTS", 0)
    rounds: list[list[str]] = []
    last = [-1]

    def progress(done: int, total: int) -> None:
        # A scan's progress only grows: a tick below the last one is the next scan's first.
        if last[0] < 0 or done < last[0]:
            rounds.append(delete_oldest(writer))
        last[0] = done

    with pytest.raises(SegmentGoneError) as caught:
        verify_read_only(writer.path, CONFIG, progress=progress, attempts=2)
    text = str(caught.value)
    assert str(writer.path) in text and "2 scans" in text and rounds[-1][0] in text
    assert "writer is idle" in text and len(rounds) == 2


def test_the_cli_says_it_started_over(
    writer: MessageStore, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    conf = tmp_path / "store.toml"
    conf.write_text(
        "mappedFileSizeCommitLog = 16384\nmappedFileSizeConsumeQueue = 1280\n"
        "maxHashSlotNum = 101\nmaxIndexNum = 400\n"
    )
    code = main(["verify", str(writer.path), "--config", str(conf), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] and out["restarts"] == 0
