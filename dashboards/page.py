"""The page shell shared by every view: navigation, filter bar, figure cards, footer.

Pages load plotly.js from the output folder's assets/ through a relative <script src>, so the
folder opens from file:// with no network. Filters work on what the page embeds: every Plotly
trace carries `meta` = {machine, device, workload} and every filterable HTML element carries
data-machine / data-device / data-workload; assets/dashboard.js hides what does not match.
"""
from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import plotly.io as pio

from dashboards.figures import BASE_LAYOUT

PROJECT = Path(__file__).resolve().parents[1]


def project_path(path: str | Path, project: Path = PROJECT) -> str:
    """`path` as a page names it: relative to the project ('results') when it lies inside it, so a
    page built on one machine does not carry that machine's folders; else as given."""
    target = Path(path).resolve()
    try:
        return target.relative_to(project.resolve()).as_posix() or "."
    except ValueError:
        return os.fspath(path)


# (file, nav title); the order of the navigation bar.
PAGES: tuple[tuple[str, str], ...] = (
    ("index.html", "Overview"),
    ("peers.html", "Peers & limits"),
    ("scaling.html", "Scaling"),
    ("memory.html", "Memory"),
    ("devices.html", "Devices"),
    ("history.html", "History"),
    ("compare.html", "Compare"),
    ("coverage.html", "Engine coverage"),
    ("compilers.html", "Compilers"),
    ("torch_versions.html", "Torch versions"),
    ("profiles.html", "Profiles"),
    ("time_to_n.html", "Time to N"),
)
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True,
                 "toImageButtonOptions": {"format": "png", "scale": 2}}
FILTER_KEYS = ("machine", "device", "workload")


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def data_attrs(**meta: Any) -> str:
    """data-machine="..." etc. for the filter script (None values are left out: match all)."""
    return "".join(f' data-{k}="{esc(v)}"' for k, v in meta.items() if v is not None and k in FILTER_KEYS)


@dataclass
class Page:
    """One rendered view: its body HTML and how many Plotly figures it holds (tests count them)."""

    filename: str
    title: str
    intro: str
    body: list[str] = field(default_factory=list)
    figures: int = 0

    def add(self, html_text: str) -> None:
        self.body.append(html_text)

    def figure(self, fig: dict[str, Any], *, title: str, note: str = "", **meta: Any) -> None:
        """Append a card holding `fig`, a Plotly JSON dict (plotly.js is loaded once per page)."""
        div_id = f"fig-{self.filename.split('.')[0]}-{self.figures}"
        figure = {"data": fig.get("data", []), "layout": {**BASE_LAYOUT, **fig.get("layout", {})}}
        plot = pio.to_html(figure, include_plotlyjs=False, full_html=False, include_mathjax=False,
                           div_id=div_id, config=PLOTLY_CONFIG, validate=False)
        note_html = f'<p class="vb-note">{note}</p>' if note else ""
        self.add(f'<section class="vb-card vb-f"{data_attrs(**meta)}><h3>{esc(title)}</h3>{note_html}'
                 f'{plot}<p class="vb-nodata" hidden>No data for the current filter.</p></section>')
        self.figures += 1

    def notice(self, text: str, kind: str = "info") -> None:
        self.add(f'<div class="vb-notice vb-{kind}">{text}</div>')


def table(headers: Iterable[str], rows: Iterable[tuple[list[tuple[str, Any]], dict[str, Any]]],
          *, sortable: bool = True, css: str = "") -> str:
    """An HTML table; each row is ([(html, sort_key), ...], filter meta). Sort keys may be None."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for cells, meta in rows:
        tds = []
        for cell, key in cells:
            sort = f' data-sort="{esc(key)}"' if key is not None else ""
            tds.append(f"<td{sort}>{cell}</td>")
        body.append(f'<tr class="vb-f"{data_attrs(**meta)}>{"".join(tds)}</tr>')
    klass = "vb-table" + (" vb-sortable" if sortable else "") + (f" {css}" if css else "")
    return f'<table class="{klass}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def render_page(page: Page, *, filters: dict[str, list[str]], footer: str, generated: str) -> str:
    """The full HTML document of one page."""
    nav = "".join(
        f'<a href="{f}" data-vb-nav="{f}"{" class=current" if f == page.filename else ""}>{esc(t)}</a>'
        for f, t in PAGES)
    selects = []
    for key in FILTER_KEYS:
        options = "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in filters.get(key, []))
        selects.append(f'<label>{key} <select data-vb-filter="{key}"><option value="">all</option>'
                       f'{options}</select></label>')
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>vmapbench · {esc(page.title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="assets/dashboard.css">
<script src="assets/plotly.min.js"></script>
</head>
<body data-vb-page="{esc(page.filename)}" data-vb-figures="{page.figures}">
<header class="vb-header">
<div class="vb-brand">vmapbench</div>
<nav class="vb-nav">{nav}</nav>
</header>
<div class="vb-filters" role="search">{''.join(selects)}</div>
<main>
<h1>{esc(page.title)}</h1>
<div class="vb-intro">{page.intro}</div>
{''.join(page.body)}
</main>
<footer class="vb-footer">{footer}<p>Generated {esc(generated)} by <code>vmapbench dashboard</code>;
opens offline from this folder.</p></footer>
<script src="assets/dashboard.js"></script>
</body>
</html>
"""


def json_script(element_id: str, data: Any) -> str:
    """Data for the page's script, embedded inert (type=application/json), safe against '</'."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return f'<script type="application/json" id="{esc(element_id)}">{text}</script>'
