"""Torch versions: one commit measured under several torch releases, side by side.

`make bench TORCH="2.13.0 2.15.0"` runs the quick selection once per release, each in its own
environment; asv files them as separate envs (`existing-py3.11-torch<version>`), which every other
page keeps apart as separate runs. This page puts them together: for each machine, the newest
commit measured under two or more releases, and per workload, size, method and device the time
per call and the allocator's peak per release with their intervals, the fallback count, and the
newest release's time over the oldest's (with the interval the two intervals span, as the Compare
page's change). The fallback count is the engine's own (`track_fallbacks`) on an engine method's
row and torch.func's own (`track_torch_fallbacks`: ops torch's vmap ran as a loop) on torch.func's.
Below, the OpInfo coverage of each release (results/coverage/torch-<version>/): how many ops each
side batches natively or by its loop fallback, and the ops whose torch.func status changed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dashboards.artifacts import CoverageReport, load_torch_coverage
from dashboards.context import TIME_METRIC, Context
from dashboards.numbers import as_estimate, change, estimate_columns, format_estimate
from dashboards.page import Page, esc, table
from dashboards.theme import method_label, method_order, natural_key
from measuring.stats import Estimate

TORCH_ENV = re.compile(r"-torch(?P<version>\d+\.\d+\.\d+)$")
# One call's memory: torch's CPU allocator, or XLA's analysis for the jax method.
MEMORY_METRICS = ("alloc_peak_bytes", "xla_memory_bytes")
# Fallback calls: the engine's on engine methods, torch.func's own on torch.func.
FALLBACK_METRICS = ("fallbacks", "torch_fallbacks")
METRICS = (TIME_METRIC, *MEMORY_METRICS, *FALLBACK_METRICS)
CASE = ["workload", "size", "method", "device"]
COVERAGE_STATUSES = ("native", "fallback", "mismatch", "error")
SIDES = (("torch_func", "torch.func"), ("engine", "engine"))


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def version_rows(frame: pd.DataFrame) -> dict[str, tuple[str, list[str], pd.DataFrame]]:
    """machine -> (commit, its torch versions oldest first, its rows of METRICS with lo/hi/n and
    `torch`): the newest commit (by date) that the machine measured under two or more releases.
    `frame` is the loader's (`machine` the host, `env` asv's environment name)."""
    if frame.empty:
        return {}
    f = frame.assign(torch=frame["env"].astype("string").str.extract(TORCH_ENV)["version"])
    f = f[f["torch"].notna() & f["metric"].isin(METRICS) & f["workload"].notna() & f["method"].notna()
          & (f["kind"] != "continuous")]
    out = {}
    for machine, rows in f.groupby("machine", sort=True, observed=True):
        per_commit = rows.groupby("commit", observed=True).agg(versions=("torch", "nunique"), date=("date", "max"))
        shared = per_commit[per_commit["versions"] >= 2].sort_values("date")
        if shared.empty:
            continue
        commit = str(shared.index[-1])
        chosen = rows[rows["commit"] == commit].sort_values("date").drop_duplicates(["torch", "case"], keep="last")
        versions = sorted(chosen["torch"].unique(), key=version_key)
        out[str(machine)] = (commit, versions, estimate_columns(chosen))
    return out


@dataclass
class VersionCase:
    """One workload, size, method and device under each release (None where it has no figure)."""

    workload: str
    size: str
    method: str
    device: str
    time: dict[str, Estimate | None]
    memory: dict[str, Estimate | None]
    fallbacks: dict[str, int | None]
    change: Estimate | None  # newest release's time over the oldest's


def version_cases(versions: list[str], rows: pd.DataFrame) -> list[VersionCase]:
    """The cases of one machine's `version_rows`, by workload, size and method (the dashboard's order)."""
    by: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in rows.to_dict("records"):
        by[(r["torch"], str(r["metric"]), *(str(r[c]) for c in CASE))] = r
    cases = rows.drop_duplicates(CASE)[CASE].astype(str).itertuples(index=False, name=None)
    order = method_order(rows["method"].unique())
    rank = {m: i for i, m in enumerate(order)}
    out = []
    for key in sorted(cases, key=lambda c: (c[0], natural_key(c[1]), rank.get(c[2], len(order)), c[3])):
        def first(metrics: tuple[str, ...], version: str) -> dict[str, Any] | None:
            return next((by[k] for m in metrics if (k := (version, m, *key)) in by), None)

        time = {v: _estimate(first((TIME_METRIC,), v)) for v in versions}
        memory = {v: _estimate(first(MEMORY_METRICS, v)) for v in versions}
        fallbacks = {v: None if (r := first(FALLBACK_METRICS, v)) is None else int(r["value"]) for v in versions}
        old, new = time[versions[0]], time[versions[-1]]
        out.append(VersionCase(*key, time, memory, fallbacks, change(old, new) if old and new else None))
    return out


def _estimate(row: dict[str, Any] | None) -> Estimate | None:
    return None if row is None else as_estimate(row)


def coverage_changes(reports: dict[str, CoverageReport], side: str) -> list[tuple[str, dict[str, str]]]:
    """(op, version -> status) for each OpInfo op whose `side` ('engine' or 'torch_func') status
    differs between releases, or that one release's OpInfo database lacks."""
    statuses: dict[str, dict[str, str]] = {}
    for version, report in reports.items():
        for op in report.ops:
            statuses.setdefault(str(op["op"]), {})[version] = str(op.get(side) or "skip")
    return [(op, s) for op, s in sorted(statuses.items()) if len(s) < len(reports) or len(set(s.values())) > 1]


