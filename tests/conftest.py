from __future__ import annotations

import functools
import inspect
import os
import shutil
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# The kit's checks assert as the tests do: pytest explains their failures too, once it knows
# them before they are first imported.
pytest.register_assert_rewrite("tests.kit")

from tests.kit import ROOT, fixtures  # noqa: E402


class _OneImportName:
    """The repository's folders are importable only as ``rocketstore.<folder>``. Tests put the
    checkout on ``sys.path`` (for ``tests.*``), which would also let ``import pipeline`` load a
    second copy of a module beside ``rocketstore.pipeline``'s: refused here, so that such an
    import fails in the suite as it does for a user."""

    BARE = frozenset({"pipeline", "sink", "source", "datasource", "jobs"})

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in self.BARE:
            raise ModuleNotFoundError(f"No module named {name!r} (import rocketstore.{name})")


sys.meta_path.insert(0, _OneImportName())  # type: ignore[arg-type]

# Every Spark driver the suite starts (the session below, and the jobs tests run with
# spark-submit or in processes of their own, which inherit this) is a JVM that lives for
# seconds to a minute on two cores: its C2 compiler's work does not pay back before it exits.
# With the JIT stopped at C1, the Spark tests took 78-83 s against 97-106 s (two runs each of
# test_sink_spark.py and test_source_spark.py, -n 2). A user's Spark keeps its own options.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")

# Hypothesis fails an example that takes over 200 ms by default: a timed assertion, which on a
# loaded two-core machine fails at random (a first example paying for imports and page faults
# took 309 ms). How long things take is the benchmarks' business, not the tests'.
settings.register_profile("rocketstore", deadline=None)
settings.load_profile("rocketstore")


@pytest.fixture(autouse=True)
def _current_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Lets :func:`tests.kit.fixtures.fixture_dir` see which test asks for a fixture store."""
    fixtures.running.append(request.node)
    yield
    fixtures.running.pop()


@pytest.fixture
def fixture_copy(tmp_path: Path):
    """Copy a fixture store to tmp_path (opening it writable may recover and write)."""

    def make(name: str) -> Path:
        src = fixtures.fixture_dir(name) / "store"
        dst = tmp_path / name
        shutil.copytree(src, dst)
        for p in dst.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        return dst

    return make


@pytest.fixture(autouse=True)
def _steady_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores opened by tests see a disk 50 % full unless a test passes its own ``disk_usage``:
    the suite must not depend on how full the machine's disk is (above 90 % every put would be
    refused, as it should be in production)."""
    monkeypatch.setattr("rocketstore.pipeline.engine.store.statvfs_used_ratio", lambda path: 0.5)


