"""The regression gate on synthetic measurements: signals, verdicts, exit codes, placement, calibration."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vmapbench import continuous, gate, stats

ROOT = Path(__file__).resolve().parents[1]
METHODS = {"loop": 4e-3, "engine": 5e-3, "engine_traced": 1.5e-3, "torch_func": 3e-3}
CHAIN = {"native": 6e-4, "torch_func": 8e-4, "engine": 2.4e-3, "engine_traced": 7e-4}


def probe(seed: int, engine_factor: float = 1.0, errors: dict | None = None) -> dict:
    """One measuring process's output: every method's time jittered by a shared load factor
    (what in-process ratios cancel) and its own small noise; engine methods scaled by engine_factor."""
    rng = np.random.default_rng(seed)
    load = float(np.exp(rng.normal(0, 0.3)))

    def jitter(t: float, engine: bool) -> float:
        return t * load * float(np.exp(rng.normal(0, 0.02))) * (engine_factor if engine else 1.0)

    times = {m: jitter(t, m == "engine") for m, t in METHODS.items()}
    chain = {m: jitter(t, m == "engine") for m, t in CHAIN.items()}
    return {"times": {"mlp_hvp": {"hidden=128,k=8": times}}, "overhead": chain, "errors": errors or {}}


def test_signals_are_named_like_the_suite_points():
    got = gate.signals(probe(0))
    p = "'hidden=128,k=8', '{}', 'cpu'"
    assert got[f"bench_workloads.mlp_hvp.track_ratio_vs_torch_func({p.format('engine')})"] == pytest.approx(
        got[f"bench_workloads.mlp_hvp.time_run({p.format('engine')})"]
        / got[f"bench_workloads.mlp_hvp.time_run({p.format('torch_func')})"])
    assert f"bench_workloads.mlp_hvp.track_ratio_vs_torch_func({p.format('torch_func')})" not in got
    assert f"bench_workloads.mlp_hvp.track_speedup_vs_loop({p.format('loop')})" not in got
    assert "bench_overhead.PerOpOverhead.track_overhead_us_per_op('engine', 'cpu')" in got
    assert "bench_overhead.PerOpOverhead.track_overhead_us_per_op('native', 'cpu')" not in got


def test_a_over_a_under_load_passes(tmp_path):
    result = gate.outcome([probe(s) for s in range(3)], [probe(s) for s in range(10, 13)], "m", tmp_path)
    assert result.exit_code == 0
    assert not gate.regressions(result.rows)
    raw = [r for r in result.rows if not r.gated]
    assert raw and all("time_run" in r.name or "time_chain" in r.name for r in raw)


def test_planted_engine_slowdown_fails_naming_only_engine_signals(tmp_path):
    result = gate.outcome([probe(s) for s in range(3)], [probe(s, engine_factor=1.3) for s in range(10, 13)],
                          "m", tmp_path)
    assert result.exit_code == 1
    named = [r.name for r in gate.regressions(result.rows)]
    assert named and all(gate.is_engine_signal(n) for n in named)
    assert any("track_ratio_vs_torch_func" in n for n in named)


def test_a_case_failing_at_head_exits_2_and_a_dead_process_too(tmp_path):
    broken = [probe(s, errors={"mlp_hvp hidden=128,k=8 engine": "RuntimeError: boom"}) for s in range(3)]
    assert gate.outcome([probe(s) for s in range(3)], broken, "m", tmp_path).exit_code == 2
    dead = [probe(1), {"fatal": "Traceback ...\nImportError: no engine"}, probe(2)]
    result = gate.outcome([probe(s) for s in range(3)], dead, "m", tmp_path)
    assert result.exit_code == 2 and "ImportError" in result.failed["measuring process"]


def test_noise_floor_file_silences_a_noisy_signal(tmp_path):
    base, head = [probe(s) for s in range(3)], [probe(s, engine_factor=1.3) for s in range(10, 13)]
    floors = {n: 1.0 for n in gate.signals(base[0]) if stats.is_gated(n)}
    path = stats.noise_file("m", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"floors": floors}))
    assert gate.outcome(base, head, "m", tmp_path).exit_code == 0


def test_markdown_summary_lists_called_changes_with_intervals(tmp_path):
    result = gate.outcome([probe(s) for s in range(3)], [probe(s, engine_factor=1.3) for s in range(10, 13)],
                          "m", tmp_path)
    text = gate.markdown(result.rows, result.failed, "Benchmarks gate: a -> b")
    assert text.startswith("### Benchmarks gate: a -> b")
    assert "**regression**" in text and "| signal | verdict | head/base [99% interval] |" in text
    slower = gate.regressions(result.rows)[0]
    assert stats.relative_change(slower.change) in text
    failed = gate.markdown([], {"x engine": "RuntimeError: a|b"}, "t")
    assert "**failed**" in failed and "RuntimeError: a/b" in failed


def test_calibrated_floors_cover_the_worst_a_over_a_deviation():
    rows = gate.outcome([probe(s) for s in range(3)], [probe(s) for s in range(10, 13)], "m", Path("/nonexistent"))
    noisy = [gate.Row(r.name, r.gated, r.verdict, r.floor, stats.Estimate(1.4, 1.2, 1.6, 3), r.base, r.head)
             if "engine_traced" in r.name else r for r in rows.rows]
    floors = gate.calibrated_floors([rows.rows, noisy])
    assert all(f >= stats.DEFAULT_NOISE_FLOOR for f in floors.values())
    traced = [f for n, f in floors.items() if "engine_traced" in n and "ratio_vs" in n]
    assert traced and all(f > 0.6 for f in traced)  # 1.5 x log(1.4), back to a fraction
    assert all(stats.is_gated(n) for n in floors)


def test_calibration_summary_counts_runs_and_engine_names():
    runs = [gate.CalibrationRun("aa", [], 0, 1.0), gate.CalibrationRun("aa", [], 0, 1.0),
            gate.CalibrationRun("planted", ["bench_overhead.PerOpOverhead.track_overhead_us_per_op('engine', 'cpu')"], 1, 1.0),
            gate.CalibrationRun("planted", ["bench_workloads.w.time_run('s', 'loop', 'cpu')"], 1, 1.0)]
    summary = gate.summarize_calibration(runs)
    assert summary["aa"] == {"runs": 2, "flagged_runs": 0, "rate": 0.0, "named": [], "only_engine_named": True,
                             "failed_runs": 0}
    assert summary["planted"]["flagged_runs"] == 2 and summary["planted"]["only_engine_named"] is False


def test_continuous_exit_codes_and_result_placement(tmp_path, monkeypatch):
    """make continuous's module, with the measuring processes replaced by synthetic outputs."""
    plans = {"ok": (1.0, None), "slow": (1.3, None), "broken": (1.0, {"mlp_hvp hidden=128,k=8 engine": "boom"})}

    def fake_measure(trees, rounds, workdir, log=print):
        factor, errors = plans[os.environ["PLAN"]]
        assert set(trees) == {"base", "head"} and all((t / "engine").is_dir() for t in trees.values())
        return {"base": [probe(s) for s in range(rounds)],
                "head": [probe(100 + s, engine_factor=factor, errors=errors) for s in range(rounds)]}

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


