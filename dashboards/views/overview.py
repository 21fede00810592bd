"""Overview: how much faster than the for-loop each method is, per workload, at the latest commit.

Speedups measured in one process by the suite (`track_speedup_vs_loop`) are preferred: they are
the stable figure on a noisy machine. Where a suite does not record them, the speedup is the
ratio of asv's median times (`time_run`) of the loop and the method at the same commit.
"""
from __future__ import annotations

import math

import pandas as pd

from dashboards.context import Context
from dashboards.figures import ratio_bars
from dashboards.numbers import Figure, fastest, figure_of, format_estimate, rows_by
from dashboards.page import Page, esc, table
from dashboards.regressions import latest_changes
from dashboards.theme import BASELINE_METHOD, method_color, method_label, method_order
from measuring import stats

KEY = ["machine", "device", "workload", "size"]


def speedups(ctx: Context) -> pd.DataFrame:
    """The cell table (dashboards.numbers.cell_table) of each run's latest commit."""
    return ctx.latest_cells


def headline(ctx: Context, sp: pd.DataFrame) -> pd.DataFrame:
    """Per (machine, device, workload): the largest size that has a speedup over the loop."""
    if sp.empty or "speedup" not in sp:
        return sp.iloc[0:0]
    base = sp[sp["speedup"].notna()]
    if base.empty:
        return base
    sizes = ctx.latest_commit_rows.drop_duplicates(KEY)
    sizes = sizes.assign(_scale=ctx.scale(sizes))[KEY + ["_scale"]]
    base = base.merge(sizes, on=KEY, how="left")
    best = base.sort_values("_scale", kind="stable").groupby(["machine", "device", "workload"],
                                                                dropna=False)["size"].last()
    keep = base.set_index(["machine", "device", "workload"]).index.map(best.to_dict())
    chosen = base[base["size"].to_numpy() == keep.to_numpy()].drop(columns="_scale")
    return sp.merge(chosen[KEY].drop_duplicates(), on=KEY)


def _speedup_figure(machine: str, data: pd.DataFrame) -> dict:
    """Grouped bars per workload, one bar per method with its interval, one panel per device."""
    bars = []
    for r in data[data["method"] != BASELINE_METHOD].to_dict("records"):
        f, t = figure_of(r, "speedup"), figure_of(r, "time")
        bars.append({"method": r["method"], "device": r["device"], "workload": r["workload"], "x": r["workload"],
                     "est": f.est, "customdata": [r["size"], f.text(), t.text("seconds") if t else "n/a", f.source]})
    return ratio_bars(machine, bars, y_title="speedup over the for-loop (×, log; dotted: 1×)",
                      hover="(%{customdata[0]})<br>speedup %{customdata[1]}<br>time %{customdata[2]}"
                            "<br>%{customdata[3]}", label=lambda m: esc(method_label(m)), color=method_color,
                      order=method_order(data["method"].unique()))


def _headline_table(data: pd.DataFrame) -> str:
    """One row per (device, workload, size) of one machine: each method's speedup over the loop
    with its interval (the bars' figure) and its time as context; the fastest method marked."""
    methods = method_order(data["method"].unique())
    headers = ["device", "workload · size"] + [method_label(m) for m in methods] + ["engine ÷ torch.func"]
    rows = []
    for (machine, device, workload, size), group in rows_by(data, KEY):
        by = {r["method"]: r for r in group}
        figs = {m: figure_of(by[m], "speedup") if m in by else None for m in methods}
        if BASELINE_METHOD in figs and figs[BASELINE_METHOD] is not None:  # 1 by definition
            figs[BASELINE_METHOD] = Figure(stats.Estimate(1.0, 1.0, 1.0, 1), "the baseline")
        best = fastest(list(figs.items()))
        cells = [(esc(device), device), (f"<b>{esc(workload)}</b><br><small>{esc(size)}</small>", workload)]
        for m in methods:
            if m not in by:
                cells.append(("—", None))
                continue
            f, t = figs[m], figure_of(by[m], "time")
            if m == BASELINE_METHOD:
                main = "baseline"
            else:
                main = f'<span class="vb-fig" data-cell="{esc(cell_id(machine, device, workload, size, m))}">' \
                       f"{esc(f.text())}</span>" if f else "n/a"
            cid = esc(cell_id(machine, device, workload, size, m))
            context = f'<br><small class="vb-time" data-cell="{cid}">{esc(t.text("seconds"))}</small>' if t else ""
            mark = ' class="vb-best" title="fastest in this row"' if m == best else ""
            cells.append((f"<div{mark}>{main}{context}</div>", f.est.value if f else None))
        engine = figure_of(by["engine"], "vs_ref") if "engine" in by else None
        cells.append((esc(engine.text()) if engine else "—", engine.est.value if engine else None))
        rows.append((cells, {"machine": machine, "device": device, "workload": workload}))
    return table(headers, rows, css="vb-compact")


