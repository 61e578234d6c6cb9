"""A directory's files as one value, to compare before and after a step: what it wrote, and
what it left alone."""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from pathlib import Path
from typing import NamedTuple


class Entry(NamedTuple):
    """One entry of a :func:`snapshot`."""

    size: int | None
    """A file's size; a directory's only when times are taken (it moves with its entries)."""
    mtime_ns: int | None
    """The modification time, when times are taken (None for names in ``untimed``)."""
    sha256: str
    """A file's bytes, hashed; ``"/"`` for a directory."""


def snapshot(
    root: Path,
    *,
    skip: Collection[str] = (),
    dirs: bool = False,
    times: bool = False,
    untimed: Collection[str] = (),
) -> dict[str, Entry]:
    """Every file under ``root`` by its name relative to ``root``: its size and a hash of its
    bytes, so that two snapshots are equal exactly when no byte changed.

    ``skip``: names (at any depth) left out, such as the ``lock`` file that a writable open
    rewrites or the ``abort`` file that only an open store has. ``dirs``: directories too (so
    a directory added or removed shows). ``times``: modification times too, and directories'
    sizes, so that even a rewrite of the same bytes shows; except for the names in
    ``untimed``, whose bytes still count.
    """
    out: dict[str, Entry] = {}
    for p in sorted(root.rglob("*")):
        if p.name in skip:
            continue
        if p.is_dir():
            if not dirs:
                continue
            digest = "/"
        elif p.is_file():
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            continue
        st = p.stat()
        timed = times and p.name not in untimed
        out[str(p.relative_to(root))] = Entry(
            st.st_size if times or digest != "/" else None,
            st.st_mtime_ns if timed else None,
            digest,
        )
    return out
