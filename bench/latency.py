"""The ``latency`` part: end-to-end latency through the store, one streaming query appending
while a second one reads the same topic, both with ``trigger(processingTime="0 seconds")``.

In one ``local[2]`` session, per measurement (a fresh store root, fresh checkpoints):

* **R, the reader**, started first: ``readStream.format("rocketstore")`` on the topic,
  ``includeProperties=true`` (for ``genTs``), ``startingOffsets=earliest`` (the topic is created empty just before, so R reads exactly
  what W writes, however their starts interleave), into a ``foreachBatch`` function (a
  :class:`Recorder`) that takes the driver's wall clock when Spark calls it for a micro-batch,
  the moment the reading query sees the batch, then has Spark compute, per row, that moment
  minus the row's ``bornTimestamp`` (stamped by the store when the sink's put began) and minus
  its ``genTs`` property, and collects those two ints and the row's sequence number as Arrow.
* **W, the writer**: Spark's ``rate`` source at a fixed ``rowsPerSecond`` (2 partitions),
  turned into messages of a 100-byte body, a key (the rate source's ``value``, a sequence
  number unique per message) and a property ``genTs`` (the rate source's ``timestamp``, in
  ms), written by ``foreachBatch(CommitLogSink(root, topic, brokers=2, queues=4))``.

``rate``, not ``rate-micro-batch``: the latter makes a fixed number of rows per micro-batch,
as fast as the query triggers, so with a zero trigger interval its rate is whatever the
writer's loop achieves, not a rate one can set. ``rate`` releases ``rowsPerSecond`` rows per
elapsed second of wall time, stamped evenly over that second
(``timestamp = start + value * 1000 / rowsPerSecond``): a steady offered load. It releases a
second's rows only when that second has passed, so ``gen -> seen`` includes up to a second
(half a second on average) of the generator's own granularity; ``born -> seen`` does not.

The rows of the first ``warmup`` seconds of generation (query start, Python workers, the
first plans) are dropped; the **window** is the rows generated in the next ``window`` seconds,
chosen by sequence number (``value`` in ``[rate * warmup, rate * (warmup + window))``), so it
is exact whatever the clock does. Both queries keep running until R has seen every row of the
window, or until ``drain`` seconds after the window's last row was generated.

A rate is **sustained** when (1) R saw every row of the window within that drain limit,
(2) the window's p50 ``gen -> seen`` is under 5 s, and (3) the backlog does not grow: the p50
``gen -> seen`` of the window's last fifth of rows (by sequence number) is at most 1 s above
that of its first fifth. ``gen -> seen`` is the criterion, not ``born -> seen``, because a
writer that falls behind shows only there (``bornTimestamp`` is stamped when the late put
begins). Runs: one untimed measurement first (not with ``--quick``: it takes the session's
cold start, Python workers and class loading, off the first timed one), ``--runs``
measurements at a steady 10K msgs/s, then one each at 20K, 40K, 80K, ... until one is not
sustained. Target (issue 10): p50 ``born -> seen`` under 1 s at 10K msgs/s.

Also recorded: the load average before and after each measurement, the backlog (rows the
rate source had released minus rows R had seen) about every half second, and both queries'
progress (Spark's ``durationMs`` per micro-batch: ``latestOffset`` is the source's planner,
``addBatch`` the ``foreachBatch`` function), to say where the time goes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.common import Options, PartResult, Row, log, median, scratch_dir, work_dir_notes
from bench.session import local_session
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta

TOPIC = "latency"
BROKERS = 2
QUEUES = 4
BODY_BYTES = 100
GEN_PROPERTY = "genTs"
STEADY_RATE = 10_000
TARGET_P50_MS = 1_000  # issue 10: born -> seen p50 under 1 s at 10K msgs/s
SUSTAIN_P50_MS = 5_000
SUSTAIN_DRIFT_MS = 1_000
STARTUP_LIMIT_S = 180  # R must see its first row within this, or the part gives up
POLL_S = 0.5
# Spark keeps a query's latest 100 progress reports; fetching them costs the driver a JSON
# round trip each, so they are fetched this often, far more often than 100 batches can pass.
PROGRESS_EVERY_S = 5
QUANTILES = (50, 90, 99)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Durations in seconds of generation, and the rates of the ramp."""

    warmup_s: int
    steady_window_s: int
    step_window_s: int
    drain_s: int
    step_rates: tuple[int, ...]
    # An untimed measurement of this many seconds (half warm-up) first, so that the first
    # timed one does not pay the session's cold start (Python workers, class loading); 0: none.
    prime_s: int


