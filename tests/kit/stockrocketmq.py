"""The stock Apache RocketMQ 4.9.4 servers and tools of ../shared/rocketmq-4.9.4, for tests that
hold rocketstore's files against RocketMQ itself.

:func:`unavailable` says why they cannot run on this machine (the tests then skip with that
reason). :class:`StockCluster` runs a name server and brokers in a network namespace of its own:
the servers bind every address (4.9.4 has no setting for it), and a private namespace keeps them
off the host's ports and lets several tests use the same port numbers at once. The kit's tools
(``mqadmin.sh``, ``consume.sh``, ...) run in the same namespace through :meth:`StockCluster.tool`,
and the tests' own programs against the stock client (``tests/java/``, compiled by
:func:`build_java`) through :meth:`StockCluster.java`.

A server counts as up when it prints its "boot success" line: a reader thread per server copies
its output to ``RUN/<name>.out`` and reports that line (or the end of the output, when the
server dies), so nothing waits by sleeping.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import queueread
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format import native
from tests.kit import ROOT
from tests.kit.fixtures import SMALL_CONFIG

KIT = ROOT.parent / "shared" / "rocketmq-4.9.4"
NAMESRV_PORT = 19876
BROKER_PORT = 20911
# Brokers on one host: each listens on its port, the one above (HA) and the one two below (VIP
# channel). Ten apart, as rocketstore numbers a root's brokers' ports (rocketstore.pipeline.engine.storehost).
PORT_STEP = 10
BOOT_SECONDS = 90  # a broker on a small store boots in 1-3 s on an idle machine
STOP_SECONDS = 60  # a clean stop takes 4-7 s


def unavailable() -> str | None:
    """Why the stock servers cannot run here, or None when they can."""
    if not KIT.is_dir():
        return f"needs the stock RocketMQ 4.9.4 kit at {KIT} (../shared beside the clone)"
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        return "needs root with unshare and nsenter to run the stock servers in a network namespace"
    # env.sh checks the Debian jars and java, and says what is missing.
    check = subprocess.run(
        ["bash", "-c", '. "$0/env.sh"', str(KIT)], capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        return f"the stock RocketMQ kit cannot run: {check.stderr.strip()}"
    return None


@dataclasses.dataclass(frozen=True, order=True)
class Consumed:
    """One message as the stock pull consumer (``consume.sh``) printed it."""

    topic: str
    broker: str
    queue_id: int
    queue_offset: int
    keys: str
    tags: str
    body: bytes


@dataclasses.dataclass
class Server:
    name: str
    proc: subprocess.Popen[str]
    log: Path
    reader: threading.Thread


class StockCluster:
    """A network namespace holding a stock name server (started on entry) and the brokers
    :meth:`broker` starts; everything still running is stopped on exit, brokers first."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        # The kit's scripts keep their logs, generated confs and state under RMQ_RUN.
        self.env = {**os.environ, "RMQ_RUN": str(run_dir)}
        self._holder: subprocess.Popen[str] | None = None
        self._servers: list[Server] = []

    def __enter__(self) -> StockCluster:
        # The namespace lives as long as this process does; `cat` ends when its stdin closes.
        self._holder = subprocess.Popen(
            ["unshare", "-n", "--", "sh", "-c", "ip link set lo up && echo up && exec cat"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._holder.stdout is not None
        if self._holder.stdout.readline().strip() != "up":
            self._holder.kill()
            raise RuntimeError("could not make a network namespace (unshare -n)")
        try:
            self._start("namesrv", [str(KIT / "namesrv.sh"), str(NAMESRV_PORT)])
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for server in reversed(self._servers):
            self.stop(server)
        if self._holder is not None:
            assert self._holder.stdin is not None
            self._holder.stdin.close()
            self._holder.wait(timeout=STOP_SECONDS)
            self._holder = None

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{NAMESRV_PORT}"

    def _in_namespace(self, argv: list[str]) -> list[str]:
        assert self._holder is not None, "the cluster is not running"
        return ["nsenter", f"--net=/proc/{self._holder.pid}/ns/net", "--", *argv]

    def _start(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        *,
        refused: bool = False,
    ) -> Server:
        """Start a server and wait for its boot line; with ``refused``, wait instead for it to
        end without one (raising if it boots)."""
        log = self.run_dir / f"{name}.out"
        proc = subprocess.Popen(
            self._in_namespace(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**self.env, **(env or {})},
        )
        events: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        reader = threading.Thread(target=_copy, args=(proc.stdout, log, events), daemon=True)
        reader.start()
        server = Server(name, proc, log, reader)
        self._servers.append(server)
        try:
            event = events.get(timeout=BOOT_SECONDS)
        except queue.Empty:
            event = "timed out"
        if refused:
            self.stop(server)
            if event != "ended":
                raise AssertionError(f"stock {name} {event} although it was expected to refuse")
            return server
        if event != "booted":
            self.stop(server)
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
            raise RuntimeError(f"stock {name} did not start; the end of its output:\n{tail}")
        return server

    def broker(self, store: Path, port: int = BROKER_PORT, *conf: str) -> Server:
        """A stock broker serving ``store`` (brokerName = its directory's name,
        ``autoCreateTopicEnable=false``; ``conf`` adds broker.conf lines), once it is up."""
        return self._start(
            f"broker-{store.name}-{port}",
            [str(KIT / "broker.sh"), str(store), str(port), str(NAMESRV_PORT), *conf],
        )

    def refused_broker(self, store: Path, port: int = BROKER_PORT, *conf: str) -> tuple[int, str]:
        """Start a stock broker on ``store`` that is expected to exit without booting (the
        directory's lock is held); its exit status and output."""
        server = self._start(
            f"refused-{store.name}-{port}",
            [str(KIT / "broker.sh"), str(store), str(port), str(NAMESRV_PORT), *conf],
            refused=True,
        )
        assert server.proc.returncode is not None
        return server.proc.returncode, server.log.read_text(errors="replace")

    @contextlib.contextmanager
    def serving(self, stores: list[Path], *conf: str) -> Iterator[list[int]]:
        """Stock brokers on ``stores`` (broker ``i`` on ``BROKER_PORT + PORT_STEP * i``) for the
        body of the ``with``, stopped cleanly after it; yields their ports."""
        ports = [BROKER_PORT + PORT_STEP * i for i in range(len(stores))]
        started: list[Server] = []
        try:
            for store, port in zip(stores, ports, strict=True):
                started.append(self.broker(store, port, *conf))
            yield ports
        finally:
            for server in reversed(started):
                self.stop(server)

    def spawn(self, script: str, *args: str) -> subprocess.Popen[str]:
        """Start one of the kit's client scripts in the namespace without waiting for it."""
        return subprocess.Popen(
            self._in_namespace([str(KIT / script), *args]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )

    def mqadmin(self, command: str, *args: str) -> str:
        """``mqadmin COMMAND -n NAMESRV ARGS...``: its standard output."""
        return self.tool("mqadmin.sh", command, "-n", self.namesrv, *args)

    def stop(self, server: Server) -> None:
        """Stop a server cleanly (SIGTERM: a broker persists its config files as it stops)."""
        if server not in self._servers:
            return
        self._servers.remove(server)
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            try:
                server.proc.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()
        server.reader.join()

    def tool(
        self, script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 180
    ) -> str:
        """Run one of the kit's client scripts in the namespace; its standard output. A failure
        raises with its output."""
        return self._run([str(KIT / script), *args], f"{script} {' '.join(args)}", env, timeout)

    def java(self, classes: Path, main: str, *args: str, timeout: float = 180) -> str:
        """Run the class ``main`` of a program :func:`build_java` compiled into ``classes``, as
        the kit runs its client tools (its classpath and JVM options), in the namespace; its
        standard output. A failure raises with its output."""
        launch = '. "$1/env.sh" && cp="$2:$CP" && shift 2 && exec java $JOPTS_CLIENT -cp "$cp" "$@"'
        argv = ["bash", "-c", launch, "java", str(KIT), str(classes), main, *args]
        return self._run(argv, f"{main} {' '.join(args)}", None, timeout)

    def _run(self, argv: list[str], label: str, env: dict[str, str] | None, timeout: float) -> str:
        done = self._complete(argv, env, timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{label} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done.stdout

    def _complete(
        self, argv: list[str], env: dict[str, str] | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._in_namespace(argv),
            capture_output=True,
            text=True,
            env={**self.env, **(env or {})},
            timeout=timeout,
            check=False,
        )

    def consumer_progress(
        self, group: str, timeout: float = 120
    ) -> tuple[dict[tuple[str, str, int], QueueProgress], int]:
        """``mqadmin consumerProgress -g group``, parsed (:func:`parse_consumer_progress`).

        mqadmin finds a group's brokers by the route of its retry topic, which a broker creates
        when the group's first heartbeat arrives and tells the name server of one way; until
        the name server has it, mqadmin prints nothing on stdout (and still exits 0). So it is
        asked again until it answers, for ``timeout`` seconds."""
        argv = [str(KIT / "mqadmin.sh"), "consumerProgress", "-n", self.namesrv, "-g", group]
        deadline = time.monotonic() + timeout
        while True:
            done = self._complete(argv, None, 180)
            if done.returncode == 0 and "Diff Total:" in done.stdout:
                return parse_consumer_progress(done.stdout)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"consumerProgress -g {group} gave no progress in {timeout} s; last "
                    f"exit {done.returncode}:\n{done.stdout}{done.stderr[-3000:]}"
                )

    def produce(self, topic: str, n: int) -> None:
        """Send ``n`` messages to ``topic`` with the stock producer (``produce.sh``: body
        ``hello I``, keys ``kI``, tags A/B/C); raises unless every send was SEND_OK."""
        check_sent(self.tool("produce.sh", str(NAMESRV_PORT), topic, str(n)), n)

    def consume(self, topic: str, idle_ms: int = 3000) -> list[Consumed]:
        """Every message of ``topic`` the stock pull consumer reads from the earliest offsets
        (it stops after ``idle_ms`` without a new one)."""
        env = {"CONSUME_JOPTS": f"-DidleMs={idle_ms}"}
        return parse_consumed(self.tool("consume.sh", str(NAMESRV_PORT), topic, env=env))


def javac_unavailable() -> str | None:
    """Why test programs against the stock client cannot be compiled here, or None."""
    if shutil.which("javac") is None:
        return "needs javac (a JDK 17) to build the test's Java program against the stock client"
    return None


def build_java(source: Path, out: Path) -> Path:
    """Compile ``source`` against the kit's jars into ``out`` (the classes directory, for
    :meth:`StockCluster.java`)."""
    out.mkdir(parents=True, exist_ok=True)
    compile_ = '. "$0/env.sh" && exec javac -nowarn -cp "$CP" -d "$1" "$2"'
    done = subprocess.run(
        ["bash", "-c", compile_, str(KIT), str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"javac {source} failed:\n{done.stdout}{done.stderr}")
    return out


@dataclasses.dataclass(frozen=True)
class QueueProgress:
    """One row of ``mqadmin consumerProgress -g GROUP``."""

    broker_offset: int
    consumer_offset: int
    diff: int


def parse_consumer_progress(stdout: str) -> tuple[dict[tuple[str, str, int], QueueProgress], int]:
    """``mqadmin consumerProgress -g GROUP``'s rows by (topic, brokerName, queueId), and its
    ``Diff Total``. Its table: ``#Topic #Broker Name #QID #Broker Offset #Consumer Offset``,
    ``#Client IP`` while the group has consumers online, ``#Diff #LastTime``."""
    rows: dict[tuple[str, str, int], QueueProgress] = {}
    total: int | None = None
    with_ip = False
    for line in stdout.splitlines():
        if line.startswith("#Topic"):
            with_ip = "#Client IP" in line
        elif line.startswith("Diff Total:"):
            total = int(line.split(":", 1)[1])
        elif len(fields := line.split()) >= 6 and fields[2].isdigit():
            topic, broker, qid, broker_offset, consumer_offset = fields[:5]
            diff = fields[6] if with_ip else fields[5]
            rows[(topic, broker, int(qid))] = QueueProgress(
                int(broker_offset), int(consumer_offset), int(diff)
            )
    if total is None:
        raise AssertionError(f"consumerProgress printed no Diff Total:\n{stdout[-2000:]}")
    return rows, total


def _copy(stream: IO[str], log: Path, events: queue.Queue[str]) -> None:
    """Copy a server's output to ``log``; put "booted" on ``events`` at its boot line and
    "ended" when the output ends (the server is gone), so that a waiter wakes either way."""
    with open(log, "w", encoding="utf-8") as out:
        for line in stream:
            out.write(line)
            out.flush()
            if "boot success" in line:
                events.put("booted")
    events.put("ended")


def parse_consumed(stdout: str) -> list[Consumed]:
    """The ``MSG`` lines of one or more runs of ``consume.sh`` (``serve-and-consume.sh`` runs
    it once per topic), each run checked against the ``COUNT`` line that closes it."""
    rows: list[Consumed] = []
    closed = 0  # rows up to here belong to runs whose COUNT matched
    runs = 0
    for line in stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "MSG":
            topic, broker, queue_id, offset, keys, tags, body = parts[1:]
            rows.append(
                Consumed(topic, broker, int(queue_id), int(offset), keys, tags, bytes.fromhex(body))
            )
        elif parts[0] == "COUNT":
            if int(parts[1]) != len(rows) - closed:
                raise AssertionError(
                    f"consume.sh printed {len(rows) - closed} messages but {line!r}"
                )
            closed, runs = len(rows), runs + 1
    if runs == 0 or closed != len(rows):
        raise AssertionError(f"consume.sh output ends without its COUNT line:\n{stdout[-2000:]}")
    return rows


def check_sent(stdout: str, n: int) -> None:
    """Raise unless ``produce.sh``'s summary says all ``n`` messages were sent (SEND_OK)."""
    if f"SENT ok={n} notOk=0 failed=0" not in stdout:
        raise AssertionError(f"the stock producer did not send all {n}:\n{stdout[-2000:]}")


def parse_topic_status(stdout: str) -> dict[tuple[str, int], tuple[int, int]]:
    """``mqadmin topicStatus``'s rows: (brokerName, queueId) to (min offset, max offset)."""
    rows: dict[tuple[str, int], tuple[int, int]] = {}
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and not line.startswith("#") and fields[1].isdigit():
            rows[(fields[0], int(fields[1]))] = (int(fields[2]), int(fields[3]))
    return rows


def parse_query_by_key(stdout: str) -> list[tuple[str, int, int]]:
    """``mqadmin queryMsgByKey``'s rows: (message id as printed, queueId, queue offset)."""
    found = re.findall(r"^([0-9A-F]{32,56})\s+(\d+)\s+(\d+)\s*$", stdout, re.MULTILINE)
    return [(msg_id, int(qid), int(offset)) for msg_id, qid, offset in found]


def parse_message(stdout: str) -> dict[str, str]:
    """The ``Name: value`` lines ``mqadmin queryMsgById`` and ``queryMsgByUniqueKey`` print
    for one message (``OffsetID``, ``Topic``, ``Keys``, ``Store Host``, ...)."""
    fields: dict[str, str] = {}
    for line in stdout.splitlines():
        name, sep, value = line.partition(":")
        if sep and name and not name.startswith(" ") and value.startswith(" "):
            fields.setdefault(name.strip(), value.strip())
    return fields


# Small files, so that brokers and rocketstore both roll CommitLog segments, ConsumeQueue files
# and IndexFiles; the stock brokers are given the same geometry (RocketMQ's names throughout).
GEOMETRY = {
    "mappedFileSizeCommitLog": SMALL_CONFIG.mapped_file_size_commitlog,
    "mappedFileSizeConsumeQueue": SMALL_CONFIG.mapped_file_size_consume_queue,
    "maxHashSlotNum": SMALL_CONFIG.max_hash_slot_num,
    "maxIndexNum": SMALL_CONFIG.max_index_num,
}
BROKER_CONF = [
    *(f"{name}={value}" for name, value in GEOMETRY.items()),
    # A stock broker refuses sends with SYSTEM_BUSY (which its producer does not retry) when a
    # send waits over 200 ms in its queue or a put holds the log over 1 s: flow control that a
    # loaded two-core machine trips. These tests are about the files, so it is loosened.
    "waitTimeMillsInSendQueue=30000",
    "osPageCacheBusyTimeOutMills=30000",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StockCluster]:
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    with StockCluster(tmp_path_factory.mktemp("rmq-run")) as running:
        yield running


# -- what a stock consumer read, against rocketstore's own reading ---------------------------


def as_consumed(store_dir: Path, topic: str, config: StoreConfig = SMALL_CONFIG) -> list[Consumed]:
    """Every message of ``topic`` as rocketstore reads the directory (read-only), in the form
    the stock consumer prints (a missing KEYS or TAGS is Java's ``null``)."""
    with MessageStore(store_dir, config, read_only=True) as store:
        return [
            Consumed(
                topic,
                store_dir.name,
                m.queue_id,
                m.queue_offset,
                m.properties.get("KEYS", "null"),
                m.properties.get("TAGS", "null"),
                m.body,
            )
            for info in store.queue_infos(topic)
            for batch in queueread.queue_batches(store, topic, info.queue_id)
            for m in native.messages(batch)
        ]


def content(rows: Sequence[Consumed]) -> collections.Counter[tuple[str, str, str, bytes]]:
    """What was stored, whatever queue and offset: (topic, keys, tags, body), with counts."""
    return collections.Counter((r.topic, r.keys, r.tags, r.body) for r in rows)


def assert_dense(rows: Sequence[Consumed]) -> None:
    """Each queue's offsets are 0, 1, ..., n - 1: nothing missing, nothing twice."""
    per_queue: dict[tuple[str, str, int], list[int]] = collections.defaultdict(list)
    for r in rows:
        per_queue[(r.topic, r.broker, r.queue_id)].append(r.queue_offset)
    for key, offsets in per_queue.items():
        assert sorted(offsets) == list(range(len(offsets))), key


def serve_and_consume(
    cluster: StockCluster,
    store_dir: Path,
    topic: str,
    produce: int,
    want: collections.Counter[tuple[str, str, str, bytes]],
) -> list[Consumed]:
    """A stock broker on ``store_dir`` for a while: ``produce`` messages sent to ``topic``
    (added to ``want``), then every message of it consumed, which must be ``want``'s and
    dense; what was consumed."""
    with cluster.serving([store_dir], *BROKER_CONF):
        if produce:
            cluster.produce(topic, produce)
        want += collections.Counter(
            (topic, f"k{i}", "ABC"[i % 3], f"hello {i}".encode()) for i in range(produce)
        )
        consumed = cluster.consume(topic)
    assert content(consumed) == want
    assert_dense(consumed)
    return consumed
