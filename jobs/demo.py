"""Demo: the whole pipeline on one machine, for a bounded time, then a summary of what it did.

    make demo                      # or: python -m rocketstore.jobs.demo [--seconds 60] [--rate 400]

A generator writes a file of orders (customer keys, order types, amounts, event times) into
``DIR/incoming`` every second. Four streaming queries run at once in one local Spark
application, each started by the job that does it on its own (the commands are printed first):

1. ingest: the order files -> topic ``orders`` (2 brokers x 2 queues, Avro bodies; keys are
   the order id and the customer, the tag is the order type, the customer picks the queue);
2. process: ``orders`` -> 10-second windows per order type with a 5-second watermark (SQL) ->
   topic ``order-stats``;
3. export: ``orders`` -> parquet files, stamped with the time each was exported;
4. export: ``order-stats`` -> JSON files.

A progress line every few seconds shows orders generated, stored, exported and the export's
consumer lag. Once every query has run a micro-batch and worked off the backlog that built up
meanwhile (the warm-up: Spark's first plans and Python workers), the run goes on for
``--seconds``; then the generator stops, each query drains what is left, and the summary shows
messages per topic and queue, throughput, end-to-end latency percentiles, the consumer lag, and
where everything is. It also checks that every generated order is in the store once and in the
export once: exit status 1 if not.

Everything lives under ``--dir`` (default ``data/demo``): ``incoming/``, ``store/``,
``checkpoints/`` and ``export/``, and a marker file ``.rocketstore-demo`` that lists them. What an
earlier run made there is removed first, and only that: without the marker, a ``--dir`` that
already holds one of those names is refused, since the demo did not make it. ``make clean``
removes what the marker lists, and nothing else.
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import itertools
import json
import os
import random
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocketstore.jobs import common, export, ingest, process
from rocketstore.jobs.demo_files import Paths
from rocketstore.jobs.demo_summary import RunFacts, batch_stats, say, summary

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from rocketstore.jobs.sinkgate import SinkGate

PROG = "demo"
ORDER_TYPES = ("NEW", "PAID", "SHIPPED", "CANCELLED")
ORDER_TYPE_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
CUSTOMERS = 1000
ORDER_DDL = (
    "orderId STRING, customer STRING, orderType STRING, amount DOUBLE, currency STRING, "
    "items INT, eventTime TIMESTAMP"
)
WARMING = ("ingest", "process", "export-orders")
WARM_UP_LIMIT = 120.0
STEADY_BACKLOG_S = 10
# Four queries share two cores: fair scheduling lets a short job of one run between the tasks
# of another instead of queueing behind its whole job, and the aggregation's state needs no
# more than two partitions at this size.
DEMO_SPARK_CONF = {"spark.scheduler.mode": "FAIR", "spark.sql.shuffle.partitions": "2"}
WINDOW_SQL = (
    "SELECT window.start AS windowStart, window.end AS windowEnd, orderType, "
    "orderType AS keys, orderType AS tags, count(*) AS orders, "
    "round(sum(amount), 2) AS revenue, approx_count_distinct(customer) AS customers "
    "FROM orders GROUP BY window(eventTime, '10 seconds'), orderType"
)


# -- the sample stream ---------------------------------------------------------------------------


class OrderGenerator(threading.Thread):
    """Writes one JSON-lines file of ``rate`` orders per second into ``folder``.

    Each order's event time is when it was "placed": spread over the second before its file
    appears. Customers follow a long-tailed popularity (a few order often), order types
    40/30/20/10 % NEW/PAID/SHIPPED/CANCELLED, amounts log-normal around 30 EUR. A file is
    written under a hidden name and renamed, so Spark's file source never sees half a file.
    """

    def __init__(self, folder: Path, rate: int, seed: int = 7) -> None:
        super().__init__(name="order-generator", daemon=True)
        self.folder = folder
        self.rate = rate
        self.rng = random.Random(seed)
        weights = [1 / (rank**0.9) for rank in range(1, CUSTOMERS + 1)]
        self._cumulative = list(itertools.accumulate(weights))
        self._stop_event = threading.Event()
        self.orders = 0
        self.files = 0
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        if self.error is not None:
            raise self.error

    def run(self) -> None:
        try:
            tick = time.time()
            while not self._stop_event.is_set():
                tick += 1.0
                if self._stop_event.wait(max(0.0, tick - time.time())):
                    break
                self._write_file(tick - 1.0, tick)
        except BaseException as exc:  # reported by stop(): a dead generator must not go unseen
            self.error = exc

    def _customer(self) -> str:
        pick = self.rng.random() * self._cumulative[-1]
        return f"customer-{bisect.bisect_left(self._cumulative, pick):04d}"

    def _write_file(self, start: float, end: float) -> None:
        times = sorted(self.rng.uniform(start, end) for _ in range(self.rate))
        lines = []
        for seq, t in enumerate(times, start=self.orders):
            order = {
                "orderId": f"order-{seq:08d}",
                "customer": self._customer(),
                "orderType": self.rng.choices(ORDER_TYPES, ORDER_TYPE_WEIGHTS)[0],
                "amount": round(self.rng.lognormvariate(3.4, 0.7), 2),
                "currency": "EUR",
                "items": self.rng.randint(1, 5),
                "eventTime": dt.datetime.fromtimestamp(t, dt.UTC).isoformat(
                    timespec="milliseconds"
                ),
            }
            lines.append(json.dumps(order, separators=(",", ":")))
        name = f"orders-{self.files:06d}.json"
        tmp = self.folder / f".{name}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.folder / name)
        # Counted once the file is there: the progress lines read these from another thread.
        self.orders += len(lines)
        self.files += 1


# -- the four jobs ---------------------------------------------------------------------------------


def job_argv(paths: Paths, store_config: str) -> dict[str, list[str]]:
    """The command line of each job, as ``spark-submit jobs/<name>.py`` would take it."""
    store = ["--store", str(paths.store), "--store-config", store_config]
    ck = paths.checkpoints
    return {
        "ingest": [
            *store,
            "--topic", "orders",
            "--checkpoint", str(ck / "ingest"),
            "--source", "json",
            "--input", str(paths.incoming),
            "--schema", ORDER_DDL,
            "--key-column", "orderId",
            "--key-column", "customer",
            "--tag-column", "orderType",
            "--sharding-key", "customer",
            "--brokers", "2",
            "--queues", "2",
            "--body-format", "avro",
            "--trigger", "2 seconds",
        ],
        "process": [
            *store,
            "--topic", "orders",
            "--checkpoint", str(ck / "process"),
            "--view", "orders",
            "--watermark", "eventTime=5 seconds",
            "--sql", WINDOW_SQL,
            "--output-topic", "order-stats",
            "--brokers", "1",
            "--queues", "2",
            "--trigger", "5 seconds",
        ],
        "export-orders": [
            *store,
            "--topic", "orders",
            "--checkpoint", str(ck / "export-orders"),
            "--with-column", "exportedAt=current_timestamp()",
            "--output", str(paths.export_orders),
            "--format", "parquet",
            "--trigger", "3 seconds",
        ],
        "export-stats": [
            *store,
            "--topic", "order-stats",
            "--checkpoint", str(ck / "export-stats"),
            "--columns", "windowStart,windowEnd,orderType,orders,revenue,customers,storeTimestamp",
            "--output", str(paths.export_stats),
            "--format", "json",
            "--trigger", "5 seconds",
        ],
    }  # fmt: skip


class Pipeline:
    """The four queries; each is started once the topic it reads exists."""

    def __init__(self, spark: SparkSession, paths: Paths, argv: dict[str, list[str]]) -> None:
        self.spark = spark
        self.paths = paths
        self.argv = argv
        self.queries: dict[str, StreamingQuery] = {}
        self.sinks: dict[str, SinkGate | None] = {}
        self.started_at: dict[str, float] = {}

    def start_ready(self) -> None:
        from rocketstore.pipeline.engine.root import StoreRoot

        root = StoreRoot(self.paths.store)
        if "ingest" not in self.queries:
            q, gate = ingest.start(
                self.spark, ingest.build_parser().parse_args(self.argv["ingest"])
            )
            self._started("ingest", q, gate)
        if root.topic("orders") is not None:
            if "process" not in self.queries:
                args = process.build_parser().parse_args(self.argv["process"])
                q, stats_gate = process.start(self.spark, args)
                self._started("process", q, stats_gate)
            if "export-orders" not in self.queries:
                args = export.build_parser().parse_args(self.argv["export-orders"])
                self._started("export-orders", export.start(self.spark, args), None)
        if root.topic("order-stats") is not None and "export-stats" not in self.queries:
            args = export.build_parser().parse_args(self.argv["export-stats"])
            self._started("export-stats", export.start(self.spark, args), None)

    def _started(self, name: str, query: StreamingQuery, sink: SinkGate | None) -> None:
        self.queries[name] = query
        self.sinks[name] = sink
        self.started_at[name] = time.monotonic()

    def check(self) -> None:
        """Raise the failure of any query that died."""
        for query in self.queries.values():
            if not query.isActive:
                exc = query.exception()
                if exc is not None:
                    raise exc

    def appended(self, name: str) -> int:
        sink = self.sinks.get(name)
        return sum(b.appended for b in sink.history) if sink is not None else 0

    def read(self, name: str) -> int:
        query = self.queries.get(name)
        return common.rows_in_and_out(query)[0] if query is not None else 0

    def drain(self, name: str) -> None:
        """Let ``name`` process everything available, then stop it between micro-batches."""
        query = self.queries.get(name)
        if query is None:
            return
        query.processAllAvailable()
        common.stop_between_batches(query, patience=60.0, gate=self.sinks.get(name))

    def stop_all(self) -> None:
        for query in self.queries.values():
            if query.isActive:
                query.stop()


# -- figures ------------------------------------------------------------------------------------------


def export_lag(paths: Paths, config: Any) -> int | None:
    """Messages of ``orders`` the export has not committed yet (None before its first batch)."""
    from rocketstore.pipeline.errors import StoreError
    from rocketstore.pipeline.tools.lag import consumer_lag, read_committed_offsets

    ck = paths.checkpoints / "export-orders"
    try:
        progress = read_committed_offsets(ck)
        if progress.batch_id is None:
            return None
        rows = consumer_lag(paths.store, progress.offsets, config, ["orders"])
    except StoreError:
        return None
    return sum(r.lag for r in rows if r.lag is not None)


# -- the run ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = common.job_parser(
        PROG,
        __doc__,
        "Exit status: 0 done and every order accounted for exactly once; 1 otherwise; "
        "2 bad options.",
        query=False,
    )
    parser.add_argument(
        "--dir",
        default="data/demo",
        help="working directory (default data/demo); what an earlier demo run made in it is "
        "removed, nothing else",
    )
    parser.add_argument(
        "--seconds",
        type=common.positive_int,
        default=60,
        help="how long orders are generated after the warm-up (default 60); draining and the "
        "summary follow",
    )
    parser.add_argument(
        "--rate", type=common.positive_int, default=400, help="orders per second (default 400)"
    )
    parser.add_argument(
        "--every",
        type=common.positive_float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between progress lines (default 5)",
    )
    parser.add_argument(
        "--store-config",
        metavar="FILE",
        help="store settings (default: conf/demo-store.toml, small segments)",
    )
    return parser


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    from rocketstore.pipeline.config import StoreConfig

    paths = Paths(Path(args.dir))
    store_config = args.store_config or str(common.conf_dir() / "demo-store.toml")
    if not Path(store_config).is_file():
        raise common.JobError(f"--store-config {store_config}: no such file")
    config = StoreConfig.load(store_config)
    paths.prepare()
    if not os.environ.get("SPARK_LOG_LEVEL"):
        # The progress lines say how the queries keep up; Spark's warnings that a batch took
        # longer than its trigger interval would only bury them.
        spark.sparkContext.setLogLevel("ERROR")
    argv = job_argv(paths, store_config)

    say(
        f"rocketstore demo: orders at {args.rate}/s through four jobs, for a warm-up and then "
        f"{args.seconds} s"
    )
    say("running in one Spark application; on their own they would be:")
    for name, job_args in argv.items():
        script = name.split("-")[0]
        say(f"  spark-submit jobs/{script}.py {shlex.join(job_args)}")
    say()

    generator = OrderGenerator(paths.incoming, args.rate)
    pipeline = Pipeline(spark, paths, argv)
    t0 = time.monotonic()
    try:
        generator.start()
        pipeline.start_ready()
        lag_at_stop, warm_at = _watch(pipeline, generator, paths, config, args, t0)
        say(f"[{time.monotonic() - t0:4.0f}s] generator stopped; draining the queries ...")
        for name in ("ingest", "process", "export-orders"):
            pipeline.drain(name)
        pipeline.start_ready()  # order-stats may have appeared only while draining
        pipeline.drain("export-stats")
        elapsed = time.monotonic() - t0
    finally:
        if generator.is_alive():
            generator.stop()
        pipeline.stop_all()
    say(f"[{elapsed:4.0f}s] done\n")
    ingest_sink = pipeline.sinks.get("ingest")
    facts = RunFacts(
        generator.orders,
        generator.files,
        lag_at_stop,
        warm_at,
        store_config,
        ORDER_TYPES,
        appended_bytes=sum(b.bytes for b in ingest_sink.history) if ingest_sink is not None else 0,
        throughput=tuple(
            (label, *batch_stats(pipeline.queries.get(name)))
            for name, label in (
                ("ingest", "ingest -> store"),
                ("process", "store -> windows"),
                ("export-orders", "store -> parquet"),
            )
        ),
    )
    return summary(spark, paths, config, args, facts)


def _watch(
    pipeline: Pipeline,
    generator: OrderGenerator,
    paths: Paths,
    config: Any,
    args: argparse.Namespace,
    t0: float,
) -> tuple[int | None, float | None]:
    """Progress lines through the warm-up and then ``args.seconds``; stops the generator.

    The warm-up ends when every query has run a micro-batch with input (Spark plans its first
    batches and starts Python workers, which takes tens of seconds on a small machine) and the
    backlog that built up meanwhile is down to a few seconds of orders, or after WARM_UP_LIMIT
    seconds. Returns the export's lag when the generator stopped, and when
    (epoch seconds) the warm-up ended.
    """
    streams = pipeline.spark.streams
    # Queries that ended before this run (an earlier run in the same session) would make
    # awaitAnyTermination return at once, every time.
    streams.resetTerminated()
    warm_at: float | None = None
    deadline: float | None = None
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            break
        pause = args.every if deadline is None else min(args.every, deadline - now)
        # Returns early, raising, if a query fails: a broken pipeline must not sit out the time.
        if streams.awaitAnyTermination(pause):
            pipeline.check()
            raise common.JobError("a query of the pipeline stopped before the end")
        pipeline.start_ready()
        lag = export_lag(paths, config)
        elapsed = time.monotonic() - t0
        # Warm once every query has run a micro-batch and worked off the backlog that piled
        # up meanwhile, so that what follows is the steady state. In that state about ten
        # seconds of orders are in flight: a second in the generator's file, the ingest's and
        # the export's trigger intervals (2 s, 3 s) and their micro-batches. A machine too slow
        # to get there has WARM_UP_LIMIT seconds.
        backlog = generator.orders - pipeline.appended("ingest") + (lag if lag is not None else 0)
        ran = all(batch_stats(pipeline.queries.get(n))[0] for n in WARMING)
        caught_up = ran and lag is not None and backlog <= STEADY_BACKLOG_S * args.rate
        if warm_at is None and (caught_up or elapsed >= WARM_UP_LIMIT):
            warm_at = time.time()
            deadline = time.monotonic() + args.seconds
            state = "caught up" if caught_up else f"not caught up after {WARM_UP_LIMIT:.0f} s"
            say(f"[{elapsed:4.0f}s] warm-up over ({state}); {args.seconds} s more")
        say(
            f"[{elapsed:4.0f}s] generated {generator.orders:>8,}"
            f" | stored {pipeline.appended('ingest'):>8,}"
            f" | windows {pipeline.appended('process'):>4,}"
            f" | exported {pipeline.read('export-orders'):>8,}"
            f" | export lag {'-' if lag is None else f'{lag:,}':>6}"
        )
    generator.stop()
    return export_lag(paths, config), warm_at


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the demo with ``argv`` (default ``sys.argv[1:]``) on ``spark`` (default: a new local
    session, stopped at the end); returns the exit status."""

    def body(args: argparse.Namespace) -> int:
        started = time.monotonic()
        with common.session("rocketstore-demo", spark, DEMO_SPARK_CONF) as session:
            code = run(session, args)
        say(f"\n(the demo took {time.monotonic() - started:.0f} s, Spark's start-up included)")
        return code

    return common.run_main(PROG, build_parser(), argv, body)


if __name__ == "__main__":
    sys.exit(main())
