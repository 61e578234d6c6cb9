"""Store configuration, named as Apache RocketMQ's ``MessageStoreConfig`` names it.

Settings are read from a TOML file or from a RocketMQ ``broker.conf`` style properties file, so
an operator's existing values carry over. Keys are RocketMQ's camelCase names in both formats.

Where settings come from, for every tool alike (the command line, the sink, the source and the
jobs; see :meth:`StoreConfig.effective`): the file the user names, else ``store.toml`` in the
configuration directory (``$ROCKETSTORE_CONF_DIR`` when set, else ``conf/`` in the current
directory) when it exists, else the built-in defaults, which are RocketMQ 4.9.x's and are part
of the package (this module), so an installed wheel has them too.

* In TOML, an unknown key is an error: the file is ours, so a typo should not pass silently.
* In a properties file, keys this store does not use (``brokerClusterName``, ``namesrvAddr``, …)
  are ignored, as RocketMQ itself ignores them when it maps properties onto its config objects;
  they are listed in :attr:`StoreConfig.ignored_keys` so tools can show them.

:class:`StoreConfig` is immutable and picklable; it is safe to share between threads and to ship
to Spark executors.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rocketstore.pipeline.errors import ConfigError
from rocketstore.pipeline.layout import (
    CQ_UNIT_SIZE,
    DEFAULT_CQ_UNITS_PER_FILE,
    DEFAULT_MAX_HASH_SLOT_NUM,
    DEFAULT_MAX_INDEX_NUM,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_SLOT_SIZE,
    index_file_size,
)

ASYNC_FLUSH = "ASYNC_FLUSH"
CONF_DIR_ENV = "ROCKETSTORE_CONF_DIR"
DEFAULT_FILE = "store.toml"
BUILT_IN = "built-in defaults"
SYNC_FLUSH = "SYNC_FLUSH"
# sharedStorage: decide from the file system's type, or say so.
SHARED_STORAGE_CHOICES = ("auto", "shared", "local")

# RocketMQ name -> (attribute, type). The order is the order `rocketstore config` prints.
_FIELDS: dict[str, tuple[str, type]] = {
    "mappedFileSizeCommitLog": ("mapped_file_size_commitlog", int),
    "mappedFileSizeConsumeQueue": ("mapped_file_size_consume_queue", int),
    "maxHashSlotNum": ("max_hash_slot_num", int),
    "maxIndexNum": ("max_index_num", int),
    "messageIndexEnable": ("message_index_enable", bool),
    "flushDiskType": ("flush_disk_type", str),
    "flushIntervalCommitLog": ("flush_interval_commitlog", int),
    "maxMessageSize": ("max_message_size", int),
    "maxMsgsNumBatch": ("max_msgs_num_batch", int),
    "fileReservedTime": ("file_reserved_time", int),
    "deleteWhen": ("delete_when", str),
    "diskMaxUsedSpaceRatio": ("disk_max_used_space_ratio", int),
    "checkCRCOnRecover": ("check_crc_on_recover", bool),
    "maxMappedFiles": ("max_mapped_files", int),
    "sharedStorage": ("shared_storage", str),
    "visibilityWaitMs": ("visibility_wait_ms", int),
    "brokerIP1": ("broker_ip1", str),
    "listenPort": ("listen_port", int),
    # Tiered storage (docs/tiering.md), named after RocketMQ 5's tiered store where one fits.
    "tieredStorageLevel": ("tiered_storage_level", str),
    "objectStoreEndpoint": ("object_store_endpoint", str),
    "objectStoreBucket": ("object_store_bucket", str),
    "objectStorePrefix": ("object_store_prefix", str),
    "objectStoreRegion": ("object_store_region", str),
    "objectStoreAccessKey": ("object_store_access_key", str),
    "objectStoreSecretKey": ("object_store_secret_key", str),
    "brokerName": ("broker_name", str),
    "tieredStoreGroupCommitTimeout": ("tiered_store_group_commit_timeout", int),
    "tieredStoreFileReservedTime": ("tiered_store_file_reserved_time", int),
    "tieredStoreUploadThreads": ("tiered_store_upload_threads", int),
}

# tieredStorageLevel: the tier off, or sealed segments uploaded and read from the bucket.
TIER_DISABLE = "DISABLE"
TIER_NOT_IN_DISK = "NOT_IN_DISK"
TIER_LEVELS = (TIER_DISABLE, TIER_NOT_IN_DISK)
# Each segment upload holds its segment index in memory (up to a fifth of a segment of small
# messages): more at once than this buys no bandwidth and costs that memory.
MAX_UPLOAD_THREADS = 16
# Settings whose value a tool must never print (rocketstore config shows them masked).
SECRET_SETTINGS = frozenset({"objectStoreSecretKey"})


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """Settings of one broker store directory. Defaults are RocketMQ 4.9.x's."""

    mapped_file_size_commitlog: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = DEFAULT_CQ_UNITS_PER_FILE * CQ_UNIT_SIZE
    max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM
    max_index_num: int = DEFAULT_MAX_INDEX_NUM
    message_index_enable: bool = True
    flush_disk_type: str = ASYNC_FLUSH
    flush_interval_commitlog: int = 500
    max_message_size: int = 1024 * 1024 * 4
    max_msgs_num_batch: int = 64
    file_reserved_time: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    check_crc_on_recover: bool = True
    # Not a RocketMQ setting: how many ConsumeQueue and IndexFile mappings stay open at once.
    max_mapped_files: int = 1024
    # Not RocketMQ settings: whether readers see only what the writer published
    # (rocketstore.pipeline.files.visibility), and how long a reader waits for published data to reach its host.
    shared_storage: str = "auto"
    visibility_wait_ms: int = 30_000
    # The store host a writer stamps into records and msgIds; None (unset): the directory's, or
    # RocketMQ's broker defaults for a new one (rocketstore.pipeline.engine.storehost).
    broker_ip1: str | None = None
    listen_port: int | None = None
    # Not a RocketMQ setting: added to a listenPort that is set or defaulted, never to one
    # taken from the directory (a root's broker b: 10 * b; rocketstore.pipeline.engine.storehost).
    listen_port_offset: int = 0
    # Tiered storage (docs/tiering.md). Unset strings (None) leave the value to the standard
    # AWS chain (environment, AWS_PROFILE and ~/.aws), which is where credentials belong.
    tiered_storage_level: str = TIER_DISABLE
    object_store_endpoint: str | None = None
    object_store_bucket: str | None = None
    object_store_prefix: str = ""
    object_store_region: str | None = None
    object_store_access_key: str | None = None
    object_store_secret_key: str | None = None
    # None: the name of the store directory (so the brokers of a root get their own prefixes).
    broker_name: str | None = None
    tiered_store_group_commit_timeout: int = 60_000
    tiered_store_file_reserved_time: int = 72
    # Not a RocketMQ setting: sealed segments the uploader sends at once (docs/tiering.md).
    tiered_store_upload_threads: int = 4
    ignored_keys: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    # Where the settings came from (a file, or BUILT_IN), for messages; not a setting.
    origin: str = dataclasses.field(default=BUILT_IN, compare=False)

    def __post_init__(self) -> None:
        self._check()

    # -- validation -------------------------------------------------------------------------
    def _check(self) -> None:
        def need(cond: bool, name: str, what: str) -> None:
            if not cond:
                value = getattr(self, _FIELDS[name][0])
                if name in SECRET_SETTINGS:
                    value = "***"
                raise ConfigError(f"{name}={value!r}: {what}")

        need(self.mapped_file_size_commitlog >= 4096, "mappedFileSizeCommitLog", "must be >= 4096")
        need(
            self.mapped_file_size_commitlog <= 2**31 - 1,
            "mappedFileSizeCommitLog",
            "must fit in a Java int (RocketMQ maps each file as one buffer)",
        )
        need(
            self.mapped_file_size_consume_queue >= CQ_UNIT_SIZE,
            "mappedFileSizeConsumeQueue",
            f"must be >= {CQ_UNIT_SIZE}",
        )
        need(self.max_hash_slot_num >= 1, "maxHashSlotNum", "must be >= 1")
        need(self.max_index_num >= 2, "maxIndexNum", "must be >= 2 (entry 0 is never used)")
        need(
            self.index_file_size <= 2**31 - 1,
            "maxIndexNum",
            f"index file ({INDEX_HEADER_SIZE} + {INDEX_SLOT_SIZE}*maxHashSlotNum + "
            f"{INDEX_ENTRY_SIZE}*maxIndexNum bytes) must fit in a Java int",
        )
        need(
            self.flush_disk_type in (ASYNC_FLUSH, SYNC_FLUSH),
            "flushDiskType",
            f"must be {ASYNC_FLUSH} or {SYNC_FLUSH}",
        )
        need(self.flush_interval_commitlog >= 1, "flushIntervalCommitLog", "must be >= 1 ms")
        need(self.max_message_size >= 1, "maxMessageSize", "must be >= 1")
        need(self.max_msgs_num_batch >= 1, "maxMsgsNumBatch", "must be >= 1")
        need(self.max_mapped_files >= 2, "maxMappedFiles", "must be >= 2")
        need(
            self.shared_storage in SHARED_STORAGE_CHOICES,
            "sharedStorage",
            f"must be one of {', '.join(SHARED_STORAGE_CHOICES)}",
        )
        need(self.visibility_wait_ms >= 0, "visibilityWaitMs", "must be >= 0 ms")
        need(self.file_reserved_time >= 0, "fileReservedTime", "must be >= 0 hours")
        need(
            all(_is_hour(h) for h in self.delete_when.split(";")),
            "deleteWhen",
            'must be hours 00-23 separated by \';\' (e.g. "04" or "04;16")',
        )
        need(
            10 <= self.disk_max_used_space_ratio <= 95,
            "diskMaxUsedSpaceRatio",
            "must be between 10 and 95 (RocketMQ's bounds)",
        )
        port = self.listen_port if self.listen_port is not None else 10911
        need(
            0 < port + self.listen_port_offset < 65536,
            "listenPort",
            "must be a TCP port (1-65535)"
            + (f" after adding {self.listen_port_offset}" if self.listen_port_offset else ""),
        )
        if self.broker_ip1 is not None:
            try:
                ipaddress.ip_address(self.broker_ip1)
            except ValueError:
                need(False, "brokerIP1", "must be an IPv4 or IPv6 address")
        self._check_tier(need)
        # RocketMQ rounds the ConsumeQueue file size up to whole units; so do we, but say so
        # loudly rather than silently changing the geometry of an existing store.
        need(
            self.mapped_file_size_consume_queue % CQ_UNIT_SIZE == 0,
            "mappedFileSizeConsumeQueue",
            f"must be a multiple of {CQ_UNIT_SIZE} (one ConsumeQueue unit)",
        )

    def _check_tier(self, need: Callable[[bool, str, str], None]) -> None:
        need(
            self.tiered_storage_level in TIER_LEVELS,
            "tieredStorageLevel",
            f"must be one of {', '.join(TIER_LEVELS)}",
        )
        need(
            self.tiered_store_group_commit_timeout >= 1,
            "tieredStoreGroupCommitTimeout",
            "must be >= 1 ms",
        )
        need(
            self.tiered_store_file_reserved_time >= 0,
            "tieredStoreFileReservedTime",
            "must be >= 0 hours (0: the bucket keeps segments for ever)",
        )
        need(
            1 <= self.tiered_store_upload_threads <= MAX_UPLOAD_THREADS,
            "tieredStoreUploadThreads",
            f"must be from 1 to {MAX_UPLOAD_THREADS} (segments uploaded at once)",
        )
        if self.broker_name is not None:
            need(
                _is_key_part(self.broker_name),
                "brokerName",
                "must be a non-empty name without '/' (it is a folder of the bucket's keys)",
            )
        need(
            not self.object_store_prefix.startswith("/"),
            "objectStorePrefix",
            "must not start with '/' (keys are relative to the bucket)",
        )
        if self.object_store_endpoint is not None:
            need(
                self.object_store_endpoint.startswith(("http://", "https://")),
                "objectStoreEndpoint",
                "must be an http:// or https:// URL (e.g. http://127.0.0.1:7480)",
            )
        need(
            (self.object_store_access_key is None) == (self.object_store_secret_key is None),
            "objectStoreAccessKey",
            "objectStoreAccessKey and objectStoreSecretKey are set together or not at all "
            "(prefer AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)",
        )
        if self.tier_on:
            need(
                bool(self.object_store_bucket),
                "objectStoreBucket",
                f"is required with tieredStorageLevel={self.tiered_storage_level}",
            )

    # -- derived values ---------------------------------------------------------------------
    @property
    def tier_on(self) -> bool:
        """Whether sealed segments go to the bucket (tieredStorageLevel is not DISABLE)."""
        return self.tiered_storage_level != TIER_DISABLE

    @property
    def index_file_size(self) -> int:
        return index_file_size(self.max_hash_slot_num, self.max_index_num)

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type == SYNC_FLUSH

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def names(cls) -> list[str]:
        """The RocketMQ names of every setting, in documentation order."""
        return list(_FIELDS)

    def to_rocketmq(self) -> dict[str, Any]:
        """Settings keyed by their RocketMQ names."""
        return {name: getattr(self, attr) for name, (attr, _) in _FIELDS.items()}

    def with_overrides(self, values: Mapping[str, Any], *, strict: bool = True) -> StoreConfig:
        """A copy with the given settings (RocketMQ names) replaced.

        Values may be strings (as from a properties file or a Spark option) or already typed.
        With ``strict``, an unknown name raises :class:`ConfigError`; otherwise it is recorded in
        :attr:`ignored_keys`.
        """
        changes: dict[str, Any] = {}
        ignored = list(self.ignored_keys)
        lowered = {k.lower(): k for k in _FIELDS}
        for key, raw in values.items():
            # Spark hands options over lower-cased; accept any case, as RocketMQ's names are unique
            # case-insensitively.
            name = lowered.get(key.lower())
            if name is None:
                if strict:
                    raise ConfigError(
                        f"unknown store setting {key!r}; known settings: {', '.join(_FIELDS)}"
                    )
                ignored.append(key)
                continue
            attr, typ = _FIELDS[name]
            changes[attr] = _coerce(name, typ, raw)
        changes["ignored_keys"] = tuple(ignored)
        return dataclasses.replace(self, **changes)

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides: Any) -> StoreConfig:
        """Read a ``.toml`` or broker.conf properties file (or the built-in defaults, for
        ``None``)."""
        config = cls()
        if path is not None:
            values, strict = _read_file(Path(path))
            config = config.with_overrides(values, strict=strict)
            config = dataclasses.replace(config, origin=str(path))
        if overrides:
            config = config.with_overrides(overrides)
        return config

    @classmethod
    def effective(cls, path: str | Path | None = None) -> StoreConfig:
        """The settings a tool uses: the file ``path`` when given, else the configuration
        directory's ``store.toml`` when it exists (:func:`default_file`), else the built-in
        defaults. :attr:`origin` says which."""
        return cls.load(path if path is not None else default_file())


