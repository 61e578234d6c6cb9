"""The console in a real browser: ``rocketstore console`` as a subprocess on a free loopback
port, headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by selenium.

Each page is opened and screenshotted into the test's temporary directory (set
``ROCKETSTORE_CONSOLE_SHOTS=DIR`` to keep them elsewhere, as docs/images was made), and checked
for what a person would look at: the topic's count, a chart with data points, a known query's
lag, a message found by key, a verify run that finishes. Then messages appended while the topic
page is open appear on it by its own refresh. Ctrl-C (SIGINT) stops the server cleanly.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.localstate import TierState
from tests.kit.consolekit import ConsoleProcess as Server
from tests.kit.consolekit import append_orders, make_root

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
pytest.importorskip("starlette", reason="the console needs the 'console' extra")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None or DRIVER is None,
        reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
        "chromium-driver; .ci/run installs them)",
    ),
]


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("ROCKETSTORE_CONSOLE_SHOTS") or tmp_path / "shots")
    target.mkdir(parents=True, exist_ok=True)
    return target


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    root, checkpoint = make_root(tmp_path)
    server = Server(
        [
            str(root),
            "--checkpoint",
            str(checkpoint),
            "--config",
            str(tmp_path / "small.toml"),
            "--port",
            "0",
        ]
    )
    try:
        yield server, root
    finally:
        status = server.interrupt()
        rest = "".join(server.output) + "".join(iter_queue(server.lines))
        assert status == 0, rest
        assert "stopped" in rest


def iter_queue(q: queue.Queue[str]) -> Iterator[str]:
    while True:
        try:
            yield q.get_nowait()
        except queue.Empty:
            return


@pytest.fixture
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1200,900",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(DRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: Any, shots: Path, name: str) -> Path:
    """A screenshot of the whole page: the viewport grown to the page's height (within
    reason) for the shot, then put back."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    metrics = {"width": 1200, "height": min(max(height, 500), 2400), "deviceScaleFactor": 1}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "mobile": False})
    path = shots / f"console-{name}.png"
    driver.save_screenshot(str(path))
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return path


