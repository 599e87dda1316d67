"""The status page in a real headless Chromium (Debian's ``chromium``, driven by Playwright;
no browser is downloaded) during a real ``sentinel demo --fault nan`` run."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import end_process, wait_for
from tests.integration.test_run import SCRIPTS, _config, _start

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "status-page.png"

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed")]
playwright_api = pytest.importorskip("playwright.sync_api")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    """A faulty demo (NaN gradient at step 60 of 400) serving on a free loopback port."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "demo", "--fault", "nan", "--steps", "400",
                             "--fault-step", "60", "--delay", "0.05", "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(url + "/healthz"), timeout=60, what="the demo's engine to serve")
        yield url
    finally:
        end_process(proc)


def _get(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-background-networking"])
        try:
            yield b
        finally:
            b.close()


def _chart(page: Any, key: str) -> tuple[int, int]:
    """(points drawn, last step drawn) of a chart."""
    svg = page.locator(f'svg[data-chart="{key}"]')
    points = svg.get_attribute("data-points") or "0"
    last = svg.get_attribute("data-last-step") or "0"
    return int(points), int(float(last or "0"))


def test_status_page_shows_the_faulty_run_live(demo: str, browser: Any, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    foreign: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith("http://127.0.0.1:") or r.url.startswith("data:")
            else foreign.append(r.url))
    page.goto(demo + "/")

    # the run and its state
    wait_for(lambda: "demo/demo-nan" in page.locator("#run-select").inner_text(), timeout=30,
             what="the run in the selector")
    assert page.locator("#runs tr[data-run='demo/demo-nan']").count() == 1
    assert page.locator("#ranks tr[data-rank='0'] .badge").inner_text() in ("training", "ended", "stalled")

    # charts with data, and they move as steps arrive
    for key in ("loss", "grad_norm", "learning_rate", "memory_used"):
        wait_for(lambda k=key: _chart(page, k)[0] >= 2, timeout=30, what=f"the {key} chart to hold data")
    first = _chart(page, "loss")[1]
    wait_for(lambda: _chart(page, "loss")[1] > first, timeout=30, what="the loss chart to move on")
    wait_for(lambda: _chart(page, "update_ratio")[0] >= 2, timeout=30, what="update ratios (every 10 steps)")

    # the NaN at step 60: a firing critical alert with its causes and checks, and a marker on the charts
    firing = page.locator(".alert[data-alert='TrainingNonFinite']")
    wait_for(lambda: firing.count() >= 1, timeout=60, what="TrainingNonFinite on the page")
    text = firing.first.inner_text()
    assert "critical" in text and "Likely causes" in text and "First checks" in text
    assert "layers.1" in text  # the first non-finite group named
    wait_for(lambda: page.locator("svg[data-chart='loss'] line[data-marker='TrainingNonFinite']").count() >= 1,
             timeout=10, what="an alert marker on the loss chart")
    marker = page.locator("svg[data-chart='loss'] line[data-marker='TrainingNonFinite'] title").first
    assert "since step 60" in (marker.text_content() or "")  # where the NaN came, not the latest step
    assert "since step 60" in text
    wait_for(lambda: page.locator("#keyvalues [data-key='loss'] b").inner_text() == "NaN", timeout=10,
             what="the current loss shown as NaN, not as a blank")
    assert page.locator("#groups tr[data-group]").count() >= 1  # the per-group view

    page.screenshot(path=str(tmp_path / "status-page.png"), full_page=True)
    if os.environ.get("SENTINEL_UPDATE_SCREENSHOT"):  # how docs/status-page.png was taken
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copy(tmp_path / "status-page.png", SCREENSHOT)
    assert (tmp_path / "status-page.png").stat().st_size > 10_000
    assert errors == [], errors
    assert foreign == [], foreign
    page.close()


def test_status_page_before_any_run_says_so(browser: Any) -> None:
    """An engine with no run yet: the page explains how to start one, without errors."""
    from sentinel.config import load_config
    from sentinel.daemon.service import Service

    cfg, pack = load_config(None)
    service = Service(cfg, pack, "127.0.0.1:0")
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(service.url + "/")
        wait_for(lambda: page.locator("#empty").is_visible(), timeout=15, what="the empty-state note")
        assert "sentinel.watch" in page.locator("#empty").inner_text()
        wait_for(lambda: re.search("updated", page.locator("#updated").inner_text()), timeout=10,
                 what="the first poll")
        assert errors == []
    finally:
        page.close()
        service.stop()


@pytest.mark.slow  # 25-47 s: behind the marker, to keep `make test` well under its 20 minutes
def test_a_stalled_ranks_row_shows_where_its_training_thread_waits(browser: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`sentinel run` of a script that stops stepping in ``wait_for_peer``: the rank's row turns
    *stalled* and names the call, what the on-call person would otherwise py-spy for."""
    monkeypatch.setenv("SENTINEL_HEARTBEAT_SECONDS", "0.5")  # where it waits is looked at every 0.5 s
    cfg = _config(tmp_path, "rules:\n  TrainingStalled:\n    params: {min_seconds: 2}\n")
    proc, url = _start([sys.executable, str(SCRIPTS / "faulty_train.py"), "30", "stall"], config=cfg)
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(url + "/")
        row = page.locator("#ranks tr[data-rank='0']")
        wait_for(lambda: row.count() == 1 and row.locator(".badge").inner_text() == "stalled", timeout=60,
                 what="rank 0 shown as stalled")
        wait_for(lambda: row.locator(".where").count() == 1, timeout=15, what="where rank 0 waits")
        where = row.locator(".where").inner_text()
        assert re.fullmatch(r"in wait \(threading\.py:\d+\) from wait_for_peer \(\S*faulty_train\.py:\d+\)",
                            where), where
        assert errors == [], errors
    finally:
        page.close()
        end_process(proc)
