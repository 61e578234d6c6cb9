"""Hosts with a network (tests/netcluster.py), the fixture itself: every host sees the volume
at one path and the caller sees none of it; a partitioned host cannot reach the volume while
the others can, and heals; a host cut off from one brick of three still writes, from two it
cannot; a lock held on a partitioned host is taken over on another within the bound the
volume's ``server.tcp-user-timeout`` sets, whatever ``network.ping-timeout`` says; teardown
leaves nothing behind, also after a failure, and two clusters at once do not meet."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gluster import _poll
from tests.netcluster import NetCluster, cluster, takeover

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
