"""Figures as plain Plotly JSON dicts, one panel per (machine, device), legends listed once.

The views build trace and layout dicts directly instead of plotly.graph_objects: the objects
validate every property on assignment, which made a 1000-file build spend most of its time in
plotly.py. The dicts follow the Plotly JSON schema and are written with plotly.io.to_html.
"""
from __future__ import annotations

from typing import Any, Hashable, Iterable

import pandas as pd

MAX_COLUMNS = 3
PANEL_HEIGHT = 340
GRID = "#e8ecf2"
# A light theme in a few keys (instead of a full plotly template in every figure).
BASE_LAYOUT: dict[str, Any] = {
    "paper_bgcolor": "white", "plot_bgcolor": "white",
    "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12, "color": "#2a3f5f"},
    "margin": {"l": 64, "r": 20, "t": 36, "b": 50},
    "hoverlabel": {"align": "left"}, "hovermode": "closest", "legend": {"font": {"size": 11}},
}


def axis(**extra: Any) -> dict[str, Any]:
    base = {"gridcolor": GRID, "linecolor": "#b8c2d0", "zeroline": False, "automargin": True,
            "exponentformat": "SI"}
    base.update(extra)
    return base


def records(rows: pd.DataFrame, columns: list[str]) -> list[tuple]:
    """Rows as plain tuples of `columns`: grouping a few hundred rows in Python beats pandas'
    per-group overhead by an order of magnitude."""
    return list(zip(*(rows[c].tolist() for c in columns))) if len(rows) else []


def epoch_ms(dates: pd.Series) -> list[int]:
    """UTC datetimes as milliseconds since the epoch (a date axis reads them directly)."""
    return ((dates - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)).tolist()


