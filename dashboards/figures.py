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
