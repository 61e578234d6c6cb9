"""How the ``rocketstore`` command line is used: argument orders, usage errors, exit statuses,
a closed output pipe, and what start-up imports."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.engine.store import MessageStore

ROOT = Path(__file__).resolve().parent.parent

# Every command with every kind of argument it takes: positionals in order, and options (each
# with its value). The orders below are built from these; a command missing here fails
# test_every_command_is_covered.
ARGS: dict[str, tuple[list[str], list[list[str]]]] = {
    "dump": (["S"], [["--topic", "T"], ["--config", "c.toml"]]),
    "queues": (["S"], [["--topic", "T"], ["--json"], ["--config", "c.toml"]]),
    "topics": (["S"], [["--topic", "T"], ["--json"], ["--config", "c.toml"]]),
    "get": (
        ["S"],
        [
            ["--topic", "T"],
            ["--queue", "1"],
            ["--offset", "-3"],
            ["--max", "5"],
            ["--tags", "A || B"],
            ["--json"],
            ["--config", "c.toml"],
        ],
    ),
    "query-key": (
        ["S"],
        [
            ["--topic", "T"],
            ["--key", "K"],
            ["--begin", "1"],
            ["--end", "2"],
            ["--max", "3"],
            ["--json"],
            ["--config", "c.toml"],
        ],
    ),
    "query-time": (
        ["S"],
        [["--topic", "T"], ["--queue", "1"], ["--timestamp", "5"], ["--json"], ["--config", "c"]],
    ),
    "query-offset": (["S", "175"], [["--json"], ["--config", "c.toml"]]),
    "query-msgid": (["S", "7F0000010000"], [["--json"], ["--config", "c.toml"]]),
    "produce": (
        ["S", "in.jsonl"],
        [["--batch-size", "5"], ["--linger-ms", "7"], ["--config", "c.toml"]],
    ),
    "verify": (["S"], [["--all"], ["--progress"], ["--json"], ["--config", "c.toml"]]),
    "recover": (["S"], [["--json"], ["--config", "c.toml"]]),
    "clean": (["S"], [["--dry-run"], ["--max-files", "2"], ["--json"], ["--config", "c.toml"]]),
    "lag": (
        ["R"],
        [["--checkpoint", "D"], ["--group", "G"], ["--topic", "T"], ["--json"], ["--config", "c"]],
    ),
    "config": ([], [["--config", "c.toml"], ["--json"]]),
    "console": (
        ["R"],
        [
            ["--checkpoint", "D"],
            ["--port", "0"],
            ["--bind", "::1"],
            ["--token-file", "F"],
            ["--per-queue-limit", "5"],
            ["--config", "c.toml"],
        ],
    ),
    "exporter": (
        ["R"],
        [
            ["--checkpoint", "q=D"],
            ["--port", "0"],
            ["--bind", "::1"],
            ["--token-file", "F"],
            ["--per-queue-limit", "0"],
            ["--config", "c.toml"],
        ],
    ),
    "tier": (
        ["upload", "S"],
        [["--follow"], ["--interval", "0.5"], ["--json"], ["--config", "c.toml"]],
    ),
}


def orders(positionals: list[str], options: list[list[str]]) -> list[list[str]]:
    """The same arguments as positionals first, options first, and interleaved."""
    flat = [token for option in options for token in option]
    mixed: list[str] = []
    for i in range(max(len(positionals), len(options))):
        if i < len(options):
            mixed += options[i]
        if i < len(positionals):
            mixed.append(positionals[i])
    after_first = [token for option in options[1:] for token in option]
    return [positionals + flat, flat + positionals, mixed, options[0] + positionals + after_first]


def test_every_command_is_covered() -> None:
    _, commands = cli.build_parser()
    assert set(commands) == set(ARGS)


@pytest.mark.parametrize("command", sorted(ARGS))
def test_every_command_loads_its_function_of_the_parsed_arguments(command: str) -> None:
    """What a command's parser names is imported only when the command runs: here each one
    is, and is the command's ``cmd_`` function, taking the arguments and returning a status."""
    _, commands = cli.build_parser()
    handler = commands[command].get_default("load_handler")()
    assert handler.__name__ == "cmd_" + command.replace("-", "_")
    (param,) = inspect.signature(handler).parameters.values()
    hints = typing.get_type_hints(handler)
    assert (hints[param.name], hints["return"]) == (argparse.Namespace, int)


