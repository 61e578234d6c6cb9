"""Fault injection: a task dying mid-append and retried, and the driver SIGKILLed mid-batch.

Each runs the query in its own process (tests/procs/sink_job.py): the retry test needs
``local[2,3]`` (three attempts per task), and the kill test kills the whole process group.
Where the fault is a task's or a micro-batch's, not the process's, the faces run one after
another in one driver (a JVM and a Spark session take some 10 s to start); a restart after a
failure is a new process, as a user's is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketstore.pipeline.files import failpoints
from tests.kit.realfs import real_fs
from tests.kit.sink import (
    check_exactly_once,
    finish,
    fired,
    job,
    kill_mid_batch,
    outcomes,
    write_input,
)


def test_task_failing_mid_append_is_retried_without_duplicates(tmp_path: Path) -> None:
    faces = ["foreach", "foreach-shuffled", "format"]
    rows = write_input(tmp_path / "in", files=2, rows_per_file=400)
    got = outcomes(
        finish(
            job(
                tmp_path,
                "local[2,3]",
                ",".join(faces),
                f"after_chunk:2:{tmp_path}/fired-{{face}}",
                root=tmp_path / "store-{face}",
            )
        )
    )
    for face in faces:
        log = tmp_path / f"fired-{face}"
        # Tasks really died after two chunks (else this would test nothing); their retries
        # completed the batches.
        assert fired(log) and all(line.startswith("after_chunk ") for line in fired(log)), face
        if face.startswith("foreach"):
            assert got[face]["shuffled"] == (1 if face == "foreach-shuffled" else 0)
            # Broker tasks died after 2 chunks of 50 and were retried: the retries skipped
            # what the failed attempts stored and appended the rest.
            appended, skipped = got[face]["appended"], got[face]["skipped"]
            assert isinstance(appended, int) and isinstance(skipped, int)
            assert appended + skipped == 800 and skipped >= 100, (face, got[face])
        check_exactly_once(tmp_path, rows, tmp_path / f"store-{face}")


@pytest.mark.parametrize("face", ["foreach", "format"])
def test_driver_killed_mid_batch_restarts_without_duplicates(tmp_path: Path, face: str) -> None:
    rows = write_input(tmp_path / "in", files=3, rows_per_file=300)
    kill_mid_batch(tmp_path, face, rows)
    finish(job(tmp_path, "local[2]", face))
    check_exactly_once(tmp_path, rows)


@pytest.mark.parametrize("face", ["foreach", "format"])
@pytest.mark.parametrize("fault", ["consumequeue-append=raise@3", "index-put=raise@2"])
def test_store_failing_mid_put_under_the_sink_is_retried_exactly_once(
    tmp_path: Path, face: str, fault: str
) -> None:
    """An I/O error inside a store put (rocketstore.pipeline.files.failpoints, armed in every Python worker):
    the store stops writes, the task fails, its retry reopens the broker (recovery completes
    or drops the failed put) and appends only what is missing."""
    rows = write_input(tmp_path / "in", files=2, rows_per_file=400)
    log = tmp_path / "fired"
    env = {failpoints.ENV: fault, failpoints.LOG_ENV: str(log)}
    finish(job(tmp_path, "local[2,3]", face, env_extra=env))
    assert fired(log), "the store fault never fired"
    check_exactly_once(tmp_path, rows)


def test_sink_into_a_full_disk_fails_with_the_error_then_lands_every_row_once(
    tmp_path: Path,
) -> None:
    """A real full disk (a loop-mounted ext4) under the sink: the query fails with the store's
    error, raised in the Python worker as an exception (no SIGBUS killing it); once space is
    freed, a restart of the same query lands every row exactly once. Both faces, each on a
    disk of its own, one after the other in one driver, and again in the restart's."""
    faces = ["foreach", "format"]
    # One micro-batch that alone overfills the disk: the retention check at open (puts refused
    # above 90 % used) passes, and the disk fills between two checks, as a fast producer does.
    # 80,000 rows are ~18 MB of records: more than the 16 MiB left beside the ballast.
    rows = write_input(tmp_path / "in", files=1, rows_per_file=80_000)
    with real_fs("ext4", 32) as foreach_disk, real_fs("ext4", 32) as format_disk:
        for face, mnt in zip(faces, (foreach_disk, format_disk), strict=True):
            (tmp_path / f"disk-{face}").symlink_to(mnt)
            (mnt / "ballast").write_bytes(b"\1" * (14 << 20))
        root = tmp_path / "disk-{face}" / "store"
        # The sink's own chunk size: one put per broker, which must fail whole before its
        # first byte and leave a store the retry can open.
        whole = {"SINK_JOB_CHUNK_ROWS": "1000000"}
        proc = job(tmp_path, "local[2]", ",".join(faces), root=root, env_extra=whole)
        out, err = proc.communicate(timeout=600)
        assert "crashed" not in err and "exited unexpectedly" not in err, err[-4000:]
        got = outcomes(out)
        for face in faces:
            error = got[face]["error"]
            assert error is not None, f"{face}: the sink filled the disk without failing"
            assert "No space left on device" in str(error) and "bytes free" in str(error), error
            (tmp_path / f"disk-{face}" / "ballast").unlink()
        assert proc.returncode != 0
        finish(job(tmp_path, "local[2]", ",".join(faces), root=root, env_extra=whole))
        for face in faces:
            check_exactly_once(tmp_path, rows, tmp_path / f"disk-{face}" / "store")
