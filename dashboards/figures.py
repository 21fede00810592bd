"""Figure helpers shared by the views: one panel per (machine, device), legends listed once."""
from __future__ import annotations

from typing import Any, Iterable

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

MAX_COLUMNS = 3
PANEL_HEIGHT = 360


def panel_keys(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """(machine, device) pairs of `rows`, machines alphabetically, cpu before other devices."""
    pairs = rows[["machine", "device"]].drop_duplicates().itertuples(index=False)
    return sorted(((str(m), str(d)) for m, d in pairs), key=lambda p: (p[0], p[1] != "cpu", p[1]))


class Panels:
    """A figure with one subplot per (machine, device); `add` places a trace in its panel."""

    def __init__(self, keys: Iterable[tuple[str, str]], *, shared_y: bool = True,
                 x_title: str = "", y_title: str = "", log_x: bool = False, log_y: bool = False) -> None:
        self.keys = list(keys) or [("", "")]
        cols = min(MAX_COLUMNS, len(self.keys))
        rows = -(-len(self.keys) // cols)
        self.where = {k: (i // cols + 1, i % cols + 1) for i, k in enumerate(self.keys)}
        titles = [f"{m} · {d}" if m or d else "" for m, d in self.keys]
        self.fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, shared_yaxes=shared_y,
                                 horizontal_spacing=0.06 if cols > 1 else 0.02,
                                 vertical_spacing=min(0.12, 0.3 / rows))
        self.legend: set[str] = set()
        self.fig.update_layout(height=PANEL_HEIGHT * rows + 60, hovermode="closest",
                               legend=dict(font=dict(size=11)))
        if log_x:
            self.fig.update_xaxes(type="log")
        if log_y:
            self.fig.update_yaxes(type="log")
        # SI prefixes (µ, m, k, M, G) read right for seconds and bytes; plotly's default writes 1B.
        self.fig.update_xaxes(exponentformat="SI")
        self.fig.update_yaxes(exponentformat="SI")
        for r in range(1, rows + 1):
            self.fig.update_yaxes(title_text=y_title, row=r, col=1)
        for c in range(1, cols + 1):
            self.fig.update_xaxes(title_text=x_title, row=rows, col=c)

    def add(self, trace: Any, machine: str, device: str) -> None:
        """Add `trace` to the (machine, device) panel; its legend entry appears once per name."""
        row, col = self.where.get((str(machine), str(device)), (1, 1))
        name = trace.name
        trace.legendgroup = trace.legendgroup or name
        trace.showlegend = name not in self.legend
        self.legend.add(name)
        self.fig.add_trace(trace, row=row, col=col)
