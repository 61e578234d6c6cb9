"""What the jobs share: the Spark session, the ``conf/`` directory, and the options that several
jobs take (reading the store, writing the store, writing files, triggers).

Runs on the driver only (or, with ``--remote``, in the Spark Connect client). Every job is
``main(argv, spark=None) -> int``: with ``spark`` given it uses that session and leaves it running
(tests, the demo); with ``--remote sc://HOST:PORT`` (or ``$SPARK_REMOTE``) it connects to that
Spark Connect server (:func:`connect_session`); otherwise it builds a local one with
:func:`build_session`. A session it made is stopped at the end.

Where settings of a session the job builds come from, lowest first (a Spark Connect server
keeps its own, and gets only the job's own SQL settings):

1. ``conf/spark-defaults.conf`` (see that file), applied only to keys spark-submit has not set;
2. what spark-submit sets (``--master``, ``--conf``, ``--properties-file``);
3. the job's own options.

``conf/`` is ``$ROCKETSTORE_CONF_DIR`` when set, else ``conf`` in the current directory, as for
the ``rocketstore`` command, the sink and the source (whose store settings, without
``--store-config``, come from its ``store.toml`` when it exists, else the built-in defaults).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocketstore.jobs.sinkgate import SinkGate, StopRequested
from rocketstore.pipeline import sparkapi
from rocketstore.pipeline.errors import StoreError
from rocketstore.pipeline.wholenumbers import count_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

FILE_FORMATS = ("parquet", "json")
OUTPUT_FORMATS = (*FILE_FORMATS, "console")
BODY_FORMATS = ("binary", "avro", "json")
_LOG4J_FILE = re.compile(r"(-Dlog4j2\.configurationFile=)(\S+)")


class JobError(StoreError):
    """A usage problem the job reports in one line and exits 2 for (bad paths, option values).
    The jobs' own, so it lives with them; a StoreError like every error rocketstore raises."""


# -- configuration files ------------------------------------------------------------------------


def conf_dir() -> Path:
    """The directory holding ``spark-defaults.conf``, ``log4j2.properties`` and ``store.toml``:
    the same for every tool (:func:`rocketstore.pipeline.config.conf_dir`)."""
    from rocketstore.pipeline.config import conf_dir as shared

    return shared()


def read_properties(path: Path) -> dict[str, str]:
    """``key value`` lines of a Spark properties file (``#``/``!`` comments, ``=`` or ``:`` or
    white space between key and value), in file order. Line continuations are not supported."""
    out: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        m = re.match(r"([^\s=:]+)\s*[=:\s]\s*(.*)$", line)
        if m is None:
            out[line] = ""
        else:
            out[m.group(1)] = m.group(2).strip()
    return out


def spark_defaults() -> dict[str, str]:
    """``conf/spark-defaults.conf``, with a relative log4j2 configuration file made absolute
    (relative to the directory above ``conf/``), so that the jobs stay quiet from any cwd."""
    path = conf_dir() / "spark-defaults.conf"
    if not path.is_file():
        return {}
    values = read_properties(path)
    base = conf_dir().resolve().parent

    def absolute(m: re.Match[str]) -> str:
        target = Path(m.group(2))
        return m.group(1) + str(target if target.is_absolute() else base / target)

    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        if key in values:
            values[key] = _LOG4J_FILE.sub(absolute, values[key])
    return values


# -- the session ----------------------------------------------------------------------------------


