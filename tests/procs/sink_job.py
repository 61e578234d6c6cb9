"""A streaming query writing parquet input into a store root, run in its own process by the
sink's fault tests (they need their own Spark master and must be able to SIGKILL the driver).

usage: python tests/procs/sink_job.py INPUT ROOT CHECKPOINT MASTER FACE [FAILPOINT]
FACE is ``foreach``, ``foreach-shuffled`` (two input files a micro-batch: two partitions, which
the foreachBatch sink shuffles into one task per broker) or ``format``; FAILPOINT is a ``$ROCKETSTORE_TEST_FAILPOINT`` value (see
sink/append.py), which the Spark tasks inherit. Prints ``done <rows appended> <rows skipped>
<micro-batches shuffled>``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Run by path, this script has tests/procs/ on sys.path: the checkout is added for tests.kit.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import SparkSession

from rocketstore.datasource import register
from rocketstore.sink.append import FAILPOINT_ENV
from rocketstore.sink.foreach import CommitLogSink
from tests.kit.sinkutil import STORE_OPTIONS

SCHEMA = "id long, keys string, tags string, properties map<string,string>, flag int, body binary"


def main(argv: list[str]) -> int:
    folder, root, checkpoint, master, face = argv[:5]
    if len(argv) > 5:
        # Set before Spark starts: its Python workers inherit the driver's environment.
        os.environ[FAILPOINT_ENV] = argv[5]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    files = 2 if face == "foreach-shuffled" else 1
    reader = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", files)
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
    if face.startswith("foreach"):
        appended = sum(s.appended for s in sink.history)
        skipped = sum(s.skipped for s in sink.history)
        shuffled = sum(s.shuffled for s in sink.history)
        print("done", appended, skipped, shuffled)
    else:
        print("done")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
