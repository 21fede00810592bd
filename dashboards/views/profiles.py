"""Profiles: every results/profiles/<name>/ folder `vmapbench profile` wrote, with links to its files.

Links are relative to the dashboard folder, so they work from file:// as long as the dashboard
and results/ keep their relative places (the default dashboards/out/ and results/ do).
"""
from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path
from typing import Any

from dashboards.context import Context
from dashboards.page import Page, data_attrs, esc, table
from dashboards.theme import format_value

# Summary keys shown as columns, with the unit format_value reads them in.
COLUMNS = (("median_call_s", "median call", "seconds"), ("first_call_s", "first call", "seconds"),
           ("iterations", "calls profiled", ""))


def _link(target: Path, out_dir: Path) -> str:
    try:
        rel = os.path.relpath(target.resolve(), out_dir.resolve())
    except ValueError:  # another drive on Windows: an absolute file URL still works offline
        return target.resolve().as_uri()
    return urllib.parse.quote(Path(rel).as_posix())


def _scalar_items(summary: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for key, value in summary.items():
        if isinstance(value, (dict, list)):
            text = json.dumps(value)
            if len(text) > 160:
                text = text[:157] + "..."
        else:
            text = str(value)
        out.append((key, text))
    return out


def render(ctx: Context) -> Page:
    page = Page("profiles.html", "Profiles", intro=(
        "<p>Profiles recorded with <code>make profile W=&lt;workload&gt; M=&lt;method&gt;</code> "
        "(<code>vmapbench profile</code>): py-spy flame graphs and speedscope files of the Python "
        "side, torch.profiler traces of the kernels (open <code>trace.json</code> in "
        "<code>chrome://tracing</code> or Perfetto), and NVML memory timelines on GPUs. Each "
        "row links the folder's files; the details hold its summary.json.</p>"))
    if not ctx.profiles:
        page.notice("No profiles in <code>results/profiles/</code>. Record one with "
                    "<code>make profile W=&lt;workload&gt; M=&lt;method&gt;</code> "
                    "(see <code>make list</code> for names).")
        return page
    headers = ["profile", "workload", "method", "size", "device"] + [c[1] for c in COLUMNS] + ["files"]
    rows = []
    details = []
    for entry in ctx.profiles:
        s = entry.summary
        links = " ".join(f'<a href="{_link(f, ctx.out_dir)}">{esc(f.relative_to(entry.path).as_posix())}</a>'
                         for f in entry.files)
        cells = [(f"<a href=\"#profile-{esc(entry.name)}\">{esc(entry.name)}</a>", entry.name)]
        for key in ("workload", "method", "size", "device"):
            cells.append((esc(s.get(key, "")), s.get(key)))
        for key, _, unit in COLUMNS:
            value = s.get(key)
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            cells.append((format_value(value, unit) if numeric else esc(value if value is not None else "—"),
                          value if numeric else None))
        cells.append((links or "—", None))
        meta = {"workload": s.get("workload"), "device": s.get("device")}
        rows.append((cells, meta))
        items = "".join(f"<tr><th>{esc(k)}</th><td><code>{esc(v)}</code></td></tr>" for k, v in _scalar_items(s))
        error = f'<p class="vb-bad">{esc(entry.error)}</p>' if entry.error else ""
        details.append(f'<details id="profile-{esc(entry.name)}" class="vb-f"{data_attrs(**meta)}>'
                       f'<summary>{esc(entry.name)}</summary>'
                       f'{error}<table class="vb-table vb-kv">{items}</table></details>')
    page.add(table(headers, rows))
    page.add("<h2>Summaries</h2>" + "".join(details))
    return page
