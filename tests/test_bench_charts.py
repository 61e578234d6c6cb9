"""The chart step of the benchmarks (``bench/charts.py``, ``bench/chartkit.py``) on small hand-made result files: the
bars and lines carry the values the files hold, the SVGs name what they show and when, and a
missing part is named in the error. No benchmark runs here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from bench import chartkit, charts

MACHINE = {
    "nproc": 2,
    "cpu_model": "Test CPU 3000",
    "mem_total_gib": 7.8,
    "kernel": "6.1.0-test",
    "git_commit": "abc123def456",
}


def spread(median: float, low: float, high: float) -> dict[str, float]:
    return {"median": median, "min": low, "max": high}


def payload(part: str, started: str, n_runs: int = 3, **data: Any) -> dict[str, Any]:
    return {
        "part": part,
        "started_utc": started,
        "duration_s": 125.0,
        "machine": MACHINE,
        "part_load_avg": {"start": [2.5, 2.0, 1.5], "end": [3.5, 2.5, 1.7]},
        "options": {"runs": n_runs, "quick": False, "pin": True, "seed": 1},
        "targets_met": True,
        **data,
    }


STORE = payload(
    "store",
    "2026-11-27T12:40:00+00:00",
    put_small={
        "messages": 1_000_000,
        "body_bytes": 100,
        "encoded_bytes": 269_888_890,
        "store_msgs_per_s": spread(2_500_000, 2_000_000, 2_900_000),
        "store_mb_per_s": spread(675.0, 540.0, 780.0),
        "raw_mb_per_s": spread(3_100.0, 2_900.0, 3_600.0),
        "store_over_raw": spread(0.21, 0.19, 0.25),
    },
    put_large={
        "messages": 100_000,
        "body_bytes": 4096,
        "encoded_bytes": 426_000_000,
        "store_msgs_per_s": spread(500_000, 400_000, 600_000),
        "store_mb_per_s": spread(2_200.0, 1_900.0, 2_400.0),
        "raw_mb_per_s": spread(3_300.0, 3_000.0, 3_500.0),
        "store_over_raw": spread(0.66, 0.6, 0.7),
    },
)
CORE = payload(
    "core",
    "2026-11-27T12:45:00+00:00",
    single={
        "messages": 200_000,
        "put_msgs_per_s": spread(185_000, 170_000, 190_000),
        "write_msgs_per_s": spread(1_050_000, 1_000_000, 1_100_000),
    },
)
ROWS = 5_000_000
SINK = payload(
    "sink",
    "2026-11-27T12:50:00+00:00",
    rows=ROWS,
    # rows/s = 5M / seconds: medians 500k, 600k, 1M, 1.25M, 1.6M, 3.2M rows/s
    wall_s={
        "rocketstore": [10.0, 12.5, 9.0],
        "rocketstore-ds": [25 / 3, 8.0, 9.0],
        "floor-fb": [8.0, 7.0, 9.0],
        "floor-ds": [5.0, 4.0, 6.0],
        "parquet": [3.125, 3.0, 3.5],
        "noop": [1.5625, 1.5, 1.7],
    },
    # CPU s per million rows = CPU s / 5: medians 3.0, 2.4, 2.8, 1.5; the native put 0.7
    cpu_s={
        "rocketstore": [15.0, 14.0, 16.0],
        "rocketstore-ds": [12.0, 12.5, 11.5],
        "floor-fb": [14.0, 13.0, 15.0],
        "floor-ds": [7.5, 7.0, 8.0],
        "parquet": [5.0, 5.0, 5.0],
        "noop": [2.0, 2.0, 2.0],
    },
    native_put_cpu_s=[3.5, 3.0, 4.0],
    load_avg=[1.25, 4.75],
)
BATCH = payload(
    "sink-batch",
    "2026-11-27T12:55:00+00:00",
    batches=6,
    large=500_000,
    ms_per_batch={"parquet": [230.0, 240.0, 220.0], "empty": [270.0], "large": [275.0]},
    loadavg=[[2.0, 2.0, 2.0], [3.0, 2.0, 2.0]],
)
SOURCE = payload(
    "source",
    "2026-11-27T13:00:00+00:00",
    messages=ROWS,
    body_bytes=100,
    runs=[
        {
            "load_avg_before": 2.0,
            "load_avg_after": 2.2,
            "source_cpu_s": 45.0,
            "replay_stream_cpu_s": 40.0,
            "replay_cpu_s": 20.0,
        },
        {
            "load_avg_before": 2.2,
            "load_avg_after": 2.4,
            "source_cpu_s": 50.0,
            "replay_stream_cpu_s": 40.0,
            "replay_cpu_s": 25.0,
        },
    ],
    source_rows_per_s=spread(900_000, 800_000, 1_000_000),
    parquet_rows_per_s=spread(1_700_000, 1_500_000, 1_800_000),
    replay_rows_per_s=spread(1_900_000, 1_800_000, 2_000_000),
    replay_stream_rows_per_s=spread(1_150_000, 1_100_000, 1_200_000),
    source_over_parquet=spread(0.52, 0.5, 0.55),
    source_over_floor=spread(0.77, 0.7, 0.8),
    source_empty_s=spread(0.45, 0.40, 0.60),
    parquet_empty_s=spread(0.30, 0.25, 0.35),
)


def measurement(rate: int, born: list[float], gen: list[float], sustained: bool) -> dict[str, Any]:
    keys = ("p50", "p90", "p99", "max")
    return {
        "rate": rate,
        "born_to_seen_ms": dict(zip(keys, born, strict=True)),
        "gen_to_seen_ms": dict(zip(keys, gen, strict=True)),
        "sustained": sustained,
        "load_before": [2.0, 2.0, 2.0],
        "load_after": [5.0, 3.0, 2.0],
    }


LATENCY = payload(
    "latency",
    "2026-11-27T13:05:00+00:00",
    runs=3,
    steady_rate=10_000,
    steady=[
        measurement(10_000, [150, 400, 500, 700], [650, 900, 1100, 1300], True),
        measurement(10_000, [170, 420, 560, 800], [700, 950, 1150, 1400], True),
        measurement(10_000, [160, 410, 600, 900], [680, 930, 1120, 1350], True),
    ],
    steps=[
        measurement(20_000, [180, 450, 650, 900], [700, 1000, 1200, 1500], True),
        measurement(40_000, [9000, 12000, 15000, 16000], [9500, 13000, 16000, 17000], False),
    ],
    highest_sustained_rate=20_000,
    load_avg_start=[1.0, 1.0, 1.0],
    load_avg_end=[2.0, 2.0, 2.0],
)


def scale_point(queues: int, put: float, verify: float, rocketmq: float | None) -> dict[str, Any]:
    return {
        "queues": queues,
        "messages": 400_000,
        "put_close_s": spread(put, put * 0.9, put * 1.1),
        "open_s": spread(0.01 * queues / 40, 0.005, 0.02 * queues / 40),
        "verify_s": spread(verify, verify, verify),
        "floor_create_s": spread(put / 4, put / 5, put / 3),
        "rocketmq_load_s": None if rocketmq is None else spread(rocketmq, rocketmq, rocketmq),
    }


SCALE = payload(
    "scale",
    "2026-11-27T13:10:00+00:00",
    counts=[40, 4000, 40000],
    by_queues={
        "40": scale_point(40, 0.5, 1.7, 0.37),
        "4000": scale_point(4000, 2.9, 2.0, 0.5),
        # RocketMQ's load failed here: no point of its at 40,000
        "40000": scale_point(40000, 34.0, 6.0, None),
    },
)

TIER = payload(
    "tier",
    "2026-11-27T13:20:00+00:00",
    hot={"ratio": spread(0.76, 0.57, 0.95)},
    cold={
        "spark": {"cold_over_local": 0.6},
        "cold_over_local": spread(0.25, 0.2, 0.3),
        "cold_over_floor": spread(0.35, 0.28, 0.42),
    },
    wide={"amplification": 1.0},
    keys={"query_key_ms": spread(250.0, 200.0, 400.0)},
    bounded={"tier_over_local": 3.0, "seconds": 60.0},
    pace={"pace": 0.855},
)

ALL = {
    "tier": TIER,
    "scale": SCALE,
    "store": STORE,
    "core": CORE,
    "sink": SINK,
    "sink-batch": BATCH,
    "source": SOURCE,
    "latency": LATENCY,
}


def write_results(directory: Path, parts: dict[str, dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for part, data in parts.items():
        (directory / f"{part}-20261127T120000Z.json").write_text(json.dumps(data))
    return directory


def by_gid(fig: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for ax in fig.axes:
        for artist in [*ax.patches, *ax.lines]:
            gid = artist.get_gid()
            if gid:
                assert gid not in found, f"two artists with gid {gid}"
                found[gid] = artist
    return found


THROUGHPUT_BARS = {
    "throughput.put_small.store_mb_per_s": 675.0,
    "throughput.put_small.raw_mb_per_s": 3_100.0,
    "throughput.put_large.store_mb_per_s": 2_200.0,
    "throughput.put_large.raw_mb_per_s": 3_300.0,
    "throughput.put_small.store_msgs_per_s": 2_500_000,
    "throughput.single.put_msgs_per_s": 185_000,
    "throughput.single.write_msgs_per_s": 1_050_000,
    "throughput.rocketmq.batch": 485_000,
    "throughput.rocketmq.single": 297_000,
    "throughput.sink.rocketstore": 500_000,
    "throughput.sink.rocketstore-ds": 600_000,
    "throughput.sink.parquet": 1_600_000,
    "throughput.source.source": 900_000,
    "throughput.source.parquet": 1_700_000,
}
FLOORS_BARS = {
    "floors.sink.rocketstore": 500_000,
    "floors.sink.floor-fb": 625_000,
    "floors.sink.rocketstore-ds": 600_000,
    "floors.sink.floor-ds": 1_000_000,
    "floors.source.source": 900_000,
    "floors.source.replay_stream": 1_150_000,
    "floors.source.replay": 1_900_000,
    "floors.batch.empty": 270.0,
    "floors.batch.large": 275.0,
    "floors.batch.parquet": 230.0,
    "floors.empty.source": 450.0,
    "floors.empty.parquet": 300.0,
    "floors.sink_cpu.rocketstore": 3.0,
    "floors.sink_cpu.floor-fb": 2.8,
    "floors.sink_cpu.rocketstore-ds": 2.4,
    "floors.sink_cpu.floor-ds": 1.5,
    "floors.sink_cpu.native_put": 0.7,
    "floors.source_cpu.source": 9.5,  # (45 + 50) / 2 CPU s over 5M rows
    "floors.source_cpu.replay_stream": 8.0,
    "floors.source_cpu.replay": 4.5,
}


def bar_value(bar: Any) -> float:
    """A bar's length: its width when horizontal (``barh`` pins x at 0), else its height."""
    return float(bar.get_width() if bar.sticky_edges.x else bar.get_height())


