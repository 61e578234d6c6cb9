"""A real full disk: ``produce`` into a small tmpfs or a loop-mounted ext4 until it is full.

The writer must stop with a clear error (the file, "No space left on device", the free space)
and a non-zero exit, never die of SIGBUS; every acknowledged line must be readable after
``recover``, ``verify`` must be clean, and once space is freed the store takes writes again.
A failpoint cannot stand in here: a Python ``OSError`` is not the SIGBUS a sparse mapping gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocketstore.pipeline import layout
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import SegmentCreateError
from rocketstore.pipeline.files import failpoints, filesystem, indexfile, mappedfile
from rocketstore.pipeline.files.consumequeue import queue as consumequeue
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit.cli import run_cli
from tests.kit.produce import SMALL, stored_bodies, write_input
from tests.kit.realfs import real_fs

ROOT = Path(__file__).resolve().parent.parent

BALLAST = 3 << 20  # freed after the disk is full: room for another segment and its files
ROOM = 10 << 20  # free space left for the store beside the ballast: less than the input needs


def fill(mnt: Path) -> None:
    """Leave about ``ROOM`` + ``BALLAST`` bytes free on ``mnt``, whatever its size."""
    st = os.statvfs(mnt)
    extra = st.f_bavail * st.f_frsize - ROOM - BALLAST
    if extra > 0:
        (mnt / "filler").write_bytes(b"\2" * extra)
        os.sync()


def produce(store: Path, conf: Path, lines: Path) -> tuple[int, list[dict[str, object]], str]:
    proc = run_cli("produce", str(store), str(lines), "--config", str(conf))
    out = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    return proc.returncode, out, proc.stderr


@pytest.mark.parametrize(
    ("kind", "size_mib"),
    [("tmpfs", 6), ("tmpfs", 9), ("tmpfs", 13), ("ext4", 16), ("btrfs", 128)],
    ids=["tmpfs-6m", "tmpfs-9m", "tmpfs-13m", "ext4-16m", "btrfs-128m"],
)
def test_produce_until_full_then_free_space(tmp_path: Path, kind: str, size_mib: int) -> None:
    """On btrfs the store's files are written in place (NOCOW, see rocketstore.pipeline.files.filesystem); the
    image is filled to leave the store about ``ROOM`` bytes."""
    conf = tmp_path / "store.toml"
    conf.write_text(SMALL)
    config = StoreConfig.load(conf)
    lines = tmp_path / "in.jsonl"
    rows = write_input(lines, 0, 60_000)  # ~14 MB of records: more than any of these holds
    with real_fs(kind, size_mib) as mnt:
        fill(mnt)
        ballast = mnt / "ballast"
        ballast.write_bytes(b"\1" * BALLAST)
        store = mnt / "store"

        code, out, err = produce(store, conf, lines)
        assert code == 2, (code, err[-2000:])  # a negative code would be a signal (SIGBUS)
        assert "No space left on device" in err and "bytes free" in err, err
        assert f"{store}/" in err, err  # names the file it could not create or fill
        acked = [r for r in out if r["status"] == "PUT_OK"]
        refused = [r for r in out if r["status"] != "PUT_OK"]
        assert acked, "the disk was large enough for some messages"
        assert all(r["status"] == "NOT_STORED" for r in refused)
        assert [r["line"] for r in acked] == list(range(1, len(acked) + 1))

        # Recovery repairs the log whatever the free space; recording that it did needs a few
        # blocks, which a disk filled to the last block (btrfs keeps a reserve for its own
        # metadata) may not have: then a warning and exit 1, and the next open repeats it.
        fixed = run_cli("recover", str(store), "--config", str(conf), "--json")
        assert fixed.returncode == 0 or (
            fixed.returncode == 1 and "recovered, but" in fixed.stderr
        ), fixed.stderr[-2000:]
        check = run_cli("verify", str(store), "--config", str(conf))
        assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
        bodies = stored_bodies(store, config)
        assert len(bodies) == len(acked)
        for r in acked:
            row = rows[int(str(r["line"])) - 1]
            assert bodies[int(str(r["commitLogOffset"]))] == str(row["body"]).encode()

        # Space freed: the store takes the lines that were not stored.
        ballast.unlink()
        rest = tmp_path / "rest.jsonl"
        more = write_input(rest, len(acked), 2_000)
        code, out, err = produce(store, conf, rest)
        assert code == 0, err[-2000:]
        assert [r["status"] for r in out] == ["PUT_OK"] * len(more)
        assert run_cli("verify", str(store), "--config", str(conf)).returncode == 0
        assert len(stored_bodies(store, config)) == len(acked) + len(more)


def test_default_geometry_on_a_small_tmpfs_is_a_clear_error(tmp_path: Path) -> None:
    """The issue's case: 1 MiB CommitLog segments, RocketMQ's default ConsumeQueue (5.7 MiB)
    and IndexFile (420 MB) sizes, on a 6 MiB tmpfs. On tmpfs every file gets all its blocks
    when created (reading a hole of a mapping allocates there), so the first put cannot create
    its ConsumeQueue file: an error naming it, nothing stored, and no SIGBUS, also for the
    read-only open that reports the lines."""
    conf = tmp_path / "store.toml"
    conf.write_text("mappedFileSizeCommitLog = 1048576\n")
    lines = tmp_path / "in.jsonl"
    write_input(lines, 0, 5_000)
    with real_fs("tmpfs", 6) as mnt:
        code, out, err = produce(mnt / "store", conf, lines)
        assert code == 2, err[-2000:]
        assert "consumequeue" in err and "cannot create a file of 6,000,000 bytes" in err, err
        assert out and all(r["status"] == "NOT_STORED" for r in out)
        check = run_cli("verify", str(mnt / "store"), "--config", str(conf))
        assert check.returncode == 0, check.stdout[-2000:]


def test_a_first_put_larger_than_the_disk_leaves_a_store_that_opens(tmp_path: Path) -> None:
    """The first put into a new store needs more segments than fit (found by the sink into a
    full disk with one big chunk): its prepare step creates the segments that fit and fails on
    the next. Those empty segments must not take normal recovery's start (the third-last
    segment) past the log's end: the store reopens empty and takes a put once space is freed."""
    config = StoreConfig(mapped_file_size_commitlog=1 << 20, max_index_num=65536)
    with real_fs("ext4", 32) as mnt:
        ballast = mnt / "ballast"
        ballast.write_bytes(b"\1" * (14 << 20))
        batch = [Message("T", b"x" * 300, queue_id=i % 2, keys=f"k{i}") for i in range(45_000)]
        with MessageStore(mnt / "s", config) as store:
            with pytest.raises(SegmentCreateError, match="No space left on device"):
                store.put_batch(batch)
            assert store.max_phy_offset == 0
        assert len(list((mnt / "s" / "commitlog").iterdir())) >= 3
        ballast.unlink()
        with MessageStore(mnt / "s", config) as store:
            assert store.recovery.commitlog_end == 0
            store.put_batch(batch[:1000])
        with MessageStore(mnt / "s", config, read_only=True) as ro:
            got = ro.get_messages("T", 1, 0, 1000).messages
            assert [m.keys for m in got] == [[f"k{i}"] for i in range(1, 1000, 2)]
            assert verify(ro).ok