def build_session(app_name: str, conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession for a job, with the ``rocketstore`` data source registered.

    ``conf`` wins over everything; ``conf/spark-defaults.conf`` fills in what neither ``conf``
    nor spark-submit set. Python workers run this interpreter unless ``PYSPARK_PYTHON`` says
    otherwise (the venv has pyarrow, pandas and fastavro; a bare ``python3`` may not).
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    # PySpark turns any builder into a Spark Connect client while SPARK_REMOTE is set; this
    # function builds a local session (jobs honour SPARK_REMOTE before they get here).
    os.environ.pop("SPARK_REMOTE", None)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    already: set[str] = set()
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # Started by spark-submit: its JVM is running and holds the submitted settings, which
        # must win over our defaults. (Reading them needs the gateway, which this opens.)
        SparkContext._ensure_initialized()
        already = {k for k, _ in SparkConf().getAll()}
    builder = SparkSession.builder.appName(app_name)
    for key, value in spark_defaults().items():
        if key not in already and key != "spark.app.name":
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    level = os.environ.get("SPARK_LOG_LEVEL")
    if level:
        spark.sparkContext.setLogLevel(level.upper())
    register(spark)
    return spark


def connect_session(url: str, conf: dict[str, str] | None = None) -> SparkSession:
    """A Spark Connect session with the server at ``url`` (``sc://HOST:PORT``), with the
    ``rocketstore`` data source registered.

    The server's settings stay as they are, except ``conf`` (runtime SQL settings only): the
    local ``conf/spark-defaults.conf`` describes a local Spark, not somebody's server.
    """
    from pyspark.sql import SparkSession

    if not url.startswith("sc://"):
        raise JobError(f"--remote {url!r}: expected a Spark Connect URL, sc://HOST:PORT")
    spark = SparkSession.builder.remote(url).getOrCreate()
    for key, value in (conf or {}).items():
        spark.conf.set(key, value)
    register(spark)
    return spark


def add_session_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run on this Spark Connect server instead of a local Spark (default: "
        "$SPARK_REMOTE when set); paths are then the server's",
    )


def remote_url(args: argparse.Namespace) -> str | None:
    """``--remote``, else ``$SPARK_REMOTE``, else None (a local Spark)."""
    url: str | None = args.remote or os.environ.get("SPARK_REMOTE") or None
    return url


def is_remote(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (whose queries run on the server)."""
    from rocketstore.sink.identity import is_connect

    return is_connect(spark)


def register(spark: SparkSession) -> None:
    """Register the ``rocketstore`` data source (reader and writer) with ``spark``, where the
    PySpark has one: on 3.5 the jobs that only write run without it (``read_store`` says what
    the others need)."""
    if not sparkapi.has(sparkapi.DATA_SOURCE):
        return
    from rocketstore import datasource

    datasource.register(spark)


@contextlib.contextmanager
def session(
    app_name: str,
    spark: SparkSession | None,
    conf: dict[str, str] | None = None,
    remote: str | None = None,
) -> Iterator[SparkSession]:
    """``spark`` as it is (left running), or a new session, stopped on exit: a Spark Connect
    session with the server at ``remote``, or else a local one built with ``conf`` on top of
    the defaults."""
    if spark is not None:
        register(spark)
        yield spark
        return
    built = connect_session(remote, conf) if remote else build_session(app_name, conf)
    try:
        yield built
    finally:
        built.stop()


# -- running a job ----------------------------------------------------------------------------------

QUERY_EXIT_STATUS = "Exit status: 0 finished, 1 the query failed, 2 bad options."


def job_parser(
    prog: str, doc: str | None, epilog: str = QUERY_EXIT_STATUS, *, query: bool = True
) -> argparse.ArgumentParser:
    """The parser a job starts from: its name, the first paragraph of its module docstring
    (``doc``) as the description, ``epilog`` (the exit statuses) and, for a job that runs one
    streaming query (``query``), the options every such job takes: ``--remote`` and the
    store's (:func:`add_session_options`, :func:`add_store_options`)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0] if doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    if query:
        add_session_options(parser)
        add_store_options(parser)
    return parser


def run_job(
    prog: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    spark: SparkSession | None,
    run: Callable[[SparkSession, argparse.Namespace], int],
) -> int:
    """A query job's ``main``: parse ``argv``, then ``run(session, args)`` in ``spark`` or in a
    session made for the job (on the ``--remote`` server when one is named, see
    :func:`session`), stopped at the end; returns the exit status as :func:`run_main` does."""

    def body(args: argparse.Namespace) -> int:
        with session(prog, spark, remote=remote_url(args)) as built:
            return run(built, args)

    return run_main(prog, parser, argv, body)


def run_main(
    prog: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    body: Callable[[argparse.Namespace], int],
) -> int:
    """Parse ``argv`` and run ``body``; returns the exit status.

    0 on success; 1 when a streaming query failed (its error printed in one paragraph); 2 for a
    usage error, a bad option or store error (one line ``PROG: error: ...`` on stderr).
    """
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has reported
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return body(args)
    except StoreError as exc:  # JobError among them
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from pyspark.errors import PySparkException, StreamingQueryException

        if isinstance(exc, StreamingQueryException):
            sys.stderr.write(f"{prog}: the streaming query failed: {_first_lines(str(exc))}\n")
            return 1
        if isinstance(exc, PySparkException):
            # Planning errors (an unknown column in --sql, a bad source option) name the
            # problem in their first lines; the JVM stack trace below them helps nobody here.
            sys.stderr.write(f"{prog}: error: {_first_lines(str(exc))}\n")
            return 2
        raise


def _first_lines(text: str, limit: int = 12) -> str:
    lines = text.strip().splitlines()
    cut = lines[:limit]
    if len(lines) > limit:
        cut.append(f"... ({len(lines) - limit} more lines)")
    return "\n".join(cut)


def log(prog: str, message: str) -> None:
    """A progress line on stderr (stdout stays free for console output and summaries)."""
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} {prog}: {message}\n")
    sys.stderr.flush()


# -- triggers ---------------------------------------------------------------------------------------


def add_trigger_options(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--trigger",
        default=default,
        metavar="WHEN",
        help="'available-now': process what is there, in as many micro-batches as the limits "
        "need, then stop; 'once': one micro-batch; or an interval between micro-batches, e.g. "
        f"'5 seconds' (default: {default})",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help="stop the query after this long (it stops between micro-batches when it can)",
    )


def apply_trigger(writer: DataStreamWriter, when: str) -> DataStreamWriter:
    word = when.strip().lower()
    if word in ("available-now", "availablenow"):
        return writer.trigger(availableNow=True)
    if word == "once":
        return writer.trigger(once=True)
    if not re.match(r"^\d+(\.\d+)?\s*[a-z]*$", word):
        raise JobError(
            f"--trigger {when!r}: expected available-now, once, or an interval like '5 seconds'"
        )
    return writer.trigger(processingTime=when)


def wait(query: StreamingQuery, timeout: float | None, gate: SinkGate | None = None) -> None:
    """Wait for ``query`` to finish, or stop it after ``timeout`` seconds; re-raise its failure.

    With the ``gate`` of the query's store sink, the stop comes between micro-batches (see
    :func:`stop_between_batches`).
    """
    if timeout is None:
        query.awaitTermination()
        return
    # Seconds may be fractional: PySpark turns them into milliseconds (its stub says int).
    if query.awaitTermination(timeout):  # type: ignore[arg-type]
        return
    stop_between_batches(query, patience=60.0, gate=gate)


def stop_between_batches(
    query: StreamingQuery, patience: float, gate: SinkGate | None = None
) -> None:
    """Stop ``query`` so that no micro-batch is left half-written; re-raise a real failure.

    With a store sink's ``gate``: the gate closes (no micro-batch starts appending any more),
    the append under way, if any, finishes (up to ``patience`` seconds), and then the query is
    stopped. A batch planned meanwhile fails at the gate before appending anything, and is
    replayed whole on restart. Without a gate (file sinks, whose manifest leaves out what a
    stopped batch wrote), the query is stopped once it is between triggers, waiting at most
    ``patience`` seconds for that. Over Spark Connect the sink runs on the server, out of the
    gate's reach, and the query is stopped between triggers too; a micro-batch that started
    appending all the same is completed, exactly once, when the query is restarted.
    """
    if gate is not None and not gate.remote:
        gate.close(patience)
    else:
        deadline = time.monotonic() + patience
        while query.isActive and query.status.get("isTriggerActive"):
            if time.monotonic() >= deadline:
                break
            # Spark offers no "stop after this batch" call: poll its status.
            time.sleep(0.2)
    query.stop()
    exc = query.exception()
    if exc is not None and StopRequested.MARK not in str(exc):
        raise exc


def rows_in_and_out(query: StreamingQuery) -> tuple[int, int]:
    """Rows read and rows written over the query's recent micro-batches (Spark keeps the last
    ``spark.sql.streaming.numRecentProgressUpdates``, 100 by default). A ``foreachBatch`` sink
    reports no row count: 0 written."""
    read = written = 0
    for progress in query.recentProgress:
        read += int(progress.numInputRows)
        written += max(0, int(progress.sink.numOutputRows))
    return read, written


# -- reading the store ------------------------------------------------------------------------------


def add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", required=True, metavar="ROOT", help="the store root directory (broker-N/)"
    )
    parser.add_argument(
        "--store-config",
        metavar="FILE",
        help="store settings, a .toml or broker.conf file (default: conf/store.toml when it "
        "exists, else the built-in defaults); a store must always be written with the same "
        "geometry",
    )


