"""The demo's working directory: where each part of a run lives, and the marker file that says
what the demo made there, so that a rerun and ``make clean`` remove that and nothing else.

Driver only; no Spark. Used by :mod:`rocketstore.jobs.demo` (which prepares the directory) and
:mod:`rocketstore.jobs.demo_summary` (which reads what the run left there).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rocketstore.jobs.common import JobError

MARKER = ".rocketstore-demo"


class Paths:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.incoming = root / "incoming"
        self.store = root / "store"
        self.checkpoints = root / "checkpoints"
        self.export_orders = root / "export" / "orders"
        self.export_stats = root / "export" / "order-stats"

        self.marker = root / MARKER

    def made(self) -> list[Path]:
        """Everything a run creates under the root (besides the marker)."""
        return [self.incoming, self.store, self.checkpoints, self.root / "export"]

    def prepare(self) -> None:
        """Make the root ready for a run, removing what an earlier run made there and nothing
        else; raises :class:`~rocketstore.jobs.common.JobError` when a name the demo uses is taken by
        something the demo did not make (no marker)."""
        present = [p for p in self.made() if p.exists() or p.is_symlink()]
        if present and not self.marker.is_file():
            raise JobError(
                f"--dir {self.root}: {', '.join(p.name for p in present)} not made by a demo run "
                f"(no {MARKER} file there); choose another --dir, or move them away"
            )
        for old in present:
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
        self.root.mkdir(parents=True, exist_ok=True)
        # Written before anything else, so a run that dies half way is still known as the
        # demo's; `make clean` deletes the names listed here.
        names = "".join(f"{p.name}\n" for p in self.made())
        self.marker.write_text(
            f"# made by `make demo` (jobs/demo.py); removed by `make clean`\n{names}"
        )
        self.incoming.mkdir()
