"""Kill -9 crash test: a writer process is killed at random moments; every reopen must recover.

``tests/procs/crash_writer.py`` puts batches (1..500 messages) and single messages into a store
with 64 KiB CommitLog segments, acknowledging each put in a file only after the put returned. The
test kills it with SIGKILL after a random number of acknowledgements (plus a random jitter of a few
milliseconds, so that kills land inside puts too), then reopens the store in this process, which
runs the abnormal recovery (``abort`` is present), and checks:

1. every acknowledged put is present and intact: the record at its CommitLog offset is the
   message derived from its ``seq``, and its queue offset is the one the put returned;
2. nothing that was not put appears: every record of the recovered CommitLog (walked from its
   first to its last offset) is a message of a put, stored once; records of the put that was in
   flight at the kill may be there, but only whole messages forming a prefix of that put;
3. every ConsumeQueue holds queue offsets ``min .. max-1`` without holes: ``get_messages`` over
   the whole queue returns ``max - min`` messages with consecutive queue offsets, each unit
   points at a record of its topic and queue with the unit's size and tags code, and every
   record of the CommitLog has exactly one unit;
4. the key index answers: ``query_by_key`` finds a sample of acknowledged messages by KEYS and
   by UNIQ_KEY (exactly the one message);
5. writing continues: more puts after recovery, a clean close, and the next writer cycle goes on
   with the same store.

Every fourth kill is not checked at once: the next writer opens the crashed store itself (and
may be killed during that recovery), so recovery also runs over a store a recovery left. The
checks collect every broken invariant with its offset and fail with the list.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import random
import selectors
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import rocketstore.pipeline
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import StoreError
from rocketstore.pipeline.format.record import MessageExt, encode_record
from tests.kit import PROCS
from tests.kit.crashdata import GEOMETRY, Expected, store_config
from tests.kit.crashdata import expected as derive
from tests.kit.model import java_hash

WRITER = PROCS / "crash_writer.py"
PIPELINE_ROOT = Path(rocketstore.pipeline.__file__).resolve().parent.parent  # the code under test
SEGMENT = GEOMETRY["mapped_file_size_commitlog"]
MAGIC = -626843481  # 0xDAA320A7
BLANK_MAGIC = -875286124  # 0xCBD43194
SIZE_MAGIC = struct.Struct(">ii")
RESERVED_PROPERTIES = ("KEYS", "TAGS", "UNIQ_KEY")

KILLS = 12  # per flush mode
UNCHECKED_EVERY = 4  # every 4th kill is recovered by the next writer, not checked at once
SEQ_SPAN = 10_000_000  # seq numbers of writer cycle c: c * SEQ_SPAN + 1 ...
AFTER_RECOVERY = 9_000_000  # ... and of the test's own puts after recovery: + 9_000_000
WAIT_S = 30.0  # bound on any wait for the writer
MAX_PROBLEMS = 25


@functools.cache
def expected(seq: int) -> Expected:
    """Message ``seq`` as the writer derives it (cached: every check looks at every message)."""
    return derive(seq)


# -- the writer process --------------------------------------------------------------------------


class Writer:
    """``crash_writer.py`` in a subprocess; its stdout is read line by line, with deadlines."""

    def __init__(self, store: Path, work: Path, name: str, flush: str, seed: int, first: int):
        self.acks = work / f"{name}.acks"
        self.intents = work / f"{name}.intents"
        self.stderr_path = work / f"{name}.stderr"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PIPELINE_ROOT), env.get("PYTHONPATH", "")) if p
        )
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(WRITER),
                    str(store),
                    str(self.acks),
                    str(self.intents),
                    "--flush",
                    flush,
                    "--seed",
                    str(seed),
                    "--first-seq",
                    str(first),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
            )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._pending = b""
        self.lines: list[str] = []

    @property
    def acked(self) -> int:
        """Acknowledgements the writer reported on stdout so far."""
        return sum(1 for line in self.lines if line.startswith("ack "))

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def wait_for(self, done: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"writer: no {what} within {timeout:.0f} s\n{self.stderr()}")
            if not self._selector.select(left):
                continue
            chunk = os.read(self._fd, 65536)
            if not chunk:
                code = self.proc.wait(timeout=WAIT_S)
                raise AssertionError(
                    f"writer exited (status {code}) before {what}; stdout {self.lines[-3:]}\n"
                    f"{self.stderr()}"
                )
            *complete, self._pending = (self._pending + chunk).split(b"\n")
            self.lines.extend(c.decode() for c in complete)

    def wait_acks(self, n: int) -> None:
        self.wait_for(lambda: self.acked >= n, f"acknowledgement {n}")

    def kill(self) -> None:
        """SIGKILL; the writer must have been running until then."""
        alive = self.proc.poll() is None
        if alive:
            self.proc.send_signal(signal.SIGKILL)
        code = self.proc.wait(timeout=WAIT_S)
        self._selector.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        assert alive and code == -signal.SIGKILL, (
            f"writer ended by itself (status {code}) before the kill\n{self.stderr()}"
        )


# -- what the writer acknowledged ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Put:
    first: int
    n: int
    offsets: tuple[int, ...] = ()
    queue_offsets: tuple[int, ...] = ()

    @property
    def seqs(self) -> range:
        return range(self.first, self.first + self.n)


@dataclasses.dataclass
class CycleLog:
    acked: list[Put]
    in_flight: Put | None
    torn_ack: bool


def read_cycle(w: Writer) -> CycleLog:
    """The puts a killed writer acknowledged, and the one it had in flight (if any)."""
    raw = w.acks.read_bytes() if w.acks.exists() else b""
    *lines, tail = raw.split(b"\n")
    acked = []
    for line in lines:
        d = json.loads(line)
        acked.append(Put(d["first"], d["n"], tuple(d["offsets"]), tuple(d["queue_offsets"])))
        assert len(acked[-1].offsets) == len(acked[-1].queue_offsets) == d["n"], d
    assert len(acked) >= w.acked, (
        f"{w.acks}: {len(acked)} complete lines, but the writer reported {w.acked} acks"
    )
    raw_intents = w.intents.read_bytes() if w.intents.exists() else b""
    intents = [(int(a), int(b)) for a, b in (x.split() for x in raw_intents.split(b"\n")[:-1])]
    assert [(p.first, p.n) for p in acked] == intents[: len(acked)], "acks do not match intents"
    assert len(intents) <= len(acked) + 1, f"{len(intents)} intents for {len(acked)} acks"
    in_flight = Put(*intents[-1]) if len(intents) == len(acked) + 1 else None
    return CycleLog(acked, in_flight, bool(tail))


class Model:
    """What must be in the store (``known``), and the puts in flight at kills not yet checked."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[int, int]] = {}  # seq -> (CommitLog offset, queue offset)
        self.pending: list[Put] = []

    def acknowledge(self, put: Put) -> None:
        for seq, off, qo in zip(put.seqs, put.offsets, put.queue_offsets, strict=True):
            assert seq not in self.known, f"seq {seq} acknowledged twice"
            self.known[seq] = (off, qo)

    def pending_put(self, seq: int) -> Put | None:
        return next((p for p in self.pending if seq in p.seqs), None)


