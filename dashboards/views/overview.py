"""Overview: how much faster than the for-loop each method is, per workload, at the latest commit.

Speedups measured in one process by the suite (`track_speedup_vs_loop`) are preferred: they are
the stable figure on a noisy machine. Where a suite does not record them, the speedup is the
ratio of asv's median times (`time_run`) of the loop and the method at the same commit.
"""
from __future__ import annotations

import math

import pandas as pd

from dashboards.context import TIME_METRIC, Context
from dashboards.figures import Panels, panel_keys
from dashboards.page import Page, esc, table
from dashboards.regressions import latest_changes
from dashboards.theme import (BASELINE_METHOD, REFERENCE_METHOD, format_value, method_color,
                              method_label, method_order)

SPEEDUP_METRIC = "speedup_vs_loop"
KEY = ["machine", "device", "workload", "size"]


def speedups(ctx: Context) -> pd.DataFrame:
    """Latest-commit rows of every (machine, device, workload, size, method) with its speedup."""
    rows = ctx.latest_commit_rows
    times = rows[rows["metric"] == TIME_METRIC]
    if times.empty:
        return pd.DataFrame(columns=KEY + ["method", "time", "loop_time", "speedup", "source"])
    times = times.groupby(KEY + ["method"], dropna=False, as_index=False)["value"].median()
    times = times.rename(columns={"value": "time"})
    loop = times[times["method"] == BASELINE_METHOD].set_index(KEY)["time"].rename("loop_time")
    out = times.join(loop, on=KEY)
    out["speedup"] = out["loop_time"] / out["time"]
    out["source"] = "ratio of median times"
    measured = rows[rows["metric"] == SPEEDUP_METRIC]
    if not measured.empty:
        measured = measured.groupby(KEY + ["method"], dropna=False)["value"].median().rename("measured")
        out = out.join(measured, on=KEY + ["method"])
        has = out["measured"].notna()
        out.loc[has, "speedup"] = out.loc[has, "measured"]
        out.loc[has, "source"] = "measured in one process"
        out = out.drop(columns="measured")
    return out


def headline(ctx: Context, sp: pd.DataFrame) -> pd.DataFrame:
    """Per (machine, device, workload): the largest size that has a loop baseline."""
    if sp.empty:
        return sp
    base = sp[sp["loop_time"].notna()].copy()
    if base.empty:
        return base
    sizes = ctx.latest_commit_rows.drop_duplicates(KEY)
    scale = ctx.scale(sizes)
    sizes = sizes.assign(_scale=scale)[KEY + ["_scale"]]
    base = base.merge(sizes, on=KEY, how="left")
    best = base.sort_values("_scale", kind="stable").groupby(["machine", "device", "workload"],
                                                                dropna=False)["size"].last()
    keep = base.set_index(["machine", "device", "workload"]).index.map(best.to_dict())
    return base[base["size"].to_numpy() == keep.to_numpy()].drop(columns="_scale")


def _speedup_figure(machine: str, data: pd.DataFrame) -> dict:
    """Grouped bars per workload, one bar per method, one panel per device of `machine`."""
    panels = Panels(panel_keys(data), y_title="speedup over the for-loop (×, log; dotted: 1×)",
                    log_y=True, panel_height=380)
    order = method_order(data["method"].unique())
    records = sorted(data.itertuples(index=False), key=lambda r: (order.index(r.method), str(r.workload)))
    for r in records:
        method, workload = r.method, r.workload
        if method == BASELINE_METHOD:
            continue
        panels.add({
            "type": "bar", "x": [workload], "y": [r.speedup], "name": method_label(method),
            "legendgroup": method, "offsetgroup": method, "marker": {"color": method_color(method)},
            "meta": {"machine": machine, "device": r.device, "workload": workload},
            "customdata": [[r.size, format_value(r.time, "seconds"),
                            format_value(r.loop_time, "seconds"), r.source]],
            "hovertemplate": (f"<b>{esc(method_label(method))}</b><br>%{{x}} (%{{customdata[0]}})"
                              "<br>speedup %{y:.3g}×<br>time %{customdata[1]}, loop %{customdata[2]}"
                              "<br>%{customdata[3]}<extra></extra>"),
        }, machine, r.device)
    panels.hline(1.0)
    panels.layout.update(barmode="group", bargap=0.2)
    for name in list(panels.layout):
        if name.startswith("xaxis"):
            panels.layout[name]["tickangle"] = -30
    return panels.fig


