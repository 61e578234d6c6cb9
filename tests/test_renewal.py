"""pipeline/engine/renewal.py: after an unclean take-over on shared storage, the derived files the
writer before may still have dirty pages of get new inodes, so that its late write-back lands
on none of the new writer's files.

A late write-back is made the way a host's kernel makes it: through the first writer's own
mappings, which it set up before the take-over, after the new writer has written. On a local
file system, as on GlusterFS (``tests/test_netcluster.py``), such a write reaches the inode the
mapping was made of. Storage is declared shared (``sharedStorage=shared``) to run that path on
a local disk.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import renewal
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import FencedError, RenewalError
from rocketstore.pipeline.files import durability, fileio
from rocketstore.pipeline.files.filecreation import TMP_SUFFIX
from rocketstore.pipeline.files.mappedfile import MappedFile
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit.fencing import (
    CONFIG,
    QUEUES,
    TOPIC,
    Taker,
    abandon,
    bodies,
    expected,
    lose_lock,
    put_a,
)

ROOT = Path(__file__).resolve().parent.parent
UNITS_PER_FILE = CONFIG.mapped_file_size_consume_queue // 20


def put_b(store: MessageStore, count: int) -> None:
    for i in range(count):
        store.put(Message(TOPIC, f"B-{i}".encode(), queue_id=i % QUEUES, keys=[f"b{i}"]))


def inodes(path: Path) -> dict[str, int]:
    """The inode of each data file (the ones in ``config/`` are replaced by a rename anyway)."""
    return {
        str(p.relative_to(path)): p.stat().st_ino
        for p in [path / "checkpoint", *(path / "consumequeue").rglob("*"),
                  *(path / "index").iterdir(), *(path / "commitlog").iterdir()]
        if p.is_file()
    }  # fmt: skip


def tails(store: MessageStore) -> list[MappedFile]:
    """The first writer's mappings of its newest ConsumeQueue files and IndexFile, mapped now."""
    files = [cq.segments.files[-1] for cq in store.queues.values()]
    assert store.index is not None
    files.append(store.index.files[-1]._mf)
    for mf in files:
        assert len(mf.buffer)  # mapped: a late write-back goes to the inode mapped here
    return files


def write_back(files: list[MappedFile], pages: list[bytes]) -> None:
    """What the first writer's kernel does after the heal: its pages go out, as it had them."""
    for mf, page in zip(files, pages, strict=True):
        mf.buffer[: len(page)] = page
        mf.sync_range(0, len(page))


@pytest.mark.parametrize("renew", [True, False], ids=["renewed", "in-place"])
def test_late_pages_of_the_writer_before_reach_no_file_of_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, renew: bool
) -> None:
    a = MessageStore(tmp_path, CONFIG)
    put_a(a, 0, 60)
    a.flush()
    put_a(a, 60, 80)  # written, not flushed: what a writer cut off while busy has
    files = tails(a)
    pages = [bytes(mf.buffer[: mf.size]) for mf in files]
    abandon(a)  # cut off: no flush, no close; its mappings stay
    if not renew:
        monkeypatch.setattr(renewal, "renew_derived", lambda *args: 0)
    b = MessageStore(tmp_path, CONFIG)
    put_b(b, 300)
    b.flush()
    write_back(files, pages)
    b.close()
    with MessageStore(tmp_path, CONFIG, read_only=True) as ro:
        problems = [p.kind for p in verify(ro).problems]
    if renew:
        assert problems == []
        assert bodies(tmp_path) == expected(80, 300)
    else:
        # Without new inodes the pages land over the new writer's units and index header.
        assert problems
    for mf in files:
        mf.close()


def test_unclean_takeover_on_shared_storage_renews_the_tails_with_the_same_bytes(
    tmp_path: Path,
) -> None:
    a = MessageStore(tmp_path, CONFIG)
    put_a(a, 0, UNITS_PER_FILE * QUEUES + 40)  # every queue past its first file
    a.flush()
    index_at_flush = sorted(p.name for p in (tmp_path / "index").iterdir())
    put_a(a, UNITS_PER_FILE * QUEUES + 40, UNITS_PER_FILE * QUEUES + 60)
    abandon(a)
    index_now = sorted(p.name for p in (tmp_path / "index").iterdir())
    assert len(index_at_flush) > 1
    before = inodes(tmp_path)
    content = {p: (tmp_path / p).read_bytes() for p in before}
    progress = FlushProgress.read(tmp_path / "config")
    renewed = renewal.renew_derived(tmp_path, CONFIG.mapped_file_size_consume_queue, progress)
    after = inodes(tmp_path)
    changed = sorted(p for p in before if after[p] != before[p])
    assert len(changed) == renewed
    # The checkpoint, each queue's second (newest) file, the IndexFile the flush reached and
    # any started after it; not the full files before them.
    assert changed == sorted(
        ["checkpoint", *(f"index/{n}" for n in index_now if n >= index_at_flush[-1])]
        + [f"consumequeue/{TOPIC}/{q}/{CONFIG.mapped_file_size_consume_queue:020d}"
           for q in range(QUEUES)]
    )  # fmt: skip
    assert {p: (tmp_path / p).read_bytes() for p in before} == content
    assert not list(tmp_path.rglob("*" + TMP_SUFFIX))


