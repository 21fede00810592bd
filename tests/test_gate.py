"""The regression gate on synthetic measurements: signals, verdicts, exit codes, placement, calibration."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vmapbench import continuous, gate
from measuring import counts, stats

ROOT = Path(__file__).resolve().parents[1]
METHODS = {"loop": 4e-3, "engine": 5e-3, "engine_traced": 1.5e-3, "torch_func": 3e-3}
CHAIN = {"native": 6e-4, "torch_func": 8e-4, "engine": 2.4e-3, "engine_traced": 7e-4}
COUNTS = {"chain|engine": 6.5e6, "chain|engine_traced": 4.0e6, "wl|mlp_hvp|hidden=128,k=8|engine_eager": 8.9e6,
          "wl|mlp_hvp|hidden=128,k=8|engine": 3.8e6}
ROUNDS = 8


def probe(seed: int, engine_factor: float = 1.0, errors: dict | None = None, copy: int = 0) -> dict:
    """One side's output of a time process: every method's per-round times jittered by a load
    factor per process and per round (`seed` sets them: the sides of one process share them, which
    is what ratios taken round by round cancel) and by its own small noise; engine methods scaled
    by engine_factor. `copy` gives a second copy of the same commit its own small noise."""
    rng = np.random.default_rng(seed)
    load = float(np.exp(rng.normal(0, 0.3)))
    rounds = np.exp(rng.normal(0, 0.2, ROUNDS))
    own = np.random.default_rng([seed, int(engine_factor * 1000), len(errors or {}), copy])

    def jitter(t: float, engine: bool) -> list[float]:
        return [t * load * float(r) * float(np.exp(own.normal(0, 0.02))) * (engine_factor if engine else 1.0)
                for r in rounds]

    times = {m: jitter(t, m == "engine") for m, t in METHODS.items()}
    chain = {m: jitter(t, m == "engine") for m, t in CHAIN.items()}
    return {"times": {"mlp_hvp": {"hidden=128,k=8": times}}, "overhead": chain, "errors": errors or {}}


def count_probe(seed: int, engine_factor: float = 1.0) -> dict:
    """One side's output of a count process: two counts of each region, differing by a few parts in 10^4."""
    rng = np.random.default_rng(seed)
    return {"counts": {f"{label}|{rep}": int(n * (engine_factor if label.endswith("|engine") else 1.0)
                                            * (1 + rng.normal(0, 3e-4)))
                       for label, n in COUNTS.items() for rep in range(2)}, "errors": {}, "process": "count"}


def sides(seed: int, engine_factor: float = 1.0, counts_factor: float | None = None, errors: dict | None = None,
          twin: bool = True, processes: int = 1) -> dict[str, list[dict]]:
    """What gate.measure returns: per side (base, head, twin: head's second copy) its outputs of
    `processes` time processes (the sides of one process share its load and round factors) and of
    one count process (base and head); head's (and twin's) engine methods scaled by engine_factor,
    its counts by counts_factor (default engine_factor), errors at head."""
    out: dict[str, list[dict]] = {"base": [], "head": []} | ({"twin": []} if twin else {})
    for i in range(processes):
        for name in out:
            at_head = name in ("head", "twin")
            p = probe(seed + i, engine_factor if at_head else 1.0, errors if name == "head" else None,
                      copy=int(name == "twin"))
            out[name].append({**p, "process": f"time-{i}"})
    out["base"].append(count_probe(seed + 50))
    out["head"].append(count_probe(seed + 51, engine_factor if counts_factor is None else counts_factor))
    return out


def outcome_of(measured: dict[str, list[dict]], root: Path, machine: str = "m") -> gate.Outcome:
    return gate.outcome(measured["base"], measured["head"], machine, root, twin_probes=measured.get("twin", ()))


def test_signals_are_named_like_the_suite_points():
    got = gate.signals(probe(0))
    p = "'hidden=128,k=8', '{}', 'cpu'"
    ratio = got[f"bench_workloads.mlp_hvp.track_ratio_vs_torch_func({p.format('engine')})"]
    run = got[f"bench_workloads.mlp_hvp.time_run({p.format('engine')})"]
    ref = got[f"bench_workloads.mlp_hvp.time_run({p.format('torch_func')})"]
    assert len(ratio) == len(run) == ROUNDS and ratio == pytest.approx([a / b for a, b in zip(run, ref)])
    raw = probe(0)["times"]["mlp_hvp"]["hidden=128,k=8"]["engine"]
    assert run == pytest.approx(raw)  # one sample a round (whole cycles of two: ROUNDS is even)
    assert ROUNDS % 2 == 0 and len(gate.signals({**probe(0), "cycle": 3})[
        f"bench_workloads.mlp_hvp.time_run({p.format('engine')})"]) == ROUNDS - ROUNDS % 3
    assert f"bench_workloads.mlp_hvp.track_ratio_vs_torch_func({p.format('torch_func')})" not in got
    assert f"bench_workloads.mlp_hvp.track_speedup_vs_loop({p.format('loop')})" not in got
    assert "bench_overhead.PerOpOverhead.track_overhead_us_per_op('engine', 'cpu')" in got
    assert "bench_overhead.PerOpOverhead.track_overhead_us_per_op('native', 'cpu')" not in got
    counted = gate.signals(count_probe(0))
    assert len(counted[f"bench_workloads.mlp_hvp.instructions({p.format('engine_eager')})"]) == 2
    assert len(counted["bench_overhead.PerOpOverhead.instructions('engine_traced', 'cpu')"]) == 2
    assert all(stats.is_gated(n) and stats.is_count(n) for n in counted)


def test_a_over_a_under_load_passes_on_a_machine_without_a_calibration(tmp_path):
    result = outcome_of(sides(0), tmp_path)
    assert result.exit_code == 0
    assert not gate.regressions(result.rows)
    sources = {r.source for r in result.rows if r.gated}
    assert sources == {"evidence", "count"}  # no blanket default floor anywhere
    assert all(r.floor == stats.COUNT_FLOOR for r in result.rows if r.source == "count")
    raw = [r for r in result.rows if not r.gated]
    assert raw and all("time_run" in r.name or "time_chain" in r.name for r in raw)
    assert 0 < result.twin_noise < 0.2  # the run's own noise, from head and its twin
    assert outcome_of(sides(0, twin=False), tmp_path).twin_noise is None


def test_without_a_twin_there_is_no_evidence_and_time_signals_are_inconclusive(tmp_path):
    """Without a calibration file and without base's twin a time signal's noise is unknown:
    it is reported inconclusive, never slower, however far its head moved."""
    result = outcome_of(sides(0, engine_factor=1.5, counts_factor=1.0, twin=False), tmp_path)
    timed = [r for r in result.rows if r.gated and not stats.is_count(r.name)]
    assert timed and all(r.source == "none" and r.verdict == "inconclusive" for r in timed)
    assert result.exit_code == 0


def test_planted_engine_slowdown_fails_naming_only_engine_signals(tmp_path):
    result = outcome_of(sides(0, engine_factor=1.3), tmp_path)
    assert result.exit_code == 1
    named = [r.name for r in gate.regressions(result.rows)]
    assert named and all(gate.is_engine_signal(n) for n in named)
    assert any("instructions" in n for n in named)


def test_a_small_count_change_is_caught_where_time_cannot_see_it(tmp_path):
    """A 5% slowdown: inside any time floor of a loaded machine, beyond the 3% count floor."""
    result = outcome_of(sides(0, engine_factor=1.0, counts_factor=1.05), tmp_path)
    named = [r.name for r in gate.regressions(result.rows)]
    assert named and all(stats.is_count(n) and gate.is_engine_signal(n) for n in named)
    unchanged = outcome_of(sides(0, counts_factor=1.02), tmp_path)
    assert unchanged.exit_code == 0