# -- checks --------------------------------------------------------------------------------------


class Problems:
    def __init__(self, label: str) -> None:
        self.label = label
        self.items: list[str] = []
        self.count = 0

    def add(self, text: str) -> None:
        self.count += 1
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(text)

    def raise_if_any(self, report: object) -> None:
        if self.count:
            listing = "\n  ".join(self.items)
            more = (
                f"\n  ... and {self.count - len(self.items)} more"
                if self.count > len(self.items)
                else ""
            )
            raise AssertionError(
                f"{self.label}: {self.count} broken invariant(s)\n  {listing}{more}\n"
                f"recovery report: {report}"
            )


def content_problem(m: MessageExt) -> str | None:
    """Why the record is not exactly the message its ``seq`` property names (None if it is)."""
    text = m.properties.get("seq", "")
    if not text.isdigit():
        return f"no seq property (properties {m.properties!r})"
    e = expected(int(text))
    user = {k: v for k, v in m.properties.items() if k not in RESERVED_PROPERTIES}
    wrong = [
        name
        for name, ok in (
            ("topic", m.topic == e.topic),
            ("queueId", m.queue_id == e.queue_id),
            ("body", m.body == e.body),
            ("keys", m.keys == [e.key]),
            ("tags", m.tags == e.tags),
            ("uniqKey", m.uniq_key == e.uniq_key),
            ("properties", user == e.properties),
            ("flag/sysFlag", m.flag == 0 and m.sys_flag & 0xC == 0),
            ("reconsumeTimes", m.reconsume_times == 0 and m.prepared_transaction_offset == 0),
        )
        if not ok
    ]
    return f"seq {e.seq}: wrong {', '.join(wrong)}" if wrong else None


