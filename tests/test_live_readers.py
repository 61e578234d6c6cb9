"""Read-only views of a store whose writer goes on writing.

A view is the store as it was when it opened: it fixes the CommitLog's end then, and every
queue it loads later (queues load when first used) ends at the last unit whose record lies
inside that end. What the writer appends meanwhile is not there for the view, and is never
taken for damage. The writer's appends are made between the view's open and its reads, in
this thread, so each interleaving is the one named, not one a scheduler happened to pick.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import logread, queueread
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.format import native
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.layout import CQ_UNIT_SIZE
from rocketstore.pipeline.tools import commands
from rocketstore.pipeline.tools.verify import state
from tests.kit.powercut import abandon

CONFIG = StoreConfig(
    mapped_file_size_commitlog=64 * 1024,
    mapped_file_size_consume_queue=20 * 50,
    max_hash_slot_num=101,
    max_index_num=300,
)
QUEUES = [(f"T{t}", q) for t in range(5) for q in range(4)]


def body(topic: str, queue_id: int, n: int) -> bytes:
    return f"{topic}/{queue_id}/{n}".encode()


def put_round(store: MessageStore, n: int, queues: list[tuple[str, int]] = QUEUES) -> None:
    """One message to each queue (a batch), then a flush: what a reader could see."""
    store.put_batch([Message(t, body(t, q, n), queue_id=q, keys=f"k{n}") for t, q in queues])
    store.flush()


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[MessageStore]:
    with MessageStore(tmp_path / "s", CONFIG, background=False) as store:
        for n in range(3):
            put_round(store, n)
        yield store


def test_a_view_reads_what_was_there_when_it_opened_while_the_writer_appends(
    writer: MessageStore,
) -> None:
    with MessageStore(writer.path, CONFIG, read_only=True) as view:
        put_round(writer, 3)
        put_round(writer, 4, [("NEW", 0)])
        for topic, queue_id in QUEUES:
            got = view.get_messages(topic, queue_id, 0, 100)
            assert [m.body for m in got.messages] == [body(topic, queue_id, n) for n in range(3)]
            assert (got.status, got.max_offset) == ("FOUND", 3)
        assert ("NEW", 0) not in view.queue_ids()


@pytest.mark.parametrize("ask", ["queue_infos", "queue_ends", "max_offset"])
def test_a_view_bounds_queues_it_has_not_loaded_at_its_open(writer: MessageStore, ask: str) -> None:
    """The bounds a view gives of a queue it never loaded, read from the files now (peeked at
    or loaded), are those of the store it opened on."""
    with MessageStore(writer.path, CONFIG, read_only=True) as view:
        put_round(writer, 3)
        if ask == "max_offset":
            ends = [view.max_offset(t, q) for t, q in QUEUES]
        elif ask == "queue_infos":
            ends = [info.max_offset for info in view.queue_infos()]
        else:
            ends = [e.info.max_offset for e in view.queue_ends()]
        assert ends == [3] * len(QUEUES)


def test_a_view_whose_writer_flushed_between_its_listing_and_its_progress_read(
    writer: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The progress file a view reads at open must not name units past the log it listed:
    the writer flushes right after the view listed the CommitLog's segments."""
    from rocketstore.pipeline.files import commitlog as commitlog_module

    loads = commitlog_module.CommitLog.load

    def load_then_write(self: Any) -> None:
        loads(self)
        if self.segments.read_only:
            put_round(writer, 3)

    monkeypatch.setattr(commitlog_module.CommitLog, "load", load_then_write)
    with MessageStore(writer.path, CONFIG, read_only=True) as view:
        monkeypatch.setattr(commitlog_module.CommitLog, "load", loads)
        infos = view.queue_infos()
        read = [view.get_messages(t, q, 0, 100) for t, q in QUEUES]
    # The writer's flush came before the progress file was read: the view has all of it.
    assert [i.max_offset for i in infos] == [4] * len(QUEUES)
    assert [len(got.messages) for got in read] == [4] * len(QUEUES)


