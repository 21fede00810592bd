"""History: the engine's figures per benchmark across commits, per run, with regressions flagged.

For every workload, each run (machine + asv env) gets three panels side by side: the time per
call, the in-process ratio engine / torch.func, and the in-process speedup over the loop. Raw
times move with the machine's load; the ratios, measured interleaved in one process, do not: a
step in the time with flat ratios is the machine, a step in the ratios is the engine.
Points carry their intervals (dashboards.numbers). Regressions come from asv's step detector
(dashboards.regressions) over the times and the engine/torch.func ratios, with the benchmark's
noise floor as threshold; red crosses mark the first commit of every slower level.
"""
from __future__ import annotations

import datetime as _dt
import functools

import pandas as pd

from dashboards.context import TIME_METRIC, Context
from dashboards.figures import Panels, epoch_ms, error_bar, panel_keys, records
from dashboards.numbers import REFERENCE_RATIO_METRIC, SPEEDUP_METRIC, estimate_columns, format_estimate
from dashboards.page import Page, esc, table
from dashboards.regressions import HISTORY_COMMITS, found_regressions
from dashboards.theme import format_value, method_color, method_label, method_order, natural_key
from measuring.stats import Estimate
from workloads.base import ENGINE_METHODS

SYMBOLS = ("circle", "square", "diamond", "triangle-up", "star", "hexagon")
# (metric, panel title, unit, log axis) of the panels of one run, left to right.
SERIES = ((TIME_METRIC, "time per call (s)", "seconds"),
          (REFERENCE_RATIO_METRIC, "engine ÷ torch.func (lower: better)", "x"),
          (SPEEDUP_METRIC, "speedup over the loop (higher: better)", "x"))


def _figure(ctx: Context, rows: pd.DataFrame, regressions: pd.DataFrame) -> dict:
    """Per (run, device): three panels (time, engine/torch.func, speedup over the loop), a line
    per engine method and size over the run's commits in commit-date order, red crosses at
    regressions."""
    present = [m for m in SERIES if (rows["metric"] == m[0]).any()]
    keys = [(machine, device, metric) for machine, device in panel_keys(rows) for metric, _, _ in present]
    names = {m: t for m, t, _ in SERIES}
    devices = {d for _, d, _ in keys}
    titles = [names[metric] + (f" · {device}" if len(devices) > 1 else "") for _, device, metric in keys]
    panels = Panels(keys, titles=titles, shared_y=False, x_title="commit (oldest → newest)", log_y=True,
                    x_extra={"type": "category", "categoryorder": "array", "tickangle": -45})
    for machine, device, metric in keys:
        shown = ctx.commits.get(machine, [])[-HISTORY_COMMITS:]
        panels.x_axis(machine, device, metric)["categoryarray"] = [c[:8] for c in shown]
    panels.layout["margin"] = {"l": 64, "r": 20, "t": 60, "b": 50}
    order = method_order(rows["method"].unique())
    sizes = sorted({str(s) for s in rows["size"].dropna().unique()}, key=natural_key)
    units = {m: u for m, _, u in SERIES}
    lines: dict[tuple, list[tuple]] = {}
    dates = epoch_ms(rows["date"])
    for (machine, device, metric, method, size, workload, commit, value, lo, hi, n), date in zip(
            records(rows, ["machine", "device", "metric", "method", "size", "workload", "commit",
                           "value", "lo", "hi", "n"]), dates):
        lines.setdefault((machine, device, metric, method, size, workload), []).append(
            (date, commit, value, lo, hi, n))
    for key in sorted(lines, key=lambda k: (order.index(k[3]), natural_key(k[4]))):
        machine, device, metric, method, size, workload = key
        points = sorted(lines[key])
        name = f"{method_label(method)} {size}"
        symbol = SYMBOLS[sizes.index(str(size)) % len(SYMBOLS)] if str(size) in sizes else "circle"
        texts = [format_estimate(Estimate(v, lo, hi, int(n)), units[metric]) for _, _, v, lo, hi, n in points]
        trace = {
            "type": "scatter", "x": [p[1][:8] for p in points], "y": [p[2] for p in points],
            "mode": "lines+markers", "name": name,
            "line": {"color": method_color(method), "width": 1.5}, "marker": {"symbol": symbol, "size": 6},
            "meta": {"machine": machine, "device": device, "workload": workload, "metric": metric,
                     "method": method, "size": size},
            "customdata": [[_when(p[0]), t] for p, t in zip(points, texts)],
            "hovertemplate": f"<b>{esc(name)}</b><br>commit %{{x}} (%{{customdata[0]}})<br>%{{customdata[1]}}<extra></extra>",
        }
        err = error_bar([p[2] for p in points], [p[3] for p in points], [p[4] for p in points])
        if err:
            trace["error_y"] = err
        panels.add(trace, machine, device, metric)
    for (machine, device, metric), reg in regressions.groupby(["machine", "device", "metric"], dropna=False,
                                                              observed=True):
        if (machine, device, metric) not in panels.ref:
            continue
        panels.add({
            "type": "scatter", "x": [c[:8] for c in reg["commit_after"]], "y": reg["after"].tolist(),
            "mode": "markers", "name": "regression",
            "marker": {"symbol": "x", "size": 13, "color": "#d62728", "line": {"width": 1}},
            "meta": {"machine": machine, "device": device, "workload": reg["workload"].iloc[0]},
            "customdata": [[f"{method_label(r.method)} {r.size}", r.commit_before[:8], r.commit_after[:8], r.ratio]
                           for r in reg.itertuples(index=False)],
            "hovertemplate": ("<b>regression</b> %{customdata[0]}<br>%{customdata[1]} → "
                              "%{customdata[2]}: %{customdata[3]:.2f}× slower<extra></extra>"),
        }, machine, device, metric)
    return panels.fig


