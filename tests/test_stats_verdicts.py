"""measuring.stats.verdicts: the verdict rule over arrays, the same as `verdict` one change at a time."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from measuring import stats


def test_verdicts_agree_with_verdict_on_every_case():
    bounds = [0.5, 0.85, 0.95, 1.0, 1.05, 1.2, 2.0, math.nan]
    cases = [(lo, hi, n, floor, better)
             for lo, hi in itertools.product(bounds, bounds) if not lo > hi
             for n in (1, 2, 9) for floor in (0.0, 0.1, math.inf) for better in (False, True)]
    lo, hi, n, floor, better = (np.array(column) for column in zip(*cases))
    got = stats.verdicts(lo, hi, n, floor, better)
    want = [stats.verdict(stats.Estimate(1.0, *case[:3]), case[3], case[4]) for case in cases]
    assert got.tolist() == want
    assert {"slower", "faster", "unchanged"} == set(want)


def test_verdicts_broadcast_one_floor_over_many_changes():
    got = stats.verdicts([1.3, 0.5, 0.97], [1.7, 0.8, 1.02], 5, 0.1)
    assert got.tolist() == ["slower", "faster", "unchanged"]
    assert stats.verdicts([1.3, 0.5], [1.7, 0.8], 5, 0.1, higher_is_better=True).tolist() == ["faster", "slower"]


def test_a_negative_floor_is_refused():
    with pytest.raises(ValueError, match="noise_floor"):
        stats.verdicts([1.0], [1.0], 5, [-0.1])