def test_a_queue_the_view_s_recovery_loads_ends_at_the_log_it_walked(
    writer: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A view of a store whose writer appended past its last flush loads those queues while it
    recovers, after it walked the log to its end: what the writer appends in between must not
    be in the view either."""
    from rocketstore.pipeline.engine import recovery

    walk = recovery.find_end
    put_round(writer, 3)
    writer.put_batch([Message(t, body(t, q, 4), queue_id=q) for t, q in QUEUES])  # unflushed

    def walk_then_write(*args: Any, **kwargs: Any) -> Any:
        found = walk(*args, **kwargs)
        writer.put_batch([Message(t, body(t, q, 5), queue_id=q) for t, q in QUEUES])
        return found

    monkeypatch.setattr(recovery, "find_end", walk_then_write)
    with MessageStore(writer.path, CONFIG, read_only=True) as view:
        assert view.work.queues_loaded == len(QUEUES)  # units past the recorded lengths
        for topic, queue_id in QUEUES:
            got = view.get_messages(topic, queue_id, 0, 100)
            assert [m.body for m in got.messages] == [body(topic, queue_id, n) for n in range(5)]


def test_a_reader_beside_a_recovery_finds_the_units_it_was_offered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer dies with units past its last flush; a reader (the Spark source reads the
    files itself) was offered them. The next writer's recovery dispatches those records again:
    while it does, and after, the units in the files are the ones the reader was offered,
    never zeros."""
    from rocketstore.pipeline.engine import dispatch

    path = tmp_path / "s"
    store = MessageStore(path, CONFIG, background=False)
    for n in range(3):
        put_round(store, n)
    store.put_batch([Message(t, body(t, q, 3), queue_id=q) for t, q in QUEUES])
    abandon(store)
    files = {k: path / "consumequeue" / k[0] / str(k[1]) / segment_name(0) for k in QUEUES}
    offered = {k: f.read_bytes()[: 4 * CQ_UNIT_SIZE] for k, f in files.items()}
    assert all(
        len(u) == 4 * CQ_UNIT_SIZE and u[-CQ_UNIT_SIZE:] != bytes(20) for u in offered.values()
    )
    redispatch = dispatch.redispatch
    seen_during: list[dict[tuple[str, int], bytes]] = []

    def look_then_redispatch(*args: Any, **kwargs: Any) -> Any:
        seen_during.append({k: f.read_bytes()[: 4 * CQ_UNIT_SIZE] for k, f in files.items()})
        return redispatch(*args, **kwargs)

    monkeypatch.setattr(dispatch, "redispatch", look_then_redispatch)
    with MessageStore(path, CONFIG, background=False) as again:
        assert again.recovery.records_redispatched == len(QUEUES)
        assert again.recovery.units_dropped == 0
    assert seen_during == [offered]
    assert {k: f.read_bytes()[: 4 * CQ_UNIT_SIZE] for k, f in files.items()} == offered


TOTAL = 360


def test_retention_after_a_view_listed_the_files_is_retention_for_the_view(
    tmp_path: Path,
) -> None:
    """The writer's retention deletes CommitLog segments, ConsumeQueue files and IndexFiles
    that a view listed when it opened and has not read yet. The view reads on as if they had
    gone before it opened, as a RocketMQ consumer skips what was removed: a pull below the new
    min offset is OFFSET_TOO_SMALL, a deleted record is passed over, a key look-up finds what
    is left, and dump prints what is left. None of it is an error."""
    path = tmp_path / "s"
    later = lambda: int(time.time() * 1000) + 100 * 3_600_000  # noqa: E731
    with MessageStore(path, CONFIG, background=False, clock_ms=later) as writer:
        for n in range(TOTAL // 3):
            writer.put_batch([Message("T0", b"%d" % n + b"x" * 900, queue_id=0, keys=f"k{n}")] * 3)
        with (
            MessageStore(path, CONFIG, read_only=True) as view,
            MessageStore(path, CONFIG, read_only=True) as dumping,
            MessageStore(path, CONFIG, read_only=True) as in_log_order,
        ):
            assert view.max_offset("T0", 0) == TOTAL  # loaded: its files listed
            assert dumping.max_offset("T0", 0) == TOTAL
            first = view.commitlog.min_offset
            deleted = writer.clean(force_expired=True, max_files=100).files
            kinds = {f.kind for f in deleted}
            assert kinds == {"commitlog", "consumequeue", "index"}, kinds
            got = view.get_messages("T0", 0, 0, 32)
            assert got.status in ("OFFSET_TOO_SMALL", "FOUND")
            offset, bodies = view.min_offset("T0", 0), []
            while offset < TOTAL:
                got = view.get_messages("T0", 0, offset, 32)
                bodies += [m.body for m in got.messages]
                offset = got.next_begin_offset
            assert view.commitlog.min_offset > first
            assert 0 < len(bodies) < TOTAL
            assert bodies == [
                b"%d" % (n // 3) + b"x" * 900 for n in range(TOTAL - len(bodies), TOTAL)
            ]
            assert [m.body[:3] for m in view.query_by_key("T0", "k119")] == [b"119"] * 3
            dumped = [
                m.body
                for b in queueread.queue_batches(dumping, "T0", 0)
                for m in native.messages(b)
            ]
            assert dumped == bodies
            logged = [m.body for b in logread.log_batches(in_log_order) for m in native.messages(b)]
            assert logged == bodies
            assert view.query_by_key("T0", "k0") == []


@pytest.mark.parametrize("order", ["queue", "log"])
def test_dump_beside_a_writer_prints_the_store_as_it_opened(
    writer: MessageStore,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    order: str,
) -> None:
    """``rocketstore dump`` opens a view and then reads queue after queue; the writer puts to
    every queue between the two."""

    class WriterAppendsAfterTheOpen(MessageStore):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            put_round(writer, 3)

    monkeypatch.setattr(commands, "MessageStore", WriterAppendsAfterTheOpen)
    conf = writer.path.parent / "store.toml"
    conf.write_text(
        f"mappedFileSizeCommitLog = {CONFIG.mapped_file_size_commitlog}\n"
        f"mappedFileSizeConsumeQueue = {CONFIG.mapped_file_size_consume_queue}\n"
        f"maxHashSlotNum = {CONFIG.max_hash_slot_num}\nmaxIndexNum = {CONFIG.max_index_num}\n"
    )
    status = cli.main(["dump", str(writer.path), "--config", str(conf), "--order", order])
    out, err = capsys.readouterr()
    assert (status, err) == (cli.EXIT_OK, "")
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 3 * len(QUEUES)


def test_a_view_whose_recovery_meets_retention_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A view's recovery loads the queues written past the last flush, then moves their min
    offsets past what retention left: retention deletes their oldest files in between. The
    view opens, and reads from the new min offset."""
    from rocketstore.pipeline.engine import recovery

    path = tmp_path / "s"
    later = lambda: int(time.time() * 1000) + 100 * 3_600_000  # noqa: E731
    with MessageStore(path, CONFIG, background=False, clock_ms=later) as writer:
        for n in range(TOTAL // 3):
            writer.put_batch([Message("T0", b"%d" % n + b"x" * 900, queue_id=0)] * 3)
        writer.flush()
        writer.put_batch([Message("T0", b"unflushed", queue_id=0)])
        correct = recovery._Recovery.correct_min_offsets
        rounds: list[int] = []

        def clean_then_correct(self: Any) -> None:
            rounds.append(len(writer.clean(force_expired=True, max_files=100).files))
            correct(self)

        monkeypatch.setattr(recovery._Recovery, "correct_min_offsets", clean_then_correct)
        with MessageStore(path, CONFIG, read_only=True) as view:
            assert rounds[0] > 0 and view.work.queues_loaded == 1
            lo, hi = view.min_offset("T0", 0), view.max_offset("T0", 0)
            assert 0 < lo < hi == TOTAL + 1
            got = view.get_messages("T0", 0, lo, 1000)
            # The first units left may point at records retention deleted too: passed over.
            offsets = [m.queue_offset for m in got.messages]
            assert offsets == list(range(offsets[0], hi)) and offsets[0] >= lo
            assert got.messages[-1].body == b"unflushed"


def test_a_view_whose_index_listing_retention_overtook_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deletes the two oldest IndexFiles while a view opens them one by one, after
    it opened the first: the view forgets both and opens with the rest."""
    from rocketstore.pipeline.files import indexfile, indexservice

    path = tmp_path / "s"
    later = lambda: int(time.time() * 1000) + 100 * 3_600_000  # noqa: E731
    with MessageStore(path, CONFIG, background=False, clock_ms=later) as writer:
        for n in range(TOTAL // 3):
            writer.put_batch([Message("T0", b"%d" % n + b"x" * 900, keys=f"k{n}")] * 3)
        opened: list[Path] = []
        real = indexfile.IndexFile

        def index_file(path: Path, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("read_only") and opened == [
                path.parent / sorted(path.parent.iterdir())[0].name
            ]:
                for old in sorted(path.parent.iterdir())[:2]:
                    old.unlink()  # as retention would, oldest first
            made = real(path, *args, **kwargs)
            opened.append(path)
            return made

        monkeypatch.setattr(indexservice, "IndexFile", index_file)
        with MessageStore(path, CONFIG, read_only=True) as view:
            assert [f.path for f in view.index.files] == sorted((path / "index").iterdir())
            assert [m.body[:3] for m in view.query_by_key("T0", "k119")] == [b"119"] * 3


@pytest.fixture
def retained_after_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, Path]]:
    """A root with one broker whose writer (kept open) runs a retention round right after
    each read-only open, the first time (a round deletes everything expired at once): what the
    view listed is gone before it reads anything. Yields the root and a config file for it."""
    root = tmp_path / "root"
    path = root / "broker-0"
    later = lambda: int(time.time() * 1000) + 100 * 3_600_000  # noqa: E731
    conf = tmp_path / "store.toml"
    conf.write_text(
        f"mappedFileSizeCommitLog = {CONFIG.mapped_file_size_commitlog}\n"
        f"mappedFileSizeConsumeQueue = {CONFIG.mapped_file_size_consume_queue}\n"
        f"maxHashSlotNum = {CONFIG.max_hash_slot_num}\nmaxIndexNum = {CONFIG.max_index_num}\n"
    )
    with MessageStore(path, CONFIG, background=False, clock_ms=later) as writer:
        for n in range(TOTAL // 3):
            writer.put_batch(
                [
                    Message(t, b"%d" % n + b"x" * 900, queue_id=q, keys=f"k{n}")
                    for t, q in QUEUES[:3]
                ]
            )
        writer.flush()  # what a reader goes by: the progress file, config/topics.json
        offsets = {"offsetTable": {"T0@billing": {"0": 10, "1": 20, "2": 30}}}
        (path / "config" / "consumerOffset.json").write_text(json.dumps(offsets))
        # The writer is in this process: verify is to take it for one elsewhere.
        monkeypatch.setattr(state, "is_locked_elsewhere", lambda _path: True)
        opened = MessageStore._open
        rounds: list[int] = []

        def open_then_clean(self: MessageStore) -> None:
            opened(self)
            if self.read_only and not rounds:
                rounds.append(len(writer.clean(force_expired=True, max_files=100).files))

        monkeypatch.setattr(MessageStore, "_open", open_then_clean)
        yield root, conf
        assert rounds and rounds[0] > 0  # the round ran and deleted files


@pytest.mark.parametrize(
    "argv",
    [
        ["dump", "{broker}"],
        ["queues", "{broker}"],
        ["topics", "{broker}"],
        ["get", "{broker}", "--topic", "T0", "--queue", "0", "--offset", "0", "--max", "400"],
        ["query-key", "{broker}", "--topic", "T0", "--key", "k119"],
        ["query-time", "{broker}", "--topic", "T0", "--queue", "0", "--timestamp", "0"],
        ["verify", "{broker}"],
        ["lag", "{root}", "--group", "billing"],
    ],
    ids=lambda argv: argv[0],
)
def test_reading_commands_read_past_retention_after_their_open(
    retained_after_open: tuple[Path, Path], capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    root, conf = retained_after_open
    args = [a.format(root=root, broker=root / "broker-0") for a in argv]
    status = cli.main([*args, "--config", str(conf)])
    out, err = capsys.readouterr()
    assert (status, err) == (cli.EXIT_OK, ""), err + out[-3000:]
    assert out


@pytest.mark.parametrize(
    "page",
    [
        "/",
        "/topic/T0",
        "/messages?topic=T0&by=queue&broker=broker-0&queue=0",
        "/messages?topic=T0&by=key&key=k119",
        "/consumers",
    ],
)
def test_console_pages_read_past_retention_after_their_open(
    retained_after_open: tuple[Path, Path], page: str
) -> None:
    from starlette.testclient import TestClient

    from rocketstore.pipeline.console.app import create_app
    from rocketstore.pipeline.console.views import Console

    root, _ = retained_after_open
    with TestClient(create_app(Console(root, CONFIG, ())), base_url="http://127.0.0.1") as client:
        answer = client.get(page)
    assert answer.status_code == 200, answer.text[-2000:]
