"""The HTML report in a real browser: headless Chromium (Debian's `chromium`, `chromium-driver`)
through Selenium. The page loads without console errors, a header click sorts the rows, a row click
shows its evidence, and every plot is drawn (a pixel check of its screenshot).

Skipped only where Chromium or its driver cannot be found; `.ci/run` installs them and sets
KBV_REQUIRE_BROWSER=1, which turns a missing browser into a failure."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbv.report.publish import write_report
from records import write_run

pytestmark = pytest.mark.browser


def _unavailable(reason: str) -> None:
    if os.environ.get("KBV_REQUIRE_BROWSER"):
        pytest.fail(f"KBV_REQUIRE_BROWSER is set and {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def driver() -> Iterator[object]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium is not installed (pip install selenium)")
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    chromedriver = shutil.which("chromedriver")
    if browser is None or chromedriver is None:
        _unavailable("chromium or chromedriver not found (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="module")
def page_url(sample_run: Path, sample_html: str) -> str:
    return (sample_run / "report.html").resolve().as_uri()


def errors_in_console(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def load(driver, url: str) -> None:
    driver.get(url)
    driver.get_log("browser")  # drop what an earlier page logged


def test_the_console_check_sees_errors(driver, tmp_path: Path) -> None:
    """The check below can fail: a page with a script error shows in the log."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>notAFunction();</script></body></html>")
    driver.get(bad.as_uri())
    assert any("notAFunction" in e["message"] for e in errors_in_console(driver))


def test_the_page_loads_without_console_errors(driver, page_url: str) -> None:
    load(driver, "about:blank")
    driver.get(page_url)
    assert driver.title.startswith("kbv report")
    assert errors_in_console(driver) == []
    ids = driver.execute_script("return Array.from(document.querySelectorAll('main > section')).map(s => s.id)")
    assert ids == ["summary", "leaderboard", "plots", "pairs", "provenance"]


def _column(driver, index: int) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.getElementById('pairs-table').tBodies)"
        ".map(b => b.rows[0].cells[arguments[0]].getAttribute('data-sort'))", index)


def test_clicking_a_header_sorts_the_rows_and_their_evidence_moves_with_them(driver, page_url: str) -> None:
    load(driver, page_url)
    speed_col = 7
    header = driver.find_elements("css selector", "#pairs-table > thead th")[speed_col]
    assert header.text.startswith("speedup")
    before = _column(driver, speed_col)
    header.find_element("css selector", "button").click()
    ascending = _column(driver, speed_col)
    numbers = [float(s) for s in ascending if s]
    assert numbers == sorted(numbers) and ascending != before
    assert ascending[len(numbers):] == [""] * (len(ascending) - len(numbers))  # no speedup: last
    assert header.get_attribute("aria-sort") == "ascending"
    header.find_element("css selector", "button").click()
    descending = [float(s) for s in _column(driver, speed_col) if s]
    assert descending == sorted(numbers, reverse=True) and header.get_attribute("aria-sort") == "descending"
    paired = driver.execute_script(
        "return Array.from(document.getElementById('pairs-table').tBodies)"
        ".every(b => b.rows[1].id === b.rows[0].getAttribute('aria-controls'))")
    assert paired
    problem = driver.find_elements("css selector", "#pairs-table > thead th")[0].find_element("css selector", "button")
    problem.click()
    problems = _column(driver, 0)
    assert problems == sorted(problems)


def test_clicking_a_row_shows_its_evidence(driver, page_url: str) -> None:
    load(driver, page_url)
    rows = driver.find_elements("css selector", "#pairs-table tr.row")
    target = next(r for r in rows if "relu_cache" in r.text and "verified" in r.text)
    panel = driver.find_element("id", target.get_attribute("aria-controls"))
    assert not panel.is_displayed()
    target.click()
    assert panel.is_displayed() and target.get_attribute("aria-expanded") == "true"
    assert "KBV-S502" in panel.text and "cache.setdefault(x.data_ptr()" in panel.text
    highlighted = panel.find_element("css selector", "pre.source .line.hit")
    assert highlighted.is_displayed() and highlighted.value_of_css_property("background-color") != "rgba(0, 0, 0, 0)"
    target.click()
    assert not panel.is_displayed()
    assert errors_in_console(driver) == []


def colored_pixels(png: bytes) -> int:
    """Pixels of a screenshot in a clear colour (series are coloured; axes, text and paper are grey)."""
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)  # (height, width, 3)
    return int(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 60).sum())


def test_every_plot_is_drawn(driver, page_url: str, tmp_path: Path) -> None:
    load(driver, page_url)
    figures = driver.find_elements("css selector", "figure.plot")
    assert len(figures) == 5
    for figure in figures:
        size = figure.size
        assert size["width"] > 300 and size["height"] > 200, figure.get_attribute("data-plot")
        assert colored_pixels(figure.screenshot_as_png) > 300, figure.get_attribute("data-plot")
    # the check tells a plot from a blank one: an empty run's plots say "nothing to plot"
    empty = write_report([str(write_run(tmp_path / "empty", []))], "html").path
    load(driver, empty.resolve().as_uri())
    for figure in driver.find_elements("css selector", "figure.plot"):
        assert colored_pixels(figure.screenshot_as_png) < 50
