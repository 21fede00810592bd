"""Time to N: cumulative seconds from a fresh process to the N-th call, log-log, one line per curve.

Reads each machine's newest results/time_to_n/<machine>/<commit8>.json (`vmapbench time-to-n
--all --write`, format in workloads.time_to_n). Per workload one figure, one panel per machine
and device, one line per method (warm-cache curves dashed), and a star where the default path's
cold curve crosses another method's: the N from which one of them has cost less in all. Two
tables give the default path's cold time over jax.jit's at each N, counted from the first call
and from process start.
"""
from __future__ import annotations

import math
import warnings

from dashboards.context import Context
from dashboards.figures import Panels
from dashboards.loader import CorruptResultWarning
from dashboards.page import Page, esc, project_path, table
from dashboards.theme import method_color
from workloads import time_to_n as ttn


def _reports(ctx: Context) -> list[tuple[dict, list[ttn.Curve]]]:
    folder = ctx.results.results_dir
    out = []
    for path in ttn.newest(folder) if folder else []:
        try:
            doc, curves = ttn.load(path)
        except ValueError as exc:
            warnings.warn(f"skipping {path}: {exc}", CorruptResultWarning, stacklevel=2)
            continue
        doc["file"] = project_path(path)
        out.append((doc, curves))
    return out


def figure(reports: list[tuple[dict, list[ttn.Curve]]], workload: str) -> dict:
    keys = [(doc["machine"], doc["device"]) for doc, _ in reports]
    panels = Panels(keys, x_title="calls N (log)", y_title="seconds from the first call (log)", log_x=True, log_y=True)
    for doc, curves in reports:
        machine, device = doc["machine"], doc["device"]
        group = [c for c in curves if c.workload == workload and c.points]
        for c in group:
            start = c.first_call_at_s or 0.0
            panels.add({
                "type": "scatter", "x": [p[0] for p in c.points], "y": [p[1] for p in c.points],
                "mode": "lines+markers", "name": c.label, "marker": {"size": 5},
                "line": {"color": method_color(c.method), "dash": "dash" if c.cache == "warm" else "solid"},
                "meta": {"machine": machine, "device": device, "workload": workload},
                "customdata": [[f"{p[1] + start:.3g}"] for p in c.points],
                "hovertemplate": (f"<b>{esc(c.label)}</b><br>N=%{{x}}: %{{y:.3g}} s from the first call, "
                                  f"%{{customdata[0]}} s from process start<extra></extra>"),
            }, machine, device)
        ours = next((c for c in group if c.method in ttn.OURS and c.cache == "cold"), None)
        if ours is None:
            continue
        for other in group:
            if other is ours or other.method in ttn.OURS:
                continue
            for n, s in ttn.crossovers(ours.points, other.points):
                panels.add({
                    "type": "scatter", "x": [n], "y": [s], "mode": "markers", "name": "crossover",
                    "marker": {"symbol": "star", "size": 14, "color": method_color(other.method),
                               "line": {"color": "#222", "width": 1}},
                    "meta": {"machine": machine, "device": device, "workload": workload},
                    "hovertemplate": (f"<b>{esc(ours.label)} crosses {esc(other.label)}</b><br>N≈{n:.3g}, "
                                      f"{s:.3g} s<extra></extra>"),
                }, machine, device)
    return panels.fig


def _ratio_cell(value: float | None) -> tuple[str, float | None]:
    if value is None or not math.isfinite(value):
        return "–", None
    css = "vb-good" if value <= 1.0 else "vb-bad" if value > 1.5 else ""
    return f'<span class="{css}">{value:.2f}×</span>', value


def render(ctx: Context) -> Page:
    page = Page("time_to_n.html", "Time to N", intro=(
        "<p>What a process that starts, calls a function N times and ends pays: the cumulative wall "
        "time from the start of the first call to the return of the N-th, each curve in its own fresh "
        "process (imports and setup apart; hover for the time from process start). The default path "
        "runs with an empty inductor cache (cold) and again on the cache the cold run left (warm, "
        "dashed). A star marks where the default path's cold curve crosses another method's. "
        "Written by <code>vmapbench time-to-n --all --write</code>.</p>"))
    reports = _reports(ctx)
    if not reports:
        page.notice("No time-to-N results under <code>results/time_to_n/</code>: run "
                    "<code>vmapbench time-to-n --all --write</code>.", "warn")
        return page
    for doc, _ in reports:
        page.notice(esc(ttn.header(doc)) + f" File: <code>{esc(doc['file'])}</code>.")
    ns = sorted({int(n) for doc, _ in reports for n in doc["ns"]})
    for title, from_start in (("from the first call", False), ("from process start", True)):
        rows = []
        for doc, curves in reports:
            for (workload, size), group in ttn.by_workload(curves).items():
                cells = [(esc(workload), workload), (esc(size), size), (esc(doc["machine"]), doc["machine"])]
                cells += [_ratio_cell(ttn.ours_over_jax(group, n, from_start)) for n in ns]
                rows.append((cells, {"machine": doc["machine"], "device": doc["device"], "workload": workload}))
        page.add(f"<h2>Ours (cold cache) / jax.jit, time to N {title}</h2>"
                 + table(["workload", "size", "machine"] + [f"N={n}" for n in ns], rows))
    workloads = list(dict.fromkeys(c.workload for _, curves in reports for c in curves))
    for workload in workloads:
        notes = [f"{esc(c.label)}: {esc(c.status)}: {esc(c.note)}" for _, curves in reports for c in curves
                 if c.workload == workload and c.note]
        page.figure(figure(reports, workload), title=workload, workload=workload, note="<br>".join(notes))
    return page
