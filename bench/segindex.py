"""The ``segindex`` part: building the tier's segment index of a full 1 GiB CommitLog segment
(:func:`rocketstore.pipeline.format.segmentindex.build_segment_index`, what an upload does
for every sealed segment), and parsing it back whole.

Input: a store written by ``put_batch`` of 100-byte messages with a key and a tag
(``bench.store.make_table``; the store adds a UNIQ_KEY, so two key entries per record) over 8
queues, enough of them to fill the first 1 GiB segment, which is then sealed (its END_OF_FILE
blank written); mapped read-only. Timed, per run, pinned to one CPU: the build over the
mapping (the record walk with body CRCs, the units sorted by queue, the keys sorted by hash),
then :meth:`SegmentIndex.parse` of the object (its CRC, every order check). Baseline, same
run: ``bytes(mapping)`` of the segment, the floor of touching its bytes at all.

Reported: records/s of the build and the parse (median of ``--runs``), the build's ratio to
the raw copy (raw copy time / build time), the index's size, and the load average.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from bench.common import (
    Options,
    PartResult,
    Row,
    log,
    pinned_to_one_cpu,
    scratch_dir,
    spread,
    timed,
)
from bench.store import make_table
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.format.segmentindex import SegmentIndex, build_segment_index

BODY = 100
SEGMENT = 1 << 30
# A segment of 1 GiB must index in seconds, not minutes: at 1M records/s, 4 s.
TARGET_RECORDS_PER_S = 1_000_000
BATCH = 1_000_000


def _write_store(path: Path, segment: int, seed: int) -> None:
    """Messages until the first segment is sealed (a record went into the second)."""
    store = MessageStore(path, StoreConfig(mapped_file_size_commitlog=segment))
    try:
        first = last = 0
        while last < segment:
            n = min(BATCH, max(segment // 260 // 4, 1000))
            got = store.put_batch(make_table(n, BODY, seed, first_key=first, queues=8))
            first += n
            last = int(got.commit_log_offsets[-1])
    finally:
        store.close()


def run(options: Options) -> PartResult:
    segment = (8 << 20) if options.quick else SEGMENT
    runs: list[dict[str, float]] = []
    load_before = os.getloadavg()
    with scratch_dir(options.work_dir, "segindex-") as path:
        log(f"segindex: writing a sealed {segment >> 20} MiB segment")
        _write_store(path, segment, options.seed)
        # Read through the seam, as the uploader does: the segment mapped read-only.
        seg = LocalSegments(path / "commitlog").open(0, whole=True)
        try:
            index = build_segment_index(seg.buffer, 0, seg.size)  # warm-up: the pages in memory
            parsed = SegmentIndex.parse(index, where="bench")
            records, size, data_end = parsed.records, len(index), parsed.data_end
            del index, parsed
            with pinned_to_one_cpu(options.pin) as cpu:
                log(f"segindex: pinned to CPU {cpu}" if cpu is not None else "segindex: unpinned")
                for i in range(options.runs):
                    build_s, index = timed(lambda: build_segment_index(seg.buffer, 0, seg.size))
                    parse_s, parsed = timed(partial(SegmentIndex.parse, index, where="bench"))
                    if parsed.records != records:
                        raise RuntimeError(f"parsed {parsed.records} records of {records}")
                    del index, parsed
                    raw_s, _ = timed(lambda: bytes(seg.buffer[:data_end]))
                    runs.append({"build_s": build_s, "parse_s": parse_s, "raw_copy_s": raw_s})
                    log(f"segindex: run {i + 1}: build {records / build_s:,.0f} records/s")
        finally:
            seg.close()
    load_after = os.getloadavg()
    build = spread([records / r["build_s"] for r in runs])
    parse = spread([records / r["parse_s"] for r in runs])
    ratio = spread([r["raw_copy_s"] / r["build_s"] for r in runs])
    rows = [
        Row.of(
            f"build the index of a {segment >> 20} MiB segment ({records:,} records)",
            "records/s",
            build,
            baseline="raw copy of the segment",
            ratio=ratio["median"],
            target=f">= {TARGET_RECORDS_PER_S:,} records/s",
            met=build["median"] >= TARGET_RECORDS_PER_S,
        ),
        Row.of("parse it back whole (CRC, order checks)", "records/s", parse),
    ]
    data = {
        "segment_bytes": segment,
        "data_end": data_end,
        "records": records,
        "index_bytes": size,
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "runs": runs,
        "build_records_per_s": build,
        "parse_records_per_s": parse,
        "build_over_raw": ratio,
    }
    notes = [
        f"index {size:,} bytes for {records:,} records ({size / data_end:.1%} of the segment)",
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
        f"({os.cpu_count()} CPUs)",
        "ratio = raw copy time / build time, per run",
    ]
    return PartResult("segindex", rows, data, notes)
