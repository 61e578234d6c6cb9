"""Why the first writes into a fresh segment vary from run to run (issue 43).

The store's encoder writes records through a shared mapping of a fresh 1 GiB CommitLog segment
whose blocks ``posix_fallocate`` reserved; every first write into a page is a page fault that
gives the file a page of the page cache. The batch put's time there was seen to vary 2-5 x
from run to run. This part writes the same bytes the same way (1 MiB copies into the mapping,
in order) under each condition the machine can be in when a put starts, alternating them
within each run:

* **after sync**: nothing dirty in the page cache (``sync`` first);
* **after a big write**: :attr:`Sizes.dirty` bytes written to another file just before and not
  synced, as a previous batch of puts leaves them: past the kernel's background threshold
  (``vm.dirty_background_ratio``), so writeback runs meanwhile;
* **populated first**: ``madvise(MADV_POPULATE_WRITE)`` of the region, then the same writes:
  the faults taken ahead of the writes, as a background warmer would (RocketMQ warms a new
  segment), the two timed apart;
* the floor: the same copies into pages already faulted in.

Each figure is the write's rate in MB/s, with the machine's ``Dirty`` and ``Writeback`` at
its start. The method and the figures are in ``bench/README.md``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import os
import time
from pathlib import Path
from typing import Any

from bench.common import Options, PartResult, Row, log, median, scratch_dir, spread, work_dir_notes

SEGMENT = 1 << 30
CHUNK = 1 << 20
MADV_POPULATE_WRITE = 23  # Linux 5.14; Python 3.11's mmap module does not name it
_libc = ctypes.CDLL(None, use_errno=True)


@dataclasses.dataclass(frozen=True)
class Sizes:
    write: int = 256 << 20  # bytes written into the fresh segment
    dirty: int = 4 << 30  # bytes left dirty before the "after a big write" figure


FULL = Sizes()
QUICK = Sizes(write=16 << 20, dirty=32 << 20)


def meminfo() -> dict[str, int]:
    """``Dirty`` and ``Writeback`` of /proc/meminfo, in bytes."""
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Dirty", "Writeback"):
            out[name] = int(rest.split()[0]) * 1024
    return out


def fresh_segment(path: Path) -> tuple[int, mmap.mmap]:
    """A new file of :data:`SEGMENT` bytes, its blocks reserved, mapped shared."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.posix_fallocate(fd, 0, SEGMENT)
    return fd, mmap.mmap(fd, SEGMENT, flags=mmap.MAP_SHARED)


def write_through(mm: mmap.mmap, n: int, chunk: bytes) -> float:
    """Seconds to copy ``n`` bytes into ``mm`` from its start, a chunk at a time."""
    t0 = time.perf_counter()
    for at in range(0, n, CHUNK):
        mm[at : at + CHUNK] = chunk
    return time.perf_counter() - t0


def populate(mm: mmap.mmap, n: int) -> float:
    """Seconds to fault in the first ``n`` bytes of ``mm`` for writing, without writing."""
    holder = (ctypes.c_char * n).from_buffer(mm)
    try:
        t0 = time.perf_counter()
        if _libc.madvise(ctypes.c_void_p(ctypes.addressof(holder)), n, MADV_POPULATE_WRITE):
            raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")
        return time.perf_counter() - t0
    finally:
        del holder


def leave_dirty(path: Path, n: int, chunk: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(0, n, CHUNK):
            os.write(fd, chunk)
    finally:
        os.close(fd)


def one_run(work: Path, sizes: Sizes, run: int, chunk: bytes) -> dict[str, dict[str, Any]]:
    """Each condition once, in an order that turns from run to run."""
    conditions = ["sync", "dirty", "populated"]
    k = run % len(conditions)
    out: dict[str, dict[str, Any]] = {}
    for name in conditions[k:] + conditions[:k]:
        if name == "dirty":
            leave_dirty(work / "filler", sizes.dirty, chunk)
        else:
            os.sync()
        state = meminfo()
        fd, mm = fresh_segment(work / f"seg-{run}-{name}")
        try:
            took = populate(mm, sizes.write) if name == "populated" else None
            seconds = write_through(mm, sizes.write, chunk)
            row: dict[str, Any] = {"seconds": seconds, **state}
            if took is not None:
                row["populate_seconds"] = took
            out[name] = row
            if name == "sync":  # the floor: the same pages again, faulted in now
                out["floor"] = {"seconds": write_through(mm, sizes.write, chunk)}
        finally:
            mm.close()
            os.close(fd)
            (work / f"seg-{run}-{name}").unlink()
    (work / "filler").unlink(missing_ok=True)
    return out


def run(options: Options) -> PartResult:
    sizes = QUICK if options.quick else FULL
    notes = work_dir_notes(options.work_dir, "firsttouch")
    chunk = os.urandom(CHUNK)
    runs: list[dict[str, dict[str, Any]]] = []
    with scratch_dir(options.work_dir, "firsttouch-") as work:
        for i in range(options.runs):
            log(f"firsttouch: run {i + 1} of {options.runs}")
            runs.append(one_run(work, sizes, i, chunk))
    mb = sizes.write / 1e6

    def rates(name: str, key: str = "seconds") -> list[float]:
        return [mb / r[name][key] for r in runs]

    floor = median(rates("floor"))
    after_sync = median(rates("sync"))
    rows = []
    for name, label in (
        ("sync", "first writes into a fresh segment, after sync"),
        ("dirty", f"the same, right after {sizes.dirty >> 20} MiB written and not synced"),
        ("populated", "the same writes after MADV_POPULATE_WRITE (the faults taken before)"),
    ):
        s = spread(rates(name))
        rows.append(
            Row(
                label,
                "MB/s",
                s["median"],
                s["min"],
                s["max"],
                "after sync",
                s["median"] / after_sync,
            )
        )
    s = spread(rates("populated", "populate_seconds"))
    rows.append(Row("MADV_POPULATE_WRITE itself", "MB/s", s["median"], s["min"], s["max"]))
    s = spread(rates("floor"))
    rows.append(
        Row(
            "the same writes into pages already faulted in", "MB/s", s["median"], s["min"], s["max"]
        )
    )
    sysctl = {
        name: int(Path(f"/proc/sys/vm/{name}").read_text())
        for name in ("dirty_ratio", "dirty_background_ratio", "dirty_expire_centisecs")
    }
    notes.append(f"first writes after sync run at {after_sync / floor:.2f} x the floor")
    return PartResult(
        "firsttouch",
        rows,
        {"sizes": dataclasses.asdict(sizes), "runs": runs, "vm": sysctl},
        notes,
    )
