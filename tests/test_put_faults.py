"""A fault at every write step of a put, as an exception in the process and as a kill -9 at that
exact point (a failpoint in a writer subprocess): the store never ends up damaged.

After each fault the store is reopened; then ``verify`` finds nothing wrong, every acknowledged
message is readable at its offset and found by its keys, a message of the failed put is either
wholly there or wholly absent, and two ``rocketstore recover`` runs leave identical bytes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from crash_writer import GEOMETRY, batch_table, expected, store_config

import rocketstore.pipeline
from rocketstore.pipeline import failpoints
from rocketstore.pipeline.cli import main as cli_main
from rocketstore.pipeline.errors import ProgressNotRecordedError, StoreError, StoreFailedError
from rocketstore.pipeline.progress import FlushProgress
from rocketstore.pipeline.store import MessageStore
from rocketstore.pipeline.verify import verify

WRITER = Path(__file__).resolve().with_name("crash_writer.py")
PIPELINE_ROOT = Path(rocketstore.pipeline.__file__).resolve().parent.parent
CONF = (
    f"mappedFileSizeCommitLog = {GEOMETRY['mapped_file_size_commitlog']}\n"
    f"mappedFileSizeConsumeQueue = {GEOMETRY['mapped_file_size_consume_queue']}\n"
    f"maxHashSlotNum = {GEOMETRY['max_hash_slot_num']}\n"
    f"maxIndexNum = {GEOMETRY['max_index_num']}\n"
)
# Steps a put reaches: each with the hit of it that fails (later hits reach rolled files).
PUT_STEPS = [
    ("segment-create", 1),
    ("segment-create", 3),
    ("commitlog-write", 1),
    ("commitlog-write", 2),
    ("consumequeue-append", 1),
    ("consumequeue-append", 4),
    ("index-put", 1),
    ("index-put", 2),
    ("flush", 1),
    ("progress-write", 1),
    ("checkpoint-write", 1),
]
# For the writer subprocess: which hit kills it, late enough that some puts were acknowledged.
KILL_STEPS = [
    ("segment-create", 25),
    ("segment-create", 40),
    ("commitlog-write", 12),
    ("consumequeue-append", 30),
    ("consumequeue-append", 47),
    ("index-put", 12),
    ("flush", 3),
    ("progress-write", 3),
    ("checkpoint-write", 3),
]


@pytest.fixture(autouse=True)
def _disarm() -> None:
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()


def store_files(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != "lock"
    }


def recorded(path: Path) -> int:
    progress = FlushProgress.read(path / "config")
    assert progress is not None
    return progress.flushed_offset


def recover_twice_identically(path: Path, tmp_path: Path) -> None:
    conf = tmp_path / "geometry.toml"
    conf.write_text(CONF)
    assert cli_main(["recover", str(path), "--config", str(conf), "--json"]) == 0
    first = store_files(path)
    assert cli_main(["recover", str(path), "--config", str(conf), "--json"]) == 0
    assert store_files(path) == first


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


@pytest.mark.parametrize(("step", "nth"), PUT_STEPS, ids=[f"{s}@{n}" for s, n in PUT_STEPS])
def test_fault_in_process_then_recovers_exactly(tmp_path: Path, step: str, nth: int) -> None:
    path = tmp_path / "store"
    acked: list[tuple[int, int, list[int]]] = []
    seq = 1
    # Only the test's own flushes run: a put flushes by itself once a flush interval passed
    # since the last, which on a loaded machine would take the one failure armed below.
    config = dataclasses.replace(store_config("ASYNC_FLUSH"), flush_interval_commitlog=3_600_000)
    store = MessageStore(path, config)
    try:
        for n in (40, 90, 130):
            result = store.put_batch(batch_table(seq, n))
            acked.append((seq, n, result.commit_log_offsets.tolist()))
            seq += n
        store.flush()
        failpoints.arm(step, "raise", nth)
        failed_at = seq
        with pytest.raises(StoreError) as info:
            for n in (170, 170, 170, 170):
                result = store.put_batch(batch_table(seq, n))
                acked.append((seq, n, result.commit_log_offsets.tolist()))
                seq += n
                store.flush()
        failed = range(seq, seq + 170)
        assert seq >= failed_at
        if isinstance(info.value, StoreFailedError):
            # Fail-stop: no more writes until the store is reopened.
            with pytest.raises(StoreFailedError):
                store.put_batch(batch_table(10**6, 1))
        elif isinstance(info.value, ProgressNotRecordedError):
            # The files were flushed; only the record of how far failed. Puts go on, and the
            # next flush records the point the failed one could not.
            assert step in ("progress-write", "checkpoint-write")
            if step == "progress-write":
                assert recorded(path) < store.max_phy_offset
            result = store.put_batch(batch_table(10**6, 5))
            acked.append((10**6, 5, result.commit_log_offsets.tolist()))
            store.flush()
            assert recorded(path) == store.max_phy_offset
        else:
            # Failed before its first byte: the store is unchanged and still takes puts.
            assert step == "segment-create"
            result = store.put_batch(batch_table(10**6, 5))
            acked.append((10**6, 5, result.commit_log_offsets.tolist()))
    finally:
        failpoints.disarm_all()
        store.close()
    check_store(path, acked, failed)
    recover_twice_identically(path, tmp_path)


def read_acks(acks: Path) -> list[tuple[int, int, list[int]]]:
    out = []
    for line in acks.read_text().splitlines(keepends=True):
        if line.endswith("\n"):
            entry = json.loads(line)
            out.append((entry["first"], entry["n"], entry["offsets"]))
    return out


def in_flight(intents: Path, acked: list[tuple[int, int, list[int]]]) -> range:
    lines = intents.read_text().splitlines()
    if len(lines) <= len(acked):
        return range(0)
    first, n = map(int, lines[len(acked)].split())
    return range(first, first + n)


@pytest.mark.slow
@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
@pytest.mark.parametrize(("step", "nth"), KILL_STEPS, ids=[f"{s}@{n}" for s, n in KILL_STEPS])
def test_kill9_at_each_write_step_then_recover(
    tmp_path: Path, step: str, nth: int, flush: str
) -> None:
    path, acks, intents = tmp_path / "store", tmp_path / "acks", tmp_path / "intents"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(PIPELINE_ROOT), os.environ.get("PYTHONPATH")])
        ),
        failpoints.ENV: f"{step}=kill@{nth}",
    }
    proc = subprocess.run(
        [
            *(sys.executable, str(WRITER), str(path), str(acks), str(intents)),
            *("--flush", flush, "--seed", "11", "--max-puts", "5000"),
        ],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    acked = read_acks(acks)
    assert acked, "the writer died before its first acknowledgement"
    check_store(path, acked, in_flight(intents, acked))
    recover_twice_identically(path, tmp_path)
