"""Checks of a store after an injected fault, for stores the crash writer's messages
(:mod:`tests.kit.crashdata`) went into: every acknowledged message intact and found by its key,
each message of the failed put stored once or not at all, and recovery run twice changing
nothing the second time."""

from __future__ import annotations

from pathlib import Path

from rocketstore.pipeline.cli import main as cli_main
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit.crashdata import GEOMETRY, expected, store_config
from tests.kit.files import snapshot

CONF = (
    f"mappedFileSizeCommitLog = {GEOMETRY['mapped_file_size_commitlog']}\n"
    f"mappedFileSizeConsumeQueue = {GEOMETRY['mapped_file_size_consume_queue']}\n"
    f"maxHashSlotNum = {GEOMETRY['max_hash_slot_num']}\n"
    f"maxIndexNum = {GEOMETRY['max_index_num']}\n"
)


def recorded(path: Path) -> int:
    progress = FlushProgress.read(path / "config")
    assert progress is not None
    return progress.flushed_offset


def recover_twice_identically(path: Path, tmp_path: Path) -> None:
    conf = tmp_path / "geometry.toml"
    conf.write_text(CONF)
    assert cli_main(["recover", str(path), "--config", str(conf), "--json"]) == 0
    first = snapshot(path, skip={"lock"})
    assert cli_main(["recover", str(path), "--config", str(conf), "--json"]) == 0
    assert snapshot(path, skip={"lock"}) == first


def check_store(path: Path, acked: list[tuple[int, int, list[int]]], in_flight: range) -> int:
    """Reopen and check; ``acked`` holds (first seq, count, CommitLog offsets) per put that
    returned, ``in_flight`` the seqs of the put that failed. Returns how many of those landed."""
    with MessageStore(path, store_config("ASYNC_FLUSH")) as store:
        report = verify(store, max_per_kind=None)
        assert report.ok, [str(p) for p in report.problems]
        for first, n, offsets in acked:
            for seq, phys in zip(range(first, first + n), offsets, strict=True):
                want = expected(seq)
                got = store.get_message(phys)
                assert (got.body, got.uniq_key) == (want.body, want.uniq_key)
                found = store.query_by_key(want.topic, want.key)
                assert [m.commit_log_offset for m in found] == [phys], seq
        landed = 0
        for seq in in_flight:
            want = expected(seq)
            hits = store.query_by_key(want.topic, want.uniq_key)
            assert len(hits) <= 1
            if hits:
                assert hits[0].body == want.body
                units = store.read_units(hits[0].topic, hits[0].queue_id, hits[0].queue_offset, 1)
                assert int(units[0]["offset"]) == hits[0].commit_log_offset
                landed += 1
        return landed
