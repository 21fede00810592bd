"""Building the dashboard: a self-contained offline folder, and the edge cases of its inputs."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from dashboards.builder import build_dashboard
from dashboards.loader import CorruptResultWarning
from dashboards.page import PAGES

FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"
REPO = Path(__file__).resolve().parents[1]
PAGE_FILES = [f for f, _ in PAGES]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("dash")
    return build_dashboard(FIXTURE, out), out


def read(out: Path, page: str) -> str:
    return (out / page).read_text(encoding="utf-8")


def test_every_view_is_written_with_its_figures(built) -> None:
    result, out = built
    assert result.index == out / "index.html"
    assert sorted(result.pages) == sorted(PAGE_FILES)
    # Overview: one speedup figure per run; scaling and memory one per workload (every workload:
    # jacobian_chunked has one size apart from chunk_size and gets bars), memory also the
    # chunk_size trade-off; history one per (workload, run).
    assert result.pages["index.html"] == 2
    assert result.pages["scaling.html"] == 3
    assert result.pages["memory.html"] == 4
    assert result.pages["history.html"] == 6
    assert result.pages["coverage.html"] == 2
    assert result.pages["compilers.html"] == 1
    assert result.pages["compare.html"] == result.pages["profiles.html"] == 0
    for page in PAGE_FILES:
        text = read(out, page)
        assert text.count('class="plotly-graph-div"') == result.pages[page], page
        assert f'data-vb-figures="{result.pages[page]}"' in text


def test_output_is_self_contained_and_offline(built) -> None:
    result, out = built
    js = out / "assets" / "plotly.min.js"
    assert js.is_file() and js.stat().st_size > 1_000_000
    assert sorted(p.name for p in (out / "assets").iterdir()) == ["dashboard.css", "dashboard.js", "plotly.min.js"]
    for page in PAGE_FILES:
        text = read(out, page)
        # plotly.js once, by relative path, never inlined or fetched.
        assert text.count('<script src="assets/plotly.min.js"></script>') == 1
        assert len(text) < 1_000_000, f"{page} looks like it inlines plotly.js"
        sources = re.findall(r'(?:src|href)="([^"#]+)', text)
        remote = [s for s in sources if re.match(r"[a-z]+:", s) and not s.startswith("data:")]
        assert not remote, f"{page} references {remote}"
        assert "cdn.plot.ly" not in text and "mathjax" not in text.lower()
        assert "fonts.googleapis" not in text


def test_overview_reads_the_latest_commit(built) -> None:
    _, out = built
    text = read(out, "index.html")
    assert "cb197ba8" in text  # the newest fixture commit
    assert "Did the last commit make anything slower?" in text
    assert "Speedups at the latest commit" in text


def test_history_flags_the_injected_regression(built) -> None:
    _, out = built
    text = read(out, "history.html")
    assert "The step detector found no regression" not in text
    table = text.split("<h2>Regressions</h2>", 1)[1]
    assert "bayes_logreg_hessian" in table and "per_sample_grad_mlp" not in table


def test_coverage_and_profiles_are_listed(built) -> None:
    _, out = built
    coverage = read(out, "coverage.html")
    assert "engine (ours): 11 of 17 native" in coverage
    profiles = read(out, "profiles.html")
    link = re.search(r'href="([^"]*py-spy\.svg)"', profiles).group(1)
    assert (out / link).resolve() == (FIXTURE / "profiles" / "bayes_logreg_hessian-engine-cpu" / "py-spy.svg").resolve()


def test_compilers_page_counts_only_agreeing_programs_as_faster(built) -> None:
    _, out = built
    text = read(out, "compilers.html")
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", text.split("<h2>ci-box</h2>", 1)[1])
    # the summary: backend, median compile, faster (agreeing), refused, graphs measured
    assert cells[:10] == ["xla", "0.55", "1", "0", "2", "iree", "0.90", "0", "1", "2"]
    assert "0.50 (disagrees)" in cells and "the measuring process exited 1: MemoryError" in cells
    assert "fused_backends/ci-box/cb197ba8.json" in text


def test_empty_results_build_a_dashboard_that_says_what_to_do(tmp_path: Path) -> None:
    empty = tmp_path / "results"
    empty.mkdir()
    result = build_dashboard(empty, tmp_path / "out")
    assert sum(result.pages.values()) == 0
    assert "No ASV results found" in read(tmp_path / "out", "index.html")
    assert "make coverage" in read(tmp_path / "out", "coverage.html")
    assert "No profiles" in read(tmp_path / "out", "profiles.html")
    assert "vmapbench fused-backends --write" in read(tmp_path / "out", "compilers.html")


def test_single_commit(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    for path in results.glob("*/*.json"):
        if path.name != "machine.json" and not path.name.startswith("cb197ba8") and path.parent.name != "coverage":
            path.unlink()
    result = build_dashboard(results, tmp_path / "out")
    assert result.files == 2
    assert result.pages["index.html"] == 2 and result.pages["scaling.html"] == 3
    assert result.pages["history.html"] == 0
    assert "Only one commit per run" in read(tmp_path / "out", "history.html")
    assert "one commit only" in read(tmp_path / "out", "compare.html")


def test_corrupt_file_is_named_on_the_page(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    victim = next(results.glob("gpu-box/6e27858f-*.json"))
    victim.write_text("{\"commit_hash\": \"6e27858f")
    with pytest.warns(CorruptResultWarning, match=victim.name):
        result = build_dashboard(results, tmp_path / "out")
    assert result.files == 5
    for page in PAGE_FILES:
        assert victim.name in read(tmp_path / "out", page)
    assert result.pages["index.html"] == 2


def test_cli_prints_the_index_path(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "vmapbench", "dashboard", "--results", str(FIXTURE),
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str((out / "index.html").resolve())
    assert f"figures on {len(PAGE_FILES)} pages" in proc.stderr


def test_rebuild_refreshes_pages_and_keeps_one_plotly_copy(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean fixture raises no warning at all
        build_dashboard(FIXTURE, out)
    (out / "index.html").write_text("stale")
    build_dashboard(FIXTURE, out)
    assert "stale" not in read(out, "index.html")
    assert len(list(out.rglob("plotly*.js"))) == 1


def test_footers_name_the_results_folder_relative_to_the_project(built) -> None:
    _, out = built
    for page in PAGE_FILES:
        footer = read(out, page).split('<footer class="vb-footer">', 1)[1]
        assert "Results: <code>tests/fixtures/asv_results</code>" in footer, page
        assert str(REPO) not in footer, page


def test_every_ratio_cell_has_its_interval_where_the_suite_recorded_rounds(tmp_path: Path) -> None:
    """The suite records its in-process ratios round by round (suite.workload_pass): every speedup
    and engine ÷ torch.func cell of the Overview then shows its interval, as the gate's table does."""
    from dashboards.synthetic import write_results

    write_results(tmp_path / "results", commits=2, machines=1, extras=False)
    build_dashboard(tmp_path / "results", tmp_path / "out")
    text = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    table = text.split("Speedups at the latest commit", 1)[1]
    cells = re.findall(r'<span class="vb-fig"[^>]*>([^<]*)</span>', table)
    assert cells and all(re.search(r"× \[.+×, .+×\]$", c) for c in cells), cells
    engine_cells = re.findall(r"<td[^>]*>(\d[^<]*×[^<]*)</td>", table)
    assert engine_cells and all("[" in c for c in engine_cells), engine_cells
