"""Compare's verdicts are judged in Python, for every pair of commits the page offers, by the rule
the Overview's box uses (regressions.commit_changes); the page's script only shows them."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from dashboards import numbers
from dashboards.context import Context
from dashboards.loader import load_results
from dashboards.regressions import commit_changes
from dashboards.views import compare
from measuring import stats

FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"
SCRIPT = Path(__file__).resolve().parents[1] / "dashboards" / "assets" / "dashboard.js"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Context:
    results = load_results(FIXTURE, stats="intervals")
    return Context(results=results, coverage=None, profiles=[], out_dir=tmp_path_factory.mktemp("dash"))


def page_verdicts(data: dict, machine: str, base: str, head: str) -> dict[int, str]:
    """Row id -> verdict of the rows of both commits, read from the data as the page's script reads it."""
    run = data["machines"][machine]
    at = {c: i for i, (c, _) in enumerate(run["commits"])}
    present = [set(run["values"].get(c, [[]])[0]) for c in (base, head)]
    listed = {row: data["called"][k] for k, ids in enumerate(run["verdicts"][at[base]][at[head]]) for row in ids}
    never = set(run["never"])
    return {row: listed.get(row, "not judged" if row in never else "unchanged") for row in present[0] & present[1]}


def test_every_pair_gets_the_verdicts_of_commit_changes(ctx: Context) -> None:
    data = compare.compare_data(ctx)
    row_of = {case: i for i, case in enumerate(np.sort(ctx.of_commits(ctx.lean, compare.COMPARE_COMMITS)["case"].unique()))}
    pairs = 0
    for machine, run in data["machines"].items():
        commits = [c for c, _ in run["commits"]]
        for base, head in itertools.permutations(commits, 2):
            want = {row_of[r.case]: r.verdict for r in commit_changes(ctx, machine, base, head).itertuples()}
            assert page_verdicts(data, machine, base, head) == want, (machine, base, head)
            pairs += 1
    assert pairs >= 4


def test_changes_and_judgements_are_change_and_judge_over_arrays() -> None:
    base = [stats.Estimate(1.0, 0.9, 1.1, 5), stats.Estimate(0.0, 0.0, 0.1, 5), stats.Estimate(2.0, 1.9, 2.1, 1)]
    head = [stats.Estimate(1.5, 1.4, 1.6, 5), stats.Estimate(1.0, 0.9, 1.1, 5), stats.Estimate(1.0, 0.9, 1.1, 5)]
    for floor, better in itertools.product((0.1, float("inf")), (False, True)):
        one = [numbers.judge(b, h, "bench.track_speedup_vs_loop" if better else "bench.time_run", floor)[0]
               for b, h in zip(base, head)]
        value, lo, hi, defined = numbers.changes(*zip(*[(b.value, b.lo, b.hi, h.value, h.lo, h.hi) for b, h in zip(base, head)]))
        n = [min(b.n, h.n) for b, h in zip(base, head)]
        assert numbers.judgements(lo, hi, n, defined, floor, better).tolist() == one
    assert numbers.change(base[1], head[1]) is None
    assert numbers.change(base[0], head[0]) == stats.Estimate(1.5, 1.4 / 1.1, 1.6 / 0.9, 5)


def test_the_script_makes_no_verdict() -> None:
    """dashboard.js compares no interval with a floor: the verdicts come with the data."""
    script = SCRIPT.read_text(encoding="utf-8")
    assert "floor" not in script.lower()
    assert not re.search(r"\b(lo|hi)\s*[<>]=?\s*1\b", script)
