"""Export: read a topic as a stream and write its messages to parquet or JSON files, or print
them on the console.

    spark-submit jobs/export.py --store data/store --topic orders \\
        --checkpoint data/ck/export --output data/export/orders --format parquet

Each message is one row with the source's default columns: topic, brokerName, queueId,
queueOffset, commitLogOffset, keys, tags, bornTimestamp, storeTimestamp and either ``body``
(binary) or, for a topic written with an avro or json body, the body's columns decoded;
``--read-option includeAll=true`` adds properties, msgId, the hosts and the flags (or one
group of them: includeProperties, includeMsgId, includeHosts, includeFlags).
``--with-column NAME=EXPR`` adds computed columns (Spark SQL expressions), ``--columns`` keeps
only some. Files are written through Spark's file sink, whose manifest (``_spark_metadata``)
lists exactly the files of committed micro-batches: read the output with Spark (or honour the
manifest) and every message is there once.

Exit status: 0 when the query ended (``--trigger available-now`` / ``once``, or ``--timeout``);
1 when it failed; 2 for a bad option.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from rocketstore.jobs import common

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

PROG = "export"


def build_parser() -> argparse.ArgumentParser:
    parser = common.job_parser(PROG, __doc__)
    parser.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="the query's checkpoint directory"
    )
    common.add_read_options(parser)
    cols = parser.add_argument_group("columns")
    cols.add_argument(
        "--with-column",
        action="append",
        default=[],
        type=common.key_value,
        metavar="NAME=EXPR",
        help="add a column computed by a SQL expression, e.g. "
        "'exportedAt=current_timestamp()' (repeatable)",
    )
    cols.add_argument("--columns", metavar="A,B,...", help="keep only these columns (default: all)")
    common.add_file_output_options(parser, required=False)
    common.add_trigger_options(parser, default="5 seconds")
    return parser


def select(df: DataFrame, args: argparse.Namespace) -> DataFrame:
    """``df`` with the ``--with-column`` columns added and only the ``--columns`` kept."""
    from pyspark.errors import AnalysisException, ParseException
    from pyspark.sql import functions as F

    for name, expr in args.with_column:
        try:
            df = df.withColumn(name, F.expr(expr))
        except (AnalysisException, ParseException) as exc:
            raise common.JobError(
                f"--with-column {name}={expr}: {str(exc).splitlines()[0]}"
            ) from None
    if args.columns:
        wanted = [c.strip() for c in args.columns.split(",") if c.strip()]
        missing = [c for c in wanted if c not in df.columns]
        if missing:
            raise common.JobError(
                f"--columns: no column {', '.join(missing)}; the columns: {', '.join(df.columns)}"
            )
        df = df.select(*wanted)
    return df


def start(spark: SparkSession, args: argparse.Namespace) -> StreamingQuery:
    """Start the export query."""
    if args.format != "console" and not args.output:
        raise common.JobError(f"--output DIR is required with --format {args.format}")
    df = select(common.read_store(spark, args), args)
    writer = common.file_writer(df, args, args.checkpoint)
    writer = common.apply_trigger(writer, args.trigger).queryName(f"export-{args.topic}")
    return writer.start()


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the export job with ``argv`` (default ``sys.argv[1:]``) on ``spark`` (default: a new
    session, stopped at the end); returns the exit status."""

    return common.run_job(PROG, build_parser(), argv, spark, run)


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    """Run the export query until it ends (see the module); returns the exit status."""
    query = start(spark, args)
    target = args.output or "the console"
    common.log(PROG, f"started: {args.store} topic {args.topic} -> {target}")
    common.wait(query, args.timeout)
    read, _ = common.rows_in_and_out(query)
    common.log(PROG, f"done: {read} message(s) exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
