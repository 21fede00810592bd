"""Runs kept apart and one figure per number: results of two asv envs on one machine, continuous
results beside them, peers and unknown methods, the memory-limit view, and the rough edges
(missing results folder, stale coverage report)."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
from pathlib import Path

import pytest

from dashboards.artifacts import CoverageReport, coverage_staleness, load_memlimit
from dashboards.builder import build_dashboard
from dashboards.context import Context
from dashboards.loader import load_results
from dashboards.numbers import cell_table, sampled_estimates
from dashboards.regressions import commit_changes, latest_changes
from dashboards.synthetic import ENV_NAME, SyntheticWorkload, write_results

REPO = Path(__file__).resolve().parents[1]
OTHER_ENV = "virtualenv-py3.11-torch2.13.0"
CONTINUOUS_ENV = "existing-py3.11"
PEERS = SyntheticWorkload("psg_peers", ("batch=64",),
                          ("loop", "engine", "torch_func", "jax", "opacus_ew", "backpack", "mystery_peer",
                           "closed_form"), style="class")
SIX_HOURS = 6 * 3_600_000


def hashes(files: list[Path]) -> set[str]:
    return {p.name.split("-", 1)[0] for p in files}


@pytest.fixture(scope="module")
def two_envs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One machine, two asv envs with interleaved commits, the second 30x slower in time (as a
    different interpreter or a loaded run can be), and continuous results 10x slower."""
    root = tmp_path_factory.mktemp("runs") / "results"
    workloads = (PEERS,)
    first = write_results(root, commits=2, machines=1, seed=0, extras=False, workloads=workloads)
    second = write_results(root, commits=2, machines=1, seed=1, extras=False, workloads=workloads,
                           env_name=OTHER_ENV, time_scale=30.0, date_offset_ms=SIX_HOURS // 2)
    cont = write_results(root, commits=2, machines=1, seed=2, extras=False, workloads=workloads,
                         env_name=CONTINUOUS_ENV, time_scale=10.0, date_offset_ms=SIX_HOURS // 3,
                         machine_root=root / "continuous")
    return {"root": root, "first": hashes(first), "second": hashes(second), "continuous": hashes(cont)}


def test_each_env_is_its_own_run_and_continuous_results_stay_out(two_envs: dict) -> None:
    ctx = Context(results=load_results(two_envs["root"]))
    runs = {f"cpu-box [{ENV_NAME}]": two_envs["first"], f"cpu-box [{OTHER_ENV}]": two_envs["second"]}
    assert {run: {c[:8] for c in commits} for run, commits in ctx.commits.items()} == runs
    assert set(ctx.lean["kind"]) == {"reference"}
    with_cont = Context(results=load_results(two_envs["root"], continuous=True))
    assert {c[:8] for c in with_cont.commits[f"cpu-box [continuous {CONTINUOUS_ENV}]"]} == two_envs["continuous"]


def test_the_latest_commit_is_compared_within_its_env(two_envs: dict) -> None:
    """Mixing the envs would compare the 30x slower env's newest commit with the other env's
    previous one and call every time 30x slower (the 'logreg_hessian closed_form 28.63x')."""
    ctx = Context(results=load_results(two_envs["root"]))
    changes = latest_changes(ctx)
    assert len(changes) == 2
    for c in changes:
        assert {c["base"], c["head"]} == set(ctx.commits[c["machine"]])
        assert c["counts"].get("slower", 0) == 0, c
        cmp = commit_changes(ctx, c["machine"], c["base"], c["head"])
        times = cmp[cmp["metric"] == "time"]
        assert len(times) and times["ratio"].between(0.9, 1.1).all()


def test_pages_hold_no_continuous_commit_unless_asked(two_envs: dict, tmp_path: Path) -> None:
    build_dashboard(two_envs["root"], tmp_path / "plain")
    build_dashboard(two_envs["root"], tmp_path / "all", continuous=True)
    for commit in two_envs["continuous"]:
        for page in (tmp_path / "plain").glob("*.html"):
            assert commit[:8] not in page.read_text(encoding="utf-8"), page.name
    assert any(c[:8] in (tmp_path / "all" / "compare.html").read_text(encoding="utf-8")
               for c in two_envs["continuous"])
    assert "continuous" in (tmp_path / "all" / "history.html").read_text(encoding="utf-8")


def test_peers_and_unknown_methods_are_columns(two_envs: dict, tmp_path: Path) -> None:
    build_dashboard(two_envs["root"], tmp_path / "out")
    overview = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    head = overview.split("Speedups at the latest commit", 1)[1]
    for label in ("JAX (jit)", "Opacus (ew)", "BackPACK", "mystery_peer", "closed form"):
        assert f"<th>{label}</th>" in head, label
    peers = (tmp_path / "out" / "peers.html").read_text(encoding="utf-8")
    assert "Distance to the limit" in peers and "mystery_peer" in peers
    assert "No memory-limit results" in peers  # the folder is absent: said, not an error


def test_bars_and_table_show_the_in_process_speedup(two_envs: dict) -> None:
    """One source: the bar and the table cell are the track_speedup_vs_loop value, not a
    ratio of medians, wherever the suite recorded it."""
    ctx = Context(results=load_results(two_envs["root"]))
    cells = cell_table(ctx.latest_commit_rows)
    tracked = ctx.latest_commit_rows[ctx.latest_commit_rows["metric"] == "speedup_vs_loop"]
    engine = cells[cells["method"] == "engine"]
    for r in engine.itertuples(index=False):
        stored = tracked[(tracked["machine"] == r.machine) & (tracked["method"] == "engine")]["value"]
        assert r.speedup == pytest.approx(float(stored.iloc[0]))
        assert r.speedup_source == "in-process ratio"


def test_memlimit_view_reads_the_newest_report(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_results(results, commits=1, machines=1, extras=False, workloads=(PEERS,))
    folder = results / "memlimit" / "cpu-box"
    folder.mkdir(parents=True)
    rows = [{"workload": "psg_peers", "method": "engine", "size": "", "max_batch": 4096, "time_at_max_s": 0.25,
             "status": "ok", "reason": "fits at batch 4096; batch 5120 ran out of memory", "limited_by": "memory"},
            {"workload": "psg_peers", "method": "loop", "size": "", "max_batch": 181, "time_at_max_s": 21.0,
             "status": "ok", "reason": "fits at batch 181; batch 226 exceeded the probe time limit",
             "limited_by": "time"},
            {"workload": "psg_peers", "method": "closed_form", "size": "", "max_batch": 16384, "time_at_max_s": 0.01,
             "status": "ok", "reason": "fits at the search cap (batch 16384)", "limited_by": "cap"},
            {"workload": "psg_peers", "method": "backpack", "size": "", "max_batch": None, "time_at_max_s": None,
             "status": "ok", "reason": "not even batch 1 fits: batch 2 ran out of memory", "limited_by": "memory"},
            {"workload": "psg_peers", "method": "engine_chunked", "size": "", "max_batch": 2048,
             "time_at_max_s": 1.5, "status": "ok", "reason": "fits at batch 2048", "limited_by": "memory"},
            {"workload": "psg_peers", "method": "opacus_ew", "size": "", "max_batch": None, "time_at_max_s": None,
             "status": "skip", "reason": "opacus is not installed"}]
    head = {"machine": "cpu-box", "torch": "2.13.0", "device": "cpu", "budget_bytes": 2 ** 31,
            "probe_timeout_s": 30.0, "search": {"precision": 0.25}}
    (folder / "0a1b2c3d.json").write_text(json.dumps({**head, "commit": "0a1b2c3d", "rows": rows,
                                                      "written_at": "2026-11-23T12:00:00Z"}))
    # An older report whose name sorts last and whose file is touched last (as a fresh clone may
    # leave it): the recorded time still says which is newest.
    (folder / "ffff0000.json").write_text(json.dumps({**head, "commit": "ffff0000", "rows": rows[:1]}))
    frame = load_memlimit(results)
    assert set(frame["commit"]) == {"0a1b2c3d"} and frame["budget_bytes"].iloc[0] == 2 ** 31
    assert set(frame["method"]) == {r["method"] for r in rows}
    build_dashboard(results, tmp_path / "out")
    page = (tmp_path / "out" / "peers.html").read_text(encoding="utf-8")
    assert "budget 2 GiB" in page and "probe time limit 30 s" in page and "precision 25%" in page
    assert ">4096<" in page and "opacus is not installed" in page and "engine (chunked)" in page and ">2048<" in page
    assert re.search(r">181<br><small>21 s per call</small><br><small><b>time limit</b>", page)
    assert ">≥16384<" in page and "none fits (over budget)" in page


@pytest.mark.parametrize("command", ["dashboard", "export"])
def test_missing_results_folder_exits_non_zero(command: str, tmp_path: Path, capsys) -> None:
    from vmapbench.commands import dashboard, export

    module = dashboard if command == "dashboard" else export
    parser = argparse.ArgumentParser()
    module.configure(parser)
    args = parser.parse_args(["--results", str(tmp_path / "nonexistent")]
                             + (["--out", str(tmp_path / "out")] if command == "dashboard" else []))
    assert module.main(args) == 2
    assert "no results folder" in capsys.readouterr().err


def test_stale_coverage_report_says_how_old(tmp_path: Path) -> None:
    old = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD~3"], capture_output=True, text=True)
    if old.returncode != 0:
        pytest.skip("needs a git checkout with three commits")
    count = subprocess.run(["git", "-C", str(REPO), "rev-list", "--count", "HEAD~3..HEAD"],
                           capture_output=True, text=True).stdout.strip()
    report = CoverageReport(tmp_path / "latest.json", [], {"engine_commit": old.stdout.strip()[:7]})
    stale = coverage_staleness(report, REPO)
    assert stale is not None and stale.commits_behind == int(count) >= 3
    assert re.search(rf"{count} commits and [\d.]+ days older than HEAD", stale.note())
    fresh = CoverageReport(tmp_path / "latest.json", [], {"engine_commit": "HEAD"})
    assert coverage_staleness(fresh, REPO).note() == ""


def test_batched_estimates_are_the_gates_own() -> None:
    """numbers.sampled_estimates computes stats.estimate many rows at a time: same numbers."""
    import numpy as np

    from measuring import stats

    rng = np.random.default_rng(7)
    entries = [list(rng.lognormal(-6, 0.3, size=n)) for n in (2, 3, 5, 5, 10, 10, 10, 40)]
    entries += [[1e-3, None, 2e-3, float("nan"), 1.5e-3], [4e-3], None]
    for entry, got in zip(entries, sampled_estimates(entries)):
        want = stats.row_estimate(1.0, entry) if entry else None
        if want is None or want.n <= 1:
            assert got is None
        else:
            assert got == pytest.approx((want.value, want.lo, want.hi, want.n), rel=1e-12)


def test_peers_page_shows_compile_cost_from_peer_ratios(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_results(results, commits=1, machines=1, extras=False, workloads=(PEERS,))
    folder = results / "peer_ratios" / "cpu-box"
    folder.mkdir(parents=True)
    row = {"workload": "bayes_hmc", "size": "model=logreg,chains=8", "ours": "engine_traced",
           "samples": {"engine_traced": [0.002, 0.0021, 0.0019], "jax": [0.001, 0.001, 0.001],
                       "torch_func": [0.01, 0.011, 0.009]},
           "seconds": {"engine_traced": 0.002, "jax": 0.001, "torch_func": 0.01},
           "first_call": {"engine_traced": {"cold": 31.5, "warm": 0.8}, "jax": {"cold": 1.2, "warm": 0.01}},
           "break_even": {"engine_traced": 3938, "jax": math.inf}, "fused_state": "fused",
           "skipped": {"backpack": "not a per-sample workload"}, "failed": {}}
    (folder / "0a1b2c3d.json").write_text(json.dumps({"machine": "cpu-box", "commit": "0a1b2c3d" * 5,
                                                      "threads": 1, "rows": [row]}))
    (folder / "broken.json").write_text("{not json")
    os.utime(folder / "broken.json", (0, 0))  # older: the newest readable report is the one shown
    build_dashboard(results, tmp_path / "out")
    page = (tmp_path / "out" / "peers.html").read_text(encoding="utf-8")
    assert "Against jax.jit, compile cost included" in page and "commit <code>0a1b2c3d</code>" in page
    assert "cpu-box · cpu · 1 thread(s)" in page  # a report without a device field ran on the CPU
    assert "31.5 s / 800 ms" in page and ">3938<" in page and ">never<" in page
    assert re.search(r"2(\.0+)?×", page) and "not a per-sample workload" in page
