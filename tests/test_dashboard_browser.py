"""The dashboard in a real browser: headless Debian chromium opens every page from file://.

Checks: no console error, no request that is not file:// or data: (and none failing), every
figure the build wrote is rendered as SVG, the filters change what is shown, the compare table is
built and sorts. The overview's first screen is saved (to a temporary folder, or
$VMAPBENCH_SCREENSHOTS); with $VMAPBENCH_SCREENSHOTS set, every page's full height too. Skipped,
with the reason, where chromium or chromedriver is missing (.ci/run installs them: apt-get install
chromium chromium-driver).
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


# Full-height pictures of every page only where a folder is asked for: each costs chromium a
# re-layout and a large PNG.
FULL_PAGE_SHOTS = bool(os.environ.get("VMAPBENCH_SCREENSHOTS"))


def screenshot(drv: Any, path: Path) -> None:
    """A full-height picture of the page (where FULL_PAGE_SHOTS)."""
    if not FULL_PAGE_SHOTS:
        return
    height = drv.execute_script("return document.documentElement.scrollHeight")
    drv.set_window_size(1400, min(max(height, 600), 6000))
    drv.save_screenshot(str(path))
    drv.set_window_size(1400, 1000)


def test_every_page_renders_offline_without_errors_or_horizontal_scroll(driver, site, shots: Path) -> None:
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
        # No horizontal scroll at the window's 1400 px (before the screenshot resizes it).
        assert driver.execute_script("return document.documentElement.scrollWidth") <= \
            driver.execute_script("return window.innerWidth"), page
        screenshot(driver, shots / page.replace(".html", ".png"))
    if FULL_PAGE_SHOTS:
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
    assert "slower" in summary and "unchanged" in summary and "not judged" in summary
    # The engine regression of the newest commit tops the default order (slower, most certain first).
    first = driver.execute_script("return document.querySelector('#vb-compare tbody tr').className")
    assert "vb-worse" in first
    # RSS deltas are never judged: none of them is called slower or faster.
    rss = driver.execute_script(
        "return Array.from(document.querySelectorAll('#vb-compare tbody tr'))"
        ".filter(tr => tr.getAttribute('data-benchmark').endsWith('track_rss_delta_bytes'))"
        ".map(tr => tr.querySelector('td.vb-verdict').textContent)")
    assert rss and set(rss) <= {"not judged", "in one commit only"}

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

    driver.find_elements("css selector", "#vb-compare thead th")[6].click()  # change: descending first
    keys = driver.execute_script(
        "return Array.from(document.querySelectorAll('#vb-compare tbody td.vb-ratio'))"
        ".map(td => td.getAttribute('data-sort')).filter(k => k !== '').map(Number)")
    assert len(keys) > 50 and keys == sorted(keys, reverse=True)


# Pages whose content is per workload: each must answer for every workload (a drawn trace or a
# table row of it, or a notice that names it).
WORKLOAD_PAGES = ("index.html", "peers.html", "scaling.html", "memory.html", "history.html", "compare.html")
ANSWERS = """
const w = arguments[0];
const traces = Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(
  g => g.data.filter(t => (t.visible === undefined || t.visible === true) && t.meta && t.meta.workload === w));
const rows = Array.from(document.querySelectorAll('tr.vb-f:not(.vb-hidden)')).filter(
  tr => tr.getAttribute('data-workload') === w);
const named = Array.from(document.querySelectorAll('.vb-notice')).some(n => n.textContent.includes(w));
return traces.length + rows.length + (named ? 1 : 0);
"""


def test_every_page_answers_for_every_workload(driver, site) -> None:
    result, out = site
    open_page(driver, out, "index.html", result.pages["index.html"])
    workloads = driver.execute_script(
        "return Array.from(document.querySelectorAll('select[data-vb-filter=workload] option'))"
        ".map(o => o.value).filter(v => v)")
    assert {"bayes_logreg_hessian", "per_sample_grad_mlp", "jacobian_chunked"} <= set(workloads)
    missing = []
    for page in WORKLOAD_PAGES:
        for workload in workloads:
            if workload == "per_op_overhead" and page != "compare.html":
                continue  # the per-op microbenchmark is not a workload of the registry
            open_page(driver, out, page, result.pages[page], f"#workload={workload}")
            driver.execute_script("window.vbDashboard.applyFilters()")
            if not wait_for_value(lambda: driver.execute_script(ANSWERS, workload)):
                missing.append(f"{page}#{workload}")
    assert not missing, f"pages with nothing for a workload: {missing}"


def wait_for_value(predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return predicate()


# One cell: the engine on per_sample_grad_mlp at cpu-box's newest commit (quick profile: batch=64).
CELL = ("cpu-box", "cpu", "per_sample_grad_mlp", "batch=64", "engine")
HISTORY_TEXT = """
const [machine, device, workload, size, method, metric] = arguments;
for (const g of document.querySelectorAll('.js-plotly-plot')) {
  for (const t of g.data) {
    const m = t.meta || {};
    if (m.machine === machine && m.device === device && m.workload === workload && m.size === size
        && m.method === method && m.metric === metric) return t.customdata[t.customdata.length - 1][1];
  }
}
return null;
"""
COMPARE_TEXT = """
const [benchmark, params] = arguments;
const tr = Array.from(document.querySelectorAll('#vb-compare tbody tr')).find(
  tr => tr.getAttribute('data-benchmark').endsWith(benchmark) && tr.getAttribute('data-params') === params);