def test_evidence_floor_pools_the_spread_of_a_metric():
    spread = {f"b.w{i}.track_ratio_vs_torch_func('s', 'engine', 'cpu')": 0.01 * i for i in range(1, 11)}
    spread["b.w.time_run('s', 'engine', 'cpu')"] = 0.5  # reported metrics get no evidence floor
    floors = gate.evidence_floors(spread)
    assert "b.w.time_run('s', 'engine', 'cpu')" not in floors
    q = float(np.quantile([0.01 * i for i in range(1, 11)], gate.EVIDENCE_QUANTILE))
    low = "b.w1.track_ratio_vs_torch_func('s', 'engine', 'cpu')"
    assert floors[low] == pytest.approx(math.expm1(gate.EVIDENCE_MARGIN * q))  # lifted to its metric's spread
    high = "b.w10.track_ratio_vs_torch_func('s', 'engine', 'cpu')"
    assert floors[high] == pytest.approx(math.expm1(gate.EVIDENCE_MARGIN * 0.1))


def test_evidence_pools_by_method_where_a_method_has_enough_signals():
    """Automatic tracing's replays move more under load than traced calls: each method's signals
    are pooled apart, so the quiet method keeps a floor of its own; a method with few signals is
    pooled with its whole metric."""
    name = "b.w{}.track_ratio_vs_torch_func('s', '{}', 'cpu')"
    spread = {name.format(i, "engine"): 0.2 for i in range(10)}
    spread |= {name.format(i, "engine_traced"): 0.02 for i in range(10)}
    spread |= {name.format(i, "loop"): 0.02 for i in range(3)}  # too few: the metric's pool
    floors = gate.evidence_floors(spread)
    assert floors[name.format(0, "engine_traced")] == pytest.approx(math.expm1(gate.EVIDENCE_MARGIN * 0.02))
    assert floors[name.format(0, "engine")] == pytest.approx(math.expm1(gate.EVIDENCE_MARGIN * 0.2))
    pooled = float(np.quantile(list(spread.values()), gate.EVIDENCE_QUANTILE))
    assert floors[name.format(0, "loop")] == pytest.approx(math.expm1(gate.EVIDENCE_MARGIN * pooled))


def test_a_case_failing_at_head_exits_2_and_a_dead_process_too(tmp_path):
    broken = sides(0, errors={"mlp_hvp hidden=128,k=8 engine": "RuntimeError: boom"})
    assert outcome_of(broken, tmp_path).exit_code == 2
    dead = sides(0, processes=2)
    for name in dead:
        dead[name][1] = {"fatal": "Traceback ...\nImportError: no engine", "process": "time-1"}
    result = outcome_of(dead, tmp_path)
    assert result.exit_code == 2 and "ImportError" in result.failed["measuring process"]


def test_noise_floor_file_silences_a_noisy_signal(tmp_path):
    measured = sides(0, engine_factor=1.3)
    floors = {n: 1.0 for p in measured["base"] for n in gate.signals(p) if stats.is_gated(n)}
    path = stats.noise_file("m", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"floors": floors}))
    result = outcome_of(measured, tmp_path)
    assert result.exit_code == 0 and {r.source for r in result.rows if r.gated} == {"calibrated"}


def test_a_calibrated_floor_is_lifted_by_its_own_twin_only(tmp_path):
    # With a file, a signal's calibrated floor is lifted only by the spread of its own two copies
    # of head, so the calibrated floors are the floors in effect; on an unseen machine its pool's.
    name = "bench_workloads.w{}.track_ratio_vs_torch_func('s', 'engine_eager', 'cpu')"
    offset = {0: 1.2} | {i: 1.0 for i in range(1, 10)}
    base = {"t": {name.format(i): [1.0, 1.01, 0.99, 1.0] for i in range(10)}}
    head = {"t": {n: list(v) for n, v in base["t"].items()}}
    twin = {"t": {name.format(i): [offset[i] * v for v in head["t"][name.format(i)]] for i in range(10)}}
    lifted = math.expm1(gate.EVIDENCE_MARGIN * math.log(1.2))
    unseen = {r.name: r for r in gate.compare(base, head, "fresh", tmp_path, twin)}
    pooled = math.expm1(gate.EVIDENCE_MARGIN * float(np.quantile([math.log(1.2)] + [0.0] * 9, gate.EVIDENCE_QUANTILE)))
    assert unseen[name.format(0)].floor == pytest.approx(lifted) and unseen[name.format(3)].floor == pytest.approx(pooled)
    assert {r.source for r in unseen.values()} == {"evidence"}
    path = stats.noise_file("m", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"floors": {name.format(i): 0.05 for i in range(10)}}))
    home = {r.name: r for r in gate.compare(base, head, "m", tmp_path, twin)}
    assert home[name.format(0)].floor == pytest.approx(lifted) and home[name.format(3)].floor == pytest.approx(0.05)
    assert {r.source for r in home.values()} == {"calibrated"}


def test_a_time_signal_is_slower_only_where_both_copies_of_head_are(tmp_path):
    # One copy of a commit can run a method 10-25% slower for a whole workload in one process (a
    # side's own slowness, seen on any side): one slowed copy of head is inconclusive, both slower.
    name = "bench_workloads.w.track_ratio_vs_torch_func('s', 'engine', 'cpu')"
    path = stats.noise_file("m", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"floors": {name: 0.05}}))
    base = {"t": {name: [1.0, 1.01, 0.99, 1.0, 1.0, 1.01]}}

    def times(factor: float) -> dict:
        return {"t": {name: [factor * v for v in base["t"][name]]}}

    # head 25% slower, its twin 10%: the copies' spread lifts the floor to 21%, which head alone
    # passes; the verdicts disagree.
    (one,) = gate.compare(base, times(1.25), "m", tmp_path, times(1.1))
    assert one.floor == pytest.approx(math.expm1(gate.EVIDENCE_MARGIN * math.log(1.25 / 1.1)))
    assert one.verdict == "inconclusive" and one.change.value == pytest.approx(1.1)
    (both,) = gate.compare(base, times(1.25), "m", tmp_path, times(1.3))
    assert both.verdict == "slower" and both.change.value == pytest.approx(1.25)
    (faster,) = gate.compare(base, times(0.7), "m", tmp_path, times(0.75))
    assert faster.verdict == "faster"


def test_the_busy_core_spinner_ends_when_the_calibration_is_killed():
    import signal
    import time

    child = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                              "from vmapbench import gate\nwith gate.busy_core(True):\n    print('busy', flush=True); "
                              "time.sleep(60)", str(ROOT)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "busy"
    marker = f"os.getppid() == {child.pid}"

    def spinners() -> list[str]:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if marker in cmdline.read_bytes().decode(errors="replace"):
                    found.append(cmdline.parent.name)
            except OSError:
                continue
        return found

    deadline = time.time() + 120  # a hang guard: on a busy machine the spinner may show late
    while not spinners() and time.time() < deadline:
        time.sleep(0.1)
    assert spinners()
    child.send_signal(signal.SIGKILL)  # no finally runs in it
    child.wait()
    deadline = time.time() + 120  # a hang guard: a spinner checks its parent between loops
    while spinners() and time.time() < deadline:
        time.sleep(0.1)
    assert not spinners()


def test_markdown_summary_lists_called_changes_with_intervals(tmp_path):
    result = outcome_of(sides(0, engine_factor=1.3), tmp_path)
    text = gate.markdown(result.rows, result.failed, "Benchmarks gate: a -> b", ["valgrind is not installed"])
    assert text.startswith("### Benchmarks gate: a -> b")
    assert "**regression**" in text and "| signal | verdict | head/base [99% interval] |" in text
    assert "skipped: valgrind is not installed" in text and "inconclusive" in text
    slower = gate.regressions(result.rows)[0]
    assert stats.relative_change(slower.change) in text
    failed = gate.markdown([], {"x engine": "RuntimeError: a|b"}, "t")
    assert "**failed**" in failed and "RuntimeError: a/b" in failed


