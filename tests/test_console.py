"""The console's routes, through Starlette's TestClient, on a root the project's writer made
(:mod:`consolekit`): what each page shows, that lag equals ``rocketstore lag``, validation,
the token, a verify run, and the store's bytes unchanged after every test."""

from __future__ import annotations

import html
import json
import re
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape

from tests.kit.consolekit import (
    HOSTILE_BODY,
    ORDER_SCHEMA,
    ORDERS_PER_QUEUE,
    SMALL,
    START_TIMEOUT,
    ConsoleProcess,
    cells,
    lag_rows,
    make_root,
    order_messages,
    order_schema,
)

pytest.importorskip("starlette", reason="the console needs the 'console' extra")
with warnings.catch_warnings():
    # Starlette 1.x suggests httpx2 for its TestClient; httpx is what it still runs on.
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

import pyarrow as pa

from rocketstore.pipeline import cli, extras
from rocketstore.pipeline.console import rates, views
from rocketstore.pipeline.console.app import create_app
from rocketstore.pipeline.console.views import Console
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format import bodyformat
from rocketstore.pipeline.format.message import Message
from tests.kit.files import snapshot

LOCAL = "http://127.0.0.1"


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_root(tmp_path_factory.mktemp("console"))


@pytest.fixture
def client(store_root: tuple[Path, Path]) -> Iterator[TestClient]:
    """A client of a loopback console (no token); the root's bytes must not change."""
    root, checkpoint = store_root
    before = snapshot(root)
    app = create_app(Console(root, SMALL, (checkpoint,)))
    with TestClient(app, base_url=LOCAL) as c:
        yield c
    assert snapshot(root) == before, "the console changed the store"