@pytest.mark.parametrize(
    ("draw", "expected"),
    [(charts.draw_throughput, THROUGHPUT_BARS), (charts.draw_floors, FLOORS_BARS)],
    ids=["throughput", "floors"],
)
def test_bars_carry_the_results(tmp_path: Path, draw: Any, expected: dict[str, float]) -> None:
    bars = by_gid(draw(write_results(tmp_path / "out", ALL)))
    assert set(expected) <= set(bars), set(expected) - set(bars)
    for gid, value in expected.items():
        assert bar_value(bars[gid]) == pytest.approx(value), gid


def test_latency_bars_and_ramp_carry_the_results(tmp_path: Path) -> None:
    results = write_results(tmp_path / "out", ALL)
    artists = by_gid(charts.draw_latency(results))
    assert artists["latency.born_to_seen_ms.p50"].get_height() == pytest.approx(160)
    assert artists["latency.born_to_seen_ms.p99"].get_height() == pytest.approx(560)
    assert artists["latency.gen_to_seen_ms.max"].get_height() == pytest.approx(1350)
    ramp = artists["latency.ramp.born_to_seen_ms.p50"]
    assert list(ramp.get_xdata()) == [10_000, 20_000, 40_000]
    assert list(ramp.get_ydata()) == pytest.approx([160, 180, 9000])
    assert list(artists["latency.ramp.gen_to_seen_ms.p99"].get_ydata()) == pytest.approx(
        [1120, 1200, 16000]
    )