def conf_dir() -> Path:
    """The configuration directory: ``$ROCKETSTORE_CONF_DIR`` when set, else ``conf`` in the
    current directory. A variable naming no directory is an error, not a silent default."""
    env = os.environ.get(CONF_DIR_ENV)
    if not env:
        return Path("conf")
    path = Path(env)
    if not path.is_dir():
        raise ConfigError(f"{CONF_DIR_ENV}={env}: no such directory")
    return path


def default_file() -> Path | None:
    """``store.toml`` of the configuration directory, when it exists."""
    path = conf_dir() / DEFAULT_FILE
    return path if path.is_file() else None


def _read_file(path: Path) -> tuple[dict[str, Any], bool]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read store configuration {path}: {exc.strerror}") from exc
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        # Accept both a flat file and one with a [store] table, so the file can grow sections;
        # keys at the top level still count (and an unknown one is still an error).
        store = data.pop("store", None)
        if isinstance(store, dict):
            data.update(store)
        elif store is not None:
            data["store"] = store
        return data, True
    return parse_properties(raw.decode("utf-8", errors="replace"), str(path)), False


def parse_properties(text: str, origin: str = "<properties>") -> dict[str, str]:
    """Parse the subset of Java ``.properties`` syntax broker.conf files use.

    ``key=value`` or ``key: value`` or ``key value``, ``#`` and ``!`` comments, surrounding blanks
    trimmed, backslash line continuations.
    """
    result: dict[str, str] = {}
    logical: list[str] = []
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical.append(line[:-1])
            continue
        logical.append(line)
        entry = "".join(logical)
        logical = []
        # As java.util.Properties: the key ends at the first '=', ':' or blank; blanks and at
        # most one '=' or ':' separate it from the value.
        end = next((k for k, ch in enumerate(entry) if ch in "=: \t\f"), len(entry))
        key, rest = entry[:end], entry[end:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        value = rest
        result[key.strip()] = value.strip()
    if logical:
        raise ConfigError(f"{origin}: file ends inside a continued line")
    return result


def _coerce(name: str, typ: type, raw: Any) -> Any:
    if typ is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise ConfigError(f"{name}={raw!r}: expected true or false")
    if typ is int:
        if isinstance(raw, bool):
            raise ConfigError(f"{name}={raw!r}: expected an integer")
        if isinstance(raw, int):
            return raw
        try:
            return int(str(raw).strip())
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected an integer") from None
    if not isinstance(raw, str | int):
        raise ConfigError(f"{name}={raw!r}: expected a string")
    return str(raw).strip()


def _is_key_part(text: str) -> bool:
    return bool(text) and "/" not in text and text not in (".", "..")


def _is_hour(text: str) -> bool:
    return text.strip().isdigit() and 0 <= int(text) <= 23


def format_host(ip: str, port: int) -> str:
    """``ip:port``, with IPv6 addresses in brackets (``[::1]:5006``)."""
    addr = ipaddress.ip_address(ip)
    if addr.version == 6:
        return f"[{addr.compressed}]:{port}"
    return f"{addr}:{port}"