FULL = Sizes(10, 60, 30, 30, (20_000, 40_000, 80_000, 160_000, 320_000), prime_s=10)
QUICK = Sizes(2, 3, 3, 20, (20_000,), prime_s=0)


@dataclasses.dataclass(frozen=True)
class Window:
    """The measured rows: sequence numbers ``[first, end)`` of a rate source at ``rate``."""

    rate: int
    warmup_s: int
    window_s: int

    @property
    def first(self) -> int:
        return self.rate * self.warmup_s

    @property
    def end(self) -> int:
        return self.rate * (self.warmup_s + self.window_s)

    @property
    def size(self) -> int:
        return self.end - self.first


def exact_percentiles(values: npt.NDArray[np.int64]) -> dict[str, float]:
    """p50, p90, p99 and max of integer milliseconds, each an observed value (nearest rank,
    no interpolation)."""
    if len(values) == 0:
        return {}
    qs = np.percentile(values, QUANTILES, method="inverted_cdf")
    out = {f"p{q}": float(v) for q, v in zip(QUANTILES, qs, strict=True)}
    out["max"] = float(values.max())
    return out


def drift_ms(
    seq: npt.NDArray[np.int64], gen: npt.NDArray[np.int64], window: Window
) -> float | None:
    """p50 ``gen -> seen`` of the window's last fifth of rows minus that of its first fifth
    (by sequence number): how much the backlog grew across the window. None when either
    fifth has no row seen."""
    fifth = window.size // 5
    head = gen[seq < window.first + fifth]
    tail = gen[seq >= window.end - fifth]
    if len(head) == 0 or len(tail) == 0:
        return None
    return float(np.median(tail) - np.median(head))


def sustained(complete: bool, gen_p50: float | None, drift: float | None) -> list[str]:
    """Why the measurement does not count as sustained (empty: it does); see the module doc."""
    why = []
    if not complete:
        why.append("the reader did not see every row of the window within the drain limit")
    if gen_p50 is None or not gen_p50 < SUSTAIN_P50_MS:
        seen = "no row seen" if gen_p50 is None else f"{gen_p50:,.0f} ms"
        why.append(f"p50 gen -> seen ({seen}) is not under {SUSTAIN_P50_MS:,} ms")
    if drift is None:
        why.append("no row seen of the window's first or last fifth, so no trend to compare")
    elif drift > SUSTAIN_DRIFT_MS:
        why.append(
            f"gen -> seen grew by {drift:,.0f} ms from the window's first fifth to its last "
            f"(more than {SUSTAIN_DRIFT_MS:,} ms: the backlog grows)"
        )
    return why


