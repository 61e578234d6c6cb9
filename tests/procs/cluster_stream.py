"""A Spark application for the cluster test: the ingest job's streaming sink and the export
job's streaming source, started by those jobs' own ``start`` functions in one application and
running at the same time over one store root, until the export has read every row.

usage: spark-submit tests/procs/cluster_stream.py STORE CONFIG STAGED SHARED ROWS SUMMARY

The row files in STAGED are fed one at a time into the folder the sink reads (STAGED-feed):
the next only once the source has read every row fed so far, so the source reads the store
between the sink's appends, never only after them. The source starts once the sink's first
micro-batch has created the topic. Checkpoints and the parquet output go under SHARED; ROWS is
how many rows the files hold. SUMMARY gets a JSON object: the rows the sink appended and found
already stored, the files fed, and the rows the export read. Exit status 1 if a query failed
or the export did not read ROWS rows within the deadline.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout

from pyspark.sql import SparkSession

from rocketstore.datasource import register
from rocketstore.jobs import common, export, ingest

DEADLINE_S = 240.0


def main(argv: list[str]) -> int:
    store, config, staged, shared, rows, summary = argv
    total = int(rows)
    files = sorted(Path(staged).glob("*.json"))
    feed = Path(f"{staged}-feed")
    feed.mkdir()
    lines = [sum(1 for _ in f.open()) for f in files]

    def feed_next(fed: int) -> int:
        # A rename: the file source never sees a file half written.
        os.rename(files[fed], feed / files[fed].name)
        return fed + 1

    spark = SparkSession.builder.appName("cluster-stream").getOrCreate()
    register(spark)  # as the jobs' own session does
    base = ["--store", store, "--store-config", config, "--topic", "live"]
    sink_args = ingest.build_parser().parse_args(
        [
            *base,
            "--checkpoint", f"{shared}/ck-stream-ingest",
            "--input", str(feed),
            "--schema", "id BIGINT, customer STRING, note STRING",
            "--key-column", "customer",
            "--brokers", "2",
            "--queues", "2",
            "--max-files-per-trigger", "1",
            "--trigger", "1 second",
        ]
    )  # fmt: skip
    source_args = export.build_parser().parse_args(
        [
            *base,
            "--checkpoint", f"{shared}/ck-stream-export",
            "--output", f"{shared}/out-stream",
            "--format", "parquet",
            "--trigger", "1 second",
        ]
    )  # fmt: skip
    fed = feed_next(0)
    deadline = time.monotonic() + DEADLINE_S
    sinking, gate = ingest.start(spark, sink_args)
    # The source needs the topic to exist: it starts once the sink's first batch created it.
    while not gate.history and sinking.exception() is None and time.monotonic() < deadline:
        sinking.awaitTermination(0.2)  # type: ignore[arg-type]
    sourcing = export.start(spark, source_args)
    exported: dict[int, int] = {}
    failed = None
    while time.monotonic() < deadline:
        for q in (sinking, sourcing):
            if q.exception() is not None:
                failed = f"{q.name}: {q.exception()}"
        if failed:
            break
        for p in sourcing.recentProgress:
            exported.setdefault(p.batchId, int(p.numInputRows))
        read = sum(exported.values())
        if read >= total:
            break
        if fed < len(files) and read >= sum(lines[:fed]):
            fed = feed_next(fed)
        # Both queries run on their own threads; this only bounds how often it looks.
        sourcing.awaitTermination(0.5)  # type: ignore[arg-type]
    common.stop_between_batches(sinking, patience=60.0, gate=gate)
    common.stop_between_batches(sourcing, patience=60.0)
    result = {
        "appended": sum(b.appended for b in gate.history),
        "skipped": sum(b.skipped for b in gate.history),
        "exported": sum(exported.values()),
        "fed": fed,
        "failed": failed,
    }
    Path(summary).write_text(json.dumps(result))
    spark.stop()
    return 0 if failed is None and result["exported"] == total else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