def test_a_writable_open_renews_only_after_an_unclean_end_on_shared_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    with MessageStore(shared, CONFIG) as clean:
        put_a(clean, 0, 30)
    before = inodes(shared)
    with MessageStore(shared, CONFIG) as again:
        assert again.recovery.files_renewed == 0
    assert inodes(shared) == before
    a = MessageStore(shared, CONFIG)
    put_a(a, 30, 60)
    abandon(a)
    with MessageStore(shared, CONFIG) as taker:
        assert taker.recovery.files_renewed > 0
        assert taker.recovery.to_json()["filesRenewed"] == taker.recovery.files_renewed
    assert bodies(shared) == expected(60, 0)
    # On a local disk nothing changes: one host, one page cache, no writer left to fence.
    local_cfg = StoreConfig(**{**CONFIG.__dict__, "shared_storage": "local"})
    local = tmp_path / "local"
    a = MessageStore(local, local_cfg)
    put_a(a, 0, 60)
    abandon(a)

    def refuse(path: Path, tmp: Path | None = None) -> None:
        raise AssertionError(f"{path} renewed on a local disk")

    monkeypatch.setattr(renewal, "renew_file", refuse)
    with MessageStore(local, local_cfg) as taker:
        assert taker.recovery.files_renewed == 0
    assert bodies(local, local_cfg) == expected(60, 0)


CRASHER = textwrap.dedent(
    """
    import sys
    from rocketstore.pipeline.engine.store import MessageStore
    from tests.kit.fencing import CONFIG
    MessageStore(sys.argv[1], CONFIG)
    """
)


@pytest.mark.parametrize("nth", [1, 3])
def test_a_crash_in_the_middle_of_the_renewal_leaves_a_store_recovery_repairs_exactly(
    tmp_path: Path, nth: int
) -> None:
    a = MessageStore(tmp_path, CONFIG)
    put_a(a, 0, UNITS_PER_FILE * QUEUES + 40)
    a.flush()
    put_a(a, UNITS_PER_FILE * QUEUES + 40, UNITS_PER_FILE * QUEUES + 60)
    abandon(a)
    env = dict(os.environ, PYTHONPATH=str(ROOT), ROCKETSTORE_FAILPOINTS=f"derived-renew=kill@{nth}")
    crashed = subprocess.run([sys.executable, "-c", CRASHER, str(tmp_path)], env=env, check=False)
    assert crashed.returncode == -9
    assert list(tmp_path.rglob("*" + TMP_SUFFIX)) or (tmp_path / "checkpoint.tmp").exists()
    with MessageStore(tmp_path, CONFIG) as taker:
        assert taker.recovery.files_renewed > 0 and taker.recovery.bytes_truncated == 0
    assert not list(tmp_path.rglob("*" + TMP_SUFFIX))
    assert bodies(tmp_path) == expected(UNITS_PER_FILE * QUEUES + 60, 0)
    with MessageStore(tmp_path, CONFIG, read_only=True) as ro:
        assert verify(ro).ok
    with MessageStore(tmp_path, CONFIG) as again:  # exact: nothing left to do
        report = again.recovery
        assert report.files_renewed == 0 and report.records_redispatched == 0
        assert not report.queues_rebuilt and not report.index_rebuilt


