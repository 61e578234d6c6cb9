"""`rocketstore queues`, `topics` and `lag` on a store of thousands of queues: what each reads
follows what it shows, counted (queues loaded, queue files read), not timed.

* ``queues`` reads one file per queue, a page or less of it, and loads none
  (:meth:`ConsumeQueue.peek`): the bounds are those a load finds, also where the
  recorded lengths are behind the files (a writer appended since its last flush) or retention
  deleted the records of a queue's first units (then the queue is loaded);
* ``topics`` reads no queue's files at all (the directories say which queues there are);
* ``lag`` reads the queues of the topics it shows only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocketstore.pipeline.cli import main
from rocketstore.pipeline.engine.results import QueueInfo
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue, Peek
from tests.kit.manyqueues import QUICK, build, table

CONFIG = QUICK
TOPICS = 500  # 2,000 queues
PER_QUEUE = 3


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build(tmp_path_factory.mktemp("many") / "store", TOPICS, PER_QUEUE, CONFIG)
    (path.parent / "store.toml").write_text(
        f"mappedFileSizeCommitLog = {CONFIG.mapped_file_size_commitlog}\n"
        f"maxHashSlotNum = {CONFIG.max_hash_slot_num}\n"
        f"maxIndexNum = {CONFIG.max_index_num}\n"
    )
    return path


def cli(store: Path, *args: str) -> int:
    return main([*args[:1], str(store), *args[1:], "--config", str(store.parent / "store.toml")])


def loaded_bounds(path: Path) -> list[QueueInfo]:
    """Every queue's bounds with every queue loaded (the reference)."""
    with MessageStore(path, CONFIG, read_only=True) as s:
        out = []
        for (topic, qid), cq in sorted(s.queues.items()):
            assert cq.segments is not None  # loads it
            out.append(QueueInfo(topic, qid, cq.min_offset, cq.max_offset, cq.max_physic_offset))
        assert s.work.queues_loaded == len(out)
        return out


class Looks:
    """Counts the queues loaded and peeked at while installed (any store of the process)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loads = 0
        self.peeks: list[str] = []
        load, peek = ConsumeQueue._load, ConsumeQueue.peek

        def counted_load(cq: ConsumeQueue, length: int | None) -> object:
            self.loads += 1
            return load(cq, length)

        def counted_peek(cq: ConsumeQueue, min_offset: int, log_end: int) -> Peek | None:
            self.peeks.append(cq.topic)
            return peek(cq, min_offset, log_end)

        monkeypatch.setattr(ConsumeQueue, "_load", counted_load)
        monkeypatch.setattr(ConsumeQueue, "peek", counted_peek)


def test_queue_bounds_read_one_file_each_and_load_no_queue(store: Path) -> None:
    with MessageStore(store, CONFIG, read_only=True) as s:
        s.work.reset()
        infos = s.queue_infos()
        assert s.work.queues_loaded == 0
        assert s.work.queues_peeked == TOPICS * 4
        assert not any(cq.loaded for cq in s.queues.values())
    assert infos == loaded_bounds(store)
    assert {(i.min_offset, i.max_offset) for i in infos} == {(0, PER_QUEUE)}


def test_bounds_past_the_recorded_lengths_are_found_by_loading(tmp_path: Path) -> None:
    """A writer appended after its last flush: the recorded lengths are behind, the unit at
    each of them is valid, so the queues it wrote are loaded (by the open's recovery, or
    :meth:`ConsumeQueue.peek` declines) and their real ends found."""
    path = build(tmp_path / "store", 50, PER_QUEUE, CONFIG)
    with MessageStore(path, CONFIG, background=False) as writer:
        writer.put_batch(table(10, 2, start=10_000))  # topics T00000..T00009 only
        with MessageStore(path, CONFIG, read_only=True) as s:
            # Looked at by the open's recovery (the writer has not closed the store).
            assert sum(cq.loaded for cq in s.queues.values()) == 40
            s.work.reset()
            infos = s.queue_infos()
            assert s.work.queues_loaded == 0 and s.work.queues_peeked == 160
        assert infos == loaded_bounds(path)
        assert {i.max_offset for i in infos if i.topic < "T00010"} == {PER_QUEUE + 2}
        assert {i.max_offset for i in infos if i.topic >= "T00010"} == {PER_QUEUE}


def test_bounds_after_retention_deleted_the_first_records(tmp_path: Path) -> None:
    """The first CommitLog segment is gone: queues whose first unit pointed into it are loaded
    and their min offset moved past it, as a load moves it; the others are read at once."""
    path = build(tmp_path / "store", TOPICS, PER_QUEUE, CONFIG)
    segments = sorted((path / "commitlog").iterdir())
    assert len(segments) >= 2
    segments[0].unlink()
    with MessageStore(path, CONFIG, read_only=True) as s:
        s.work.reset()
        infos = s.queue_infos()
        moved = [i for i in infos if i.min_offset > 0]
        assert moved and s.work.queues_loaded == len(moved)
        assert s.work.queues_peeked == len(infos) - len(moved)
    assert infos == loaded_bounds(path)


def test_topics_reads_no_queue(
    store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    looks = Looks(monkeypatch)
    assert cli(store, "topics", "--json") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == TOPICS and {r["diskQueues"] for r in rows} == {4}
    assert looks.loads == 0 and looks.peeks == []


def test_lag_reads_the_queues_of_the_topics_it_shows(
    store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (store / "config" / "consumerOffset.json").write_text(
        json.dumps({"offsetTable": {"T00007@g1": {"0": 1, "1": 2, "2": 3, "3": 0}}})
    )
    looks = Looks(monkeypatch)
    try:
        assert cli(store, "lag", "--json") == 0
    finally:
        (store / "config" / "consumerOffset.json").unlink()
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["queueId"], r["lag"]) for r in rows] == [(0, 2), (1, 1), (2, 0), (3, 3)]
    assert looks.loads == 0 and looks.peeks == ["T00007"] * 4
