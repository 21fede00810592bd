"""measuring.stats: intervals, ratios, verdicts, noise floors and asv entries, on synthetic samples."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from measuring import stats


def noisy(center: float, n: int, spread: float, seed: int) -> list[float]:
    """Samples like a loaded machine's: log-normal around `center` plus rare slow outliers."""
    rng = np.random.default_rng(seed)
    values = center * np.exp(rng.normal(0, spread, n))
    values[rng.random(n) < 0.1] *= 1.8
    return values.tolist()


def test_estimate_is_the_median_with_an_interval_around_it():
    samples = noisy(2.0, 15, 0.05, seed=1)
    est = stats.estimate(samples)
    assert est.value == pytest.approx(float(np.median(samples)))
    assert est.lo <= est.value <= est.hi
    assert est.lo < est.hi and est.n == 15
    assert min(samples) <= est.lo and est.hi <= max(samples)


def test_estimate_is_deterministic_and_narrows_with_more_samples():
    few, many = noisy(1.0, 6, 0.1, seed=2), noisy(1.0, 60, 0.1, seed=2)
    assert stats.estimate(few) == stats.estimate(few)
    assert stats.estimate(many).halfwidth < stats.estimate(few).halfwidth


def test_lower_confidence_gives_a_narrower_interval():
    samples = noisy(1.0, 20, 0.1, seed=3)
    wide, narrow = stats.estimate(samples, 0.99), stats.estimate(samples, 0.8)
    assert narrow.lo >= wide.lo and narrow.hi <= wide.hi
    assert (narrow.hi - narrow.lo) < (wide.hi - wide.lo)


def test_one_sample_gives_a_degenerate_interval_and_none_is_an_error():
    assert stats.estimate([3.0]) == stats.Estimate(3.0, 3.0, 3.0, 1)
    with pytest.raises(ValueError, match="no samples"):
        stats.estimate([float("nan"), None])
    with pytest.raises(ValueError, match="confidence"):
        stats.estimate([1.0, 2.0], confidence=1.5)


def test_ratio_of_a_planted_shift_is_detected_as_slower():
    base = noisy(1.0, 7, 0.04, seed=4)
    head = [x * 1.3 for x in noisy(1.0, 7, 0.04, seed=5)]
    change = stats.ratio(base, head)
    assert change.lo <= change.value <= change.hi
    assert 1.15 < change.value < 1.45
    assert stats.verdict(change) == "slower"
    assert stats.verdict(stats.ratio(head, base)) == "faster"


def test_a_over_a_is_not_flagged_across_many_seeds():
    """Same distribution on both sides, 200 synthetic A/A comparisons: none is called."""
    called = [stats.verdict(stats.ratio(noisy(1.0, 7, 0.05, seed=s), noisy(1.0, 7, 0.05, seed=1000 + s)))
              for s in range(200)]
    assert called.count("unchanged") == 200


def test_a_shift_inside_the_noise_floor_is_unchanged_even_when_significant():
    """A 5% shift with a tight interval is real but below the 10% floor: not called."""
    base = [1.0 + 0.001 * i for i in range(20)]
    head = [x * 1.05 for x in base]
    change = stats.ratio(base, head)
    assert change.lo > 1.0  # statistically different ...
    assert stats.verdict(change, noise_floor=0.10) == "unchanged"  # ... but within the floor
    assert stats.verdict(change, noise_floor=0.02) == "slower"


def test_verdict_turns_around_for_higher_is_better_metrics():
    up = stats.Estimate(1.5, 1.3, 1.7, 5)
    assert stats.verdict(up) == "slower"
    assert stats.verdict(up, higher_is_better=True) == "faster"
    assert stats.verdict(stats.Estimate(0.6, 0.5, 0.7, 5), higher_is_better=True) == "slower"
    assert stats.higher_is_better("bench_workloads.psg_mlp.track_speedup_vs_loop('batch=64', 'engine', 'cpu')")
    with pytest.raises(ValueError, match="noise_floor"):
        stats.verdict(up, noise_floor=-0.1)


def test_wide_interval_is_not_called_even_when_the_median_moved():
    assert stats.verdict(stats.Estimate(1.5, 0.9, 2.2, 3)) == "unchanged"


def test_one_sample_a_side_is_never_called():
    change = stats.ratio([1.0], [3.0])
    assert change == stats.Estimate(3.0, 3.0, 3.0, 1)
    assert stats.verdict(change) == "unchanged"


def test_ratio_refuses_non_positive_base():
    with pytest.raises(ValueError, match="positive"):
        stats.ratio([0.0, 0.0], [1.0, 1.0])