def test_a_renewal_that_fails_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 5000)
    ino = path.stat().st_ino

    def refuse(tmp: Path, target: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(renewal.durability, "replace", refuse)
    with pytest.raises(RenewalError, match="the file is as it was"):
        renewal.renew_file(path)
    assert path.stat().st_ino == ino and path.read_bytes() == b"x" * 5000
    assert not list(tmp_path.glob("*" + TMP_SUFFIX))


def test_a_fenced_writer_whose_files_were_replaced_is_told_it_was_fenced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On GlusterFS the old writer's sync of a file the new one renewed fails (ESTALE): its
    flush and close say that it was fenced, not only that a sync failed."""
    a = MessageStore(tmp_path, CONFIG)
    put_a(a, 0, 50)
    a.flush()
    lose_lock(a)
    Taker(tmp_path, 10).close()

    def stale(mm: object, start: int, length: int, path: Path) -> None:
        raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))

    monkeypatch.setattr(durability, "msync", stale)
    with pytest.raises(FencedError, match="no longer owns the store"):
        a.flush(force=True)
    with pytest.raises(FencedError):
        a.close()


# -- the copy itself: holes found by SEEK_DATA, zero runs, against a plain model -------------
PAGE = 4096


@settings(max_examples=60)
@example(size=4 * PAGE, writes=[(0.0, bytes(3 * PAGE))])  # zeros written: data, yet no data
@example(size=4 * PAGE + 1, writes=[(0.0, b"\1"), (0.5, bytes(PAGE) + b"\2")])
@given(
    size=st.integers(1, 64 * PAGE),
    writes=st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=3 * PAGE)),
        max_size=8,
    ),
)
def test_a_renewed_file_holds_the_same_bytes_in_a_new_inode(
    tmp_path_factory: pytest.TempPathFactory, size: int, writes: list[tuple[float, bytes]]
) -> None:
    """A sparse file with data written here and there (zeros among it, at either end or none
    at all): the renewed file has the same size and bytes as a bytearray given the same
    writes, is a new inode, and holds data only in pages where the model has a byte that is
    not zero."""
    path = tmp_path_factory.mktemp("renew") / "00000000000000000000"
    model = bytearray(size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, size)
        for where, data in writes:
            at = int(where * size)
            data = data[: size - at]
            os.pwrite(fd, data, at)
            model[at : at + len(data)] = data
    finally:
        os.close(fd)
    before = path.stat()
    renewal.renew_file(path)
    after = path.stat()
    assert path.read_bytes() == bytes(model)
    assert after.st_size == size and after.st_ino != before.st_ino
    assert data_pages(path) <= {p // PAGE for p in range(size) if model[p]}
    assert not path.with_name(path.name + TMP_SUFFIX).exists()


def data_pages(path: Path) -> set[int]:
    """The pages the file system holds data for (``SEEK_DATA``/``SEEK_HOLE``, asked here,
    not through the code under test): a copy that wrote its zero pages would hold more."""
    found: set[int] = set()
    fd = os.open(path, os.O_RDONLY)
    try:
        size, at = os.fstat(fd).st_size, 0
        while at < size:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    break
                raise
            end = os.lseek(fd, start, os.SEEK_HOLE)
            found.update(range(start // PAGE, (end + PAGE - 1) // PAGE))
            at = end
    finally:
        os.close(fd)
    return found


def test_data_extents_skip_the_holes_of_a_large_sparse_file(tmp_path: Path) -> None:
    """An IndexFile-sized file holding two pages of data: the copy reads only what
    ``SEEK_DATA`` finds (on a file system that supports it: ext4, xfs, tmpfs), and a file of
    holes alone reads nothing."""
    path = tmp_path / "sparse"
    size = 400 << 20
    with path.open("wb") as f:
        f.truncate(size)
    fd = os.open(path, os.O_RDWR)
    try:
        assert fileio.data_extents(fd, size) in ([], [(0, size)])
        os.pwrite(fd, b"h" * 10, 0)
        os.pwrite(fd, b"e" * 10, 300 << 20)
        os.fsync(fd)
        extents = fileio.data_extents(fd, size)
    finally:
        os.close(fd)
    if extents == [(0, size)]:
        pytest.skip(f"{tmp_path}: this file system does not report holes")
    assert sum(end - start for start, end in extents) <= 4 * PAGE
    assert extents[0][0] == 0 and any(s <= (300 << 20) < e for s, e in extents)
    renewal.renew_file(path)
    with path.open("rb") as f:
        assert f.read(10) == b"h" * 10
        f.seek(300 << 20)
        assert f.read(10) == b"e" * 10
    assert data_pages(path) == {0, (300 << 20) // PAGE}


def test_seek_answers_that_do_not_move_on_read_the_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GlusterFS's FUSE client was seen answering ``SEEK_DATA`` and ``SEEK_HOLE`` both with the
    offset asked (``lseek(fd, 12288, SEEK_HOLE) = 12288``, then ``SEEK_DATA`` the same), which
    would walk the file forever: such answers make the copy read the whole file."""
    path = tmp_path / "f"
    data = b"\0" * 12288 + b"x" * 5000 + b"\0" * 9000 + b"y"
    path.write_bytes(data)
    real = os.lseek

    def stuck(fd: int, pos: int, how: int) -> int:
        if how in (os.SEEK_DATA, os.SEEK_HOLE) and pos >= 12288:
            return pos
        return real(fd, pos, how)

    monkeypatch.setattr(renewal.os, "lseek", stuck)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert fileio.data_extents(fd, len(data)) == [(0, len(data))]
    finally:
        os.close(fd)
    renewal.renew_file(path)
    assert path.read_bytes() == data
