"""measuring.stats' plain summaries: median, quartiles, quantile, rank_percentile, spread, geomean."""
from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from measuring import stats


def test_median_is_the_middle_or_the_mean_of_the_two_middle_values():
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert stats.median(x for x in (5.0, 7.0)) == 6.0


def test_quartiles_follow_the_method_asked_for():
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert stats.quartiles(values) == tuple(statistics.quantiles(values, n=4))
    assert stats.quartiles(values, "inclusive") == tuple(statistics.quantiles(values, n=4, method="inclusive"))
    assert stats.quartiles(values)[1] == stats.median(values)
    assert stats.quartiles([2.5]) == (2.5, 2.5, 2.5)


def test_quantile_interpolates_linearly():
    values = [1.0, 2.0, 3.0, 4.0]
    assert stats.quantile(values, 0.5) == 2.5
    assert stats.quantile(values, 0.9) == pytest.approx(float(np.quantile(values, 0.9)))
    assert stats.quantile(values, 0.0) == 1.0 and stats.quantile(values, 1.0) == 4.0


def test_rank_percentile_is_always_a_sample():
    values = [float(v) for v in range(10, 0, -1)]  # 10 .. 1, unsorted on purpose
    assert stats.rank_percentile(values, 0.9) == 10.0  # index 9 of 1..10
    assert stats.rank_percentile(values, 0.1) == 2.0
    assert stats.rank_percentile(values, 1.0) == 10.0  # the last at most
    assert stats.rank_percentile([0.3], 0.5) == 0.3
    with pytest.raises(ValueError, match="no values"):
        stats.rank_percentile([], 0.5)


def test_spread_drops_the_same_number_of_samples_at_each_end():
    values = [float(v) for v in range(1, 31)]
    assert stats.spread(values, 0.1) == (4.0, 27.0)  # 3 dropped below, 3 above
    assert stats.spread([2.0, 1.0], 0.5) == (1.0, 2.0)  # never crosses the middle
    assert stats.spread([1.0, 2.0, 3.0], 0.0) == (1.0, 3.0)


def test_geomean_averages_ratios_in_log_scale():
    assert stats.geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert stats.geomean([1.0, 4.0, 16.0]) == pytest.approx(4.0)
    assert math.isnan(stats.geomean([]))
    with pytest.raises(ValueError):
        stats.geomean([1.0, 0.0])
