"""Hosts with a network: a replica-3 GlusterFS volume on a server behind a bridge, and hosts
that mount it and can be cut off from it, for partition tests.

Every namespace, interface, address and nftables table below is made here and lives only
inside namespaces made here; the caller's network namespace gets nothing, and nothing binds or
sends outside them (the subnet exists only behind the bridge)::

    netns <id>-srv  (and a mount namespace of its own: /run, /var/lib/glusterd and
    |               /var/log/glusterfs are private, so the machine's own glusterd is untouched)
    |   glusterd, bricks b0 b1 b2 of a replica-3 volume, the self-heal daemon
    |   br0 10.27.0.1/24
    |    +-- vA <==veth==> eth0 10.27.0.11  netns <id>-A  + mount ns: the volume at .mount
    |    +-- vB <==veth==> eth0 10.27.0.12  netns <id>-B  + mount ns: the volume at .mount
    |    +-- vV <==veth==> eth0 10.27.0.13  netns <id>-V  + mount ns: the volume at .mount

Each host is a network namespace with one veth into the server's bridge and a mount namespace
of its own in which the volume is mounted at the same path, :attr:`NetCluster.mount`, with a
FUSE client (and cache) of its own; the caller's mount namespace does not see those mounts.
A process started with :meth:`NetCluster.run` or :meth:`NetCluster.popen` runs on a host: in
its network and mount namespaces, so a CLI run "on A" and one "on B" name the store by one
path. Each namespace is held by a ``sleep infinity`` holder process.

Cutting a host off: :meth:`~NetCluster.partition` loads an nftables ``netdev`` ingress chain
with ``policy drop`` on both ends of the host's veth (its ``eth0`` and the bridge port): every
packet between the host and the server vanishes, no reset, no ICMP, no error. A process there
blocks on the mount until the client's ``network.ping-timeout`` passes, then gets ENOTCONN
(7.6 s after the cut with a ping timeout of 5 s).
:meth:`~NetCluster.cut` drops only the traffic of chosen bricks (by the port ``volume status``
gives each), to take one brick of three away from a host (writes go on with two) or two (no
quorum: ENOTCONN). :meth:`~NetCluster.heal` removes both; the host's client reconnects on its
own, within about 2 s here.

In a test: the ``netcluster`` fixture (tests/conftest.py), or ``with cluster(tmp_path) as c``::

    c.run("A", [sys.executable, "-m", "rocketstore.pipeline.cli", "produce", ...])  # on host A
    writer = c.popen("A", [...], stdin=subprocess.PIPE)  # the same, left running
    c.partition("A"); c.heal("A"); c.wait_reachable("A")  # cut off, back, usable again
    c.cut("A", [0, 1])  # A loses bricks b0 and b1 only (no quorum)
    takeover(c, "A", "B")  # seconds until B gets a store lock that A held when cut off
    c.lock_release_s()  # the bound on that: server.tcp-user-timeout
    c.gluster("volume", "heal", c.volume, "info")  # the cluster's own gluster CLI
    c.running_bricks(); c.brick_ports(); c.clients()  # bricks, ports, connected clients

Lock take-over. A partitioned client's POSIX locks stay held on the bricks until the bricks
drop its connection, and they drop it after ``server.tcp-user-timeout``: the kernel gives up
on a connection whose data or keepalive probes (``server.keepalive-*``) have gone unanswered
that long, counted from the last packet it got from the client. ``network.ping-timeout`` only
decides when the partitioned client gives up on the bricks (and its processes get ENOTCONN):
it does not free the locks. So a lock held on A is obtainable on B about
``tcp-user-timeout`` after A is cut off, whatever the ping timeout: within 0.8 s after it
here, B's retries included, and earlier by up to ``keepalive-time`` when the bricks had heard
nothing from A for that long before the cut (3.3 s with 5 in a manual run).
Measured here (a ``DirectoryLock`` held on A; B retrying every 50 ms; three runs each of
``python -m tests.kit.netcluster takeover``), seconds from the partition to B holding the lock:

    ================  ============  ===============  ================
    tcp-user-timeout  ping-timeout  keepalive t/i/c  take-over
    ================  ============  ===============  ================
    42 (default)      5             default          42.1, 42.8, 42.1
    5                 5             2/1/3            5.0, 4.9, 5.0
    10                5             2/1/3            10.2, 10.1, 10.1
    10                42 (default)  2/1/3            10.2, 10.2, 10.0
    ================  ============  ===============  ================

:func:`cluster` sets ``network.ping-timeout`` 5, ``server.tcp-user-timeout`` 5 and keepalive
2/1/3 unless told otherwise (``None`` keeps GlusterFS's default).

Teardown, whatever happened (a failed setup or test, a partitioned host, a process stuck on
the mount): every process in each of the cluster's network namespaces is killed -9 (holders,
glusterd, bricks, FUSE clients, whatever ran on a host), which takes the mount namespaces and
their mounts with them; the network namespaces are deleted, which takes the veths, the bridge
and every nftables table with them; the bricks and the glusterd state are removed. A cluster
left behind by a process that died before its teardown (its PID is in the namespaces' names)
is torn down by the next :func:`cluster`. Not thread-safe; one process manages a cluster.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.kit import gluster as gl

# What a host's client answers for a descriptor (or a mapping's write-back) of a file that was
# replaced while the host was cut off: it reopens descriptors by the old inode's gfid, which is
# gone from the bricks (tests/test_netcluster.py).
GONE = ("ESTALE", "ENOENT", "EBADFD")
SERVER = "10.27.0.1"  # the bridge's address inside the srv namespace; the subnet exists only there
PREFIX = "rsnet"  # namespaces are named PREFIX<pid>-<n>-<role>
TOOLS = ("ip", "nft", "nsenter", "unshare", "sleep")
HOLD = ("sleep", "infinity")
_serial = itertools.count()
_live: set[str] = set()  # the ids of this process's clusters that are not torn down yet


def unavailable() -> str | None:
    """Why this machine cannot make a cluster, or None when it can."""
    why = gl.unavailable()
    if why is not None:
        return why
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (
            f"no {', '.join(missing)}: apt-get install iproute2 nftables util-linux (.ci/run does)"
        )
    # A throwaway network namespace (gone when the probe exits) with a netdev ingress chain:
    # what a partition needs from the kernel.
    probe = subprocess.run(
        ["unshare", "--net", "nft", "-f", "-"],
        input=_table("probe", "lo", "policy accept;"),
        capture_output=True,
        text=True,
        timeout=gl.TIMEOUT_S,
        check=False,
    )
    if probe.returncode != 0:
        return f"no network namespace with an nftables netdev chain here: {probe.stderr.strip()}"
    return None


def _table(name: str, device: str, body: str) -> str:
    """An nft script that replaces netdev table ``name`` (created empty first, so that the
    delete never fails) by one ingress chain on ``device``; with an empty ``body`` the table
    is only removed. One script is one transaction: no packet sees a half-loaded table."""
    script = f"table netdev {name} {{}}\ndelete table netdev {name}\n"
    if body:
        script += (
            f"table netdev {name} {{\n  chain ingress {{\n"
            f'    type filter hook ingress device "{device}" priority 0;\n'
            f"    {body}\n  }}\n}}\n"
        )
    return script


def _netns_pids(name: str) -> list[int]:
    out = subprocess.run(
        ["ip", "netns", "pids", name], capture_output=True, text=True, check=False
    ).stdout
    return [int(x) for x in out.split()]


def _netns_names() -> list[str]:
    out = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=False
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _remove_netns(names: Iterable[str]) -> None:
    """Kill every process in the network namespaces ``names``, then delete them. Killing is
    repeated until none is left: glusterd may be starting a brick while its peers die. A
    namespace whose processes outlive that keeps its name, for a later sweep to find; the
    error names it once every other one is gone."""
    stuck = []
    for name in names:

        def emptied(name: str = name) -> bool:
            pids = _netns_pids(name)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not pids

        try:
            gl._poll(f"the processes of namespace {name} to exit", emptied)
        except TimeoutError:
            stuck.append(name)
            continue
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    if stuck:
        raise RuntimeError(f"processes in network namespaces {stuck} did not die")


def _sweep_orphans() -> None:
    """Tear down the clusters of processes that died before their own teardown (a dead PID in
    the name; or this PID, recycled, without a cluster of this process behind it). A PID
    that another process now has hides its orphan until that process ends."""
    orphans = []
    for name in _netns_names():
        m = re.match(rf"({PREFIX}(\d+)-\d+)-", name)
        if m and (
            not Path(f"/proc/{m[2]}").exists() or (int(m[2]) == os.getpid() and m[1] not in _live)
        ):
            orphans.append(name)
    _remove_netns(orphans)


class NetCluster:
    """A started volume on the server namespace and hosts that mount it (module docstring).

    ``hosts``: the host names; ``mount``: where every host sees the volume; ``volume``: its
    name; ``bricks``: the brick directories, as the caller's namespace sees them too;
    ``options``: the volume options set at creation; ``work``: the directory of it all (the
    clients' and glusterd's logs are in ``work/log``)."""

    fs = "glusterfs"
    # What a healed host's processes get from the descriptors of files replaced meanwhile.
    gone: tuple[str, ...] = GONE

    def __init__(self, work: Path, hosts: Sequence[str]) -> None:
        self.work = work
        self.hosts = tuple(hosts)
        self.volume = f"rs{uuid.uuid4().hex[:10]}"
        self.mount = work / "mnt"
        self.bricks = [work / f"b{i}" for i in range(3)]
        self.id = f"{PREFIX}{os.getpid()}-{next(_serial)}"
        self._holders: dict[str, subprocess.Popen[bytes]] = {}
        self._children: list[subprocess.Popen[bytes]] = []
        self.options: dict[str, str] = {}
        self._partitioned: set[str] = set()
        self._cut: dict[str, frozenset[int]] = {}

    def netns(self, role: str) -> str:
        """The network namespace of a host, or of the server (``"srv"``)."""
        return f"{self.id}-{role}"

    def address(self, host: str) -> str:
        return f"10.27.0.{11 + self.hosts.index(host)}"

    def lock_release_s(self) -> float:
        """How long the bricks may keep the locks of a host cut off from them: its
        ``server.tcp-user-timeout`` (module docstring), GlusterFS's 42 s unless set."""
        return float(self.options.get("server.tcp-user-timeout", 42))

    # Running things on a host.

    def _enter(self, role: str, cwd: str | os.PathLike[str] | None = None) -> list[str]:
        pid = self._holders[role].pid
        return ["nsenter", f"--target={pid}", "--mount", "--net", f"--wd={cwd or os.getcwd()}"]

    def run(
        self,
        host: str,
        argv: Sequence[str],
        *,
        timeout: float = gl.TIMEOUT_S,
        check: bool = False,
        input: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` (its network and mount namespaces; ``cwd`` defaults to the
        caller's), capturing text output. ``subprocess.TimeoutExpired`` after ``timeout``
        (the process is killed); with ``check``, ``CalledProcessError`` on a non-zero exit."""
        return subprocess.run(
            [*self._enter(host, cwd), "--", *argv],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            env=env,
        )

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` on ``host``; ``kwargs`` go to ``subprocess.Popen`` (``cwd`` is the
        directory on the host, the caller's by default). The teardown kills it if it is
        still running."""
        cwd = kwargs.pop("cwd", None)
        return subprocess.Popen([*self._enter(host, cwd), "--", *argv], **kwargs)

    def wait_reachable(self, host: str, timeout_s: float = gl.TIMEOUT_S) -> None:
        """Wait until ``host`` creates and removes a file in the volume (after :meth:`heal`
        its client reconnects on its own, but not at once)."""
        probe = str(self.mount / f".reachable-{host}")

        def reached() -> bool:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return self.run(host, ["sh", "-c", 'touch "$0" && rm "$0"', probe],
                                timeout=10).returncode == 0  # fmt: skip
            return False

        gl._poll(f"{host} to reach the volume", reached, timeout_s)

    def gives_up_s(self) -> float | None:
        """How long after a cut a host's processes get ENOTCONN from the mount
        (``network.ping-timeout``); None: they wait until the heal."""
        return float(self.options.get("network.ping-timeout", 42))

    def rejoin(self, host: str) -> None:
        """After :meth:`heal`: wait until ``host`` works on the volume, its client is connected
        to every brick again and the bricks have healed what they missed."""
        self.wait_reachable(host)
        address = self.address(host)
        gl._poll(f"{host} on every brick", lambda: all(address in c for c in self.clients()), 60)
        self.wait_for_heal()

    # Cutting hosts off.

    def partition(self, host: str) -> None:
        """Drop every packet between ``host`` and the server, both ways, until :meth:`heal`."""
        self._partitioned.add(host)
        self._apply(host)

    def cut(self, host: str, bricks: Iterable[int]) -> None:
        """Drop the traffic between ``host`` and the bricks of these indexes (into
        :attr:`bricks`) only, replacing an earlier cut of that host; glusterd and the other
        bricks stay reachable. ``cut(host, ())`` undoes it. The bricks are matched by the ports
        they listen on now: a brick restarted later may listen on another."""
        ports = self.brick_ports()
        self._cut[host] = frozenset(ports[i] for i in bricks)
        self._apply(host)

    def heal(self, host: str) -> None:
        """Undo :meth:`partition` and :meth:`cut` for ``host``: its packets flow again."""
        self._partitioned.discard(host)
        self._cut.pop(host, None)
        self._apply(host)

    def _apply(self, host: str) -> None:
        ports = ", ".join(str(p) for p in sorted(self._cut.get(host, ())))
        # The host's end sees the bricks' packets come from their ports; the bridge's end sees
        # the host's packets go to them.
        for role, table, device, rule in (
            (host, "partition", "eth0", f"tcp sport {{ {ports} }} drop"),
            ("srv", f"partition_{host}", f"v{host}", f"tcp dport {{ {ports} }} drop"),
        ):
            body = "policy drop;" if host in self._partitioned else (rule if ports else "")
            subprocess.run(
                ["ip", "netns", "exec", self.netns(role), "nft", "-f", "-"],
                input=_table(table, device, body),
                capture_output=True,
                text=True,
                timeout=gl.TIMEOUT_S,
                check=True,
            )

    # The volume.

    def gluster(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The ``gluster`` CLI of the cluster's own glusterd."""
        return gl.gluster(*args, check=check, enter=self._enter("srv"))

    def wait_for_heal(self, timeout_s: float = 120.0) -> None:
        """Wait until the self-heal has copied every entry a brick missed (a host cut off
        from some bricks wrote to the others)."""
        self.gluster("volume", "heal", self.volume, check=False)  # now, not at the next crawl
        gl._poll(
            f"the heal of {self.volume}",
            lambda: (
                gl.count_pending(
                    self.gluster("volume", "heal", self.volume, "info", check=False).stdout,
                    len(self.bricks),
                )
                == 0
            ),
            timeout_s,
        )

    def running_bricks(self) -> list[gl.Brick]:
        return gl.running_bricks(self.gluster("volume", "status", self.volume, "--xml").stdout)

    def brick_ports(self) -> list[int]:
        """The TCP port of each brick, in the order of :attr:`bricks` (all must be running)."""
        by_path = {b.path: b.port for b in self.running_bricks()}
        if set(by_path) != set(self.bricks) or 0 in by_path.values():
            raise RuntimeError(f"not every brick of {self.volume} runs: {by_path}")
        return [by_path[b] for b in self.bricks]

    def clients(self) -> list[set[str]]:
        """The addresses each brick (in the order of :attr:`bricks`) has a client connection
        from. A connection stays listed until the brick drops it: a host cut off just now is
        still there."""
        xml = self.gluster("volume", "status", self.volume, "clients", "--xml").stdout
        by_path = {
            Path(node.findtext("path") or ""): {
                (c.findtext("hostname") or "").rsplit(":", 1)[0] for c in node.iter("client")
            }
            for node in ET.fromstring(xml).iter("node")
        }
        return [by_path.get(b, set()) for b in self.bricks]

    # Setting up.

    def _hold(self, role: str) -> None:
        """Start the process that holds ``role``'s network namespace and a private mount
        namespace of its own, and wait until it is in them."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns(role),
             "unshare", "--mount", "--propagation", "private", *HOLD],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        self._holders[role] = proc
        sleep = os.path.realpath(shutil.which(HOLD[0]) or HOLD[0])

        def holding() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the holder of {role} exited: {proc.communicate()[1]!r}")
            with contextlib.suppress(OSError):
                return os.readlink(f"/proc/{proc.pid}/exe") == sleep
            return False

        gl._poll(f"the holder of {role}", holding)

    def _network(self) -> None:
        ip = ["ip", "-n"]
        srv = self.netns("srv")
        for role in ("srv", *self.hosts):
            subprocess.run(["ip", "netns", "add", self.netns(role)], check=True)
            subprocess.run([*ip, self.netns(role), "link", "set", "lo", "up"], check=True)
        subprocess.run([*ip, srv, "link", "add", "br0", "type", "bridge"], check=True)
        subprocess.run([*ip, srv, "addr", "add", f"{SERVER}/24", "dev", "br0"], check=True)
        subprocess.run([*ip, srv, "link", "set", "br0", "up"], check=True)
        for host in self.hosts:
            ns = self.netns(host)
            # Made inside the namespaces: no interface ever exists in the caller's.
            subprocess.run([*ip, srv, "link", "add", f"v{host}", "type", "veth",
                            "peer", "name", "eth0", "netns", ns], check=True)  # fmt: skip
            subprocess.run([*ip, srv, "link", "set", f"v{host}", "master", "br0", "up"], check=True)
            subprocess.run([*ip, ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0"],
                           check=True)  # fmt: skip
            subprocess.run([*ip, ns, "link", "set", "eth0", "up"], check=True)

    def _glusterd(self) -> None:
        state, logs = self.work / "state", self.work / "log"
        state.mkdir()
        logs.mkdir(exist_ok=True)
        # The server's own /run (glusterd's CLI socket is /run/glusterd.socket), state and
        # logs: the machine's glusterd, which other tests run, keeps its own.
        subprocess.run(
            [*self._enter("srv"), "sh", "-c",
             'mount -t tmpfs rocketstore-run /run && mount --bind "$1" /var/lib/glusterd '
             '&& mount --bind "$2" /var/log/glusterfs', "sh", str(state), str(logs)],
            check=True,
            timeout=gl.TIMEOUT_S,
        )  # fmt: skip
        self._children.append(
            subprocess.Popen(
                [*self._enter("srv"), "glusterd", "--no-daemon"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        gl._poll(
            "glusterd to answer", lambda: self.gluster("pool", "list", check=False).returncode == 0
        )

    def _volume(self, options: Mapping[str, str]) -> None:
        for brick in self.bricks:
            brick.mkdir()
        self.gluster("volume", "create", self.volume, "replica", "3",
                     *(f"{SERVER}:{b}" for b in self.bricks), "force")  # fmt: skip
        for key, value in options.items():
            self.gluster("volume", "set", self.volume, key, value)
            self.options[key] = value
        self.gluster("volume", "start", self.volume)
        self.mount.mkdir()
        for host in self.hosts:
            self.run(host, ["mount", "-t", "glusterfs", "-o",
                            f"log-file={self.work / 'log' / f'{host}-mount.log'}",
                            f"{SERVER}:/{self.volume}", str(self.mount)], check=True)  # fmt: skip
        # A client connects to the bricks after the mount returns; a test that cuts a brick off
        # must find every host connected to every brick first.
        every = {self.address(h) for h in self.hosts}
        gl._poll("every host's client on every brick",
                 lambda: all(every <= c for c in self.clients()))  # fmt: skip

    def _teardown(self) -> None:
        _remove_netns([n for n in _netns_names() if n.startswith(f"{self.id}-")])
        for proc in (*self._holders.values(), *self._children):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=gl.TIMEOUT_S)  # reap: killed with its namespace
        left = [n for n in _netns_names() if n.startswith(f"{self.id}-")]
        if left:
            raise RuntimeError(f"network namespaces left behind: {left}")


def default_options(
    ping_timeout: int | None = 5,
    tcp_user_timeout: int | None = 5,
    keepalive: tuple[int, int, int] | None = (2, 1, 3),
) -> dict[str, str]:
    """Volume options for the timeouts (module docstring); ``None`` keeps the default.
    ``keepalive``: ``server.keepalive-time``, ``-interval`` and ``-count``, in that order."""
    options = {}
    if ping_timeout is not None:
        options["network.ping-timeout"] = str(ping_timeout)
    if tcp_user_timeout is not None:
        options["server.tcp-user-timeout"] = str(tcp_user_timeout)
    if keepalive is not None:
        for key, value in zip(("time", "interval", "count"), keepalive, strict=True):
            options[f"server.keepalive-{key}"] = str(value)
    return options


@contextlib.contextmanager
def cluster(
    parent: Path | None = None,
    hosts: Sequence[str] = ("A", "B", "V"),
    *,
    ping_timeout: int | None = 5,
    tcp_user_timeout: int | None = 5,
    keepalive: tuple[int, int, int] | None = (2, 1, 3),
    options: Mapping[str, str] | None = None,
) -> Iterator[NetCluster]:
    """A started cluster (module docstring), every host's client connected to every brick,
    torn down afterwards whatever happens. ``hosts``: at most ten distinct short names
    (letters and digits, not ``srv``); the timeouts: volume options (:func:`default_options`);
    ``options``: more of them, set before the volume starts (``client.strict-locks: on``, say).
    Work files go to a new directory in ``parent``; the clients' and glusterd's logs
    (``log/``) stay there when ``parent`` is given. Raises :class:`~tests.kit.gluster.
    GlusterUnavailable` where this machine cannot make one."""
    why = unavailable()
    if why is not None:
        raise gl.GlusterUnavailable(why)
    names_ok = all(re.fullmatch(r"[A-Za-z0-9]{1,10}", h) and h != "srv" for h in hosts)
    if len(set(hosts)) != len(hosts) or len(hosts) > 10 or not names_ok:
        raise ValueError(f"hosts: at most ten distinct names of 1-10 letters or digits: {hosts}")
    _sweep_orphans()
    work = Path(tempfile.mkdtemp(prefix="rs-netcluster-", dir=parent))
    c = NetCluster(work, hosts)
    _live.add(c.id)
    try:
        c._network()
        for role in ("srv", *hosts):
            c._hold(role)
        c._glusterd()
        c._volume({**default_options(ping_timeout, tcp_user_timeout, keepalive), **(options or {})})
        yield c
    finally:
        try:
            c._teardown()
        finally:
            _live.discard(c.id)
            for name in ("state", *(b.name for b in c.bricks), *(() if parent else ("log",))):
                shutil.rmtree(work / name, ignore_errors=True)
            if parent is None:
                shutil.rmtree(work, ignore_errors=True)


def _measure_takeover(runs: int, **kwargs: Any) -> Iterator[float]:
    """Seconds from partitioning A to B holding a DirectoryLock A held, ``runs`` times."""
    with cluster(**kwargs) as c:
        for _ in range(runs):
            yield takeover(c, "A", "B")
            c.heal("A")
            c.wait_reachable("A")


HOLD_LOCK = """
import sys
from pathlib import Path
from rocketstore.pipeline.files.lock import DirectoryLock
DirectoryLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
sys.stdin.read()  # hold it until the test lets go (or the teardown kills this)
"""
TAKE_LOCK = """
import sys, time
from pathlib import Path
from rocketstore.pipeline.errors import StoreLockedError
from rocketstore.pipeline.files.lock import DirectoryLock
lock = DirectoryLock(Path(sys.argv[1]))
tries = int(sys.argv[2])
for _ in range(tries):
    try:
        lock.acquire()
    except StoreLockedError:
        time.sleep(0.05)  # the retry interval of a writer waiting for the store
        continue
    print(time.monotonic(), flush=True)
    sys.exit(0)
sys.exit(3)  # still held by someone else
"""


def takeover(c: NetCluster, holder: str, taker: str, timeout_s: float = 120.0) -> float:
    """Seconds from partitioning ``holder``, which holds the store lock (pipeline/files/lock.py) of a
    fresh directory in the volume, until ``taker`` holds it; raises when ``taker`` could take
    it before the partition, or not within ``timeout_s`` after. ``holder`` stays partitioned."""
    store = c.mount / f"takeover-{uuid.uuid4().hex[:8]}"
    c.run(holder, ["mkdir", str(store)], check=True)
    held = c.popen(holder, [sys.executable, "-c", HOLD_LOCK, str(store)],
                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert held.stdout is not None
        ready, _, _ = select.select([held.stdout], [], [], timeout_s)
        if not ready or held.stdout.readline().strip() != "locked":
            raise RuntimeError(f"{holder} could not take the lock")
        early = c.run(taker, [sys.executable, "-c", TAKE_LOCK, str(store), "1"])
        if early.returncode != 3:
            raise RuntimeError(f"{taker} took the lock while {holder} held it: {early}")
        start = time.monotonic()
        c.partition(holder)
        got = c.run(taker, [sys.executable, "-c", TAKE_LOCK, str(store), "1000000"],
                    timeout=timeout_s, check=True)  # fmt: skip
        return float(got.stdout) - start
    finally:
        held.kill()
        held.communicate()


def main(argv: Sequence[str]) -> None:
    """``python -m tests.kit.netcluster takeover [RUNS]``: the take-over table of the docstring."""
    if list(argv[:1]) != ["takeover"]:
        sys.exit(main.__doc__)
    runs = int(argv[1]) if len(argv) > 1 else 3
    for label, kwargs in (
        ("tcp-user-timeout default, ping-timeout 5, keepalive default",
         {"tcp_user_timeout": None, "keepalive": None}),
        ("tcp-user-timeout 5, ping-timeout 5, keepalive 2/1/3", {}),
        ("tcp-user-timeout 10, ping-timeout 5, keepalive 2/1/3", {"tcp_user_timeout": 10}),
        ("tcp-user-timeout 10, ping-timeout default, keepalive 2/1/3",
         {"tcp_user_timeout": 10, "ping_timeout": None}),
    ):  # fmt: skip
        for took in _measure_takeover(runs, **kwargs):
            print(f"{label}: {took:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
