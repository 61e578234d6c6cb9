"""``rocketstore``: read and feed a RocketMQ-format store directory from the shell.

Commands (``rocketstore COMMAND --help`` for each)::

    dump STORE [--topic T]                      every message, one JSON object per line
    queues STORE [--topic T]                    ConsumeQueue bounds per topic and queue
    topics STORE [--topic T]                    the topics a stock broker serves, queue counts
    get STORE --topic T --queue Q --offset N    messages of one queue (tag filter: --tags)
    query-key STORE --topic T --key K           messages by KEYS token or UNIQ_KEY
    query-time STORE --topic T --queue Q --timestamp MS
    query-offset STORE OFFSET                   the message at a CommitLog offset
    query-msgid STORE MSGID                     the message an offset msgId names
    produce STORE [FILE|-]                      store JSON lines, print one result per line
    verify STORE                                check every record, unit and index entry
    recover STORE                               run recovery, print its report
    clean STORE [--dry-run]                     delete expired files now (retention)
    lag ROOT [--checkpoint DIR] [--group NAME]  Spark queries' and consumer groups' lag
    console ROOT [--checkpoint DIR ...]         a read-only web console on 127.0.0.1
    exporter ROOT [--checkpoint [NAME=]DIR ...] Prometheus metrics on 127.0.0.1:9560
    config                                      the effective store settings
    tier status|upload|clean STORE [--follow]   tiered storage: what is where; upload; retention

Contract:

* Options and positional arguments may come in any order after the command
  (``produce --batch-size 5 STORE --config X FILE``); a usage error prints that command's usage.
* Every command that takes STORE also takes ``--config FILE`` (``.toml`` or a broker.conf
  properties file); without it, ``conf/store.toml`` when it exists (see
  :meth:`rocketstore.pipeline.config.StoreConfig.effective`), else RocketMQ's defaults. The store must be
  opened with the geometry it was written with.
* Reading commands open the store read-only: they take no lock and write nothing, so they work
  on a store a writer has open and on read-only directories. ``produce`` opens it for writing
  and fails at once when another writer holds the lock.
* ``dump`` and ``produce`` write JSON lines. The other commands print an aligned table for
  people, or JSON lines with ``--json``.
* Exit status: see :data:`EPILOG`. Errors are one line ``rocketstore: error: ...`` on stderr.

Start-up: this module imports nothing heavy. A command's implementation (and with it numpy,
pyarrow and the store) is imported only once the arguments are parsed (by its function in
:mod:`.clihandlers`), so ``--help`` and usage errors answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from rocketstore.pipeline import clihandlers as run
from rocketstore.pipeline.clihandlers import Handler
from rocketstore.pipeline.errors import NotFoundError, StoreError
from rocketstore.pipeline.wholenumbers import count_type

PROG = "rocketstore"
EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_ERROR = 2
EXIT_NOT_FOUND = 3
EXIT_INTERRUPTED = 130
# As a command killed by SIGPIPE (128 + 13) ends in the shell: `rocketstore dump S | head`.
EXIT_PIPE_CLOSED = 141
EPILOG = """\
exit status:
  0    success
  1    the command ran and found problems: produce refused a line, verify found damage
  2    usage or configuration error, or the store could not be opened, read or
       written (produce: a put failed)
  3    not found: no such topic, queue, record offset or msgId in the store
  130  interrupted (Ctrl-C)
  141  the output was closed early (e.g. piped into head); nothing is reported