def is_blank(store_dir: Path, pos: int) -> bool:
    """Whether an END_OF_FILE blank sits at ``pos`` (read from the segment file itself)."""
    base = pos - pos % SEGMENT
    path = store_dir / "commitlog" / f"{base:020d}"
    with open(path, "rb") as f:
        f.seek(pos - base)
        head = f.read(8)
    return len(head) == 8 and SIZE_MAGIC.unpack(head) == (base + SEGMENT - pos, BLANK_MAGIC)


def walk_commitlog(store: MessageStore, problems: Problems) -> list[MessageExt]:
    """Every record from the CommitLog's min to its max offset, END_OF_FILE blanks skipped."""
    pos, end = store.min_phy_offset, store.max_phy_offset
    out: list[MessageExt] = []
    while pos < end:
        try:
            m = store.get_message(pos)
        except StoreError as exc:
            if is_blank(store.path, pos):
                pos += SEGMENT - pos % SEGMENT
                continue
            problems.add(f"CommitLog offset {pos} (< max {end}) is not a readable record: {exc}")
            return out
        if m.commit_log_offset != pos or m.store_size <= 0:
            problems.add(f"CommitLog offset {pos}: record says offset {m.commit_log_offset}")
            return out
        out.append(m)
        pos += m.store_size
    if pos != end:
        problems.add(f"CommitLog walk ended at {pos}, past max_phy_offset {end}")
    return out


@dataclasses.dataclass
class CheckStats:
    records: int = 0
    in_flight_present: int = 0  # messages of in-flight puts kept by recovery
    kept: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    queues: int = 0
    lookups: int = 0


