"""vmapbench.asv_verdict, the asv plugin: asv's own comparison table on synthetic results, with and without it."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from vmapbench import asv_verdict
from measuring import stats

ROOT = Path(__file__).resolve().parents[1]
RATIO = "bench_workloads.rosenbrock_hessian.track_ratio_vs_torch_func"
SPEEDUP = "bench_workloads.rosenbrock_hessian.track_speedup_vs_loop"
TIME = "bench_workloads.rosenbrock_hessian.time_run"
PARAMS = [["'d=128'"], ["'engine'"], ["'cpu'"]]
MACHINE = "no-calibration-here"


def _resultset(values: dict[str, list[float]]) -> list[tuple]:
    """asv continuous's result tuples: (key, params, value, stats, samples, version, machine, env)."""
    out = []
    for key, samples in values.items():
        median = float(sorted(samples)[len(samples) // 2])
        entry = {"ci_99_a": min(samples), "ci_99_b": max(samples), "q_25": min(samples), "q_75": max(samples),
                 "repeat": len(samples), "number": 1}
        out.append((key, PARAMS, [median], [entry], [samples], "1", MACHINE, "virtualenv-py3.11"))
    return out


def _table(base: dict[str, list[float]], head: dict[str, list[float]], capsys: pytest.CaptureFixture[str],
           factor: float = 1.1) -> tuple[bool, bool, str]:
    from asv import config
    from asv.commands.compare import Compare

    conf = config.Config.load(str(ROOT / "asv.conf.json"))
    conf.results_dir = str(ROOT / "results")  # benchmarks.json: the units asv prints
    worse, better = Compare.print_table(conf, "a" * 40, "b" * 40, factor=factor, split=False,
                                        resultset_1=_resultset(base), resultset_2=_resultset(head),
                                        only_changed=True, sort="ratio")
    return worse, better, capsys.readouterr().out


def _spread(center: float, n: int = 7, width: float = 0.02) -> list[float]:
    return [center * (1 + width * (i - n // 2) / n) for i in range(n)]


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin loaded as asv loads it (its setup hook), undone after the test."""
    from asv.commands import compare

    monkeypatch.setattr(asv_verdict, "_ORIGINAL", {})
    monkeypatch.setattr(compare, "_is_result_better", compare._is_result_better)
    monkeypatch.setattr(compare, "unroll_result", compare.unroll_result)
    monkeypatch.setattr(compare.Compare, "print_table", compare.Compare.print_table)
    asv_verdict.setup()


BASE = {RATIO: _spread(1.5), SPEEDUP: _spread(4.0), TIME: _spread(1e-3)}


def test_without_the_plugin_asv_calls_raw_times_and_turns_a_speedup_around(capsys: pytest.CaptureFixture[str]) -> None:
    """What the plugin changes: asv alone fails a raw time that doubled between two processes, and
    calls a speed-up over the loop that fell by half an improvement."""
    worse, better, out = _table(BASE, {**BASE, TIME: _spread(2e-3)}, capsys)
    assert worse and "time_run" in out
    worse, better, out = _table(BASE, {**BASE, SPEEDUP: _spread(2.0)}, capsys)
    assert better and not worse


def test_raw_times_are_stored_not_called(plugin: None, capsys: pytest.CaptureFixture[str]) -> None:
    worse, better, out = _table(BASE, {**BASE, TIME: _spread(2e-3)}, capsys)
    assert not worse and not better, out
    assert "asv's verdict counts only the gated signals" in out and f"no calibration for machine {MACHINE!r}" in out


def test_a_time_ratio_is_called_only_beyond_the_unpaired_floor(plugin: None, capsys: pytest.CaptureFixture[str]) -> None:
    """asv's ratios come from separate processes: a 1.7x move of one with tight rounds is what two
    processes of one commit did; only a change beyond UNPAIRED_TIME_FLOOR (or --factor) is called."""
    assert asv_verdict.UNPAIRED_TIME_FLOOR > 0.7
    worse, better, out = _table(BASE, {**BASE, RATIO: _spread(1.5 * 1.7)}, capsys)
    assert not worse and not better, out
    worse, _, out = _table(BASE, {**BASE, RATIO: _spread(1.5 * 3.0)}, capsys)
    assert worse and "| +" in out and "track_ratio_vs_torch_func('d=128', 'engine', 'cpu')" in out, out
    worse, _, out = _table(BASE, {**BASE, RATIO: _spread(1.5 * 3.0)}, capsys, factor=4.0)
    assert not worse, out  # --factor 4 lifts every time floor to 300%


def test_an_instruction_count_is_called_beyond_three_percent(plugin: None, capsys: pytest.CaptureFixture[str]) -> None:
    counts = "bench_counts.Instructions.track_instructions"
    base = {counts: [1_000_000.0, 1_000_400.0]}
    worse, _, out = _table(base, {counts: [1_050_000.0, 1_050_300.0]}, capsys, factor=1.5)
    assert worse and "track_instructions" in out, out  # 5% > COUNT_FLOOR, whatever --factor says
    worse, better, out = _table(base, {counts: [1_010_000.0, 1_010_500.0]}, capsys)
    assert not worse and not better, out


def test_a_speedup_that_drops_is_worse(plugin: None, capsys: pytest.CaptureFixture[str]) -> None:
    worse, better, out = _table(BASE, {**BASE, SPEEDUP: _spread(4.0 / 3.0)}, capsys)
    assert worse and not better and "track_speedup_vs_loop" in out, out


def test_a_wide_interval_reaching_across_the_floor_is_not_called(plugin: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Head 3x in the median, but its rounds spread from 1.7x to 4.3x: inconclusive, as in the gate."""
    worse, _, out = _table(BASE, {**BASE, RATIO: _spread(1.5 * 3.0, width=1.0)}, capsys)
    assert not worse, out


def test_change_follows_the_gate_policy() -> None:
    assert asv_verdict.change(TIME + "('d=128', 'engine', 'cpu')", [1.0] * 5, [3.0] * 5, 0.1) == "not gated"
    point = RATIO + "('d=128', 'engine', 'cpu')"
    assert asv_verdict.change(point, _spread(1.0), _spread(1.3), 0.1) == "slower"
    assert asv_verdict.change(point, _spread(1.0), _spread(1.0), 0.1) == "unchanged"
    assert asv_verdict.floor_of(point, MACHINE, 1.1) == asv_verdict.UNPAIRED_TIME_FLOOR
    assert math.isclose(asv_verdict.floor_of(point, MACHINE, 4.0), 3.0)
    assert asv_verdict.floor_of("bench_counts.Instructions.track_instructions('w', 'engine')", MACHINE, 4.0) \
        == stats.COUNT_FLOOR
    # an allocator peak is exact too: its own floor, not the unpaired time ratios' 122%
    peak = "bench_workloads.w.track_alloc_peak_bytes('d=128', 'engine', 'cpu')"
    assert asv_verdict.floor_of(peak, MACHINE, 1.1) == stats.MEMORY_FLOOR
    assert asv_verdict.change(peak, [1000.0] * 3, [1100.0] * 3, asv_verdict.floor_of(peak, MACHINE, 1.1)) == "slower"