def cell_id(machine: str, device: str, workload: str, size: str, method: str) -> str:
    """The id pages give one Overview cell, so the browser test can find the same cell elsewhere."""
    return "|".join(str(x) for x in (machine, device, workload, size, method))


def render(ctx: Context) -> Page:
    page = Page("index.html", "Overview", intro=(
        "<p>How much faster than a Python for-loop of <code>torch.autograd.grad</code> each method "
        "is, per workload, at each run's <b>latest commit</b> and the largest size measured with "
        "the loop. Bars above the dotted line beat the loop; the log scale makes 2× and 0.5× the "
        "same distance from it. The figure is the suite's in-process speedup "
        "(<code>track_speedup_vs_loop</code>: the loop and the method timed interleaved in one "
        "process, so machine load cancels out) with its interval as the error bar; only where a "
        "suite did not record it is the ratio of asv's median times used (the hover says which). "
        "The table prints the same figures with each method's time per call below, frames the "
        "fastest method of each row and gives engine ÷ torch.func "
        "(<code>track_ratio_vs_torch_func</code>, below 1× is faster); the closed-form distance is "
        f"on <a href=\"peers.html\" data-vb-nav=\"peers.html\">Peers &amp; limits</a>. {ctx.measured_note()}</p>"))
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
    page.add("<h2>Speedups at the latest commit</h2><p class=\"vb-note\">Each cell: the speedup over "
             "the for-loop with its interval (the bar's figure), the time per call below it; the "
             "fastest method of the row is framed.</p>")
    for machine in sorted(head["machine"].unique()):
        page.add(f'<h3 class="vb-f" data-machine="{esc(machine)}">{esc(machine)} · commit '
                 f'<code>{esc(ctx.latest_commits.get(machine, "")[:8])}</code></h3>'
                 + _headline_table(head[head["machine"] == machine]))
    return page


def _changes_box(ctx: Context) -> str:
    """What each run's latest commit changed: the verdicts Compare shows for the same pair."""
    changes = latest_changes(ctx)
    if not changes:
        return ('<div class="vb-notice vb-info">Only one commit per run so far: the '
                '<a href="history.html" data-vb-nav="history.html">History</a> view fills in as '
                'commits are benchmarked.</div>')
    items = []
    for c in changes:
        head = (f'<li class="vb-f vb-change" data-machine="{esc(c["machine"])}"><b>{esc(c["machine"])}</b> '
                f'<code>{esc(c["base"][:8])}</code> → <code>{esc(c["head"][:8])}</code>: ')
        if not c["total"]:
            items.append(head + "no benchmark in common, nothing to compare.</li>")
            continue
        n = c["counts"]
        worse = c["slower"]
        kind = "vb-bad" if c["gated_slower"] else ("vb-warn-text" if worse else "vb-good")
        text = (f'<span class="{kind}">{n.get("slower", 0)} slower</span> '
                f'({c["gated_slower"]} of them gated in-process ratios), {n.get("faster", 0)} faster, '
                f'{n.get("unchanged", 0)} unchanged, {n.get("not judged", 0)} not judged, of '
                f'{c["total"]} compared')
        if worse:
            w = worse[0]
            ci = format_estimate(stats.Estimate(w["ratio"], w["lo"], w["hi"], 2), "x")
            text += f'. Most certain: {esc(w["label"])} {esc(ci)}'
        items.append(head + text + f'. {c["flagged"]} series flagged by the step detector.</li>')
    return ('<div class="vb-notice vb-info"><b>Did the last commit make anything slower?</b> '
            "A change counts only when its whole interval lies beyond the benchmark's noise floor "
            "(the gate's rule, <code>measuring.stats.verdict</code>); the gate acts on the in-process "
            "ratios only.<ul>" + "".join(items) + '</ul>Details: <a href="compare.html" '
            'data-vb-nav="compare.html">Compare</a> (same pair, same counts), <a href="history.html" '
            'data-vb-nav="history.html">History</a>.</div>')
