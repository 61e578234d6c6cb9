"""pipeline/files/lock.py and MessageStore opening: the exclusive lock, the abort marker, refusals."""

from __future__ import annotations

import concurrent.futures
import fcntl
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import NotAStoreError, StoreFailedError, StoreLockedError
from rocketstore.pipeline.files import failpoints
from rocketstore.pipeline.files import lock as lock_module
from rocketstore.pipeline.files.lock import DirectoryLock, is_locked_elsewhere
from rocketstore.pipeline.format.message import Message
from tests.kit.contention import Aside, SignallingLock, run_aside
from tests.kit.files import snapshot

ROOT = Path(__file__).resolve().parent.parent
CONFIG = StoreConfig(mapped_file_size_commitlog=65536, max_hash_slot_num=64, max_index_num=256)
CLOCK = 1_700_000_000_000

CHILD = textwrap.dedent(
    """
    import sys
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.format.message import Message
    from rocketstore.pipeline.engine.store import MessageStore

    cfg = StoreConfig(mapped_file_size_commitlog=65536, max_hash_slot_num=64, max_index_num=256)
    store = MessageStore(sys.argv[1], cfg, clock_ms=lambda: 1_700_000_000_000)
    for i in range(int(sys.argv[2])):
        store.put(Message("TopicTest", b"body-%d" % i, keys=["k%d" % i]))
    store.flush()
    print("ready", flush=True)
    sys.stdin.readline()
    store.close()
    print("closed", flush=True)
    """
)


class Child:
    """A writer in another process, holding the store open until told to close it."""

    def __init__(self, path: Path, messages: int = 0) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(messages)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=env,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line != "ready\n":
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"child did not open the store: {line!r} {err}")

    def close(self) -> None:
        out, err = self.proc.communicate("\n", timeout=30)
        assert self.proc.returncode == 0, err
        assert out == "closed\n"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def child_writer() -> Iterator[list[Child]]:
    children: list[Child] = []
    yield children
    for c in children:
        c.kill()


def open_store(path: Path, **kw: object) -> MessageStore:
    return MessageStore(path, CONFIG, clock_ms=lambda: CLOCK, **kw)  # type: ignore[arg-type]


