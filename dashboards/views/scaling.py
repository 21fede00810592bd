"""Scaling: time against the size parameter that varies most, log-log, one line per method.

A slope of 1 on these axes is linear scaling; a line of the same slope shifted down is a constant
factor faster. Each point is the most recent measurement of its case on its machine.
"""
from __future__ import annotations

import pandas as pd

from dashboards.context import TIME_METRIC, Context
from dashboards.figures import Panels, grouped_bars, panel_keys, records
from dashboards.page import Page, esc
from dashboards.theme import format_value, method_color, method_label, method_order

DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def line_figure(ctx: Context, rows: pd.DataFrame, x: str, *, y_title: str, hover_value: str) -> dict:
    """One panel per (machine, device); in it one line per method (and other size parameters)."""
    others = [c for c in ctx.size_columns_of(rows) if c != x and rows[c].nunique() > 1]
    panels = Panels(panel_keys(rows), x_title=f"{x} (log)", y_title=y_title, log_x=True, log_y=True)
    order = method_order(rows["method"].unique())
    lines: dict[tuple, list[tuple]] = {}
    for machine, device, method, workload, size, commit, xv, value, *rest in records(
            rows, ["machine", "device", "method", "workload", "size", "commit", x, "value"] + others):
        rest = tuple(None if v != v else v for v in rest)  # NaN -> None: one key for 'absent'
        lines.setdefault((machine, device, method, workload, rest), []).append((xv, value, size, commit))
    # Other size parameters are told apart by the dash (and the legend), methods by the color.
    combos = sorted({key[4] for key in lines}, key=str)
    for key in sorted(lines, key=lambda k: (order.index(k[2]), str(k[4]))):
        machine, device, method, workload, rest = key
        points = sorted(lines[key], key=lambda p: p[0])
        suffix = ", ".join(f"{c}={v:g}" for c, v in zip(others, rest) if v is not None)
        name = method_label(method) + (f" ({suffix})" if suffix else "")
        dash = DASHES[combos.index(rest) % len(DASHES)] if others else "solid"
        panels.add({
            "type": "scatter", "x": [p[0] for p in points], "y": [p[1] for p in points],
            "mode": "lines+markers", "name": name, "legendgroup": name,
            "line": {"color": method_color(method), "dash": dash}, "marker": {"size": 7},
            "meta": {"machine": machine, "device": device, "workload": workload},
            "customdata": [[p[2], p[3][:8]] for p in points],
            "hovertemplate": (f"<b>{esc(name)}</b> · {esc(machine)} · {esc(device)}<br>%{{customdata[0]}}"
                              f"<br>{hover_value}<br>commit %{{customdata[1]}}<extra></extra>"),
        }, machine, device)
    return panels.fig


def render(ctx: Context) -> Page:
    page = Page("scaling.html", "Scaling", intro=(
        "<p>Time per call against problem size for each workload, on log-log axes, one panel per "
        "machine and device, one line per method (and per value of any other size parameter, "
        "told apart by the dash). Parallel "
        "lines differ by a constant factor; a steeper line scales worse. The x axis is the size "
        "parameter with the most distinct values. Each point is the most recent asv median "
        f"(<code>time_run</code>) of that case on its machine. {ctx.measured_note()}</p>"))
    rows = ctx.latest_per_case([TIME_METRIC])
    if rows.empty:
        page.notice("No timed workload results yet: run <code>make bench</code>.", "warn")
        return page
    for workload in sorted(rows["workload"].unique()):
        w_rows = rows[rows["workload"] == workload]
        x = ctx.x_param(w_rows)
        if x is not None:
            w_rows = w_rows[w_rows[x].notna()]
            fig = line_figure(ctx, w_rows, x, y_title="time per call (s, log)", hover_value="%{y:.3s}s")
            page.figure(fig, title=workload, workload=workload)
            continue
        # One size: nothing to scale over, so say so and still show the methods' times there.
        sizes = ", ".join(sorted({str(s) for s in w_rows["size"].dropna()})) or "no size parameter"
        bars = w_rows.assign(text=[format_value(v, "seconds") for v in w_rows["value"]])
        fig = grouped_bars(bars, y_title="time per call (s, log)", color=method_color, label=method_label,
                           order=method_order(w_rows["method"].unique()), hover="%{customdata}", log_y=True)
        page.figure(fig, title=workload, workload=workload, note=(
            f"Measured at one size only ({esc(sizes)}): no scaling to show, so these are the "
            "methods' times there. A full run (<code>VMAPBENCH_PROFILE=full make bench</code>) "
            "measures every size."))
    return page
