"""The stores Apache RocketMQ 4.9.4 wrote (``../shared/fixtures/rocketmq-4.9.4``, beside the
clone) and the geometry they were written with.

A test that reads one is marked ``fixtures`` (``-m "not fixtures"`` must leave out every test
that reads ../shared): :func:`fixture_dir` fails a test that forgets the marker, and skips,
saying why, where ../shared is absent. tests/conftest.py keeps :data:`running` up to date.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from tests.kit import ROOT

FIXTURES = ROOT.parent / "shared" / "fixtures" / "rocketmq-4.9.4"

# The geometry the fixture stores were written with (their README).
FIXTURE_CONFIG = StoreConfig(
    mapped_file_size_commitlog=1_048_576,
    mapped_file_size_consume_queue=6000,
    max_hash_slot_num=1000,
    max_index_num=4000,
)
SMALL_CONFIG = FIXTURE_CONFIG

running: list[pytest.Item] = []
"""The tests running now, the innermost last: which test asks :func:`fixture_dir`."""


def fixture_dir(name: str) -> Path:
    # `-m "not fixtures"` must leave out every test that reads ../shared; a test that forgets
    # the marker fails here rather than slipping through.
    if running and running[-1].get_closest_marker("fixtures") is None:
        pytest.fail(f"{running[-1].nodeid} reads the fixture store {name!r}: mark it fixtures")
    path = FIXTURES / name
    if not (path / "store").is_dir():
        pytest.skip(
            f"RocketMQ 4.9.4 fixture '{name}' not found at {path}: these tests need ../shared "
            "beside the clone (as CI has it)"
        )
    return path
