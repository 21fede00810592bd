"""Compilers: the fused tier's candidate backends side by side on every graph the default path
records (`vmapbench fused-backends --write`, results/fused_backends/<machine>/<commit8>.json):
per machine's newest run, compile seconds against the program's time per call over the replay's,
one marker per graph and backend, and the table of the same with each backend's summary.
"""
from __future__ import annotations

import json
import warnings

from dashboards.context import Context
from dashboards.figures import Panels
from dashboards.loader import CorruptResultWarning
from dashboards.page import Page, esc, project_path, table
from dashboards.theme import method_color
from measuring import compilers


def _runs(ctx: Context) -> list[dict]:
    folder = ctx.results.results_dir
    out = []
    for path in compilers.newest(folder) if folder else []:
        try:
            doc = json.loads(path.read_text())
            doc["rows"], doc["backends"]  # noqa: B018 - the fields every run has
        except (ValueError, KeyError) as exc:
            warnings.warn(f"skipping {path}: {exc}", CorruptResultWarning, stacklevel=2)
            continue
        doc["file"] = project_path(path)
        out.append(doc)
    return out


def figure(runs: list[dict]) -> dict:
    panels = Panels([d["machine"] for d in runs], x_title="compile seconds, cold (log)",
                    y_title="time per call / the replay's (log)", log_x=True, log_y=True)
    for doc in runs:
        for backend in doc["backends"]:
            points = [(r, o) for r in doc["rows"] if r.get("graph") is not None
                      for o in [compilers.outcome(r, backend)] if o is not None and o["ratio"] is not None]
            if not points:
                continue
            panels.add({
                "type": "scatter", "mode": "markers", "name": backend,
                "x": [o["compile_s"] for _, o in points], "y": [o["ratio"] for _, o in points],
                "marker": {"size": 9, "color": method_color(backend),
                           "symbol": ["x" if o.get("agrees") is False else "circle" for _, o in points]},
                "text": [f"{r['workload']} graph {r['graph']} ({r['ops']} ops)" for r, _ in points],
                "meta": {"machine": doc["machine"], "device": "cpu"},
                "hovertemplate": (f"<b>{esc(backend)}</b> · %{{text}}<br>compile %{{x:.3g}} s<br>"
                                  "call / replay %{y:.3g}<extra></extra>"),
            }, doc["machine"])
    panels.hline(1.0)
    return panels.fig


def render(ctx: Context) -> Page:
    page = Page("compilers.html", "Compilers", intro=(
        "<p>The fused tier compiles a recorded graph once it has replayed often enough to pay for "
        "the compile. Here each candidate backend compiles every graph the default path records on "
        "the quick selection, in a fresh process with nothing cached: its compile seconds (x) and "
        "its program's time per call over the replay's (y; below the dotted line it is faster). "
        "A cross marks a program whose results differ from the replay's beyond the tier's "
        "tolerance; a graph a backend refused is in the table only. Written by "
        "<code>vmapbench fused-backends --backends xla,inductor,iree --write</code>.</p>"))
    runs = _runs(ctx)
    if not runs:
        page.notice("No compiler results under <code>results/fused_backends/</code>: run "
                    "<code>vmapbench fused-backends --write</code>.", "warn")
        return page
    for doc in runs:
        page.notice(f"{esc(doc['machine'])} ({esc(doc.get('cpu', '?'))}, {esc(doc.get('cores', '?'))} cores), "
                    f"commit <code>{esc(doc['commit'][:8])}</code>, {esc(doc.get('written_at', '?'))}, "
                    f"{esc(doc.get('threads', '?'))} thread(s), torch {esc(doc.get('torch', '?'))}. "
                    f"File: <code>{esc(doc['file'])}</code>.")
    page.figure(figure(runs), title="Compile seconds against time per call")
    for doc in runs:
        backends = doc["backends"]
        meta = {"machine": doc["machine"]}
        rows = []
        for b in backends:
            s = compilers.summary(doc["rows"], b)
            median = s["median_compile_s"]
            rows.append(([(esc(b), b), (f"{median:.2f}" if median is not None else "–", median),
                          (esc(s["faster"]), s["faster"]), (esc(s["refused"]), s["refused"]),
                          (esc(s["graphs"]), s["graphs"])], meta))
        body = [([(esc(t), _key(t)) for t in compilers.cells(r, backends)], {**meta, "workload": r["workload"]})
                for r in doc["rows"]]
        page.add(f"<h2>{esc(doc['machine'])}</h2>"
                 + table(["backend", "median compile s", "faster than the replay (agreeing)", "refused", "graphs"], rows)
                 + table(compilers.head(backends), body))
    return page


def _key(text: str) -> float | str:
    """A cell's sort key: its number where it starts with one."""
    try:
        return float(text.split(" ")[0])
    except ValueError:
        return text