def panel_keys(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """(machine, device) pairs of `rows`, machines alphabetically, cpu before other devices."""
    pairs = rows[["machine", "device"]].drop_duplicates().itertuples(index=False)
    return sorted(((str(m), str(d)) for m, d in pairs), key=lambda p: (p[0], p[1] != "cpu", p[1]))


class Panels:
    """A figure with one subplot per key; `add` places a trace dict in its key's panel.

    Keys default to (machine, device) pairs titled 'machine · device'. Shared y axes match the
    first panel's and show tick labels on the first column only, like make_subplots(shared_yaxes).
    """

    def __init__(self, keys: Iterable[Hashable], *, titles: Iterable[str] | None = None,
                 shared_y: bool = True, x_title: str = "", y_title: str = "", log_x: bool = False,
                 log_y: bool = False, x_extra: dict | None = None, y_extra: dict | None = None,
                 panel_height: int = PANEL_HEIGHT) -> None:
        self.keys = list(keys) or [("", "")]
        names = list(titles) if titles is not None else [
            " · ".join(str(p) for p in k if p) if isinstance(k, tuple) else str(k) for k in self.keys]
        cols = min(MAX_COLUMNS, len(self.keys))
        rows = -(-len(self.keys) // cols)
        hgap, vgap = (0.05 if cols > 1 else 0.0), (0.1 if rows > 1 else 0.0)
        width, height = (1 - hgap * (cols - 1)) / cols, (1 - vgap * (rows - 1)) / rows
        self.data: list[dict[str, Any]] = []
        self.layout: dict[str, Any] = {"height": panel_height * rows + 70, "annotations": [], "shapes": []}
        self.ref: dict[Hashable, tuple[str, str]] = {}
        self.legend: set[str] = set()
        for i, key in enumerate(self.keys):
            r, c = divmod(i, cols)
            n = "" if i == 0 else str(i + 1)
            x0 = c * (width + hgap)
            y1 = 1 - r * (height + vgap)
            xa = axis(domain=[x0, x0 + width], anchor=f"y{n}", **(x_extra or {}))
            ya = axis(domain=[y1 - height, y1], anchor=f"x{n}", **(y_extra or {}))
            if log_x:
                xa["type"] = "log"
            if log_y:
                ya["type"] = "log"
            if r == rows - 1 or i + cols >= len(self.keys):
                xa["title"] = {"text": x_title}
            if c == 0:
                ya["title"] = {"text": y_title}
            elif shared_y:
                ya["matches"] = "y"
                ya["showticklabels"] = False
            self.layout[f"xaxis{n}"] = xa
            self.layout[f"yaxis{n}"] = ya
            self.ref[key] = (f"x{n}", f"y{n}")
            if names[i]:
                self.layout["annotations"].append({
                    "text": names[i], "x": x0 + width / 2, "y": y1, "xref": "paper", "yref": "paper",
                    "xanchor": "center", "yanchor": "bottom", "showarrow": False, "font": {"size": 13}})

    def add(self, trace: dict[str, Any], *key: Hashable) -> None:
        """Add `trace` to the panel of `key` (machine, device by default); one legend entry per name."""
        k = key[0] if len(key) == 1 and key[0] in self.ref else tuple(str(p) for p in key)
        xref, yref = self.ref.get(k, ("x", "y"))
        trace["xaxis"], trace["yaxis"] = xref, yref
        name = trace.get("name", "")
        trace.setdefault("legendgroup", name)
        trace["showlegend"] = name not in self.legend
        self.legend.add(name)
        self.data.append(trace)

    def x_axis(self, *key: Hashable) -> dict[str, Any]:
        """The layout dict of the x axis of `key`'s panel (to set per-panel properties)."""
        k = key[0] if len(key) == 1 and key[0] in self.ref else tuple(str(p) for p in key)
        return self.layout["xaxis" + self.ref[k][0][1:]]

    def hline(self, y: float) -> None:
        """A dotted horizontal line at `y` across every panel."""
        for xref, yref in self.ref.values():
            self.layout["shapes"].append({
                "type": "line", "xref": f"{xref} domain", "x0": 0, "x1": 1, "yref": yref, "y0": y, "y1": y,
                "line": {"color": "#555", "dash": "dot", "width": 1}})

    @property
    def fig(self) -> dict[str, Any]:
        return {"data": self.data, "layout": self.layout}


BYTE_UNITS = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def byte_scale(values: Iterable[float]) -> tuple[float, str]:
    """(divisor, unit name) that puts the largest of `values` between 1 and 1024 (MiB, GiB...)."""
    top = max((abs(v) for v in values if v == v), default=0.0)
    return next(((d, u) for d, u in BYTE_UNITS if top >= d), BYTE_UNITS[-1])


def error_bar(values: list[float], lo: list[float] | None, hi: list[float] | None) -> dict[str, Any] | None:
    """A Plotly asymmetric error_y from interval bounds (None where no bound is known)."""
    if lo is None or hi is None:
        return None
    plus = [h - v if h == h and v == v else None for v, h in zip(values, hi)]
    minus = [v - lo_ if lo_ == lo_ and v == v else None for v, lo_ in zip(values, lo)]
    if all(not p for p in plus) and all(not m for m in minus):
        return None  # no interval known (n=1): no bar rather than a bar of zero length
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus,
            "thickness": 1.2, "width": 3, "color": "#333"}


def grouped_bars(rows: pd.DataFrame, *, y_title: str, color: Any, label: Any, order: list[str],
                 hover: str, divisor: float = 1.0, log_y: bool = False, shared_y: bool = True) -> dict[str, Any]:
    """One panel per (machine, device); x = size label, one bar per method (colors/legend by method).

    `rows` has machine, device, workload, size, method, value and optionally lo/hi (an interval
    drawn as an error bar) and text (the bar's hover reading); values are divided by `divisor`."""
    from dashboards.theme import natural_key

    panels = Panels(panel_keys(rows), y_title=y_title, log_y=log_y, x_title="size",
                    x_extra={"type": "category"}, shared_y=shared_y)
    cols = ["machine", "device", "method", "workload", "size", "value"]
    extra = [c for c in ("lo", "hi", "text") if c in rows.columns]
    groups: dict[tuple, list[tuple]] = {}
    for rec in records(rows, cols + extra):
        groups.setdefault((rec[0], rec[1], rec[2]), []).append(rec)
    rank = {m: i for i, m in enumerate(order)}
    for (machine, device, method), recs in sorted(groups.items(), key=lambda kv: rank.get(kv[0][2], len(rank))):
        recs.sort(key=lambda r: natural_key(r[4]))
        got = {name: [r[len(cols) + i] for r in recs] for i, name in enumerate(extra)}
        values = [r[5] / divisor for r in recs]
        trace: dict[str, Any] = {
            "type": "bar", "x": [str(r[4]) for r in recs], "y": values, "name": label(method),
            "legendgroup": method, "offsetgroup": method, "marker": {"color": color(method)},
            "meta": {"machine": machine, "device": device, "workload": recs[0][3]},
            "hovertemplate": f"<b>{label(method)}</b> %{{x}}<br>{hover}<extra></extra>",
        }
        if "text" in got:
            trace["customdata"] = got["text"]
        if "lo" in got and "hi" in got:
            err = error_bar(values, [v / divisor for v in got["lo"]], [v / divisor for v in got["hi"]])
            if err:
                trace["error_y"] = err
        panels.add(trace, machine, device)
    panels.layout.update(barmode="group", bargap=0.25)
    return panels.fig


def ratio_bars(machine: str, bars: list[dict[str, Any]], *, y_title: str, hover: str, label: Any,
               color: Any, order: list[str]) -> dict[str, Any]:
    """Grouped log-scale bars of ratios with their intervals, one panel per device of `machine`,
    a dotted line at 1×. Each bar: {method, device, workload, x, est (a stats.Estimate),
    customdata (a list)}; one trace per bar so the workload filter can hide it (legends follow)."""
    panels = Panels(sorted({(machine, str(b["device"])) for b in bars}, key=lambda k: (k[1] != "cpu", k[1])),
                    y_title=y_title, log_y=True, panel_height=370)
    rank = {m: i for i, m in enumerate(order)}
    for b in sorted(bars, key=lambda b: (rank.get(b["method"], len(rank)), str(b["x"]))):
        est = b["est"]
        trace = {"type": "bar", "x": [b["x"]], "y": [est.value], "name": label(b["method"]),
                 "legendgroup": b["method"], "offsetgroup": b["method"], "marker": {"color": color(b["method"])},
                 "meta": {"machine": machine, "device": b["device"], "workload": b["workload"]},
                 "customdata": [b["customdata"]],
                 "hovertemplate": f"<b>{label(b['method'])}</b> %{{x}}<br>{hover}<extra></extra>"}
        err = error_bar([est.value], [est.lo], [est.hi])
        if err:
            trace["error_y"] = err
        panels.add(trace, machine, b["device"])
    panels.hline(1.0)
    panels.layout.update(barmode="group", bargap=0.2)
    for name in list(panels.layout):
        if name.startswith("xaxis"):
            panels.layout[name]["tickangle"] = -30
    return panels.fig