@pytest.mark.parametrize("command", sorted(ARGS))
def test_every_order_of_the_arguments_parses_the_same(command: str) -> None:
    positionals, options = ARGS[command]
    parsed = [vars(cli.parse_args([command, *argv])) for argv in orders(positionals, options)]
    assert all(p == parsed[0] for p in parsed), parsed
    assert parsed[0]["config"] in ("c.toml", "c")


@pytest.mark.parametrize(
    "argv",
    [
        ["produce", "S", "--config", "c.toml", "-"],
        ["produce", "S", "--config", "c.toml", "in.jsonl"],
        ["produce", "--batch-size", "5", "S", "--config", "c.toml", "in.jsonl"],
        ["produce", "--config", "c.toml", "S"],
    ],
)
def test_produce_takes_its_input_after_options(argv: list[str]) -> None:
    args = cli.parse_args(argv)
    assert (args.store, args.config) == ("S", "c.toml")
    assert args.input == (argv[-1] if argv[-1] != "S" else "-")


def test_the_readme_orders_store_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("mappedFileSizeCommitLog = 65536\nmaxHashSlotNum = 100\nmaxIndexNum = 400\n")
    store = tmp_path / "store"
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"topic": "T", "body": "from a file"}\n')
    assert cli.main(["produce", str(store), "--config", str(conf), str(lines)]) == 0
    assert (
        cli.main(["produce", "--batch-size", "5", str(store), "--config", str(conf), str(lines)])
        == 0
    )
    monkeypatch.setattr(sys, "stdin", open(lines, encoding="utf-8"))  # noqa: SIM115
    assert cli.main(["produce", str(store), "--config", str(conf), "-"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["queueOffset"] for r in results] == [0, 1, 2]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["get", "S", "--topic", "T"], "the following arguments are required: --queue, --offset"),
        (["produce", "S", "a.jsonl", "b.jsonl"], "unrecognized arguments: b.jsonl"),
        (["queues", "S", "--nope"], "unrecognized arguments: --nope"),
        (["query-offset", "S", "-1"], "argument OFFSET: expected an integer >= 0, got '-1'"),
        (["lag", "--group", "G"], "the following arguments are required: ROOT"),
    ],
)
def test_a_usage_error_shows_the_commands_usage(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    assert cli.main(argv) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"usage: rocketstore {argv[0]} ")
    assert f"rocketstore {argv[0]}: error: {needle}" in err


def test_an_unknown_command_shows_the_top_level_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["nonsense"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("usage: rocketstore [-h] [--version] COMMAND ...")
    assert "invalid choice: 'nonsense'" in err


def test_lag_calls_its_argument_a_store_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["lag", "--help"]) == 0
    out = capsys.readouterr().out
    assert "ROOT" in out and not re.search(r"\bSTORE\b", out)
    assert "broker store directory" not in out.split("positional arguments:")[1].split("\n")[1]


# -- exit status ----------------------------------------------------------------------------------


def documented_codes(text: str) -> dict[int, str]:
    """Exit codes and their first words from an ``exit status`` table (docs/cli.md or --help)."""
    return {int(m[1]): m[2] for m in re.finditer(r"^\|? *`?(\d+)`? *\|? +(\w+)", text, re.M)}


def test_exit_codes_are_documented_in_help_and_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    help_text = capsys.readouterr().out.split("exit status:")[1]
    page = (ROOT / "docs/cli.md").read_text(encoding="utf-8")
    section = page.split("**Exit status** of `rocketstore`")[1].split("\n\n")[1]
    constants = {v for k, v in vars(cli).items() if k.startswith("EXIT_")}
    assert set(documented_codes(help_text)) == constants
    assert documented_codes(section) == documented_codes(help_text)
    assert cli.main(["queues", "--help"]) == 0
    assert "exit status:" in capsys.readouterr().out


def run_script(*argv: str, **kw: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "rocketstore.pipeline.cli", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,  # type: ignore[call-overload]
    )