def test_files_on_a_disk_are_reserved_ahead_not_whole(tmp_path: Path) -> None:
    """On a file system where holes read as zeros (ext4), files stay sparse past the window
    reserved ahead of what was written: forty queues with one message each do not take
    RocketMQ's 5.7 MiB per ConsumeQueue file, nor the IndexFile its 420 MB."""
    config = StoreConfig(mapped_file_size_commitlog=64 << 20)
    with real_fs("ext4", 200) as mnt:
        with MessageStore(mnt / "s", config) as store:
            store.put_batch([Message("T", b"x" * 100, queue_id=q) for q in range(40)])
        segment = (mnt / "s" / "commitlog" / ("0" * 20)).stat().st_blocks * 512
        queues = [p.stat().st_blocks * 512 for p in (mnt / "s" / "consumequeue").rglob("0" * 20)]
        index = [p.stat().st_blocks * 512 for p in (mnt / "s" / "index").iterdir()]
    assert len(queues) == 40
    assert 0 < segment <= mappedfile.RESERVE_AHEAD
    assert all(0 < b <= consumequeue.RESERVE_AHEAD for b in queues), queues
    slots = layout.INDEX_HEADER_SIZE + layout.INDEX_SLOT_SIZE * config.max_hash_slot_num
    assert len(index) == 1 and slots <= index[0] <= slots + indexfile.RESERVE_AHEAD + 4096


def test_a_failed_reservation_changes_nothing(tmp_path: Path) -> None:
    """The ``reserve`` step fails (an injected ``ENOSPC``) for files larger than the window:
    the put is refused before its first byte, the store is unchanged and takes the next put."""
    config = StoreConfig(
        mapped_file_size_commitlog=16 << 20,
        mapped_file_size_consume_queue=400_000,
        max_hash_slot_num=1000,
        max_index_num=200_000,
    )
    body = b"y" * 1000
    with MessageStore(tmp_path / "s", config) as store:
        store.put_batch([Message("T", body, queue_id=0, keys=f"a{i}") for i in range(3000)])
        before = (store.max_phy_offset, store.max_offset("T", 0))
        for nth in range(1, 4):
            failpoints.arm("reserve", "raise", 1)
            try:
                with pytest.raises(SegmentCreateError, match="nothing"):
                    for _ in range(20):
                        store.put_batch([Message("T", body, queue_id=0) for _ in range(1000)])
                        before = (store.max_phy_offset, store.max_offset("T", 0))
            finally:
                failpoints.disarm_all()
            assert (store.max_phy_offset, store.max_offset("T", 0)) == before, nth
            assert store.failed is None
        store.put_batch([Message("T", b"after", queue_id=0)])
    with MessageStore(tmp_path / "s", config, read_only=True) as ro:
        last = ro.get_messages("T", 0, ro.max_offset("T", 0) - 1, 1).messages
        assert [m.body for m in last] == [b"after"]
    assert os.path.exists(tmp_path / "s" / "commitlog")