def test_scale_lines_carry_the_results(tmp_path: Path) -> None:
    artists = by_gid(charts.draw_scale(write_results(tmp_path / "out", ALL)))
    put = next(a for gid, a in artists.items() if gid.endswith(".put_close_s"))
    assert list(put.get_xdata()) == [40, 4000, 40000]
    assert list(put.get_ydata()) == pytest.approx([0.5, 2.9, 34.0])
    rocketmq = next(a for gid, a in artists.items() if gid.endswith(".rocketmq_load_s"))
    assert list(rocketmq.get_xdata()) == [40, 4000], "a failed load draws no point"
    verify = next(a for gid, a in artists.items() if gid.endswith(".verify_s"))
    assert list(verify.get_ydata()) == pytest.approx([1.7, 2.0, 6.0])


def test_tier_bars_are_the_share_of_each_target(tmp_path: Path) -> None:
    bars = by_gid(charts.draw_tier(write_results(tmp_path / "out", ALL)))
    # Measured over asked for; for the limits, the limit over the measurement.
    expected = {
        "tier.hot": 0.76 / 0.95,
        "tier.spark": 0.6 / 0.5,
        "tier.cold": 0.25 / 0.5,
        "tier.floor": 0.35 / 0.7,
        "tier.wide": 2.0 / 1.0,
        "tier.keys": 200.0 / 250.0,
        "tier.bounded": 3.0 / 10.0,
        "tier.pace": 0.855 / 0.95,
    }
    assert {g for g in bars if g.startswith("tier.")} == set(expected)
    for gid, value in expected.items():
        assert bar_value(bars[gid]) == pytest.approx(value), gid


