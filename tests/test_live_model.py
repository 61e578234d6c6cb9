"""One writer and every kind of reader on one store at once, checked against a log of what was
acknowledged (tests/kit/livemodel.py).

The writer (tests/procs/model_writer.py) puts batches and single messages over a few hot queues
and many cold ones, runs retention every half second (segments live 4 s), and is
killed with SIGKILL at random moments and started again. Beside it, in turn: read-only opens
reading queues through, `rocketstore dump` (in queue or in log order), `verify`, `queues` and
`lag`, the console's pages, and a Spark streaming query over two topics. Every message any of them reads is checked to be
the one acknowledged at that offset; in the end, with the writer closed, one more read of the
whole store must hold every acknowledged message retention has not removed.

What must hold:

* no offset is handed out twice (two acknowledgements, or two readers, with different
  messages at one offset), and no queue's end goes backwards;
* no reader reports damage: the one error a reader may meet is a file retention deleted after
  the reader listed it (:class:`SegmentGoneError`, "open the store again"), which is counted;
* `verify` exits 0 whenever the writer was running, and not killed, for the whole scan;
* the Spark query reads each message at most once, in offset order per queue, and catches up;
* every acknowledged message at or past its queue's min offset is in the store at its offset.

The suite runs it for :data:`SECONDS`; ``ROCKETSTORE_MODEL_SECONDS`` makes it longer (the long
run in docs/operations.md took 30 minutes), ``ROCKETSTORE_MODEL_SEED`` replays a run's choices.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import SegmentGoneError, StoreError
from tests.kit import PROCS
from tests.kit.cli import run_cli
from tests.kit.consolekit import ConsoleProcess
from tests.kit.livemodel import (
    CONFIG,
    CONFIG_TOML,
    FINAL,
    HOT_QUEUES,
    HOT_TOPIC,
    Model,
    Shape,
    next_seq,
)

SECONDS = float(os.environ.get("ROCKETSTORE_MODEL_SECONDS", "75"))
SEED = int(os.environ.get("ROCKETSTORE_MODEL_SEED", str(random.SystemRandom().randrange(1 << 30))))
SHAPE = Shape(cold_queues_per_topic=int(os.environ.get("ROCKETSTORE_MODEL_COLD", "250")))
GONE = "gone since this read-only view listed it"
READY_TIMEOUT_S = 120.0


class Writer:
    """The writer process: started, killed with SIGKILL and started again, stopped."""

    def __init__(self, work: Path, broker: Path, rng: random.Random) -> None:
        self.broker, self.rng = broker, rng
        self.intents, self.acks = work / "intents", work / "acks"
        self.err = work / "writer.err"
        self.proc: subprocess.Popen[str] | None = None
        self.generation = 0  # starts so far: a reader that saw it change saw a kill
        self.kills = 0

    def start(self) -> None:
        with open(self.err, "a") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(PROCS / "model_writer.py"),
                    str(self.broker),
                    str(self.intents),
                    str(self.acks),
                    "--cold",
                    str(SHAPE.cold_queues_per_topic),
                    "--seed",
                    str(self.rng.randrange(1 << 30)),
                    "--first-seq",
                    str(next_seq(self.intents)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert self._line() == "ready", self.failure()
        self.generation += 1

    def _line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        with selectors.DefaultSelector() as waiting:  # poll: any descriptor number
            waiting.register(self.proc.stdout, selectors.EVENT_READ)
            ready = waiting.select(READY_TIMEOUT_S)
        return self.proc.stdout.readline().strip() if ready else "(no answer)"

    def failure(self) -> str:
        return f"the writer failed: {self.err.read_text()[-4000:]}"

    def check_alive(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, self.failure()

    def kill(self) -> None:
        assert self.proc is not None
        self.check_alive()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.kills += 1

    def stop(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.check_alive()
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        assert self._line().startswith("stopped"), self.failure()
        assert self.proc.wait(timeout=READY_TIMEOUT_S) == 0, self.failure()


class Readers:
    """The readers' turns, each checked against the model as it reads."""

    def __init__(self, model: Model, root: Path, conf: Path, checkpoint: Path) -> None:
        self.model, self.root, self.conf, self.checkpoint = model, root, conf, checkpoint
        self.broker = root / "broker-0"
        self.counts: collections.Counter[str] = collections.Counter()
        self.ends: dict[tuple[str, int], int] = {}  # the highest max offset listed per queue

    def damage(self, who: str, text: str) -> None:
        if GONE in text:
            kind = next(
                (k for k in ("commitlog", "consumequeue", "index") if f"/{k}/" in text), "?"
            )
            self.counts[f"{who}: {kind} file gone"] += 1
        else:
            self.model.problem(f"{who}: {text[-2000:]}")

    def view(self, rng: random.Random) -> None:
        """A read-only open reading the hot queues and a sample of the cold ones through."""
        try:
            with MessageStore(self.broker, CONFIG, read_only=True) as view:
                cold = [k for k in view.queue_ids() if k[0] != HOT_TOPIC]
                picked = [(HOT_TOPIC, q) for q in range(HOT_QUEUES)]
                picked += rng.sample(cold, min(len(cold), 60))
                for topic, queue_id in picked:
                    self._read_queue(view, topic, queue_id)
        except SegmentGoneError as exc:
            self.damage("view", str(exc))
        except StoreError as exc:
            self.damage("view", repr(exc))
        self.counts["view"] += 1

    def _read_queue(self, view: MessageStore, topic: str, queue_id: int) -> None:
        offset, end = view.min_offset(topic, queue_id), view.max_offset(topic, queue_id)
        while offset < end:
            got = view.get_messages(topic, queue_id, offset, 32)
            for m in got.messages:
                self.model.saw("view", m.topic, m.queue_id, m.queue_offset, m.body)
            if got.next_begin_offset <= offset:
                break
            offset = got.next_begin_offset

    def dump(self, rng: random.Random) -> None:
        order = rng.choice(["queue", "log"])
        done = run_cli("dump", str(self.broker), "--config", str(self.conf), "--order", order)
        self.counts["dump"] += 1
        if done.returncode != 0:
            self.damage("dump", done.stderr)
            return
        for line in done.stdout.splitlines():
            m = json.loads(line)
            body = base64.b64decode(m["body"])
            self.model.saw("dump", m["topic"], m["queueId"], m["queueOffset"], body)

    def verify(self, writer: Writer) -> None:
        generation, kills = writer.generation, writer.kills
        done = run_cli("verify", str(self.broker), "--config", str(self.conf), "--json")
        self.counts["verify"] += 1
        undisturbed = writer.kills == kills and writer.generation == generation
        if done.returncode == 0:
            return
        if not undisturbed:
            # A scan that a kill overtook saw a crashed store (no lock, abort left): what it
            # finds past the last durable point is what recovery repairs, not for this check.
            self.counts["verify across a kill"] += 1
            return
        self.damage("verify", done.stdout[:3000] + done.stderr)
        kept = self.root.parent / f"verify-failed-{self.counts['verify']}"
        kept.with_suffix(".json").write_text(done.stdout)
        kept.with_suffix(".stderr").write_text(done.stderr)

    def queues(self) -> None:
        done = run_cli("queues", str(self.broker), "--config", str(self.conf), "--json")
        self.counts["queues"] += 1
        if done.returncode != 0:
            self.damage("queues", done.stderr)
            return
        for q in map(json.loads, done.stdout.splitlines()):
            key = (q["topic"], q["queueId"])
            if q["maxOffset"] < self.ends.get(key, 0):
                self.model.problem(
                    f"queues: {key} ends at {q['maxOffset']}, after {self.ends[key]}"
                )
            self.ends[key] = max(self.ends.get(key, 0), q["maxOffset"])

    def lag(self) -> None:
        if not any((self.checkpoint / "commits").glob("[0-9]*")):
            return  # the query has not committed a batch yet: nothing to measure
        args = ["lag", str(self.root), "--config", str(self.conf), "--json"]
        done = run_cli(*args, "--checkpoint", str(self.checkpoint))
        self.counts["lag"] += 1
        if done.returncode != 0:
            self.damage("lag", done.stderr)

    def console(self, url: str, rng: random.Random) -> None:
        queue_id = rng.randrange(HOT_QUEUES)
        for page in (
            "",
            f"topic/{HOT_TOPIC}",
            f"messages?topic={HOT_TOPIC}&by=queue&broker=broker-0&queue={queue_id}",
            f"messages?topic=cold0&by=key&key=k{rng.randrange(1, 1000)}",
            "consumers",
            "health",
            "metrics",
        ):
            try:
                with urllib.request.urlopen(url + page, timeout=120) as answer:
                    answer.read()
            except urllib.error.HTTPError as exc:
                text = exc.read().decode(errors="replace")
                self.damage(f"console /{page} ({exc.code})", text)
            self.counts["console page"] += 1


