"""pipeline/engine/fencing.py: a writer that lost the store's lock writes nothing more, and recovery
and ``verify`` treat what such a writer left in a dead region as not data.

A lost lock is made the way a shared file system loses it: the lock is dropped on the writer's
own descriptor while the writer goes on holding the store open (GlusterFS's servers drop a
cut-off client's locks; the client reopens without them after the heal). The new writer runs in
another process, as on another host. ``tests/test_partition.py`` does the same across network
namespaces on GlusterFS.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import fencing
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import DamagedLogError, FencedError
from rocketstore.pipeline.files import lock as lock_module
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit.fencing import (
    CONFIG,
    SEGMENT,
    TOPIC,
    Taker,
    abandon,
    bodies,
    expected,
    lose_lock,
    put_a,
)


@pytest.mark.parametrize("taker_still_holds", [True, False], ids=["held", "released"])
def test_a_writer_that_lost_its_lock_writes_nothing(
    tmp_path: Path, taker_still_holds: bool
) -> None:
    store = MessageStore(tmp_path, CONFIG)
    put_a(store, 0, 50)
    store.flush()
    lose_lock(store)
    taker = Taker(tmp_path, 300)  # crosses segments: the take-over starts a fresh one
    if not taker_still_holds:
        taker.close()
    before = {p.name: p.read_bytes() for p in (tmp_path / "commitlog").iterdir()}
    # Puts, batch puts, flushes and retention are refused; the error says why.
    with pytest.raises(FencedError, match="no longer owns the store") as info:
        store.put(Message(TOPIC, b"late", queue_id=0))
    reason = "another writer holds its lock" if taker_still_holds else "epoch 1 was taken"
    assert reason in str(info.value)
    with pytest.raises(FencedError):
        store.put_batch([Message(TOPIC, b"late", queue_id=1)])
    with pytest.raises(FencedError):
        store.flush(force=True)
    with pytest.raises(FencedError):
        store.close()
    after = {p.name: p.read_bytes() for p in (tmp_path / "commitlog").iterdir()}
    assert after == before
    # A fenced writer holds nothing: the next writer gets the store at once.
    assert not lock_module.is_locked_elsewhere(tmp_path) or taker_still_holds
    if taker_still_holds:
        taker.close()
    assert bodies(tmp_path) == expected(50, 300)
    epochs = fencing.read_epochs(tmp_path)
    assert [e.epoch for e in epochs] == [0, 1]
    # The first writer never closed: the taker started at a segment of its own.
    assert epochs[1].start % SEGMENT == 0 and epochs[1].start > epochs[1].fenced_end
    assert min(taker.offsets) == epochs[1].start
    with MessageStore(tmp_path, CONFIG, read_only=True) as ro:
        assert verify(ro).ok


def test_recovery_restores_what_an_unfenced_writer_left_in_the_dead_region(tmp_path: Path) -> None:
    """The first writer's late writes (here: a writer with no fencing at all, as before it
    existed) land in the dead region; recovery drops them and keeps every one of the taker's
    acknowledged messages, and verify names the region until then."""
    store = MessageStore(tmp_path, CONFIG)
    put_a(store, 0, 50)
    store.flush()
    lose_lock(store)
    taker = Taker(tmp_path, 300)
    taker.close()
    dead = fencing.read_epochs(tmp_path)[1]
    store._fence = None  # what the store did before fencing: write on regardless
    late = put_a(store, 50, 80)
    store.flush()
    abandon(store)
    assert all(dead.fenced_end <= off < dead.start for off in late)
    with MessageStore(tmp_path, CONFIG, read_only=True) as ro:
        kinds = {p.kind for p in verify(ro).problems}
    assert "commitlog-fenced-writer" in kinds
    # The late writer's published point went over the taker's: readers stop there now.
    assert bodies(tmp_path) != expected(50, 300)
    with MessageStore(tmp_path, CONFIG) as fresh:
        report = fresh.recovery
        assert report.fenced_bytes > 0 and report.fenced_regions == [[dead.fenced_end, dead.start]]
        assert report.bytes_truncated == 0
    assert bodies(tmp_path) == expected(50, 300)
    with MessageStore(tmp_path, CONFIG, read_only=True) as ro:
        result = verify(ro)
        assert result.ok, [str(p) for p in result.problems]
    # Recovery is exact: a second run changes nothing.
    with MessageStore(tmp_path, CONFIG) as again:
        assert again.recovery.fenced_bytes == 0 and again.recovery.bytes_truncated == 0


def test_recovery_refuses_to_cut_valid_records_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another writer's records over the middle of this one's (no dead region between them):
    the walk stops inside the log with valid records after it. Cutting there would drop them,
    so recovery refuses and leaves every file as it was."""
    cfg = StoreConfig(mapped_file_size_commitlog=1 << 20, max_hash_slot_num=64, max_index_num=4096)
    with MessageStore(tmp_path, cfg) as store:
        acked = [
            store.put(Message(TOPIC, b"x" * (100 + i % 7), keys=[f"k{i}"])) for i in range(400)
        ]
    seg = tmp_path / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    # A shorter record written at record 100's place, as an overlapping writer would.
    at = acked[100].commit_log_offset
    data[at : at + 150] = data[acked[0].commit_log_offset : acked[0].commit_log_offset + 150]
    seg.write_bytes(bytes(data))
    # As after a crash before any flush recorded a point past the damage.
    (tmp_path / "abort").touch()
    (tmp_path / "config" / "rocketstore.json").unlink()
    snapshot = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(DamagedLogError, match="a valid record follows at offset"):
        MessageStore(tmp_path, cfg)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == snapshot
    # The command line says the same, exits 2 and changes nothing either.
    settings = tmp_path.parent / f"{tmp_path.name}.toml"
    settings.write_text(
        f"mappedFileSizeCommitLog = {1 << 20}\nmaxHashSlotNum = 64\nmaxIndexNum = 4096\n"
    )
    rc = cli.main(["recover", str(tmp_path), "--config", str(settings)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "a valid record follows at offset" in err and "--cut-at-damage" in err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == snapshot
    # Asked to, it cuts at the damage and says where valid records resumed.
    rc = cli.main(
        ["recover", str(tmp_path), "--config", str(settings), "--json", "--cut-at-damage"]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert (
        report["commitLogEnd"] == at and report["damageResumesAt"] == acked[101].commit_log_offset
    )
    with MessageStore(tmp_path, cfg, read_only=True) as ro:
        assert verify(ro).ok


# -- the epochs file --------------------------------------------------------------------------


def test_the_epochs_file_is_made_whole_and_padded(tmp_path: Path) -> None:
    """The first writer creates the file at its least size (zeros after the slot), under a
    temporary name of its own that it then drops, and removes one an earlier creation that
    crashed left; each writer after it writes its slot in place."""
    (tmp_path / "config").mkdir()
    leftover = tmp_path / "config" / f"{fencing.FILE_NAME}.4242.creating"
    leftover.write_bytes(b"a crashed creation's")
    with MessageStore(tmp_path, CONFIG):
        pass
    with MessageStore(tmp_path, CONFIG):
        pass
    data = fencing.path_of(tmp_path).read_bytes()
    assert len(data) == fencing.MIN_SIZE
    assert [e.epoch for e in fencing.parse(data)] == [0, 1]
    assert not any(data[2 * fencing.SLOT.size :])
    assert sorted(
        p.name for p in (tmp_path / "config").iterdir() if fencing.FILE_NAME in p.name
    ) == [fencing.FILE_NAME]


def test_an_older_versions_epochs_file_is_read_and_padded_by_the_next_writer(
    tmp_path: Path,
) -> None:
    """A file an older version wrote is its slots and nothing more, here with a torn append
    after them: the next writer records its epoch after the whole slots, zeros the torn bytes
    after its own and pads the file."""
    with MessageStore(tmp_path, CONFIG):
        pass
    with MessageStore(tmp_path, CONFIG):
        pass
    path = fencing.path_of(tmp_path)
    slots = path.read_bytes()[: 2 * fencing.SLOT.size]
    torn = fencing.Epoch(2, 0, 0, 0, 0).pack()[:30]
    path.write_bytes(slots + torn + slots[: fencing.SLOT.size])  # a slot, then bytes after it
    assert [e.epoch for e in fencing.read_epochs(tmp_path)] == [0, 1]
    with MessageStore(tmp_path, CONFIG):
        pass
    data = path.read_bytes()
    assert len(data) == fencing.MIN_SIZE
    assert data[: 2 * fencing.SLOT.size] == slots
    epochs = fencing.parse(data)
    assert [e.epoch for e in epochs] == [0, 1, 2] and epochs[2].pid == os.getpid()
    assert not any(data[3 * fencing.SLOT.size :])
