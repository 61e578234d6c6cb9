"""The JSON files a RocketMQ 4.9 broker keeps in its store directory's ``config/``
(``topics.json``, ``consumerOffset.json``, ``subscriptionGroup.json``, ...), as its
``ConfigManager`` loads them.

A broker rewrites such a file by writing ``NAME.tmp``, copying the old file to ``NAME.bak``,
deleting ``NAME`` and renaming ``NAME.tmp`` into its place (``MixAll.string2File``). So a reader,
or a crash, between the delete and the rename finds only the ``.bak``, which then holds the
previous, complete state; and the broker's loader reads ``NAME.bak`` when ``NAME`` is missing or
blank (fastjson reads a blank file as nothing). Pure function; thread-safe.
"""

from __future__ import annotations

from pathlib import Path


def load_bytes(config_dir: Path, name: str) -> tuple[Path, bytes] | None:
    """The file a broker's loader would parse for ``config_dir/name`` and its bytes: ``name``,
    or ``name.bak`` when ``name`` is missing or blank; None when neither has content. Raises
    ``OSError`` when one cannot be read."""
    for path in (config_dir / name, config_dir / f"{name}.bak"):
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            continue
        if raw.strip():
            return path, raw
    return None
