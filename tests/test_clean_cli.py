"""The store's wiring of retention: puts refused on a full disk, `rocketstore clean`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from rocketstore.pipeline.cli import main
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import DiskFullError

CONFIG = StoreConfig(
    mapped_file_size_commitlog=16 * 1024,
    mapped_file_size_consume_queue=20 * 20,
    max_hash_slot_num=31,
    max_index_num=100,
)
TOML = (
    "mappedFileSizeCommitLog = 16384\nmappedFileSizeConsumeQueue = 400\n"
    "maxHashSlotNum = 31\nmaxIndexNum = 100\n"
)


def table(n: int) -> pa.Table:
    return pa.table(
        {"topic": ["T"] * n, "body": [b"x" * 200] * n, "keys": [f"k{i}" for i in range(n)]}
    )


def test_a_full_disk_refuses_puts_and_loses_nothing(tmp_path: Path) -> None:
    usage = {"ratio": 0.5}
    with MessageStore(tmp_path / "s", CONFIG, disk_usage=lambda p: usage["ratio"]) as store:
        store.put_batch(table(10))
        usage["ratio"] = 0.95
        assert store.retention is not None
        store.retention.refresh()
        end = store.max_phy_offset
        with pytest.raises(DiskFullError, match="90"):
            store.put_batch(table(5))
        assert store.max_phy_offset == end
        usage["ratio"] = 0.80
        store.retention.refresh()
        store.put_batch(table(5))
        assert store.max_offset("T", 0) == 15


def test_clean_command_dry_run_then_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s"
    with MessageStore(path, CONFIG) as store:
        for _ in range(8):
            store.put_batch(table(40))
    segs = sorted((path / "commitlog").iterdir())
    assert len(segs) > 4
    old = 1_000_000  # 1970: long expired
    for seg in segs[:3]:
        os.utime(seg, (old, old))
    conf = tmp_path / "store.toml"
    conf.write_text(TOML)
    before = {p: p.stat().st_size for p in path.rglob("*") if p.is_file()}
    assert main(["clean", str(path), "--config", str(conf), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    planned = {f["path"] for f in plan["files"] if f["kind"] == "commitlog"}
    assert planned == {str(s) for s in segs[:3]}
    assert {p: p.stat().st_size for p in path.rglob("*") if p.is_file()} == before
    assert main(["clean", str(path), "--config", str(conf)]) == 0
    out = capsys.readouterr().out
    assert "deleted" in out
    assert sorted((path / "commitlog").iterdir()) == segs[3:]
    with MessageStore(path, CONFIG, read_only=True) as store:
        q = store.queue_infos("T")[0]
        assert q.min_offset > 0 and q.max_offset == 320
        got = store.get_messages("T", 0, 0, 10)
        assert got.status == "OFFSET_TOO_SMALL" and got.next_begin_offset == q.min_offset
        assert len(store.get_messages("T", 0, q.min_offset, 1000).messages) == 320 - q.min_offset
