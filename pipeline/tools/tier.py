"""``rocketstore tier status|upload|clean STORE``: what of a store is where, its upload, and
the bucket's retention.

``status`` reads the store's files (read-only, no lock), its tier record and the bucket's
manifest and listing: what is local, what the bucket holds, what is sealed and not uploaded
yet (segments, bytes, and the upload lag: seconds since the oldest of them was sealed), and
objects under the prefix that the manifest does not name (leftovers of an upload that died,
rewritten by the next), and the tier's ``deleted.below``. Changes nothing, here or in the
bucket.

``upload`` uploads what is sealed (:class:`rocketstore.pipeline.tier.upload.Uploader`), once,
or with ``--follow`` continuously until SIGTERM or Ctrl-C (each ends it once the segments
being sent are named, starting no other, or at once while it waits). An object store that does not answer is waited out under
``--follow`` (each failure one line on stderr) and is an error without it. Each run (each
round of ``--follow``) applies the tier's retention after its uploads.

``clean`` applies the tier's retention once (:mod:`rocketstore.pipeline.tier.retention`):
segments older than ``tieredStoreFileReservedTime`` hours leave the manifest, then the bucket,
with any object a clean that died left below ``deleted.below``; ``--dry-run`` lists them and
changes nothing.

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
    ManifestStore,
    index_key,
    manifest_key,
    read_manifest,
    segment_key,
    tier_prefix,
)
from rocketstore.pipeline.tier.objects import ObjectStore
from rocketstore.pipeline.tier.retention import RetentionReport, TierRetention
from rocketstore.pipeline.tier.upload import Uploader, UploadReport
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
    if args.action == "clean":
        return _clean(args)
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
    tier_end = manifest.end if manifest is not None and manifest.holds_any() else 0
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
            "deletedBelow": manifest.deleted_below if manifest is not None else 0,
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
        f"owner {tier['owner']}, deleted.below {tier['deletedBelow']})\nthis store: {status['storeId']}, uploadedEnd "
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


def tier_clean(
    store: Path, config: StoreConfig, now_ms: int, *, dry_run: bool
) -> RetentionReport | None:
    """The tier's retention applied once (or planned, with ``dry_run``); None when the store
    never uploaded (it has no identity in the bucket, so nothing there is its own)."""
    state = localstate.read(store)
    if state is None:
        return None
    objects = ObjectStore(config)
    retention = TierRetention(
        objects,
        ManifestStore(objects, tier_prefix(store, config), state.store_id),
        config.tiered_store_file_reserved_time,
        lambda: now_ms,
    )
    return retention.plan() if dry_run else retention.apply()


def _clean(args: argparse.Namespace) -> int:
    config = _config(args)
    store = Path(args.store)
    report = tier_clean(store, config, time.time_ns() // 1_000_000, dry_run=args.dry_run)
    hours = config.tiered_store_file_reserved_time
    where = f"s3://{config.object_store_bucket}/{tier_prefix(store, config)}"
    if args.json:
        emit(
            {
                "store": str(store),
                "bucket": where,
                "reservedHours": hours,
                "dryRun": args.dry_run,
                "removed": report.removed if report else [],
                "deletedBelow": report.deleted_below if report else 0,
                "deleted": report.deleted if report else [],
            }
        )
        return 0
    if report is None:
        sys.stdout.write(f"{store}: never uploaded (no {localstate.path_of(store)}): nothing\n")
        return 0
    verb = "would remove" if args.dry_run else "removed"
    keep = f"{hours} hours" if hours else "for ever (tieredStoreFileReservedTime = 0)"
    sys.stdout.write(
        f"{verb} {len(report.removed)} segments from {where} (kept: {keep}); deleted.below "
        f"{report.deleted_below}\n"
    )
    for key in report.deleted:
        sys.stdout.write(f"  {'would delete' if args.dry_run else 'deleted'} {key}\n")
    return 0


def _upload(args: argparse.Namespace) -> int:
    uploader = Uploader(args.store, _config(args))
    stop = threading.Event()
    if not args.follow:
        report = uploader.run_once(stop)
        _say(uploader, report.uploaded, report.bytes)
        _said_removed(uploader, report.removed, report.deleted_below)
        return 0

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        uploader.follow(
            stop,
            interval_s=args.interval,
            on_error=_retrying,
            on_report=lambda r: _said_both(uploader, r),
        )
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    sys.stdout.write(f"stopped; uploadedEnd {uploader.state.uploaded_end}\n")
    return 0


def _said_both(uploader: Uploader, report: UploadReport) -> None:
    if report.uploaded:
        _say(uploader, report.uploaded, report.bytes)
    _said_removed(uploader, report.removed, report.deleted_below)


def _said_removed(uploader: Uploader, removed: list[int], below: int) -> None:
    if removed:
        sys.stdout.write(
            f"retention removed {len(removed)} segments from "
            f"{uploader.objects.target.url(uploader.prefix)}; deleted.below {below}\n"
        )
        sys.stdout.flush()


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
