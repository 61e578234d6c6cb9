"""A writable open with settings that do not fit the store's files is refused before anything
is touched: no ``abort`` file, no leftover removed, so the next open is a normal one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import NotAStoreError
from rocketstore.pipeline.format.message import Message
from tests.kit.files import snapshot

SMALL = StoreConfig(
    mapped_file_size_commitlog=4096,
    mapped_file_size_consume_queue=200,
    max_hash_slot_num=10,
    max_index_num=40,
)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A closed store written with SMALL (several segments), plus what a crash could leave: a
    half-created segment and an empty trailing one, which a writable open would remove."""
    path = tmp_path / "store"
    with MessageStore(path, SMALL) as s:
        s.put_batch([Message("T", b"x" * 300, keys=[f"k{i}"]) for i in range(30)])
    (path / "commitlog" / "00000000000000999999.creating").write_bytes(b"half")
    last = max(int(p.name) for p in (path / "commitlog").iterdir() if p.name.isdigit())
    (path / "commitlog" / f"{last + 4096:020d}").touch()
    return path


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            {"mapped_file_size_commitlog": 8192},
            "commitlog file is 4096 bytes, but mappedFileSizeCommitLog=8192",
        ),
        (
            {"mapped_file_size_consume_queue": 400},
            "consumequeue file is 200 bytes, but mappedFileSizeConsumeQueue=400",
        ),
        (
            {"max_index_num": 80},
            "index file is 880 bytes, but maxHashSlotNum=10 and maxIndexNum=80",
        ),
    ],
)
def test_a_refused_writable_open_touches_nothing(
    store: Path, change: dict[str, int], needle: str
) -> None:
    # The lock file's time is left out: the open takes the lock first (rewriting the same four
    # bytes, as RocketMQ does), so that no other writer changes the files while they are checked.
    before = snapshot(store, dirs=True, times=True, untimed={"lock"})
    wrong = dataclasses.replace(SMALL, **change)
    with pytest.raises(NotAStoreError, match=needle) as caught:
        MessageStore(store, wrong)
    assert "(from built-in defaults)" in str(caught.value)
    assert snapshot(store, dirs=True, times=True, untimed={"lock"}) == before
    assert not (store / "abort").exists()
    with MessageStore(store, SMALL) as again:
        assert not again.abort_file_found
        assert not again.recovery.abort_file_found
        assert again.max_offset("T", 0) == 30


def test_the_message_names_the_file_the_settings_came_from(store: Path, tmp_path: Path) -> None:
    conf = tmp_path / "other.toml"
    conf.write_text("mappedFileSizeCommitLog = 8192\n")
    with pytest.raises(NotAStoreError, match=f"from {conf}"):
        MessageStore(store, StoreConfig.load(conf))


def test_a_store_without_index_does_not_check_index_files(store: Path) -> None:
    no_index = dataclasses.replace(SMALL, max_index_num=80, message_index_enable=False)
    with MessageStore(store, no_index) as again:
        assert again.max_offset("T", 0) == 30
