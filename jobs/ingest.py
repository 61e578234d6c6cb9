"""Ingest: files arriving in a folder (JSON lines, CSV, parquet) or Spark's rate source, into a
topic of a rocketstore store root, through the exactly-once sink.

    spark-submit jobs/ingest.py --store data/store --topic orders --checkpoint data/ck/ingest \\
        --source json --input data/incoming --key-column customer --tag-column orderType

Each input row becomes one message. ``--key-column`` columns become the message KEYS (the
IndexFile makes them searchable, and they pick the message queue), ``--tag-column`` the TAGS;
with the avro (default) or json body format every column goes into the body, so nothing is lost.
With ``--body-format binary`` the input must have a ``body`` column and no columns besides the
message fields. The checkpoint makes the job restartable: a restart goes on where the last
committed micro-batch ended and never stores a row twice.

Exit status: 0 when the query ended (``--trigger available-now`` / ``once``, or ``--timeout``);
1 when it failed; 2 for a bad option.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocketstore.jobs import common

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from rocketstore.jobs.sinkgate import SinkGate

PROG = "ingest"
SOURCES = ("json", "csv", "parquet", "rate")


def build_parser() -> argparse.ArgumentParser:
    parser = common.job_parser(PROG, __doc__)
    parser.add_argument("--topic", required=True, help="topic the rows are stored in")
    parser.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="the query's checkpoint directory"
    )
    src = parser.add_argument_group("the input")
    src.add_argument(
        "--source",
        choices=SOURCES,
        default="json",
        help="files of this format arriving in --input, or rate: generated rows "
        "(timestamp, value) for load tests (default: json)",
    )
    src.add_argument("--input", metavar="DIR", help="the folder files arrive in")
    src.add_argument(
        "--schema",
        metavar="DDL",
        help="the files' schema, e.g. 'id BIGINT, customer STRING, eventTime TIMESTAMP' "
        "(default: inferred from the files already there)",
    )
    src.add_argument(
        "--max-files-per-trigger", type=common.positive_int, metavar="N", help="files per batch"
    )
    src.add_argument(
        "--rows-per-second",
        type=common.positive_int,
        default=1000,
        metavar="N",
        help="rate source: rows generated per second (default 1000)",
    )
    src.add_argument(
        "--read-option",
        action="append",
        default=[],
        type=common.key_value,
        metavar="KEY=VALUE",
        help="an option of Spark's file or rate source, e.g. multiLine=true (repeatable)",
    )
    msg = parser.add_argument_group("rows to messages")
    msg.add_argument(
        "--key-column",
        action="append",
        default=[],
        metavar="COLUMN",
        help="a column whose value is a message key (repeatable; a keys column is used as is)",
    )
    msg.add_argument(
        "--tag-column", metavar="COLUMN", help="the column whose value is the message tag"
    )
    common.add_sink_options(parser)
    common.add_trigger_options(parser, default="5 seconds")
    return parser


def input_stream(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """The streaming input: Spark's file source over ``--input`` or the rate source."""
    if args.source == "rate":
        reader = spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_second)
        for key, value in args.read_option:
            reader = reader.option(key, value)
        return reader.load()
    if not args.input:
        raise common.JobError(f"--input DIR is required with --source {args.source}")
    folder = Path(args.input)
    # Over Spark Connect the folder is the server's: Spark itself reports a missing one.
    local = not common.is_remote(spark)
    if local and not folder.is_dir():
        raise common.JobError(f"--input {folder}: no such directory")
    options: dict[str, str] = {"header": "true"} if args.source == "csv" else {}
    options.update(dict(args.read_option))
    if args.max_files_per_trigger is not None:
        options["maxFilesPerTrigger"] = str(args.max_files_per_trigger)
    reader = spark.readStream.format(args.source).options(**options)
    if args.schema:
        reader = reader.schema(args.schema)
    else:
        reader = reader.schema(_infer_schema(spark, args.source, folder, options, local))
    return reader.load(str(folder))


def _infer_schema(
    spark: SparkSession, fmt: str, folder: Path, options: dict[str, str], local: bool
) -> Any:
    # Spark's file stream needs the schema up front; the files already there tell it.
    if local and not any(
        p.is_file() and not p.name.startswith((".", "_")) for p in folder.iterdir()
    ):
        raise common.JobError(
            f"--input {folder} is empty, so the schema cannot be inferred; give --schema DDL"
        )
    batch_options = {k: v for k, v in options.items() if k != "maxFilesPerTrigger"}
    if fmt == "csv":
        batch_options.setdefault("inferSchema", "true")
    return spark.read.format(fmt).options(**batch_options).load(str(folder)).schema


def to_messages(df: DataFrame, key_columns: list[str], tag_column: str | None) -> DataFrame:
    """``df`` with the ``keys`` and ``tags`` message columns made from the named columns (which
    stay as they are, so an avro or json body still holds them)."""
    from pyspark.sql import functions as F

    missing = [c for c in [*key_columns, tag_column] if c is not None and c not in df.columns]
    if missing:
        raise common.JobError(
            f"no column {', '.join(missing)} in the input; its columns: {', '.join(df.columns)}"
        )
    if key_columns:
        df = df.withColumn("keys", F.array(*[F.col(c).cast("string") for c in key_columns]))
    if tag_column is not None:
        df = df.withColumn("tags", F.col(tag_column).cast("string"))
    return df


def start(spark: SparkSession, args: argparse.Namespace) -> tuple[StreamingQuery, SinkGate]:
    """Start the ingest query; returns it and the gate of its sink (whose ``history`` holds
    each micro-batch's summary)."""
    df = to_messages(input_stream(spark, args), args.key_column, args.tag_column)
    sink = common.commit_log_sink(df, args, args.topic)
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", args.checkpoint)
    writer = common.apply_trigger(writer, args.trigger).queryName(f"ingest-{args.topic}")
    return writer.start(), sink


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the ingest job with ``argv`` (default ``sys.argv[1:]``) on ``spark`` (default: a new
    session, stopped at the end); returns the exit status."""

    return common.run_job(PROG, build_parser(), argv, spark, run)


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    """Run the ingest query until it ends (see the module); returns the exit status."""
    query, sink = start(spark, args)
    common.log(PROG, f"started: {args.source} -> {args.store} topic {args.topic}")
    common.wait(query, args.timeout, sink)
    if sink.remote:
        # The server's copy of the sink kept the per-batch counts.
        read, _ = common.rows_in_and_out(query)
        common.log(PROG, f"done: {read} row(s) read and stored (over Spark Connect)")
        return 0
    rows = sum(b.appended for b in sink.history)
    skipped = sum(b.skipped for b in sink.history)
    size = sum(b.bytes for b in sink.history)
    common.log(
        PROG,
        f"done: {len(sink.history)} micro-batch(es), {rows} message(s) appended "
        f"({size} bytes), {skipped} already stored by an earlier attempt",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