class SparkReader:
    """A streaming query over the hot topic and one cold one, from the earliest offsets; every
    micro-batch's rows go to the model, and the offsets each queue delivers must ascend."""

    def __init__(self, spark: Any, model: Model, root: Path, checkpoint: Path) -> None:
        self.model = model
        self.last: dict[tuple[str, int], int] = {}
        self.rows = 0
        self.lock = threading.Lock()
        frame = (
            spark.readStream.format("rocketstore")
            .option("path", str(root))
            .option("topic", f"{HOT_TOPIC},cold0")
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", "false")
            .option("maxMessagesPerTrigger", 20_000)
            .load()
            .select("topic", "queueId", "queueOffset", "body")
        )
        self.query = (
            frame.writeStream.foreachBatch(self._batch)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="1 second")
            .start()
        )

    def _batch(self, df: Any, batch_id: int) -> None:
        rows = sorted((r.topic, r.queueId, r.queueOffset, bytes(r.body)) for r in df.collect())
        with self.lock:
            for topic, queue_id, offset, _ in rows:
                before = self.last.get((topic, queue_id), -1)
                if offset <= before:
                    self.model.problem(
                        f"spark: {topic}/{queue_id}/{offset} in batch {batch_id}, after {before}"
                    )
                self.last[(topic, queue_id)] = offset
            self.model.saw_rows("spark", rows)
            self.rows += len(rows)

    def finish(self, bounds: dict[tuple[str, int], tuple[int, int]]) -> None:
        """Read what is left (the writer is closed), stop, and check the query caught up: to
        the last message of each queue that still has one (one whose messages retention
        removed before the query got to them has nothing left to read)."""
        self.query.processAllAvailable()
        self.query.stop()
        for (topic, queue_id), (lo, end) in bounds.items():
            if topic in (HOT_TOPIC, "cold0") and lo < end:
                got = self.last.get((topic, queue_id))
                if got != end - 1:
                    self.model.problem(f"spark: {topic}/{queue_id} read to {got}, ends at {end}")


