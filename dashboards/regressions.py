"""Regressions across commits, found with asv's own step detector.

Each series (one machine, one benchmark case, commits in date order) is fitted with a piecewise
constant function by `asv.step_detect.detect_steps` (a penalized L1 fit, the one `asv publish`
uses), and `detect_regressions` reports upward steps larger than the benchmark's noise floor
(`measuring.stats.noise_floor`: the gate's calibration or policy, the one threshold every page
uses) relative to the best later level. A regression is reported at the first commit of the
slower level. The fit is pure Python and linear in a series' length, so the search covers the
engine's methods over each run's newest HISTORY_COMMITS commits. The one-commit comparison of the
overview's box and of Compare is `commit_changes`: head/base with its interval, judged by
`measuring.stats.verdict`.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import pandas as pd
from asv.step_detect import detect_regressions, detect_steps

from dashboards.context import TIME_METRIC, Context
from dashboards.numbers import estimate_columns, floor_of, judge
from measuring import stats
from workloads.base import ENGINE_METHODS

# Commits per machine the history and its regression search cover (the newest).
HISTORY_COMMITS = 60
REGRESSION_COLUMNS = ["machine", "benchmark", "workload", "size", "method", "device", "metric",
                      "unit", "commit_before", "commit_after", "date_after", "before", "after", "ratio"]


def find_steps(values: list[float], threshold: float) -> list[tuple[int, int, float, float]]:
    """Upward steps of one series larger than `threshold` (a fraction): (last index at the good
    level, first index at the worse level, value before, best value after). Empty for fewer than
    3 points or no step."""
    if len(values) < 3:
        return []
    steps = detect_steps(values)
    _, _, positions = detect_regressions(steps, threshold=threshold)
    # asv weighs a step against the segments' spread, which short noisy series underestimate:
    # keep only jumps that are themselves above the threshold.
    return [(int(a), int(b), float(va), float(vb)) for a, b, va, vb in positions or []
            if a is not None and b is not None and vb > va * (1 + threshold)]


def history_regressions(ctx: Context, metrics: tuple[str, ...] = (TIME_METRIC, "ratio_vs_torch_func"),
                        methods: Iterable[str] = ENGINE_METHODS,
                        max_commits: int = HISTORY_COMMITS) -> pd.DataFrame:
    """Regressions the step detector finds in `metrics` (lower is better) of `methods` over each
    run's newest `max_commits` commits: steps up by more than the benchmark's noise floor
    (stats.noise_floor, the threshold the gate and Compare use)."""
    rows = ctx.metric_rows(metrics)
    rows = rows[rows["method"].isin(list(methods))]
    found: list[dict[str, Any]] = []
    if rows.empty or max(len(c) for c in ctx.commits.values()) < 3:
        return pd.DataFrame(columns=REGRESSION_COLUMNS)
    rows = ctx.of_commits(rows, max_commits).sort_values("date", kind="stable")
    floor_cache: dict[tuple[str, str], float] = {}
    for _, series in rows.groupby(["machine", "case"], sort=False, observed=True):
        if len(series) < 3:
            continue
        values = series["value"].tolist()
        first = series.iloc[0]
        key = (str(first["host"]), str(first["benchmark"]))
        if key not in floor_cache:
            floor_cache[key] = floor_of(key[1], key[0], ctx.results.results_dir)
        threshold = floor_cache[key]
        # Segment levels lie between the series' extremes, so a series whose whole range is
        # within the threshold cannot hold a reportable step: skip the (costly) fit.
        if not math.isfinite(threshold) or max(values) <= min(values) * (1 + threshold):
            continue
        commits = series["commit"].tolist()
        dates = series["date"].tolist()
        for before, after, v_before, v_after in find_steps(values, threshold):
            found.append({
                "machine": first["machine"], "benchmark": first["benchmark"],
                "workload": first["workload"], "size": first["size"], "method": first["method"],
                "device": first["device"], "metric": first["metric"], "unit": first["unit"],
                "commit_before": commits[before], "commit_after": commits[after],
                "date_after": dates[after], "before": v_before, "after": v_after,
                "ratio": v_after / v_before if v_before else float("nan"),
            })
    return pd.DataFrame(found, columns=REGRESSION_COLUMNS)


def found_regressions(ctx: Context) -> pd.DataFrame:
    """history_regressions with its defaults, computed once per build (History and the Overview's
    changes box both read it): the one table of regressions the pages show."""
    return ctx.shared(history_regressions)


def commit_pair(ctx: Context, machine: str) -> tuple[str, str] | None:
    """(previous, latest) commit of a run by commit date, or None with fewer than two."""
    commits = ctx.commits.get(machine, [])
    return (commits[-2], commits[-1]) if len(commits) >= 2 else None


def floors(ctx: Context, rows: pd.DataFrame) -> dict[str, float]:
    """benchmark -> its noise floor (stats.noise_floor) on the host of `rows` (one run)."""
    host = str(rows["host"].iloc[0]) if len(rows) else ""
    return {b: floor_of(b, host, ctx.results.results_dir) for b in rows["benchmark"].unique()}


def commit_changes(ctx: Context, machine: str, base: str, head: str) -> pd.DataFrame:
    """Every benchmark value of run `machine` at both commits, with its change head/base
    (numbers.change) and verdict (stats.verdict beyond the benchmark's noise floor; 'not judged'
    for metrics never called, like RSS deltas, and for ratios with a zero base). Compare shows
    the same figures and verdicts for the same pair (views/compare.py judges them with
    numbers.judgements)."""
    f = ctx.lean
    on = f[(f["machine"] == machine) & f["commit"].isin([base, head])]
    on = estimate_columns(on.drop_duplicates(["commit", "case"], keep="last"))
    a, b = on[on["commit"] == base], on[on["commit"] == head]
    both = a.merge(b[["case", "value", "lo", "hi", "n"]], on="case", suffixes=("_base", "_head"))
    floor = floors(ctx, both)
    verdicts, ratios, los, his = [], [], [], []
    for r in both.itertuples(index=False):
        v, delta = judge(stats.Estimate(r.value_base, r.lo_base, r.hi_base, int(r.n_base)),
                         stats.Estimate(r.value_head, r.lo_head, r.hi_head, int(r.n_head)),
                         r.benchmark.rsplit(".", 1)[-1], floor[r.benchmark])
        verdicts.append(v)
        ratios.append(delta.value if delta else float("nan"))
        los.append(delta.lo if delta else float("nan"))
        his.append(delta.hi if delta else float("nan"))
    return both.assign(verdict=verdicts, ratio=ratios, ratio_lo=los, ratio_hi=his)


def latest_changes(ctx: Context) -> list[dict[str, Any]]:
    """Per run with two commits: what its latest commit changed, by the verdicts of
    commit_changes (the counts Compare shows for the same pair)."""
    out = []
    regressions = found_regressions(ctx)
    for machine in sorted(ctx.latest_commits):
        pair = commit_pair(ctx, machine)
        if pair is None:
            continue
        cmp = commit_changes(ctx, machine, *pair)
        counts = cmp["verdict"].value_counts().to_dict()
        slower = cmp[cmp["verdict"] == "slower"]
        slower = slower.assign(gated=slower["benchmark"].map(lambda b: stats.is_gated(b.rsplit(".", 1)[-1])))
        slower = slower.sort_values(["gated", "ratio_lo"], ascending=[False, False])
        worst = []
        for r in slower.itertuples(index=False):
            label = " ".join(str(x) for x in (r.workload, r.size, r.method, r.device) if x == x and x is not None)
            worst.append({"label": f"{label} {r.metric}".strip(), "ratio": float(r.ratio),
                          "lo": float(r.ratio_lo), "hi": float(r.ratio_hi), "gated": bool(r.gated)})
        gated = slower[slower["gated"]]
        flagged = 0
        if not regressions.empty:
            flagged = int(((regressions["machine"] == machine) &
                           (regressions["commit_after"] == pair[1])).sum())
        out.append({"machine": machine, "base": pair[0], "head": pair[1], "counts": counts,
                    "slower": worst, "gated_slower": len(gated), "total": len(cmp), "flagged": flagged})
    return out
