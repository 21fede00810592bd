"""Compare: two commits of one machine side by side, like `asv compare`, in a sortable table.

The page embeds every benchmark value of each machine's newest commits as JSON; assets/dashboard.js
builds the table for the chosen machine and pair of commits (default: the two newest), colors the
ratio head/base beyond COMPARE_FACTOR and sorts on any column.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from dashboards.context import Context
from dashboards.page import Page, json_script
from dashboards.theme import COMPARE_FACTOR, higher_is_better

# Commits per machine offered for comparison (the newest).
COMPARE_COMMITS = 30
PARAM_ORDER = ("workload", "size", "method", "device")


def compare_data(ctx: Context) -> dict[str, Any]:
    """{'factor', 'rows': [[benchmark, params, workload, device, metric, unit, higher_better]],
    'machines': {machine: {'commits': [[hash, label]] newest first, 'values': {hash: [ids, values]}}}}"""
    f = ctx.lean
    data: dict[str, Any] = {"factor": COMPARE_FACTOR, "rows": [], "machines": {}}
    if f.empty:
        return data
    f = ctx.of_commits(f, COMPARE_COMMITS)
    f = f.drop_duplicates(["machine", "commit", "case"], keep="last")
    cases = np.sort(f["case"].unique())
    f = f.assign(_row=np.searchsorted(cases, f["case"].to_numpy()))
    firsts = f.drop_duplicates("_row").sort_values("_row")
    extra = [c for c in ctx.param_columns
             if c not in ("benchmark",) + PARAM_ORDER and c not in ctx.results.size_columns]
    rows = []
    for r in firsts.to_dict("records"):
        params = [str(r[c]) for c in PARAM_ORDER + tuple(extra) if c in r and _present(r[c])]
        rows.append([r["benchmark"], " · ".join(params), _text(r.get("workload")), _text(r.get("device")),
                     r["metric"], _text(r["unit"]) or "", int(higher_is_better(r["metric"]))])
    data["rows"] = rows
    for machine, on in f.groupby("machine", sort=True, observed=True):
        dates = on.drop_duplicates("commit").set_index("commit")["date"]
        entry: dict[str, Any] = {"commits": [], "values": {}}
        for commit in reversed(ctx.commits[machine][-COMPARE_COMMITS:]):
            date = dates.get(commit)
            when = date.strftime("%Y-%m-%d %H:%M") if date is not None and pd.notna(date) else "no date"
            entry["commits"].append([commit, f"{commit[:8]} · {when}"])
        for commit, group in on.groupby("commit", sort=False, observed=True):
            values = [v if math.isfinite(v) else None for v in group["value"].tolist()]
            entry["values"][commit] = [group["_row"].tolist(), values]
        data["machines"][machine] = entry
    return data


def _text(value: Any) -> str | None:
    """A JSON-safe label: None for missing values (pandas gives NaN for them)."""
    return str(value) if _present(value) else None


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def render(ctx: Context) -> Page:
    page = Page("compare.html", "Compare", intro=(
        "<p>Every benchmark of two commits on one machine, like <code>asv compare</code>: the "
        "ratio is the later commit's value over the earlier one's. For times, memory and "
        "fallback counts a ratio above "
        f"{COMPARE_FACTOR:g} is a slowdown (red, <b>+</b>) and below 1/{COMPARE_FACTOR:g} an "
        "improvement (green, <b>−</b>); for speedups the other way round. Click a column header "
        f"to sort. The newest {COMPARE_COMMITS} commits of each machine can be picked. One run "
        "per commit is noisy: confirm a change with <code>make continuous</code> or in History. "
        f"{ctx.measured_note()}</p>"))
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
        '<th>benchmark</th><th>parameters</th><th>base</th><th>head</th><th data-sort-default="desc">ratio</th>'
        '</tr></thead><tbody></tbody></table>'
        + json_script("vb-compare-data", data))
    return page
