"""Failpoints: named steps of the write path where a test can make the store fail.

Each write step calls :func:`hit` with its name before it changes anything on disk:

============================ ==================================================================
``segment-create``           creating a CommitLog, ConsumeQueue or index file
``reserve``                  reserving blocks of a file ahead of writes (``posix_fallocate``)
``commitlog-write``          writing a run of records into a CommitLog segment
``consumequeue-append``      appending units to one ConsumeQueue
``index-put``                adding entries to an IndexFile
``flush``                    msync of the store's files
``progress-write``           writing ``config/rocketstore.json``
``checkpoint-write``         writing ``checkpoint``
``derived-renew``            renaming a derived file's copy over it (rocketstore.pipeline.engine.renewal)
============================ ==================================================================

A test arms a failpoint with :func:`arm` (in-process) or with the environment variable
``ROCKETSTORE_FAILPOINTS="name=action[@n],..."`` (read once at import, for writer subprocesses),
where ``action`` is ``raise`` (:class:`InjectedFault`, an ``OSError``), ``kill`` (SIGKILL of
the process, as a crash at that exact point) or ``stop`` (SIGSTOP of the process, a pause at
that point until SIGCONT), fired on the ``n``-th hit (default 1), once per process. With
``ROCKETSTORE_FAILPOINTS_LOG=FILE`` a failpoint fires once across every process that shares
FILE (Spark's Python workers, where a retried task may run in a fresh process): each firing
appends a line to FILE, and a failpoint FILE already names stays quiet.

Not a user option: nothing in the sink, the source or the CLI exposes it. Unarmed, a hit costs
one lookup in an empty dict. Thread-safe enough for tests: arming is not synchronised.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import signal

ENV = "ROCKETSTORE_FAILPOINTS"
LOG_ENV = "ROCKETSTORE_FAILPOINTS_LOG"
NAMES = (
    "segment-create",
    "reserve",
    "commitlog-write",
    "consumequeue-append",
    "index-put",
    "flush",
    "progress-write",
    "checkpoint-write",
    "derived-renew",
)


ACTIONS = ("raise", "kill", "stop")


class InjectedFault(OSError):
    """The I/O error an armed failpoint raises."""


@dataclasses.dataclass
class _Armed:
    action: str
    after: int
    hits: int = 0


_armed: dict[str, _Armed] = {}


def arm(name: str, action: str = "raise", nth: int = 1) -> None:
    """Make the ``nth`` next hit of ``name`` fail with ``action`` (``raise`` or ``kill``), or
    pause there (``stop``: the process stops itself with SIGSTOP, as a stunned VM or a starved
    executor would, and goes on where it was when it gets SIGCONT)."""
    if name not in NAMES:
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(NAMES)}")
    if action not in ACTIONS:
        raise ValueError(f"failpoint action must be one of {', '.join(ACTIONS)}, got {action!r}")
    if nth < 1:
        raise ValueError(f"failpoint hit number must be >= 1, got {nth}")
    _armed[name] = _Armed(action, nth)


def disarm_all() -> None:
    _armed.clear()


def armed() -> bool:
    """Whether any failpoint is armed (a write path that fuses steps splits them then)."""
    return bool(_armed)


def hit(name: str) -> None:
    """Fail here if a test armed ``name``; otherwise do nothing."""
    if not _armed:
        return
    armed = _armed.get(name)
    if armed is None:
        return
    armed.hits += 1
    if armed.hits < armed.after:
        return
    del _armed[name]
    log = os.environ.get(LOG_ENV)
    if log:
        with open(log, "a+", encoding="utf-8") as out:
            out.seek(0)
            if any(line.split(" ", 1)[0] == name for line in out):
                return  # fired already, in another process
            out.write(f"{name} {armed.action} pid={os.getpid()}\n")
    if armed.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if armed.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    raise InjectedFault(errno.EIO, f"injected fault at failpoint {name!r}")


def _from_env(text: str) -> None:
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, spec = item.partition("=")
        action, _, nth = spec.partition("@")
        arm(name, action or "raise", int(nth) if nth else 1)


if os.environ.get(ENV):
    _from_env(os.environ[ENV])
