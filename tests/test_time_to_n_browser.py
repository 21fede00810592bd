"""The time-to-N page in headless chromium, built from the committed results/time_to_n/ files.

Checks: no console error, no request that is not file:// or data:, one rendered figure per
workload with its curves and crossover stars drawn, the ratio table, and the workload filter.
Skipped where chromium or chromedriver is missing (as tests/test_dashboard_browser.py).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dashboards.builder import build_dashboard
from test_dashboard_browser import (  # noqa: F401  (driver and shots are fixtures)
    FIXTURE, RENDERED, VISIBLE_ROWS, drain, driver, network_problems, open_page, pytestmark, screenshot, shots,
    wait_for)
from workloads import time_to_n as ttn

REPO = Path(__file__).resolve().parents[1]
TRACES = ("return Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(g => g.data.filter("
          "t => t.visible === undefined || t.visible === true).map(t => [t.name, (t.meta || {}).workload]))")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory):
    results = tmp_path_factory.mktemp("results")
    shutil.copytree(FIXTURE, results, dirs_exist_ok=True)
    shutil.copytree(REPO / "results" / ttn.RESULTS_DIR, results / ttn.RESULTS_DIR)
    out = tmp_path_factory.mktemp("dashboard")
    return build_dashboard(results, out), out, results


def test_time_to_n_page_renders_curves_and_crossovers(driver, site, shots: Path) -> None:  # noqa: F811
    from selenium.webdriver.support.ui import Select

    result, out, results = site
    _, curves = ttn.load(ttn.newest(results)[0])
    workloads = sorted({c.workload for c in curves})
    drain(driver)
    open_page(driver, out, "time_to_n.html", len(workloads))
    assert driver.execute_script(RENDERED) == result.pages["time_to_n.html"] == len(workloads)
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors
    assert not network_problems(driver)
    traces = driver.execute_script(TRACES)
    drawn = {tuple(t) for t in traces}
    for c in curves:
        if c.points:
            assert (c.label, c.workload) in drawn, (c.label, c.workload)
    assert any(name == "crossover" for name, _ in traces), "no crossover star drawn"
    assert driver.execute_script(VISIBLE_ROWS) == 2 * len(workloads)  # two ratio tables
    screenshot(driver, shots / "time_to_n.png")
    print(f"\nscreenshot: {shots / 'time_to_n.png'}")

    # The filter's options come from the asv results (the fixture's workloads are others): add this
    # page's first workload as an option, as a full run's results would list it, and pick it.
    driver.execute_script("document.querySelector('select[data-vb-filter=\"workload\"]')"
                          ".add(new Option(arguments[0], arguments[0]))", workloads[0])
    Select(driver.find_element("css selector", 'select[data-vb-filter="workload"]')).select_by_value(workloads[0])
    cards = ("return Array.from(document.querySelectorAll('.vb-card'))"
             ".filter(c => !c.classList.contains('vb-hidden')).length")
    wait_for(lambda: driver.execute_script(cards) == 1, what="one figure card after filtering")
    wait_for(lambda: driver.execute_script(VISIBLE_ROWS) == 2, what="one row per table after filtering")
    assert {w for _, w in driver.execute_script(TRACES)} == {workloads[0]}