def final_read(model: Model, broker: Path) -> dict[tuple[str, int], tuple[int, int]]:
    """Every queue read through once the writer closed the store; its bounds."""
    bounds: dict[tuple[str, int], tuple[int, int]] = {}
    with MessageStore(broker, CONFIG, read_only=True) as store:
        for info in store.queue_infos():
            key = (info.topic, info.queue_id)
            bounds[key] = (info.min_offset, info.max_offset)
            offset = info.min_offset
            while offset < info.max_offset:
                got = store.get_messages(info.topic, info.queue_id, offset, 64)
                if got.status != "FOUND" or got.messages[0].queue_offset != offset:
                    model.problem(f"final read: {key} at {offset}: {got.status}")
                    break
                for m in got.messages:
                    model.saw(FINAL, m.topic, m.queue_id, m.queue_offset, m.body)
                    if m.queue_offset != offset:
                        model.problem(f"final read: {key} skips from {offset} to {m.queue_offset}")
                    offset = m.queue_offset + 1
    return bounds


def test_one_writer_killed_at_random_and_every_reader_beside_it(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}, {SECONDS:.0f} s, {SHAPE.queues} queues")
    root, conf, checkpoint = tmp_path / "root", tmp_path / "store.toml", tmp_path / "ck"
    root.mkdir()
    conf.write_text(CONFIG_TOML)
    model = Model(SHAPE)
    writer = Writer(tmp_path, root / "broker-0", rng)
    writer.start()
    readers = Readers(model, root, conf, checkpoint)
    console = ConsoleProcess([str(root), "--config", str(conf), "--port", "0"])
    source = SparkReader(spark, model, root, checkpoint)
    try:
        deadline = time.monotonic() + SECONDS
        kill_at = time.monotonic() + rng.uniform(2, 8)
        turns = [
            lambda: readers.view(rng),
            lambda: readers.dump(rng),
            lambda: readers.verify(writer),
            readers.queues,
            readers.lag,
            lambda: readers.console(console.url, rng),
        ]
        while time.monotonic() < deadline:
            rng.choice(turns)()
            readers.counts["most descriptors"] = max(
                readers.counts["most descriptors"], len(os.listdir("/proc/self/fd"))
            )
            writer.check_alive()
            if time.monotonic() >= kill_at:
                writer.kill()
                writer.start()
                kill_at = time.monotonic() + rng.uniform(2, 8)
            failed = source.query.exception()
            if failed is not None:
                print(failed)
            assert failed is None, str(failed)[:5000]
        writer.stop()
    finally:
        if writer.proc is not None and writer.proc.poll() is None:
            writer.proc.kill()
        console.interrupt()
    bounds = final_read(model, root / "broker-0")
    source.finish(bounds)
    model.load_logs(writer.intents, writer.acks)
    model.check_seen()
    removed = model.check_complete(bounds)
    verified = run_cli("verify", str(root / "broker-0"), "--config", str(conf))
    summary = (
        f"seed {SEED}: {len(model.acked)} messages acknowledged over {writer.kills} kills, "
        f"{removed} removed by retention, {model.observations} reads checked, "
        f"{source.rows} rows through Spark; {dict(readers.counts)}"
    )
    print(summary)
    assert model.problems == [], "\n".join([summary, *model.problems[:30]])
    assert verified.returncode == 0, verified.stdout[-3000:]
    assert writer.kills >= 1 and removed > 0 and source.rows > 0, summary
    assert readers.counts["verify"] + readers.counts["dump"] > 0, summary
