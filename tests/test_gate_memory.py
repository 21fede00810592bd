"""Memory in the regression gate: every workload's allocator peak per method, judged exactly."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vmapbench import gate
from measuring import stats

ROOT = Path(__file__).resolve().parents[1]
METHODS = {"loop": 4e-3, "engine": 5e-3, "engine_eager": 9e-3, "engine_traced": 1.5e-3, "torch_func": 3e-3}
# workload -> (size, method -> allocator peak in bytes)
PEAKS = {
    "psg_mlp": ("batch=64", {"loop": 52106240, "engine": 26053120, "engine_eager": 26053632,
                             "engine_traced": 26053120, "torch_func": 26091520}),
    "mlp_hvp": ("hidden=128,k=8", {"loop": 271136, "engine": 857604, "engine_eager": 923396,
                                   "engine_traced": 852480, "torch_func": 923396}),
}
ROUNDS = 8


def probe(seed: int, copy: int = 0, held: dict[str, float] | None = None) -> dict:
    """One side's output of the time process that measures memory: per-round times with a shared
    load (seed) and a copy's own small noise, and each method's allocator peak of two calls, the
    same bytes every time; `held` multiplies one workload's peaks (a planted memory regression)."""
    rng = np.random.default_rng(seed)
    rounds = np.exp(rng.normal(0, 0.2, ROUNDS))
    own = np.random.default_rng([seed, copy])
    times, memory = {}, {}
    for workload, (size, peaks) in PEAKS.items():
        times[workload] = {size: {m: [t * float(r) * float(np.exp(own.normal(0, 0.02))) for r in rounds]
                                  for m, t in METHODS.items()}}
        factor = (held or {}).get(workload, 1.0)
        memory[workload] = {size: {m: [int(b * factor)] * 2 for m, b in peaks.items()}}
    return {"times": times, "memory": memory, "overhead": {}, "errors": {}, "process": "time-0"}


def outcome(held: dict[str, float] | None = None) -> gate.Outcome:
    return gate.outcome([probe(0)], [probe(0, 0, held)], "never-calibrated", ROOT / "no-such-root",
                        twin_probes=[probe(0, 1, held)])


def test_memory_signals_are_named_like_the_suite_points_and_gated_exactly():
    got = gate.signals(probe(0))
    name = "bench_workloads.psg_mlp.track_alloc_peak_bytes('batch=64', 'engine', 'cpu')"
    assert got[name] == [26053120.0, 26053120.0]
    assert stats.is_gated(name) and stats.is_memory(name) and stats.is_exact(name) and not stats.is_count(name)
    assert stats.noise_floor(name, "never-calibrated") == stats.MEMORY_FLOOR
    assert gate.signal_family(name) == "memory: allocator peak"


def test_a_over_a_keeps_every_memory_signal_unchanged_on_a_machine_never_calibrated():
    result = outcome()
    memory = [r for r in result.rows if stats.is_memory(r.name)]
    assert len(memory) == sum(len(peaks) for _, peaks in PEAKS.values())  # every workload x method
    assert all(r.gated and r.verdict == "unchanged" and r.change.value == 1.0 for r in memory)
    assert all(r.source == "memory" and r.floor == stats.MEMORY_FLOOR for r in memory)
    assert result.exit_code == 0


def test_a_planted_1_2x_memory_regression_in_one_workload_fails_naming_its_memory():
    result = outcome({"mlp_hvp": 1.2})
    assert result.exit_code == 1
    named = {r.name for r in gate.regressions(result.rows)}
    assert named == {f"bench_workloads.mlp_hvp.track_alloc_peak_bytes('hidden=128,k=8', '{m}', 'cpu')"
                     for m in PEAKS["mlp_hvp"][1]}
    assert "allocator peaks" in gate.markdown(result.rows, {}, "t")


def test_a_change_inside_the_tolerance_passes():
    assert outcome({"psg_mlp": 1.01}).exit_code == 0


def test_calibration_writes_no_floor_for_memory():
    rows = outcome().rows
    floors = gate.calibrated_floors([rows])
    assert floors and not any(stats.is_memory(n) for n in floors)


def test_the_first_time_process_measures_memory_the_others_do_not(tmp_path):
    trees = {side: tmp_path / side for side in gate.SIDES}
    first = gate.probe_command(tmp_path / "out.json", gate.Job("time", 0), trees)
    second = gate.probe_command(tmp_path / "out.json", gate.Job("time", 1), trees)
    assert "--memory" in first and "--memory" not in second
    assert first[first.index("--memory") + 1] == "base,head"  # exact: the twin would read head's bytes again


def test_the_memory_plant_writes_valid_python(tmp_path):
    tree = gate.extract(ROOT, gate.resolve(ROOT, "HEAD"), tmp_path / "tree")
    gate.plant_slowdown(tree, 1.2, "memory:psg_mlp")
    source = (tree / "workloads" / "__init__.py").read_text()
    assert gate.PLANT_MARK in source
    compile(source, "workloads/__init__.py", "exec")


@pytest.mark.slow  # a fresh interpreter importing torch, the engine and the registry
def test_the_memory_plant_holds_1_2x_the_calls_own_peak_and_keeps_results_exact(tmp_path, run_in_tree):
    tree = gate.extract(ROOT, gate.resolve(ROOT, "HEAD"), tmp_path / "tree")
    gate.plant_slowdown(tree, 1.2, "memory:mlp_hvp")
    code = ("import torch; torch.set_num_threads(1); from workloads.base import get; "
            "from measuring.memory import alloc_peak_bytes as peak; w = get('mlp_hvp'); "
            "s = w.setup(w.params(w.quick[0]), 'cpu'); w.prepare('torch_func', s); w.run('torch_func', s); "
            "own = peak(s.fn('torch_func')); held = peak(lambda: w.run('torch_func', s)); "
            "assert abs(held / own - 1.2) < 0.01, (own, held); w.check(s, ['torch_func']); "
            "o = get('psg_mlp'); assert o.run.__name__ == 'run', o.run.__name__; print('ok')")
    proc = run_in_tree(tree, code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
