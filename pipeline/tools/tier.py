"""``rocketstore tier status|upload STORE``: what of a store is where, and its upload.

``status`` reads the store's files (read-only, no lock), its tier record and the bucket's
manifest and listing: what is local, what the bucket holds, what is sealed and not uploaded
yet (segments, bytes, and the upload lag: seconds since the oldest of them was sealed), and
objects under the prefix that the manifest does not name (leftovers of an upload that died,
rewritten by the next). Changes nothing, here or in the bucket.

``upload`` uploads what is sealed (:class:`rocketstore.pipeline.tier.upload.Uploader`), once,
or with ``--follow`` continuously until SIGTERM or Ctrl-C (each ends it between two segments,
or at once while it waits). An object store that does not answer is waited out under
``--follow`` (each failure one line on stderr) and is an error without it.

Owns: nothing (the uploader owns what it writes). Thread-safety: a command runs on one
thread. Crash behaviour: as the uploader's: killed at any point, the next run completes.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import TierError
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.backlog import backlog
from rocketstore.pipeline.tier.manifest import (
    index_key,
    manifest_key,
    read_manifest,
    segment_key,
    tier_prefix,
)
from rocketstore.pipeline.tier.objects import ObjectStore
from rocketstore.pipeline.tier.upload import Uploader
from rocketstore.pipeline.tools.output import emit, print_table


def _config(args: argparse.Namespace) -> StoreConfig:
    config = StoreConfig.effective(args.config)
    if not config.tier_on:
        raise TierError(
            f"{args.store}: tieredStorageLevel={config.tiered_storage_level} in "
            f'{config.origin}: the tier is off; set tieredStorageLevel = "NOT_IN_DISK" and '
            "objectStoreBucket"
        )
    return config


def cmd_tier(args: argparse.Namespace) -> int:
    if args.action == "status":
        return _status(args)
    return _upload(args)


def tier_status(store: Path, config: StoreConfig, now_ms: int) -> dict[str, Any]:
    """The figures ``tier status`` prints (see the module docstring), as one JSON object."""
    objects = ObjectStore(config)
    prefix = tier_prefix(store, config)
    key = manifest_key(prefix)
    loaded = read_manifest(objects, prefix)
    manifest = loaded[0] if loaded is not None else None
    state = localstate.read(store)
    named = {
        k
        for s in (manifest.segments if manifest else ())
        for k in (segment_key(prefix, s.base), index_key(prefix, s.base))
    }
    listed = objects.list(prefix)
    leftovers = [k for k, _ in listed if k not in named and k != key]
    tier_end = manifest.end if manifest is not None and manifest.segments else 0
    local = backlog(store, config, tier_end, now_ms)
    return {
        "store": str(store),
        "bucket": objects.bucket,
        "prefix": prefix,
        "storeId": state.store_id if state is not None else None,
        "uploadedEnd": state.uploaded_end if state is not None else 0,
        "local": {
            "segments": len(local.local),
            "bytes": local.local_bytes,
            "first": local.local[0] if local.local else None,
            "sealed": len(local.sealed),
        },
        "tier": {
            "owner": manifest.store_id if manifest is not None else None,
            "generation": manifest.generation if manifest is not None else 0,
            "segments": len(manifest.segments) if manifest is not None else 0,
            "bytes": sum(s.length + s.index.length for s in manifest.segments) if manifest else 0,
            "start": manifest.start if manifest is not None else None,
            "end": manifest.end if manifest is not None else None,
            "leftovers": leftovers,
        },
        "pending": {
            "segments": len(local.pending),
            "bytes": local.pending_bytes,
            "lagSeconds": round(local.lag_s, 3),
        },
    }


def _status(args: argparse.Namespace) -> int:
    status = tier_status(Path(args.store), _config(args), time.time_ns() // 1_000_000)
    if args.json:
        emit(status)
        return 0
    tier, local, pending = status["tier"], status["local"], status["pending"]
    print_table(
        ("where", "segments", "bytes", "from", "to"),
        [
            ["local", local["segments"], local["bytes"], local["first"], ""],
            ["bucket", tier["segments"], tier["bytes"], tier["start"], tier["end"]],
            ["pending", pending["segments"], pending["bytes"], "", ""],
        ],
    )
    sys.stdout.write(
        f"bucket: s3://{status['bucket']}/{status['prefix']} (generation {tier['generation']}, "
        f"owner {tier['owner']})\nthis store: {status['storeId']}, uploadedEnd "
        f"{status['uploadedEnd']}\nupload lag: {pending['lagSeconds']} s\n"
    )
    if tier["owner"] is not None and tier["owner"] != status["storeId"]:
        sys.stdout.write("the prefix belongs to another store: uploads are refused\n")
    if tier["leftovers"]:
        sys.stdout.write(
            f"leftovers (not in the manifest, rewritten by the next upload): "
            f"{', '.join(tier['leftovers'])}\n"
        )
    return 0


def _upload(args: argparse.Namespace) -> int:
    uploader = Uploader(args.store, _config(args))
    stop = threading.Event()
    if not args.follow:
        report = uploader.run_once(stop)
        _say(uploader, report.uploaded, report.bytes)
        return 0

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        uploader.follow(
            stop,
            interval_s=args.interval,
            on_error=_retrying,
            on_report=lambda r: _say(uploader, r.uploaded, r.bytes) if r.uploaded else None,
        )
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    sys.stdout.write(f"stopped; uploadedEnd {uploader.state.uploaded_end}\n")
    return 0


def _retrying(exc: TierError) -> None:
    sys.stderr.write(f"rocketstore: tier upload: {exc} (retrying)\n")
    sys.stderr.flush()


def _say(uploader: Uploader, bases: list[int], sent: int) -> None:
    sys.stdout.write(
        f"uploaded {len(bases)} segments ({sent} bytes) to "
        f"{uploader.objects.target.url(uploader.prefix)}; uploadedEnd "
        f"{uploader.state.uploaded_end}\n"
    )
    sys.stdout.flush()
