"""One default for the store settings, used alike by the command line, the sink, the source and
the jobs: ``--config``/``config`` when given, else ``conf/store.toml`` (under
``$ROCKETSTORE_CONF_DIR``, else the current directory) when it exists, else the built-ins."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import BUILT_IN, CONF_DIR_ENV, StoreConfig
from rocketstore.pipeline.errors import ConfigError
from rocketstore.sink.settings import SinkSettings
from rocketstore.source import options

ROOT = Path(__file__).resolve().parent.parent
# Far from the built-ins, so that a tool that ignores the file cannot pass.
EDITED = "mappedFileSizeCommitLog = 65536\nmaxHashSlotNum = 100\nmaxIndexNum = 400\n"


@pytest.fixture
def edited_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory whose conf/store.toml has a small geometry; the cwd is changed to it."""
    work = tmp_path / "work"
    (work / "conf").mkdir(parents=True)
    (work / "conf" / "store.toml").write_text(EDITED)
    monkeypatch.chdir(work)
    monkeypatch.delenv(CONF_DIR_ENV, raising=False)
    return work


def test_without_a_conf_directory_the_built_ins_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CONF_DIR_ENV, raising=False)
    config = StoreConfig.effective()
    assert config == StoreConfig() and config.origin == BUILT_IN
    assert config.mapped_file_size_commitlog == 1 << 30


def test_an_edited_conf_store_toml_is_used_by_every_tool(
    edited_conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    effective = StoreConfig.effective()
    assert effective.mapped_file_size_commitlog == 65536
    assert effective.origin == str(Path("conf") / "store.toml")

    # The sink writes with it ...
    sink = SinkSettings.from_options({"path": str(edited_conf / "root"), "topic": "t"})
    assert sink.store_config.mapped_file_size_commitlog == 65536
    assert (sink.store_config.max_hash_slot_num, sink.store_config.max_index_num) == (100, 400)
    # ... the command line writes and opens a store with it, without --config ...
    assert cli.main(["config", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["settings"]["mappedFileSizeCommitLog"] == 65536
    assert shown["source"] == str(Path("conf") / "store.toml")
    lines = edited_conf / "in.jsonl"
    lines.write_text('{"topic": "t", "body": "x"}\n')
    assert cli.main(["produce", "store", str(lines)]) == 0
    (segment,) = (edited_conf / "store" / "commitlog").iterdir()
    assert segment.stat().st_size == 65536
    capsys.readouterr()
    assert cli.main(["queues", "store", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["maxOffset"] == 1
    # ... and the source reads with it.
    read = options.parse({"path": "store", "topic": "t"}, streaming=None)
    assert read.config is not None and read.config.max_index_num == 400


def test_a_named_file_wins_over_conf_store_toml(edited_conf: Path) -> None:
    named = edited_conf / "other.toml"
    named.write_text("mappedFileSizeCommitLog = 131072\n")
    assert StoreConfig.effective(named).mapped_file_size_commitlog == 131072
    sink = SinkSettings.from_options({"path": "r", "config": str(named)})
    assert sink.store_config.mapped_file_size_commitlog == 131072
    assert sink.store_config.max_index_num == StoreConfig().max_index_num  # not the edited file's


def test_the_conf_directory_can_be_moved(
    tmp_path: Path, edited_conf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rocketstore.jobs import common

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "store.toml").write_text("mappedFileSizeCommitLog = 262144\n")
    monkeypatch.setenv(CONF_DIR_ENV, str(elsewhere))
    assert common.conf_dir() == elsewhere
    assert StoreConfig.effective().mapped_file_size_commitlog == 262144
    sink = SinkSettings.from_options({"path": "r"})
    assert sink.store_config.mapped_file_size_commitlog == 262144
    monkeypatch.setenv(CONF_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=f"{CONF_DIR_ENV}=.*missing: no such directory"):
        StoreConfig.effective()


def test_pyproject_ships_what_exists() -> None:
    """Every package the distribution lists is a folder of the repository with its
    ``__init__.py``, every folder with one is listed (under the one import name), and the
    package data exists."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setup = project["tool"]["setuptools"]
    folders = setup["package-dir"]
    assert set(folders) == set(setup["packages"])
    for package in setup["packages"]:
        assert package == "pyspark_rocketstore" or package.startswith("rocketstore."), package
        assert (ROOT / folders[package] / "__init__.py").is_file(), package
    for package, patterns in setup["package-data"].items():
        for pattern in patterns:
            found = list((ROOT / folders[package]).glob(pattern))
            assert found or pattern.startswith("_native"), f"{package}/{pattern} does not exist"
    imported = {str(p.parent.relative_to(ROOT)) for p in ROOT.glob("**/__init__.py")}
    imported = {d for d in imported if not d.startswith(("tests", "bench", "build", ".venv"))}
    assert imported == set(folders.values())
