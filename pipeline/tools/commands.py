"""The ``rocketstore`` commands that read or maintain a store directory (``produce`` is in
:mod:`rocketstore.pipeline.tools.produce`, ``lag`` in :mod:`rocketstore.pipeline.tools.lag`).

Each ``cmd_*`` takes the parsed arguments and returns the exit status; errors are raised
(:class:`~rocketstore.pipeline.errors.StoreError` and its kinds) and reported by :mod:`rocketstore.pipeline.cli`.
Reading commands open the store read-only: no lock, nothing written. With the tier on in the
store's settings, the reading commands read what local retention deleted from the bucket
(:mod:`rocketstore.pipeline.tools.bothtiers`), and ``verify`` checks the bucket's objects too
(:mod:`rocketstore.pipeline.tools.verify.tier`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rocketstore.pipeline.config import SECRET_SETTINGS, StoreConfig
from rocketstore.pipeline.engine import queueread, storehost
from rocketstore.pipeline.engine.reads import MAX_TIMESTAMP
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import (
    ConfigError,
    NotFoundError,
    OffsetOutOfRangeError,
    ProgressNotRecordedError,
)
from rocketstore.pipeline.files import topicconfig
from rocketstore.pipeline.format import native, record
from rocketstore.pipeline.format.record import MessageExt
from rocketstore.pipeline.tools.bothtiers import BothTiers, QueueSpan
from rocketstore.pipeline.tools.output import emit, plain_cell, preview, print_table

DUMP_PAGE = 1000
MESSAGE_COLUMNS = (
    "topic",
    "queueId",
    "queueOffset",
    "commitLogOffset",
    "storeTimestamp",
    "tags",
    "keys",
    "msgId",
    "body",
)


def _message_row(m: MessageExt) -> list[object]:
    return [
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.commit_log_offset,
        m.store_timestamp,
        m.tags,
        " ".join(m.keys),
        m.msg_id,
        preview(m.body),
    ]


def _print_messages(messages: Sequence[MessageExt], as_json: bool) -> None:
    if as_json:
        for m in messages:
            emit(m.to_json())
    elif messages:
        print_table(MESSAGE_COLUMNS, [_message_row(m) for m in messages])


def _print_message_detail(m: MessageExt, as_json: bool) -> None:
    """One message: every field, one per line (or one JSON line)."""
    if as_json:
        emit(m.to_json())
        return
    fields = m.to_json()
    fields["body"] = f"{preview(m.body, 200)} ({len(m.body)} bytes)"
    props = fields.pop("properties")
    rows: list[list[object]] = [[name, value] for name, value in fields.items()]
    rows.append(["properties", ""])
    rows.extend([f"  {name}", value] for name, value in props.items())
    print_table(("field", "value"), rows)


def _note(text: str) -> None:
    sys.stderr.write(f"rocketstore: note: {text}\n")


def _open(args: argparse.Namespace) -> MessageStore:
    return MessageStore(args.store, StoreConfig.effective(args.config), read_only=True)


def _check_queue(store: MessageStore, topic: str, queue_id: int) -> None:
    """Raise :class:`NotFoundError` unless the store has queue ``queue_id`` of ``topic``."""
    queues = [q for _, q in store.queue_ids(topic)]
    if not queues:
        raise NotFoundError(f"{store.path}: no topic {topic!r} in this store")
    if queue_id not in queues:
        raise NotFoundError(
            f"{store.path}: topic {topic!r} has no queue {queue_id} "
            f"(its queues: {', '.join(map(str, queues))})"
        )


def _check_record_start(store: MessageStore, offset: int, low: int | None = None) -> None:
    """Raise :class:`NotFoundError` unless a record starts at CommitLog offset ``offset``;
    ``low``: where the log starts (default: the local files' start)."""
    low = store.min_phy_offset if low is None else low
    high = store.max_phy_offset
    if not low <= offset < high:
        raise NotFoundError(
            f"{store.path}: CommitLog offset {offset} is outside the log, which holds "
            f"[{low}, {high})"
        )
    if not store.commitlog.starts_record(offset):
        raise NotFoundError(
            f"{store.path}: no record starts at CommitLog offset {offset} (it lies inside "
            "another record, or past the end of a segment); records start where `dump` or "
            "`queues` show their commitLogOffset"
        )


def _open_both(args: argparse.Namespace) -> BothTiers:
    """The store read-only and, with the tier on in its settings, its tier (docs/cli.md)."""
    return BothTiers.open(args.store, StoreConfig.effective(args.config))


def cmd_dump(args: argparse.Namespace) -> int:
    if args.order == "log":
        return _dump_log_order(args)
    with _open_both(args) as both:
        store = both.store
        spans = both.spans(args.topic)
        if args.topic is not None and not spans:
            _note(f"no queue of topic {args.topic!r} in {args.store}")
        for span in spans:
            _note_gap(args.store, span)
            # The offsets only the tier holds first, then the local files from their start.
            for m in both.queue_messages(span):
                emit(m.to_json())
            if span.local is None:
                continue
            topic, queue_id = span.info.topic, span.info.queue_id
            for batch in queueread.queue_batches(store, topic, queue_id, page=DUMP_PAGE):
                for m in native.messages(batch):
                    emit(m.to_json())
    return 0


def _dump_log_order(args: argparse.Namespace) -> int:
    with _open_both(args) as both:
        if args.topic is not None and not both.spans(args.topic):
            _note(f"no queue of topic {args.topic!r} in {args.store}")
        gap = both.log_gap()
        if gap is not None:
            _note(
                f"{args.store}: CommitLog offsets [{gap[0]}, {gap[1]}) are in neither the tier "
                "nor the local files (local retention deleted them before they were uploaded)"
            )
        for m in both.log_messages(args.topic):
            emit(m.to_json())
    return 0


def _note_gap(store: str, span: QueueSpan) -> None:
    if span.gap is not None:
        _note(
            f"{store}: {span.info.topic}/{span.info.queue_id} offsets [{span.gap[0]}, "
            f"{span.gap[1]}) are in neither the tier nor the local files (local retention "
            "deleted them before they were uploaded)"
        )


def cmd_queues(args: argparse.Namespace) -> int:
    with _open_both(args) as both:
        spans = both.spans(args.topic)
        tiered = both.tier is not None
    if args.topic is not None and not spans:
        _note(f"no queue of topic {args.topic!r} in {args.store}")
    header: tuple[str, ...] = ("topic", "queueId", "minOffset", "maxOffset", "maxPhysicOffset")
    rows = []
    for span in spans:
        i = span.info
        _note_gap(args.store, span)
        rows.append([i.topic, i.queue_id, i.min_offset, i.max_offset, i.max_physic_offset])
    if args.json:
        for row, span in zip(rows, spans, strict=True):
            fields = dict(zip(header, row, strict=True))
            if tiered:
                fields.update(_where_fields(span))
            emit(fields)
    elif rows:
        if tiered:
            # Where each range lives: the bucket's segments, the local files, or both.
            header += ("inTier", "local")
            for row, span in zip(rows, spans, strict=True):
                row += [_range_text(span.tier), _range_text(span.local)]
        print_table(header, rows)
    return 0


def _where_fields(span: QueueSpan) -> dict[str, object]:
    """``queues --json``'s fields with the tier on: each tier's ``[min, max)`` of the queue
    (null where it holds none)."""
    tier, local = span.tier, span.local
    return {
        "tierMinOffset": tier[0] if tier else None,
        "tierMaxOffset": tier[1] if tier else None,
        "localMinOffset": local[0] if local else None,
        "localMaxOffset": local[1] if local else None,
    }


def _range_text(span: tuple[int, int] | None) -> str:
    return "-" if span is None or span[0] >= span[1] else f"[{span[0]}, {span[1]})"


def cmd_topics(args: argparse.Namespace) -> int:
    """The topic table a broker would load (config/topics.json, else its .bak) beside the
    queues on disk; a note for each topic on disk that a broker would not serve in full."""
    with _open(args) as store:
        disk = topicconfig.queue_counts(store.queue_ids(args.topic))
        found = topicconfig.read_topics(store.path / "config")
    config_file = store.path / "config" / topicconfig.FILE_NAME
    if found is None:
        configured: dict[str, topicconfig.TopicConfig] = {}
        if disk:
            _note(
                f"no {config_file} (or it is empty): a stock broker with "
                "autoCreateTopicEnable=false serves none of this store's topics"
            )
    else:
        configured = found.topics
        if found.path.name != topicconfig.FILE_NAME:
            _note(f"{config_file} is missing or empty; shown: {found.path}, as a broker loads it")
    if args.topic is not None:
        configured = {k: v for k, v in configured.items() if k == args.topic}
        if not configured and not disk:
            _note(f"no topic {args.topic!r} in {config_file} nor on disk in {args.store}")
    header = ("topic", "readQueueNums", "writeQueueNums", "perm", "order", "diskQueues")
    rows: list[list[object]] = []
    for name in sorted(set(configured) | set(disk)):
        tc, on_disk = configured.get(name), disk.get(name)
        if tc is None:
            # Without any topics.json, the note above has said it for every topic.
            if found is not None:
                _note(f"topic {name!r} is on disk but not in {config_file}: a broker ignores it")
        elif on_disk is not None and on_disk > tc.read_queue_nums:
            _note(
                f"topic {name!r} has queues 0..{on_disk - 1} on disk but readQueueNums "
                f"{tc.read_queue_nums}: a broker serves queues 0..{tc.read_queue_nums - 1} only"
            )
        if args.json:
            fields = (tc or topicconfig.TopicConfig(name)).to_json()
            del fields["topicName"]
            if tc is None:  # the same keys for every topic: null where topics.json has none
                fields = dict.fromkeys(fields)
            emit({"topic": name, **fields, "diskQueues": on_disk})
        elif tc is None:
            rows.append([name, None, None, None, None, on_disk])
        else:
            rows.append(
                [name, tc.read_queue_nums, tc.write_queue_nums, tc.perm_text, tc.order, on_disk]
            )
    if rows:
        print_table(header, rows)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    with _open_both(args) as both:
        r = both.get_messages(args.topic, args.queue, args.offset, args.max, args.tags)
    summary = {
        "status": r.status,
        "nextBeginOffset": r.next_begin_offset,
        "minOffset": r.min_offset,
        "maxOffset": r.max_offset,
    }
    if args.json:
        emit({**summary, "messages": [m.to_json() for m in r.messages]})
    else:
        sys.stdout.write("   ".join(f"{k}: {v}" for k, v in summary.items()) + "\n")
        _print_messages(r.messages, False)
    return 0


def cmd_query_key(args: argparse.Namespace) -> int:
    with _open_both(args) as both:
        found = both.query_by_key(
            args.topic,
            args.key,
            begin=args.begin,
            end=MAX_TIMESTAMP if args.end is None else args.end,
            max_count=args.max,
        )
    _print_messages(found, args.json)
    return 0


def cmd_query_time(args: argparse.Namespace) -> int:
    with _open_both(args) as both:
        if both.span(args.topic, args.queue) is None:
            _check_queue(both.store, args.topic, args.queue)  # says which queues there are
        offset = both.offset_by_time(args.topic, args.queue, args.timestamp)
    header = ("topic", "queueId", "timestamp", "offset")
    row = [args.topic, args.queue, args.timestamp, offset]
    if args.json:
        emit(dict(zip(header, row, strict=True)))
    else:
        print_table(header, [row])
    return 0


def _message_at(both: BothTiers, offset: int) -> MessageExt:
    """The message at CommitLog offset ``offset``: from the tier below the local files."""
    m = both.tier_message_at(offset)
    if m is None:
        _check_record_start(both.store, offset, both.log_start())
        m = both.store.get_message(offset)
    return m


def cmd_query_offset(args: argparse.Namespace) -> int:
    with _open_both(args) as both:
        m = _message_at(both, args.offset)
    _print_message_detail(m, args.json)
    return 0


def cmd_query_msgid(args: argparse.Namespace) -> int:
    _, offset = record.parse_msg_id(args.msgid)
    with _open_both(args) as both:
        m = _message_at(both, offset)
    if m.msg_id != args.msgid.strip().upper():
        # As MessageStore.get_by_msg_id: the host part must be the record's.
        raise OffsetOutOfRangeError(
            f"msgId {args.msgid}: the message at offset {offset} has id {m.msg_id}"
        )
    _print_message_detail(m, args.json)
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    """Open the store for writing (which runs recovery), print the report, close it cleanly.

    Exit status 1 when the repair is done and flushed but the close could not record it (a
    full disk): the store stays marked as not closed cleanly, and the next open repeats the
    same recovery, which changes nothing more."""
    store = MessageStore(
        args.store,
        StoreConfig.effective(args.config),
        create=False,
        full_check=True,
        cut_at_damage=args.cut_at_damage,
    )
    unrecorded: ProgressNotRecordedError | None = None
    try:
        report = store.recovery.to_json()
    finally:
        try:
            store.close()
        except ProgressNotRecordedError as exc:
            unrecorded = exc
    if args.json:
        emit(report)
    else:
        print_table(("field", "value"), [[k, v] for k, v in report.items()])
    if unrecorded is not None:
        sys.stderr.write(f"rocketstore: warning: recovered, but {unrecorded}\n")
        return 1
    return 0


def _verify_metrics_file(value: str) -> Path:
    """``verify --metrics FILE``, checked before the scan: the extra it needs, its directory."""
    from rocketstore.pipeline.extras import check_dependencies

    check_dependencies(
        ("prometheus_client",),
        "verify --metrics needs the 'console' extra: pip install 'rocketstore[console]'",
    )
    path = Path(value)
    if not path.parent.is_dir():
        raise ConfigError(f"option --metrics={value}: no such directory {path.parent}")
    return path


def cmd_verify(args: argparse.Namespace) -> int:
    """Scan every record and index structure; print each problem; exit 1 if there is any."""
    from rocketstore.pipeline.tools.verify.check import verify_read_only

    metrics = _verify_metrics_file(args.metrics) if args.metrics else None

    def progress(done: int, total: int) -> None:
        if args.progress and total:
            sys.stderr.write(f"\rverifying: {100 * done // total:3d} %")
            sys.stderr.flush()

    config = StoreConfig.effective(args.config)
    if args.tier and not config.tier_on:
        raise ConfigError(
            "option --tier: the tier is off in the store's settings (tieredStorageLevel "
            f"{config.tiered_storage_level}); there is no bucket to check"
        )
    report = verify_read_only(
        args.store,
        config,
        progress=progress,
        max_per_kind=None if args.all else 100,
    )
    if args.progress:
        sys.stderr.write("\n")
    if config.tier_on and args.tier is not False:
        from rocketstore.pipeline.tools.verify.tier import verify_tier

        def tier_progress(done: int, total: int) -> None:
            if args.progress:
                sys.stderr.write(f"\rverifying the tier: {done}/{total} segments")
                sys.stderr.flush()

        report.tier = verify_tier(args.store, config, report, progress=tier_progress).to_json()
        if args.progress:
            sys.stderr.write("\n")
    if metrics is not None:
        from rocketstore.pipeline.tools.metrics import write_verify_textfile

        broker = Path(args.store).resolve().name  # as the exporter names a store directory
        write_verify_textfile(metrics, broker, len(report.problems) + report.suppressed)
    if args.json:
        emit(report.to_json())
    else:
        if report.problems:
            print_table(
                ("kind", "file", "offset", "detail"),
                [[p.kind, p.path, p.offset, p.detail] for p in report.problems],
            )
        state = "ok" if report.ok else f"{len(report.problems) + report.suppressed} problem(s)"
        again = (
            f" (started over {report.restarts} time(s): retention deleted files under the scan)"
            if report.restarts
            else ""
        )
        print(
            f"{state}: {report.records} records, {report.units} units, "
            f"{report.index_entries} index entries checked in {report.seconds:.2f}s{again}"
        )
        if report.tier is not None:
            t = report.tier
            print(
                f"tier {t['bucket']}: {t['segments']} segments ({t['bytes']} bytes, "
                f"{t['records']} records) and {t['indexObjects']} index objects checked"
            )
    return 0 if report.ok else 1


def cmd_clean(args: argparse.Namespace) -> int:
    """Delete what retention allows now (or, with --dry-run, show it) and print the report.

    A store that was not closed cleanly is cleaned without being opened for writing (which
    would recover it first, and recovering can need the very space the clean frees): see
    :mod:`rocketstore.pipeline.engine.unclean`."""
    from rocketstore.pipeline.engine import unclean
    from rocketstore.pipeline.engine.retention.report import CleanPlan
    from rocketstore.pipeline.engine.retention.service import RetentionService

    config = StoreConfig.effective(args.config)
    report: CleanPlan
    path = Path(args.store)
    if not args.dry_run and path.is_dir() and not unclean.was_closed_cleanly(path):
        report = unclean.clean_unrecovered(path, config, max_files=args.max_files)
        _note(
            f"{args.store} was not closed cleanly: cleaned without recovering it; "
            "`rocketstore recover` recovers it next"
        )
    else:
        with MessageStore(args.store, config, read_only=args.dry_run, create=False) as store:
            if args.dry_run:
                report = RetentionService(store).plan(force_expired=True, max_files=args.max_files)
            else:
                # Checks first that this writer still owns the store (rocketstore.pipeline.engine.fencing).
                report = store.clean(force_expired=True, max_files=args.max_files)
    if args.json:
        emit(report.to_json())
        return 0
    if report.files:
        print_table(
            ("file", "kind", "bytes", "reason"),
            [[str(f.path), f.kind, f.bytes, f.reason] for f in report.files],
        )
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"{verb} {len(report.files)} file(s), {report.bytes} bytes; "
        f"disk {report.disk_used_ratio:.1%} used"
    )
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """The effective settings, and where they came from."""
    config = StoreConfig.effective(args.config)
    settings = config.to_rocketmq()
    for name in SECRET_SETTINGS & settings.keys():
        if settings[name] is not None:
            settings[name] = "***"  # a secret is never printed, only whether it is set
    if args.json:
        emit(
            {
                "settings": settings,
                "source": config.origin,
                "ignoredKeys": list(config.ignored_keys),
            }
        )
        return 0
    print_table(
        ("setting", "value"),
        [
            [k, "(unset)" if v is None else '""' if v == "" else plain_cell(v)]
            for k, v in settings.items()
        ],
    )
    sys.stdout.write(f"from: {config.origin}\n")
    if config.broker_ip1 is None or config.listen_port is None:
        # What unset means depends on the directory (rocketstore.pipeline.engine.storehost): say it here.
        sys.stdout.write(
            "store host (brokerIP1:listenPort) where unset: the one the directory's newest "
            f"record carries; in a new directory {storehost.store_host(config)} (a store root's broker-N: "
            "the port + 10 N)\n"
        )
    if config.ignored_keys:
        sys.stdout.write(f"ignored (not store settings): {', '.join(config.ignored_keys)}\n")
    return 0
