"""The coverage page's per-pattern view: counts per batch-dim pattern and side, and the op table."""
from __future__ import annotations

from pathlib import Path

from dashboards.artifacts import CoverageReport
from dashboards.views.coverage import pattern_figure, _pattern_table


def _report(ops: list[dict]) -> CoverageReport:
    return CoverageReport(path=Path("coverage-test.json"), ops=ops)


def test_pattern_figure_counts_each_status_per_pattern_and_side() -> None:
    ops = [
        {"op": "a", "family": "x", "engine": "native", "torch_func": "error",
         "patterns": {"0": {"engine": "native", "torch_func": "native"}, "-1": {"engine": "native", "torch_func": "error"}}},
        {"op": "b", "family": "x", "engine": "mismatch", "torch_func": "native",
         "patterns": {"0": {"engine": "native", "torch_func": "native"}, "-1": {"engine": "mismatch", "torch_func": "native"}}},
    ]
    fig = pattern_figure(_report(ops))
    bars = {(t["xaxis"], t["name"]): t["y"] for t in fig["data"]}
    engine_axis, torch_axis = sorted({t["xaxis"] for t in fig["data"]})
    assert fig["data"][0]["x"] == ["0", "-1"]
    assert bars[(engine_axis, "native")] == [2, 1] and bars[(engine_axis, "mismatch")] == [0, 1]
    assert bars[(torch_axis, "native")] == [2, 1] and bars[(torch_axis, "error")] == [0, 1]
    table = _pattern_table(_report(ops))
    assert "2 (each cell" in table and "mismatch / native" in table and "native / error" in table


def test_reports_without_patterns_draw_no_pattern_view() -> None:
    ops = [{"op": "a", "family": "x", "engine": "native", "torch_func": "native"}]
    assert pattern_figure(_report(ops)) is None and _pattern_table(_report(ops)) == ""