def check_store(store: MessageStore, model: Model, rng: random.Random, label: str) -> CheckStats:
    """Invariants 1-4 of the module docstring; raises listing every broken one."""
    problems = Problems(label)
    stats = CheckStats()
    report = store.recovery.to_json() if getattr(store, "recovery", None) else None

    # 2. The recovered CommitLog: every record is a message that was put, stored once.
    records = walk_commitlog(store, problems)
    stats.records = len(records)
    by_offset = {m.commit_log_offset: m for m in records}
    seq_at: dict[int, int] = {}  # seq -> offset
    for m in records:
        why = content_problem(m)
        if why:
            problems.add(f"CommitLog offset {m.commit_log_offset}: {why}")
            continue
        seq = int(m.properties["seq"])
        if seq in seq_at:
            problems.add(f"seq {seq} stored twice, at {seq_at[seq]} and {m.commit_log_offset}")
            continue
        seq_at[seq] = m.commit_log_offset
        known = model.known.get(seq)
        if known is not None:
            if known[0] != m.commit_log_offset:
                problems.add(
                    f"seq {seq} acknowledged at offset {known[0]}, found at {m.commit_log_offset}"
                )
            elif known[1] != m.queue_offset:
                problems.add(
                    f"seq {seq} at {m.commit_log_offset}: queue offset {m.queue_offset}, "
                    f"acknowledged {known[1]}"
                )
        elif model.pending_put(seq) is None:
            problems.add(
                f"CommitLog offset {m.commit_log_offset} holds seq {seq}, which was never put "
                "(neither acknowledged nor in flight at a kill)"
            )
    # In-flight puts: only whole messages, and only a prefix of the put.
    for put in model.pending:
        present = sorted(s for s in put.seqs if s in seq_at)
        if present != list(range(put.first, put.first + len(present))):
            problems.add(
                f"in-flight put of seqs {put.first}..{put.first + put.n - 1}: kept seqs "
                f"{present[:5]}..{present[-5:]} are not a prefix of it"
            )
        stats.in_flight_present += len(present)
        for seq in present:
            stats.kept[seq] = (seq_at[seq], by_offset[seq_at[seq]].queue_offset)

    # 1. Every acknowledged message is there, intact, at its offset.
    for seq, (off, _) in model.known.items():
        if seq_at.get(seq) == off:
            continue
        try:
            m = store.get_message(off)
            why = content_problem(m) or (
                f"holds seq {m.properties.get('seq')}"
                if m.properties.get("seq") != str(seq)
                else ""
            )
        except StoreError as exc:
            why = f"{type(exc).__name__}: {exc}"
        problems.add(
            f"acknowledged seq {seq} at offset {off} missing from the recovered CommitLog "
            f"(min {store.min_phy_offset}, max {store.max_phy_offset}): {why or 'not walked'}"
        )

    # 3. ConsumeQueues: no holes, every unit on a record of its queue, every record one unit.
    unit_of: dict[int, tuple[str, int, int]] = {}  # CommitLog offset -> (topic, queue, qoffset)
    infos = store.queue_infos()
    stats.queues = len(infos)
    for qi in infos:
        where = f"queue {qi.topic}/{qi.queue_id}"
        if not 0 <= qi.min_offset <= qi.max_offset:
            problems.add(f"{where}: min {qi.min_offset} max {qi.max_offset}")
            continue
        got: list[MessageExt] = []
        pos = qi.min_offset
        while pos < qi.max_offset:
            r = store.get_messages(qi.topic, qi.queue_id, pos, 1000)
            if not r.messages or r.next_begin_offset <= pos:
                problems.add(
                    f"{where}: get_messages at queue offset {pos} (max {qi.max_offset}) -> "
                    f"{r.status}, {len(r.messages)} messages"
                )
                break
            got.extend(r.messages)
            pos = r.next_begin_offset
        if len(got) != qi.max_offset - qi.min_offset:
            problems.add(
                f"{where}: get_messages over [{qi.min_offset}, {qi.max_offset}) returned "
                f"{len(got)} messages"
            )
        units = store.read_units(qi.topic, qi.queue_id, qi.min_offset, len(got))
        for i, m in enumerate(got):
            qo = qi.min_offset + i
            phys = m.commit_log_offset
            if m.queue_offset != qo or m.topic != qi.topic or m.queue_id != qi.queue_id:
                problems.add(
                    f"{where}: queue offset {qo} -> record at {phys} of "
                    f"{m.topic}/{m.queue_id} with queue offset {m.queue_offset}"
                )
            if phys not in by_offset:
                problems.add(
                    f"{where}: queue offset {qo} -> CommitLog offset {phys}, not a record of "
                    f"the recovered CommitLog (max {store.max_phy_offset})"
                )
            if phys in unit_of:
                problems.add(f"{where}: queue offset {qo} -> {phys}, also unit {unit_of[phys]}")
            unit_of[phys] = (qi.topic, qi.queue_id, qo)
            if i < len(units):
                u = units[i]
                tags_code = java_hash(m.tags) if m.tags else 0
                if (int(u["offset"]), int(u["size"]), int(u["tags_code"])) != (
                    phys,
                    m.store_size,
                    tags_code,
                ):
                    problems.add(
                        f"{where}: unit {qo} = ({int(u['offset'])}, {int(u['size'])}, "
                        f"{int(u['tags_code'])}), record ({phys}, {m.store_size}, {tags_code})"
                    )
            if phys in by_offset and m != by_offset[phys]:
                problems.add(
                    f"{where}: queue offset {qo} -> offset {phys}: get_messages and get_message "
                    "disagree on the record"
                )
    for m in records:
        if m.commit_log_offset not in unit_of:
            problems.add(
                f"record at {m.commit_log_offset} (seq {m.properties.get('seq')}, "
                f"{m.topic}/{m.queue_id}, queue offset {m.queue_offset}) has no ConsumeQueue unit"
            )
    known_seqs = sorted(model.known)
    for seq in known_seqs:
        off, qo = model.known[seq]
        e = expected(seq)
        if off in by_offset and unit_of.get(off) != (e.topic, e.queue_id, qo):
            problems.add(
                f"acknowledged seq {seq} (offset {off}) not reachable at "
                f"{e.topic}/{e.queue_id} queue offset {qo}: unit {unit_of.get(off)}"
            )
    for seq in rng.sample(known_seqs, min(40, len(known_seqs))):
        off, qo = model.known[seq]
        e = expected(seq)
        r = store.get_messages(e.topic, e.queue_id, qo, 1)
        if [m.commit_log_offset for m in r.messages] != [off]:
            problems.add(
                f"get_messages({e.topic}, {e.queue_id}, {qo}, 1) -> {r.status} "
                f"{[m.commit_log_offset for m in r.messages]}, acknowledged offset {off}"
            )

    # 4. The key index: by KEYS and by UNIQ_KEY, exactly the one message.
    sample = set(rng.sample(known_seqs, min(60, len(known_seqs))))
    sample.update(known_seqs[-20:])
    sample.update(s for p in model.pending for s in p.seqs if s in seq_at)
    for seq in sorted(sample):
        e = expected(seq)
        at = seq_at.get(seq)
        if at is None:
            continue  # reported above
        for key in (e.key, e.uniq_key):
            stats.lookups += 1
            found = [m.commit_log_offset for m in store.query_by_key(e.topic, key)]
            if found != [at]:
                problems.add(f"query_by_key({e.topic!r}, {key!r}) -> {found}, expected [{at}]")

    problems.raise_if_any(report)
    return stats