class Recorder:
    """R's ``foreachBatch`` function: per micro-batch, the driver's wall clock when Spark calls
    it, and per row that moment minus ``bornTimestamp`` and minus ``genTs``.

    Spark calls it on the query's thread; the benchmark reads the counters from its own, so
    they change under a lock."""

    def __init__(self, window: Window) -> None:
        self.window = window
        self._lock = threading.Lock()
        self._seq: list[npt.NDArray[np.int64]] = []
        self._born: list[npt.NDArray[np.int64]] = []
        self._gen: list[npt.NDArray[np.int64]] = []
        self.seen = 0  # every row, warm-up and after the window included
        self.in_window = 0
        self.start_ms: int | None = None  # the rate source's time 0, from the rows' genTs
        self.batches: list[dict[str, int]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        see_ms = time.time_ns() // 1_000_000
        seen = F.lit(see_ms)
        table = df.select(
            F.element_at("keys", 1).cast("long").alias("seq"),
            (seen - F.unix_millis("bornTimestamp")).alias("born"),
            (seen - F.col("properties").getItem(GEN_PROPERTY).cast("long")).alias("gen"),
        ).toArrow()
        done_ms = time.time_ns() // 1_000_000
        seq, born, gen = (_ints(table.column(c), c) for c in ("seq", "born", "gen"))
        w = self.window
        keep = (seq >= w.first) & (seq < w.end)
        start = None
        if len(seq):
            # genTs = start + seq * 1000 / rate, rounded to the ms: any row gives the start.
            start = int(see_ms - gen[0] - round(int(seq[0]) * 1000 / w.rate))
        with self._lock:
            if self.start_ms is None:
                self.start_ms = start
            self.seen += len(seq)
            self.in_window += int(keep.sum())
            self._seq.append(seq[keep])
            self._born.append(born[keep])
            self._gen.append(gen[keep])
            self.batches.append(
                {"batch": batch_id, "see_ms": see_ms, "read_ms": done_ms - see_ms, "rows": len(seq)}
            )

    def counts(self) -> tuple[int, int, int | None]:
        with self._lock:
            return self.seen, self.in_window, self.start_ms

    def arrays(
        self,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        with self._lock:
            parts = (self._seq, self._born, self._gen)
            return tuple(  # type: ignore[return-value]
                np.concatenate(p) if p else np.empty(0, np.int64) for p in parts
            )


def _ints(column: Any, name: str) -> npt.NDArray[np.int64]:
    if column.null_count:
        raise AssertionError(
            f"latency reader: {column.null_count} row(s) without {name} (a message the "
            "benchmark did not write?)"
        )
    return np.asarray(column.to_numpy(), dtype=np.int64)


def _messages(spark: Any, rate: int) -> Any:
    from pyspark.sql import functions as F

    value = F.col("value").cast("string")
    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .option("numPartitions", 2)
        .load()
        .select(
            value.alias("keys"),
            F.rpad(F.concat(F.lit("m-"), value, F.lit(" ")), BODY_BYTES, "x")
            .cast("binary")
            .alias("body"),
            F.create_map(F.lit(GEN_PROPERTY), F.unix_millis("timestamp").cast("string")).alias(
                "properties"
            ),
        )
    )


class _BatchReports:
    """Both queries' progress reports, kept by batch id."""

    def __init__(self) -> None:
        self.by_query: dict[str, dict[int, dict[str, Any]]] = {"writer": {}, "reader": {}}

    def poll(self, queries: dict[str, Any]) -> None:
        for name, q in queries.items():
            for p in q.recentProgress:
                self.by_query[name][int(p["batchId"])] = {
                    "batchId": int(p["batchId"]),
                    "timestamp_ms": _iso_ms(str(p["timestamp"])),
                    "numInputRows": int(p["numInputRows"]),
                    "durationMs": {k: int(v) for k, v in dict(p["durationMs"]).items()},
                }

    def summary(self, name: str, lo_ms: int, hi_ms: int) -> dict[str, Any]:
        """Medians over the micro-batches with rows that started in ``[lo_ms, hi_ms)``."""
        got = [
            p
            for p in self.by_query[name].values()
            if lo_ms <= p["timestamp_ms"] < hi_ms and p["numInputRows"] > 0
        ]
        if not got:
            return {"batches": 0}
        keys = sorted({k for p in got for k in p["durationMs"]})
        return {
            "batches": len(got),
            "rows_per_batch_p50": median([p["numInputRows"] for p in got]),
            "duration_ms_p50": {k: median([p["durationMs"].get(k, 0) for p in got]) for k in keys},
            "trigger_ms_max": max(p["durationMs"].get("triggerExecution", 0) for p in got),
        }


class Gate:
    """A ``foreachBatch`` function that passes micro-batches to ``fn`` until :meth:`close`,
    and then does nothing with them, so that the query can be stopped between triggers.

    ``stop()`` interrupts a running micro-batch, and an interrupted ``foreachBatch`` function
    makes Spark 4.3 match the long Python error against a backtracking regex, which overflows
    the stream thread's stack: a ``StackOverflowError`` and a thousand-line trace on stderr,
    harmless but alarming. A writer that cannot keep up is never between triggers; closed, its
    batches take a few milliseconds and it soon is."""

    def __init__(self, fn: Callable[[Any, int], None]) -> None:
        self.fn = fn
        self.closed = False

    def __call__(self, df: Any, batch_id: int) -> None:
        if not self.closed:
            self.fn(df, batch_id)

    def close(self) -> None:
        self.closed = True


def stop_between_batches(query: Any, wait_s: float = 30.0) -> None:
    """Stop ``query`` while no trigger runs, if that happens within ``wait_s`` (see
    :class:`Gate`)."""
    deadline = time.monotonic() + wait_s
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.005)
    query.stop()


def _iso_ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).timestamp() * 1000)