def svg_text(path: Path) -> str:
    """The SVG's text elements, joined (text is kept as text: svg.fonttype none)."""
    body = path.read_text(encoding="utf-8")
    return " ".join(
        re.sub(r"<[^>]+>", "", t) for t in re.findall(r"<text[^>]*>.*?</text>", body, re.S)
    )


def test_svgs_name_what_they_show_and_when(tmp_path: Path) -> None:
    results = write_results(tmp_path / "out", ALL)
    images = tmp_path / "images"
    assert charts.main(["--results", str(results), "--images", str(images)]) == 0
    texts = {name: svg_text(images / f"{name}.svg") for name in charts.CHARTS}
    svgs = {name: (images / f"{name}.svg").read_text(encoding="utf-8") for name in charts.CHARTS}
    for gid in THROUGHPUT_BARS:
        assert f'id="{gid}"' in svgs["throughput"], gid
    for gid in FLOORS_BARS:
        assert f'id="{gid}"' in svgs["floors"], gid
    for name, text in texts.items():
        assert "2 cores (Test CPU 3000)" in text, name
        assert "commit abc123def456" in text, name
    throughput = texts["throughput"]
    assert "raw mmap write of the same bytes" in throughput
    assert "parquet sink" in throughput and "parquet source" in throughput
    assert "RocketMQ 4.9.4 store" in throughput
    assert "1M x 100 B" in throughput and "100k x 4 KiB" in throughput
    # store: the command line's load average around the part, 2.5 and 3.5
    assert "store: 2026-11-27 12:40-12:42 UTC, load average 2.5-3.5, median of 3 runs" in (
        throughput
    )
    # sink: its own samples widen it
    assert "sink: 2026-11-27 12:50-12:52 UTC, load average 1.2-4.8, median of 3 runs" in (
        throughput
    )
    assert "latency: 2026-11-27 13:05-13:07 UTC, load average 1.0-5.0" in texts["latency"]
    assert "not sustained" in texts["latency"]
    assert "p50" in texts["latency"] and "p99" in texts["latency"]
    assert "sink-batch: 2026-11-27 12:55-12:57 UTC, load average 2.0-3.5" in texts["floors"]
    assert "100-row" in texts["floors"] and "its floor" in texts["floors"]
    # the same-run ratios beside the bars: the parts' own, or the medians' as the tables do
    assert "0.21 x raw" in throughput and "0.66 x raw" in throughput
    assert "0.52 x parquet" in throughput  # source_over_parquet
    assert "0.31 x parquet" in throughput  # sink: 500k / 1.6M
    assert "0.80 x floor" in texts["floors"]  # sink: 500k / 625k
    assert "0.77 x floor" in texts["floors"]  # source_over_floor
    assert "1.17 x parquet" in texts["floors"] and "1.02 x empty" in texts["floors"]
    assert "+0.20 over floor" in texts["floors"] and "+0.90 over floor" in texts["floors"]


def test_svg_output_is_stable(tmp_path: Path) -> None:
    results = write_results(tmp_path / "out", ALL)
    first, second = tmp_path / "a", tmp_path / "b"
    charts.main(["latency", "--results", str(results), "--images", str(first)])
    charts.main(["latency", "--results", str(results), "--images", str(second)])
    body = (first / "latency.svg").read_text(encoding="utf-8")
    assert body == (second / "latency.svg").read_text(encoding="utf-8")
    assert "<dc:date>" not in body


def test_newest_results_win(tmp_path: Path) -> None:
    out = write_results(tmp_path / "out", ALL)
    newer = {**LATENCY, "highest_sustained_rate": 40_000}
    (out / "latency-20261127T130000Z.json").write_text(json.dumps(newer))
    # sink-batch's files must not pass for sink's
    (out / "sink-batch-20261128T000000Z.json").write_text(json.dumps(BATCH))
    assert chartkit.newest(out, "latency").name == "latency-20261127T130000Z.json"
    assert chartkit.newest(out, "sink").name == "sink-20261127T120000Z.json"


def test_a_missing_part_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = write_results(tmp_path / "out", {k: v for k, v in ALL.items() if k != "latency"})
    images = tmp_path / "images"
    with pytest.raises(charts.MissingResults, match="no results of bench part 'latency'"):
        charts.draw_latency(results)
    assert charts.main(["--results", str(results), "--images", str(images)]) == 2
    err = capsys.readouterr().err
    assert "no results of bench part 'latency' in " in err
    assert "run `python -m bench latency` first" in err
    assert not images.exists(), "nothing is drawn when a chart's part is missing"
