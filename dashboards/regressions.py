"""Regressions across commits, found with asv's own step detector.

Each series (one machine, one benchmark case, commits in date order) is fitted with a piecewise
constant function by `asv.step_detect.detect_steps` (a penalized L1 fit, the one `asv publish`
uses), and `detect_regressions` reports upward steps larger than REGRESSION_THRESHOLD (5%, asv's
default) relative to the best later level. A regression is reported at the first commit of the
slower level. The fit is pure Python (about 3 ms per 60-commit series), so the search covers the
engine's methods over each machine's newest HISTORY_COMMITS commits. The one-commit comparison
of the overview and of Compare is a plain ratio with COMPARE_FACTOR, like `asv compare`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import pandas as pd
from asv.step_detect import detect_regressions, detect_steps

from dashboards.theme import COMPARE_FACTOR, REGRESSION_THRESHOLD, higher_is_better
from workloads.base import ENGINE_METHODS

if TYPE_CHECKING:
    from dashboards.context import Context

TIME_METRIC = "time"
# Commits per machine the history and its regression search cover (the newest).
HISTORY_COMMITS = 60
REGRESSION_COLUMNS = ["machine", "benchmark", "workload", "size", "method", "device", "metric",
                      "unit", "commit_before", "commit_after", "date_after", "before", "after", "ratio"]


def find_steps(values: list[float]) -> list[tuple[int, int, float, float]]:
    """Upward steps of one series: (last index at the good level, first index at the worse level,
    value before, best value after). Empty for fewer than 3 points or no step."""
    if len(values) < 3:
        return []
    steps = detect_steps(values)
    _, _, positions = detect_regressions(steps, threshold=REGRESSION_THRESHOLD)
    # asv weighs a step against the segments' spread, which short noisy series underestimate:
    # keep only jumps that are themselves above the threshold.
    return [(int(a), int(b), float(va), float(vb)) for a, b, va, vb in positions or []
            if a is not None and b is not None and vb > va * (1 + REGRESSION_THRESHOLD)]


def history_regressions(ctx: "Context", metric: str = TIME_METRIC,
                        methods: Iterable[str] = ENGINE_METHODS,
                        max_commits: int = HISTORY_COMMITS) -> pd.DataFrame:
    """Regressions the step detector finds in `metric` of `methods` over each machine's newest
    `max_commits` commits."""
    rows = ctx.metric_rows((metric,))
    rows = rows[rows["method"].isin(list(methods))]
    found: list[dict[str, Any]] = []
    if rows.empty or max(len(c) for c in ctx.commits.values()) < 3:
        return pd.DataFrame(columns=REGRESSION_COLUMNS)
    rows = ctx.of_commits(rows, max_commits).sort_values("date", kind="stable")
    for _, series in rows.groupby(["machine", "case"], sort=False, observed=True):
        if len(series) < 3:
            continue
        values = series["value"].tolist()
        # Segment levels lie between the series' extremes, so a series whose whole range is
        # within the threshold cannot hold a reportable step: skip the (costly) fit.
        if max(values) <= min(values) * (1 + REGRESSION_THRESHOLD):
            continue
        commits = series["commit"].tolist()
        dates = series["date"].tolist()
        first = series.iloc[0]
        for before, after, v_before, v_after in find_steps(values):
            found.append({
                "machine": first["machine"], "benchmark": first["benchmark"],
                "workload": first["workload"], "size": first["size"], "method": first["method"],
                "device": first["device"], "metric": metric, "unit": first["unit"],
                "commit_before": commits[before], "commit_after": commits[after],
                "date_after": dates[after], "before": v_before, "after": v_after,
                "ratio": v_after / v_before if v_before else float("nan"),
            })
    return pd.DataFrame(found, columns=REGRESSION_COLUMNS)


def commit_pair(ctx: "Context", machine: str) -> tuple[str, str] | None:
    """(previous, latest) commit of a machine by commit date, or None with fewer than two."""
    commits = ctx.commits.get(machine, [])
    return (commits[-2], commits[-1]) if len(commits) >= 2 else None


def compare_commits(rows: pd.DataFrame, machine: str, base: str, head: str) -> pd.DataFrame:
    """Every case of `rows` measured at both commits, with ratio = head / base (asv compare's)."""
    on = rows[(rows["machine"] == machine) & rows["commit"].isin([base, head])]
    a = on[on["commit"] == base].drop_duplicates("case", keep="last")
    b = on[on["commit"] == head].drop_duplicates("case", keep="last")
    both = a.merge(b[["case", "value"]], on="case", suffixes=("_base", "_head"))
    both["ratio"] = both["value_head"] / both["value_base"]
    return both


def latest_changes(ctx: "Context", factor: float = COMPARE_FACTOR) -> list[dict[str, Any]]:
    """Per machine with two commits: what the latest commit made slower or faster (time only)."""
    out = []
    regressions = ctx.regressions
    for machine in sorted(ctx.latest_commits):
        pair = commit_pair(ctx, machine)
        if pair is None:
            continue
        cmp = compare_commits(ctx.metric_rows((TIME_METRIC,)), machine, *pair)
        slower, faster = [], []
        for r in cmp.itertuples(index=False):
            label = f"{r.workload} {r.size or ''} {r.method} {r.device or ''}".replace("  ", " ")
            worse = r.ratio < 1 / factor if higher_is_better(r.metric) else r.ratio > factor
            better = r.ratio > factor if higher_is_better(r.metric) else r.ratio < 1 / factor
            if worse:
                slower.append({"label": label, "ratio": float(r.ratio)})
            elif better:
                faster.append({"label": label, "ratio": float(r.ratio)})
        slower.sort(key=lambda d: -d["ratio"])
        flagged = 0
        if not regressions.empty:
            flagged = int(((regressions["machine"] == machine) &
                           (regressions["commit_after"] == pair[1])).sum())
        out.append({"machine": machine, "base": pair[0], "head": pair[1], "slower": slower,
                    "faster": faster, "total": len(cmp), "factor": factor, "flagged": flagged})
    return out