@pytest.fixture
def big_store(tmp_path: Path) -> tuple[Path, Path]:
    """A store whose dump is far larger than a pipe's buffer (64 KiB)."""
    conf = tmp_path / "c.toml"
    conf.write_text("mappedFileSizeCommitLog = 1048576\nmaxHashSlotNum = 100\nmaxIndexNum = 4000\n")
    store = tmp_path / "store"
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(f'{{"topic": "T", "body": "{i:0200d}"}}\n' for i in range(2000)))
    assert cli.main(["produce", str(store), str(lines), "--config", str(conf)]) == 0
    return store, conf


def test_a_closed_output_pipe_ends_quietly_with_141(
    big_store: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    store, conf = big_store
    proc = run_script("dump", str(store), "--config", str(conf))
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()  # like `| head -1`: read a line, then go away
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == cli.EXIT_PIPE_CLOSED == 141
    assert json.loads(first)["queueOffset"] == 0
    assert err == b""


def test_produce_with_its_output_closed_and_its_input_open_ends_with_141(tmp_path: Path) -> None:
    """The results' reader is gone before the first result while the producer still holds the
    input open: 141 at once (not an abort at exit over standard input), and the batch whose
    results could not be printed is stored."""
    store = tmp_path / "store"
    r, w = os.pipe()
    os.close(r)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rocketstore.pipeline.cli",
            "produce",
            str(store),
            "--linger-ms",
            "0",
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=w,
        stderr=subprocess.PIPE,
    )
    os.close(w)
    assert proc.stdin is not None and proc.stderr is not None
    try:
        proc.stdin.write(b'{"topic": "T", "body": "unread"}\n')
        proc.stdin.flush()
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("produce still runs 60 s after its output was closed, its input open")
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()  # only now is the input's write end closed
        proc.stderr.close()
    assert (rc, err) == (cli.EXIT_PIPE_CLOSED, b"")
    with MessageStore(store, read_only=True) as s:
        assert [m.body for m in s.get_messages("T", 0, 0, 8).messages] == [b"unread"]


def test_not_found_exits_3(
    big_store: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    store, conf = big_store
    capsys.readouterr()
    for argv, needle in (
        (["query-time", "--topic", "Nope", "--queue", "0", "--timestamp", "1"], "no topic 'Nope'"),
        (["query-time", "--topic", "T", "--queue", "9", "--timestamp", "1"], "has no queue 9"),
        (["query-offset", "175"], "no record starts at CommitLog offset 175"),
        (["query-offset", str(10**9)], "outside the log"),
    ):
        assert cli.main([argv[0], str(store), *argv[1:], "--config", str(conf)]) == 3
        err = capsys.readouterr().err
        assert err.startswith("rocketstore: error: ") and needle in err
        assert "bad magic" not in err and err.count("\n") == 1


# -- start-up -------------------------------------------------------------------------------------

HEAVY = (
    "numpy",
    "pyarrow",
    "pandas",
    "rocketstore.pipeline.engine.store",
    "rocketstore.pipeline.format.encode",
)
PROBE = f"""
import contextlib, io, json, sys
from rocketstore.pipeline import cli
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = cli.main(sys.argv[1:])
print(json.dumps({{"code": code, "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def probe(*argv: str) -> dict[str, object]:
    """Run ``rocketstore ARGV`` in a fresh interpreter; its exit code and which heavy modules
    it imported."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["--version"], ["produce", "--help"], ["lag", "--help"], ["get", "S"]],
)
def test_help_and_usage_errors_import_nothing_heavy(argv: list[str]) -> None:
    result = probe(*argv)
    assert result["loaded"] == []


def test_a_read_command_does_not_import_pandas(big_store: tuple[Path, Path]) -> None:
    store, conf = big_store
    result = probe("queues", str(store), "--config", str(conf))
    assert result == {
        "code": 0,
        "loaded": [
            "numpy",
            "pyarrow",
            "rocketstore.pipeline.engine.store",
            "rocketstore.pipeline.format.encode",
        ],
    }


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"rocketstore {version('rocketstore')}"
    text = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"', text, re.M)
    assert declared is not None and declared.group(1) == version("rocketstore")
