"""History: the engine's time per benchmark across commits, with regressions flagged.

Regressions come from asv's step detector (see dashboards.regressions) run over the time series
of the engine's methods (the code this repository changes); the plots show a red cross at the
first commit of every slower level and the table lists them.
"""
from __future__ import annotations

import pandas as pd

from dashboards.context import TIME_METRIC, Context
from dashboards.figures import Panels, epoch_ms, panel_keys, records
from dashboards.regressions import HISTORY_COMMITS
from dashboards.page import Page, esc, table
from dashboards.theme import (REGRESSION_THRESHOLD, format_value, method_color, method_label,
                              method_order, natural_key)
from workloads.base import ENGINE_METHODS



SYMBOLS = ("circle", "square", "diamond", "triangle-up", "star", "hexagon")


def _figure(ctx: Context, rows: pd.DataFrame, regressions: pd.DataFrame) -> dict:
    """One panel per (machine, device): a line per engine method and size over the machine's
    commits (in commit-date order, like asv's graphs), red crosses at regressions."""
    keys = panel_keys(rows)
    panels = Panels(keys, x_title="commit (oldest → newest)", y_title="time per call (s, log)", log_y=True,
                    x_extra={"type": "category", "categoryorder": "array", "tickangle": -45})
    for machine, device in keys:
        shown = ctx.commits.get(machine, [])[-HISTORY_COMMITS:]
        panels.x_axis(machine, device)["categoryarray"] = [c[:8] for c in shown]
    order = method_order(rows["method"].unique())
    sizes = sorted({str(s) for s in rows["size"].dropna().unique()}, key=natural_key)
    lines: dict[tuple, list[tuple]] = {}
    dates = epoch_ms(rows["date"])
    for (machine, device, method, size, workload, commit, value), date in zip(
            records(rows, ["machine", "device", "method", "size", "workload", "commit", "value"]), dates):
        lines.setdefault((machine, device, method, size, workload), []).append((date, commit, value))
    for key in sorted(lines, key=lambda k: (order.index(k[2]), natural_key(k[3]))):
        machine, device, method, size, workload = key
        points = sorted(lines[key])
        name = f"{method_label(method)} {size}"
        symbol = SYMBOLS[sizes.index(str(size)) % len(SYMBOLS)] if str(size) in sizes else "circle"
        panels.add({
            "type": "scatter", "x": [p[1][:8] for p in points], "y": [p[2] for p in points],
            "mode": "lines+markers", "name": name,
            "line": {"color": method_color(method), "width": 1.5}, "marker": {"symbol": symbol, "size": 6},
            "meta": {"machine": machine, "device": device, "workload": workload},
            "customdata": [_when(p[0]) for p in points],
            "hovertemplate": f"<b>{esc(name)}</b><br>commit %{{x}} (%{{customdata}})<br>%{{y:.3s}}s<extra></extra>",
        }, machine, device)
    for (machine, device), reg in regressions.groupby(["machine", "device"], dropna=False, observed=True):
        panels.add({
            "type": "scatter", "x": [c[:8] for c in reg["commit_after"]], "y": reg["after"].tolist(),
            "mode": "markers", "name": "regression",
            "marker": {"symbol": "x", "size": 13, "color": "#d62728", "line": {"width": 1}},
            "meta": {"machine": machine, "device": device, "workload": reg["workload"].iloc[0]},
            "customdata": [[f"{method_label(r.method)} {r.size}", r.commit_before[:8], r.commit_after[:8], r.ratio]
                           for r in reg.itertuples(index=False)],
            "hovertemplate": ("<b>regression</b> %{customdata[0]}<br>%{customdata[1]} → "
                              "%{customdata[2]}: %{customdata[3]:.2f}× slower<extra></extra>"),
        }, machine, device)
    return panels.fig


def _when(ms: int) -> str:
    return pd.Timestamp(ms, unit="ms", tz="UTC").strftime("%Y-%m-%d %H:%M UTC")


def _regression_table(regs: pd.DataFrame) -> str:
    regs = regs.sort_values("ratio", ascending=False)
    headers = ["machine", "workload", "size", "method", "device", "last good", "first slow",
               "before", "after", "ratio"]
    rows = []
    for r in regs.itertuples(index=False):
        cells = [(esc(r.machine), r.machine), (esc(r.workload), r.workload), (esc(r.size), r.size),
                 (esc(method_label(r.method)), r.method), (esc(r.device), r.device),
                 (f"<code>{esc(r.commit_before[:8])}</code>", r.commit_before),
                 (f"<code>{esc(r.commit_after[:8])}</code>", r.date_after.isoformat()),
                 (format_value(r.before, r.unit), r.before), (format_value(r.after, r.unit), r.after),
                 (f'<span class="vb-bad">{r.ratio:.2f}×</span>', r.ratio)]
        rows.append((cells, {"machine": r.machine, "device": r.device, "workload": r.workload}))
    return table(headers, rows)


def render(ctx: Context) -> Page:
    page = Page("history.html", "History", intro=(
        "<p>The engine's time per call (<code>engine</code>, <code>engine_traced</code>, "
        "<code>engine_compiled</code>) for every workload and size across commits in commit-date "
        "order, newest "
        f"{HISTORY_COMMITS} commits per machine. Red crosses mark regressions found by asv's step "
        "detector: it fits each series with a piecewise-constant level (a penalized L1 fit, the "
        "one <code>asv publish</code> uses) and reports a step up of more than "
        f"{REGRESSION_THRESHOLD:.0%} that the later commits do not undo, at the first commit of the "
        "slower level. It needs three commits of a series. Other methods' times are in Compare and "
        f"in <code>vmapbench export --csv</code>. {ctx.measured_note()}</p>"))
    rows = ctx.metric_rows((TIME_METRIC,))
    if rows.empty:
        page.notice("No timed workload results yet: run <code>make bench</code>.", "warn")
        return page
    if max(len(c) for c in ctx.commits.values()) < 2:
        page.notice("Only one commit per machine so far, so there is no history to draw. Each "
                    "<code>make bench</code> on a new commit adds one point (or benchmark a range "
                    "with <code>make continuous BASE=&lt;rev&gt; HEAD=&lt;rev&gt;</code>).")
        return page
    engine = ctx.of_commits(rows[rows["method"].isin(list(ENGINE_METHODS))], HISTORY_COMMITS)
    regressions = ctx.regressions
    if engine.empty:
        page.notice("No engine method was timed in these results.", "warn")
    for workload in sorted(engine["workload"].unique()):
        w_rows = engine[engine["workload"] == workload]
        w_regs = regressions[regressions["workload"] == workload]
        page.figure(_figure(ctx, w_rows, w_regs), title=workload, workload=workload)
    page.add("<h2>Regressions</h2>")
    if regressions.empty:
        page.notice("The step detector found no regression in these results.", "good")
    else:
        page.add(_regression_table(regressions))
    return page
