"""Process: read a topic as a stream, transform it with SQL, and write the result to another
topic of the store, to files, or to the console.

    spark-submit jobs/process.py --store data/store --topic orders --checkpoint data/ck/stats \\
        --watermark 'eventTime=10 seconds' --output-topic order-stats \\
        --sql "SELECT window.start AS windowStart, orderType AS keys, count(*) AS orders
               FROM messages GROUP BY window(eventTime, '1 minute'), orderType"

The input is registered as the temporary view ``--view`` (default ``messages``) with the
source's columns: topic, brokerName, queueId, queueOffset, storeTimestamp, keys, tags, ... and,
for a topic written with an avro or json body, the body's columns decoded. ``--watermark``
declares the event-time column and how late rows may be, which a windowed aggregation in
append mode needs to know when a window is final.

Writing to a topic goes through the exactly-once sink: the result may have the message columns
(keys, tags, properties, flag, queueId; body with ``--body-format binary``), and every other
column goes into an avro (default) or json body.

Exit status: 0 when the query ended (``--trigger available-now`` / ``once``, or ``--timeout``);
1 when it failed; 2 for a bad option or SQL.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from rocketstore.jobs import common

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from rocketstore.jobs.sinkgate import SinkGate

PROG = "process"
OUTPUT_MODES = ("append", "update", "complete")


def build_parser() -> argparse.ArgumentParser:
    parser = common.job_parser(
        PROG, __doc__, "Exit status: 0 finished, 1 the query failed, 2 bad options or SQL."
    )
    parser.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="the query's checkpoint directory"
    )
    common.add_read_options(parser)
    sql = parser.add_argument_group("the transformation")
    sql.add_argument("--sql", required=True, help="a SELECT over the input view")
    sql.add_argument(
        "--view", default="messages", help="name of the input's temporary view (default messages)"
    )
    sql.add_argument(
        "--watermark",
        type=common.key_value,
        metavar="COLUMN=DELAY",
        help="event-time column and allowed lateness, e.g. 'eventTime=10 seconds'",
    )
    sql.add_argument(
        "--output-mode",
        choices=OUTPUT_MODES,
        default="append",
        help="append: rows once final (with a watermark for aggregations); update: changed "
        "rows every batch; complete: the whole result every batch (default append)",
    )
    out = parser.add_argument_group("writing the result")
    out.add_argument("--output-topic", metavar="TOPIC", help="write the result to this topic")
    common.add_file_output_options(parser, required=False)
    common.add_sink_options(parser)
    common.add_trigger_options(parser, default="5 seconds")
    return parser


def transform(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """The streaming result of ``--sql`` over the store's messages."""
    from pyspark.errors import AnalysisException

    df = common.read_store(spark, args)
    if args.watermark is not None:
        column, delay = args.watermark
        if column not in df.columns:
            raise common.JobError(
                f"--watermark {column}={delay}: no column {column!r}; the input's columns: "
                f"{', '.join(df.columns)}"
            )
        df = df.withWatermark(column, delay)
    df.createOrReplaceTempView(args.view)
    try:
        return spark.sql(args.sql)
    except AnalysisException as exc:
        raise common.JobError(f"--sql: {str(exc).splitlines()[0]}") from None


def start(spark: SparkSession, args: argparse.Namespace) -> tuple[StreamingQuery, SinkGate | None]:
    """Start the processing query; returns it and the gate of its store sink (``None`` when
    the result goes to files or the console)."""
    result = transform(spark, args)
    sink = None
    if args.output_topic is not None:
        if args.output:
            raise common.JobError("give --output-topic or --output, not both")
        sink = common.commit_log_sink(result, args, args.output_topic)
        writer = (
            result.writeStream.outputMode(args.output_mode)
            .foreachBatch(sink)
            .option("checkpointLocation", args.checkpoint)
        )
    elif args.output or args.format == "console":
        writer = common.file_writer(result, args, args.checkpoint, args.output_mode)
    else:
        raise common.JobError(
            "say where the result goes: --output-topic TOPIC, --output DIR, or --format console"
        )
    writer = common.apply_trigger(writer, args.trigger).queryName(f"process-{args.topic}")
    return writer.start(), sink


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the process job with ``argv`` (default ``sys.argv[1:]``) on ``spark`` (default: a new
    session, stopped at the end); returns the exit status."""

    return common.run_job(PROG, build_parser(), argv, spark, run)


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    """Run the process query until it ends (see the module); returns the exit status."""
    query, sink = start(spark, args)
    target = args.output_topic or args.output or "the console"
    common.log(PROG, f"started: {args.store} topic {args.topic} -> {target}")
    common.wait(query, args.timeout, sink)
    read, written = common.rows_in_and_out(query)
    common.log(PROG, f"done: {read} message(s) read, {written} row(s) written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