def test_policy_names_gated_and_never_called_metrics():
    point = "bench_workloads.mlp_hvp.track_ratio_vs_torch_func('hidden=128,k=8', 'engine', 'cpu')"
    assert stats.metric_of(point) == "track_ratio_vs_torch_func"
    assert stats.is_gated(point)
    assert not stats.is_gated("bench_workloads.mlp_hvp.time_run")
    bench, params = stats.split_point(point)
    assert stats.point_name(bench, params) == point
    assert params == ("'hidden=128,k=8'", "'engine'", "'cpu'")


def test_noise_floor_reads_the_calibration_file_then_falls_back(tmp_path):
    point = "bench_workloads.mlp_hvp.track_ratio_vs_torch_func('hidden=128,k=8', 'engine', 'cpu')"
    assert stats.noise_floor(point, "m1", root=tmp_path) == stats.DEFAULT_NOISE_FLOOR
    assert stats.noise_floor("bench_workloads.x.time_run('a')", "m1", root=tmp_path) == stats.UNGATED_FLOORS["time_run"]
    assert stats.noise_floor("bench_workloads.x.track_rss_delta_bytes('a')", "m1", root=tmp_path) == math.inf
    path = stats.noise_file("m1", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"default": 0.2, "floors": {
        point: 0.07, "bench_workloads.psg_mlp.track_ratio_vs_torch_func": 0.12, "track_overhead_us_per_op": 0.3}}))
    assert stats.noise_floor(point, "m1", root=tmp_path) == 0.07
    assert stats.noise_floor("bench_workloads.psg_mlp.track_ratio_vs_torch_func('batch=64', 'loop', 'cpu')",
                             "m1", root=tmp_path) == 0.12
    assert stats.noise_floor("bench_overhead.PerOpOverhead.track_overhead_us_per_op('engine', 'cpu')",
                             "m1", root=tmp_path) == 0.3
    assert stats.noise_floor("bench_workloads.other.track_speedup_vs_loop('a')", "m1", root=tmp_path) == 0.2
    path.write_text("{not json")
    with pytest.raises(ValueError, match="calibration"):
        stats.noise_floor(point, "m1", root=tmp_path)


def test_asv_entries_become_estimates_from_samples_then_ci_then_value():
    data = {
        "result_columns": ["result", "params", "version", "started_at", "duration", "stats_ci_99_a",
                           "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_number", "stats_repeat",
                           "samples", "profile"],
        "results": {
            "bench_workloads.w.time_run": [
                [0.002, None, float("nan"), 0.004],
                [["'s'"], ["'loop'", "'engine'"], ["'cpu'", "'cuda'"]],
                "1", 0, 1.0,
                [0.0015, None, None, float("inf")], [0.0025, None, None, float("inf")],
                None, None, None, None,
                [[0.0019, 0.002, 0.0021, 0.0022], None, None, None], None,
            ],
            "bench_runtime.track_torch_num_threads": [[2], [], "1", 0, 0.1] + [[None]] * 4 + [None] * 3,
        },
    }
    got = dict(stats.asv_estimates(data))
    first = got["bench_workloads.w.time_run('s', 'loop', 'cpu')"]
    assert first.n == 4 and first.lo <= 0.00205 <= first.hi  # from the samples
    assert got["bench_workloads.w.time_run('s', 'loop', 'cuda')"] is None  # failed
    assert got["bench_workloads.w.time_run('s', 'engine', 'cpu')"] is None  # skipped
    assert got["bench_workloads.w.time_run('s', 'engine', 'cuda')"] == stats.Estimate(0.004, 0.004, 0.004, 1)
    assert got["bench_runtime.track_torch_num_threads"] == stats.Estimate(2.0, 2.0, 2.0, 1)
    assert stats.row_estimate(1.0, None, 0.9, 1.2) == stats.Estimate(1.0, 0.9, 1.2, 2)


def test_read_asv_result_reads_a_file_and_drops_skipped_points(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"result_columns": ["result", "params"],
                                "results": {"a.b.time_x": [[1.0, float("nan")], [["'p'", "'q'"]]]}}))
    assert stats.read_asv_result(path) == {"a.b.time_x('p')": stats.Estimate(1.0, 1.0, 1.0, 1)}


def test_relative_change_formats_the_interval():
    assert stats.relative_change(stats.Estimate(1.25, 1.1, 1.4, 5)) == "+25.0% [+10.0%, +40.0%]"
    assert stats.relative_change(stats.Estimate(0.9, 0.9, 0.9, 1)) == "-10.0%"


def test_the_suite_agrees_with_the_gate_policy():
    from suite import selection

    assert selection.HIGHER_IS_BETTER == stats.HIGHER_IS_BETTER
    metrics = {m.name for m in selection.METRICS}
    # the per-op overhead is the gate's difference of two suite times; instruction counts are the gate's own
    assert stats.GATED_METRICS - {"track_overhead_us_per_op"} - stats.COUNT_METRICS <= metrics
    assert stats.NEVER_CALLED <= metrics