def test_calibrated_floors_cover_the_worst_a_over_a_deviation():
    rows = outcome_of(sides(0), Path("/nonexistent"))
    noisy = [gate.Row(r.name, r.gated, r.verdict, r.floor, stats.Estimate(1.4, 1.2, 1.6, 3), r.base, r.head)
             if "engine_traced" in r.name else r for r in rows.rows]
    floors = gate.calibrated_floors([rows.rows, noisy])
    traced = [f for n, f in floors.items() if "engine_traced" in n and "ratio_vs" in n]
    assert traced and all(f > 0.6 for f in traced)  # 1.5 x log(1.4), back to a fraction
    assert all(stats.is_gated(n) for n in floors)
    counted = [f for n, f in floors.items() if stats.is_count(n) and "engine_traced" not in n]
    assert counted and all(gate.COUNT_MIN_FLOOR <= f < stats.COUNT_FLOOR for f in counted)
    families = gate.floors_by_family(floors)
    assert {"count: per-op chain", "count: eager calls", "count: replayed calls", "time: ratio vs torch.func"} <= set(families)


def test_calibration_summary_counts_runs_and_engine_names():
    runs = [gate.CalibrationRun("aa", [], 0, 1.0), gate.CalibrationRun("aa", [], 0, 1.0),
            gate.CalibrationRun("planted-uniform", ["bench_overhead.PerOpOverhead.instructions('engine', 'cpu')"], 1, 1.0),
            gate.CalibrationRun("planted-uniform", ["bench_workloads.w.time_run('s', 'loop', 'cpu')"], 1, 1.0)]
    summary = gate.summarize_calibration(runs)
    assert summary["aa"] == {"runs": 2, "flagged_runs": 0, "rate": 0.0, "named": [], "only_engine_named": True,
                             "failed_runs": 0, "seconds": [1, 1], "verdicts": [{}, {}], "beyond_floor": [0, 0],
                             "twin_noise": [None, None]}
    assert summary["planted-uniform"]["flagged_runs"] == 2 and summary["planted-uniform"]["only_engine_named"] is False


def test_calibration_runs_are_appended_to_the_record_of_one_machine(tmp_path):
    path = tmp_path / "results" / "gate" / "m" / "checks.json"
    gate.record_run(path, "m", gate.CalibrationRun("aa", [], 0, 100.0, {"unchanged": 3}, [], 0.01, "abc", 0.4))
    gate.record_run(path, "m", gate.CalibrationRun("planted-uniform", ["x"], 1, 120.0, commit="abd"))
    runs = json.loads(path.read_text())["runs"]
    assert [(r["kind"], r["exit_code"], r["commit"]) for r in runs] == [("aa", 0, "abc"), ("planted-uniform", 1, "abd")]
    assert runs[0]["twin_noise"] == 0.01 and runs[0]["load"] == 0.4 and runs[0]["date"]
    with pytest.raises(SystemExit, match="holds runs of 'm'"):
        gate.record_run(path, "other", gate.CalibrationRun("aa", [], 0, 1.0))


def test_a_signal_beyond_its_floor_either_way_is_named():
    def row(name, value, floor, gated=True):
        est = stats.Estimate(value, value * 0.99, value * 1.01, 12)
        return gate.Row(name, gated, "unchanged", floor, est, est, est)

    rows = [row("in", 1.04, 0.05), row("slower", 1.06, 0.05), row("faster", 1 / 1.06, 0.05),
            row("unknown", 3.0, math.inf), row("reported", 2.0, 0.05, gated=False)]
    assert [name for name, _, _ in gate.beyond_floor(rows)] == ["slower", "faster"]


def test_count_dumps_are_parsed_by_their_label(tmp_path):
    dump = ("version: 1\ncreator: callgrind-3.19.0\npid: 12\ncmd: python\npart: 3\n\n"
            "desc: I1 cache: \ndesc: Trigger: Client Request: wl|nn_ffnn|batch=32|engine|1\n\n"
            "positions: line\nevents: Ir\nsummary: 18446744073580942358\n\nfn=(1) main\n0 5\n\ntotals: 1500230\n")
    assert counts.parse_dump(dump) == {"wl|nn_ffnn|batch=32|engine|1": 1500230}
    assert counts.parse_dump(dump.replace("Client Request: wl|nn_ffnn|batch=32|engine|1", "Program termination")) == {}
    (tmp_path / "callgrind.out.3").write_text(dump)
    (tmp_path / "callgrind.out").write_text("desc: Trigger: Program termination\ntotals: 0\n")
    assert counts.read_dumps(tmp_path) == {"wl|nn_ffnn|batch=32|engine|1": 1500230}


def test_missing_valgrind_skips_the_counts_with_a_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(counts.shutil, "which", lambda name: None)
    reason = counts.available()
    assert reason and "valgrind is not installed" in reason
    seen = {}

    def fake_measure(trees, workdir, log=print, counting=None):
        seen["counting"] = counting
        return {side: [{**probe(0), "process": "time-0"}] for side in ("base", "head", "twin")}

    monkeypatch.setattr(gate, "measure", fake_measure)
    result = gate.compare_commits(ROOT, "HEAD", "HEAD", "m", log=lambda *a: None)
    assert seen["counting"] == reason and result.skipped == [reason] and result.exit_code == 0
    assert not any(stats.is_count(r.name) for r in result.rows)


def test_one_process_times_base_its_twin_and_head_and_one_counts_base_and_head():
    # The core the count leaves free times the workloads the first time process has not reached.
    assert [(j.label, j.share) for j in gate.jobs(counting=True)] == [("time-0", "front"), ("count-0", ""),
                                                                        ("time-1", "front")]
    assert [(j.kind, j.share) for j in gate.jobs(counting=False)] == [("time", ""), ("time", "")]  # more rounds
    trees = {side: Path(f"/x/{side}") for side in gate.SIDES}
    cmd = gate.probe_command(Path("/x/count-0.json"), gate.Job("count"), trees, Path("/lib.so"))
    assert cmd[0] == "valgrind" and "--instr-atstart=no" in cmd and "--count" in cmd
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--tree"] == ["base=/x/base", "head=/x/head"]
    cmd = gate.probe_command(Path("/x/time-0.json"), gate.Job("time"), trees)
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--tree"] == ["base=/x/base", "head=/x/head", "twin=/x/twin"]
    assert "--claims" not in cmd and "--overhead" in cmd
    front, count, back = (gate.probe_command(Path(f"/x/{j.label}.json"), j, trees, Path("/lib.so"))
                          for j in gate.jobs(counting=True))
    assert front[front.index("--claims") + 1] == back[back.index("--claims") + 1] == "/x/claims"
    assert "--from-end" not in back and "--from-end" not in front and "--claims" not in count
    assert "--overhead" in front and "--overhead" not in back  # the per-op chain: timed once
    assert "--memory" in front and "--memory" in back  # each workload's peaks, by the process that times it


def test_two_time_processes_sharing_the_registry_time_each_workload_once(tmp_path):
    """One claims from the first workload on, the other from the last back, each its own; what
    one process claimed the other skips."""
    from vmapbench import gate_probe

    commit = gate.resolve(ROOT, "HEAD")
    sides = gate_probe.Sides({"base": gate.extract(ROOT, commit, tmp_path / "base")})
    names = ["quadratic_hessian", "rosenbrock_hessian", "mlp_jacobian"]
    claim = gate_probe.claimer(tmp_path / "claims")
    try:
        assert claim("mlp_jacobian")  # taken by the other process, from the end
        out = gate_probe.measure_workloads(sides, budget_s=0.01, clock=gate_probe.CLOCKS["cpu"], only=names,
                                           claim=claim, from_end=False)
        again = gate_probe.measure_workloads(sides, budget_s=0.01, clock=gate_probe.CLOCKS["cpu"], only=names,
                                             claim=gate_probe.claimer(tmp_path / "claims"), from_end=True)
        asked: list[str] = []
        last = gate_probe.measure_workloads(sides, budget_s=0.01, clock=gate_probe.CLOCKS["cpu"], only=names,
                                            claim=lambda name: not asked.append(name) and len(asked) == 1,
                                            from_end=True)
    finally:
        sides.close()
    assert set(out["base"]["times"]) == {"quadratic_hessian", "rosenbrock_hessian"}
    assert not again["base"]["times"] and not claim("quadratic_hessian")
    assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == sorted(names)
    assert asked == names[::-1] and set(last["base"]["times"]) == {"mlp_jacobian"}


