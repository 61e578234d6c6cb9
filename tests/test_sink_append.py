"""Exactly-once appends of one writer's rows to one broker (engine only, no Spark)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import (
    InvalidMessageError,
    SinkFailpoint,
    SinkReplayError,
    StoreLockedError,
)
from rocketstore.sink.append import (
    FAILPOINT_ENV,
    append,
    landed_prefix,
    search_bound,
    sink_fingerprint,
    uniq_keys,
)
from tests.kit.appendrows import CONFIG, FP, rows, stored

ROOT = Path(__file__).resolve().parent.parent


def run(path: Path, table: pa.Table, **kw: object) -> object:
    args: dict[str, object] = {"sink_fp": FP, "batch_id": 7, "slot": 2, "lock_timeout_ms": 5000}
    args.update(kw)
    return append(path, CONFIG, table, **args)  # type: ignore[arg-type]


def test_uniq_key_layout() -> None:
    keys = uniq_keys(bytes.fromhex("01020304"), 0x0A0B0C0D0E, 0x112233, 3).to_pylist()
    assert keys == ["01020304" + "0A0B0C0D0E" + "112233" + f"{i:08X}" for i in range(3)]


def test_rerun_of_a_landed_batch_appends_nothing(tmp_path: Path) -> None:
    path = tmp_path / "broker-0"
    first = run(path, rows(50))
    again = run(path, rows(50))
    assert (first.appended, first.skipped) == (50, 0)  # type: ignore[attr-defined]
    assert (again.appended, again.skipped) == (0, 50)  # type: ignore[attr-defined]
    assert stored(path) == [b"body-%d" % i for i in range(50)]


@pytest.mark.parametrize("landed", [0, 1, 17, 49, 50])
def test_rerun_appends_exactly_what_did_not_land(tmp_path: Path, landed: int) -> None:
    path = tmp_path / "broker-0"
    with MessageStore(path, CONFIG, create=True) as s:
        s.put_batch(rows(5, 1000, topic="other"))  # someone else's messages, before ours
        prefix = rows(50).slice(0, landed)
        s.put_batch(prefix.append_column("uniqKey", uniq_keys(FP, 7, 2, 50)[:landed]))
    result = run(path, rows(50))
    assert result.skipped == landed  # type: ignore[attr-defined]
    assert stored(path) == [b"body-%d" % i for i in range(50)]


def test_other_batches_and_slots_are_not_mistaken_for_this_one(tmp_path: Path) -> None:
    path = tmp_path / "broker-0"
    run(path, rows(10), batch_id=6)
    run(path, rows(10), slot=3)
    run(path, rows(10), sink_fp=sink_fingerprint("query-2"))
    assert run(path, rows(10)).skipped == 0  # type: ignore[attr-defined]
    assert len(stored(path)) == 40


def test_replay_with_different_rows_fails(tmp_path: Path) -> None:
    path = tmp_path / "broker-0"
    run(path, rows(10))
    with pytest.raises(SinkReplayError, match="deterministic"):
        run(path, rows(10, start=500))
    assert len(stored(path)) == 10


def test_failed_attempt_leaves_a_prefix_the_retry_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "broker-0"
    log = tmp_path / "fired"
    monkeypatch.setenv(FAILPOINT_ENV, f"after_chunk:2:{log}")
    with pytest.raises(SinkFailpoint):
        run(path, rows(100), chunk_rows=30, attempt=0)
    assert len(log.read_text().splitlines()) == 1
    assert stored(path) == [b"body-%d" % i for i in range(60)]
    retry = run(path, rows(100), chunk_rows=30, attempt=1)  # retries: the failpoint is off
    assert (retry.skipped, retry.appended) == (60, 40)  # type: ignore[attr-defined]
    assert stored(path) == [b"body-%d" % i for i in range(100)]
    assert len(log.read_text().splitlines()) == 1


def test_failpoint_is_not_a_sink_option(tmp_path: Path) -> None:
    from rocketstore.pipeline.errors import ConfigError
    from rocketstore.sink.settings import SINK_OPTIONS, SinkSettings

    assert "failpoint" not in SINK_OPTIONS
    with pytest.raises(ConfigError, match="unknown store setting 'failpoint'"):
        SinkSettings.from_options({"path": str(tmp_path), "failpoint": "after_chunk:1:x"})


def test_bad_row_in_a_later_chunk_refuses_the_whole_append(tmp_path: Path) -> None:
    path = tmp_path / "broker-0"
    table = rows(100)
    bodies = table.column("body").to_pylist()
    bodies[95] = None
    table = table.set_column(1, "body", pa.array(bodies, pa.binary()))
    with pytest.raises(InvalidMessageError, match="body is null"):
        run(path, table, chunk_rows=30)
    with MessageStore(path, CONFIG, read_only=True) as s:
        assert s.max_phy_offset == 0


def test_landed_prefix_by_binary_search(tmp_path: Path) -> None:
    path = tmp_path / "broker-0"
    keys = uniq_keys(FP, 1, 0, 1000)
    with MessageStore(path, CONFIG, create=True) as s:
        s.put_batch(rows(1000).slice(0, 613).append_column("uniqKey", keys[:613]))
        assert landed_prefix(s, pa.array(["orders"] * 1000), keys) == 613


def note_of(path: Path, fp: bytes = FP) -> list[int] | None:
    with MessageStore(path, CONFIG, read_only=True) as s:
        return s.note("sink." + fp.hex())


@pytest.mark.parametrize(
    ("note", "batch", "bound"),
    [
        (None, 5, 0),
        ([4, 900, 300], 5, 900),  # an earlier batch: its attempts ended where this one starts
        ([4, 900, 300], 9, 900),
        ([5, 900, 300], 5, 300),  # this batch: another attempt or slot began from 300
        ([6, 900, 300], 5, 0),  # a later batch (a stray attempt of an old one): search it all
        ([4, 900], 5, 0),  # not a note this sink writes
    ],
)
def test_search_bound(note: list[int] | None, batch: int, bound: int) -> None:
    assert search_bound(note, batch) == bound


def test_note_moves_forward_with_the_batches_and_is_durable(tmp_path: Path) -> None:
    path = tmp_path / "broker-0"
    run(path, rows(10), batch_id=3)
    assert note_of(path) == [3, 0, 0]
    with MessageStore(path, CONFIG, read_only=True) as s:
        end_of_3 = s.max_phy_offset
    run(path, rows(10, start=10), batch_id=4)
    assert note_of(path) == [4, end_of_3, 0]
    run(path, rows(10, start=10), batch_id=4, slot=5)  # another slot of the same batch
    assert note_of(path) == [4, end_of_3, 0]
    run(path, rows(10, start=20), batch_id=2)  # a stray attempt of an old batch
    assert note_of(path) == [4, end_of_3, 0]
    assert note_of(path, sink_fingerprint("query-2")) is None
    assert len(stored(path)) == 40


def test_a_later_batch_reads_only_the_index_files_that_reach_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rocketstore.pipeline.files.indexfile import IndexFile

    path = tmp_path / "broker-0"
    for batch in range(4):  # 1,500 entries a batch (key + UNIQ_KEY): files of 4,096 fill up
        run(path, rows(750, start=750 * batch), batch_id=batch)
    with MessageStore(path, CONFIG, read_only=True) as s:
        assert s.index is not None
        files = [(f.path.name, f.end_phy_offset) for f in s.index.files]
        bound = s.note("sink." + FP.hex())
    assert len(files) >= 2 and bound is not None
    consulted: set[str] = set()
    real = IndexFile.candidates

    def spy(self: IndexFile, *args: int) -> object:
        consulted.add(self.path.name)
        return real(self, *args)

    monkeypatch.setattr(IndexFile, "candidates", spy)
    result = run(path, rows(750, start=3000), batch_id=4)
    assert (result.skipped, result.appended) == (0, 750)  # type: ignore[attr-defined]
    assert consulted and consulted <= {name for name, end in files if end >= bound[1]}
    assert len(consulted) < len(files)
    assert stored(path) == [b"body-%d" % i for i in range(3750)]


def test_retry_after_a_later_note_finds_the_prefix_it_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failed attempt's note (made durable when its store closed) names its own batch:
    the retry searches from where the batch before it ended, and finds the 60 rows."""
    path = tmp_path / "broker-0"
    run(path, rows(40, start=1000), batch_id=6)
    monkeypatch.setenv(FAILPOINT_ENV, f"after_chunk:2:{tmp_path / 'fired'}")
    with pytest.raises(SinkFailpoint):
        run(path, rows(100), batch_id=7, chunk_rows=30, attempt=0)
    note = note_of(path)
    assert note is not None and note[0] == 7
    retry = run(path, rows(100), batch_id=7, chunk_rows=30, attempt=1)
    assert (retry.skipped, retry.appended) == (60, 40)  # type: ignore[attr-defined]
    assert stored(path) == [b"body-%d" % i for i in range(1000, 1040)] + [
        b"body-%d" % i for i in range(100)
    ]


