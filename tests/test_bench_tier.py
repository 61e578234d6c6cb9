"""Smoke test of the ``tier`` benchmark part (bench/tier.py): ``--quick --runs 1`` with a short
upload run, in-process, against the Ceph the part starts itself; it checks the shape of the
results and that every figure was measured, not the speed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.kit.ceph import SKIP, unavailable

ROOT = Path(__file__).resolve().parent.parent

# The part starts a Ceph (as the tier's tests do through their fixture) and processes; its
# code is looked up by name (bench/cli.py), which tests/conftest.py's walk does not follow.
# One Ceph at a time: the group of the tier's tests.
pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("ceph")]


def test_tier_benchmark_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    why = unavailable()
    if why is not None:
        pytest.skip(f"{SKIP} {why}")
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is a directory of the checkout
    from bench.cli import main

    out = tmp_path / "out"
    argv = ["tier", "--quick", "--runs", "1", "--minutes", "0.1", "--out", str(out)]
    assert main(argv) == 0  # without --check: a missed target is a figure, not a failure
    data: dict[str, Any] = json.loads((out / "tier-latest.json").read_text())
    assert not list((out / "tmp").iterdir()), "scratch stores must be removed"
    printed = capsys.readouterr().out
    for label in ("put, tier on", "source read, cold", "one queue of 4000", "key look-up"):
        assert label in printed
    assert set(data["phases"]) == {"hot", "cold", "wide", "keys", "bounded", "pace"}
    for phase in data["phases"].values():
        assert phase["s"] > 0 and phase["load1_start"] >= 0

    hot = data["hot"]
    assert len(hot["runs"]) == 1
    assert hot["ratio_apart"]["median"] > 0 and hot["ratio_shared"]["median"] > 0
    cold = data["cold"]
    assert cold["segments_in_tier"] >= 1 and 0.5 < cold["cold_share"] < 1
    assert cold["cold_over_local"]["median"] > 0 and cold["cold_over_floor"]["median"] > 0
    wide = data["wide"]
    run = wide["runs"][0]
    assert run["rows"] > 0 and run["commitlog_bytes"] >= run["message_bytes"] > 0
    assert data["keys"]["query_key_ms"]["median"] > 0
    bounded = data["bounded"]
    assert bounded["exactly_once"] and bounded["read"] == bounded["acked"] > 0
    assert bounded["tier_bytes"] > 0 and bounded["max_local_bytes"] > 0
    pace = data["pace"]
    assert pace["writer_mb_per_s"] > 0 and pace["samples"]
    # Every row with a target says met or missed.
    assert data["targets_met"] in (True, False)


def test_figures_option_names_the_tier_figures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--figures`` picks the tier part's figures (keys brings the cold read it looks up in);
    an unknown name is a usage error naming the known ones."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.cli import parse_args

    _, options, _ = parse_args(["tier", "--figures", "keys"])
    assert options.figures == ("cold", "keys")
    _, options, _ = parse_args(["tier", "--figures", "pace, hot,pace"])
    assert options.figures == ("pace", "hot")
    assert parse_args(["tier"])[1].figures is None
    with pytest.raises(SystemExit):
        parse_args(["tier", "--figures", "cold,fast"])
    err = capsys.readouterr().err
    assert "--figures: unknown fast" in err and "hot, cold, wide" in err
