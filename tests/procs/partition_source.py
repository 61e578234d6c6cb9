"""A streaming query of the ``rocketstore`` source that a partition test runs on a host cut off
from the volume (tests/test_partition.py): driver and executors (``local[2]``) on that host.

usage: python -m tests.procs.partition_source STORE TOPIC OUT CHECKPOINT

Each micro-batch's bodies go to ``OUT/batch-<id>.txt`` (written whole, then renamed; a replayed
batch id replaces its file), and the script prints ``batch <id> <rows>``. When the query fails
(the host lost the volume) it prints ``failed <error>`` and waits for a line on standard input
(``resume``) before it starts the query again from its checkpoint; ``stop`` ends it
(``stopped``). OUT and CHECKPOINT are on the host's own disk, not on the volume.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from rocketstore.datasource import register


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(store: str, topic: str, out: str, checkpoint: str) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # The host's network namespace has only its loopback and its link to the volume.
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    Path(out).mkdir(parents=True, exist_ok=True)

    def keep(df: Any, batch_id: int) -> None:
        bodies = [bytes(r.body).decode() for r in df.select("body").collect()]
        tmp = Path(out) / f".batch-{batch_id}.tmp"
        tmp.write_text("".join(b + "\n" for b in bodies))
        tmp.replace(Path(out) / f"batch-{batch_id}.txt")
        say(f"batch {batch_id} {len(bodies)}")

    commands: queue.Queue[str] = queue.Queue()

    def read_commands() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("stop")

    threading.Thread(target=read_commands, daemon=True).start()
    while True:
        query = (
            spark.readStream.format("rocketstore")
            .option("path", store)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .option("mappedFileSizeCommitLog", str(64 * 1024))
            .load()
            .writeStream.foreachBatch(keep)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        try:
            # Polls the query so that a stop can come in between; a failure raises here.
            while not query.awaitTermination(0.2):
                if not commands.empty() and commands.get() == "stop":
                    query.stop()
                    break
            else:
                continue
            break
        except Exception as exc:
            say(f"failed {' '.join(str(exc).split())[:500]}")
            if commands.get() == "stop":
                break
    say("stopped")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
