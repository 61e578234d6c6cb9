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

import rocketstore.pipeline
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import ProgressNotRecordedError, StoreError, StoreFailedError
from rocketstore.pipeline.files import failpoints
from tests.kit import PROCS
from tests.kit.crashdata import batch_table, store_config
from tests.kit.faultcheck import check_store, recorded, recover_twice_identically

WRITER = PROCS / "crash_writer.py"
PIPELINE_ROOT = Path(rocketstore.pipeline.__file__).resolve().parent.parent
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