def measure(spark: Any, work: Path, window: Window, drain_s: int, label: str) -> dict[str, Any]:
    """One measurement at ``window.rate`` (see the module doc); the figures as a dict."""
    from rocketstore.sink.foreach import CommitLogSink

    root = work / f"root-{label}"
    StoreRoot(root).ensure_topic(TOPIC, TopicMeta(BROKERS, QUEUES))
    sink = CommitLogSink(str(root), topic=TOPIC, brokers=BROKERS, queues=QUEUES)
    recorder = Recorder(window)
    gates = {"writer": Gate(sink), "reader": Gate(recorder)}
    progress = _BatchReports()
    load_before = os.getloadavg()
    reader = (
        spark.readStream.format("rocketstore")
        .option("path", str(root))
        .option("topic", TOPIC)
        .option("startingOffsets", "earliest")
        .option("includeProperties", "true")  # genTs is a user property
        .load()
        .writeStream.foreachBatch(gates["reader"])
        .option("checkpointLocation", str(work / f"ck-reader-{label}"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    writer = (
        _messages(spark, window.rate)
        .writeStream.foreachBatch(gates["writer"])
        .option("checkpointLocation", str(work / f"ck-writer-{label}"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    queries = {"writer": writer, "reader": reader}
    backlog: list[tuple[int, int]] = []  # (ms since the rate source's start, rows behind)
    t0 = time.monotonic()
    last_log = t0
    try:
        while True:
            for name, q in queries.items():
                if q.exception() is not None:
                    raise RuntimeError(f"latency {label}: the {name} query failed: {q.exception()}")
            seen, in_window, start_ms = recorder.counts()
            now_ms = time.time_ns() // 1_000_000
            if in_window >= window.size:
                break
            if start_ms is None:
                if time.monotonic() - t0 > STARTUP_LIMIT_S:
                    raise RuntimeError(
                        f"latency {label}: the reader saw no row within {STARTUP_LIMIT_S} s"
                    )
            else:
                elapsed_ms = now_ms - start_ms
                released = window.rate * max(0, elapsed_ms // 1000)
                backlog.append((elapsed_ms, released - seen))
                if elapsed_ms > (window.warmup_s + window.window_s + drain_s) * 1000:
                    break
            if time.monotonic() - last_log >= PROGRESS_EVERY_S:
                last_log = time.monotonic()
                progress.poll(queries)
                log(
                    f"latency {label}: {seen:,} rows seen, {in_window:,} of the window's "
                    f"{window.size:,}; backlog {backlog[-1][1] if backlog else 0:,} rows"
                )
            time.sleep(POLL_S)
    finally:
        for gate in gates.values():
            gate.close()
        for q in queries.values():
            stop_between_batches(q)
    progress.poll(queries)
    load_after = os.getloadavg()
    return _figures(window, recorder, progress, backlog, sink, load_before, load_after)


def _figures(
    window: Window,
    recorder: Recorder,
    progress: _BatchReports,
    backlog: list[tuple[int, int]],
    sink: Any,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> dict[str, Any]:
    seq, born, gen = recorder.arrays()
    unique = len(np.unique(seq))
    if unique != len(seq):
        raise AssertionError(
            f"latency at {window.rate}/s: the reader saw {len(seq) - unique} row(s) of the "
            "window more than once"
        )
    complete = len(seq) == window.size
    born_p = exact_percentiles(born)
    gen_p = exact_percentiles(gen)
    drift = drift_ms(seq, gen, window)
    why = sustained(complete, gen_p.get("p50"), drift)
    start_ms = recorder.start_ms or 0
    lo_ms = start_ms + window.warmup_s * 1000
    hi_ms = start_ms + (window.warmup_s + window.window_s) * 1000

    def backlog_at(t_ms: int) -> int | None:
        after = [rows for t, rows in backlog if t >= t_ms]
        return after[0] if after else None

    reads = [b["read_ms"] for b in recorder.batches if b["rows"] and lo_ms <= b["see_ms"] < hi_ms]
    return {
        "rate": window.rate,
        "warmup_s": window.warmup_s,
        "window_s": window.window_s,
        "window_messages": window.size,
        "seen_in_window": len(seq),
        "complete": complete,
        "born_to_seen_ms": born_p,
        "gen_to_seen_ms": gen_p,
        "gen_drift_ms": drift,
        "sustained": not why,
        "not_sustained_because": why,
        "backlog_rows": {
            "window_start": backlog_at(window.warmup_s * 1000),
            "window_end": backlog_at((window.warmup_s + window.window_s) * 1000),
            "max": max((rows for _, rows in backlog), default=None),
            "series": backlog,
        },
        "writer": {
            **progress.summary("writer", lo_ms, hi_ms),
            "sink_batches": len(sink.history),
            "stored_messages": sum(s.appended for s in sink.history),
        },
        "reader": {
            **progress.summary("reader", lo_ms, hi_ms),
            "read_and_measure_ms_p50": median(reads) if reads else None,
        },
        "load_before": load_before,
        "load_after": load_after,
    }


def _log_result(label: str, r: dict[str, Any]) -> None:
    b, g = r["born_to_seen_ms"], r["gen_to_seen_ms"]
    log(
        f"latency {label}: born->seen p50 {b.get('p50')} p99 {b.get('p99')} ms, gen->seen p50 "
        f"{g.get('p50')} p99 {g.get('p99')} ms; "
        + (
            "sustained"
            if r["sustained"]
            else "NOT sustained: " + "; ".join(r["not_sustained_because"])
        )
    )


def run(options: Options) -> PartResult:
    sizes = QUICK if options.quick else FULL
    notes = work_dir_notes(options.work_dir, "latency")
    spark, owned = local_session("rocketstore-bench-latency")
    steady: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    load_start = os.getloadavg()
    try:
        with scratch_dir(options.work_dir, "latency-") as work:
            if sizes.prime_s:
                half = sizes.prime_s // 2
                primer = Window(STEADY_RATE, half, sizes.prime_s - half)
                _log_result("prime", measure(spark, work, primer, sizes.drain_s, "prime"))
            for i in range(options.runs):
                window = Window(STEADY_RATE, sizes.warmup_s, sizes.steady_window_s)
                label = f"steady-{i + 1}"
                steady.append(measure(spark, work, window, sizes.drain_s, label))
                _log_result(label, steady[-1])
            for rate in sizes.step_rates:
                window = Window(rate, sizes.warmup_s, sizes.step_window_s)
                label = f"step-{rate}"
                steps.append(measure(spark, work, window, sizes.drain_s, label))
                _log_result(label, steps[-1])
                if not steps[-1]["sustained"]:
                    break
    finally:
        if owned:
            spark.stop()
    load_end = os.getloadavg()
    return _result(options, sizes, steady, steps, load_start, load_end, notes)


def _result(
    options: Options,
    sizes: Sizes,
    steady: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
    notes: list[str],
) -> PartResult:
    def per_run(key: str, q: str) -> list[float]:
        return [r[key][q] for r in steady if q in r[key]]

    rows: list[Row] = []
    for key, what in (("born_to_seen_ms", "born -> seen"), ("gen_to_seen_ms", "gen -> seen")):
        for q in ("p50", "p90", "p99", "max"):
            values = per_run(key, q)
            if not values:
                continue
            is_target = key == "born_to_seen_ms" and q == "p50"
            m = median(values)
            rows.append(
                Row(
                    f"{what} {q}, {STEADY_RATE:,} msgs/s",
                    "ms",
                    m,
                    min(values),
                    max(values),
                    target=f"< {TARGET_P50_MS:,} ms" if is_target else "",
                    met=(m < TARGET_P50_MS) if is_target else None,
                )
            )
    for r in steps:
        for key, what in (("born_to_seen_ms", "born -> seen"), ("gen_to_seen_ms", "gen -> seen")):
            p = r[key]
            is_born = key == "born_to_seen_ms"
            rows.append(
                Row(
                    f"{what} p50, {r['rate']:,} msgs/s",
                    "ms",
                    p.get("p50", float("nan")),
                    baseline=f"p99 {p.get('p99', float('nan')):,.0f} ms",
                    target=("sustained" if r["sustained"] else "not sustained") if is_born else "",
                )
            )
    measured = [*steady, *steps]
    passed = [r["rate"] for r in measured if r["sustained"]]
    highest = max(passed) if passed else 0
    failed = [r["rate"] for r in steps if not r["sustained"]]
    bound = (
        f"first rate not sustained: {failed[0]:,} msgs/s"
        if failed
        else "every rate tried was sustained"
    )
    rows.append(Row("highest rate sustained", "msgs/s", float(highest), baseline=bound))
    notes.append(
        f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end "
        f"({os.cpu_count()} CPUs); per measurement in the JSON"
    )
    for r in measured:
        if not r["sustained"]:
            notes.append(
                f"{r['rate']:,} msgs/s not sustained: " + "; ".join(r["not_sustained_because"])
            )
    data = {
        "sizes": dataclasses.asdict(sizes),
        "topic": {"brokers": BROKERS, "queues_per_broker": QUEUES, "body_bytes": BODY_BYTES},
        "steady_rate": STEADY_RATE,
        "steady": steady,
        "steps": steps,
        "highest_sustained_rate": highest,
        "first_rate_not_sustained": failed[0] if failed else None,
        "load_avg_start": load_start,
        "load_avg_end": load_end,
        "runs": options.runs,
    }
    return PartResult("latency", rows, data, notes)