def test_gate_verdict_calls_inconclusive_what_an_interval_cannot_decide():
    floor = 0.10
    assert stats.gate_verdict(stats.Estimate(1.3, 1.2, 1.4, 5), floor) == "slower"
    assert stats.gate_verdict(stats.Estimate(0.7, 0.6, 0.8, 5), floor) == "faster"
    assert stats.gate_verdict(stats.Estimate(1.02, 0.97, 1.06, 5), floor) == "unchanged"
    # a wide interval wholly beyond the floor is still slower; one that reaches back across it is not
    wide = stats.Estimate(2.71, 1.72, 47.3, 3)
    assert stats.verdict(wide, 0.10) == "slower" and stats.gate_verdict(wide, 0.60) == "slower"
    assert stats.gate_verdict(stats.Estimate(2.71, 0.003, 41.0, 3), floor) == "inconclusive"
    assert stats.gate_verdict(stats.Estimate(1.08, 1.04, 1.13, 5), floor) == "inconclusive"  # reaches past +10%
    assert stats.gate_verdict(stats.Estimate(1.5, 1.5, 1.5, 1), floor) == "inconclusive"  # no interval
    assert stats.gate_verdict(stats.Estimate(3.0, 2.9, 3.1, 5), math.inf) == "inconclusive"  # noise unknown
    assert stats.gate_verdict(stats.Estimate(0.7, 0.6, 0.8, 5), floor, higher_is_better=True) == "slower"


def test_unchanged_is_an_equivalence_test_and_slower_keeps_its_interval():
    """With the change's 90% interval (TOST at 5% a side) a 99% interval reaching past the floor
    can still be "unchanged" where the 90% one lies within it; "slower" is decided by the 99%
    interval alone, so no equivalence interval makes a change slower or keeps it from being so."""
    floor = 0.10
    wide, narrow = stats.Estimate(1.04, 0.96, 1.13, 8), stats.Estimate(1.04, 0.99, 1.08, 8)
    assert stats.gate_verdict(wide, floor) == "inconclusive"
    assert stats.gate_verdict(wide, floor, equivalence=narrow) == "unchanged"
    assert stats.gate_verdict(wide, floor, equivalence=stats.Estimate(1.04, 0.98, 1.11, 8)) == "inconclusive"
    slow = stats.Estimate(1.3, 1.2, 1.4, 8)
    assert stats.gate_verdict(slow, floor, equivalence=stats.Estimate(1.0, 0.99, 1.01, 8)) == "slower"
    reaching = stats.Estimate(1.15, 1.05, 1.25, 8)
    assert stats.gate_verdict(reaching, floor, equivalence=stats.Estimate(1.15, 1.12, 1.18, 8)) == "inconclusive"
    # the 90% interval of the same ratios is inside the 99% one
    ratios = [1.02, 0.97, 1.05, 1.01, 0.99, 1.04, 1.0, 1.03]
    e99, e90 = stats.paired_ratio(ratios), stats.paired_ratio(ratios, stats.EQUIVALENCE_CONFIDENCE)
    assert e99.lo < e90.lo <= e90.value == e99.value <= e90.hi < e99.hi
    assert stats.t_quantile(5, 0.90) < stats.t_quantile(5, 0.95) < stats.t_quantile(5, 0.99)


def test_calibrated_floor_is_none_without_a_file_or_an_entry(tmp_path):
    point = "bench_workloads.mlp_hvp.instructions('hidden=128,k=8', 'engine', 'cpu')"
    assert stats.calibrated_floor(point, "fresh", root=tmp_path) is None
    path = stats.noise_file("fresh", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"floors": {point: 0.012}}))
    assert stats.calibrated_floor(point, "fresh", root=tmp_path) == 0.012
    assert stats.calibrated_floor("bench_workloads.other.instructions('a')", "fresh", root=tmp_path) is None
    assert stats.is_gated(point) and stats.is_count(point) and not stats.is_count("x.time_run('a')")


def test_paired_ratio_widens_with_few_pairs():
    """Three pair ratios within 12% of each other: a bootstrap interval of their median is their
    range (it made a false alarm); the t interval of their mean log ratio is far wider."""
    few = stats.paired_ratio([0.68, 0.72, 0.80])
    assert few.lo < 0.55 and few.hi > 0.95
    many = stats.paired_ratio([0.68, 0.72, 0.80, 0.70, 0.75, 0.71, 0.74, 0.69, 0.73, 0.72, 0.76, 0.70])
    assert many.hi < 0.8 and many.lo > 0.65  # enough pairs: an interval that decides
    assert few.value == pytest.approx(0.72) and stats.t_quantile(2) == pytest.approx(9.925)
    with pytest.raises(ValueError, match="not tabulated"):
        stats.t_quantile(5, 0.8)
