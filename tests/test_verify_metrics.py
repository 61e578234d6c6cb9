"""``rocketstore verify STORE --metrics FILE``: the result in Prometheus' text format for
node_exporter's textfile collector, checked by ``promtool check metrics`` and read back with
prometheus_client's parser, for a sound store and one with a damaged record; files of two
brokers merge without a clash; a real node_exporter (Debian's prometheus-node-exporter, on
loopback) serves the file's series; a bad FILE fails before the scan."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message
from tests.kit.consolekit import SMALL, SMALL_TOML
from tests.kit.promkit import PROMTOOL, free_port

pytest.importorskip("prometheus_client", reason="verify --metrics needs the 'console' extra")
from prometheus_client.parser import text_string_to_metric_families


def write_store(path: Path) -> None:
    with MessageStore(path, SMALL) as store:
        store.put_batch([Message("T", f"body {i}".encode(), queue_id=i % 2) for i in range(20)])


def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(path.read_text())
        for s in family.samples
    }


def verify(store: Path, metrics: Path, conf: Path) -> int:
    return cli.main(["verify", str(store), "--metrics", str(metrics), "--config", str(conf)])


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(SMALL_TOML)
    return path


def test_sound_and_damaged_stores(
    tmp_path: Path, conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    for name in ("broker-0", "broker-1"):
        write_store(tmp_path / name)
    # A byte of broker-1's third record's body: its CRC no longer matches.
    segment = tmp_path / "broker-1" / "commitlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    at = data.index(b"body 2")
    data[at] ^= 0xFF
    segment.write_bytes(bytes(data))

    before = time.time()
    assert verify(tmp_path / "broker-0", textfiles / "broker-0.prom", conf) == 0
    assert verify(tmp_path / "broker-1", textfiles / "broker-1.prom", conf) == 1
    capsys.readouterr()
    assert sorted(p.name for p in textfiles.iterdir()) == ["broker-0.prom", "broker-1.prom"]
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for name in ("broker-0", "broker-1"):
        found = samples(textfiles / f"{name}.prom")
        assert not set(found) & set(merged)  # one series per broker: the files merge
        merged |= found
    stamps = {k: v for k, v in merged.items() if k[0].endswith("_timestamp_seconds")}
    assert all(before <= v <= time.time() for v in stamps.values()) and len(stamps) == 2
    assert {k: v for k, v in merged.items() if k not in stamps} == {
        ("rocketstore_verify_ok", (("broker", "broker-0"),)): 1.0,
        ("rocketstore_verify_problems", (("broker", "broker-0"),)): 0.0,
        ("rocketstore_verify_ok", (("broker", "broker-1"),)): 0.0,
        ("rocketstore_verify_problems", (("broker", "broker-1"),)): 1.0,
    }
    if PROMTOOL is not None:
        for f in textfiles.iterdir():
            done = subprocess.run(
                [PROMTOOL, "check", "metrics"],
                input=f.read_text(),
                capture_output=True,
                text=True,
                check=False,
            )
            assert done.returncode == 0, done.stdout + done.stderr


def test_a_file_in_no_directory_fails_before_the_scan(
    tmp_path: Path, conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_store(tmp_path / "store")
    assert verify(tmp_path / "store", tmp_path / "nope" / "v.prom", conf) == 2
    err = capsys.readouterr().err
    assert f"option --metrics={tmp_path / 'nope' / 'v.prom'}: no such directory" in err
    assert not (tmp_path / "nope").exists()


NODE_EXPORTER = shutil.which("prometheus-node-exporter")


@pytest.mark.skipif(
    NODE_EXPORTER is None,
    reason="needs Debian's prometheus-node-exporter (apt-get install prometheus-node-exporter)",
)
def test_node_exporters_textfile_collector_serves_the_result(tmp_path: Path, conf: Path) -> None:
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    write_store(tmp_path / "broker-0")
    assert verify(tmp_path / "broker-0", textfiles / "rocketstore-broker-0.prom", conf) == 0
    assert NODE_EXPORTER is not None
    port = free_port()
    proc = subprocess.Popen(
        [
            NODE_EXPORTER,
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={textfiles}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "no node_exporter"
                time.sleep(0.1)  # a readiness probe's pause, not synchronisation
    finally:
        proc.terminate()
        proc.wait(30)
    served = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("rocketstore_")
    }
    assert served == samples(textfiles / "rocketstore-broker-0.prom")
    assert served[("rocketstore_verify_ok", (("broker", "broker-0"),))] == 1.0
    assert "node_textfile_scrape_error 0" in text