def settle_pending(model: Model, stats: CheckStats) -> None:
    """After a passing check, the kept messages of in-flight puts are part of the store."""
    model.known.update(stats.kept)
    model.pending.clear()


def write_more(store: MessageStore, model: Model, first: int, count: int = 50) -> None:
    """Puts after recovery (a batch and a single message), acknowledged into the model."""
    batch = store.put_batch([expected(s).message() for s in range(first, first + count)])
    model.acknowledge(
        Put(
            first,
            count,
            tuple(batch.commit_log_offsets.tolist()),
            tuple(batch.queue_offsets.tolist()),
        )
    )
    one = store.put(expected(first + count).message())
    model.acknowledge(Put(first + count, 1, (one.commit_log_offset,), (one.queue_offset,)))
    for seq in range(first, first + count + 1):
        m = store.get_message(model.known[seq][0])
        assert content_problem(m) is None and m.properties["seq"] == str(seq), (seq, m)


def last_segment_state(store_dir: Path) -> str:
    """The newest CommitLog segment after a kill: ``empty`` (0 bytes: created, not yet sized),
    ``zero-filled`` (sized, nothing written), ``partial`` or ``full``."""
    files = sorted(p for p in (store_dir / "commitlog").iterdir() if p.name.isdigit())
    if not files:
        return "none"
    data = files[-1].read_bytes()
    if not data:
        return "empty"
    if not any(data):
        return "zero-filled"
    return "partial" if not any(data[-64:]) else "full"


def raw_end(segment: Path) -> int:
    """Where the records of a segment file stop (magic and size only, no CRC): the first byte
    after the last complete-looking record, or the segment size after a blank."""
    data = segment.read_bytes()
    rel = 0
    while rel + 8 <= len(data):
        size, magic = SIZE_MAGIC.unpack_from(data, rel)
        if magic == BLANK_MAGIC:
            return len(data)
        if magic != MAGIC or not 91 <= size <= len(data) - rel:
            break
        rel += size
    return rel


