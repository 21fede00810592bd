"""The dashboard in a real browser: headless Debian chromium opens every page from file://.

Checks: no console error, no request that is not file:// or data: (and none failing), every
figure the build wrote is rendered as SVG, the filters change what is shown, the compare table is
built and sorts. Screenshots go to a temporary folder (or $VMAPBENCH_SCREENSHOTS) and their path
is printed. Skipped, with the reason, where chromium or chromedriver is missing (.ci/run installs
them: apt-get install chromium chromium-driver).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from dashboards.builder import build_dashboard
from dashboards.page import PAGES

FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
                       reason=f"needs Debian chromium and chromedriver ({CHROMIUM}, {CHROMEDRIVER}): "
                              "apt-get install chromium chromium-driver"),
]

# JavaScript run in the page.
RENDERED = ("return Array.from(document.querySelectorAll('.js-plotly-plot'))"
            ".filter(g => g.querySelector('svg.main-svg')).length")
VISIBLE_TRACES = ("return Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap("
                  "g => g.data.filter(t => t.visible === undefined || t.visible === true)"
                  ".map(t => t.meta || {}))")
DRAWN_POINTS = "return document.querySelectorAll('.js-plotly-plot g.trace g.point, .js-plotly-plot g.trace path.js-line').length"
VISIBLE_ROWS = "return document.querySelectorAll('tr.vb-f:not(.vb-hidden)').length"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("dashboard")
    return build_dashboard(FIXTURE, out), out


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("VMAPBENCH_SCREENSHOTS")
    folder = Path(env) if env else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="vmapbench-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-default-apps", "--disable-dev-shm-usage", "--window-size=1400,1000",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    drv.get("about:blank")
    drain(drv)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


def drain(drv: Any) -> None:
    drv.get_log("browser")
    drv.get_log("performance")


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def open_page(drv: Any, out: Path, page: str, figures: int, fragment: str = "") -> None:
    drv.get((out / page).as_uri() + fragment)
    wait_for(lambda: drv.execute_script("return document.readyState") == "complete", what=f"{page} to load")
    wait_for(lambda: drv.execute_script(RENDERED) >= figures, what=f"{figures} rendered figures on {page}")


def network_problems(drv: Any) -> list[str]:
    """Requests made by our pages that are not local files, and requests that failed."""
    ours: dict[str, str] = {}
    problems = []
    for entry in drv.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent" and params.get("documentURL", "").startswith("file://"):
            url = params["request"]["url"]
            ours[params["requestId"]] = url
            if not url.startswith(("file://", "data:")):
                problems.append(f"external request {url}")
        elif message["method"] == "Network.loadingFailed" and params.get("requestId") in ours:
            problems.append(f"failed request {ours[params['requestId']]}: {params.get('errorText')}")
    return problems


def screenshot(drv: Any, path: Path) -> None:
    height = drv.execute_script("return document.documentElement.scrollHeight")
    drv.set_window_size(1400, min(max(height, 600), 6000))
    drv.save_screenshot(str(path))
    drv.set_window_size(1400, 1000)


def test_every_page_renders_offline_without_errors(driver, site, shots: Path) -> None:
    result, out = site
    for page, _ in PAGES:
        drain(driver)
        expected = result.pages[page]
        open_page(driver, out, page, expected)
        assert driver.execute_script(RENDERED) == expected, page
        assert driver.execute_script("return document.querySelectorAll('.js-plotly-plot').length") == expected
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, f"{page}: console errors {errors}"
        assert not network_problems(driver), page
        screenshot(driver, shots / page.replace(".html", ".png"))
    print(f"\nscreenshots: {shots}")
    assert sum(result.pages.values()) >= 10


def test_filters_change_the_shown_data(driver, site) -> None:
    from selenium.webdriver.support.ui import Select

    result, out = site
    open_page(driver, out, "index.html", result.pages["index.html"])
    traces = driver.execute_script(VISIBLE_TRACES)
    points = driver.execute_script(DRAWN_POINTS)
    rows = driver.execute_script(VISIBLE_ROWS)
    assert {t["workload"] for t in traces} == {"bayes_logreg_hessian", "jacobian_chunked", "per_sample_grad_mlp"}

    Select(driver.find_element("css selector", 'select[data-vb-filter="workload"]')).select_by_value("per_sample_grad_mlp")
    wait_for(lambda: driver.execute_script(DRAWN_POINTS) < points, what="fewer bars after filtering")
    shown = driver.execute_script(VISIBLE_TRACES)
    assert shown and {t["workload"] for t in shown} == {"per_sample_grad_mlp"}
    assert len(shown) < len(traces)
    assert 0 < driver.execute_script(VISIBLE_ROWS) < rows

    # The filter travels in the URL to the next page through the navigation bar.
    link = driver.find_element("css selector", 'a[data-vb-nav="scaling.html"]')
    assert link.get_attribute("href").endswith("#workload=per_sample_grad_mlp")
    link.click()
    wait_for(lambda: driver.current_url.split("/")[-1].startswith("scaling.html"), what="scaling page")
    open_page(driver, out, "scaling.html", result.pages["scaling.html"], "#workload=per_sample_grad_mlp")
    cards = driver.execute_script("return Array.from(document.querySelectorAll('.vb-card'))"
                                  ".filter(c => !c.classList.contains('vb-hidden')).length")
    assert cards == 1

    machine = Select(driver.find_element("css selector", 'select[data-vb-filter="machine"]'))
    machine.select_by_value("cpu-box")
    wait_for(lambda: {t["machine"] for t in driver.execute_script(VISIBLE_TRACES)} == {"cpu-box"},
             what="only cpu-box traces")
    machine.select_by_value("")
    wait_for(lambda: {t["machine"] for t in driver.execute_script(VISIBLE_TRACES)} == {"cpu-box", "gpu-box"},
             what="both machines again")


def test_compare_table_is_built_and_sorts(driver, site) -> None:
    from selenium.webdriver.support.ui import Select

    result, out = site
    open_page(driver, out, "compare.html", 0)
    rows = driver.execute_script(VISIBLE_ROWS)
    assert rows > 50
    summary = driver.find_element("id", "vb-cmp-summary").text
    assert "worse" in summary and "unchanged" in summary
    # The engine regression of the newest commit tops the default order (worst first).
    first = driver.execute_script("return document.querySelector('#vb-compare tbody tr').className")
    assert "vb-worse" in first

    ratios = "return Array.from(document.querySelectorAll('#vb-compare tbody tr:not(.vb-hidden) td.vb-ratio')).map(td => td.textContent)"
    before = driver.execute_script(ratios)
    Select(driver.find_element("id", "vb-cmp-a")).select_by_index(2)  # the oldest commit as base
    after = driver.execute_script(ratios)
    assert before != after

    # The machine filter picks the compared machine; the device filter hides rows.
    Select(driver.find_element("css selector", 'select[data-vb-filter="machine"]')).select_by_value("gpu-box")
    wait_for(lambda: driver.find_element("id", "vb-cmp-machine").get_attribute("value") == "gpu-box",
             what="compare to follow the machine filter")
    gpu_rows = driver.execute_script(VISIBLE_ROWS)
    Select(driver.find_element("css selector", 'select[data-vb-filter="device"]')).select_by_value("cuda")
    wait_for(lambda: 0 < driver.execute_script(VISIBLE_ROWS) < gpu_rows, what="fewer rows for device=cuda")
    devices = driver.execute_script("return Array.from(document.querySelectorAll('#vb-compare tr.vb-f:not(.vb-hidden)'))"
                                    ".map(tr => tr.getAttribute('data-device'))")
    assert set(devices) <= {"cuda", None}

    driver.find_elements("css selector", "#vb-compare thead th")[-1].click()  # ratio: descending first
    keys = driver.execute_script(
        "return Array.from(document.querySelectorAll('#vb-compare tbody td.vb-ratio'))"
        ".map(td => td.getAttribute('data-sort')).filter(k => k !== '').map(Number)")
    assert len(keys) > 50 and keys == sorted(keys, reverse=True)
