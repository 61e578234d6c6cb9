"""File descriptors and mappings: a store of 1,000 queues works under ``ulimit -n 256``, and
``produce`` says exactly which lines landed when a put fails.

Segments close their descriptor once mapped, and ConsumeQueue and index files are mapped lazily,
at most ``maxMappedFiles`` at once (pipeline/files/mappings.py). The limit is set in a subprocess
(``resource.setrlimit``), which runs the command line's produce, a get from every queue, verify
and recover, and then reports what it saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.cli import main
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files import durability, mappings
from rocketstore.pipeline.format.message import Message

ROOT = Path(__file__).resolve().parent.parent
QUEUES = 1000
TOPICS = 10

CONF = """\
mappedFileSizeCommitLog = 1048576
mappedFileSizeConsumeQueue = 400
maxHashSlotNum = 1009
maxIndexNum = 4000
maxMappedFiles = 64
"""

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    from rocketstore.pipeline.cli import main
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.engine.store import MessageStore

    store, conf, lines = sys.argv[1:4]
    out = {"limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
    out["produce"] = main(["produce", store, lines, "--config", conf])
    got = {}
    with MessageStore(store, StoreConfig.load(conf), read_only=True) as s:
        for info in s.queue_infos():
            r = s.get_messages(info.topic, info.queue_id, 0, 64)
            assert len(s.mappings) <= 128
            got[f"{info.topic}/{info.queue_id}"] = [m.body.decode() for m in r.messages]
        out["mapped"] = len(s.mappings)
    out["got"] = got
    out["verify"] = main(["verify", store, "--config", conf])
    out["recover"] = main(["recover", store, "--config", conf, "--json"])
    out["verify_after"] = main(["verify", store, "--config", conf])
    sys.stderr.write("RESULT " + json.dumps(out) + "\\n")
    """
)


def run_child(script: str, *args: Path) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run ``script`` (which sets the limit itself) and return what it reported."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    result_line = [x for x in proc.stderr.splitlines() if x.startswith("RESULT ")]
    assert result_line, proc.stderr[-3000:]
    return proc, json.loads(result_line[0][len("RESULT ") :])


@pytest.mark.parametrize(
    ("conf_text", "per_queue", "most_mapped"),
    [
        (CONF, 3, 64),
        # maxMappedFiles at its default (1024, above the descriptor limit): the bound derived
        # from RLIMIT_NOFILE (half of it) must hold on its own. 12 batches of 1,000 lines, each
        # touching every one of the 1,000 queues.
        ("\n".join(x for x in CONF.splitlines() if "maxMappedFiles" not in x) + "\n", 12, 128),
    ],
    ids=["maxMappedFiles-64", "maxMappedFiles-default"],
)
def test_a_thousand_queues_under_ulimit_256(
    tmp_path: Path, conf_text: str, per_queue: int, most_mapped: int
) -> None:
    conf = tmp_path / "store.toml"
    conf.write_text(conf_text)
    lines = tmp_path / "in.jsonl"
    expected: dict[str, list[str]] = {}
    with open(lines, "w") as f:
        for n in range(per_queue * QUEUES):
            q = n % QUEUES
            topic, queue_id = f"T{q % TOPICS}", q // TOPICS
            body = f"m{n}"
            expected.setdefault(f"{topic}/{queue_id}", []).append(body)
            f.write(json.dumps({"topic": topic, "queueId": queue_id, "body": body, "keys": body}))
            f.write("\n")
    store = tmp_path / "store"
    proc, out = run_child(CHILD, store, conf, lines)
    assert out["limit"] == 256
    assert out["produce"] == 0
    produced = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith('{"line"')]
    assert len(produced) == per_queue * QUEUES
    assert all(r["status"] == "PUT_OK" for r in produced)
    assert out["got"] == expected
    assert out["mapped"] <= most_mapped
    assert out["verify"] == 0 and out["recover"] == 0 and out["verify_after"] == 0