def test_store_files_on_btrfs_are_written_in_place(tmp_path: Path) -> None:
    """A writable open on btrfs gives the store's directories NOCOW, and the files it creates
    there inherit it: the reserved blocks are the ones their mapped writes use."""
    config = StoreConfig(mapped_file_size_commitlog=1 << 20)
    with real_fs("btrfs", 128) as mnt:
        with MessageStore(mnt / "s", config) as store:
            store.put_batch([Message("T", b"x" * 100, queue_id=0, keys="k")])
        made = [
            mnt / "s" / "commitlog" / ("0" * 20),
            mnt / "s" / "consumequeue" / "T" / "0" / ("0" * 20),
            *(mnt / "s" / "index").iterdir(),
        ]
        assert len(made) == 3
        for path in made:
            assert filesystem.nocow(path), path
        assert not filesystem.nocow(mnt / "s" / "config")


# Puts plain messages until the store refuses one, printing "offset n" for each acknowledged,
# then ends without closing the store (abort left), as a writer that dies does.
DYING_WRITER = """
import os, sys
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.engine.store import MessageStore

store = MessageStore(sys.argv[1], StoreConfig.load(sys.argv[2]), background=False)
n = 0
try:
    while True:
        body = f"{n:08d}-".encode() + b"x" * 190
        r = store.put(Message(f"T{n % 3}", body, queue_id=n % 4, keys=[f"k{n}"]))
        print(r.commit_log_offset, n, flush=True)
        n += 1
except Exception as exc:
    print(f"refused: {exc}", file=sys.stderr, flush=True)
os._exit(0)
"""


def test_an_unclean_store_on_a_full_tmpfs_is_cleaned_then_recovered(tmp_path: Path) -> None:
    """A writer on shared storage fills a small tmpfs and dies without closing; the rest of
    the volume is filled too. A writable open of that store must renew files and start a fresh
    segment, which needs space: ``recover`` fails, naming the way out and changing nothing.
    ``clean`` frees space without recovering (the oldest segments, forced above 85 % use);
    then ``recover`` succeeds, every acknowledged message still in the log reads back, and the
    store takes writes once the volume has room."""
    conf = tmp_path / "store.toml"
    conf.write_text(SMALL + 'sharedStorage = "shared"\n')
    config = StoreConfig.load(conf)
    with real_fs("tmpfs", 12) as mnt:
        store = mnt / "store"
        done = subprocess.run(
            [sys.executable, "-c", DYING_WRITER, str(store), str(conf)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0 and "No space left on device" in done.stderr, done.stderr
        acked = {int(off): int(n) for off, n in (ln.split() for ln in done.stdout.splitlines())}
        assert (store / "abort").exists()
        filler = mnt / "filler"
        with open(filler, "wb", buffering=0) as f, pytest.raises(OSError, match="No space left"):
            while True:
                f.write(b"\1" * 4096)

        before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
        refused = run_cli("recover", str(store), "--config", str(conf))
        assert refused.returncode == 2, refused.stderr
        assert "No space left on device" in refused.stderr
        assert f"`rocketstore clean {store}` deletes what retention allows" in refused.stderr
        assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before

        cleaned = run_cli("clean", str(store), "--config", str(conf), "--json")
        assert cleaned.returncode == 0, cleaned.stderr
        assert "was not closed cleanly: cleaned without recovering it" in cleaned.stderr
        report = json.loads(cleaned.stdout)
        gone = [f for f in report["files"] if f["kind"] == "commitlog"]
        assert gone and all(f["reason"] == "forced" for f in gone)
        low = report["commitLogMinOffsetAfter"]
        assert all(not Path(f["path"]).exists() for f in report["files"])

        fixed = run_cli("recover", str(store), "--config", str(conf))
        assert fixed.returncode == 0, fixed.stderr
        check = run_cli("verify", str(store), "--config", str(conf))
        assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
        bodies = stored_bodies(store, config)
        kept = {off: n for off, n in acked.items() if off >= low}
        assert kept and len(kept) < len(acked)
        assert {off: bodies.get(off) for off in kept} == {
            off: f"{n:08d}-".encode() + b"x" * 190 for off, n in kept.items()
        }

        # The store itself fills the volume: a clean of the recovered store frees more room.
        filler.unlink()
        assert run_cli("clean", str(store), "--config", str(conf)).returncode == 0
        lines = tmp_path / "more.jsonl"
        more = write_input(lines, len(acked), 500)
        code, out, err = produce(store, conf, lines)
        assert code == 0, err[-2000:]
        assert [r["status"] for r in out] == ["PUT_OK"] * len(more)