"""


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions as usual, but keeps text already laid out in lines (the exit status
    table of the epilog) as it is."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser, and each command's own parser by name. Each command's parser
    sets ``load_handler``: the :mod:`.clihandlers` function that imports its implementation."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Read and write a message store directory in Apache RocketMQ 4.9's "
        "on-disk format (CommitLog, ConsumeQueue, IndexFile).",
        epilog=EPILOG,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {_version()}", help="print the version"
    )
    c = _Commands(parser)
    _reading_commands(c)
    _query_commands(c)
    _writing_commands(c)
    _repair_commands(c)
    _lag_command(c)
    _serving_commands(c)
    _tier_command(c)
    c.add(
        "config",
        run.config,
        "Print the effective store settings",
        "Every setting by its RocketMQ name, then the keys of a broker.conf that are not "
        "store settings (ignored).",
        [c.conf, c.as_json],
    )
    return parser, c.parsers


class _Commands:
    """The subcommands being declared: their parsers by name, and the argument groups they
    share (argparse parents): ``conf`` (--config), ``store`` (STORE and --config),
    ``as_json`` (--json) and ``queue`` (--topic and --queue, both required)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        self.parsers: dict[str, argparse.ArgumentParser] = {}
        self.conf = argparse.ArgumentParser(add_help=False)
        self.conf.add_argument(
            "--config",
            metavar="FILE",
            help="store settings: a .toml file or a broker.conf properties file, RocketMQ "
            "names (default: conf/store.toml when it exists, under $ROCKETSTORE_CONF_DIR or "
            "the current directory, else RocketMQ's defaults); must match the geometry the "
            "store was written with",
        )
        self.store = argparse.ArgumentParser(add_help=False, parents=[self.conf])
        self.store.add_argument("store", metavar="STORE", help="the broker store directory")
        self.as_json = argparse.ArgumentParser(add_help=False)
        self.as_json.add_argument(
            "--json", action="store_true", help="print JSON lines instead of a table"
        )
        self.queue = argparse.ArgumentParser(add_help=False)
        self.queue.add_argument("--topic", required=True, help="topic")
        self.queue.add_argument("--queue", required=True, type=count_type(0), help="queue id")

    def add(
        self,
        name: str,
        load_handler: Callable[[], Handler],
        summary: str,
        details: str,
        parents: list[argparse.ArgumentParser],
    ) -> argparse.ArgumentParser:
        """Declare command ``name``, run by what ``load_handler`` returns."""
        p = self.sub.add_parser(
            name,
            help=summary,
            description=f"{summary}. {details}",
            epilog=EPILOG,
            formatter_class=_HelpFormatter,
            parents=parents,
        )
        # Imported only when the command runs: --help and usage errors must not pay for
        # importing the store (numpy, pyarrow).
        p.set_defaults(load_handler=load_handler)
        self.parsers[name] = p
        return p


def _served(p: argparse.ArgumentParser, port: int) -> None:
    """The options of a command that serves HTTP (console, exporter)."""
    p.add_argument(
        "--port",
        type=count_type(0),
        default=port,
        help=f"TCP port (default {port}; 0: any free port, printed on start)",
    )
    p.add_argument(
        "--bind",
        metavar="ADDR",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1); any other needs a token",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="read the token from FILE's first line (at least 16 characters) instead of "
        "generating one; with it, loopback requests need the token too",
    )
    p.add_argument(
        "--per-queue-limit",
        type=count_type(0),
        default=1000,
        metavar="N",
        help="/metrics leaves per-queue series out when the root has more than N queues "
        "(default 1000)",
    )


def _reading_commands(c: _Commands) -> None:
    """The commands that read a store's queues: dump, queues, topics, get."""
    p = c.add(
        "dump",
        run.dump,
        "Print every message reachable through the ConsumeQueues",
        "One JSON object per line (MessageExt fields, body in base64), topics sorted, queues "
        "ascending, queue offsets ascending; with --order log, in CommitLog order instead.",
        [c.store],
    )
    p.add_argument("--topic", help="only this topic")
    p.add_argument(
        "--order",
        choices=("queue", "log"),
        default="queue",
        help="queue (default): queue by queue; log: in CommitLog order, each segment read "
        "once for all its queues (an export of a tiered store fetches each object once, "
        "not once per queue)",
    )
    p = c.add(
        "queues",
        run.queues,
        "Print each queue's bounds",
        "Per topic and queue: topic, queueId, minOffset, maxOffset, maxPhysicOffset.",
        [c.store, c.as_json],
    )
    p.add_argument("--topic", help="only this topic")
    p = c.add(
        "topics",
        run.topics,
        "Print the topics a stock RocketMQ broker would serve from the store",
        "Per topic named in config/topics.json (the topic table a broker loads at start-up; "
        "it serves no other topic) or with ConsumeQueues on disk: readQueueNums, "
        "writeQueueNums, perm (R read, W write, X inherit), order, and diskQueues (1 + the "
        "highest queue id on disk). A note on stderr names each topic on disk a broker would "
        "not serve in full.",
        [c.store, c.as_json],
    )
    p.add_argument("--topic", help="only this topic")
    p = c.add(
        "get",
        run.get,
        "Print messages of one queue from a queue offset",
        "First the status (RocketMQ's GetMessageStatus), nextBeginOffset (where to continue) "
        "and the queue's minOffset/maxOffset, then the messages. With --json, one object "
        "holding those fields and a 'messages' list.",
        [c.store, c.queue, c.as_json],
    )
    p.add_argument("--offset", required=True, type=int, help="queue offset to start at")
    p.add_argument("--max", type=count_type(1), default=32, help="most messages (default 32)")
    p.add_argument("--tags", metavar="EXPR", help="tag filter, e.g. 'TagA || TagB' (default *)")