return tr ? tr.querySelector('td.vb-head').textContent : null;
"""


def test_overview_compare_and_history_show_the_same_number(driver, site) -> None:
    result, out = site
    machine, device, workload, size, method = CELL
    cell = "|".join(CELL)
    open_page(driver, out, "index.html", result.pages["index.html"])
    speedup = driver.execute_script(f"return document.querySelector('span.vb-fig[data-cell=\"{cell}\"]').textContent")
    timing = driver.execute_script(f"return document.querySelector('small.vb-time[data-cell=\"{cell}\"]').textContent")
    assert speedup.endswith("×") and timing.split(" [")[0].endswith("s")

    open_page(driver, out, "compare.html", 0)
    params = f"{workload} · {size} · {method} · {device}"
    assert driver.execute_script(COMPARE_TEXT, ".track_speedup_vs_loop", params) == speedup
    assert driver.execute_script(COMPARE_TEXT, ".time_run", params) == timing

    open_page(driver, out, "history.html", result.pages["history.html"])
    assert driver.execute_script(HISTORY_TEXT, machine, device, workload, size, method, "speedup_vs_loop") == speedup
    assert driver.execute_script(HISTORY_TEXT, machine, device, workload, size, method, "time") == timing


def test_legend_entries_stay_when_filtered(driver, site) -> None:
    """Filtering hides traces; every method still drawn keeps its legend entry."""
    result, out = site
    open_page(driver, out, "index.html", result.pages["index.html"], "#workload=per_sample_grad_mlp")
    driver.execute_script("window.vbDashboard.applyFilters()")
    check = ("return Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => {"
             "const vis = g.data.filter(t => t.visible === true || t.visible === undefined);"
             "const groups = new Set(vis.map(t => t.legendgroup));"
             "const shown = new Set(vis.filter(t => t.showlegend !== false).map(t => t.legendgroup));"
             "return [groups.size, shown.size, g.querySelectorAll('g.legend g.traces').length]; })")
    panels = wait_for(lambda: [p for p in driver.execute_script(check) if p[0]], what="visible traces")
    for groups, shown, drawn in panels:
        assert groups == shown == drawn


DEVICE_TRACES = ("return Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(g => g.data"
                 ".filter(t => t.visible === undefined || t.visible === true)"
                 ".map(t => ({name: t.name, device: t.meta.device, x: t.x, y: t.y})))")


def test_devices_page_compares_each_method_on_cpu_and_cuda(driver, site, shots: Path) -> None:
    """The device filter offers cpu and cuda; the Devices page draws, per workload, each method's
    time on both devices, the GPU-over-CPU speed-up (cpu time / cuda time, the bars' own figures)
    and the peak memory on both; the device filter hides the other device's bars."""
    from selenium.webdriver.support.ui import Select

    result, out = site
    assert result.pages["devices.html"] >= 3
    open_page(driver, out, "devices.html", result.pages["devices.html"])
    options = driver.execute_script("return Array.from(document.querySelectorAll('select[data-vb-filter=device] option'))"
                                    ".map(o => o.value)")
    assert {"cpu", "cuda"} <= set(options)
    screenshot(driver, shots / "devices-cpu-and-cuda.png")
    traces = driver.execute_script(DEVICE_TRACES)
    cpu = [t for t in traces if t["name"].startswith("cpu · ")]
    cuda = [t for t in traces if t["name"].startswith("cuda · ")]
    speedups = [t for t in traces if t["name"] == "GPU over CPU"]
    assert cpu and len(cpu) == len(cuda) == len(speedups)
    for c, g, s in zip(cpu, cuda, speedups):
        assert c["x"] == g["x"] == s["x"] and len(c["x"]) >= 3
        for tc, tg, ratio in zip(c["y"], g["y"], s["y"]):
            if tc is not None and tg is not None:
                assert abs(ratio - tc / tg) <= 1e-9 * ratio
    assert any(t["name"] == "cuda: cuda_peak_bytes" for t in traces)
    assert any(t["name"] == "cpu: rss_delta_bytes" for t in traces)

    Select(driver.find_element("css selector", 'select[data-vb-filter="device"]')).select_by_value("cuda")
    wait_for(lambda: {t["device"] for t in driver.execute_script(DEVICE_TRACES)} == {"cuda"},
             what="only cuda bars for device=cuda")
    Select(driver.find_element("css selector", 'select[data-vb-filter="device"]')).select_by_value("")


@pytest.fixture(scope="module")
def results_site(tmp_path_factory: pytest.TempPathFactory):
    """The dashboard of the repository's own results/."""
    out = tmp_path_factory.mktemp("dashboard-of-results")
    return build_dashboard(Path(__file__).resolve().parents[1] / "results", out), out


def test_the_committed_results_render_and_give_the_docs_screenshot(driver, results_site, shots: Path) -> None:
    """The dashboard of the repository's own results/ renders its overview without errors. Its
    first screen is saved as dashboard-overview.png in the screenshots folder: the picture on
    docs/index.md is that file (docs/img/dashboard-overview.png, see docs/guide/dashboard.md)."""
    result, out = results_site
    drain(driver)
    open_page(driver, out, "index.html", result.pages["index.html"])
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, f"console errors {errors}"
    assert not network_problems(driver)
    driver.set_window_size(1400, 1200)
    driver.save_screenshot(str(shots / "dashboard-overview.png"))
    driver.set_window_size(1400, 1000)
    assert (shots / "dashboard-overview.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


TORCH_VERSION_CELLS = """
const table = document.querySelector('table.vb-torch-versions');
if (!table) return null;
const heads = Array.from(table.tHead.rows[0].cells).map(th => th.textContent);
return Array.from(table.tBodies[0].rows).filter(tr => !tr.classList.contains('vb-hidden')).map(
  tr => Object.fromEntries(heads.map((h, i) => [h, tr.cells[i].textContent])));
"""


def test_torch_versions_page_shows_the_committed_releases_side_by_side(driver, results_site, shots: Path) -> None:
    """The committed `make bench TORCH=...` results: one commit under two releases, each case's time
    under both, and the fallback counts of the engine and of torch.func per release; the OpInfo
    coverage of each release below, with the ops whose status changed."""
    from selenium.webdriver.support.ui import Select

    result, out = results_site
    drain(driver)
    open_page(driver, out, "torch_versions.html", result.pages["torch_versions.html"])
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, f"console errors {errors}"
    assert not network_problems(driver)
    screenshot(driver, shots / "torch-versions-committed.png")
    rows = driver.execute_script(TORCH_VERSION_CELLS)
    assert rows, "no table of cases across torch releases"
    times = [h for h in rows[0] if h.startswith("time · ")]
    fallbacks = [h for h in rows[0] if h.startswith("fallbacks · ")]
    assert len(times) >= 2 and len(fallbacks) == len(times)
    torch_func = [r for r in rows if r["method"] == "torch.func"]
    engine = [r for r in rows if r["method"].startswith("engine")]
    assert torch_func and engine
    for r in torch_func + engine:  # a count under every release
        assert all(r[h].isdigit() for h in fallbacks), r
    assert all(r[h].endswith("s") or " [" in r[h] for r in rows for h in times if r[h] != "–")
    # torch.func's OpInfo status moved between the releases for at least one op (fill: a rule in 2.15)
    changed = driver.execute_script(
        "return Array.from(document.querySelectorAll('table.vb-torch-coverage-changes tbody tr'))"
        ".map(tr => tr.cells[0].textContent + ' ' + tr.cells[1].textContent)")
    assert "fill torch.func" in changed

    # The workload filter hides the other workloads' rows.
    workload = rows[0]["workload"]
    Select(driver.find_element("css selector", 'select[data-vb-filter="workload"]')).select_by_value(workload)
    wait_for(lambda: {r["workload"] for r in driver.execute_script(TORCH_VERSION_CELLS)} == {workload},
             what=f"only {workload} rows")
    Select(driver.find_element("css selector", 'select[data-vb-filter="workload"]')).select_by_value("")
    # A row holds several runs (one per release), so the machine filter, which lists runs, keeps it.
    machine = Select(driver.find_element("css selector", 'select[data-vb-filter="machine"]'))
    machine.select_by_index(1)
    wait_for(lambda: len(driver.execute_script(TORCH_VERSION_CELLS)) == len(rows), what="every row under a machine filter")
    machine.select_by_value("")