@functools.lru_cache(maxsize=8192)
def _when(ms: int) -> str:
    """A commit date for the hover (cached: a few hundred commits, tens of thousands of points)."""
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _regression_table(regs: pd.DataFrame) -> str:
    regs = regs.sort_values("ratio", ascending=False)
    headers = ["run", "workload", "size", "method", "device", "metric", "last good", "first slow",
               "before", "after", "ratio"]
    rows = []
    for r in regs.itertuples(index=False):
        cells = [(esc(r.machine), r.machine), (esc(r.workload), r.workload), (esc(r.size), r.size),
                 (esc(method_label(r.method)), r.method), (esc(r.device), r.device),
                 (esc(r.metric), r.metric),
                 (f"<code>{esc(r.commit_before[:8])}</code>", r.commit_before),
                 (f"<code>{esc(r.commit_after[:8])}</code>", r.date_after.isoformat()),
                 (format_value(r.before, r.unit), r.before), (format_value(r.after, r.unit), r.after),
                 (f'<span class="vb-bad">{r.ratio:.2f}×</span>', r.ratio)]
        rows.append((cells, {"machine": r.machine, "device": r.device, "workload": r.workload}))
    return table(headers, rows)


def render(ctx: Context) -> Page:
    page = Page("history.html", "History", intro=(
        "<p>The engine's methods (<code>engine</code>, <code>engine_traced</code>, "
        "<code>engine_compiled</code>, ...) for every workload and size across commits in "
        f"commit-date order, newest {HISTORY_COMMITS} commits per run. Each run (machine and asv "
        "env; continuous runs only with <code>vmapbench dashboard --continuous</code>) has three "
        "panels: the time per call, and the two ratios the suite measures interleaved in one "
        "process: engine ÷ torch.func and the speedup over the loop. A busy machine moves the "
        "time but not the ratios; a change in the engine moves both. Error bars are the values' "
        "intervals (hover for the figures). Red crosses mark regressions found by asv's step "
        "detector (a penalized L1 fit, the one <code>asv publish</code> uses) in the times and "
        "the engine ÷ torch.func ratios: a step up beyond the benchmark's noise floor "
        "(<code>measuring.stats.noise_floor</code>, the threshold Compare and the gate use) that "
        "later commits do not undo, at the first commit of the slower level; it needs three "
        f"commits of a series. Other methods are in Compare. {ctx.measured_note()}</p>"))
    rows = ctx.metric_rows((TIME_METRIC, REFERENCE_RATIO_METRIC, SPEEDUP_METRIC))
    if rows.empty:
        page.notice("No timed workload results yet: run <code>make bench</code>.", "warn")
        return page
    if max(len(c) for c in ctx.commits.values()) < 2:
        page.notice("Only one commit per run so far, so there is no history to draw. Each "
                    "<code>make bench</code> on a new commit adds one point.")
        return page
    engine = ctx.of_commits(rows[rows["method"].isin(list(ENGINE_METHODS))], HISTORY_COMMITS)
    engine = estimate_columns(engine)
    regressions = found_regressions(ctx)
    if engine.empty:
        page.notice("No engine method was timed in these results.", "warn")
    for (workload, machine), w_rows in engine.groupby(["workload", "machine"], observed=True, sort=True):
        w_regs = regressions[(regressions["workload"] == workload) & (regressions["machine"] == machine)]
        page.figure(_figure(ctx, w_rows, w_regs), title=f"{workload} — {machine}", workload=workload,
                    machine=machine)
    page.add("<h2>Regressions</h2>")
    if regressions.empty:
        page.notice("The step detector found no regression in these results.", "good")
    else:
        page.add(_regression_table(regressions))
    return page