def _query_commands(c: _Commands) -> None:
    """The commands that look messages up: by key, store time, CommitLog offset, msgId."""
    p = c.add(
        "query-key",
        run.query_key,
        "Print messages of a topic by key",
        "Messages whose KEYS contain the key, or whose UNIQ_KEY is it, newest first "
        "(at most maxMsgsNumBatch).",
        [c.store, c.as_json],
    )
    p.add_argument("--topic", required=True, help="topic")
    p.add_argument("--key", required=True, help="a KEYS token or a UNIQ_KEY")
    p.add_argument(
        "--begin",
        type=int,
        default=0,
        metavar="MS",
        help="earliest store timestamp, ms since the epoch (default 0)",
    )
    p.add_argument(
        "--end",
        type=int,
        metavar="MS",
        help="latest store timestamp, ms since the epoch (default: no limit)",
    )
    p.add_argument("--max", type=count_type(1), help="most messages (default maxMsgsNumBatch)")
    p = c.add(
        "query-time",
        run.query_time,
        "Print the queue offset of a store time",
        "The offset of the message stored at that time, else the nearest one, clamped to "
        "the queue (RocketMQ's getOffsetInQueueByTime).",
        [c.store, c.queue, c.as_json],
    )
    p.add_argument(
        "--timestamp",
        required=True,
        type=int,
        metavar="MS",
        help="store timestamp, ms since the epoch",
    )
    p = c.add(
        "query-offset",
        run.query_offset,
        "Print the message at a CommitLog offset",
        "Every field of the message; the full body with --json (base64).",
        [c.store, c.as_json],
    )
    p.add_argument(
        "offset", metavar="OFFSET", type=count_type(0), help="CommitLog (physical) offset"
    )
    p = c.add(
        "query-msgid",
        run.query_msgid,
        "Print the message an offset msgId names",
        "Every field of the message; the full body with --json (base64).",
        [c.store, c.as_json],
    )
    p.add_argument("msgid", metavar="MSGID", help="offset msgId (32 or 56 hex characters)")


def _writing_commands(c: _Commands) -> None:
    """The command that writes a store: produce."""
    p = c.add(
        "produce",
        run.produce,
        "Store messages read as JSON lines",
        'Input lines: {"topic", "body" (text) or "bodyBase64", optional "queueId", '
        '"keys" (string or list), "tags", "properties" (object), "flag"}; blank lines '
        "are skipped. Prints one JSON result per line in input order, as each batch is "
        'stored: {"line", "status": "PUT_OK", "msgId", "commitLogOffset", '
        '"queueOffset", "storeTimestamp", "uniqKey"}, or a refusal '
        '("MESSAGE_ILLEGAL" or "PROPERTIES_SIZE_EXCEEDED") with an "error" naming the '
        "line. Refused lines do not stop the others; exit status 1 if any was refused. A "
        'put that fails (an I/O error) stops it: its lines are reported "PUT_OK" or '
        '"NOT_STORED" as the log holds them ("UNKNOWN" if it cannot be read back), and '
        "the exit status is 2. "
        "Opens the store for writing (creating it if absent).",
        [c.store],
    )
    p.add_argument(
        "input",
        nargs="?",
        default="-",
        metavar="FILE",
        help="input file (default -, standard input)",
    )
    p.add_argument(
        "--batch-size",
        type=count_type(1),
        default=1000,
        help="store a batch at this many lines (default 1000)",
    )
    p.add_argument(
        "--linger-ms",
        type=count_type(0),
        default=100,
        help="or this long after a batch's first line (default 100)",
    )


