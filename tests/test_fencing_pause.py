"""A writer paused between its fence check and its write (a VM stun, a stopped process, a
starved executor) while another writer takes the store over: when it resumes, nothing it
writes reaches the new writer's files.

The pause is made deterministic here: the first writer's put stops at a chosen write step
(its failpoint), after the put's fence check passed; there it loses its lock the way a shared
file system's servers drop it, and another process takes the store over, writes and closes;
then the put goes on. (tests/test_partition.py stops a real writer with SIGSTOP across a
take-over on GlusterFS hosts.) Afterwards every message the new writer acknowledged is read
back in order, nothing of the paused put is, and ``verify`` is clean.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import FileReplacedError, StoreError
from rocketstore.pipeline.files import failpoints
from rocketstore.pipeline.files.mappedfile import MappedFile, segment_name
from rocketstore.pipeline.files.mappings import MappingCache
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit.fencing import CONFIG, QUEUES, TOPIC, Taker, bodies, expected, lose_lock, put_a

# The write steps of a batch put that come after its fence check, in the order they run
# (blocks are reserved with a file this small's creation, so no "reserve" step is met).
STEPS = ("segment-create", "commitlog-write", "consumequeue-append", "index-put")
LATE = 900


@pytest.mark.parametrize("step", STEPS)
def test_a_writer_paused_after_its_check_writes_nothing_into_the_takers_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    store = MessageStore(tmp_path, CONFIG, background=False)
    put_a(store, 0, 50)
    store.flush()
    taken: list[Taker] = []
    real_hit = failpoints.hit

    def pause_here(name: str) -> None:
        if name == step and not taken:
            lose_lock(store)
            taker = Taker(tmp_path, 300)
            taker.close()
            taken.append(taker)
        real_hit(name)

    monkeypatch.setattr(failpoints, "hit", pause_here)
    # 900 units for one queue: a ConsumeQueue write of 18,000 bytes, which goes through the
    # file rather than a mapping; a new ConsumeQueue file and a new segment for the others.
    late = [Message(TOPIC, b"late-%d" % i, queue_id=0, keys=[f"l{i}"]) for i in range(LATE)]
    late += [Message("Other", b"late-other", queue_id=5)]
    with contextlib.suppress(StoreError):
        store.put_batch(late)
        store.flush()
    monkeypatch.setattr(failpoints, "hit", real_hit)
    assert taken, f"the put never reached {step}"
    with contextlib.suppress(StoreError):
        store.close()
    # The paused put's records are the log's if they were whole in it before the take-over
    # (as after a crash: the taker's recovery keeps them), and then they come before the
    # taker's; else nothing of the put is there. Either way every message the taker
    # acknowledged is there, after them, in its order.
    queue0 = len(range(0, 50, QUEUES))
    want = expected(50, 300)
    adopted = [*want[:queue0], *(b"late-%d" % i for i in range(LATE)), *want[queue0:]]
    got = bodies(tmp_path)
    assert got in (want, adopted), f"{len(got)} messages: {got[queue0 : queue0 + 3]}"
    with MessageStore(tmp_path, CONFIG, read_only=True) as ro:
        problems = [p for p in verify(ro).problems if p.kind != "commitlog-fenced-writer"]
        assert not problems, [str(p) for p in problems]
    # The next writer recovers and writes on, after the taker's messages.
    end0 = queue0 + (LATE if got == adopted else 0) + len(range(0, 300, QUEUES))
    with MessageStore(tmp_path, CONFIG) as next_writer:
        assert next_writer.put(Message(TOPIC, b"after", queue_id=0)).queue_offset == end0
    assert bodies(tmp_path) == [*got[:end0], b"after", *got[end0:]]


@pytest.mark.parametrize("made_anew", ["renamed over", "deleted and created"])
def test_a_file_replaced_under_its_name_is_not_written(tmp_path: Path, made_anew: str) -> None:
    """A segment whose descriptor was closed (the budget) opens its name again to write: when
    the name leads to another file (a taker's renewed copy, or a file made anew, which ext4
    may give the same inode number: its generation tells them apart), the write is refused."""
    path = tmp_path / segment_name(0)
    mf = MappedFile(path, 0, 4096, read_only=False, create=True, cache=MappingCache(8),
                    deferred=True)  # fmt: skip
    mf.write_at(0, b"a" * 20)
    assert mf.release()  # the descriptor closed, as the cache does past its budget
    if made_anew == "renamed over":
        copy = tmp_path / "copy"
        copy.write_bytes(path.read_bytes())
        os.replace(copy, path)
    else:
        path.unlink()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, 4096)
        os.close(fd)
    with pytest.raises(FileReplacedError, match="another writer took the store over"):
        mf.write_at(20, b"b" * 20)
    assert b"b" not in path.read_bytes()
    mf.close()