def test_mappings_and_descriptors_stay_bounded_and_files_are_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Puts and reads of 60 queues map no ConsumeQueue file (units go through descriptors),
    and with a descriptor budget of 16 the least recently used descriptors are closed and the
    files opened again when next used, with every unit where it belongs."""
    monkeypatch.setattr(mappings, "descriptor_budget", lambda: 16)
    config = StoreConfig(
        mapped_file_size_commitlog=1 << 20,
        mapped_file_size_consume_queue=200,
        max_hash_slot_num=101,
        max_index_num=500,
        max_mapped_files=8,
    )
    with MessageStore(tmp_path / "s", config) as store:
        for round_ in range(3):
            store.put_batch(
                [Message(f"T{q % 5}", f"{round_}-{q}".encode(), queue_id=q // 5) for q in range(60)]
            )
            assert len(store.mappings) <= 8
            assert store.mappings.descriptors <= 16
        assert store.mappings.evictions > 0
        opened = store.work.opened
        for q in range(60):
            got = store.get_messages(f"T{q % 5}", q // 5, 0, 10)
            assert [m.body for m in got.messages] == [f"{r}-{q}".encode() for r in range(3)]
        assert len(store.mappings) <= 8
        assert store.mappings.descriptors <= 16
        assert store.work.opened > opened  # closed ones were opened again
        # The CommitLog's segment and the IndexFile are mapped; no ConsumeQueue file is.
        assert store.work.mapped <= 2 + store.mappings.evictions


def test_single_puts_with_two_mappings_allowed(tmp_path: Path) -> None:
    """A single put hands the native code the CommitLog segment's, the ConsumeQueue file's and
    the IndexFile's bytes at once; with ``maxMappedFiles = 2``, mapping one of them evicts
    another, which must stay usable for the put that holds it."""
    config = StoreConfig(mapped_file_size_commitlog=1 << 20, max_mapped_files=2)
    with MessageStore(tmp_path / "s", config, background=False) as store:
        store.put_batch([Message(f"T{t}", b"first", keys="k") for t in range(10)])
        for n in range(4000):
            store.put(Message(f"T{n % 10}", f"m{n}".encode(), keys=f"k{n}"))
        assert store.mappings.evictions > 0
        for t in range(10):
            got = store.get_messages(f"T{t}", 0, 1, 1000)
            assert [m.body for m in got.messages] == [f"m{n}".encode() for n in range(t, 4000, 10)]
        assert [m.body for m in store.query_by_key("T3", "k3993")] == [b"m3993"]


TWO_STORES = textwrap.dedent(
    """
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    from rocketstore.pipeline.engine.store import MessageStore
    from rocketstore.pipeline.format.message import Message

    first, second = sys.argv[1:3]
    out = {"limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
    # A sink task writing to two brokers: two stores of the default settings in one process.
    stores = [MessageStore(first), MessageStore(second)]
    for s in stores:
        s.put_batch([Message(f"T{q % 50}", b"first", queue_id=q // 50, keys="k") for q in range(200)])
    acked = 0
    for n in range(4000):
        q = n % 200
        r = stores[n % 2].put(Message(f"T{q % 50}", f"m{n}".encode(), queue_id=q // 50, keys=f"k{n}"))
        acked += r.status == "PUT_OK"
    out["acked"] = acked
    got = {}
    for i, s in enumerate(stores):
        for q in range(200):
            r = s.get_messages(f"T{q % 50}", q // 50, 1, 100)
            got[f"{i}/{q}"] = [m.body.decode() for m in r.messages]
        s.close()
    out["got"] = got
    sys.stderr.write("RESULT " + json.dumps(out) + "\\n")
    """
)


def test_two_stores_in_one_process_take_single_puts_under_ulimit_256(tmp_path: Path) -> None:
    proc, out = run_child(TWO_STORES, tmp_path / "a", tmp_path / "b")
    assert (out["limit"], out["acked"]) == (256, 4000), proc.stderr[-3000:]
    expected = {
        f"{i}/{q}": [f"m{n}" for n in range(4000) if n % 2 == i and n % 200 == q]
        for i in range(2)
        for q in range(200)
    }
    assert out["got"] == expected


def test_produce_reports_which_lines_of_a_failed_put_landed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under SYNC_FLUSH the second put's msync fails (EIO) after its records were written:
    its lines are reported as stored exactly when the log holds them, and nothing after the
    failed batch is read."""
    conf = tmp_path / "store.toml"
    conf.write_text(CONF + 'flushDiskType = "SYNC_FLUSH"\n')
    lines = tmp_path / "in.jsonl"
    lines.write_text(
        "".join(
            json.dumps({"topic": "T", "body": f"m{n}", "keys": f"k{n}"}) + "\n" for n in range(30)
        )
    )
    calls = {"n": 0}
    real = durability.msync

    def failing(mm: object, start: int, length: int, path: Path) -> None:
        if path.parent.name == "commitlog":  # one CommitLog msync per put under SYNC_FLUSH
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError(5, "Input/output error")
        real(mm, start, length, path)  # type: ignore[arg-type]

    monkeypatch.setattr(durability, "msync", failing)
    store = tmp_path / "store"
    code = main(["produce", str(store), str(lines), "--config", str(conf), "--batch-size", "10"])
    captured = capsys.readouterr()
    assert code == 2
    results = [json.loads(x) for x in captured.out.splitlines()]
    assert "a put failed at line" in captured.err
    monkeypatch.setattr(durability, "msync", real)
    # Exactly the first two batches are answered: the second failed, the third was never read.
    assert [r["line"] for r in results] == list(range(1, 21))
    assert all(r["status"] == "PUT_OK" for r in results[:10])
    with MessageStore(store, StoreConfig.load(conf)) as s:
        held = {m.body for m in s.get_messages("T", 0, 0, 64).messages}
        for r in results:
            body = f"m{r['line'] - 1}".encode()
            if r["status"] == "PUT_OK":
                assert s.get_message(r["commitLogOffset"]).body == body
            else:
                assert r["status"] == "NOT_STORED" and body not in held
    assert held == {f"m{n}".encode() for n in range(20) if results[n]["status"] == "PUT_OK"}


SEGMENTS_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    from rocketstore.pipeline.cli import main
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.engine.store import MessageStore

    store, conf = sys.argv[1:3]
    out = {"queues": main(["queues", store, "--config", conf, "--json"])}
    bodies = []
    with MessageStore(store, StoreConfig.load(conf), read_only=True) as s:
        out["segments"] = len(s.commitlog.segments.files)
        for info in s.queue_infos():
            offset = info.min_offset
            while offset < info.max_offset:
                r = s.get_messages(info.topic, info.queue_id, offset, 256)
                bodies += [m.body.decode() for m in r.messages]
                offset = r.next_begin_offset
        out["mapped"] = len(s.mappings)
    out["bodies"] = sorted(bodies)
    out["get"] = main(["get", store, "--config", conf, "--topic", "S1", "--queue", "2",
                       "--offset", "0", "--max", "5"])
    out["verify"] = main(["verify", store, "--config", conf])
    out["recover"] = main(["recover", store, "--config", conf, "--json"])
    out["verify_after"] = main(["verify", store, "--config", conf])
    with MessageStore(store, StoreConfig.load(conf)) as s:
        s.put_batch([])
    sys.stderr.write("RESULT " + json.dumps(out) + "\\n")
    """
)


def test_a_store_of_300_segments_under_ulimit_256(tmp_path: Path) -> None:
    """Every CommitLog segment used to be mapped (one descriptor each) when the store opened:
    past ~200 segments a store could not even be opened under ``ulimit -n 256``."""
    conf = tmp_path / "store.toml"
    conf.write_text("mappedFileSizeCommitLog = 65536\nmappedFileSizeConsumeQueue = 20000\n")
    config = StoreConfig.load(conf)
    store = tmp_path / "store"
    body = "b" * 600
    expected = []
    with MessageStore(store, config) as s:
        n = 0
        while len(s.commitlog.segments.files) < 300:
            batch = [
                Message(f"S{i % 3}", f"{n + i}-{body}".encode(), queue_id=i % 4) for i in range(200)
            ]
            s.put_batch(batch)
            expected += [f"{n + i}-{body}" for i in range(200)]
            n += 200
    _, out = run_child(SEGMENTS_CHILD, store, conf)
    assert out["segments"] >= 300
    assert out["bodies"] == sorted(expected)
    assert out["mapped"] <= 128
    assert out["queues"] == 0 and out["get"] == 0
    assert out["verify"] == 0 and out["recover"] == 0 and out["verify_after"] == 0