@pytest.mark.parametrize("code", [0, 1, 2])
def test_make_continuous_keeps_the_gate_exit_code(tmp_path, code):
    stub = tmp_path / "python"
    stub.write_text(f"#!/bin/sh\necho \"stub gate $*\"\nexit {code}\n")
    stub.chmod(0o755)
    proc = subprocess.run(["make", "-s", "continuous", f"PY={stub}", "BASE=HEAD", "HEAD=HEAD"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == code, proc.stderr
    assert "stub gate -m vmapbench.continuous HEAD HEAD --rounds 3" in proc.stderr


@pytest.mark.slow  # a fresh interpreter importing torch and the engine
def test_planted_slowdown_keeps_the_engine_exact(tmp_path):
    """The planted copy of the engine still computes what torch.func does (it only burns time)."""
    tree = gate.extract(ROOT, gate.resolve(ROOT, "HEAD"), tmp_path / "tree")
    gate.plant_slowdown(tree, 1.3)
    assert gate.PLANT_MARK in (tree / "engine" / "_dispatch.py").read_text()
    assert gate.PLANT_MARK in (tree / "engine" / "trace.py").read_text()
    code = ("import torch, engine, engine._dispatch as d; from engine.trace import TracedFunction;"
            "assert d.VmapMode.__torch_dispatch__.__name__ == '_plant_slow' == TracedFunction._replay.__name__;"
            "x = torch.randn(4, 3); f = lambda v: (v.sin() * v).sum(); g = engine.vmap(engine.grad(f));"
            "want = torch.func.vmap(torch.func.grad(f))(x);"
            "[torch.testing.assert_close(g(x), want) for _ in range(5)];"  # eager, watched, recorded, replays
            "torch.testing.assert_close(engine.trace(g)(x), want); print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    (tree / "engine" / "_dispatch.py").write_text("x = 1\n")
    with pytest.raises(SystemExit, match="VmapMode"):
        gate.plant_slowdown(tree, 1.3)


@pytest.mark.parametrize("argv", [["HEAD", "HEAD", "--rounds", "1"], ["no-such-revision", "HEAD"]])
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

    times, errors = gate_probe.measure_overhead(budget_s=0.05, rounds=1, clock=gate_probe.CLOCKS["cpu"])
    assert not errors, errors
    assert {"native", "engine"} <= set(times) and all(t > 0 for t in times.values())
