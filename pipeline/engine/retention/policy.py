"""When retention deletes files (:mod:`rocketstore.pipeline.engine.retention.service`): RocketMQ 4.9.x's
thresholds and per-run limits, the policy a store's settings give, the triggers that start a
deletion and the reasons a file goes, and the disk measures it decides by.

Pure values and functions; thread-safe.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import ConfigError

CLEAN_FORCIBLY_RATIO = 0.85  # diskSpaceCleanForciblyRatio
WARNING_LEVEL_RATIO = 0.90  # diskSpaceWarningLevelRatio
DELETE_FILES_BATCH_MAX = 10  # MappedFileQueue.DELETE_FILES_BATCH_MAX
RUN_INTERVAL_MS = 10_000  # cleanResourceInterval
HOUR_MS = 3_600_000

REASON_EXPIRED = "expired"
REASON_DISK_PRESSURE = "disk-pressure"
REASON_FORCED = "forced"
REASON_BELOW_MIN_OFFSET = "below-min-offset"

TRIGGER_DELETE_WHEN = "delete-when"
TRIGGER_MANUAL = "manual"
TRIGGER_DISK_RATIO = "disk-ratio"
TRIGGER_FORCIBLY = "forcibly"

KIND_COMMITLOG = "commitlog"
KIND_CONSUMEQUEUE = "consumequeue"
KIND_INDEX = "index"


def statvfs_used_ratio(path: Path) -> float:
    """Used share (0..1) of the filesystem holding ``path``, as Java's ``File`` reports it
    (``(total - free) / total``, root's reserve counted as used); -1 if the size is unknown."""
    st = os.statvfs(path)
    if st.f_blocks <= 0:
        return -1.0
    return (st.f_blocks - st.f_bfree) / st.f_blocks


def statvfs_total_bytes(path: Path) -> int:
    """Size in bytes of the filesystem holding ``path``."""
    st = os.statvfs(path)
    return int(st.f_blocks * st.f_frsize)


def parse_delete_when(text: str) -> tuple[int, ...]:
    """``"04;16"`` -> ``(4, 16)`` (RocketMQ's ``deleteWhen``)."""
    hours: list[int] = []
    for part in text.split(";"):
        p = part.strip()
        if not p.isdigit() or not 0 <= int(p) <= 23:
            raise ConfigError(f"deleteWhen={text!r}: must be hours 00-23 separated by ';'")
        hours.append(int(p))
    return tuple(hours)


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    """When files go. Ratios are fractions (0..1); :meth:`from_config` converts RocketMQ's."""

    file_reserved_time: int = 72  # hours (fileReservedTime)
    delete_when: tuple[int, ...] = (4,)  # local hours (deleteWhen)
    disk_max_used_space_ratio: float = 0.75  # diskMaxUsedSpaceRatio / 100
    clean_forcibly_ratio: float = CLEAN_FORCIBLY_RATIO
    warning_level_ratio: float = WARNING_LEVEL_RATIO
    clean_file_forcibly_enable: bool = True  # cleanFileForciblyEnable
    max_files_per_run: int = DELETE_FILES_BATCH_MAX  # CommitLog segments per run
    max_derived_files_per_run: int = 1000  # ConsumeQueue + index files per run
    max_queues_per_run: int = 4096  # ConsumeQueues looked at per run

    def __post_init__(self) -> None:
        if self.file_reserved_time < 0:
            raise ConfigError(f"fileReservedTime={self.file_reserved_time}: must be >= 0 hours")
        if not self.delete_when or any(not 0 <= h <= 23 for h in self.delete_when):
            raise ConfigError(f"deleteWhen={self.delete_when}: must be hours 0-23")
        for name in ("disk_max_used_space_ratio", "clean_forcibly_ratio", "warning_level_ratio"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"{name}={value}: must be a fraction in (0, 1]")
        if min(self.max_files_per_run, self.max_derived_files_per_run, self.max_queues_per_run) < 1:
            raise ConfigError(
                "max_files_per_run, max_derived_files_per_run and max_queues_per_run must be >= 1"
            )

    @classmethod
    def from_config(cls, config: StoreConfig, **overrides: Any) -> RetentionPolicy:
        """The policy a store's settings give (``fileReservedTime``, ``deleteWhen``,
        ``diskMaxUsedSpaceRatio``), with any field replaced by ``overrides``."""
        values: dict[str, Any] = {
            "file_reserved_time": config.file_reserved_time,
            "delete_when": parse_delete_when(config.delete_when),
            "disk_max_used_space_ratio": config.disk_max_used_space_ratio / 100.0,
        }
        values.update(overrides)
        return cls(**values)

    @property
    def reserved_ms(self) -> int:
        return self.file_reserved_time * HOUR_MS

    def is_delete_hour(self, now_ms: int) -> bool:
        """Whether the local hour of ``now_ms`` is one of ``deleteWhen``'s."""
        return time.localtime(now_ms // 1000).tm_hour in self.delete_when
