"""What the tests share: stores and data to test with, checks, and the machine resources the
tests stand up (GlusterFS volumes, hosts in network namespaces, a FUSE file system, the stock
RocketMQ servers, Prometheus, Spark processes), one module a job.

Tests import it as ``tests.kit.<module>``: pyproject's pytest ``pythonpath`` puts the checkout
on ``sys.path``. A test module imports no other test module: what two of them share is here.
The scripts tests start as processes of their own are in ``tests/procs/`` (:data:`PROCS`).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The checkout."""

PROCS = ROOT / "tests" / "procs"
"""The folder of the scripts tests start as processes of their own (tests/procs/)."""
