"""Compare: two commits of one run side by side, like `asv compare`, in a sortable table.

The page embeds every benchmark value of each run's newest commits with its interval
(dashboards.numbers.estimate_columns) and, for every pair of those commits, the verdicts judged
here (numbers.changes and numbers.judgements: stats.verdicts against each benchmark's noise
floor, the same rule and figures as the Overview's box, dashboards.regressions.commit_changes),
as JSON; assets/dashboard.js builds the table for the chosen run and pair of commits (default:
the two newest) and shows the verdicts it was given. Metrics never judged (RSS deltas) and
changes from a zero base are listed apart, below the judged ones.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from dashboards.context import Context
from dashboards.numbers import NOT_JUDGED, changes, estimate_columns, judgements
from dashboards.page import Page, json_script
from dashboards.regressions import floors
from dashboards.theme import method_label
from measuring import stats

# Commits per run offered for comparison (the newest).
COMPARE_COMMITS = 30
PARAM_ORDER = ("workload", "size", "method", "device")


def compare_data(ctx: Context) -> dict[str, Any]:
    """{'rows': [[benchmark, params, workload, device, metric, unit, higher_better, gated, method
    label, params without method and device]], 'called': the verdicts listed per pair,
    'machines': {run: {'commits': [[hash, label]] newest first,
    'values': {hash: [row ids, values, lo, hi, n]}, 'never': row ids never judged (RSS deltas),
    'verdicts': [[per head commit: [row ids, one list per verdict of 'called']] per base commit]}}}:
    a row with a value at both commits, never judged, is "not judged"; one in none of a pair's
    lists is unchanged."""
    f = ctx.lean
    data: dict[str, Any] = {"rows": [], "machines": {}, "confidence": stats.CONFIDENCE, "called": list(CALLED)}
    if f.empty:
        return data
    f = ctx.of_commits(f, COMPARE_COMMITS)
    f = estimate_columns(f.drop_duplicates(["machine", "commit", "case"], keep="last"))
    cases = np.sort(f["case"].unique())
    f = f.assign(_row=np.searchsorted(cases, f["case"].to_numpy()))
    firsts = f.drop_duplicates("_row").sort_values("_row")
    extra = [c for c in ctx.param_columns
             if c not in ("benchmark", "host") + PARAM_ORDER and c not in ctx.results.size_columns]
    rows = []
    for r in firsts.to_dict("records"):
        params = [str(r[c]) for c in PARAM_ORDER + tuple(extra) if c in r and _present(r[c])]
        attr = r["benchmark"].rsplit(".", 1)[-1]
        rest = [str(r[c]) for c in ("workload", "size") + tuple(extra) if c in r and _present(r[c])]
        method = _text(r.get("method"))
        rows.append([r["benchmark"], " · ".join(params), _text(r.get("workload")), _text(r.get("device")),
                     r["metric"], _text(r["unit"]) or "", int(stats.higher_is_better(attr)),
                     int(stats.is_gated(attr)), method_label(method) if method else "", " · ".join(rest)])
    data["rows"] = rows
    benchmarks = firsts["benchmark"].tolist()
    for machine, on in f.groupby("machine", sort=True, observed=True):
        dates = on.drop_duplicates("commit").set_index("commit")["date"]
        floor = floors(ctx, on)
        entry: dict[str, Any] = {"commits": [], "values": {}}
        for commit in reversed(ctx.commits[machine][-COMPARE_COMMITS:]):
            date = dates.get(commit)
            when = date.strftime("%Y-%m-%d %H:%M") if date is not None and pd.notna(date) else "no date"
            entry["commits"].append([commit, f"{commit[:8]} · {when}"])
        for commit, group in on.groupby("commit", sort=False, observed=True):
            entry["values"][commit] = [group["_row"].tolist()] + [
                [_finite(v) for v in group[c].tolist()] for c in ("value", "lo", "hi")] + [
                group["n"].astype(int).tolist()]
        better = np.array([row[6] for row in rows], dtype=bool)
        floor_of_row = np.array([floor.get(b, math.inf) for b in benchmarks], dtype=float)
        entry["never"] = [int(i) for i in np.flatnonzero(~np.isfinite(floor_of_row)) if benchmarks[i] in floor]
        entry["verdicts"] = pair_verdicts(on, [c for c, _ in entry["commits"]], len(rows), floor_of_row, better)
        data["machines"][machine] = entry
    return data


CALLED = ("slower", "faster", NOT_JUDGED)
"""The verdicts the page is given per pair, row by row (not judged: those of a zero base; the
metrics never judged are listed once, 'never'); every other row of both commits is unchanged."""


def pair_verdicts(on: pd.DataFrame, commits: list[str], n_rows: int, floor: np.ndarray,
                  better: np.ndarray) -> list[list[list[list[int]]]]:
    """For every base and head of `commits` (the rows of one run, with estimate columns and row
    ids `_row`), the row ids of each verdict of CALLED, judged by numbers.judgements; rows whose
    floor is infinite (never judged) are left out."""
    at = {c: i for i, c in enumerate(commits)}
    table = {k: np.full((len(commits), n_rows), np.nan) for k in ("value", "lo", "hi", "n")}
    rows = on[on["commit"].astype(str).isin(at)]
    where = (rows["commit"].astype(str).map(at).to_numpy(dtype=int), rows["_row"].to_numpy(dtype=int))
    for k, column in table.items():
        column[where] = rows[k].to_numpy(dtype=float)
    present = np.isfinite(table["value"])
    out = []
    for i in range(len(commits)):
        _, lo, hi, defined = changes(table["value"][i], table["lo"][i], table["hi"][i],
                                     table["value"], table["lo"], table["hi"])
        n = np.minimum(table["n"][i], table["n"])
        verdict = judgements(lo, hi, np.nan_to_num(n), defined, floor, better)
        both = present[i] & present & np.isfinite(floor)
        out.append([[np.flatnonzero(both[j] & (verdict[j] == v)).tolist() for v in CALLED]
                    for j in range(len(commits))])
    return out


def _finite(value: Any) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _text(value: Any) -> str | None:
    """A JSON-safe label: None for missing values (pandas gives NaN for them)."""
    return str(value) if _present(value) else None


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def render(ctx: Context) -> Page:
    page = Page("compare.html", "Compare", intro=(
        "<p>Every benchmark of two commits of one run (machine and asv env), like "
        "<code>asv compare</code>: the change is the head commit's value over the base's, with "
        f"the interval spanned by the two values' {stats.CONFIDENCE:.0%} intervals. A change is "
        "called <b>slower</b> (red) or <b>faster</b> (green) only when its whole interval lies "
        "beyond the benchmark's noise floor (<code>measuring.stats.verdict</code>: the gate's "
        "calibration, else its policy: 25% for raw times and whole-process memory, 10% for the "
        "in-process ratios, which are what the gate acts on and are marked <b>gated</b>). RSS "
        "deltas and changes from a zero base are listed apart, never judged. Judged rows come "
        "first, most certain change on top; click a column header to sort. The newest "
        f"{COMPARE_COMMITS} commits of each run can be picked. {ctx.measured_note()}</p>"))
    data = compare_data(ctx)
    if not data["machines"]:
        page.notice("No ASV results found: run <code>make bench</code>.", "warn")
        return page
    if all(len(m["commits"]) < 2 for m in data["machines"].values()):
        page.notice("Each machine has results for one commit only; the table shows it. Benchmark "
                    "another commit (<code>make bench</code> after a commit, or "
                    "<code>make continuous</code>) to compare.")
    page.add(
        '<div class="vb-compare-controls">'
        '<label>machine <select id="vb-cmp-machine"></select></label>'
        '<label>base <select id="vb-cmp-a"></select></label>'
        '<label>head <select id="vb-cmp-b"></select></label>'
        '<span id="vb-cmp-summary" class="vb-summary"></span></div>'
        '<table id="vb-compare" class="vb-table vb-sortable"><thead><tr>'
        '<th>benchmark</th><th>workload · size</th><th>method</th><th>device</th><th>base</th><th>head</th>'
        '<th data-sort-default="desc">change</th>'
        '<th>verdict</th></tr></thead><tbody></tbody></table>'
        + json_script("vb-compare-data", data))
    return page
