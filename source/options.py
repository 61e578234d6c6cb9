"""The reader options of the ``rocketstore`` source, parsed and checked once, on the driver.

Names follow Spark's Kafka source where one exists (``startingOffsets``, ``endingOffsets``,
``startingTimestamp``, ``startingOffsetsByTimestamp``, ``failOnDataLoss``, ``minPartitions``,
``maxTriggerDelay``), with ``Messages`` for Kafka's ``Offsets`` in the rate limits, and
RocketMQ's connector's ``subExpression`` for tags:

=========================== ========================================================== ==========
option                      accepted values                                            default
=========================== ========================================================== ==========
path                        a store root (``broker-N/`` directories), one RocketMQ     required
                            store directory, or ``s3://BUCKET/PREFIX/``: the tier alone
topic                       a topic, or several separated by commas                    required
startingOffsets             ``earliest``, ``latest``, offsets JSON (-2 / -1) or        streams:
                            ``group:NAME``: a RocketMQ consumer group's offsets        latest;
                                                                                       batches:
                                                                                       earliest
endingOffsets (batch)       ``latest`` or offsets JSON (-1)                            latest
startingTimestamp           store time in ms: each queue starts at its first message
                            stored at or after it
startingOffsetsByTimestamp  offsets JSON whose values are store times in ms (-2 / -1)
maxMessagesPerTrigger       positive integer: most ConsumeQueue units per micro-batch  none
minMessagesPerTrigger       positive integer: wait for this many (see maxTriggerDelay) none
maxTriggerDelay             a duration (``500ms``, ``30s``, ``15m``, ``1h``)           15m
minPartitions               positive integer: split queue ranges up to this many tasks none
subExpression               RocketMQ tag expression (``*``, ``TagA || TagB``)          ``*``
failOnDataLoss              ``true`` or ``false``                                      true
bodyFormat                  ``binary``, ``avro`` or ``json``                           the topic's
key (batch)                 read the messages with this key (IndexFile look-up)
startTimestamp (batch, key) store time in ms, inclusive                                0
endTimestamp (batch, key)   store time in ms, inclusive                                no end
config                      a store configuration file (.toml or broker.conf), for the conf/store.toml
                            IndexFile geometry of key reads (used when it fits the     or built-in
                            files, else RocketMQ's 1:4 slots to entries is assumed)
includeProperties           ``true`` or ``false``: add column ``properties``           false
includeHosts                ``true`` or ``false``: add ``bornHost``, ``storeHost``     false
includeMsgId                ``true`` or ``false``: add ``msgId``                       false
includeFlags                ``true`` or ``false``: add ``flag``, ``sysFlag``,          false
                            ``reconsumeTimes``
includeAll                  ``true`` or ``false``: all of the four above               false
objectStoreEndpoint,        the tier's settings (docs/tiering.md), over the config     config's
objectStoreRegion,          file's: ``NOT_IN_DISK`` reads the tier too
tieredStorageLevel
=========================== ========================================================== ==========

The ``include*`` options widen the row beyond the default columns (see :mod:`rocketstore.source.schema`),
as Kafka's ``includeHeaders`` adds ``headers``: Spark cannot prune a Python data source's
columns, so a column that is there costs every query, used or not.

``startingOffsets=group:NAME`` starts each queue where the RocketMQ consumer group ``NAME``
committed (``config/consumerOffset.json`` of each broker directory: :mod:`rocketstore.pipeline.engine.groups`), so
that a group can move from Java consumers to Spark without skipping or reading again; queues it
never committed start at their earliest offset. The files are read when the query first plans
its offsets (a query restarted from its checkpoint goes on from there and reads them no more);
a group with no committed offset for the query's topics is an error, not a start from the
earliest offsets. Nothing is committed back: the group's offsets stay as they were.

Precedence of the starting options, as Kafka's: ``startingOffsetsByTimestamp``, then
``startingTimestamp``, then ``startingOffsets``. Every bad value raises
:class:`~rocketstore.pipeline.errors.ConfigError` naming the option and what it accepts.

Pure and immutable once parsed; picklable (readers carry it to executors).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.errors import ConfigError, NotAStoreError, StoreError, TopicConfigError
from rocketstore.pipeline.files.topicconfig import read_topics
from rocketstore.pipeline.format.bodyformat import check_format
from rocketstore.pipeline.tier.catalog import BucketCatalog
from rocketstore.pipeline.wholenumbers import parse_count
from rocketstore.source.offsets import OffsetSpec, parse_option, parse_timestamps_option
from rocketstore.source.tiers import BucketRoot, bucket_catalog, bucket_config, parse_bucket_path

DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

# Settings of the tier a reader may give as options, over the configuration file's.
TIER_OPTIONS = ("tieredStorageLevel", "objectStoreEndpoint", "objectStoreRegion")
STREAM_ONLY = ("maxMessagesPerTrigger", "minMessagesPerTrigger", "maxTriggerDelay")
BATCH_ONLY = ("endingOffsets", "key", "startTimestamp", "endTimestamp")
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")
_DURATION_RE = re.compile(r"^\s*(\d+)\s*(ms|s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000}
_UNIT_MS |= {"h": 3_600_000, "d": 86_400_000}

# The optional message columns, by the option that adds each group (the layout is
# source/schema.py's); includeAll adds every group.
COLUMN_OPTIONS: dict[str, tuple[str, ...]] = {
    "includeProperties": ("properties",),
    "includeHosts": ("bornHost", "storeHost"),
    "includeMsgId": ("msgId",),
    "includeFlags": ("flag", "sysFlag", "reconsumeTimes"),
}
INCLUDE_ALL = "includeAll"
OPTIONAL_COLUMNS = frozenset(c for group in COLUMN_OPTIONS.values() for c in group)


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """Everything the planner and the readers need from the options."""

    path: str
    topics: tuple[str, ...]
    streaming: bool | None
    starting: OffsetSpec
    ending: OffsetSpec
    max_per_trigger: int | None = None
    min_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    sub_expression: str = "*"
    fail_on_data_loss: bool = True
    body_format: str | None = None  # None: each topic's recorded format
    key: str | None = None
    start_timestamp: int = 0
    end_timestamp: int = 2**63 - 1
    config: StoreConfig | None = None
    optional_columns: frozenset[str] = frozenset()  # of OPTIONAL_COLUMNS, by the include* options
    catalog: str = ""  # the root's topics and schemas: the path, or s3://... for a bucket's

    def topic_catalog(self) -> StoreRoot | BucketCatalog:
        """Each topic's body format and schemas: the root's, or the bucket's copy."""
        if self.catalog and parse_bucket_path(self.catalog) is not None:
            return bucket_catalog(self.catalog, self.store_config)
        return self.root

    @property
    def root(self) -> StoreRoot:
        return StoreRoot(self.path)

    @property
    def bucket(self) -> tuple[str, str] | None:
        """``(bucket, prefix)`` when the path is a bucket's (``s3://``): a reader of the tier
        alone."""
        return parse_bucket_path(self.path)

    @property
    def store_config(self) -> StoreConfig:
        return self.config or StoreConfig()


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Option lookup ignoring case (Spark hands options over in a case-insensitive map, but
    plain dicts in tests are not)."""
    lowered = name.lower()
    for k, v in options.items():
        if k.lower() == lowered:
            return None if v is None else str(v)
    return None


def parse_bool(option: str, text: str) -> bool:
    word = text.strip().lower()
    if word in ("true", "false"):
        return word == "true"
    raise ConfigError(f"option {option}={text!r}: expected true or false")


def parse_millis(option: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(
            f"option {option}={text!r}: expected a store time in milliseconds since the epoch "
            "(an integer >= 0)"
        )
    return value


def parse_duration_ms(option: str, text: str) -> int:
    m = _DURATION_RE.match(text)
    if not m:
        raise ConfigError(
            f"option {option}={text!r}: expected a duration such as 500ms, 30s, 15m, 1h or 1d"
        )
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _UNIT_MS[unit]


def parse_topics(text: str | None) -> tuple[str, ...]:
    if text is None or not text.strip():
        raise ConfigError("option topic is required: a topic name, or several separated by commas")
    topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in topics if not _TOPIC_RE.match(t)]
    if bad or not topics:
        raise ConfigError(
            f"option topic={text!r}: {', '.join(map(repr, bad)) or 'no topic'} is not a topic "
            "name (1-127 characters of letters, digits, %, |, _ and -)"
        )
    return topics


def known_topics(root: StoreRoot) -> set[str]:
    """Topics recorded in ``topics.json``, present in some broker's ``consumequeue/``, or
    served by a broker (its ``config/topics.json``: a topic created on a stock broker that
    has no message yet, whose queues the stream reads from the start once they appear)."""
    found = set(root.topics())
    for _, broker in root.brokers():
        cq = broker / "consumequeue"
        if cq.is_dir():
            found.update(p.name for p in cq.iterdir() if p.is_dir())
        # Only a hint here: a damaged file is for `rocketstore topics` to report.
        with contextlib.suppress(TopicConfigError):
            served = read_topics(broker / "config")
            found.update(served.topics if served is not None else ())
    return found


def parse(options: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    """Check every option against the store root; raises :class:`ConfigError` for the first
    bad one. Runs on the driver when the query (or the batch read) starts.

    ``streaming`` None (the schema, asked before Spark says which kind of read it is) skips
    the checks of options that belong to one kind only."""
    config = _config(options)
    path, topics, catalog = _path_and_topics(options, config)
    _check_kind(options, streaming)
    starting = _starting(options, topics, bool(streaming))
    ending = OffsetSpec("latest")
    text = _get(options, "endingOffsets")
    if text is not None:
        ending = parse_option("endingOffsets", text, topics, allow_earliest=False)
    max_per_trigger, min_per_trigger, delay = _trigger_limits(options)
    fail_text = _get(options, "failOnDataLoss")
    fmt_text = _get(options, "bodyFormat")
    key, start_ts, end_ts = _key_read(options)
    sub = _get(options, "subExpression")
    return ReadOptions(
        path=path,
        topics=topics,
        streaming=streaming,
        starting=starting,
        ending=ending,
        max_per_trigger=max_per_trigger,
        min_per_trigger=min_per_trigger,
        max_trigger_delay_ms=delay,
        min_partitions=_positive(options, "minPartitions"),
        sub_expression="*" if sub is None else sub,
        fail_on_data_loss=True if fail_text is None else parse_bool("failOnDataLoss", fail_text),
        body_format=None if fmt_text is None else check_format(fmt_text, "bodyFormat"),
        key=None if key is None else key.strip(),
        start_timestamp=start_ts,
        end_timestamp=end_ts,
        config=config,
        optional_columns=_optional_columns(options),
        catalog=catalog,
    )


def _path_and_topics(
    options: Mapping[str, str], config: StoreConfig
) -> tuple[str, tuple[str, ...], str]:
    """Options path (a readable store root or store directory, or a bucket's tier), topic
    (each one the root knows), and where the root's topic catalog is (the path, or the
    bucket's catalog)."""
    path = _get(options, "path")
    if not path:
        raise ConfigError(
            "option path is required: a store root (with broker-N directories), a RocketMQ "
            "store directory, or the tier in a bucket (s3://BUCKET/PREFIX/)"
        )
    catalog = path
    if parse_bucket_path(path) is not None:
        bucket = BucketRoot(path, config)
        topics_in_root = bucket.topics()
        catalog = bucket.catalog_url
    else:
        root = StoreRoot(path)
        try:
            root.check_readable("path")
            topics_in_root = known_topics(root)
        except NotAStoreError as exc:
            raise ConfigError(
                f"{exc}; expected a store root (broker-N directories and topics.json), a "
                "RocketMQ store directory (with commitlog/) or s3://BUCKET/PREFIX/"
            ) from None
    topics = parse_topics(_get(options, "topic"))
    unknown = [t for t in topics if t not in topics_in_root]
    if unknown:
        raise ConfigError(
            f"option topic: {', '.join(map(repr, unknown))} not found in {path}; topics there: "
            f"{', '.join(sorted(topics_in_root)) or '(none)'}"
        )
    return path, topics, catalog


def _check_kind(options: Mapping[str, str], streaming: bool | None) -> None:
    """Refuse an option of batch reads in a streaming query, and the other way round."""
    kind = "a streaming query" if streaming else "a batch read"
    for name in () if streaming is None else BATCH_ONLY if streaming else STREAM_ONLY:
        if _get(options, name) is not None:
            where = "batch reads (spark.read)" if streaming else "streaming queries"
            raise ConfigError(f"option {name} is only for {where}, not for {kind}")


def _positive(options: Mapping[str, str], name: str) -> int | None:
    raw = _get(options, name)
    return None if raw is None else parse_count(raw, f"option {name}")


def _trigger_limits(options: Mapping[str, str]) -> tuple[int | None, int | None, int]:
    """maxMessagesPerTrigger, minMessagesPerTrigger (not above the max) and maxTriggerDelay
    in ms."""
    max_per_trigger = _positive(options, "maxMessagesPerTrigger")
    min_per_trigger = _positive(options, "minMessagesPerTrigger")
    if (
        max_per_trigger is not None
        and min_per_trigger is not None
        and min_per_trigger > max_per_trigger
    ):
        raise ConfigError(
            f"option minMessagesPerTrigger={min_per_trigger} is above "
            f"maxMessagesPerTrigger={max_per_trigger}; expected min <= max"
        )
    delay_text = _get(options, "maxTriggerDelay")
    delay = (
        DEFAULT_MAX_TRIGGER_DELAY_MS
        if delay_text is None
        else parse_duration_ms("maxTriggerDelay", delay_text)
    )
    return max_per_trigger, min_per_trigger, delay


def _key_read(options: Mapping[str, str]) -> tuple[str | None, int, int]:
    """A key read's key (as given) and its store-time bounds, startTimestamp and
    endTimestamp; a key read takes no starting or ending offsets."""
    key = _get(options, "key")
    start_ts_text = _get(options, "startTimestamp")
    end_ts_text = _get(options, "endTimestamp")
    if key is None and (start_ts_text is not None or end_ts_text is not None):
        raise ConfigError(
            "options startTimestamp/endTimestamp bound a key read: they need option key"
        )
    if key is not None:
        if not key.strip():
            raise ConfigError("option key='': expected a message key (a KEYS token or UNIQ_KEY)")
        clash = [
            n
            for n in ("startingOffsets", "endingOffsets", "startingTimestamp")
            if _get(options, n) is not None
        ]
        if clash:
            raise ConfigError(
                f"option key cannot be combined with {', '.join(clash)}: a key read looks "
                "messages up in the IndexFile; bound it with startTimestamp/endTimestamp"
            )
    start_ts = 0 if start_ts_text is None else parse_millis("startTimestamp", start_ts_text)
    end_ts = 2**63 - 1 if end_ts_text is None else parse_millis("endTimestamp", end_ts_text)
    if start_ts > end_ts:
        raise ConfigError(
            f"option startTimestamp={start_ts} is after endTimestamp={end_ts}; expected "
            "startTimestamp <= endTimestamp"
        )
    return key, start_ts, end_ts


def _config(options: Mapping[str, str]) -> StoreConfig:
    """The store settings of option config, or every tool's (conf/store.toml, else the
    built-ins) without it; resolved here, on the driver."""
    config_text = _get(options, "config")
    if config_text is not None and not Path(config_text).is_file():
        raise ConfigError(
            f"option config={config_text!r}: no such file; expected a store configuration "
            "file (.toml or broker.conf)"
        )
    try:
        config = StoreConfig.effective(config_text)
    except StoreError as exc:
        raise ConfigError(f"option config={config_text!r}: {exc}") from None
    tier = {name: v for name in TIER_OPTIONS if (v := _get(options, name)) is not None}
    if tier:
        config = config.with_overrides(tier)
    path = _get(options, "path")
    found = parse_bucket_path(path) if path else None
    return bucket_config(config, found[0]) if found is not None else config


def _optional_columns(options: Mapping[str, str]) -> frozenset[str]:
    """The optional columns the ``include*`` options turn on."""

    def on(name: str) -> bool:
        text = _get(options, name)
        return text is not None and parse_bool(name, text)

    chosen = [name for name in COLUMN_OPTIONS if on(name)]  # every value checked
    if on(INCLUDE_ALL):
        return OPTIONAL_COLUMNS
    return frozenset(c for name in chosen for c in COLUMN_OPTIONS[name])


def _starting(options: Mapping[str, str], topics: tuple[str, ...], streaming: bool) -> OffsetSpec:
    by_ts = _get(options, "startingOffsetsByTimestamp")
    if by_ts is not None:
        return parse_timestamps_option("startingOffsetsByTimestamp", by_ts, topics)
    ts = _get(options, "startingTimestamp")
    if ts is not None:
        return OffsetSpec("timestamp", timestamp=parse_millis("startingTimestamp", ts))
    text = _get(options, "startingOffsets")
    if text is None:
        return OffsetSpec("latest" if streaming else "earliest")
    return parse_option("startingOffsets", text, topics, allow_group=True)
