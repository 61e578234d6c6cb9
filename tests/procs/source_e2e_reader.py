"""The reading query of ``test_source_e2e``: the rocketstore source to Spark's parquet file
sink, in a process of its own so that the test can kill it with SIGKILL and start it again from
its checkpoint.

    python tests/procs/source_e2e_reader.py ROOT CHECKPOINT OUT stream|drain

``stream`` runs micro-batches until killed; ``drain`` reads what is there (availableNow) and
exits 0.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from rocketstore.datasource import register


def main(argv: list[str]) -> int:
    root, checkpoint, out, mode = argv
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("rocketstore-e2e-reader")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    rows = (
        spark.readStream.format("rocketstore")
        .option("path", root)
        .option("topic", "e2e")
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "300")
        .option("includeMsgId", "true")
        .load()
        .select("brokerName", "queueId", "queueOffset", "msgId", "keys", "body")
    )
    writer = rows.writeStream.format("parquet").option("path", out)
    writer = writer.option("checkpointLocation", checkpoint)
    if mode == "drain":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="100 milliseconds")
    writer.start().awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
