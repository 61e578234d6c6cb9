"""``GET /metrics`` on the console and on ``rocketstore exporter``: its parameters, the guard
(loopback host, the token in the header only: never in the URL), a fuzzer of its parameters
(no 5xx, the store unchanged, a URL token refused), and the exporter as a process a person
starts and stops with Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kit.consolekit import SMALL, START_TIMEOUT, make_root

pytest.importorskip("starlette", reason="the endpoint needs the 'console' extra")
pytest.importorskip("prometheus_client", reason="the endpoint needs the 'console' extra")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

from prometheus_client.parser import text_string_to_metric_families

from rocketstore.pipeline.console.app import create_app
from rocketstore.pipeline.console.exporter import create_exporter_app
from rocketstore.pipeline.console.views import Console
from rocketstore.pipeline.tools.metricfamilies import FAMILIES
from rocketstore.pipeline.tools.metrics import StoreCollector, Target
from tests.kit.files import snapshot

TOKEN = "metrics-token-0123456789abcdef"
HOSTILE = ["", "0", "1", "2", "auto", "AUTO", "-1", "9" * 400, "<script>x</script>", "\x00", "😀"]
NAMES = [*FAMILIES, "rocketmq_messages_in_total", "rocketstore_queues_total", "up", "x" * 300]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_root(tmp_path_factory.mktemp("metrics-endpoint"))


def exporter(root: tuple[Path, Path], token: str | None = None) -> TestClient:
    store_root, checkpoint = root
    collector = StoreCollector(Target(store_root, SMALL, (("q", checkpoint),)))
    return TestClient(
        create_exporter_app(collector, store_root, token), base_url="http://127.0.0.1"
    )


def names_in(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


def test_the_exporter_serves_the_text_format(root: tuple[Path, Path]) -> None:
    with exporter(root) as client:
        r = client.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "rocketmq_consumer_lag_messages" in names_in(r.text)
        only = client.get("/metrics?name[]=rocketmq_messages_in_total&name[]=rocketstore_query_up")
        # The parser names a counter's family without _total.
        assert names_in(only.text) == {"rocketmq_messages_in", "rocketstore_query_up"}
        assert "rocketstore_queue_max_offset" not in names_in(
            client.get("/metrics?per_queue=0").text
        )
        open_metrics = client.get("/metrics", headers={"accept": "application/openmetrics-text"})
        assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
        assert open_metrics.text.endswith("# EOF\n")
        assert client.get("/").status_code == 200
        assert client.get("/messages").status_code == 404  # the exporter serves no messages


@pytest.mark.parametrize(
    "query",
    ["name[]=nope", "name[]=rocketstore_queues_total", "per_queue=yes", "per_queue=-1"],
)
def test_bad_parameters_answer_400_saying_which(root: tuple[Path, Path], query: str) -> None:
    with exporter(root) as client:
        r = client.get(f"/metrics?{query}")
    assert r.status_code == 400
    assert query.split("=")[0] in r.text


def test_the_guard_applies(root: tuple[Path, Path]) -> None:
    with exporter(root) as client:
        assert client.get("/metrics", headers={"host": "evil.example"}).status_code == 403
    with exporter(root, TOKEN) as client:
        assert client.get("/metrics").status_code == 401
        r = client.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and "rocketstore_broker_up" in r.text


def console(root: tuple[Path, Path], token: str | None = None) -> TestClient:
    store_root, checkpoint = root
    return TestClient(
        create_app(Console(store_root, SMALL, (checkpoint,)), token), base_url="http://127.0.0.1"
    )


APPS = {"exporter": exporter, "console": console}


@pytest.mark.parametrize("token", [None, TOKEN], ids=["loopback", "token"])
@pytest.mark.parametrize("app", list(APPS))
def test_a_token_in_the_url_of_metrics_is_refused(
    root: tuple[Path, Path], app: str, token: str | None
) -> None:
    # Whatever its value, beside a good header or not: the refusal is for the URL, where a
    # scrape config would keep the token and every proxy on the way would log it.
    good = {"authorization": f"Bearer {TOKEN}"}
    with APPS[app](root, token) as client:
        for path in ("/metrics", "/metrics/"):
            for query in (f"token={TOKEN}", "token=wrong", "token=", f"per_queue=0&token={TOKEN}"):
                for headers in ({}, good):
                    r = client.get(f"{path}?{query}", headers=headers, follow_redirects=False)
                    assert r.status_code == 400, (path, query, headers, r.status_code)
                    assert "Authorization: Bearer" in r.text and "credentials_file" in r.text
                    assert TOKEN not in r.text
                    assert "set-cookie" not in r.headers and "location" not in r.headers
        assert not client.cookies


def test_the_exporter_takes_the_header_only(root: tuple[Path, Path]) -> None:
    with exporter(root, TOKEN) as client:
        # No route of the exporter is a page a browser logs in on: no exchange anywhere.
        r = client.get(f"/?token={TOKEN}", follow_redirects=False)
        assert r.status_code == 400 and "set-cookie" not in r.headers
        # Cookies ignore ports: the console's, on the same host, reaches the exporter too.
        client.cookies.set("rocketstore_console", TOKEN)
        assert client.get("/metrics").status_code == 401
        client.cookies.clear()
        for wrong in ("Bearer wrong", f"Bearer {TOKEN}x", f"Basic {TOKEN}", "Bearer"):
            r = client.get("/metrics", headers={"authorization": wrong})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert "Authorization: Bearer" in r.text and "?token" not in r.text
        ok = client.get("/", headers={"authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200


def test_the_console_metrics_take_the_header_or_the_login_cookie(root: tuple[Path, Path]) -> None:
    with console(root, TOKEN) as client:
        r = client.get("/metrics", headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401 and "?token" not in r.text
        r = client.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and "rocketstore_broker_up" in r.text
        assert client.get("/metrics").status_code == 401
        # A person logged in on a page (the exchange) can look at /metrics in the browser.
        login = client.get(f"/health?token={TOKEN}", follow_redirects=False)
        assert login.status_code == 303 and "set-cookie" in login.headers
        assert client.get("/metrics").status_code == 200


def test_the_console_serves_metrics_with_its_verify_runs(root: tuple[Path, Path]) -> None:
    store_root, checkpoint = root
    app = create_app(Console(store_root, SMALL, (checkpoint,)))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        before = client.get("/metrics").text
        assert "rocketstore_verify_ok" not in before
        assert f'query="{checkpoint}"' in before
        app.state.health.start()
        assert app.state.health.wait(120)
        after = client.get("/metrics").text
    assert 'rocketstore_verify_ok{broker="broker-0"} 1.0' in after
    assert 'rocketstore_verify_problems{broker="broker-1"} 0.0' in after
    assert "rocketstore_verify_running 0.0" in after


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pairs=st.lists(
        st.tuples(
            st.sampled_from(["name[]", "per_queue", "name", "token", "x"]),
            st.one_of(st.sampled_from(HOSTILE + NAMES), st.text(max_size=40)),
        ),
        max_size=6,
    ),
    path=st.sampled_from(["/metrics", "/metrics/", "/", "/metrics/../etc/passwd", "/%00"]),
    method=st.sampled_from(["GET", "HEAD", "POST"]),
)
def test_fuzz_the_endpoint(root: tuple[Path, Path], pairs: Any, path: str, method: str) -> None:
    before = FUZZ_STATE.setdefault("digest", snapshot(root[0]))
    client = FUZZ_STATE.setdefault("client", exporter(root))
    r = client.request(method, path, params=pairs)
    assert r.status_code < 500, (path, pairs, r.text[:200])
    if any(name == "token" for name, _ in pairs):  # on any route of the exporter
        assert r.status_code == 400, (method, path, pairs, r.status_code)
    assert "set-cookie" not in r.headers
    if r.status_code == 200 and path == "/metrics" and method != "HEAD":
        names_in(r.text)  # parses
    assert "<script>" not in r.headers.get("content-type", "")
    assert snapshot(root[0]) == before


FUZZ_STATE: dict[str, Any] = {}


def test_the_exporter_process_serves_until_ctrl_c(root: tuple[Path, Path], tmp_path: Path) -> None:
    store_root, checkpoint = root
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rocketstore.pipeline.cli",
            "exporter",
            str(store_root),
            "--port",
            "0",
            "--checkpoint",
            f"reader={checkpoint}",
            "--config",
            str(store_root.parent / "small.toml"),
            "--token-file",
            str(token_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "rocketstore exporter: serving" in line, line
        url = line.split(" at ")[1].split(" ")[0]
        hint = proc.stdout.readline()
        assert "Authorization: Bearer TOKEN" in hint and "?token" not in hint, hint
        request = urllib.request.Request(
            url + "metrics", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=START_TIMEOUT) as r:
            text = r.read().decode()
        assert 'rocketstore_query_up{query="reader"} 1.0' in text
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}metrics?token={TOKEN}", timeout=START_TIMEOUT)
        assert refused.value.code == 400
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert "stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_exporter_refuses_a_missing_checkpoint(root: tuple[Path, Path], tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocketstore.pipeline.cli",
            "exporter",
            str(root[0]),
            "--checkpoint",
            f"q={tmp_path / 'nope'}",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"option --checkpoint=q={tmp_path / 'nope'}: no such directory" in done.stderr
