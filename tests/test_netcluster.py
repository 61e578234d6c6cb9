"""Hosts with a network (tests/kit/netcluster.py), the fixture itself: every host sees the volume
at one path and the caller sees none of it; a partitioned host cannot reach the volume while
the others can, and heals; a host cut off from one brick of three still writes, from two it
cannot; a lock held on a partitioned host is taken over on another within the bound the
volume's ``server.tcp-user-timeout`` sets, whatever ``network.ping-timeout`` says; a late
write of a host cut off lands over a file rewritten in place and misses one renamed over; teardown
leaves nothing behind, also after a failure, and two clusters at once do not meet."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kit.gluster import _poll
from tests.kit.netcluster import GONE, NetCluster, cluster, takeover

pytestmark = [pytest.mark.gluster, pytest.mark.slow]

WRITE = """
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, sys.argv[2].encode())
    os.fsync(fd)
    os.close(fd)
except OSError as exc:
    print(exc.errno)
    sys.exit(3)
"""


def write(c: NetCluster, host: str, name: str, timeout_s: float = 30.0) -> str:
    """Create and fsync ``name`` in the volume on ``host`` (the content is the host's name):
    ``"ok"``, the errno's name (``"ENOTCONN"``) or ``"blocked"`` past ``timeout_s``."""
    try:
        done = c.run(host, [sys.executable, "-c", WRITE, str(c.mount / name), host],
                     timeout=timeout_s)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "blocked"
    if done.returncode == 3:
        return errno.errorcode[int(done.stdout)]
    assert done.returncode == 0, done.stderr
    return "ok"


def read(c: NetCluster, host: str, name: str) -> str:
    return c.run(host, ["cat", str(c.mount / name)], timeout=30, check=True).stdout


def cut_off_bound(c: NetCluster) -> float:
    """Long enough for a host's client to give up on a brick it cannot reach (it waits for the
    ping timeout, then fails with ENOTCONN: 7.6 s with a ping timeout of 5 s here)."""
    return 2 * float(c.options["network.ping-timeout"]) + 15


def test_every_host_sees_the_volume_at_one_path_the_caller_none_of_it(netcluster: Any) -> None:
    c = netcluster
    assert write(c, "A", "from-a") == "ok"
    assert read(c, "B", "from-a") == read(c, "V", "from-a") == "A"
    for host in c.hosts:
        addresses = c.run(host, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"], check=True)
        assert f" {c.address(host)}/24 " in addresses.stdout
    with open("/proc/self/mounts") as mounts:
        assert f" {c.mount} " not in mounts.read()
    assert os.listdir(c.mount) == []
    here = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True)
    assert "10.27." not in here.stdout


def test_a_partitioned_host_cannot_reach_the_volume_until_healed(netcluster: Any) -> None:
    c = netcluster
    assert write(c, "A", "before") == "ok"
    c.partition("A")
    assert write(c, "B", "during-b", timeout_s=10) == "ok"  # the others are not held up
    assert read(c, "V", "during-b") == "B"
    assert write(c, "A", "during-a", timeout_s=cut_off_bound(c)) in ("ENOTCONN", "blocked")
    c.heal("A")
    c.wait_reachable("A")
    assert write(c, "A", "after") == "ok"
    assert read(c, "A", "during-b") == "B"
    assert read(c, "B", "after") == "A"


def test_a_host_cut_off_from_one_brick_writes_from_two_it_cannot(netcluster: Any) -> None:
    c = netcluster
    c.cut("A", [0])
    assert write(c, "A", "one-brick-off", timeout_s=cut_off_bound(c)) == "ok"  # 2 of 3
    assert read(c, "B", "one-brick-off") == "A"
    c.cut("A", [0, 1])
    assert write(c, "A", "two-off", timeout_s=cut_off_bound(c)) in ("ENOTCONN", "blocked")
    assert write(c, "B", "two-off-b", timeout_s=10) == "ok"
    c.heal("A")
    c.wait_reachable("A")
    assert write(c, "A", "after") == "ok"
    assert read(c, "V", "after") == "A"


@pytest.mark.parametrize(
    "netcluster",
    [
        pytest.param({"tcp_user_timeout": 8, "ping_timeout": 3}, id="user-timeout-8-ping-3"),
        pytest.param({"tcp_user_timeout": 4, "ping_timeout": 10}, id="user-timeout-4-ping-10"),
    ],
    indirect=True,
)
def test_a_lock_held_on_a_partitioned_host_is_taken_over_as_the_timeouts_say(
    netcluster: Any,
) -> None:
    """The store's lock held on A is B's between ``tcp-user-timeout`` minus ``keepalive-time``
    (the bricks' last word from A may be that old) and ``tcp-user-timeout`` after A is cut off,
    plus B's own start: below the ping timeout in one case, above it in the other."""
    c = netcluster
    user_timeout = c.lock_release_s()
    keepalive_time = float(c.options["server.keepalive-time"])
    took = takeover(c, "A", "B")
    assert user_timeout - keepalive_time - 1 <= took <= user_timeout + 4, took


LATE_WRITER = """
import errno, mmap, os, sys
def outcome(call):
    try:
        call()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
fds = [os.open(path, os.O_RDWR) for path in sys.argv[1:]]
mapped = mmap.mmap(fds[-1], 16384)  # of the last file
mapped[:4096] = b"A" * 4096  # dirty, perhaps written back before the partition, perhaps not
os.pread(fds[0], 1, 0)  # opened on the bricks now (the client defers an open until used)
print("ready", flush=True)
sys.stdin.readline()
done = [outcome(lambda: (os.pwrite(fd, b"A" * 4096, 0), os.fsync(fd))) for fd in fds]
print(" ".join([*done, outcome(mapped.flush)]), flush=True)
"""
RENAME_OVER = """
import os, sys
path = sys.argv[1]
fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"B" * 16384)
os.fsync(fd)
os.close(fd)
os.rename(path + ".new", path)
fd = os.open(os.path.dirname(path), os.O_RDONLY)
os.fsync(fd)
os.close(fd)
"""
FILL = "import sys; open(sys.argv[1], 'wb').write(b'o' * 16384)"
WRITE_IN_PLACE = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, b"B" * 16384, 0)
os.fsync(fd)
os.close(fd)
"""


@pytest.mark.parametrize(
    "netcluster",
    [pytest.param({"tcp_user_timeout": 8, "ping_timeout": 3}, id="user-timeout-8-ping-3")],
    indirect=True,
)
def test_a_late_page_of_a_partitioned_host_misses_a_file_renamed_over(netcluster: Any) -> None:
    """A process on A holds two files open (one also mapped, with a dirty page), and A is cut
    off; once the bricks dropped A (and closed its descriptors), as at a take-over, B writes
    one file in place and replaces the other by a new file renamed over it. After the heal,
    A's write through its old descriptor lands over B's bytes in the first; in the second it
    fails (ESTALE here: A's client reopens its descriptor by the old inode's gfid, which is
    gone) and so does the mapping's write-back: B's bytes stay (pipeline/engine/renewal.py)."""
    c = netcluster
    files = {how: c.mount / how for how in ("in-place", "renamed")}
    for path in files.values():
        c.run("V", [sys.executable, "-c", FILL, str(path)], check=True)
    a = c.popen("A", [sys.executable, "-c", LATE_WRITER, *map(str, files.values())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert a.stdout is not None and a.stdin is not None
    assert a.stdout.readline().strip() == "ready"
    c.partition("A")
    try:
        address = c.address("A")
        # As at a take-over: the bricks have dropped A (and closed its descriptors) first.
        _poll("the bricks to drop A", lambda: all(address not in s for s in c.clients()), 60.0)
        c.run("B", [sys.executable, "-c", WRITE_IN_PLACE, str(files["in-place"])], check=True)
        c.run("B", [sys.executable, "-c", RENAME_OVER, str(files["renamed"])], check=True)
    finally:
        c.heal("A")
    c.wait_reachable("A")
    _poll("A on every brick", lambda: all(address in s for s in c.clients()), 60.0)
    a.stdin.write("\n")
    a.stdin.flush()
    in_place, renamed, mapping = a.stdout.readline().split()
    assert in_place == "ok" and renamed in GONE
    # The dirty page went out now (failing as the write did) or already during the partition
    # (a failed write-back, ENOTCONN, reported once): either way it reached no brick.
    assert mapping in (*GONE, "ENOTCONN")
    a.wait(timeout=30)
    late = b"A" * 4096 + b"B" * (16384 - 4096)
    for brick in c.bricks:
        assert (brick / "in-place").read_bytes() == late
        assert (brick / "renamed").read_bytes() == b"B" * 16384
    assert c.run("V", ["cat", str(files["renamed"])], check=True).stdout == "B" * 16384


def out(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout


def running(pid: int) -> bool:
    """Whether ``pid`` runs (exists and is not a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def all_mounts() -> str:
    """Every mount of every mount namespace on the machine, as text."""
    texts = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                texts.append(Path(f"/proc/{pid}/mountinfo").read_text())
            except OSError:
                continue  # gone meanwhile, or a zombie
    return "".join(texts)


def test_teardown_leaves_nothing_after_a_failure_and_clusters_do_not_meet(
    netcluster: Any, tmp_path: Path
) -> None:
    """A second cluster beside the fixture's, failed with a host partitioned, another cut off
    from a brick and a process stuck on the mount: nothing of it is left, nor of a cluster an
    earlier process left behind, and the first cluster works throughout."""
    links = {line.split(":")[1].strip() for line in out("ip", "-o", "link").splitlines()}
    rules = out("nft", "list", "ruleset")
    # What a process killed before its teardown leaves: a namespace named for its PID, with a
    # process in it. The next cluster removes both.
    exited = subprocess.Popen(["true"])
    exited.wait()
    orphan = f"rsnet{exited.pid}-0-srv"
    out("ip", "netns", "add", orphan)
    in_orphan = subprocess.Popen(["ip", "netns", "exec", orphan, "sleep", "600"])
    _poll("the orphan's process", lambda: bool(out("ip", "netns", "pids", orphan)))
    (tmp_path / "second").mkdir()
    with pytest.raises(RuntimeError, match="the test failed"), cluster(tmp_path / "second") as d:
        assert orphan not in out("ip", "netns", "list")
        names = [d.netns(role) for role in ("srv", *d.hosts)]
        pids = [int(p) for name in names for p in out("ip", "netns", "pids", name).split()]
        assert d.id != netcluster.id and d.volume != netcluster.volume
        assert write(d, "B", "second") == "ok"
        assert write(netcluster, "B", "first") == "ok"
        d.partition("A")
        d.cut("B", [0])
        stuck = d.popen("A", [sys.executable, "-c", WRITE, str(d.mount / "stuck"), "A"])
        assert write(netcluster, "A", "first-a", timeout_s=10) == "ok"  # not cut off
        raise RuntimeError("the test failed")
    assert stuck.wait(timeout=30) != 0  # killed
    assert in_orphan.wait(timeout=30) != 0
    listed = out("ip", "netns", "list")
    assert [n for n in [*names, orphan] if n in listed] == []
    assert [p for p in pids if running(p)] == []
    assert d.volume not in all_mounts()
    assert {line.split(":")[1].strip() for line in out("ip", "-o", "link").splitlines()} == links
    assert out("nft", "list", "ruleset") == rules
    assert not any(b.exists() for b in d.bricks)
    assert write(netcluster, "V", "still") == "ok"
    assert read(netcluster, "B", "still") == "V"
