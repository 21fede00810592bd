"""The ASV results loader: agreement with asv's own reader, tidy columns, and lenience."""
from __future__ import annotations

import itertools
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from asv.results import Results

from dashboards.loader import CorruptResultWarning, load_results, metric_of, parse_param_value

FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"
REPO = Path(__file__).resolve().parents[1]


def result_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*/*.json") if p.name != "machine.json" and p.parent.name != "coverage")


@pytest.fixture
def results_copy(tmp_path: Path) -> Path:
    target = tmp_path / "results"
    shutil.copytree(FIXTURE, target)
    return target


def test_fixture_loads_every_file_into_one_tidy_frame() -> None:
    rs = load_results(FIXTURE)
    f = rs.frame
    assert not rs.skipped
    assert len(rs.files) == len(result_files(FIXTURE)) == 6
    assert set(f["machine"]) == {"cpu-box", "gpu-box"}
    assert f.groupby("machine")["commit"].nunique().to_dict() == {"cpu-box": 3, "gpu-box": 3}
    # The microbenchmark class without a workload parameter is named after its class.
    assert set(f["workload"].dropna()) == {"bayes_logreg_hessian", "per_sample_grad_mlp", "jacobian_chunked",
                                           "per_op_overhead"}
    assert set(f[f["machine"] == "cpu-box"]["device"].dropna()) == {"cpu"}
    assert set(f[f["machine"] == "gpu-box"]["device"].dropna()) == {"cpu", "cuda"}
    # A parameterless benchmark is one row per file, with no workload, method or device.
    threads = f[f["benchmark"] == "bench_runtime.track_torch_num_threads"]
    assert len(threads) == 6 and threads["value"].eq(2).all()
    assert threads[["workload", "method", "device", "size"]].isna().all().all()
    assert set(threads["metric"]) == {"torch_num_threads"} and set(threads["unit"]) == {"threads"}
    assert {"n", "d", "batch", "chunk_size"} <= set(rs.size_columns)
    assert f["value"].notna().all() and f["date"].notna().all()
    assert str(f["date"].dt.tz) == "UTC"
    # Size labels are split into numeric columns.
    row = f[f["size"] == "n=1000,d=64"].iloc[0]
    assert (row["n"], row["d"]) == (1000, 64)
    # The class-per-workload benchmarks get their workload from the class name.
    psg = f[f["workload"] == "per_sample_grad_mlp"]
    assert set(psg["benchmark"].str.split(".").str[1]) == {"PerSampleGradMlp"}
    assert set(f["metric"]) >= {"time", "peakmem", "rss_delta_bytes", "speedup_vs_loop", "fallbacks"}


def test_values_agree_with_asvs_own_reader() -> None:
    """asv's Results.load on the same files gives the same value for every parameter combination."""
    frame = load_results(FIXTURE).frame
    benchmarks = json.loads((FIXTURE / "benchmarks.json").read_text())
    checked = 0
    for path in result_files(FIXTURE):
        res = Results.load(str(path), machine_name=path.parent.name)
        ours = frame[(frame["machine"] == path.parent.name) & (frame["commit"] == res.commit_hash)]
        for name in ("bench_workloads.Workloads.time_run", "bench_workloads.PerSampleGradMlp.track_cuda_peak_bytes"):
            params = res.get_result_params(name)
            names = benchmarks[name]["param_names"]
            values = res.get_result_value(name, params)
            for combo, value in zip(itertools.product(*params), values):
                sel = ours[ours["benchmark"] == name]
                for param, raw in zip(names, combo):
                    sel = sel[sel[param] == parse_param_value(raw)]
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    assert sel.empty, f"{name} {combo}: asv has no value, we have {sel['value'].tolist()}"
                else:
                    assert sel["value"].tolist() == [value], f"{name} {combo}"
                    checked += 1
    assert checked > 100


def test_stats_and_samples_are_carried(results_copy: Path) -> None:
    f = load_results(results_copy).frame
    timed = f[(f["metric"] == "time") & (f["machine"] == "cpu-box")]
    assert (timed["ci_99_a"] <= timed["value"]).all() and (timed["value"] <= timed["ci_99_b"]).all()
    assert timed["samples"].map(lambda s: isinstance(s, list) and len(s) == 4).all()
    tracked = f[f["metric"] == "speedup_vs_loop"]
    assert tracked["ci_99_a"].isna().all()


def test_empty_and_missing_results_give_an_empty_frame(tmp_path: Path) -> None:
    for root in (tmp_path, tmp_path / "does-not-exist"):
        rs = load_results(root)
        assert rs.empty and not rs.skipped
        assert {"machine", "commit", "benchmark", "workload", "method", "value"} <= set(rs.frame.columns)


def test_corrupt_file_is_skipped_with_a_warning_naming_it(results_copy: Path) -> None:
    victim = result_files(results_copy)[0]
    text = victim.read_text()
    victim.write_text(text[: len(text) // 2])  # truncated mid-write
    with pytest.warns(CorruptResultWarning, match=victim.name):
        rs = load_results(results_copy)
    assert [Path(p).name for p, _ in rs.skipped] == [victim.name]
    assert "truncated" in rs.skipped[0][1]
    assert len(rs.files) == 5 and not rs.empty
    commit8 = victim.name.split("-")[0]
    assert not (rs.frame["commit"].str[:8] == commit8)[rs.frame["machine"] == victim.parent.name].any()


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d.update(version=1), "version"),
    (lambda d: d.pop("results"), "missing keys"),
    (lambda d: d["results"]["bench_workloads.Workloads.time_run"][0].pop(), "parameter combinations"),
    (lambda d: d["results"]["bench_workloads.Workloads.time_run"][0].__setitem__(0, "fast"), "non-numeric"),
])
def test_inconsistent_files_are_skipped_whole(results_copy: Path, damage, reason: str) -> None:
    victim = result_files(results_copy)[-1]
    data = json.loads(victim.read_text())
    damage(data)
    victim.write_text(json.dumps(data))
    with pytest.warns(CorruptResultWarning, match=victim.name):
        rs = load_results(results_copy)
    assert len(rs.skipped) == 1 and reason in rs.skipped[0][1]
    assert len(rs.files) == 5


def test_folder_without_machine_json_is_reported(results_copy: Path) -> None:
    stray = results_copy / "stray"
    stray.mkdir()
    shutil.copy(result_files(results_copy)[0], stray / "x.json")
    with pytest.warns(CorruptResultWarning, match="machine.json"):
        rs = load_results(results_copy)
    assert len(rs.files) == 6


def test_without_benchmarks_json_parameters_get_positional_names(results_copy: Path) -> None:
    (results_copy / "benchmarks.json").unlink()
    f = load_results(results_copy).frame
    shared = f[f["benchmark"].str.startswith("bench_workloads.Workloads.")]
    # Sizes are still recognized by their shape ('n=1000,d=64'); the rest keeps positional names.
    assert set(shared["param0"]) == {"bayes_logreg_hessian", "jacobian_chunked"}
    assert set(shared["param3"]) == {"cpu", "cuda"}
    assert shared["size"].notna().all() and shared["n"].notna().all()
    assert len(f) == len(load_results(FIXTURE).frame)


def test_unknown_parameter_names_become_columns(tmp_path: Path) -> None:
    root = tmp_path / "results"
    (root / "m").mkdir(parents=True)
    (root / "m" / "machine.json").write_text(json.dumps({"machine": "m", "version": 1}))
    (root / "benchmarks.json").write_text(json.dumps({
        "mod.Thing.track_score": {"name": "mod.Thing.track_score", "param_names": ["method", "flavour", "n"],
                                   "params": [["'engine'"], ["'sweet'", "'sour'"], ["1", "2"]],
                                   "type": "track", "unit": "points", "version": "1"},
        "version": 2}))
    (root / "m" / "abcdef12-env.json").write_text(json.dumps({
        "commit_hash": "abcdef1234", "env_name": "env", "date": 1_700_000_000_000, "params": {},
        "python": "3.11", "requirements": {}, "result_columns": ["result", "params"],
        "results": {"mod.Thing.track_score": [[1.0, 2.0, 3.0, None],
                                              [["'engine'"], ["'sweet'", "'sour'"], ["1", "2"]]]},
        "durations": {}, "version": 2}))
    f = load_results(root).frame
    assert f["flavour"].tolist() == ["sweet", "sweet", "sour"]
    assert f["n"].tolist() == [1, 2, 1]
    assert f["value"].tolist() == [1.0, 2.0, 3.0]
    assert set(f["unit"]) == {"points"} and set(f["metric"]) == {"score"}
    assert f["size"].tolist() == ["n=1", "n=2", "n=1"]


def test_metric_names() -> None:
    assert metric_of("bench_workloads.logreg_hessian.time_run") == "time"
    assert metric_of("bench_workloads.logreg_hessian.peakmem_run") == "peakmem"
    assert metric_of("bench_workloads.logreg_hessian.track_cuda_peak_bytes") == "cuda_peak_bytes"
    assert metric_of("bench_overhead.PerOpOverhead.time_chain") == "time_chain"
    assert parse_param_value("'n=1000,d=64'") == "n=1000,d=64"
    assert parse_param_value("64") == 64
    assert parse_param_value("<function f>") == "<function f>"


def test_export_cli_writes_the_tidy_csv(tmp_path: Path) -> None:
    out = tmp_path / "results.csv"
    proc = subprocess.run([sys.executable, "-m", "vmapbench", "export", "--csv", "--results", str(FIXTURE),
                           "-o", str(out)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out)
    frame = load_results(FIXTURE).frame
    assert len(table) == len(frame)
    assert {"machine", "commit", "workload", "method", "size", "device", "metric", "value", "n", "d"} <= set(table.columns)
    assert "samples" not in table.columns
    assert table["value"].sum() == pytest.approx(frame["value"].sum())
