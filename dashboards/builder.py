"""Build the dashboard: load the results, render every view, write one self-contained folder.

The folder holds one HTML page per view and assets/ with plotly.min.js (copied once from the
installed plotly package), the stylesheet and the filter script. Nothing is fetched at view time:
the pages open from file:// with no network.
"""
from __future__ import annotations

import datetime as _dt
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from dashboards.artifacts import list_profiles, load_coverage
from dashboards.context import Context
from dashboards.loader import CorruptResultWarning, load_results
from dashboards.page import Page, esc, render_page

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = REPO / "results"
DEFAULT_OUT = REPO / "dashboards" / "out"
ASSETS = Path(__file__).resolve().parent / "assets"


@dataclass
class BuildResult:
    index: Path
    pages: dict[str, int] = field(default_factory=dict)  # file name -> number of Plotly figures
    rows: int = 0
    files: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


def plotly_js_path() -> Path:
    """plotly.min.js of the installed plotly package (the version the figures are written for)."""
    import plotly
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall plotly (`pip install --force-reinstall plotly`)")
    return path


def copy_assets(out_dir: Path) -> None:
    target = out_dir / "assets"
    target.mkdir(parents=True, exist_ok=True)
    js = plotly_js_path()
    dest = target / "plotly.min.js"
    # Copy plotly.js only when it changed: it is 4.6 MB and the same on every build.
    if not dest.is_file() or dest.stat().st_size != js.stat().st_size or dest.stat().st_mtime < js.stat().st_mtime:
        shutil.copy2(js, dest)
    for name in ("dashboard.css", "dashboard.js"):
        shutil.copyfile(ASSETS / name, target / name)


def build_dashboard(results_dir: str | Path = DEFAULT_RESULTS, out_dir: str | Path = DEFAULT_OUT, *,
                    continuous: bool = False) -> BuildResult:
    """Build the dashboard of `results_dir` into `out_dir`; returns the index path and page facts.

    `continuous=True` adds the asv results kept apart in results/continuous/<machine>/, each as its
    own run beside the reference results; by default they are left out of every page."""
    from dashboards.views import VIEWS

    start = time.perf_counter()
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CorruptResultWarning)
        results = load_results(results_dir, stats="intervals", continuous=continuous)
        coverage = load_coverage(results_dir)
    for w in caught:  # re-emit outside the recorder so callers (and the CLI) still see them
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    extra_warnings = [str(w.message) for w in caught if issubclass(w.category, CorruptResultWarning)
                      and not any(str(w.message).startswith(f"skipping {p}:") for p, _ in results.skipped)]
    ctx = Context(results=results, coverage=coverage, profiles=list_profiles(results_dir), out_dir=out_dir)
    copy_assets(out_dir)
    generated = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    footer = ctx.footer()
    banner = _skipped_banner(results.skipped, extra_warnings)
    pages: dict[str, int] = {}
    for view in VIEWS:
        page: Page = view.render(ctx)
        if banner:
            page.body.insert(0, banner)
        text = render_page(page, filters=ctx.filters, footer=footer, generated=generated)
        (out_dir / page.filename).write_text(text, encoding="utf-8")
        pages[page.filename] = page.figures
    return BuildResult(index=out_dir / "index.html", pages=pages, rows=len(results.frame),
                       files=len(results.files), skipped=list(results.skipped),
                       seconds=time.perf_counter() - start)


def _skipped_banner(skipped: list[tuple[str, str]], others: list[str]) -> str:
    if not skipped and not others:
        return ""
    items = "".join(f"<li><code>{esc(path)}</code>: {esc(reason)}</li>" for path, reason in skipped)
    items += "".join(f"<li>{esc(text)}</li>" for text in others)
    return (f'<div class="vb-notice vb-warn"><b>{len(skipped) + len(others)} file(s) skipped</b> '
            f"(the rest loaded):<ul>{items}</ul></div>")
