"""The ``rocketstore`` command line in a process of its own, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from tests.kit import ROOT


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``rocketstore ARGS`` (``python -m rocketstore.pipeline.cli``) run from the checkout, its
    output captured as text; a failed exit status is returned, not raised."""
    return subprocess.run(
        [sys.executable, "-m", "rocketstore.pipeline.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
