"""The Torch versions page's reading of results: one commit under several torch releases, side by side."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dashboards.artifacts import CoverageReport
from dashboards.views.torch_versions import coverage_changes, version_cases, version_rows


def _row(commit: str, date: int, torch: str | None, metric: str, method: str, value: float, case: int, **extra) -> dict:
    env = f"existing-py3.11-torch{torch}" if torch else "existing-py_work_main_.venv_bin_python"
    return {"machine": "box", "commit": commit, "date": pd.Timestamp(date, unit="s"), "env": env, "kind": "reference",
            "metric": metric, "workload": "w", "size": "n=4", "method": method, "device": "cpu", "value": value,
            "case": case, "ci_99_a": extra.get("lo", float("nan")), "ci_99_b": extra.get("hi", float("nan"))}


def small_frame() -> pd.DataFrame:
    rows = [
        # commit a: measured under 2.13.0 and 2.15.0 (older, so not the one shown)
        _row("a", 100, "2.13.0", "time", "engine", 9.0, 0),
        _row("a", 100, "2.15.0", "time", "engine", 9.0, 0),
        # commit b: the newest commit under two releases
        _row("b", 200, "2.13.0", "time", "engine", 2.0, 0, lo=1.8, hi=2.2),
        _row("b", 200, "2.15.0", "time", "engine", 1.0, 0, lo=0.9, hi=1.1),
        _row("b", 200, "2.13.0", "fallbacks", "engine", 0, 1),
        _row("b", 200, "2.15.0", "fallbacks", "engine", 2, 1),
        _row("b", 200, "2.13.0", "time", "torch_func", 3.0, 2),
        _row("b", 200, "2.15.0", "time", "torch_func", 3.0, 2),
        _row("b", 200, "2.13.0", "torch_fallbacks", "torch_func", 5, 3),
        _row("b", 200, "2.15.0", "torch_fallbacks", "torch_func", 1, 3),
        _row("b", 200, "2.13.0", "alloc_peak_bytes", "engine", 1000, 4),
        _row("b", 200, "2.13.0", "speedup_vs_loop", "engine", 7.0, 5),  # not a metric of the page
        # commit c: newer, but under one release only, and a result without a torch in its env name
        _row("c", 300, "2.15.0", "time", "engine", 5.0, 0),
        _row("c", 300, None, "time", "engine", 5.0, 0),
    ]
    return pd.DataFrame(rows)


def test_version_rows_take_the_newest_commit_under_two_releases():
    found = version_rows(small_frame())
    assert list(found) == ["box"]
    commit, versions, rows = found["box"]
    assert commit == "b" and versions == ["2.13.0", "2.15.0"]
    assert set(rows["metric"]) == {"time", "fallbacks", "torch_fallbacks", "alloc_peak_bytes"}
    assert {"lo", "hi", "n"} <= set(rows.columns)


def test_version_cases_pair_each_case_across_releases():
    _, versions, rows = version_rows(small_frame())["box"]
    cases = {c.method: c for c in version_cases(versions, rows)}
    assert list(cases) == ["engine", "torch_func"]  # the registry's method order
    engine, torch_func = cases["engine"], cases["torch_func"]
    assert engine.fallbacks == {"2.13.0": 0, "2.15.0": 2}
    assert torch_func.fallbacks == {"2.13.0": 5, "2.15.0": 1}  # torch.func's own count on its row
    assert engine.memory["2.13.0"].value == 1000 and engine.memory["2.15.0"] is None
    # newest over oldest, with the interval the two intervals span
    assert engine.change.value == pytest.approx(0.5)
    assert engine.change.lo == pytest.approx(0.9 / 2.2) and engine.change.hi == pytest.approx(1.1 / 1.8)
    assert torch_func.change.value == pytest.approx(1.0)


def test_version_rows_need_two_releases_of_one_commit():
    frame = small_frame()
    assert version_rows(frame[frame["commit"] != "b"].loc[lambda f: f["commit"] != "a"]) == {}
    assert version_rows(frame.iloc[0:0]) == {}


def test_coverage_changes_name_the_ops_whose_status_moved(tmp_path: Path):
    def report(version: str, ops: list[dict]) -> CoverageReport:
        path = tmp_path / f"{version}.json"
        path.write_text(json.dumps({"ops": ops}))
        return CoverageReport(path, ops, {"engine_commit": "abc"})

    old = report("2.13.0", [{"op": "fill", "torch_func": "fallback"}, {"op": "abs", "torch_func": "native"}])
    new = report("2.15.0", [{"op": "fill", "torch_func": "native"}, {"op": "abs", "torch_func": "native"}])
    reports = {"2.13.0": old, "2.15.0": new}
    assert coverage_changes(reports, "torch_func") == [("fill", {"2.13.0": "fallback", "2.15.0": "native"})]
    newer = report("2.15.0", [*new.ops, {"op": "sdpa", "torch_func": "fallback", "engine": "native"}])
    assert coverage_changes({"2.13.0": old, "2.15.0": newer}, "engine") == [("sdpa", {"2.15.0": "native"})]