def try_writer_in_subprocess(path: Path) -> str:
    """Open the store writable in another process; returns 'opened' or the error's class name."""
    code = textwrap.dedent(
        """
        import sys
        from rocketstore.pipeline.config import StoreConfig
        from rocketstore.pipeline.engine.store import MessageStore
        cfg = StoreConfig(mapped_file_size_commitlog=65536, max_hash_slot_num=64, max_index_num=256)
        try:
            MessageStore(sys.argv[1], cfg).close()
        except Exception as exc:
            print(type(exc).__name__)
        else:
            print("opened")
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


# -- same process ------------------------------------------------------------------------


def test_second_writer_in_same_process_fails(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with open_store(path) as store:
        with pytest.raises(StoreLockedError, match="this process"):
            open_store(path)
        # the failed open left the first one intact
        assert (path / "abort").exists()
        store.put(Message("TopicTest", b"x"))
    assert not (path / "abort").exists()
    with open_store(path) as again:
        assert again.max_offset("TopicTest", 0) == 1


def test_second_writer_through_symlink_fails(tmp_path: Path) -> None:
    path = tmp_path / "store"
    link = tmp_path / "link"
    with open_store(path):
        link.symlink_to(path)
        with pytest.raises(StoreLockedError):
            open_store(link)


def test_lock_released_on_close_in_same_process(tmp_path: Path) -> None:
    path = tmp_path / "store"
    open_store(path).close()
    open_store(path).close()


def test_directory_lock_direct(tmp_path: Path) -> None:
    a, b = DirectoryLock(tmp_path), DirectoryLock(tmp_path)
    a.acquire()
    with pytest.raises(StoreLockedError):
        b.acquire()
    a.release()
    a.release()  # idempotent
    b.acquire()
    b.release()


def test_abort_and_lock_files(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = open_store(path)
    assert (path / "abort").exists()
    # (reading "lock" here would close a descriptor of it in the holding process, which drops
    # a POSIX lock; its content is checked after close)
    for sub in ("commitlog", "consumequeue", "index", "config"):
        assert (path / sub).is_dir()
    assert not store.abort_file_found
    store.close()
    assert not (path / "abort").exists()
    assert (path / "lock").read_bytes() == b"lock"
    assert (path / "checkpoint").stat().st_size == 4096


def test_abort_left_behind_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "store"
    open_store(path).close()
    (path / "abort").touch()
    with open_store(path) as store:
        assert store.abort_file_found
    assert not (path / "abort").exists()


def test_failed_open_releases_lock(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with open_store(path) as store:
        store.put(Message("TopicTest", b"x"))
    # a segment of the wrong size makes the open fail after the lock was taken
    (path / "commitlog" / "00000000000000065536").write_bytes(b"short")
    with pytest.raises(NotAStoreError, match="00000000000000065536"):
        open_store(path)
    (path / "commitlog" / "00000000000000065536").unlink()
    open_store(path).close()


# -- other processes -----------------------------------------------------------------------


def test_writer_in_other_process_blocks_open(tmp_path: Path, child_writer: list[Child]) -> None:
    path = tmp_path / "store"
    child = Child(path)
    child_writer.append(child)
    assert is_locked_elsewhere(path)
    # "at once": the attempt must not wait for the lock; run it where a wait cannot hang the test
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        attempt = pool.submit(open_store, path)
        try:
            with pytest.raises(StoreLockedError, match="another process"):
                attempt.result(timeout=20)
        finally:
            child.close()
            if attempt.done() and attempt.exception() is None:
                attempt.result().close()
    assert not is_locked_elsewhere(path)
    with open_store(path) as store:
        assert not store.abort_file_found


def test_read_only_open_while_writer_holds_lock(tmp_path: Path, child_writer: list[Child]) -> None:
    path = tmp_path / "store"
    child = Child(path, messages=5)
    child_writer.append(child)
    before = snapshot(path, dirs=True)
    assert "abort" in before
    with open_store(path, read_only=True) as ro:
        assert ro.max_offset("TopicTest", 0) == 5
        got = ro.get_messages("TopicTest", 0, 0, 10).messages
        assert [m.body for m in got] == [b"body-%d" % i for i in range(5)]
        assert [m.msg_id for m in ro.query_by_key("TopicTest", "k3")] == [got[3].msg_id]
    assert snapshot(path, dirs=True) == before
    # the writer still holds the lock
    assert is_locked_elsewhere(path)
    with pytest.raises(StoreLockedError):
        open_store(path)
    child.close()


def test_read_only_open_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with open_store(path) as store:
        store.put(Message("TopicTest", b"x", keys="a b"))
    before = snapshot(path, dirs=True)
    assert "abort" not in before
    ro = open_store(path, read_only=True)
    assert not (path / "abort").exists()
    assert ro.get_message(0).body == b"x"
    ro.close()
    assert snapshot(path, dirs=True) == before
    # and two read-only opens coexist with a writer in this process
    with open_store(path), open_store(path, read_only=True), open_store(path, read_only=True):
        pass


def test_read_only_open_does_not_release_writer_lock(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with open_store(path) as writer:
        writer.put(Message("TopicTest", b"x"))
        open_store(path, read_only=True).close()
        assert try_writer_in_subprocess(path) == "StoreLockedError"


def test_lock_probe_in_writer_process_keeps_the_lock(tmp_path: Path) -> None:
    # The probe must not disturb a lock this process holds (POSIX locks are dropped when any
    # descriptor of the file is closed by the holding process).
    path = tmp_path / "store"
    with open_store(path):
        is_locked_elsewhere(path)
        assert try_writer_in_subprocess(path) == "StoreLockedError"


def test_writer_in_this_process_blocks_other_process(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with open_store(path):
        assert try_writer_in_subprocess(path) == "StoreLockedError"
    assert try_writer_in_subprocess(path) == "opened"


# -- refusals ----------------------------------------------------------------------------


def test_unrelated_directory_refused(tmp_path: Path) -> None:
    path = tmp_path / "photos"
    path.mkdir()
    (path / "cat.jpg").write_bytes(b"\xff\xd8")
    (path / "notes").mkdir()
    before = snapshot(path, dirs=True)
    with pytest.raises(NotAStoreError, match="photos"):
        open_store(path)
    with pytest.raises(NotAStoreError, match="photos"):
        open_store(path, read_only=True)
    assert snapshot(path, dirs=True) == before


def test_plain_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"data")
    with pytest.raises(NotAStoreError, match="file"):
        open_store(path)
    with pytest.raises(NotAStoreError):
        open_store(path, read_only=True)
    assert path.read_bytes() == b"data"


def test_read_only_open_of_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "missing"
    with pytest.raises(NotAStoreError, match="missing"):
        open_store(path, read_only=True)
    assert not path.exists()
    with pytest.raises(NotAStoreError):
        open_store(path, create=False)
    assert not path.exists()


def test_read_only_open_of_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(NotAStoreError):
        open_store(tmp_path, read_only=True)
    assert list(tmp_path.iterdir()) == []


def test_writable_open_creates_missing_and_empty_directories(tmp_path: Path) -> None:
    open_store(tmp_path / "a" / "b").close()
    assert (tmp_path / "a" / "b" / "commitlog").is_dir()
    empty = tmp_path / "empty"
    empty.mkdir()
    open_store(empty).close()
    assert (empty / "lock").exists()


def test_creating_a_store_another_writer_just_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other writer's mkdir lands between this open's existence check and its own mkdir.
    path = tmp_path / "store"
    real_exists = Path.exists
    checks = 0

    def racing_exists(self: Path, **kw: object) -> bool:
        nonlocal checks
        if self == path and checks < 2:
            # The open looks twice before it creates the directory; both looks miss it.
            checks += 1
            if checks == 2:
                path.mkdir()
            return False
        return real_exists(self)

    monkeypatch.setattr(Path, "exists", racing_exists)
    with open_store(path, create=True) as store:
        store.put(Message("TopicTest", b"x"))
    monkeypatch.undo()
    with open_store(path, read_only=True) as ro:
        assert ro.get_message(0).body == b"x"


# -- the kind of lock, and the probe -------------------------------------------------------

CLASSIC_LOCKER = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # The lock RocketMQ takes: FileChannel.tryLock(0, 1, false) is fcntl(F_SETLK) on byte 0.
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        print("refused", flush=True)
        sys.exit(0)
    print("locked", flush=True)
    if sys.argv[2] == "hold":
        sys.stdin.readline()
    """
)