@pytest.fixture(autouse=True)
def _steady_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores opened by tests stamp 127.0.0.1 into a new directory's records, as they did
    before rocketstore took RocketMQ's default ``brokerIP1`` (this host's first non-loopback
    address, rocketstore.pipeline.engine.storehost): msgIds in the suite must not depend on the machine's network
    interfaces. Processes the tests start (Spark's Python workers, the console script) see
    the host's real address; tests/test_storehost.py checks the unpinned rule."""
    monkeypatch.setattr("rocketstore.pipeline.engine.storehost.host_address", lambda: "127.0.0.1")


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the whole run (starting one costs 10-20 s), with the
    ``rocketstore`` data source registered (where the PySpark has the API: 4.0 and later).
    Tests must not stop it or change its conf."""
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter (the venv), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("rocketstore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.stopTimeout", "60s")
        .config(
            "spark.driver.extraJavaOptions",
            f"-Dlog4j2.configurationFile={ROOT / 'conf' / 'log4j2.properties'}",
        )
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from rocketstore.jobs.common import register

    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Spark Connect server for the whole run (see tests/kit/connect_server.py), started by
    the first test that asks for it."""
    if shutil.which("java") is None:
        pytest.skip("needs Java 17 on PATH to run a Spark Connect server")
    pytest.importorskip("grpc", reason="the Spark Connect client needs pyspark[connect]")
    from tests.kit.connect_server import ConnectServer

    server = ConnectServer(tmp_path_factory.mktemp("connect-server"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def connect_url(connect_server: Any) -> str:
    """The ``sc://127.0.0.1:PORT`` of the run's Spark Connect server."""
    url: str = connect_server.url
    return url


GLUSTER_SKIP = "[GlusterFS]"


@pytest.fixture(scope="session")
def gluster_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """glusterd for the session: started once if none runs, stopped at the end."""
    from tests.kit.gluster import daemon, unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(f"{GLUSTER_SKIP} {why}")
    with daemon(tmp_path_factory.mktemp("glusterd")):
        yield


@pytest.fixture
def gluster_volume(gluster_daemon: None, tmp_path: Path) -> Iterator[Any]:
    """A replica-3 GlusterFS volume mounted twice (``.a``, ``.b``: two hosts' views), torn
    down after the test (tests/kit/gluster.py). Skipped where the machine cannot make one."""
    from tests.kit.gluster import volume

    with volume(tmp_path) as vol:
        yield vol


@pytest.fixture
def netcluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Hosts A, B and V with a network, mounting a replica-3 volume served from a namespace of
    its own, torn down after the test (tests/kit/netcluster.py). Parametrize it indirectly with a
    dict of ``tests.kit.netcluster.cluster`` keyword arguments for other hosts or timeouts.
    Skipped where the machine cannot make one."""
    from tests.kit.netcluster import cluster, unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(f"{GLUSTER_SKIP} {why}")
    with cluster(tmp_path, **getattr(request, "param", {})) as made:
        yield made


CEPH_FIXTURES = frozenset({"ceph", "bucket"})


@pytest.fixture(scope="session")
def ceph() -> Iterator[Any]:
    """A single-node Ceph with radosgw, one for the session (the tier's real S3;
    tests/kit/ceph.py; the MDS ticking every second), stopped and purged at the end. Skipped where the machine cannot run
    one (no ../shared, not root)."""
    from tests.kit.ceph import SKIP, cluster, unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(f"{SKIP} {why}")
    # Readers on another host wait for the MDS's tick on every look at the published point
    # (docs/cluster.md): at Ceph's 5 s, a round of the readers test took minutes under load.
    with cluster(mds_tick_s=1) as made:
        yield made


# The cross-host tests that need nothing particular to one file system run on each of these
# (``two_hosts``): GlusterFS (tests/kit/gluster.py) and CephFS through ceph-fuse
# (tests/kit/cephfs.py, on the session's Ceph).
SHARED_FILE_SYSTEMS = ("glusterfs", "cephfs")


@pytest.fixture(params=SHARED_FILE_SYSTEMS)
def two_hosts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Two hosts' mounts of one fresh shared folder (``.a``, ``.b``, ``.work`` a local folder,
    ``.client_pid(point)``, ``.lose_host(point)``, ``.in_namespace(cmd, at)``), on each file
    system of SHARED_FILE_SYSTEMS in turn. Skipped, saying why, where one cannot be made."""
    if request.param == "glusterfs":
        yield request.getfixturevalue("gluster_volume")
        return
    from tests.kit.ceph import SKIP
    from tests.kit.cephfs import hosts

    ceph = request.getfixturevalue("ceph")
    if not ceph.env.get("CEPHFS_MOUNT"):
        pytest.skip(f"{SKIP} no CephFS: no /dev/fuse for ceph-fuse here")
    with hosts(ceph, tmp_path) as made:
        yield made


@pytest.fixture
def bucket(ceph: Any) -> str:
    """A fresh, empty bucket of the session's radosgw."""
    name: str = ceph.new_bucket()
    return name


# -- the quick tier -------------------------------------------------------------------------
#
# `make check` runs the tests not marked ``heavy``: those that start no other process (no Spark
# session or spark-submit, no JVM, no server, no mount, no namespace, no browser). The mark is
# given here from what a test uses, so that a new test lands in the right tier by itself: its
# markers, its fixtures, and the names its code (and that of the fixtures and test helpers it
# calls, followed through tests/ and bench/) reaches.

# Fixtures that start Spark or another machine-wide resource (also found by the walk below;
# named here because they are the common case).
HEAVY_FIXTURES = frozenset(
    {"spark", "connect_server", "connect_url", "gluster_daemon", "gluster_volume", "netcluster"}
    | {"two_hosts"}
    | CEPH_FIXTURES
)
# Marks that say a test is slow or shares a machine-wide resource.
HEAVY_MARKERS = ("slow", "gluster", "xdist_group")
# Modules whose use means another process (or a JVM): any name of them, or under them.
PROCESS_MODULES = frozenset({"subprocess", "multiprocessing", "pyspark", "selenium"})
# What of ``os`` starts or replaces a process.
PROCESS_CALLS = frozenset(
    {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
)
# Where the walk follows code: the suite's and the benchmarks' (whose harness runs git, Python
# and Spark processes). The package's own code is not followed: what of it starts processes
# (the jobs, the Spark faces) is reached through pyspark or the fixtures.
WALKED = (Path(__file__).resolve().parent, ROOT / "bench")


def _walked(obj: object) -> bool:
    """Whether ``obj`` (a function, class or module) was defined in a file under WALKED."""
    if isinstance(obj, types.ModuleType):
        paths = [getattr(obj, "__file__", None), *getattr(obj, "__path__", ())]
    elif isinstance(obj, type):
        paths = [getattr(sys.modules.get(obj.__module__), "__file__", None)]
    else:
        paths = [getattr(getattr(obj, "__code__", None), "co_filename", None)]
    return any(p is not None and _under_walked(p) for p in paths)


@functools.cache
def _under_walked(path: str) -> bool:
    return any(Path(path).resolve().is_relative_to(d) for d in WALKED)


class _ProcessWalk:
    """Follows a test's (or fixture's) code through the functions and classes of WALKED it
    names, and says whether it reaches a way to start a process."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def reaches(self, obj: object) -> bool:
        if id(obj) in self.seen:
            return False
        self.seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            return obj.__name__.partition(".")[0] in PROCESS_MODULES
        module = getattr(obj, "__module__", None)
        if isinstance(module, str) and module.partition(".")[0] in PROCESS_MODULES:
            return True
        if isinstance(obj, type):
            return _walked(obj) and any(self.reaches(m) for m in self._members(obj))
        # Through decorators (contextlib.contextmanager's wrapper is contextlib's code).
        func = inspect.unwrap(obj) if callable(obj) else obj
        code = getattr(func, "__code__", None)
        if code is None or not _walked(func):
            return False
        return self._code(code, func.__globals__)

    def _members(self, cls: type) -> Iterator[object]:
        for klass in cls.__mro__:
            for member in vars(klass).values():
                if isinstance(member, (staticmethod, classmethod)):
                    yield member.__func__
                elif isinstance(member, property):
                    yield from (f for f in (member.fget, member.fset) if f is not None)
                elif inspect.isfunction(member) or isinstance(member, type):
                    yield member

    def _code(self, code: types.CodeType, scope: dict[str, Any]) -> bool:
        names = set(code.co_names)
        # A local import names the module in co_names too ("pyspark.sql", "subprocess").
        if any(name.partition(".")[0] in PROCESS_MODULES for name in names):
            return True
        if "os" in names and scope.get("os") is os and names & PROCESS_CALLS:
            return True
        for name in names:
            value = scope.get(name)
            if value is None:
                continue
            if self.reaches(value):
                return True
            # tests.gluster.volume(...): the attributes this code names of a kit module.
            kit = isinstance(value, types.ModuleType) and _walked(value)
            if kit and any(self.reaches(getattr(value, n)) for n in names if hasattr(value, n)):
                return True
        return any(
            self._code(const, scope)
            for const in code.co_consts
            if isinstance(const, types.CodeType)
        )


def _heavy(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(name) for name in HEAVY_MARKERS):
        return True
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & HEAVY_FIXTURES:
        return True
    used: list[Callable[..., Any]] = [item.function] if isinstance(item, pytest.Function) else []
    info = getattr(item, "_fixtureinfo", None)
    for name in fixtures:
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs:
            used.append(defs[-1].func)
    return any(_ProcessWalk().reaches(func) for func in used)


def _on(item: pytest.Item) -> str | None:
    """The shared file system a ``two_hosts`` test runs on, or None."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("two_hosts") if callspec is not None else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the tests of the heavy tier (above), and groups tests for ``pytest -n``.

    Under ``pytest -n`` (``make test``), tests that share one machine-wide resource run in
    one worker, one after another: GlusterFS tests share the one ``glusterd``, which the first
    to need it may start and stop; the Spark standalone cluster tests (six JVMs each) would
    starve each other, and share the nodes' Python built once per worker. Clusters with a
    network (``netcluster``) share nothing with those (a glusterd, state and namespaces of
    their own) and run in a group of their own: one at a time, so that the take-over times
    they measure do not also measure another cluster's load. The tier's tests share one
    Ceph (``ceph``) and run in a group of their own too; the tests across hosts on CephFS
    (``two_hosts`` on ``cephfs``) in another, whose worker starts a Ceph of its own for them
    (a worker that runs both groups starts one)."""
    for item in items:
        if _heavy(item):
            item.add_marker(pytest.mark.heavy)
        if "netcluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("netcluster"))
        elif _on(item) == "cephfs":
            # The tests across hosts on CephFS, apart from the S3 ones: each group starts the
            # Ceph of its worker's session once, and the two together were the suite's
            # longest group.
            item.add_marker(pytest.mark.xdist_group("cephfs"))
        elif CEPH_FIXTURES & set(getattr(item, "fixturenames", ())):
            # One Ceph a session: its tests in one worker, so that one is started.
            item.add_marker(pytest.mark.xdist_group("ceph"))
        elif (
            "gluster_volume" in getattr(item, "fixturenames", ())
            or _on(item) == "glusterfs"
            or item.get_closest_marker("gluster")
            or item.nodeid.startswith("tests/test_cluster.py")
        ):
            item.add_marker(pytest.mark.xdist_group("gluster"))
    if hasattr(config, "workerinput"):
        # Under -n each worker takes the next test when it is nearly done with those it has
        # (the groups go first, largest first): the slow tests first, the quick ones last, so
        # that at the end neither worker waits long for the other's last test.
        items.sort(
            key=lambda item: (
                0
                if item.get_closest_marker("slow")
                else 1
                if item.get_closest_marker("heavy")
                else 2
            )
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say how many tests skipped for want of GlusterFS or Ceph, and why: a run that skips them
    has not checked the store across hosts (nor the tier against a real S3)."""
    from tests.kit.ceph import SKIP as CEPH_SKIP

    reasons: dict[tuple[str, str], int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        reason = str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else "")
        for tag, what in ((GLUSTER_SKIP, "across hosts (GlusterFS)"), (CEPH_SKIP, "on Ceph")):
            if tag in reason:
                key = (what, reason.split(tag, 1)[1].strip())
                reasons[key] = reasons.get(key, 0) + 1
    for (what, text), count in reasons.items():
        terminalreporter.write_line(f"{count} test(s) {what} skipped: {text}", yellow=True)
