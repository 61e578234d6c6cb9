"""A real Prometheus (Debian's ``prometheus``) for the tests, on loopback, and the exporter it
scrapes.

:class:`Prometheus` starts the server on a free 127.0.0.1 port with a storage directory under
the test's tmp_path, a scrape interval and a rule evaluation interval of 1 s, and answers
PromQL through the HTTP API. :class:`Exporter` runs ``rocketstore exporter`` on another free
loopback port. :func:`fast_rules` is conf/prometheus/rocketstore-rules.yml with its windows
and ``for`` durations cut to seconds, so a test sees an alert fire and resolve in a minute.
:func:`assert_promql_is_the_commands` holds PromQL's lag and bounds against ``rocketstore lag``
and ``rocketstore queues``.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message
from tests.kit import ROOT

RULES = ROOT / "conf" / "prometheus" / "rocketstore-rules.yml"
START_TIMEOUT = 60.0
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
SKIP_REASON = "needs Debian's prometheus package (apt-get install prometheus; .ci/run installs it)"
# What a test module of a real Prometheus marks itself with: skipped without one, and one such
# module at a time (each starts a server).
PROMETHEUS_MARKS = [
    pytest.mark.skipif(PROMETHEUS is None, reason=SKIP_REASON),
    pytest.mark.xdist_group("prometheus"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fast_rules(durations: dict[str, str]) -> dict[str, Any]:
    """The project's rules with each duration of ``durations`` (``"10m": "5s"``) replaced, in
    range selectors and ``for`` alike."""
    rules: dict[str, Any] = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            for old, new in durations.items():
                rule["expr"] = rule["expr"].replace(f"[{old}]", f"[{new}]")
                if rule.get("for") == old:
                    rule["for"] = new
    return rules


class Writer:
    """Appends ``batch()`` to each of the first ``brokers`` broker directories of ``root`` every
    ``interval`` seconds until stopped, each broker's store held open (its background flush
    publishes, as a long-running writer's does)."""

    def __init__(
        self,
        root: Path,
        brokers: int,
        config: StoreConfig,
        interval: float,
        batch: Callable[[], list[Message]],
    ) -> None:
        self.stores = [MessageStore(root / f"broker-{b}", config) for b in range(brokers)]
        self.interval, self.batch = interval, batch
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop_event.wait(self.interval):
                for store in self.stores:
                    store.put_batch(self.batch())
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)
        for store in self.stores:
            store.close()
        if self.error is not None:
            raise RuntimeError(f"the writer failed: {self.error}") from self.error


class Exporter:
    """``rocketstore exporter ARGV --port 0`` in a subprocess; :attr:`address` is host:port."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocketstore.pipeline.cli", "exporter", *argv, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"serving .* at http://(\S+)/ ", line)
        if m is None:
            self.stop()
            raise AssertionError(f"the exporter did not start: {line}")
        self.address = m.group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Prometheus:
    """The server, scraping ``targets`` every second and evaluating ``rules`` every second."""

    def __init__(self, workdir: Path, targets: list[str], rules: dict[str, Any]) -> None:
        assert PROMETHEUS is not None, SKIP_REASON
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "rules.yml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(workdir / "rules.yml")],
            "scrape_configs": [
                {
                    "job_name": "rocketstore",
                    "scrape_timeout": "1s",
                    "static_configs": [{"targets": targets}],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"prometheus did not start: {(workdir / 'prometheus.log').read_text()}"
                )
            time.sleep(0.1)  # a readiness probe's pause, not synchronisation

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query's vector: sorted labels (without job and instance) -> value."""
        out = {}
        for s in self.api("query", query=expr)["result"]:
            labels = {k: v for k, v in s["metric"].items() if k not in ("job", "instance")}
            out[tuple(sorted(labels.items()))] = float(s["value"][1])
        return out

    def alerts(self, name: str) -> list[str]:
        """The states (``pending``, ``firing``) of the alerts named ``name`` now."""
        return [
            a["state"] for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name
        ]

    def wait_for(self, what: str, check: Any, timeout: float = 90.0) -> Any:
        """Poll ``check()`` until it returns something true; fail after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
            time.sleep(0.2)  # between polls of a condition with a deadline

    def scraped_after(self, moment: float) -> None:
        """Wait for a scrape of every target that started after ``moment`` (epoch seconds)."""

        def done() -> bool:
            found = self.query("timestamp(rocketstore_scrape_duration_seconds)")
            return bool(found) and min(found.values()) > moment

        self.wait_for("a scrape after the store stood still", done, 30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def cli_json(*argv: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def assert_promql_is_the_commands(
    prom: Prometheus, root: Path, conf: Path, checkpoints: dict[str, Path]
) -> int:
    """Compare every per-queue lag and bound with what the commands print; returns the
    number of queue lags compared."""
    query_rows: dict[tuple[str, ...], float] = {}
    for name, checkpoint in checkpoints.items():
        for r in cli_json(
            "lag", str(root), "--checkpoint", str(checkpoint), "--json", "--config", str(conf)
        ):
            if "batchId" in r:
                query_rows[(name, r["topic"], r["brokerName"], str(r["queueId"]))] = r["lag"]
    group_rows = {
        (r["group"], r["topic"], r["brokerName"], str(r["queueId"])): r["lag"]
        for r in cli_json("lag", str(root), "--json", "--config", str(conf))
    }

    def keyed(expr: str, *names: str) -> dict[tuple[str, ...], float]:
        return {tuple(dict(k)[n] for n in names): v for k, v in prom.query(expr).items()}

    assert (
        keyed("rocketstore_query_queue_lag_messages", "query", "topic", "broker", "queue_id")
        == query_rows
    )
    assert (
        keyed(
            "rocketstore_consumer_queue_lag_messages",
            "consumer_group",
            "topic",
            "broker",
            "queue_id",
        )
        == group_rows
    )
    totals: dict[tuple[str, ...], float] = {}
    for (g, t, _, _), lag in group_rows.items():
        totals[(g, t)] = totals.get((g, t), 0) + lag
    assert (
        keyed(
            "sum by (consumer_group, topic) (rocketmq_consumer_lag_messages)",
            "consumer_group",
            "topic",
        )
        == totals
    )
    for broker, path in StoreRoot(root).brokers():
        rows = cli_json("queues", str(path), "--json", "--config", str(conf))
        low = keyed(f'rocketstore_queue_min_offset{{broker="{broker}"}}', "topic", "queue_id")
        high = keyed(f'rocketstore_queue_max_offset{{broker="{broker}"}}', "topic", "queue_id")
        assert {
            (r["topic"], str(r["queueId"])): (r["minOffset"], r["maxOffset"]) for r in rows
        } == {k: (low[k], high[k]) for k in high}
    return len(query_rows) + len(group_rows)
