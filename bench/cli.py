"""Command line of ``python -m bench``: pick parts, run them, print tables, write JSON."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import (
    brokers,
    common,
    console,
    core,
    decode,
    firsttouch,
    latency,
    metrics,
    recovery,
    s3clients,
    scale,
    segindex,
    shared,
    soak,
    spark_sink,
    spark_sink_batch,
    spark_source,
    startup,
    store,
    tier,
    tierupload,
)
from bench.common import Options, PartResult

# Part name -> its runner, in the order ``python -m bench`` runs them. Later parts (the Spark
# sink and source) register here.
PARTS: dict[str, Callable[[Options], PartResult]] = {
    "store": store.run,
    "core": core.run,
    "firsttouch": firsttouch.run,
    "recovery": recovery.run,
    "decode": decode.run,
    "segindex": segindex.run,
    "sink": spark_sink.run,
    "sink-batch": spark_sink_batch.run,
    "source": spark_source.run,
    "latency": latency.run,
    "startup": startup.run,
    "shared": shared.run,
    "soak": soak.run,
    "console": console.run,
    "metrics": metrics.run,
    "scale": scale.run,
    "brokers": brokers.run,
    "s3clients": s3clients.run,
    "tier": tier.run,
    "tierupload": tierupload.run,
}
# Parts that run only when named: the first-touch part leaves 4 GiB dirty and syncs the
# machine's page cache between its figures; the soak takes half an hour; the console and the metrics
# write a root of ten million messages (about 3 GB); the scale part builds stores of up to
# 40,000 queues (about 20 minutes); the S3 clients, tier and tier upload parts start a Ceph
# (root, ../shared), and the tier part's upload run alone takes up to 10 minutes.
ON_REQUEST = (
    "firsttouch",
    "soak",
    "console",
    "metrics",
    "scale",
    "s3clients",
    "tier",
    "tierupload",
)


def parse_args(argv: Sequence[str] | None) -> tuple[list[str], Options, bool]:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="rocketstore benchmarks; with no part named, every part but "
        f"{', '.join(ON_REQUEST)} runs.",
    )
    p.add_argument("parts", nargs="*", metavar="PART", help=f"one of: {', '.join(PARTS)}")
    p.add_argument(
        "--runs", type=int, default=Options.runs, help="timed runs per figure (median reported)"
    )
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not figures")
    p.add_argument(
        "--no-pin", dest="pin", action="store_false", help="do not pin the put runs to one CPU"
    )
    p.add_argument("--out", type=Path, default=common.DEFAULT_OUT_DIR, help="JSON directory")
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="scratch directory for stores (default: OUT/tmp; keep it on the disk under test)",
    )
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="how long the soak part runs (default 30; with --quick 2), and the tier part's "
        "upload run (default 10; with --quick 0.5)",
    )
    p.add_argument(
        "--figures",
        default=None,
        help="the tier part's figures to run, comma-separated (default all: "
        f"{','.join(tier.FIGURES)}; keys needs cold and runs it)",
    )
    args = p.parse_args(argv)
    unknown = [name for name in args.parts if name not in PARTS]
    if unknown:
        p.error(f"unknown part {', '.join(unknown)}; known parts: {', '.join(PARTS)}")
    figures = None
    if args.figures is not None:
        figures = tuple(dict.fromkeys(f.strip() for f in args.figures.split(",") if f.strip()))
        bad = [f for f in figures if f not in tier.FIGURES]
        if bad or not figures:
            p.error(
                f"--figures: unknown {', '.join(bad) or '(none)'}; known: {', '.join(tier.FIGURES)}"
            )
        if "keys" in figures and "cold" not in figures:
            figures = ("cold", *figures)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    if args.minutes is not None and args.minutes <= 0:
        p.error("--minutes must be > 0")
    work_dir = args.work_dir if args.work_dir is not None else args.out / "tmp"
    options = Options(
        runs=args.runs,
        quick=args.quick,
        pin=args.pin,
        out_dir=args.out.resolve(),
        work_dir=work_dir.resolve(),
        minutes=args.minutes,
        figures=figures,
    )
    named = list(dict.fromkeys(args.parts))
    return named or [name for name in PARTS if name not in ON_REQUEST], options, args.check


def run_part(name: str, options: Options, machine: dict[str, object]) -> tuple[PartResult, Path]:
    """Run one part, print its table and write its JSON file."""
    started = common.utc_now()
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    result = PARTS[name](options)
    elapsed = time.perf_counter() - t0
    load_end = os.getloadavg()
    payload = {
        "part": name,
        "started_utc": started,
        "duration_s": round(elapsed, 1),
        "machine": machine,
        # The machine's load average (1, 5 and 15 minutes) as the part started and ended: on a
        # shared machine, what the wall-clock figures must be read beside (bench/charts.py
        # prints it under every chart).
        "part_load_avg": {"start": load_start, "end": load_end},
        "options": {
            "runs": options.runs,
            "quick": options.quick,
            "pin": options.pin,
            "work_dir": str(options.work_dir),
            "seed": options.seed,
        },
        "targets_met": result.targets_met,
        **result.data,
    }
    path = common.write_json(options.out_dir, result, payload)
    print(f"\n== {name} ({elapsed:.0f} s{', quick' if options.quick else ''})")
    print(common.format_table(result, options.runs))
    print(f"  JSON: {path}")
    return result, path


def main(argv: Sequence[str] | None = None) -> int:
    parts, options, check = parse_args(argv)
    machine = common.machine_info()
    print(common.machine_line(machine))
    ok = True
    for name in parts:
        result, _ = run_part(name, options, machine)
        ok = ok and result.targets_met
    return 1 if check and not ok else 0
