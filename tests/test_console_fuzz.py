"""A fuzzer over the console's routes: random and hostile parameters, paths and tokens.

For every request: no 500; with a token, nothing but the right header or the page exchange
gets through; a ``token`` parameter on ``/metrics`` is refused (400) and only the exchange on a
page sets a cookie; the hostile marker sent in parameters never comes back unescaped;
no file outside the root (and the console's own package, Python's libraries and fonts) is
opened or listed, and nothing under the root is opened for writing (an audit hook sees every
``open``, ``os.listdir`` and ``os.scandir``); and after the run the store's bytes are the same.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kit.consolekit import SMALL, make_root

pytest.importorskip("starlette", reason="the console needs the 'console' extra")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

import matplotlib

from rocketstore.pipeline.console import app as console_app
from rocketstore.pipeline.console.app import create_app
from rocketstore.pipeline.console.views import Console
from tests.kit.files import snapshot

MARKER = "<script>fz</script>"
TOKEN = "fuzz-token-0123456789abcdef"
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

HOSTILE = [
    "",
    "0",
    "-1",
    "1",
    "2147483648",
    "9223372036854775807",
    "9223372036854775808",
    "9" * 400,
    "1e9",
    "0x10",
    " 7 ",
    "../../../../etc/passwd",
    "/etc/passwd",
    "..%2F..%2Fetc%2Fpasswd",
    "....//....//etc",
    "broker-0/../../etc",
    "broker-0",
    "broker-1",
    "broker-9",
    "orders",
    "logs",
    "%RETRY%orders",
    "a" * 128,
    "a" * 5000,
    MARKER,
    "\x00",
    "é\u202e\ufeff",
    "😀",
    "order-3",
    "C0000202000029F0000000000000000",
    "0" * 32,
    "f" * 56,
    "2026-01-01T00:00:00",
    "2026-13-45T99:99:99",
    "'; DROP TABLE x; --",
    "{{7*7}}",
    "${jndi:ldap://x}",
]
PARAM_NAMES = [
    "topic",
    "by",
    "broker",
    "queue",
    "offset",
    "time",
    "key",
    "msgid",
    "phys",
    "count",
    "token",
    "x",
]
ROUTES = [
    "/",
    "/topic/{}",
    "/messages",
    "/message",
    "/consumers",
    "/health",
    "/metrics",
    "/metrics/",
    "/static/{}",
    "/{}",
]


class Opened:
    """Records what the process opens or lists while ``active`` (an audit hook cannot be
    removed, so it is installed once and switched)."""

    def __init__(self) -> None:
        self.active = False
        self.lock = threading.Lock()
        self.paths: list[tuple[str, str, int]] = []

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or event not in ("open", "os.listdir", "os.scandir"):
            return
        path = args[0] if args else None
        if isinstance(path, int) or path is None:
            return
        flags = args[2] if event == "open" and len(args) > 2 and isinstance(args[2], int) else 0
        with self.lock:
            self.paths.append((event, os.fsdecode(path), flags))


OPENED = Opened()
sys.addaudithook(OPENED.hook)


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    base = tmp_path_factory.mktemp("console-fuzz")
    root, checkpoint = make_root(base)
    before = snapshot(root)
    yield root, checkpoint
    assert snapshot(root) == before, "the fuzzed console changed the store"


def _allowed(root: Path, checkpoint: Path) -> list[str]:
    prefixes = {
        str(root),
        str(checkpoint),
        str(Path(console_app.__file__).resolve().parent),
        sys.prefix,
        sys.base_prefix,
        str(Path(matplotlib.__file__).resolve().parent),
        matplotlib.get_cachedir(),
        matplotlib.get_configdir(),
        "/usr/share/fonts",
        "/usr/share/zoneinfo",
        "/etc/localtime",
        "/proc/self",
        "/dev/urandom",
    }
    return sorted(prefixes)


def _outside(path: str, allowed: list[str]) -> bool:
    def under(p: str) -> bool:
        return any(p == a or p.startswith(a.rstrip("/") + "/") for a in allowed)

    # /proc/self resolves to the process's own number: judge the name as given too.
    return not (under(os.path.abspath(path)) or under(os.path.realpath(path)))


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], dict[str, str]]:
    route = draw(st.sampled_from(ROUTES))
    segment = draw(st.sampled_from(HOSTILE) | st.text(max_size=40))
    path = route.format(
        quote(segment, safe="") if draw(st.booleans()) else quote(segment, safe="/%")
    )
    names = draw(st.lists(st.sampled_from(PARAM_NAMES), max_size=6, unique=True))
    # The token parameter is sometimes the right one: the exchange, and its refusal on /metrics.
    params = {
        n: draw(
            st.sampled_from(HOSTILE + ([TOKEN, TOKEN + "x"] if n == "token" else []))
            | st.text(max_size=60)
        )
        for n in names
    }
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers["Authorization"] = draw(
            st.sampled_from(
                [f"Bearer {TOKEN}", "Bearer wrong", "Basic eDp5", "Bearer", f"bearer {TOKEN}x"]
            )
        )
    method = draw(st.sampled_from(["GET", "GET", "GET", "HEAD", "POST"]))
    return method, path, params, headers


@pytest.mark.parametrize("token", [None, TOKEN], ids=["loopback", "token"])
@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests())
def test_fuzzed_requests(
    fuzz_root: tuple[Path, Path],
    token: str | None,
    request: tuple[str, str, dict[str, str], dict[str, str]],
) -> None:
    root, checkpoint = fuzz_root
    method, path, params, headers = request
    app = create_app(Console(root, SMALL, (checkpoint,)), token)
    allowed = _allowed(root, checkpoint)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        OPENED.paths.clear()
        OPENED.active = True
        try:
            r = client.request(method, path, params=params, headers=headers, follow_redirects=False)
            # A verify run a POST started reads on in its thread: its opens count too.
            assert app.state.health.wait(60)
        finally:
            OPENED.active = False
    assert r.status_code < 500, (method, path, params, r.text[-400:])
    if "token" in params and path.rstrip("/") == "/metrics":
        # Whatever its value, the header and the mode: a scraper's URL must not carry it.
        assert r.status_code == 400, (method, path, params, headers, r.status_code)
    elif token is not None and r.status_code not in (401, 403, 404, 405, 303):
        assert headers.get("Authorization") == f"Bearer {TOKEN}" or params.get("token") == TOKEN
    if "set-cookie" in r.headers:  # only the exchange on a page sets one
        assert token is not None and r.status_code == 303 and params.get("token") == TOKEN
        assert path.rstrip("/") != "/metrics"
    assert MARKER.encode() not in r.content
    assert len(r.content) < 2_000_000
    for event, opened, flags in OPENED.paths:
        assert not _outside(opened, allowed), f"{event} {opened} for {method} {path} {params}"
        if os.path.realpath(opened).startswith(str(root)):
            assert not flags & WRITE_FLAGS, f"{opened} opened for writing"