def test_adaptive_rounds_stop_early_for_a_steady_signal_and_run_on_for_a_noisy_one():
    from vmapbench import gate_probe

    ticks = iter(range(10**6))
    clock = lambda: next(ticks) * 1e-3  # noqa: E731 - every call 1 ms on a fake clock
    steady = gate_probe.adaptive_samples({"a": lambda: None, "b": lambda: None}, "a", budget_s=1e9, clock=clock)
    assert len(steady["a"]) == gate_probe.MIN_ROUNDS and gate_probe.MIN_ROUNDS % 2 == 0  # one side: cycles of 2
    rng = np.random.default_rng(0)
    jumpy = iter(np.cumsum(rng.exponential(1e-3, 10**5)))
    noisy = gate_probe.adaptive_samples({"a": lambda: None, "b": lambda: None}, "a", budget_s=1e9,
                                        clock=lambda: float(next(jumpy)))
    assert len(noisy["a"]) > gate_probe.MIN_ROUNDS and len(noisy["a"]) == len(noisy["b"])
    assert len(noisy["a"]) % 2 == 0  # whole cycles of rounds (forward, reverse)


def test_the_time_process_keeps_the_collector_frozen_through_its_rounds(monkeypatch, tmp_path):
    """The time process freezes the collector before measuring, so each rounds' untimed
    collections walk only what the timed calls made (measuring.timer.rounds keeps a freeze it did
    not make), not the whole heap of torch and three commits, workload after workload."""
    import gc

    from vmapbench import gate_probe

    seen = []

    def measure(sides, budget, clock, only, memory=(), claim=None, from_end=False):
        timer = gate_probe.gate_measuring("timer")
        for _ in range(2):  # two workloads' rounds
            timer.rounds({"a": lambda: None}, 2, collect=True)
            seen.append(gc.get_freeze_count())
        return {}

    monkeypatch.setattr(gate_probe, "Sides", lambda trees: {})
    monkeypatch.setattr(gate_probe, "measure_workloads", measure)
    monkeypatch.setattr(gate_probe, "gate_suite", lambda name: type("S", (), {"pin_threads": staticmethod(lambda: None)}))
    assert gc.get_freeze_count() == 0
    try:
        assert gate_probe.main(["--tree", f"base={tmp_path}", "--out", str(tmp_path / "out.json")]) == 0
    finally:
        gc.unfreeze()  # (this test process's own objects back to the collector's walks)
    assert len(seen) == 2 and all(n > 0 for n in seen), seen


def test_a_rounds_figure_is_its_fastest_unit_of_calls_per_call():
    # The vCPU's slow phases only ever add time: a batch's figure is its fastest unit of calls
    # (calls grouped to at least UNIT_S), not its mean. A call every third of which takes 3 ms.
    from vmapbench import gate_probe

    now = [0.0]
    calls = [0]

    def fn():
        calls[0] += 1
        now[0] += 3e-3 if calls[0] % 3 == 0 else 1e-3

    got = gate_probe.adaptive_samples({"a": fn}, None, budget_s=1e9, clock=lambda: now[0],
                                      min_rounds=2, max_rounds=2)
    assert got["a"] == pytest.approx([1e-3, 1e-3])  # the means were 1.67 ms
    assert gate_probe.whole_cycles([2.0, 1.0, 3.0, 5.0, 9.0]) == [2.0, 1.0, 3.0, 5.0]  # whole cycles of two
    assert gate_probe.whole_cycles([2.0, 1.0, 3.0, 5.0, 9.0, 4.0, 7.0], 3) == [2.0, 1.0, 3.0, 5.0, 9.0, 4.0]
    assert gate_probe.whole_cycles([2.0, 1.0], 3) == [2.0, 1.0]


def test_short_calls_are_timed_in_units_so_the_clock_costs_little():
    from vmapbench import gate_probe

    now = [0.0]
    reads = [0]

    def clock():
        reads[0] += 1
        return now[0]

    def fn():  # 10 us a call
        now[0] += 1e-5

    got = gate_probe.adaptive_samples({"a": fn}, None, budget_s=1e9, clock=clock, min_rounds=2, max_rounds=2)
    assert got["a"] == pytest.approx([1e-5, 1e-5])
    per_unit = math.ceil(gate_probe.UNIT_S / 1e-5)
    batch = math.ceil(gate_probe.MIN_BATCH_S / 1e-5)
    # Two clock reads a unit (and the budget's), never two a call: 3 rounds (one warm-up) of batch calls.
    assert reads[0] < 3 * (2 * batch / per_unit + 4) + 10


def test_a_shared_reference_is_timed_on_the_first_side_only_and_read_by_every_side():
    from vmapbench import gate_probe

    log: list[tuple[str, str]] = []
    now = [0.0]

    def call(side: str, name: str, seconds: float):
        def fn():
            log.append((side, name))
            now[0] += seconds
        return fn

    sides = {side: {"engine": call(side, "engine", 1e-3 * k), "loop": call(side, "loop", 5e-3)}
             for side, k in (("base", 1), ("head", 2), ("twin", 1))}
    got = gate_probe.paired_samples(sides, "loop", budget_s=1e9, clock=lambda: now[0], shared=("loop",),
                                    min_rounds=6, max_rounds=6)
    assert ("head", "loop") not in log and ("twin", "loop") not in log and ("base", "loop") in log
    assert got["head"]["loop"] == got["base"]["loop"] == got["twin"]["loop"]
    assert len(got["base"]["loop"]) == gate_probe.REFERENCE_ROUNDS
    assert got["head"]["engine"] == pytest.approx([2e-3] * 6)
    # Apart from the rounds: after the last round (one single call, then its own rounds only).
    loops = [i for i, key in enumerate(log) if key == ("base", "loop")]
    assert len(loops) == 1 + gate_probe.REFERENCE_ROUNDS  # (a 5 ms call: one a batch)
    assert loops[1] > max(i for i, key in enumerate(log) if key[1] == "engine")


def test_every_side_takes_every_place_of_the_round_once_a_cycle():
    # Two copies of one commit must measure alike: over a cycle of orders, each side's block runs
    # once first, once after each other side and once in each place; the shared references in none.
    from vmapbench import gate_probe

    sides = {side: {"engine": None, "engine_traced": None, "torch_func": None, "loop": None}
             for side in ("base", "head", "twin")}
    orders = gate_probe.round_orders(sides, shared=("torch_func", "loop"))
    assert len(orders) == gate_probe.cycle_length(3) == 3
    for order in orders:
        assert not any(name in ("torch_func", "loop") for side, name in order)
    firsts = [order[0][0] for order in orders]
    places = {side: sorted(i for order in orders for i, key in enumerate(order) if key == (side, "engine"))
              for side in sides}
    predecessors = {side: sorted(order[i - 1][0] for order in orders
                                 for i, key in enumerate(order) if key == (side, "engine") and i)
                    for side in sides}
    assert sorted(firsts) == ["base", "head", "twin"]
    assert places["base"] == places["head"] == places["twin"] == [0, 2, 4]
    # (when not first, a side's block follows another side's block)
    assert predecessors == {"base": ["twin", "twin"], "head": ["base", "base"], "twin": ["head", "head"]}
    # One side: forward, then reverse.
    one = gate_probe.round_orders({"": {"a": None, "b": None}})
    assert one == [[("", "a"), ("", "b")], [("", "b"), ("", "a")]]