def _repair_commands(c: _Commands) -> None:
    """The commands that check and repair a store: recover, verify, clean."""
    p = c.add(
        "recover",
        run.recover,
        "Run recovery now and print what it did",
        "Opens the store for writing, which finds the end of the CommitLog (checking magic, "
        "size and CRC), cuts what follows it, drops ConsumeQueue units and index entries "
        "past it, rebuilds damaged or missing ConsumeQueues and index from the CommitLog and "
        "dispatches what is missing; then closes it cleanly. Bytes that a writer which had "
        "lost the store left in a dead region are not data: the region is restored. Safe to "
        "run again: the second run has nothing to do. Fails at once if a writer holds the "
        "store, and, changing nothing, if valid records follow the end it found (damage "
        "inside the log: `rocketstore verify` lists it).",
        [c.store, c.as_json],
    )
    p.add_argument(
        "--cut-at-damage",
        action="store_true",
        help="when valid records follow damage inside the log, cut at the damage anyway, "
        "dropping them (copy the store first)",
    )
    p = c.add(
        "verify",
        run.verify,
        "Check every record, ConsumeQueue unit and index entry",
        "Walks the whole CommitLog (magic, sizes, physical offsets, body CRCs), going on past "
        "a damaged record; checks every ConsumeQueue unit against its record and every index "
        "entry against its record's keys. With the tier on, also the objects in the bucket "
        "(--no-tier: not). Prints each problem with its file or object and offset; exit "
        "status 1 if there is any. Read-only: safe while a writer runs.",
        [c.store, c.as_json],
    )
    p.add_argument(
        "--all", action="store_true", help="list every problem (default: 100 per kind and file)"
    )
    p.add_argument("--progress", action="store_true", help="show progress on stderr")
    p.add_argument(
        "--tier",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with the tier on (tieredStorageLevel = NOT_IN_DISK), also check the bucket's "
        "objects: the manifest, every object's length and SHA-256, each segment's records and "
        "each index against the one rebuilt from them; reads every object once (default: on "
        "with the tier on; --no-tier checks the local files only)",
    )
    p.add_argument(
        "--metrics",
        metavar="FILE",
        help="also write the result to FILE in Prometheus' text format (replaced atomically), "
        "for node_exporter's textfile collector: rocketstore_verify_ok, _problems and "
        "_last_run_timestamp_seconds with broker=the store directory's name",
    )
    p = c.add(
        "clean",
        run.clean,
        "Delete expired and surplus files now, as retention would",
        "Deletes CommitLog segments older than fileReservedTime hours whatever the hour "
        "(as a manual clean does), the oldest ones even if not expired while the disk is "
        "over 85 % full, then the ConsumeQueue and index files whose messages are gone, and "
        "advances the queues' min offsets. Never deletes the segment being written. With "
        "--dry-run nothing is changed and the store is opened read-only. A store that was not "
        "closed cleanly is not recovered first (recovery can need the space a clean frees, "
        "on a full disk): the files are deleted under its lock, and `rocketstore recover` "
        "recovers it next.",
        [c.store, c.as_json],
    )
    p.add_argument("--dry-run", action="store_true", help="show what would be deleted")
    p.add_argument(
        "--max-files",
        type=count_type(1),
        default=None,
        help="most CommitLog segments to delete (default: the policy's per-round limit)",
    )


def _lag_command(c: _Commands) -> None:
    """The command that reports consumers' lag: lag."""
    p = c.add(
        "lag",
        run.lag,
        "Print how far a Spark query and RocketMQ consumer groups are behind, per queue",
        "With --checkpoint, the offsets of the last committed micro-batch of a query that "
        "reads the store with format('rocketstore') (offsets/N of the highest N with a "
        "commits/N). Then the consumer groups whose offsets a stock broker keeps in a broker "
        "directory's config/consumerOffset.json (its .bak when that is missing or empty, as a "
        "broker loads it). Per message queue: topic, brokerName, queueId, committedOffset (the "
        "next queue offset to read), maxOffset (the queue's end in the store) and lag "
        "(maxOffset - committedOffset), as RocketMQ's consumerProgress counts it; then a total "
        "per consumer. Queues not committed yet count from their minOffset, where the source "
        "starts them (consumerProgress counts those from 0). ROOT is a store root (broker-N "
        "directories) or one RocketMQ store directory; it is opened read-only. A broker writes "
        "consumerOffset.json every 5 s and when it stops, so a running broker's groups may be "
        "that far behind what it holds in memory.",
        [c.conf, c.as_json],
    )
    p.add_argument(
        "root",
        metavar="ROOT",
        help="the store root the query reads (broker-N directories), or one broker store directory",
    )
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="a reading query's checkpointLocation (a local or mounted path)",
    )
    p.add_argument(
        "--group",
        metavar="NAME",
        help="only this consumer group (default: every group with committed offsets)",
    )
    p.add_argument(
        "--topic",
        help="only this topic (default: the topics the checkpoint and the groups name)",
    )


