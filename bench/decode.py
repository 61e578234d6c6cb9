"""The ``decode`` part: the native record decoder turning CommitLog records into the source's
Arrow columns, beside two same-run baselines that produce the same columns or bytes without
decoding anything.

Input: one store written by ``put_batch`` of 1M messages x 100-byte body with a key and a tag
(``bench.store.make_table``; the store adds a UNIQ_KEY), in one 1 GiB segment, mapped
read-only. Timed, per run, with every thread pinned to one CPU:

* **decode**: :func:`rocketstore.pipeline.format.native.decode` of every record, in CommitLog order, in calls of
  ``rocketstore.source.read.CHUNK_UNITS`` records (the source's chunk), asking for the column groups of the
  source's default schema, CRC checked; the batches are what the source builds its output
  from.
* **raw copy** (the baseline): ``bytes(mapping[a:b])`` of the same records' bytes, the floor
  of touching them at all; its speed says how busy the machine's memory was in that run.
* **IPC read** (for reference): the very same columns read back from an in-memory Arrow IPC
  stream (``pa.ipc.open_stream(...).read_all()``). Zero-copy, so it measures Arrow's fixed
  costs, not a decoder: it is no floor a decoder could approach.

Reported: msgs/s of each (median of ``--runs``), the decode's ratio to the raw copy of the
same run (raw copy time / decode time), and the machine's load average before and after.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa

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
from rocketstore.pipeline.format import native
from rocketstore.source import schema as source_schema
from rocketstore.source.read import CHUNK_UNITS, ReadContext

TARGET_MSGS_PER_S = 3_000_000
BODY = 100


def _source_columns() -> native.Columns:
    """The column groups the source asks for with its default (binary body) schema."""
    ctx = ReadContext(schema=source_schema.arrow_schema(None), root="")
    return ctx.columns


def _write_store(path: Path, n: int, seed: int) -> None:
    store = MessageStore(path, StoreConfig())
    try:
        store.put_batch(make_table(n, BODY, seed))
    finally:
        store.close()


def _decode_all(
    mm: mmap.mmap,
    rel: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    seg: str,
    cols: native.Columns,
) -> list[pa.RecordBatch]:
    return [
        native.decode(
            mm,
            rel[a : a + CHUNK_UNITS],
            0,
            path=seg,
            sizes=sizes[a : a + CHUNK_UNITS],
            columns=cols,
        )
        for a in range(0, len(rel), CHUNK_UNITS)
    ]


def run(options: Options) -> PartResult:
    n = 50_000 if options.quick else 1_000_000
    cols = _source_columns()
    load_before = os.getloadavg()
    runs: list[dict[str, float]] = []
    with scratch_dir(options.work_dir, "decode-") as path:
        log(f"decode: writing {n:,} messages")
        _write_store(path, n, options.seed)
        seg = path / "commitlog" / "00000000000000000000"
        with open(seg, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            walked = native.walk(mm, 0, len(mm), 0, check_crc=False)
            if len(walked) != n:
                raise RuntimeError(f"walked {len(walked)} records, wrote {n}")
            rel, sizes = walked.phys, walked.sizes
            end = int(rel[-1] + sizes[-1])
            batches = _decode_all(mm, rel, sizes, str(seg), cols)  # warm-up, and the IPC input
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batches[0].schema) as writer:
                for b in batches:
                    writer.write_batch(b)
            ipc = sink.getvalue()
            del batches
            with pinned_to_one_cpu(options.pin) as cpu:
                log(f"decode: pinned to CPU {cpu}" if cpu is not None else "decode: not pinned")
                for i in range(options.runs):
                    dec_s, got = timed(lambda: _decode_all(mm, rel, sizes, str(seg), cols))
                    rows = sum(b.num_rows for b in got)
                    del got
                    ipc_s, table = timed(lambda: pa.ipc.open_stream(ipc).read_all())
                    del table
                    raw_s, _ = timed(lambda: bytes(mm[0:end]))
                    if rows != n:
                        raise RuntimeError(f"decoded {rows} records of {n}")
                    runs.append(
                        {
                            "decode_s": dec_s,
                            "ipc_read_s": ipc_s,
                            "raw_copy_s": raw_s,
                            "decode_msgs_per_s": n / dec_s,
                            "ipc_msgs_per_s": n / ipc_s,
                            "raw_msgs_per_s": n / raw_s,
                            "decode_over_raw": raw_s / dec_s,
                        }
                    )
                    log(f"decode: run {i + 1}: {n / dec_s:,.0f} msgs/s")
        finally:
            mm.close()
    load_after = os.getloadavg()
    dec = spread([r["decode_msgs_per_s"] for r in runs])
    ipc_rate = spread([r["ipc_msgs_per_s"] for r in runs])
    raw = spread([r["raw_msgs_per_s"] for r in runs])
    ratio = spread([r["decode_over_raw"] for r in runs])
    label = f"decode {n:,} x {BODY} B into the source's columns"
    rows_out = [
        Row(
            label,
            "msgs/s",
            dec["median"],
            dec["min"],
            dec["max"],
            baseline=f"raw copy {raw['median']:,.0f} msgs/s",
            ratio=ratio["median"],
            target=f">= {TARGET_MSGS_PER_S:,} msgs/s",
            met=dec["median"] >= TARGET_MSGS_PER_S,
        ),
        Row(
            "IPC read of the same columns",
            "msgs/s",
            ipc_rate["median"],
            ipc_rate["min"],
            ipc_rate["max"],
        ),
        Row("raw copy of the same records' bytes", "msgs/s", raw["median"], raw["min"], raw["max"]),
    ]
    data = {
        "messages": n,
        "body_bytes": BODY,
        "record_bytes": end,
        "columns": str(cols),
        "chunk": CHUNK_UNITS,
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "runs": runs,
        "decode_msgs_per_s": dec,
        "ipc_msgs_per_s": ipc_rate,
        "raw_msgs_per_s": raw,
        "decode_over_raw": ratio,
    }
    notes = [
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
        f"({os.cpu_count()} CPUs)",
        "ratio = raw copy time / decode time, per run (1 would be decoding at memcpy speed)",
    ]
    return PartResult("decode", rows_out, data, notes)