def test_the_rounds_follow_the_cycle_and_stop_at_its_end():
    from vmapbench import gate_probe

    log: list[tuple[str, str]] = []
    now = [0.0]

    def call(side: str, name: str):
        def fn():
            log.append((side, name))
            now[0] += 1e-3
        return fn

    sides = {side: {"engine": call(side, "engine"), "torch_func": call(side, "torch_func")}
             for side in ("base", "head", "twin")}
    got = gate_probe.paired_samples(sides, "torch_func", budget_s=1e9, clock=lambda: now[0],
                                    shared=("torch_func",), max_rounds=10)
    # whole cycles of three, MIN_ROUNDS (6) at least: a steady signal stops there
    assert len(got["head"]["engine"]) == gate_probe.MIN_ROUNDS == 6
    batches = [key for i, key in enumerate(log) if i == 0 or log[i - 1] != key]  # one entry a batch
    engine = [side for side, name in batches if name == "engine"]
    # the single calls, one warm-up round, six rounds (three sides' engine each), the sides rotating
    rounds = [engine[i:i + 3] for i in range(3, len(engine), 3)]
    assert len(rounds) == 1 + 6 and all(sorted(r) == ["base", "head", "twin"] for r in rounds)
    assert [r[0] for r in rounds[-6:]] == ["base", "head", "twin"] * 2
    # torch.func (shared): on base only, its single call and its own rounds after the rest
    assert {key for key in log if key[1] == "torch_func"} == {("base", "torch_func")}
    assert log.index(("base", "torch_func"), log.index(("base", "torch_func")) + 1) > \
        max(i for i, key in enumerate(log) if key[1] == "engine")


def test_a_long_gated_call_is_timed_in_several_units():
    # A batch of one long call is the whole of whatever slow phase hits it; several units let the
    # fastest leave it out. A reference keeps one unit.
    from vmapbench import gate_probe

    now, slow = [0.0], iter([0.0, 0.0, 0.0, 8e-3] * 100)
    calls: list[str] = []

    def long_call(name):
        def fn():
            calls.append(name)
            now[0] += 5e-3 + next(slow)
        return fn

    got = gate_probe.paired_samples({"base": {"engine": long_call("engine")}}, None, budget_s=1e9,
                                    clock=lambda: now[0], min_rounds=2, max_rounds=2)
    assert got["base"]["engine"] == pytest.approx([5e-3, 5e-3])
    calls.clear()
    gate_probe.paired_samples({"base": {"loop": long_call("loop")}}, None, budget_s=1e9, clock=lambda: now[0],
                              min_rounds=2, max_rounds=2)
    assert len(calls) == 1 + 3  # one single call to size the batch, then one a round (warm-up + 2)


def test_long_calls_take_fewer_units_and_the_warm_up_round_one():
    # Units of tens of milliseconds: MIN_LONG_UNITS of them make a batch (a slow phase of a few
    # milliseconds hits one of them, not both); the warm-up round times one unit of every batch.
    from vmapbench import gate_probe

    for seconds, units in ((0.05, gate_probe.MIN_LONG_UNITS), (0.005, gate_probe.MIN_UNITS)):
        now, calls = [0.0], []

        def fn():
            calls.append(1)
            now[0] += seconds

        gate_probe.paired_samples({"base": {"engine_eager": fn}}, None, budget_s=1e9, clock=lambda: now[0],
                                  min_rounds=2, max_rounds=2)
        assert len(calls) == 1 + 1 + 2 * units  # the single call, the warm-up's unit, two rounds


def test_every_side_of_a_method_gets_the_same_batch():
    # A figure is the fastest unit of a batch: more units read lower. Copies of one commit must get
    # the same units, even when the first single call (the one that sizes batches) ran cold.
    from vmapbench import gate_probe

    now = [0.0]
    units: dict[str, list[int]] = {"base": [], "head": []}
    cold = iter([50e-5])  # the first call in the process takes 50x longer

    def call(side: str):
        def fn():
            units[side].append(1)
            now[0] += next(cold, 1e-5)
        return fn

    got = gate_probe.paired_samples({"base": {"engine": call("base")}, "head": {"engine": call("head")}}, None,
                                    budget_s=1e9, clock=lambda: now[0], min_rounds=2, max_rounds=2)
    assert len(units["base"]) == len(units["head"])
    assert got["base"]["engine"] == pytest.approx(got["head"]["engine"])


def test_a_ratios_change_is_the_methods_own_when_its_reference_is_shared():
    # With the reference timed once and read by every side, head/base of a ratio signal, pair by
    # pair, is the method's own change: the reference's noise cancels; the copies make no signals.
    times = {"base": [1.0, 1.1, 1.0, 1.2], "head": [1.2, 1.32, 1.2, 1.44]}
    loop = [10.0, 14.0, 9.0, 30.0]
    tf = {"base": [5.0, 5.5, 5.0, 6.0], "head": [5.0, 5.5, 5.0, 6.0]}

    def out(side: str) -> dict:
        t = {"engine": times[side], "loop": loop, "torch_func": tf[side]}
        probe = {"times": {"mlp_hvp": {"hidden=128,k=8": t}}, "process": "time-0"}
        return probe | ({"shared": {"mlp_hvp": ["loop"]}} if side == "head" else {})

    base, head = gate.signals(out("base")), gate.signals(out("head"))
    p = "'hidden=128,k=8', '{}', 'cpu'"
    speedup = f"bench_workloads.mlp_hvp.track_speedup_vs_loop({p.format('engine')})"
    change = gate.paired_change({"t": base}, {"t": head}, speedup)
    assert change.value == pytest.approx(1 / 1.2) and change.lo == pytest.approx(1 / 1.2)
    assert f"bench_workloads.mlp_hvp.time_run({p.format('loop')})" in base
    assert f"bench_workloads.mlp_hvp.time_run({p.format('loop')})" not in head
    assert f"bench_workloads.mlp_hvp.track_ratio_vs_torch_func({p.format('loop')})" not in head


def test_a_reference_timed_apart_divides_every_round_by_its_median():
    # A shared reference timed apart from the rounds (a few figures of its own): each round of a
    # method is divided by their median, so head/base of a ratio is the method's own, round by round.
    times = {"base": [1.0, 1.1, 1.0, 1.2, 1.0, 1.1], "head": [1.2, 1.32, 1.2, 1.44, 1.2, 1.32]}

    def out(side: str) -> dict:
        t = {"engine": times[side], "loop": [10.0, 30.0, 12.0], "torch_func": [4.0, 5.0, 6.0]}
        probe = {"times": {"mlp_hvp": {"hidden=128,k=8": t}}, "process": "time-0", "cycle": 3,
                 "apart": {"mlp_hvp": ["torch_func", "loop"]}}
        return probe | ({"shared": {"mlp_hvp": ["torch_func", "loop"]}} if side == "head" else {})

    base, head = gate.signals(out("base")), gate.signals(out("head"))
    p = "'hidden=128,k=8', '{}', 'cpu'"
    ratio = f"bench_workloads.mlp_hvp.track_ratio_vs_torch_func({p.format('engine')})"
    speedup = f"bench_workloads.mlp_hvp.track_speedup_vs_loop({p.format('engine')})"
    assert base[ratio] == pytest.approx([t / 5.0 for t in times["base"]])
    assert head[speedup] == pytest.approx([12.0 / t for t in times["head"]])
    change = gate.paired_change({"t": base}, {"t": head}, ratio)
    assert change.value == pytest.approx(1.2) and change.lo == pytest.approx(1.2) and change.hi == pytest.approx(1.2)
    assert f"bench_workloads.mlp_hvp.time_run({p.format('loop')})" in base
    assert f"bench_workloads.mlp_hvp.time_run({p.format('loop')})" not in head


def test_a_reference_whose_files_cannot_be_read_is_timed_on_every_side(tmp_path):
    from vmapbench import gate_probe

    class Sides:
        trees = {"base": tmp_path / "base", "head": tmp_path / "head"}

        def activate(self, label):
            pass

    def raising():
        raise RuntimeError("a call that fails while its files are read")

    calls = {side: {"loop": raising, "torch_func": lambda: None} for side in ("base", "head")}
    assert gate_probe.shared_references(Sides(), calls, True) == ("torch_func",)


