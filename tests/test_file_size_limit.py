"""A real file size limit (``ulimit -f``, RLIMIT_FSIZE) on ``produce``.

The kernel refuses to grow a file past the limit with EFBIG (and SIGXFSZ, which CPython
ignores, so a Python writer never dies of it). Every store file is created at full size, so
the limit is met when a file is created: the put must fail before its first byte with the
file and the limit named, exit status 2, and every acknowledged line readable after
``recover``. No failpoint stands in here: the limit is set on the writer process itself.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from tests.kit.cli import run_cli
from tests.kit.produce import SMALL, stored_bodies, write_input

ROOT = Path(__file__).resolve().parent.parent


def produce_limited(
    store: Path, conf: Path, lines: Path, limit: int | None
) -> tuple[int, list[dict[str, object]], str]:
    """``rocketstore produce`` in a child whose file size limit is ``limit`` bytes. Its output
    goes to a pipe: a file would count against the limit too."""

    def set_limit() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocketstore.pipeline.cli",
            "produce",
            str(store),
            str(lines),
            "--config",
            str(conf),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=set_limit,
    )
    out = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    return proc.returncode, out, proc.stderr


def check_acked(
    store: Path, conf: Path, rows: list[dict[str, object]], acked: list[dict[str, object]]
) -> None:
    assert run_cli("recover", str(store), "--config", str(conf), "--json").returncode == 0
    check = run_cli("verify", str(store), "--config", str(conf))
    assert check.returncode == 0, check.stdout[-2000:]
    bodies = stored_bodies(store, StoreConfig.load(conf))
    assert len(bodies) == len(acked)
    for r in acked:
        row = rows[int(str(r["line"])) - 1]
        assert bodies[int(str(r["commitLogOffset"]))] == str(row["body"]).encode()


def test_a_limit_below_the_segment_size_refuses_the_first_put(tmp_path: Path) -> None:
    conf = tmp_path / "store.toml"
    conf.write_text(SMALL)
    lines = tmp_path / "in.jsonl"
    write_input(lines, 0, 3_000)
    store = tmp_path / "store"
    code, out, err = produce_limited(store, conf, lines, 500_000)
    assert code == 2, (code, err[-2000:])  # a negative code would be a signal (SIGXFSZ)
    assert f"{store}/commitlog/" in err and "File too large" in err, err
    assert "at most 500,000 bytes (ulimit -f)" in err and "nothing of the put" in err, err
    assert out and all(r["status"] == "NOT_STORED" for r in out)
    code, out, err = produce_limited(store, conf, lines, None)
    assert code == 0, err[-2000:]
    assert len(out) == 3_000


def test_a_limit_met_mid_stream_keeps_every_acknowledged_line(tmp_path: Path) -> None:
    """A store written without a limit, then reopened by a writer with one: it goes on in the
    segment it has (its blocks were reserved before the limit existed) and stops cleanly at
    the next segment it cannot create."""
    conf = tmp_path / "store.toml"
    conf.write_text(SMALL)
    first, rest = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rows = write_input(first, 0, 2_000) + write_input(rest, 2_000, 20_000)
    store = tmp_path / "store"
    code, acked, err = produce_limited(store, conf, first, None)
    assert code == 0, err[-2000:]
    code, out, err = produce_limited(store, conf, rest, 600_000)
    assert code == 2, (code, err[-2000:])
    assert "cannot create a file of 1,048,576 bytes: File too large" in err, err
    more = [r for r in out if r["status"] == "PUT_OK"]
    assert more and all(r["status"] == "NOT_STORED" for r in out[len(more) :])
    shifted = [{**r, "line": int(str(r["line"])) + 2_000} for r in more]
    check_acked(store, conf, rows, acked + shifted)