def test_overview_counts_brokers_topics_and_draws_the_hour(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200
    topics = {row[0]: row for row in cells(r.text, "topics")}
    assert topics["orders"][4] == str(sum(ORDERS_PER_QUEUE.values()))
    assert topics["orders"][1] == "json"
    assert topics["logs"][4] == "3"
    brokers = {row[0]: row for row in cells(r.text, "brokers")}
    assert set(brokers) == {"broker-0", "broker-1"}
    assert brokers["broker-0"][2] == "53" and brokers["broker-1"][2] == "40"
    chart = re.search(r'<figure id="rate-chart">(.*?)</figure>', r.text, re.S)
    assert chart and "<svg" in chart.group(1) and "<path" in chart.group(1)
    assert r.headers["content-security-policy"].startswith("default-src 'none'")


def test_topic_page_lists_queues_and_says_whether_it_sampled(client: TestClient) -> None:
    r = client.get("/topic/orders")
    assert r.status_code == 200
    assert re.search(r'<span id="topic-count">90</span>', r.text)
    rows = cells(r.text, "queues")
    got = {(row[0], int(row[1])): (int(row[2]), int(row[3]), int(row[4])) for row in rows}
    assert got == {k: (0, n, n) for k, n in ORDERS_PER_QUEUE.items()}
    assert "Exact: every message" in r.text  # at most 240 a queue: all read


def test_browse_a_queue_from_an_offset_and_page_on(client: TestClient) -> None:
    r = client.get(
        "/messages",
        params={"topic": "orders", "broker": "broker-0", "queue": "0", "offset": "5", "count": "3"},
    )
    assert r.status_code == 200
    rows = cells(r.text, "messages")
    assert [int(row[2]) for row in rows] == [5, 6, 7]
    assert 'offset=8&amp;count=3">Next 3' in r.text


def test_browse_from_a_time(client: TestClient, store_root: tuple[Path, Path]) -> None:
    root, _ = store_root
    with MessageStore(root / "broker-1", SMALL, read_only=True) as store:
        when = store.get_messages("orders", 1, 0, 1).messages[0].store_timestamp
    r = client.get(
        "/messages",
        params={"topic": "orders", "broker": "broker-1", "queue": "1", "time": str(when - 1)},
    )
    assert r.status_code == 200
    assert cells(r.text, "messages")[0][2] == "0"


def test_lookup_by_key_and_the_message_page_decodes_the_json_body(client: TestClient) -> None:
    r = client.get("/messages", params={"topic": "orders", "by": "key", "key": "order-3"})
    assert r.status_code == 200
    rows = cells(r.text, "messages")
    assert len(rows) == 1 and rows[0][5] == "order-3"
    link = re.search(r'href="(/message\?broker=[^"]+)"', r.text)
    assert link
    page = client.get(html.unescape(link.group(1)))
    assert page.status_code == 200
    body = re.search(r'<pre id="body" class="body-json">(.*?)</pre>', page.text, re.S)
    assert body and json.loads(html.unescape(body.group(1))) == {
        "id": 3,
        "customer": "customer-3",
        "amount": 4.5,
    }


def test_lookup_by_msgid_and_by_commitlog_offset(
    client: TestClient, store_root: tuple[Path, Path]
) -> None:
    root, _ = store_root
    with MessageStore(root / "broker-1", SMALL, read_only=True) as store:
        m = store.get_messages("orders", 0, 4, 1).messages[0]
    r = client.get(
        "/messages", params={"topic": "orders", "by": "msgid", "msgid": m.msg_id.lower()}
    )
    assert r.status_code == 200
    assert cells(r.text, "messages")[0][:3] == ["broker-1", "0", "4"]
    r = client.get(
        "/messages",
        params={
            "topic": "orders",
            "by": "offset",
            "broker": "broker-1",
            "phys": str(m.commit_log_offset),
        },
    )
    assert r.status_code == 200 and m.msg_id in r.text
    inside = client.get(
        "/message", params={"broker": "broker-1", "offset": str(m.commit_log_offset + 1)}
    )
    assert inside.status_code == 404 and "no record starts" in inside.text


def test_bodies_are_escaped_and_binary_shows_as_hex(client: TestClient) -> None:
    r = client.get("/messages", params={"topic": "logs", "broker": "broker-0", "queue": "0"})
    assert r.status_code == 200
    assert b"<script>" not in r.content and "&lt;script&gt;" in r.text
    offsets = re.findall(r'href="/message\?broker=broker-0&amp;offset=(\d+)"', r.text)
    hostile = client.get("/message", params={"broker": "broker-0", "offset": offsets[1]})
    assert HOSTILE_BODY.decode() not in hostile.text and "<script>alert" not in hostile.text
    assert str(escape(HOSTILE_BODY.decode())) in hostile.text
    binary = client.get("/message", params={"broker": "broker-0", "offset": offsets[2]})
    assert 'class="body-hex">00 01 02 03' in binary.text


def _lag_rows(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    assert cli.main(["lag", *argv, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_lag_equals_the_lag_command(
    client: TestClient, store_root: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root, checkpoint = store_root
    config = root.parent / "small.toml"
    printed = _lag_rows(capsys, str(root), "--checkpoint", str(checkpoint), "--config", str(config))
    r = client.get("/consumers")
    assert r.status_code == 200
    sections = re.findall(
        r'<section class="consumer" data-kind="(\w+)" data-name="([^"]*)">(.*?)</section>',
        r.text,
        re.S,
    )
    shown: list[dict[str, Any]] = []
    for kind, name, body in sections:
        for entry in lag_rows(body):
            if kind == "group":
                shown.append({"group": html.unescape(name), **entry})
            else:
                shown.append({**entry, "batchId": 1})
        assert "<svg" in body
    assert shown == printed
    assert sum(e["lag"] for e in printed if "group" not in e) == 55


@pytest.mark.parametrize(
    ("url", "status", "says"),
    [
        ("/topic/no-such-topic", 404, "no topic"),
        ("/topic/bad%20name", 400, "a topic is 1 to 127"),
        ("/topic/" + "a" * 128, 400, "a topic is 1 to 127"),
        ("/topic/..%2F..%2Fetc", 404, "no such page"),
        ("/messages?topic=orders&broker=../../etc&queue=0", 404, "no broker"),
        ("/messages?topic=orders&broker=broker-0&queue=-1", 400, "queue=-1"),
        ("/messages?topic=orders&broker=broker-0&queue=99", 404, "has no queue 99"),
        (
            "/messages?topic=orders&broker=broker-0&queue=0&offset=" + "9" * 40,
            400,
            "expected an integer",
        ),
        (
            "/messages?topic=orders&broker=broker-0&queue=0&offset=99999999999999999999",
            400,
            "expected an integer",
        ),
        ("/messages?topic=orders&broker=broker-0&queue=0&count=51", 400, "count=51"),
        ("/messages?topic=orders&broker=broker-0&queue=0&time=yesterday", 400, "ISO 8601"),
        ("/messages?topic=orders&by=sideways", 400, "by="),
        ("/messages?topic=orders&by=key", 400, "key is required"),
        ("/messages?topic=orders&by=key&key=a%20b", 400, "without spaces"),
        ("/messages?topic=orders&by=msgid&msgid=xyz", 400, "32 or 56 hex"),
        ("/messages?topic=orders&by=msgid&msgid=" + "0" * 32, 404, "no broker of this root"),
        (
            "/messages?topic=orders&by=offset&broker=broker-0&phys=999999999",
            404,
            "outside the log",
        ),
        ("/message?broker=broker-0", 400, "offset is required"),
        ("/static/../../pyproject.toml", 404, ""),
        ("/nowhere", 404, "no such page"),
    ],
)
def test_bad_input_is_a_clear_400_or_404(
    client: TestClient, url: str, status: int, says: str
) -> None:
    r = client.get(url)
    assert r.status_code == status, r.text[-500:]
    assert says in html.unescape(r.text)


def test_verify_from_the_health_page(client: TestClient) -> None:
    assert "No run yet" in client.get("/health").text
    r = client.post("/health/verify", follow_redirects=False)
    assert r.status_code == 303
    health = client.app.state.health  # type: ignore[attr-defined]
    assert health.wait(60), "verify did not finish in 60 s"
    page = client.get("/health").text
    assert "Finished: no problems" in page
    rows = cells(page, "verify-results")
    assert [(r[0], r[1]) for r in rows] == [("broker-0", "ok"), ("broker-1", "ok")]
    assert client.get("/health/verify").status_code == 405


def test_a_post_from_another_site_is_refused(client: TestClient) -> None:
    r = client.post(
        "/health/verify", headers={"Origin": "http://evil.example"}, follow_redirects=False
    )
    assert r.status_code == 403


def test_loopback_console_refuses_other_host_names(client: TestClient) -> None:
    assert client.get("/", headers={"Host": "rebound.example:8080"}).status_code == 403
    assert client.get("/health", headers={"Host": "localhost:8080"}).status_code == 200


def test_token_by_header_or_query_then_cookie(store_root: tuple[Path, Path]) -> None:
    root, _ = store_root
    token = "t" * 24
    app = create_app(Console(root, SMALL), token)
    with TestClient(app, base_url="http://console.example") as c:
        assert c.get("/health").status_code == 401
        assert c.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/health?token=" + "t" * 23).status_code == 401
        assert c.get("/health", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        r = c.get(f"/health?x=1&token={token}", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/health?x=1"
        assert "httponly" in r.headers["set-cookie"].lower()
        assert "samesite=strict" in r.headers["set-cookie"].lower()
        assert c.get("/health").status_code == 200  # the cookie now


def test_console_command_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    short = tmp_path / "token"
    short.write_text("short\n")
    assert cli.main(["console", str(tmp_path), "--port", "0"]) == 2
    assert "not a store root" in capsys.readouterr().err
    root, _ = make_root(tmp_path / "r")
    assert cli.main(["console", str(root), "--token-file", str(short), "--port", "0"]) == 2
    assert "at least 16" in capsys.readouterr().err
    real = extras.importlib.util.find_spec
    monkeypatch.setattr(
        extras.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "uvicorn" else real(name, *a),
    )
    assert cli.main(["console", str(root), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "the console needs the 'console' extra: pip install 'rocketstore[console]'" in err


def test_rates_exact_when_every_unit_is_read_and_sampled_beyond(tmp_path: Path) -> None:
    """Per-minute counts from store timestamps: exact with every unit read; with a sample,
    the buckets still add up to the queue's messages and the page says it sampled."""
    root = tmp_path / "root"
    with MessageStore(root / "broker-0", SMALL) as store:
        store.put_batch([Message("big", b"x", queue_id=0) for _ in range(300)])
        store.put_batch([Message("small", b"y", queue_id=0) for _ in range(7)])
        infos = {i.topic: i for i in store.queue_infos()}
        edges, _ = rates.bucket_edges(views.now_ms() - 3_600_000, views.now_ms())
        exact = rates.sample_queue(store, "small", 0, 0, 7, limit=240)
        assert not exact.sampled and rates.counts(exact, 0, edges).sum() == 7
        sampled = rates.sample_queue(store, "big", 0, 0, infos["big"].max_offset, limit=50)
        assert sampled.sampled and len(sampled.offsets) == 50
        assert rates.counts(sampled, 0, edges).sum() == pytest.approx(300)
        assert rates.offset_at(store, "big", 0, 0, 300, 0) == 0
        assert rates.offset_at(store, "big", 0, 0, 300, 2**62) == 300
    app = create_app(Console(root, SMALL))
    with TestClient(app, base_url=LOCAL) as c:
        page = c.get("/topic/big").text
        assert "Sampled" in page and "240 of 300" in page


def test_a_single_store_directory_is_a_root_of_one_broker(store_root: tuple[Path, Path]) -> None:
    root, _ = store_root
    app = create_app(Console(root / "broker-1", SMALL))
    with TestClient(app, base_url=LOCAL) as c:
        rows = cells(c.get("/").text, "brokers")
        assert [r[0] for r in rows] == ["broker-1"] and rows[0][2] == "40"
        page = c.get("/messages", params={"topic": "orders", "broker": "broker-1", "queue": "1"})
        assert len(cells(page.text, "messages")) == 15


def test_pages_read_while_a_writer_holds_the_store(tmp_path: Path) -> None:
    """A writer has the broker open (and its lock): the console still reads, takes no lock,
    and shows what the writer appends without closing."""
    root, _ = make_root(tmp_path)
    app = create_app(Console(root, SMALL))
    with MessageStore(root / "broker-1", SMALL) as writer, TestClient(app, base_url=LOCAL) as c:
        assert re.search(r'id="topic-count">90<', c.get("/topic/orders").text)
        writer.put_batch(order_messages(order_schema(), 500, 7, 0))
        assert re.search(r'id="topic-count">97<', c.get("/topic/orders").text)
        found = c.get("/messages", params={"topic": "orders", "by": "key", "key": "order-503"})
        assert len(cells(found.text, "messages")) == 1
        writer.put_batch(order_messages(order_schema(), 600, 1, 0))  # the writer still can


def test_binding_off_loopback_prints_a_token_every_request_needs(tmp_path: Path) -> None:
    root, _ = make_root(tmp_path)
    argv = [str(root), "--config", str(tmp_path / "small.toml"), "--port", "0", "--bind", "0.0.0.0"]
    server = ConsoleProcess(argv)
    try:
        printed = "".join(server.output)
        token = re.search(r"token (\S+)\n", printed)
        assert token, printed
        url = server.url.replace("0.0.0.0", "127.0.0.1") + "health"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=30)
        assert refused.value.code == 401
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token.group(1)}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
        hint = server.lines.get(timeout=START_TIMEOUT)  # printed just after the address
        assert "?token=" in hint and "/metrics: the header only" in hint, hint
        metrics = url.replace("health", f"metrics?token={token.group(1)}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(metrics, timeout=30)
        assert refused.value.code == 400
    finally:
        assert server.interrupt() == 0


def test_health_lists_the_problems_of_a_damaged_store(tmp_path: Path) -> None:
    root, _ = make_root(tmp_path)
    segment = next((root / "broker-0" / "commitlog").iterdir())
    data = bytearray(segment.read_bytes())
    at = data.index(b'"customer":"customer-0"')
    data[at + 1] ^= 0x20  # one body byte: the record's CRC no longer matches
    segment.write_bytes(bytes(data))
    app = create_app(Console(root, SMALL))
    with TestClient(app, base_url=LOCAL) as c:
        c.post("/health/verify")
        assert app.state.health.wait(60)
        page = c.get("/health").text
    assert "problem(s)" in page
    rows = cells(page, "verify-results")
    assert rows[0][0] == "broker-0" and "problem" in rows[0][1] and rows[1][1] == "ok"
    problems = cells(page, "problems")
    assert problems and any("crc" in " ".join(p).lower() for p in problems), problems


def test_an_avro_body_is_decoded_with_its_registered_schema(tmp_path: Path) -> None:
    root = tmp_path / "root"
    schema = bodyformat.BodySchema.from_arrow(ORDER_SCHEMA, "payments")
    meta = StoreRoot(root)
    meta.register_schema(schema.fingerprint, schema.document())
    meta.ensure_topic("payments", TopicMeta(1, 1, "avro", (schema.fingerprint,)))
    table = pa.table({"id": [7], "customer": ["<b>c</b>"], "amount": [2.5]}, schema=ORDER_SCHEMA)
    (body,) = bodyformat.encode_bodies(table, schema, "avro").to_pylist()
    props = {bodyformat.SCHEMA_PROPERTY: schema.fingerprint}
    with MessageStore(root / "broker-0", SMALL) as store:
        offset = store.put(Message("payments", body, properties=props)).commit_log_offset
    app = create_app(Console(root, SMALL))
    with TestClient(app, base_url=LOCAL) as c:
        page = c.get("/message", params={"broker": "broker-0", "offset": str(offset)}).text
    shown = re.search(r'<pre id="body" class="body-avro">(.*?)</pre>', page, re.S)
    assert shown, page[-600:]
    assert json.loads(html.unescape(shown.group(1))) == {
        "id": 7,
        "customer": "<b>c</b>",
        "amount": 2.5,
    }
    assert "<b>c</b>" not in page
