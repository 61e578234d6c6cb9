"""``rocketstore lag``: a Spark checkpoint's committed rocketstore offsets against the store.

The unit tests build checkpoint directories by hand in the layout Spark 4 writes them
(``offsets/N``: version line, batch metadata line, one line per source; ``commits/N``); the last
test reads the checkpoint of a real streaming query.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools import lag
from tests.kit.fixtures import SMALL_CONFIG

SMALL_TOML = """\
mappedFileSizeCommitLog = 1048576
mappedFileSizeConsumeQueue = 6000
maxHashSlotNum = 1000
maxIndexNum = 4000
"""
METADATA = {"batchWatermarkMs": 0, "batchTimestampMs": 1700000000000, "conf": {"a": "1"}}


def fill(broker_dir: Path, counts: dict[tuple[str, int], int]) -> None:
    """Append ``counts[(topic, queue)]`` messages to each queue of one broker directory."""
    with MessageStore(broker_dir, SMALL_CONFIG) as store:
        for (topic, qid), n in counts.items():
            store.put_batch(
                [Message(topic, f"{topic}-{qid}-{i}".encode(), queue_id=qid) for i in range(n)]
            )


def write_batch(checkpoint: Path, batch: int, *sources: object, commit: bool) -> None:
    """``offsets/<batch>`` with one line per source (``None`` = ``-``), and ``commits/<batch>``."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps(METADATA)]
    lines += ["-" if s is None else json.dumps(s) for s in sources]
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines))
    # Spark leaves checksum files beside each entry; they must not be taken for batches.
    (checkpoint / "offsets" / f".{batch}.crc").write_bytes(b"crc")
    if commit:
        (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A store root of two brokers: topic orders has queues 0-1 on each; topic other too."""
    root = tmp_path / "root"
    fill(root / "broker-0", {("orders", 0): 5, ("orders", 1): 3, ("other", 0): 2})
    fill(root / "broker-1", {("orders", 0): 4, ("orders", 1): 6})
    return root


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(SMALL_TOML)
    return path


def lag_json(capsys: pytest.CaptureFixture[str], *argv: object) -> list[dict[str, Any]]:
    rc, out, err = run(capsys, "lag", *argv, "--json")
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_last_committed_batch_is_read_and_other_sources_skipped(
    capsys: pytest.CaptureFixture[str], root: Path, config: Path, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    write_batch(ck, 0, {"logOffset": 0}, {"orders": {"broker-0": {"0": 1}}}, commit=True)
    write_batch(
        ck,
        1,
        {"logOffset": 3},
        {"orders": {"broker-0": {"0": 4, "1": 3}, "broker-1": {"0": 1, "1": 2}}},
        7,
        commit=True,
    )
    # Planned but not committed: its offsets are not progress yet.
    write_batch(ck, 2, None, {"orders": {"broker-0": {"0": 5}}}, commit=False)

    rows = lag_json(capsys, root, "--checkpoint", ck, "--config", config)
    got = {
        (r["brokerName"], r["queueId"]): (r["committedOffset"], r["maxOffset"], r["lag"])
        for r in rows
    }
    assert got == {
        ("broker-0", 0): (4, 5, 1),
        ("broker-0", 1): (3, 3, 0),
        ("broker-1", 0): (1, 4, 3),
        ("broker-1", 1): (2, 6, 4),
    }
    assert {r["topic"] for r in rows} == {"orders"}
    assert {r["batchId"] for r in rows} == {1}

    rc, out, _ = run(capsys, "lag", root, "--checkpoint", ck, "--config", config)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "topic",
        "brokerName",
        "queueId",
        "committedOffset",
        "maxOffset",
        "lag",
    ]
    assert lines[1].split() == ["orders", "broker-0", "0", "4", "5", "1"]
    assert lines[-1] == "batch 1 committed; total lag 8 message(s) in 4 queue(s)"


def test_a_checkpoint_and_the_groups_open_each_broker_once(
    capsys: pytest.CaptureFixture[str],
    root: Path,
    config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both sections (the query's, then every group's) are computed from one read of each
    broker: a root of many brokers costs one read-only open per broker, not one per section."""
    ck = tmp_path / "ck"
    write_batch(ck, 0, {"orders": {"broker-0": {"0": 4}, "broker-1": {"1": 2}}}, commit=True)
    (root / "broker-1" / "config" / "consumerOffset.json").write_text(
        '{"offsetTable":{"orders@billing":{0:1},"other@audit":{0:0}}}'
    )
    opened: list[str] = []

    class Counted(MessageStore):
        def __init__(self, path: Path, *args: Any, **kwargs: Any) -> None:
            opened.append(Path(path).name)
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr("rocketstore.pipeline.tools.lag.MessageStore", Counted)
    asked: list[object] = []
    real_bounds = lag.store_bounds

    def recorded(config: StoreConfig, topics: Any = None) -> lag.BoundsReader:
        asked.append(topics)
        return real_bounds(config, topics)

    monkeypatch.setattr(lag, "store_bounds", recorded)
    rows = lag_json(capsys, root, "--checkpoint", ck, "--config", config)
    assert sorted(opened) == ["broker-0", "broker-1"]
    # The queues of the topics shown: the query's and the groups'.
    assert asked == [{"orders", "other"}]
    query = [r for r in rows if "group" not in r]
    groups = {
        (r["group"], r["topic"], r["brokerName"], r["queueId"]): r["lag"]
        for r in rows
        if "group" in r
    }
    assert sum(r["lag"] for r in query) == (5 - 4) + (3 - 0) + (4 - 0) + (6 - 2)
    assert groups == {
        ("audit", "other", "broker-0", 0): 2,
        ("audit", "other", "broker-1", 0): 0,  # committed 0 where the topic has no queue
        ("billing", "orders", "broker-0", 0): 5,
        ("billing", "orders", "broker-0", 1): 3,
        ("billing", "orders", "broker-1", 0): 3,
        ("billing", "orders", "broker-1", 1): 6,
    }
    opened.clear()
    lag_json(capsys, root, "--checkpoint", ck, "--config", config, "--topic", "orders")
    assert sorted(opened) == ["broker-0", "broker-1"] and asked[-1] == {"orders"}


def test_queues_the_checkpoint_does_not_name_count_from_their_min_offset(
    capsys: pytest.CaptureFixture[str], root: Path, config: Path, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    # broker-9 is gone from the store: still listed, with no max offset.
    write_batch(ck, 0, {"orders": {"broker-0": {"0": 5}, "broker-9": {"0": 3}}}, commit=True)
    rows = lag_json(capsys, root, "--checkpoint", ck, "--config", config)
    got = {
        (r["brokerName"], r["queueId"]): (r["committedOffset"], r["maxOffset"], r["lag"])
        for r in rows
    }
    assert got == {
        ("broker-0", 0): (5, 5, 0),
        ("broker-0", 1): (None, 3, 3),
        ("broker-1", 0): (None, 4, 4),
        ("broker-1", 1): (None, 6, 6),
        ("broker-9", 0): (3, None, None),
    }


def test_topic_option_and_a_checkpoint_with_nothing_committed(
    capsys: pytest.CaptureFixture[str], root: Path, config: Path, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    write_batch(ck, 0, {"other": {"broker-0": {"0": 0}}}, commit=False)
    rc, _, err = run(capsys, "lag", root, "--checkpoint", ck, "--config", config)
    assert rc == 2
    assert "has not committed a batch yet" in err and "--topic" in err

    rows = lag_json(capsys, root, "--checkpoint", ck, "--config", config, "--topic", "other")
    assert [(r["brokerName"], r["queueId"], r["committedOffset"], r["lag"]) for r in rows] == [
        ("broker-0", 0, None, 2)
    ]
    rc, out, _ = run(
        capsys, "lag", root, "--checkpoint", ck, "--config", config, "--topic", "other"
    )
    assert out.splitlines()[-1] == "no batch committed yet; total lag 2 message(s) in 1 queue(s)"


def test_single_store_directory_is_one_broker_named_after_it(
    capsys: pytest.CaptureFixture[str], root: Path, config: Path, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    write_batch(ck, 3, {"other": {"broker-0": {"0": 1}}}, commit=True)
    rows = lag_json(capsys, root / "broker-0", "--checkpoint", f"file://{ck}", "--config", config)
    assert [
        (r["brokerName"], r["queueId"], r["committedOffset"], r["maxOffset"]) for r in rows
    ] == [("broker-0", 0, 1, 2)]


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda ck: ck.mkdir(), "not a Spark streaming checkpoint"),
        (
            lambda ck: write_batch(ck, 0, {"logOffset": 0}, 12, commit=True),
            "no rocketstore source offsets",
        ),
    ],
)
def test_bad_checkpoints_fail_with_one_line(
    capsys: pytest.CaptureFixture[str],
    root: Path,
    config: Path,
    tmp_path: Path,
    make: Any,
    needle: str,
) -> None:
    ck = tmp_path / "ck"
    make(ck)
    rc, out, err = run(capsys, "lag", root, "--checkpoint", ck, "--config", config)
    assert rc == 2 and out == ""
    assert err.startswith("rocketstore: error: ") and err.count("\n") == 1
    assert needle in err


def test_store_that_is_not_a_store(
    capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    write_batch(ck, 0, {"orders": {"broker-0": {"0": 1}}}, commit=True)
    (tmp_path / "empty").mkdir()
    rc, _, err = run(capsys, "lag", tmp_path / "empty", "--checkpoint", ck, "--config", config)
    assert rc == 2 and "neither a store root" in err