def _cell(est: Estimate | None, unit: str) -> tuple[str, Any]:
    return ("–", None) if est is None else (esc(format_estimate(est, unit)), est.value)


def _case_table(versions: list[str], cases: list[VersionCase]) -> str:
    oldest, newest = versions[0], versions[-1]
    headers = ["workload", "size", "method", "device", *[f"time · {v}" for v in versions],
               f"time {newest} ÷ {oldest}", *[f"memory · {v}" for v in versions],
               *[f"fallbacks · {v}" for v in versions]]
    body = []
    for c in cases:
        cells: list[tuple[str, Any]] = [(esc(c.workload), c.workload), (esc(c.size), None),
                                        (esc(method_label(c.method)), c.method), (esc(c.device), c.device)]
        cells += [_cell(c.time[v], "seconds") for v in versions]
        cells.append(_cell(c.change, "x"))
        cells += [_cell(c.memory[v], "bytes") for v in versions]
        cells += [("–", None) if c.fallbacks[v] is None else (esc(c.fallbacks[v]), c.fallbacks[v]) for v in versions]
        # No machine key: the machine filter lists runs (a machine per torch env), and a row
        # holds two of them; the heading names the machine.
        body.append((cells, {"device": c.device, "workload": c.workload}))
    return table(headers, body, css="vb-torch-versions")


def _coverage_section(page: Page, reports: dict[str, CoverageReport]) -> None:
    versions = sorted(reports, key=version_key)
    headers = ["torch", "engine commit", *[f"engine {s}" for s in COVERAGE_STATUSES],
               *[f"torch.func {s}" for s in COVERAGE_STATUSES]]
    body = []
    for v in versions:
        report = reports[v]
        cells: list[tuple[str, Any]] = [(esc(v), None), (f"<code>{esc(report.meta.get('engine_commit', '?'))}</code>", None)]
        for side in ("engine", "torch_func"):
            counts = {s: sum(fam.get(s, 0) for fam in report.counts(side).values()) for s in COVERAGE_STATUSES}
            cells += [(esc(counts[s]), counts[s]) for s in COVERAGE_STATUSES]
        body.append((cells, {}))
    page.add("<h2>OpInfo coverage per release</h2><p>Ops of torch's OpInfo database vmapped by the "
             "engine and by torch.func under each release (<code>make coverage</code> in each "
             "release's environment): <em>fallback</em> is an op run as a loop over the batch.</p>")
    page.add(table(headers, body, css="vb-torch-coverage"))
    body = [([(esc(op), op), (label, None), *[(esc(s.get(v, "–")), s.get(v)) for v in versions]], {})
            for side, label in SIDES for op, s in coverage_changes(reports, side)]
    if body:
        page.add("<h3>Ops whose status changed between releases</h3><p>Per op, its status under "
                 "each release; – where that release's OpInfo database has no such op.</p>")
        page.add(table(["op", "vmap of", *versions], body, css="vb-torch-coverage-changes"))


def render(ctx: Context) -> Page:
    page = Page("torch_versions.html", "Torch versions", intro=(
        "<p>One commit measured under several torch releases (<code>make bench "
        "TORCH=\"2.13.0 2.15.0\"</code>): per workload, size, method and device, the time per call "
        "and the allocator's peak of one call under each release, with their intervals, the "
        "newest release's time over the oldest's, and the fallback calls: the engine's own on an "
        "engine method's row, torch.func's own (ops without a batching rule, which torch's vmap "
        "runs as a loop) on torch.func's row (0 is the engine's bar). torch.func's and the other methods' "
        "rows show what a release changed for them, the engine's what it changed for the engine. "
        f"{ctx.measured_note()}</p>"))
    found = version_rows(ctx.frame)
    if not found:
        page.notice("No commit has results under two torch releases: run "
                    "<code>make bench TORCH=\"2.13.0 2.15.0\"</code>.", "warn")
    for machine, (commit, versions, rows) in found.items():
        page.add(f"<h2>{esc(machine)} · commit <code>{esc(commit[:8])}</code> · torch "
                 f"{esc(', '.join(versions))}</h2>")
        page.add(_case_table(versions, version_cases(versions, rows)))
    reports = load_torch_coverage(ctx.results.results_dir) if ctx.results.results_dir else {}
    if len(reports) >= 2:
        _coverage_section(page, reports)
    return page
