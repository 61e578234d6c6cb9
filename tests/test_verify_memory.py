"""verify's memory is bounded by a stretch of the log, not by the store.

Each store is verified in a child process while this process samples the child's RssAnon from
``/proc/<pid>/status`` (from outside, so a long call that holds the GIL cannot hide a peak).
The child opens the store first and reports its baseline, so imports and the open are not
counted. A store twice as large, in twice as many small segments and index files, must not
make the peak grow by more than a small slack: keeping anything per record for the whole
store (the walk's columns alone are 52 bytes a record) would add far more than that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore

ROOT = Path(__file__).resolve().parents[1]
CONFIG = StoreConfig(
    mapped_file_size_commitlog=4 << 20,
    mapped_file_size_consume_queue=20_000 * 20,
    max_hash_slot_num=20_000,
    max_index_num=80_000,
)
RECORDS = 150_000
QUEUES = 4
SLACK = 6 << 20  # bytes: well under 52 bytes x RECORDS (7.8 MB), allocator noise over it

CHILD = """
import sys
from pathlib import Path
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.tools.verify.check import verify

config = StoreConfig(**eval(sys.argv[2]))
store = MessageStore(Path(sys.argv[1]), config, read_only=True)
print("ready", flush=True)
sys.stdin.readline()
report = verify(store)
print("done", report.ok, report.records, report.units, report.index_entries, flush=True)
sys.stdin.readline()
"""


def build(path: Path, n: int) -> None:
    ids = np.arange(n, dtype=np.int64)
    bodies = pc.binary_join_element_wise("body-", pa.array(ids).cast(pa.string()), "")
    table = pa.table(
        {
            "topic": pa.repeat(pa.scalar("mem", pa.string()), n),
            "body": bodies.cast(pa.binary()),
            "queueId": pa.array((ids % QUEUES).astype(np.int32)),
            "keys": pc.binary_join_element_wise("k-", pa.array(ids).cast(pa.string()), ""),
            "tags": pa.repeat(pa.scalar("t", pa.string()), n),
        }
    )
    with MessageStore(path, CONFIG) as store:
        for start in range(0, n, 50_000):
            store.put_batch(table.slice(start, 50_000))


def rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc status")


def peak_growth(path: Path, n: int) -> int:
    """Peak RssAnon of a child verifying ``path`` above its RssAnon once the store is open."""
    settings = {
        "mapped_file_size_commitlog": CONFIG.mapped_file_size_commitlog,
        "mapped_file_size_consume_queue": CONFIG.mapped_file_size_consume_queue,
        "max_hash_slot_num": CONFIG.max_hash_slot_num,
        "max_index_num": CONFIG.max_index_num,
    }
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), repr(settings)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().split() == ["ready"]
        base = rss_anon(child.pid)
        peak = base
        child.stdin.write("go\n")
        child.stdin.flush()
        os.set_blocking(child.stdout.fileno(), False)
        # A read of a non-blocking pipe may return part of the line: read until its end.
        line = ""
        while not line.endswith("\n"):
            peak = max(peak, rss_anon(child.pid))
            line += child.stdout.readline()
            time.sleep(0.0005)
        # The child waits for us after printing, so this sample still sees its memory.
        peak = max(peak, rss_anon(child.pid))
        assert line.split() == ["done", "True", str(n), str(n), str(2 * n)], line
        child.stdin.write("exit\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return peak - base


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_peak_memory_does_not_grow_with_the_store(tmp_path: Path) -> None:
    small, large = tmp_path / "small", tmp_path / "large"
    build(small, RECORDS)
    build(large, 2 * RECORDS)
    segments = len(list((large / "commitlog").iterdir()))
    index_files = len(list((large / "index").iterdir()))
    assert segments >= 8 and index_files >= 3  # the store really spans many files
    grow_small = peak_growth(small, RECORDS)
    grow_large = peak_growth(large, 2 * RECORDS)
    assert grow_large - grow_small < SLACK, (grow_small, grow_large)