def classic_lock_in_subprocess(lock_file: Path) -> str:
    """Try a classic POSIX lock on ``lock_file`` from another process: 'locked' or 'refused'."""
    done = subprocess.run(
        [sys.executable, "-c", CLASSIC_LOCKER, str(lock_file), "try"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture(params=["ofd", "posix"])
def lock_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with open file description locks and with the classic fallback."""
    kind = str(request.param)
    if kind == "ofd" and lock_module._OFD_SETLK is None:
        pytest.skip("this Python/kernel has no open file description locks (F_OFD_SETLK)")
    monkeypatch.setattr(lock_module, "_OFD", kind == "ofd")
    return kind


def test_lock_conflicts_with_a_classic_lock_of_another_process(
    tmp_path: Path, lock_kind: str
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", CLASSIC_LOCKER, str(tmp_path / "lock"), "hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(StoreLockedError, match="another process"):
            DirectoryLock(tmp_path).acquire()
    finally:
        holder.communicate("\n", timeout=30)
    ours = DirectoryLock(tmp_path)
    ours.acquire()
    assert ours.kind == lock_kind
    assert classic_lock_in_subprocess(tmp_path / "lock") == "refused"
    assert is_locked_elsewhere(tmp_path) is False  # it is this process's
    ours.release()
    assert classic_lock_in_subprocess(tmp_path / "lock") == "locked"


def test_probe_racing_an_acquire_keeps_the_acquired_lock(
    tmp_path: Path, lock_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A probe in one thread, an acquire in another that lands while the probe has the lock
    # file open: the probe's close must not drop the lock the acquire took.
    (tmp_path / "lock").touch()
    registry = SignallingLock(threading.Lock())
    monkeypatch.setattr(lock_module, "_registry_lock", registry)
    real_fcntl = fcntl.fcntl
    acquires: list[Aside[None]] = []
    taken = DirectoryLock(tmp_path)

    def fcntl_then_acquire(fd: int, cmd: int, arg: bytes) -> bytes:
        if cmd == fcntl.F_GETLK and not acquires:
            acquires.append(run_aside(taken.acquire, registry))
        return real_fcntl(fd, cmd, arg)  # type: ignore[no-any-return]

    monkeypatch.setattr(fcntl, "fcntl", fcntl_then_acquire)
    assert is_locked_elsewhere(tmp_path) is False
    assert len(acquires) == 1
    acquires[0].result()
    monkeypatch.undo()
    try:
        assert classic_lock_in_subprocess(tmp_path / "lock") == "refused"
    finally:
        taken.release()


FORKING_HOLDER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import rocketstore.pipeline.files.lock as lock
    lock._OFD = sys.argv[2] == "ofd"
    held = lock.DirectoryLock(Path(sys.argv[1]))
    held.acquire()
    assert held.kind == sys.argv[2], held.kind
    if os.fork() == 0:
        sys.stdin.readline()  # the child lives on until the test lets it go
        os._exit(0)
    print("forked", flush=True)
    os._exit(0)  # the parent dies without releasing, as in a crash
    """
)


def test_a_forked_child_does_not_keep_the_lock_of_a_dead_parent(
    tmp_path: Path, lock_kind: str
) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen(
        [sys.executable, "-c", FORKING_HOLDER, str(tmp_path), lock_kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env=env,
        text=True,
    )
    assert parent.stdout is not None
    try:
        assert parent.stdout.readline() == "forked\n"
        assert parent.wait(timeout=30) == 0
        # The child still runs (blocked on the stdin it shares with its parent).
        assert classic_lock_in_subprocess(tmp_path / "lock") == "locked"
    finally:
        assert parent.stdin is not None
        parent.stdin.close()  # the child reads EOF and exits


# -- closing ------------------------------------------------------------------------------


def test_close_with_a_zero_copy_view_alive_still_closes_everything(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = open_store(path)
    put = store.put(Message("TopicTest", b"kept-after-close", keys="k"))
    view = store.commitlog.raw(put.commit_log_offset, put.store_size)
    expected = bytes(view)
    store.close()
    assert store.closed
    assert len(store.mappings) == 0  # queues and index closed too
    assert not (path / "abort").exists()
    assert try_writer_in_subprocess(path) == "opened"  # the lock was released
    with open_store(path) as again:  # and the registry entry
        assert again.get_message(put.commit_log_offset).body == b"kept-after-close"
    # "valid until the store closes" is a promise, not a trap: the bytes are still there.
    assert bytes(view) == expected
    del view


def test_close_whose_flush_fails_unlocks_and_keeps_abort(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = open_store(path)
    store.put(Message("TopicTest", b"x"))
    failpoints.arm("flush")
    try:
        with pytest.raises(StoreFailedError, match="flush failed"):
            store.close()
    finally:
        failpoints.disarm_all()
    assert store.closed
    assert len(store.mappings) == 0
    # Not a clean shutdown: the next open must recover as after a crash.
    assert (path / "abort").exists()
    assert classic_lock_in_subprocess(path / "lock") == "locked"  # the lock was released
    with open_store(path) as again:  # and the registry entry
        assert again.abort_file_found
        assert again.get_message(0).body == b"x"