def test_retry_finds_rows_of_an_attempt_whose_note_was_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 0 of batch 7 landed 30 rows but died before a flush recorded its note; attempt 1
    notes batch 7 (after those rows) and dies too; attempt 2 must still search from where
    batch 6 began, not from where attempt 1 began."""
    path = tmp_path / "broker-0"
    run(path, rows(20, start=1000), batch_id=5)
    run(path, rows(20, start=2000), batch_id=6)
    with MessageStore(path, CONFIG) as s:
        s.put_batch(rows(30).append_column("uniqKey", uniq_keys(FP, 7, 2, 100)[:30]))
    monkeypatch.setenv(FAILPOINT_ENV, f"after_chunk:1:{tmp_path / 'fired'}")
    with pytest.raises(SinkFailpoint):
        run(path, rows(100), batch_id=7, chunk_rows=30, attempt=0)
    monkeypatch.delenv(FAILPOINT_ENV)
    retry = run(path, rows(100), batch_id=7, chunk_rows=30)
    assert (retry.skipped, retry.appended) == (60, 40)  # type: ignore[attr-defined]
    old = [b"body-%d" % i for i in [*range(1000, 1020), *range(2000, 2020)]]
    assert stored(path) == old + [b"body-%d" % i for i in range(100)]


def test_appends_run_retention_once_per_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sink appends open stores without background threads, so they run the cleaner's round
    themselves: at the first append of a process, then when 10 s have passed."""
    import rocketstore.sink.append as module

    rounds: list[str] = []
    monkeypatch.setattr(MessageStore, "clean", lambda self: rounds.append(self.path.name))
    monkeypatch.setattr(module, "_last_clean", {})
    clock = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    run(tmp_path / "broker-0", rows(5), batch_id=1)
    run(tmp_path / "broker-0", rows(5), batch_id=2)
    run(tmp_path / "broker-1", rows(5), batch_id=2)
    assert rounds == ["broker-0", "broker-1"]
    clock[0] += 10.5
    run(tmp_path / "broker-0", rows(5), batch_id=3)
    assert rounds == ["broker-0", "broker-1", "broker-0"]
    assert not [t for t in threading.enumerate() if t.name.startswith("rocketstore-")]


HOLDER = textwrap.dedent(
    """
    import sys
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.engine.store import MessageStore
    cfg = StoreConfig(mapped_file_size_commitlog=1 << 16, max_hash_slot_num=512, max_index_num=4096)
    with MessageStore(sys.argv[1], cfg, create=True):
        print("holding", flush=True)
        sys.stdin.readline()
    """
)


def test_waits_for_the_lock_then_gives_up_clearly(tmp_path: Path) -> None:
    path = tmp_path / "broker-0"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        with pytest.raises(StoreLockedError, match="lockTimeoutMs"):
            run(path, rows(3), lock_timeout_ms=300)
    finally:
        holder.communicate("\n", timeout=30)
    assert run(path, rows(3)).appended == 3  # type: ignore[attr-defined]
