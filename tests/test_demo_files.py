"""What the demo and ``make clean`` delete: only what the demo made, as its marker lists it;
never a user's data (no Spark)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rocketstore.jobs.common import JobError
from rocketstore.jobs.demo_files import MARKER, Paths

ROOT = Path(__file__).resolve().parent.parent


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_a_new_directory_is_marked_before_anything_is_made(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "demo")
    paths.prepare()
    assert tree(paths.root) == [MARKER, "incoming"]
    listed = [line for line in paths.marker.read_text().splitlines() if not line.startswith("#")]
    assert listed == ["incoming", "store", "checkpoints", "export"]


def test_names_taken_by_something_else_are_refused_and_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "store" / "commitlog").mkdir(parents=True)
    (root / "store" / "commitlog" / "00000000000000000000").write_bytes(b"mine")
    (root / "notes.txt").write_text("mine too")
    before = tree(root)
    with pytest.raises(JobError, match=rf"--dir {root}: store not made by a demo run"):
        Paths(root).prepare()
    assert tree(root) == before


def test_a_later_run_replaces_only_what_the_last_one_made(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "demo")
    paths.prepare()
    for made in (paths.store / "broker-0", paths.checkpoints / "ingest", paths.export_orders):
        made.mkdir(parents=True)
        (made / "f").write_text("old run")
    (paths.incoming / "orders-000000.json").write_text("{}")
    (paths.root / "keep.txt").write_text("the user's")
    paths.prepare()
    assert tree(paths.root) == [MARKER, "incoming", "keep.txt"]
    assert (paths.root / "keep.txt").read_text() == "the user's"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_clean_deletes_only_what_the_marker_lists(tmp_path: Path) -> None:
    # A copy of the Makefile in a scratch directory: its caches are cleaned there, not here.
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    user_store = tmp_path / "data" / "store" / "commitlog"
    user_store.mkdir(parents=True)
    (user_store / "00000000000000000000").write_bytes(b"the README's example store")
    paths = Paths(tmp_path / "data" / "demo")
    paths.prepare()
    paths.store.mkdir()
    (paths.root / "keep.txt").write_text("the user's")
    with paths.marker.open("a") as marker:
        marker.write("../store\n")  # a tampered marker must not reach outside the demo's dir
    unmarked = tmp_path / "data" / "other"
    (unmarked / "store").mkdir(parents=True)

    for demo_dir in ("data/demo", "data/other"):
        subprocess.run(
            ["make", "-s", "-C", str(tmp_path), "clean", f"DEMO_DIR={demo_dir}"],
            check=True,
            capture_output=True,
            timeout=60,
        )
    assert tree(tmp_path / "data") == [
        "demo",
        "demo/keep.txt",
        "other",
        "other/store",
        "store",
        "store/commitlog",
        "store/commitlog/00000000000000000000",
    ]