def _serving_commands(c: _Commands) -> None:
    """The commands that serve a store root over HTTP: the console and the exporter."""
    p = c.add(
        "console",
        run.console,
        "Serve a read-only web console of a store root",
        "Pages: the overview (brokers, topics, disk use, the last hour's write rate), each "
        "topic's queues and messages per minute, messages (browse a queue from an offset or a "
        "time; by key, msgId or CommitLog offset; bodies decoded by the topic's body format), "
        "the consumers' lag (the Spark queries of --checkpoint and the groups of "
        "config/consumerOffset.json, as `lag` computes it) and a verify run. Opens the "
        "brokers read-only (no lock, nothing written). Listens on 127.0.0.1 unless --bind "
        "says otherwise; any other address needs a token (--token-file, else one is "
        "generated and printed) that every request carries. Needs the 'console' extra: "
        "pip install 'rocketstore[console]'. Ctrl-C stops it.",
        [c.conf],
    )
    p.add_argument(
        "root",
        metavar="ROOT",
        help="the store root (broker-N directories), or one broker store directory",
    )
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        action="append",
        help="a reading Spark query's checkpointLocation whose lag to show (repeatable)",
    )
    _served(p, 8080)
    p = c.add(
        "exporter",
        run.exporter,
        "Serve a store root's metrics for Prometheus",
        "GET /metrics answers in Prometheus' text format (see docs/monitoring.md for the "
        "metrics): messages and bytes stored, queue bounds, the lag of every consumer group of "
        "config/consumerOffset.json and of each Spark query of --checkpoint and its age, disk "
        "use against diskMaxUsedSpaceRatio, retention, and the writers' state. Read from the "
        "store files at each scrape (no lock, nothing written). The console's /metrics is the "
        "same, plus its verify runs; this is for hosts that should not serve messages. "
        "Listens on 127.0.0.1 unless --bind says otherwise; any other address needs a token "
        "(--token-file, else one is generated and printed). Needs the 'console' extra. "
        "Ctrl-C stops it.",
        [c.conf],
    )
    p.add_argument(
        "root",
        metavar="ROOT",
        help="the store root (broker-N directories), or one broker store directory",
    )
    p.add_argument(
        "--checkpoint",
        metavar="[NAME=]DIR",
        action="append",
        help="a reading Spark query's checkpointLocation whose lag to export, as query NAME "
        "(default: the path as given) (repeatable)",
    )
    _served(p, 9560)


def _tier_command(c: _Commands) -> None:
    """``tier status|upload|clean STORE``: tiered storage (docs/tiering.md)."""
    p = c.add(
        "tier",
        run.tier,
        "Tiered storage: what of a store is local, in the bucket and pending; upload it; "
        "apply the bucket's retention",
        "status: the local segments, the bucket's (from its manifest), what is sealed and not "
        "uploaded yet (segments, bytes, the upload lag in seconds) and leftovers of uploads "
        "that died; reads only. upload: upload the sealed segments not in the bucket yet, "
        "each confirmed, then named in the manifest (once; --follow: continuously until "
        "SIGTERM or Ctrl-C), then apply the bucket's retention. clean: apply the bucket's "
        "retention now: remove the oldest segments whose newest record is older than "
        "tieredStoreFileReservedTime hours (0: none ever), from the manifest first, then "
        "their objects, and objects a clean that died left (--dry-run: show them, change "
        "nothing). Needs tieredStorageLevel = NOT_IN_DISK and objectStoreBucket; "
        "credentials from the settings or the AWS chain (AWS_ACCESS_KEY_ID, AWS_PROFILE). "
        "Needs the 'tier' extra: pip install 'rocketstore[tier]'.",
        [c.conf, c.as_json],
    )
    p.add_argument("action", choices=("status", "upload", "clean"), help="what to do")
    p.add_argument("store", metavar="STORE", help="the broker store directory")
    p.add_argument(
        "--follow",
        action="store_true",
        help="upload: keep uploading what is sealed until SIGTERM or Ctrl-C",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="upload --follow: seconds between looks for sealed segments (default 1)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="clean: show what would be removed from the bucket, change nothing",
    )


def _version() -> str:
    """The installed distribution's version (``unknown`` when run from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rocketstore")
    except PackageNotFoundError:
        return "unknown (not installed)"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line (``load_handler`` returns the command's function); argparse's
    ``SystemExit`` after ``--help`` or a usage error, which it has printed."""
    parser, commands = build_parser()
    if argv and argv[0] in commands:
        # Intermixed: positionals and options in any order, so that an optional positional
        # (produce's FILE) may follow options; and a usage error shows this command's usage.
        return commands[argv[0]].parse_intermixed_args(list(argv[1:]))
    return parser.parse_args(list(argv))  # --help, no command, or an unknown one


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rocketstore`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help, or a usage error argparse has already reported
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    handler: Handler = args.load_handler()
    try:
        return handler(args)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as a command killed by SIGPIPE does,
        # and keep the interpreter's final flush of stdout from complaining too.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    except NotFoundError as exc:
        sys.stderr.write(f"{PROG}: error: {_describe(exc)}\n")
        return EXIT_NOT_FOUND
    except (StoreError, OSError) as exc:
        sys.stderr.write(f"{PROG}: error: {_describe(exc)}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