def torn_record(phys: int) -> bytes:
    """The first half of a record that was never put (seq 5), as a write cut short leaves it."""
    body = bytes(range(1, 201))
    full = encode_record(
        topic="CrashA",
        body=body,
        properties={"KEYS": "key-5", "UNIQ_KEY": f"C{5:031X}", "seq": "5"},
        queue_id=0,
        queue_offset=0,
        physical_offset=phys,
        born_timestamp=time.time_ns() // 1_000_000,
        store_timestamp=time.time_ns() // 1_000_000,
        born_host="127.0.0.1:10911",
        store_host="127.0.0.1:10911",
    )
    return full[: len(full) // 2]


# -- the tests -----------------------------------------------------------------------------------


def open_store(store_dir: Path, flush: str, label: str) -> MessageStore:
    """Open writable (recovery runs); a store that cannot be opened is a broken invariant."""
    try:
        return MessageStore(store_dir, store_config(flush))
    except StoreError as exc:
        raise AssertionError(f"{label}: the store does not open after the kill: {exc}") from exc


def kill_cycle(
    store_dir: Path,
    work: Path,
    name: str,
    flush: str,
    rng: random.Random,
    first: int,
    *,
    during_open: bool = False,
    min_acks: int = 1,
) -> CycleLog:
    """Start a writer, kill it at a random moment, return what it acknowledged."""
    w = Writer(store_dir, work, name, flush, rng.randrange(2**31), first)
    try:
        if during_open:
            w.wait_for(lambda: "opening" in w.lines, "'opening'")
            # Jitter, not synchronisation: the kill lands inside the open (and its recovery of
            # the previous crash), or shortly after it.
            time.sleep(rng.uniform(0.0, 0.05))
        else:
            w.wait_acks(rng.randint(min_acks, min_acks + 3))
            w.wait_acks(w.acked + rng.randint(0, 6))
            # Jitter, not synchronisation: the kill lands inside the next put, or its ack.
            time.sleep(rng.uniform(0.0, 0.025))
    except BaseException:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()
        raise
    w.kill()
    return read_cycle(w)


def apply_cycle(model: Model, log: CycleLog) -> None:
    for put in log.acked:
        model.acknowledge(put)
    if log.in_flight is not None:
        model.pending.append(log.in_flight)


def recover_and_check(
    store_dir: Path, flush: str, model: Model, rng: random.Random, label: str, *, crashed: bool
) -> CheckStats:
    store = open_store(store_dir, flush, label)
    try:
        report = store.recovery.to_json()
        assert report.get("abortFileFound") is crashed, f"{label}: recovery report {report}"
        stats = check_store(store, model, rng, label)
        settle_pending(model, stats)
    finally:
        store.close()
    return stats


@pytest.mark.slow  # both flush modes together take some 35 s
@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_kill9_during_puts_then_recover(tmp_path: Path, flush: str) -> None:
    rng = random.Random(f"kill9-{flush}")
    store_dir = tmp_path / "store"
    model = Model()
    seen: collections.Counter[str] = collections.Counter()
    unchecked = False
    for cycle in range(1, KILLS + 1):
        first = cycle * SEQ_SPAN + 1
        during_open = unchecked and rng.random() < 0.5
        log = kill_cycle(
            store_dir, tmp_path, f"writer-{cycle}", flush, rng, first, during_open=during_open
        )
        apply_cycle(model, log)
        seen["kills during open"] += during_open
        seen["torn ack lines"] += log.torn_ack
        seen["puts in flight"] += log.in_flight is not None
        seen[f"last segment {last_segment_state(store_dir)}"] += 1
        if cycle % UNCHECKED_EVERY == 0 and cycle < KILLS:
            unchecked = True  # the next writer recovers this crash itself
            continue
        unchecked = False
        label = f"{flush}, kill {cycle}/{KILLS}"
        store = open_store(store_dir, flush, label)
        try:
            report = store.recovery.to_json()
            assert report.get("abortFileFound") is True, f"{label}: recovery report {report}"
            stats = check_store(store, model, rng, label)
            settle_pending(model, stats)
            seen["in-flight messages kept"] += stats.in_flight_present
            seen["kills with in-flight messages kept"] += stats.in_flight_present > 0
            # 5. Writing continues after recovery.
            write_more(store, model, first + AFTER_RECOVERY)
        finally:
            store.close()
    recover_and_check(store_dir, flush, model, rng, f"{flush}, clean reopen", crashed=False)
    print(f"\n{flush}: {len(model.known)} messages; {dict(sorted(seen.items()))}")
    # The 64 KiB segments roll all the time: some kill must have left a partly written one.
    assert seen["last segment partial"] + seen["last segment zero-filled"] > 0, seen


def test_kill9_with_preallocated_segment_and_torn_tail(tmp_path: Path) -> None:
    """After a kill, the store also holds what a broker crash can leave at the end of the log:
    a record cut short after the last one, and the next segment pre-allocated (full size, all
    zeros), as RocketMQ's allocation service creates it ahead of need."""
    flush = "ASYNC_FLUSH"
    rng = random.Random("kill9-preallocated")
    store_dir = tmp_path / "store"
    model = Model()
    apply_cycle(
        model, kill_cycle(store_dir, tmp_path, "writer-1", flush, rng, SEQ_SPAN + 1, min_acks=4)
    )
    # A kill between sizing a new segment and renaming it into place leaves a *.creating file.
    segments = sorted(p for p in (store_dir / "commitlog").iterdir() if p.name.isdigit())
    last = segments[-1]
    base = int(last.name)
    end = raw_end(last)
    next_segment = store_dir / "commitlog" / f"{base + SEGMENT:020d}"
    assert not next_segment.exists()
    torn = torn_record(base + end)
    fd = os.open(next_segment, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(fd, SEGMENT)
        if end + len(torn) * 2 + 8 > SEGMENT:  # no room for the whole record: it starts the next
            os.pwrite(fd, torn_record(base + SEGMENT), 0)
    finally:
        os.close(fd)
    if end + len(torn) * 2 + 8 <= SEGMENT:
        with open(last, "r+b") as f:
            f.seek(end)
            f.write(torn)

    store = open_store(store_dir, flush, "pre-allocated segment + torn record")
    try:
        report = store.recovery.to_json()
        assert report.get("abortFileFound") is True, report
        stats = check_store(store, model, rng, "pre-allocated segment + torn record")
        settle_pending(model, stats)
        # Enough to fill the rest of the segment and go on past the pre-allocated one.
        write_more(store, model, SEQ_SPAN + AFTER_RECOVERY, count=400)
        assert store.max_phy_offset > base + SEGMENT
    finally:
        store.close()
    recover_and_check(store_dir, flush, model, rng, "clean reopen", crashed=False)
    # And a writer carries on over it, and is killed again.
    apply_cycle(model, kill_cycle(store_dir, tmp_path, "writer-2", flush, rng, 2 * SEQ_SPAN + 1))
    recover_and_check(store_dir, flush, model, rng, "second kill", crashed=True)


def test_kill9_between_creating_and_sizing_a_segment(tmp_path: Path) -> None:
    """A kill between creating a segment file and setting its length leaves an empty file
    behind. rocketstore creates segments under a temporary name and renames them once sized,
    so its own writer cannot leave one, but RocketMQ's can (it sizes the file after creating
    it): the store must still open, drop the empty file and carry on. Made deterministic here:
    after a kill, the next CommitLog segment and the next file of one ConsumeQueue are created
    empty."""
    flush = "ASYNC_FLUSH"
    rng = random.Random("kill9-unsized")
    store_dir = tmp_path / "store"
    model = Model()
    apply_cycle(
        model, kill_cycle(store_dir, tmp_path, "writer-1", flush, rng, SEQ_SPAN + 1, min_acks=4)
    )
    # A kill between sizing a new segment and renaming it leaves a *.creating file.
    last = sorted(p for p in (store_dir / "commitlog").iterdir() if p.name.isdigit())[-1]
    (store_dir / "commitlog" / f"{int(last.name) + SEGMENT:020d}").touch(exist_ok=False)
    queue_dir = sorted(p for p in (store_dir / "consumequeue").glob("*/*") if p.is_dir())[0]
    cq_last = sorted(p for p in queue_dir.iterdir() if p.name.isdigit())[-1]
    cq_size = GEOMETRY["mapped_file_size_consume_queue"]
    (queue_dir / f"{int(cq_last.name) + cq_size:020d}").touch(exist_ok=False)

    store = open_store(store_dir, flush, "empty new segments")
    try:
        stats = check_store(store, model, rng, "empty new segments")
        settle_pending(model, stats)
        write_more(store, model, SEQ_SPAN + AFTER_RECOVERY, count=400)
    finally:
        store.close()
    recover_and_check(store_dir, flush, model, rng, "clean reopen", crashed=False)
