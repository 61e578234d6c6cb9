"""verify beside a running writer, and after a writer stopped without closing the store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rocketstore.pipeline.cli import main
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools.verify import state
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit import PROCS
from tests.kit.powercut import abandon

CONF = """\
mappedFileSizeCommitLog = 262144
mappedFileSizeConsumeQueue = 4000
maxHashSlotNum = 101
maxIndexNum = 2000
"""


def test_verify_while_a_writer_appends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    conf = tmp_path / "store.toml"
    conf.write_text(CONF)
    writer = subprocess.Popen(
        [sys.executable, str(PROCS / "live_writer.py"), str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline().strip() == "ready"
        ends = []
        for _ in range(4):
            code = main(["verify", str(store), "--config", str(conf), "--json"])
            report = json.loads(capsys.readouterr().out)
            assert code == 0 and report["problems"] == [], report["problems"][:5]
            assert report["snapshotEnd"] is not None  # bounded: a writer holds the lock
            ends.append(report["snapshotEnd"])
        writer.stdin.write("stop\n")
        writer.stdin.flush()
        written = int(writer.stdout.readline())
    finally:
        writer.stdin.close()  # type: ignore[union-attr]
        writer.wait(timeout=120)
    assert writer.returncode == 0
    # The writer did append while verify ran (every scan saw a later durable point or the
    # same one), and the closed store verifies whole.
    assert ends == sorted(ends)
    code = main(["verify", str(store), "--config", str(conf), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["snapshotEnd"] is None
    assert report["counters"]["records"] == written > 50


SMALL = StoreConfig(
    mapped_file_size_commitlog=64 * 1024,
    mapped_file_size_consume_queue=20 * 50,
    max_hash_slot_num=101,
    max_index_num=300,
)


@pytest.mark.parametrize("read_first", [False, True], ids=["not-loaded", "loaded-before"])
def test_verify_of_a_view_opened_before_the_writer_appended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_first: bool
) -> None:
    """A view opens; the writer then rolls a queue into a new ConsumeQueue file, makes a new
    queue, and flushes; then the view is verified. The scan's snapshot (the progress file) and
    the files it checks must be the same store: before, the queue loaded at the open kept its
    file list from then, the new queue was unknown to the view, and verify reported their units
    missing. The writer is in this process, so the scan is told another one holds the lock."""
    monkeypatch.setattr(state, "is_locked_elsewhere", lambda _path: True)
    path = tmp_path / "s"
    with MessageStore(path, SMALL, background=False) as writer:
        writer.put_batch([Message("T", b"old %d" % i, keys=f"k{i}") for i in range(40)])
        writer.flush()
        with MessageStore(path, SMALL, read_only=True) as view:
            if read_first:
                assert len(view.get_messages("T", 0, 0, 100).messages) == 40
            writer.put_batch([Message("T", b"new %d" % i) for i in range(30)])
            writer.put_batch([Message("NEW", b"queue %d" % i, queue_id=1) for i in range(5)])
            writer.flush()
            report = verify(view)
    assert report.problems == []
    assert report.snapshot_end is not None


def test_missing_entries_after_a_crash_say_recover_repairs_them(tmp_path: Path) -> None:
    """A writer that stopped after writing records but before indexing them (emulated: the
    index is cut back to the durable point, then the writer is abandoned with ``abort`` left)."""
    config = StoreConfig(
        mapped_file_size_commitlog=64 * 1024,
        mapped_file_size_consume_queue=20 * 50,
        max_hash_slot_num=101,
        max_index_num=300,
    )
    path = tmp_path / "s"
    # No background flusher: one running between the second batch and the abandon would
    # record a durable point past it, and its records would no longer be past that point.
    store = MessageStore(path, config, background=False)
    store.put_batch([Message("T", b"a%d" % i, keys=[f"a{i}"]) for i in range(10)])
    store.flush()
    durable = store.max_phy_offset
    store.put_batch([Message("T", b"b%d" % i, keys=[f"b{i}"]) for i in range(5)])
    assert store.index is not None
    store.index.truncate_from(
        durable, lambda phys: store.commitlog.store_timestamp(phys, record.FIXED_SIZE_V4)
    )
    store.index.flush()
    abandon(store)
    with MessageStore(path, config, read_only=True) as ro:
        report = verify(ro)
    missing = [p for p in report.problems if p.kind == "index-missing-entry"]
    assert {p.kind for p in report.problems} == {"index-missing-entry"}
    assert len(missing) == 10  # five records, each with its UNIQ_KEY and one key
    for p in missing:
        assert f"past the durable point {durable}" in p.detail, p.detail
        assert "`rocketstore recover` (or the next writable open) repairs it" in p.detail
    with MessageStore(path, config) as store:
        assert [m.body for m in store.query_by_key("T", "b3")] == [b"b3"]
    with MessageStore(path, config, read_only=True) as ro:
        assert verify(ro).ok
