"""Streaming queries writing parquet input into a store root, run in a process of their own by
the sink's fault tests (they need their own Spark master and must be able to SIGKILL the driver).

usage: python tests/procs/sink_job.py INPUT ROOT CHECKPOINT MASTER FACES [FAILPOINT]
FACES is one face or several, comma-separated: ``foreach``, ``foreach-shuffled`` (two input
files a micro-batch: two partitions, which the foreachBatch sink shuffles into one task per
broker) or ``format``. Several run one after another in this one driver (a JVM and a Spark
session cost some 10 s to start), each into ROOT and CHECKPOINT with ``{face}`` replaced by its
name. FAILPOINT is a ``$ROCKETSTORE_TEST_FAILPOINT`` value (see sink/append.py), which the Spark
tasks inherit; with ``{face}`` in it, each query's tasks see it with their face's name.

Prints one JSON line per query: its ``face``, the ``error`` that stopped it (null if none)
and, for the foreachBatch faces, the rows ``appended`` and ``skipped`` and the micro-batches
``shuffled``. A failed query's traceback goes to stderr and the next query still runs; the exit
status is 1 if any failed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

# Run by path, this script has tests/procs/ on sys.path: the checkout is added for tests.kit.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import SparkSession

from rocketstore.jobs.common import register
from rocketstore.sink.append import FAILPOINT_ENV
from rocketstore.sink.foreach import CommitLogSink
from tests.kit.sink import INPUT_DDL, STORE_OPTIONS


def main(argv: list[str]) -> int:
    folder, root, checkpoint, master, faces = argv[:5]
    failpoint = argv[5] if len(argv) > 5 else None
    with tempfile.TemporaryDirectory(prefix="sink-job-") as scratch:
        return run_all(folder, root, checkpoint, master, faces, failpoint, Path(scratch))


def run_all(
    folder: str,
    root: str,
    checkpoint: str,
    master: str,
    faces: str,
    failpoint: str | None,
    scratch: Path,
) -> int:
    spec_file = None
    if failpoint and "{face}" in failpoint:
        # Python workers keep the environment they started with: the failpoint names a file
        # that holds each query's spec (sink/append.py reads it at every chunk).
        spec_file = scratch / "failpoint"
        os.environ[FAILPOINT_ENV] = f"@{spec_file}"
    elif failpoint:
        # Set before Spark starts: its Python workers inherit the driver's environment.
        os.environ[FAILPOINT_ENV] = failpoint
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    failed = False
    for face in faces.split(","):
        if spec_file is not None and failpoint is not None:
            spec_file.write_text(failpoint.replace("{face}", face))
        try:
            result = run(
                spark,
                face,
                folder,
                root.replace("{face}", face),
                checkpoint.replace("{face}", face),
            )
        except Exception as e:  # the query's failure is the outcome some tests wait for
            traceback.print_exc()
            result = {"error": str(e)}
            failed = True
        print(json.dumps({"face": face, "error": None, **result}), flush=True)
    spark.stop()
    return 1 if failed else 0


def run(spark: SparkSession, face: str, folder: str, root: str, checkpoint: str) -> dict[str, Any]:
    """One query over ``folder`` into ``root`` until the input is used up; what it counted."""
    files = 2 if face == "foreach-shuffled" else 1
    reader = spark.readStream.schema(INPUT_DDL).option("maxFilesPerTrigger", files)
    df = reader.parquet(folder).drop("id")
    # Small chunks give the failpoints many steps to fire at; a test that needs none of them
    # sets SINK_JOB_CHUNK_ROWS to the sink's default.
    extra = {"chunkRows": os.environ.get("SINK_JOB_CHUNK_ROWS", "50")}
    if face.startswith("foreach"):
        sink = CommitLogSink(root, topic="orders", brokers=2, queues=2, **STORE_OPTIONS, **extra)
        writer = df.writeStream.foreachBatch(sink)
    else:
        writer = (
            df.writeStream.format("rocketstore")
            .option("path", root)
            .option("topic", "orders")
            .option("brokers", 2)
            .option("queues", 2)
            .options(**STORE_OPTIONS, **extra)
        )
    q = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    q.awaitTermination()
    if not face.startswith("foreach"):
        return {}
    return {
        "appended": sum(s.appended for s in sink.history),
        "skipped": sum(s.skipped for s in sink.history),
        "shuffled": sum(s.shuffled for s in sink.history),
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