def test_references_are_shared_only_with_the_same_workloads_and_no_engine_code(tmp_path):
    from vmapbench import gate_probe

    for side in ("base", "head"):
        (tmp_path / side / "workloads").mkdir(parents=True)
        (tmp_path / side / "engine").mkdir()
        (tmp_path / side / "workloads" / "w.py").write_text("N = 3\n")
        (tmp_path / side / "engine" / "helper.py").write_text("def helper():\n    return 1\n")
    trees = [tmp_path / "base", tmp_path / "head"]
    assert gate_probe.same_files(trees, "workloads")
    (tmp_path / "head" / "workloads" / "w.py").write_text("N = 4\n")
    assert not gate_probe.same_files(trees, "workloads")
    (tmp_path / "head" / "workloads" / "w.py").write_text("N = 3\n")
    (tmp_path / "head" / "workloads" / "extra.py").write_text("")
    assert not gate_probe.same_files(trees, "workloads")

    namespace: dict = {}
    exec(compile((tmp_path / "base" / "engine" / "helper.py").read_text(),
                 str(tmp_path / "base" / "engine" / "helper.py"), "exec"), namespace)
    assert gate_probe.files_run(lambda: namespace["helper"](), tmp_path / "base") == {"engine/helper.py"}
    assert gate_probe.files_run(lambda: sum(range(3)), tmp_path / "base") == set()
    assert sys.getprofile() is None


def test_the_registrys_references_are_shared_unless_the_engine_code_they_run_differs(tmp_path):
    # torch.func's calls run the active engine's wrapper of Tensor.requires_grad_ (engine/_guards.py,
    # a process-wide patch): shared while that file is the same on every side, timed on every side
    # once it differs. The loop runs no engine code: shared either way.
    from vmapbench import gate_probe

    trees = {side: gate.extract(ROOT, "HEAD", tmp_path / side) for side in ("base", "head")}
    guards = trees["head"] / "engine" / "_guards.py"
    for changed in (False, True):
        if changed:
            guards.write_text(guards.read_text() + "\n# a change\n")
        sides = gate_probe.Sides(trees)
        try:
            calls = {}
            for side in sides:
                sides.activate(side)
                _, calls[side] = gate_probe.prepared("mlp_hvp", gate_probe.GATE_METHODS, {})
            sides.activate("base")
            assert "engine/_guards.py" in gate_probe.files_run(calls["base"]["torch_func"], trees["base"])
            assert not any(f.startswith("engine/") for f in gate_probe.files_run(calls["base"]["loop"], trees["base"]))
            assert gate_probe.shared_references(sides, calls, True) == (("loop",) if changed else ("torch_func", "loop"))
            assert gate_probe.shared_references(sides, calls, False) == ()
        finally:
            sides.close()


def test_a_rewarmed_method_gets_its_untimed_calls_after_every_switch_before_its_batch():
    # Automatic tracing rebuilds two native checks after another side's modules were in place (the
    # guard's, then the argument memo's): both must fall in untimed calls, not in the timed batch.
    from vmapbench import gate_probe

    import gc

    log: list[tuple[str, str, str]] = []

    def call(side: str, name: str):  # a timed batch runs with the collector off (paired_samples' batch)
        return lambda: log.append((side, name, "untimed" if gc.isenabled() else "timed"))

    ticks = iter(range(10**7))
    clock = lambda: next(ticks) * 1e-3  # noqa: E731
    sides = {side: {"engine": call(side, "engine"), "torch_func": call(side, "torch_func")} for side in ("base", "head")}
    switches: list[str] = []
    gate_probe.paired_samples(sides, "torch_func", budget_s=1e9, clock=clock, activate=switches.append,
                              rewarm=("engine",), min_rounds=2, max_rounds=2)
    # Each batch of engine is preceded, since the last switch, by REWARM_CALLS untimed engine calls.
    for i, entry in enumerate(log):
        if entry[1] == "engine" and entry[2] == "timed" and (i == 0 or log[i - 1][2] == "untimed"):
            before = log[max(0, i - gate_probe.REWARM_CALLS):i]
            assert before == [(entry[0], "engine", "untimed")] * gate_probe.REWARM_CALLS, log[max(0, i - 4):i + 1]
    assert gate_probe.REWARM_CALLS >= 2


def test_continuous_exit_codes_and_result_placement(tmp_path, monkeypatch):
    """make continuous's module, with the measuring processes replaced by synthetic outputs."""
    plans = {"ok": (1.0, None), "slow": (1.3, None), "broken": (1.0, {"mlp_hvp hidden=128,k=8 engine": "boom"})}

    def fake_measure(trees, workdir, log=print, counting=None):
        factor, errors = plans[os.environ["PLAN"]]
        assert set(trees) == set(gate.SIDES) and all((t / "engine").is_dir() for t in trees.values())
        return sides(0, engine_factor=factor, errors=errors)

    monkeypatch.setattr(gate, "measure", fake_measure)
    monkeypatch.chdir(ROOT)
    for plan, code in (("ok", 0), ("slow", 1), ("broken", 2)):
        monkeypatch.setenv("PLAN", plan)
        out, md = tmp_path / f"{plan}.json", tmp_path / f"{plan}.md"
        assert continuous.main(["HEAD", "HEAD", "--machine", "m", "--json", str(out), "--summary-md", str(md)]) == code
        assert json.loads(out.read_text())["exit_code"] == code and md.read_text().startswith("### ")
    default = gate.default_json(ROOT, "m", "a" * 40, "b" * 40)
    assert default.is_relative_to(ROOT / ".asv") and not default.is_relative_to(ROOT / "results")
    with pytest.raises(SystemExit, match="not a commit"):
        continuous.main(["no-such-rev", "HEAD", "--machine", "m"])


def test_too_noisy_to_decide_has_its_own_exit_code(tmp_path):
    """A run whose head and twin differ by more than its floors could judge answers 3 with its
    noise, not "slower" and not "no regression"; a count beyond its floor still says 1, and the
    same run at ordinary noise decides as before."""
    limit = gate.decidable_noise()
    assert 0.05 < limit < 0.1  # a floor of EVIDENCE_MARGIN x it reaches the smallest plant, 1.1x
    quiet = outcome_of(sides(0), tmp_path)
    assert quiet.twin_noise < limit and quiet.exit_code == 0 and not quiet.too_noisy
    noisy = gate.Outcome(quiet.rows, {}, [], limit * 1.5)
    assert noisy.too_noisy and noisy.exit_code == gate.TOO_NOISY_EXIT == 3
    slowed = outcome_of(sides(0, engine_factor=1.0, counts_factor=1.05), tmp_path)
    assert slowed.exit_code == 1
    assert gate.Outcome(slowed.rows, {}, [], limit * 1.5).exit_code == 1  # an exact signal decides
    timed = outcome_of(sides(0, engine_factor=1.3, counts_factor=1.0), tmp_path)
    assert timed.exit_code == 1 and not any(stats.is_exact(r.name) for r in gate.regressions(timed.rows))
    assert gate.Outcome(timed.rows, {}, [], limit * 1.5).exit_code == 3
    assert gate.Outcome(timed.rows, {"x": "boom"}, [], limit * 1.5).exit_code == 2
    md = gate.markdown(noisy.rows, {}, "t", too_noisy=noisy.twin_noise)
    assert "**too noisy to decide**" in md and f"{noisy.twin_noise:.1%}" in md