def _headline_table(data: pd.DataFrame) -> str:
    methods = method_order(data["method"].unique())
    headers = ["machine", "device", "workload", "size"] + [method_label(m) for m in methods] + [
        "engine ÷ torch.func", "engine ÷ closed form"]
    rows = []
    for (machine, device, workload, size), group in data.groupby(KEY, dropna=False, sort=True):
        by = group.set_index("method")
        cells = [(esc(machine), machine), (esc(device), device), (esc(workload), workload),
                 (esc(size), size)]
        for m in methods:
            if m in by.index:
                t, s = by.at[m, "time"], by.at[m, "speedup"]
                extra = "" if m == BASELINE_METHOD or pd.isna(s) else f" <small>({s:.3g}×)</small>"
                cells.append((format_value(t, "seconds") + extra, t))
            else:
                cells.append(("—", None))
        for other in (REFERENCE_METHOD, "closed_form"):
            if "engine" in by.index and other in by.index:
                ratio = by.at["engine", "time"] / by.at[other, "time"]
                cells.append((f"{ratio:.3g}×", ratio))
            else:
                cells.append(("—", None))
        rows.append((cells, {"machine": machine, "device": device, "workload": workload}))
    return table(headers, rows)


def render(ctx: Context) -> Page:
    page = Page("index.html", "Overview", intro=(
        "<p>How much faster than a Python for-loop of <code>torch.autograd.grad</code> each method "
        "is, per workload, at each machine's <b>latest commit</b> and the largest size measured "
        "with the loop. Bars above the dotted line beat the loop; the log scale makes 2× and 0.5× "
        "the same distance from it. Where the suite records a speedup measured in one process "
        "(<code>track_speedup_vs_loop</code>) that figure is used, otherwise the ratio of asv's "
        "median times; the hover says which. The table has the times behind the bars and where "
        "the engine stands against torch.func and the closed form (below 1× is faster). "
        f"{ctx.measured_note()}</p>"))
    if ctx.frame.empty:
        page.notice("No ASV results found. Run <code>make bench</code> (or <code>asv run</code>) to "
                    "produce them, then <code>make dashboard</code>.", "warn")
        return page
    page.add(_changes_box(ctx))
    sp = speedups(ctx)
    head = headline(ctx, sp)
    if head.empty:
        page.notice("The latest commit has no timed loop baseline, so there is no speedup to show. "
                    "See Scaling and History for the raw times.", "warn")
        return page
    plotted = head[head["method"] != BASELINE_METHOD]
    plotted = plotted[plotted["speedup"].map(lambda v: v is not None and math.isfinite(v) and v > 0)]
    for machine in sorted(plotted["machine"].unique()):
        data = plotted[plotted["machine"] == machine]
        commit = ctx.latest_commits.get(machine, "")
        page.figure(_speedup_figure(machine, data), title=f"Speedup over the for-loop — {machine}",
                    note=f"commit <code>{esc(commit[:8])}</code>", machine=machine)
    page.add('<h2>Times at the latest commit</h2><div class="vb-scroll">' + _headline_table(head) + "</div>")
    return page


def _changes_box(ctx: Context) -> str:
    changes = latest_changes(ctx)
    if not changes:
        return ('<div class="vb-notice vb-info">Only one commit per machine so far: the '
                '<a href="history.html" data-vb-nav="history.html">History</a> view fills in as '
                'commits are benchmarked.</div>')
    items = []
    for c in changes:
        if not c["total"]:
            items.append(f'<li class="vb-f" data-machine="{esc(c["machine"])}"><b>{esc(c["machine"])}</b> '
                         f'<code>{esc(c["base"][:8])}</code> → <code>{esc(c["head"][:8])}</code>: no timed '
                         'workload benchmark in common, nothing to compare.</li>')
            continue
        worse = c["slower"]
        kind = "vb-bad" if worse else "vb-good"
        items.append(
            f'<li class="vb-f" data-machine="{esc(c["machine"])}"><b>{esc(c["machine"])}</b> '
            f'<code>{esc(c["base"][:8])}</code> → <code>{esc(c["head"][:8])}</code>: '
            f'<span class="{kind}">{len(worse)} slower</span>, {len(c["faster"])} faster '
            f'(by more than {c["factor"]:.2g}×) of {c["total"]} compared. '
            + (f'Worst: {esc(worse[0]["label"])} {worse[0]["ratio"]:.2f}×. ' if worse else "")
            + f'{c["flagged"]} series flagged by the regression detector.</li>')
    return ('<div class="vb-notice vb-info"><b>Did the last commit make anything slower?</b><ul>'
            + "".join(items) + '</ul>Details: <a href="compare.html" data-vb-nav="compare.html">'
            'Compare</a>, <a href="history.html" data-vb-nav="history.html">History</a>.</div>')