def _text(driver: Any, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def _chart_points(driver: Any, css: str) -> int:
    """Vertices of the data lines or bars of the SVG chart under ``css`` (matplotlib names
    lines ``line2d_N`` and bars ``patch_N``)."""
    return int(
        driver.execute_script(
            """
            const svg = document.querySelector(arguments[0] + ' svg');
            if (!svg) return 0;
            let n = 0;
            for (const p of svg.querySelectorAll('g[id^="line2d"] path, g[id^="patch"] path')) {
              const d = p.getAttribute('d') || '';
              n += (d.match(/[ML]/g) || []).length;
            }
            return n;
            """,
            css,
        )
    )


def test_every_page_in_chromium(console: tuple[Server, Path], browser: Any, shots: Path) -> None:
    server, root = console
    d = browser
    d.get(server.url)
    assert _text(d, 'tr[data-topic="orders"] td.count') == "90"
    assert _chart_points(d, "#rate-chart") > 10
    _shot(d, shots, "overview")

    d.get(server.url + "topic/orders")
    assert _text(d, "#topic-count") == "90"
    assert _chart_points(d, "#topic-chart") > 10
    _shot(d, shots, "topic")

    d.get(server.url + "messages?topic=orders&by=key&key=order-42")
    rows = d.find_elements(By.CSS_SELECTOR, "#messages tbody tr")
    assert len(rows) == 1 and "order-42" in rows[0].text
    _shot(d, shots, "messages")
    rows[0].find_element(By.CSS_SELECTOR, "a.msgid").click()
    WebDriverWait(d, 30).until(lambda drv: drv.find_elements(By.ID, "body"))
    assert '"customer": "customer-0"' in _text(d, "#body")  # 42 % 7
    _shot(d, shots, "message")

    d.get(server.url + "consumers")
    query = d.find_element(By.CSS_SELECTOR, 'section[data-kind="query"]')
    assert query.find_element(By.CSS_SELECTOR, ".total-lag").text == "55"
    assert _chart_points(d, 'section[data-kind="query"] .lag-chart') > 0
    group = d.find_element(By.CSS_SELECTOR, 'section[data-name="billing"]')
    assert group.find_element(By.CSS_SELECTOR, ".total-lag").text == "75"
    _shot(d, shots, "consumers")

    d.get(server.url + "health")
    d.find_element(By.ID, "verify").click()
    WebDriverWait(d, 90, poll_frequency=0.5).until(
        lambda drv: "Finished" in drv.find_element(By.ID, "verify-state").text
    )
    assert "no problems" in _text(d, "#verify-state")
    _shot(d, shots, "health")

    # Appended while the topic page is open: its own refresh (every 10 s) shows them.
    d.get(server.url + "topic/orders")
    append_orders(root, "broker-1", 1, 1000, 10)
    WebDriverWait(d, 60, poll_frequency=0.5).until(
        lambda drv: drv.find_element(By.ID, "topic-count").text == "100"
    )
    assert d.find_element(By.ID, "refreshed").text.startswith("updated")


def test_a_console_bound_off_loopback_needs_its_token(tmp_path: Path, browser: Any) -> None:
    root, _ = make_root(tmp_path)
    token = "browser-token-0123456789"
    (tmp_path / "token").write_text(token + "\n")
    server = Server(
        [
            str(root),
            "--config",
            str(tmp_path / "small.toml"),
            "--port",
            "0",
            "--bind",
            "0.0.0.0",
            "--token-file",
            str(tmp_path / "token"),
        ]
    )
    try:
        url = server.url.replace("0.0.0.0", "127.0.0.1")
        d = browser
        d.get(url)
        assert "needs its token" in _text(d, "body")
        d.get(url + "?token=" + token)
        assert d.current_url == url  # the token left the address
        assert _text(d, 'tr[data-topic="orders"] td.count') == "90"
    finally:
        assert server.interrupt() == 0


def test_the_tier_table_in_chromium(tmp_path: Path, browser: Any, shots: Path) -> None:
    """With the tier on, the overview's tier table: the segments as the files are, what the
    uploader recorded (written here by hand), and its refresh showing a failed run counted
    while the page is open."""
    conf = tmp_path / "tier.toml"
    conf.write_text(
        "mappedFileSizeCommitLog = 65536\nmaxHashSlotNum = 1000\nmaxIndexNum = 20000\n"
        'tieredStorageLevel = "NOT_IN_DISK"\nobjectStoreBucket = "never-asked"\n'
    )
    store = tmp_path / "root" / "broker-0"
    config = StoreConfig.load(conf)
    with MessageStore(store, config) as s:
        s.put_batch([Message("T", bytes(1000), queue_id=k % 2) for k in range(300)])
    files = sorted((store / "commitlog").iterdir())
    record = TierState("id", int(files[1].name), bucket_segments=1, upload_errors=2)
    localstate.write(store, record)
    server = Server([str(tmp_path / "root"), "--config", str(conf), "--port", "0"])
    try:
        d = browser
        d.get(server.url)
        row = d.find_elements(By.CSS_SELECTOR, '#tiers tr[data-broker="broker-0"] td')
        texts = [c.text for c in row]
        # Local: every file; bucket: the record's one; pending: sealed (all but the last)
        # from the second on.
        assert [texts[k] for k in (0, 1, 3, 5, 9)] == [
            "broker-0",
            str(len(files)),
            "1",
            str(len(files) - 2),
            "2",
        ]
        _shot(d, shots, "tiers")
        localstate.write(store, dataclasses.replace(record, upload_errors=3))
        WebDriverWait(d, 60, poll_frequency=0.5).until(
            lambda drv: (
                drv.find_element(
                    By.CSS_SELECTOR, '#tiers tr[data-broker="broker-0"] td:nth-child(10)'
                ).text
                == "3"
            )
        )
    finally:
        assert server.interrupt() == 0