@pytest.mark.parametrize("code", [0, 1, 2, 3])
def test_make_continuous_keeps_the_gate_exit_code(tmp_path, code):
    stub = tmp_path / "python"
    stub.write_text(f"#!/bin/sh\necho \"stub gate $*\"\nexit {code}\n")
    stub.chmod(0o755)
    proc = subprocess.run(["make", "-s", "continuous", f"PY={stub}", "BASE=HEAD", "HEAD=HEAD"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == min(code, 2), proc.stderr  # make's own failure is 2
    assert "stub gate -m vmapbench.continuous HEAD HEAD" in proc.stderr
    assert ("too noisy to decide" in proc.stderr) == (code == 3)


@pytest.mark.parametrize("target", ["engine", "transform:hessian", "workloads:nn_*,bayes_*"])
def test_every_plant_target_writes_valid_python(tmp_path, target):
    tree = gate.extract(ROOT, gate.resolve(ROOT, "HEAD"), tmp_path / "tree")
    gate.plant_slowdown(tree, 1.2, target)
    planted = [p for p in tree.rglob("*.py") if gate.PLANT_MARK in p.read_text()]
    assert planted
    for path in planted:
        compile(path.read_text(), str(path), "exec")
    with pytest.raises(SystemExit, match="plant-at"):
        gate.plant_slowdown(tree, 1.2, "nowhere")


@pytest.mark.slow  # a fresh interpreter importing torch and the engine
def test_planted_slowdowns_keep_the_engine_exact(tmp_path, run_in_tree):
    """The planted copies still compute what torch.func does (they only burn time), and each plant
    is where it says: every engine call, engine.hessian's functions, one family's engine calls."""
    tree = gate.extract(ROOT, gate.resolve(ROOT, "HEAD"), tmp_path / "tree")
    for target in ("engine", "transform:hessian", "workloads:nn_*"):
        gate.plant_slowdown(tree, 1.3, target)
    assert gate.PLANT_MARK in (tree / "engine" / "_dispatch.py").read_text()
    assert gate.PLANT_MARK in (tree / "engine" / "trace.py").read_text()
    assert gate.PLANT_MARK in (tree / "engine" / "autotrace.py").read_text()
    code = ("import torch, engine, engine._dispatch as d; from engine.trace import TracedFunction;"
            "from engine.autotrace import AutoTraced;"
            "assert d.VmapMode.__torch_dispatch__.__name__ == '_plant_slow' == TracedFunction._replay.__name__;"
            "assert AutoTraced._call.__name__ == '_plant_slow';"
            "x = torch.randn(4, 3); f = lambda v: (v.sin() * v).sum(); g = engine.vmap(engine.grad(f));"
            "want = torch.func.vmap(torch.func.grad(f))(x);"
            "[torch.testing.assert_close(g(x), want) for _ in range(5)];"  # eager, watched, recorded, replays
            "torch.testing.assert_close(engine.trace(g)(x), want);"
            "h = engine.hessian(f); assert h.__name__ == '_plant_slow';"
            "torch.testing.assert_close(h(x[0]), torch.func.hessian(f)(x[0]));"
            "from workloads.base import get; w = get('nn_ffnn'); s = w.setup(w.params(w.quick[0] if w.quick else w.sizes[0]), 'cpu');"
            "w.check(s, ['engine']); assert get('mlp_hvp').run.__name__ == 'run'; print('ok')")
    proc = run_in_tree(tree, code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    (tree / "engine" / "_dispatch.py").write_text("x = 1\n")
    with pytest.raises(SystemExit, match="VmapMode"):
        gate.plant_slowdown(tree, 1.3)


@pytest.mark.skipif(counts.available() is not None, reason=str(counts.available()))
def test_callgrind_counts_a_region_exactly(tmp_path):
    """A real count under valgrind (plain Python, no torch: a few seconds): twice the work is twice
    the instructions, and one region counted twice agrees within a fraction of a percent."""
    lib = counts.build_requests(tmp_path / "lib")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from measuring.counts import Requests; r = Requests(sys.argv[2]);"
            "assert r.on_valgrind\n"
            "def work(n):\n    return sum(i * i for i in range(n))\n"
            "work(10); work(20000)\n"
            "for label, n in (('one|0', 20000), ('one|1', 20000), ('two|0', 40000)):\n"
            "    with r.region(label): work(n)\n")
    proc = subprocess.run([*counts.command(tmp_path), sys.executable, "-c", code, str(ROOT), str(lib)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = counts.read_dumps(tmp_path)
    assert set(got) == {"one|0", "one|1", "two|0"}
    assert abs(got["one|1"] / got["one|0"] - 1) < 0.005
    assert 1.9 < got["two|0"] / got["one|0"] < 2.1


def test_the_count_process_counts_steady_calls_after_a_switch_of_side(tmp_path, monkeypatch):
    """Each counted repeat is a steady call: after a switch of side, automatic tracing's first
    calls rebuild the guard's and the arguments' checks, and a repeat that counted one read up to
    24x the other (every engine signal inconclusive). Python calls made inside each region stand
    in for its instructions here (deterministic, no valgrind): the repeats make the same calls."""
    import contextlib

    from vmapbench import gate_probe

    made: dict[str, int] = {}

    class Requests:
        on_valgrind = True

        def __init__(self, library):
            pass

        def instrument(self, on):
            pass

        @contextlib.contextmanager
        def region(self, label):
            calls = [0]

            def profile(frame, event, arg):
                if event == "call":
                    calls[0] += 1

            sys.setprofile(profile)
            try:
                yield
            finally:
                sys.setprofile(None)
                made[label] = calls[0]

    import gc

    monkeypatch.setattr(counts, "Requests", Requests)
    monkeypatch.setenv("VMAPBENCH_NATIVE_GUARDS", "now")  # as in the gate's processes (gate.probe_env)
    commit = gate.resolve(ROOT, "HEAD")
    sides = gate_probe.Sides({side: gate.extract(ROOT, commit, tmp_path / side) for side in ("base", "head")})
    try:
        got = gate_probe.count_regions("lib", ["quadratic_hessian"], sides)
    finally:
        sides.close()
        gc.unfreeze()  # count_regions freezes its process's heap for good: this one's goes back
    assert all(not errors for _, errors in got.values()), got
    cases = {label.rsplit("|", 1)[0] for label in made}
    assert {"base|wl|quadratic_hessian|d=8|engine", "base|chain|engine_auto"} <= cases, cases
    for case in cases:  # a rebuild counted made several times the calls; steady repeats agree
        first, second = made[f"{case}|0"], made[f"{case}|1"]
        assert abs(first / second - 1) < 0.02, (case, first, second)


@pytest.mark.parametrize("argv", [["HEAD", "HEAD", "--plant", "0.9"], ["no-such-revision", "HEAD"]])
def test_a_gate_that_cannot_compare_exits_2_not_1(argv):
    """1 means "a regression" to make continuous and CI; a bad argument or revision is a failure (2)."""
    from vmapbench import continuous

    with pytest.raises(SystemExit) as exc:
        continuous.main(argv)
    assert exc.value.code == 2


def test_the_probe_measures_the_suites_overhead_chain():
    """The gate's measuring process times the per-op chain of the current suite/bench_overhead.py
    (its API moved once and every comparison then exited 2)."""
    from vmapbench import gate_probe

    (times, errors), = gate_probe.measure_overhead(budget_s=0.05, clock=gate_probe.CLOCKS["cpu"]).values()
    assert not errors, errors
    assert {"native", "engine"} <= set(times) and all(t > 0 for v in times.values() for t in v)


def test_probes_measure_one_tier(tmp_path, monkeypatch):
    """The gate's measuring processes keep the fused tier off whatever the caller's environment
    says: a program loaded from an earlier run's disk index mid-timing would switch tiers."""
    monkeypatch.setenv("VMAPBENCH_FUSED", "1")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    env = gate.probe_env()
    assert env["VMAPBENCH_FUSED"] == "0" and "PYTHONPATH" not in env  # the probe puts each side's tree first


def test_sides_keep_each_commits_modules_and_torch_patches_apart(tmp_path):
    """Two commits in one measuring process: each side imports its own files (lazy imports too) and
    sees only its own replacement of a torch attribute (an engine wraps Tensor.requires_grad_ for
    good; another side's wrapper would be foreign code to its automatic tracing)."""
    import torch

    from vmapbench import gate_probe

    original = torch.Tensor.requires_grad_
    for side in ("a", "b"):
        pkg = tmp_path / side / "engine"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(
            f"import torch\nSIDE = {side!r}\n"
            "def install():\n"
            "    def patched(self, flag=True):\n        return SIDE\n"
            "    torch.Tensor.requires_grad_ = patched\n"
            "def lazy():\n    from engine.sub import WHO\n    return WHO\n")
        (pkg / "sub.py").write_text(f"WHO = {side!r}\n")
    before = sys.modules.get("engine")  # this session's engine, if a test imported it: put back
    sides = gate_probe.Sides({"a": tmp_path / "a", "b": tmp_path / "b"})
    try:
        got = {}
        for side in ("a", "b"):
            sides.activate(side)
            import engine

            engine.install()
            got[side] = engine
        for side in ("b", "a", "b"):
            sides.activate(side)
            import engine

            assert engine is got[side] and engine.lazy() == side
            assert torch.zeros(1).requires_grad_() == side  # this side's patch only
    finally:
        sides.close()
    assert sys.modules.get("engine") is before and str(sides.trees["a"]) not in sys.path
    assert torch.Tensor.requires_grad_ is original  # whatever this session had installed, back


def test_every_side_takes_the_timed_choices_the_first_one_took(tmp_path):
    """Two copies of one engine in the measuring process share one table of choices made by
    timing (engine.timed_choices): a choice near its threshold cannot send an A/A's sides down
    different paths (one graph scripted, its copy on the forward)."""
    import shutil

    from vmapbench import gate_probe

    for side in ("a", "b"):
        shutil.copytree(ROOT / "engine", tmp_path / side / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    before = sys.modules.get("engine")
    sides = gate_probe.Sides({"a": tmp_path / "a", "b": tmp_path / "b"})
    try:
        got = {}
        for side in ("a", "b"):
            sides.activate(side)
            assert sys.modules["engine.timed_choices"].TABLE is sides.choices  # before any call decides
            from engine import script_replay, timed_choices

            got[side] = timed_choices
            assert timed_choices.__file__.startswith(str(tmp_path / side))
            key = ("replay-heavy", script_replay._HEAVY_RULE, "graph")
            assert timed_choices.decided(key, lambda side=side: side) == "a"  # side b's own timing is not asked
        assert got["a"] is not got["b"] and got["a"].TABLE is got["b"].TABLE is sides.choices
    finally:
        sides.close()
    assert sys.modules.get("engine") is before


def test_a_side_whose_registry_does_not_import_fails_alone(tmp_path):
    """A base commit that cannot be measured is reported as that side's failure; the other sides of
    the same process are still measured (before, each side had a process of its own)."""
    from vmapbench import gate_probe

    broken = tmp_path / "broken" / "workloads"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this commit has no registry')\n")
    good = gate.extract(ROOT, gate.resolve(ROOT, "HEAD"), tmp_path / "good")
    sides = gate_probe.Sides({"base": tmp_path / "broken", "head": good})
    try:
        out = gate_probe.measure_workloads(sides, budget_s=0.01, clock=gate_probe.CLOCKS["cpu"],
                                           only=["quadratic_hessian"])
    finally:
        sides.close()
    assert "this commit has no registry" in out["base"]["fatal"]
    assert "fatal" not in out["head"] and not out["head"]["errors"]
    assert set(out["head"]["times"]["quadratic_hessian"].popitem()[1]) >= {"engine", "torch_func"}
    failed = gate.failures([{**out["base"], "process": "time-0"}])
    assert "this commit has no registry" in failed["measuring process"] or "ImportError" in failed["measuring process"]


def test_memory_is_taken_on_the_sides_asked_and_never_of_a_shared_reference(tmp_path):
    """Allocator peaks are exact: the twin (a copy of head) is not measured again, and a reference
    that runs the same files on every side (`shared_references`) not at all (its peaks could not
    differ between sides); the engine's methods on every side asked, with the same bytes on
    copies of one commit."""
    from vmapbench import gate_probe

    commit = gate.resolve(ROOT, "HEAD")
    sides = gate_probe.Sides({side: gate.extract(ROOT, commit, tmp_path / side) for side in ("base", "head", "twin")})
    try:
        out = gate_probe.measure_workloads(sides, budget_s=0.01, clock=gate_probe.CLOCKS["cpu"],
                                           only=["quadratic_hessian"], memory=["base", "head"])
    finally:
        sides.close()
    (base,) = out["base"]["memory"]["quadratic_hessian"].values()
    (head,) = out["head"]["memory"]["quadratic_hessian"].values()
    assert out["head"]["shared"]["quadratic_hessian"] == ["torch_func", "loop"]
    assert set(base) == set(head) == set(gate_probe.GATE_METHODS) - {"torch_func", "loop"}
    assert not out["twin"]["memory"]
    assert all(head[m] == base[m] and len(set(base[m])) == 1 for m in head), (base, head)
    rows = gate.compare(gate._runs([{**out["base"], "process": "time-0"}]),
                        gate._runs([{**out["head"], "process": "time-0"}]), "never-calibrated")
    memory = [r for r in rows if stats.is_memory(r.name)]
    assert len(memory) == len(head) and all(r.verdict == "unchanged" for r in memory)


def _aa_probe_departures(tmp_path: Path, run: int) -> tuple[dict[tuple[str, str], Any], int]:
    """One real probe process over three copies of HEAD: {(copy, signal): its estimate over base}
    for the engine signals neither within their noise (interval containing 1) nor within 3% of 1,
    and how many signals were checked."""
    from measuring import stats

    commit = gate.resolve(ROOT, "HEAD")
    trees = {side: gate.extract(ROOT, commit, tmp_path / f"{side}{run}") for side in ("base", "head", "twin")}
    out = tmp_path / f"probe{run}.json"
    cmd = [sys.executable, str(ROOT / "vmapbench" / "gate_probe.py"), "--workloads", "quadratic_hessian,nn_ffnn",
           "--budget", "0.5", "--out", str(out)]
    for side, tree in trees.items():
        cmd += ["--tree", f"{side}={tree}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=600)
    probe = json.loads(out.read_text())["sides"]
    got = {side: gate.signals(probe[side]) for side in trees}
    departures, checked = {}, 0
    for name, base in got["base"].items():
        if "track_ratio_vs_torch_func" not in name or "'loop'" in name:
            continue
        for side in ("head", "twin"):
            change = stats.paired_ratio([h / b for h, b in zip(got[side][name], base)])
            if not (change.lo <= 1 <= change.hi or abs(change.value - 1) < 0.03):
                departures[(side, name)] = change
            checked += 1
    return departures, checked


@pytest.mark.slow
def test_an_aa_probe_reads_every_copy_alike(tmp_path):
    """Three copies of one commit, measured by a real probe process: every engine signal of each
    copy over base sits within its noise (its interval contains 1) or within 3% of 1. A bias of the
    measuring order or of the batches (a copy 5-7% apart with a tight interval) fails it. A signal
    that departs is measured again in a second process: a bias departs again, while a departure
    the other test worker's load made (a few percent, an interval just short of 1) does not."""
    departures, checked = _aa_probe_departures(tmp_path, 0)
    assert checked >= 2 * 2 * 3  # two workloads, two copies, engine / eager / traced
    if departures:
        again, _ = _aa_probe_departures(tmp_path, 1)
        both = {key: (departures[key], again[key]) for key in departures.keys() & again.keys()}
        assert not both, both


def test_every_probe_of_a_run_loads_one_snapshot_of_the_gate_measuring_code(tmp_path):
    # An edit of the checkout during a run (a branch switched) must not reach its later processes.
    probe = gate.snapshot_measuring(tmp_path / "gate-code")
    assert probe == tmp_path / "gate-code" / "vmapbench" / "gate_probe.py" and probe.read_bytes() == gate.PROBE.read_bytes()
    for rel in ("suite/__init__.py", "measuring/__init__.py", "measuring/stats.py"):
        assert (tmp_path / "gate-code" / rel).read_bytes() == (ROOT / rel).read_bytes()
    assert list((tmp_path / "gate-code" / "measuring" / "__pycache__").glob("stats.*.pyc"))  # compiled once
    cmd = gate.probe_command(tmp_path / "time-0.json", gate.Job("time"), {s: tmp_path / s for s in gate.SIDES},
                             probe=probe)
    assert repr(str(probe)) in cmd[2]
    # The copy's probe finds its suite and measuring/ beside itself, not the checkout's.
    where = subprocess.run(
        [sys.executable, "-c", "import runpy, sys; g = runpy.run_path(sys.argv[1]); g['gate_suite']('');"
         " print(g['GATE_ROOT']); print(sys.modules['measuring'].__file__)", str(probe)],
        capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert where == [str(tmp_path / "gate-code"), str(tmp_path / "gate-code" / "measuring" / "__init__.py")]