def add_read_options(parser: argparse.ArgumentParser) -> None:
    """Options of the ``rocketstore`` source (see source/options.py for every accepted value)."""
    group = parser.add_argument_group("reading the store")
    group.add_argument("--topic", required=True, help="topic to read (several: a,b)")
    group.add_argument(
        "--starting-offsets",
        default="earliest",
        metavar="WHERE",
        help="earliest, latest or offsets JSON, for a new checkpoint (default: earliest)",
    )
    group.add_argument(
        "--max-messages-per-trigger", type=positive_int, metavar="N", help="micro-batch size limit"
    )
    group.add_argument(
        "--sub-expression", metavar="TAGS", help="tag filter, e.g. 'NEW || PAID' (default *)"
    )
    group.add_argument(
        "--input-body-format",
        choices=BODY_FORMATS,
        help="decode bodies as (default: the format the topic was written with)",
    )
    group.add_argument(
        "--read-option",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="any other source option, e.g. failOnDataLoss=false (repeatable)",
    )


def read_store(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """A streaming DataFrame of the store's messages, as the read options say."""
    sparkapi.require(sparkapi.DATA_SOURCE, "reading the store in a job (the rocketstore source)")
    reader = (
        spark.readStream.format("rocketstore")
        .option("path", args.store)
        .option("topic", args.topic)
        .option("startingOffsets", args.starting_offsets)
    )
    if args.max_messages_per_trigger is not None:
        reader = reader.option("maxMessagesPerTrigger", str(args.max_messages_per_trigger))
    if args.sub_expression is not None:
        reader = reader.option("subExpression", args.sub_expression)
    if args.input_body_format is not None:
        reader = reader.option("bodyFormat", args.input_body_format)
    if args.store_config is not None:
        reader = reader.option("config", args.store_config)
    for key, value in args.read_option:
        reader = reader.option(key, value)
    return reader.load()


# -- writing the store ------------------------------------------------------------------------------


def add_sink_options(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """Options of a new topic written through the sink (``--brokers`` etc.)."""
    group = parser.add_argument_group("writing the store")
    group.add_argument(
        f"--{prefix}brokers",
        type=positive_int,
        metavar="N",
        help="broker directories of a new topic (default 4; a known topic keeps its own)",
    )
    group.add_argument(
        f"--{prefix}queues",
        type=positive_int,
        metavar="N",
        help="queues per broker of a new topic (default 4)",
    )
    group.add_argument(
        f"--{prefix}body-format",
        choices=BODY_FORMATS,
        help="binary: a body column is the message body; avro/json: every column that is not a "
        "message field (keys, tags, properties, flag, queueId) is encoded into the body "
        "(default: binary when there is a body column, else avro)",
    )
    group.add_argument(
        f"--{prefix}sharding-key",
        metavar="COLUMN",
        help="column whose value picks the message queue (default: the keys)",
    )
    group.add_argument(
        f"--{prefix}sink-option",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="store setting by its RocketMQ name, e.g. flushDiskType=SYNC_FLUSH (repeatable)",
    )


def commit_log_sink(
    df: DataFrame, args: argparse.Namespace, topic: str, *, prefix: str = ""
) -> SinkGate:
    """The ``foreachBatch`` function writing ``df``'s rows into ``topic`` of ``args.store``: a
    ``CommitLogSink`` behind a :class:`SinkGate`."""
    from rocketstore.sink.foreach import CommitLogSink

    def arg(name: str) -> Any:
        return getattr(args, prefix.replace("-", "_") + name)

    remote = is_remote(df.sparkSession)
    body_format = arg("body_format") or ("binary" if "body" in df.columns else "avro")
    options: dict[str, Any] = dict(arg("sink_option"))
    for key, value in (
        ("brokers", arg("brokers")),
        ("queues", arg("queues")),
        ("shardingKey", arg("sharding_key")),
        ("config", args.store_config),
    ):
        if value is not None:
            options[key] = value
    sink = CommitLogSink(args.store, topic=topic, bodyFormat=body_format, **options)
    return SinkGate(sink, remote=remote)


# -- writing files or the console ---------------------------------------------------------------------


def add_file_output_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    group = parser.add_argument_group("writing files")
    group.add_argument(
        "--output", required=required, metavar="DIR", help="directory the files are written to"
    )
    group.add_argument(
        "--format",
        choices=OUTPUT_FORMATS,
        default="parquet",
        help="file format, or console to print each micro-batch (default: parquet)",
    )
    group.add_argument(
        "--console-rows", type=positive_int, default=20, metavar="N", help="rows shown per batch"
    )


def file_writer(
    df: DataFrame, args: argparse.Namespace, checkpoint: str, output_mode: str = "append"
) -> DataStreamWriter:
    """A writer of ``df`` to ``args.format`` files under ``args.output`` (or the console)."""
    writer = df.writeStream.option("checkpointLocation", checkpoint).outputMode(output_mode)
    if args.format == "console":
        return (
            writer.format("console")
            .option("numRows", args.console_rows)
            .option("truncate", "false")
        )
    if not args.output:
        raise JobError(f"--output DIR is required with --format {args.format}")
    if output_mode != "append":
        raise JobError(
            f"--output-mode {output_mode}: files can only be appended to (use the console or a "
            "topic for update/complete)"
        )
    return writer.format(args.format).option("path", args.output)


# -- option types -------------------------------------------------------------------------------------


# The same check as the rocketstore command's and the sink's and source's options.
positive_int = count_type(1)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key.strip(), value
