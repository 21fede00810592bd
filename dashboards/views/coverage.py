"""Engine coverage: OpInfo ops the engine batches natively, by fallback, or not at all, per family,
against torch.func on the same ops (from the coverage report), and the suite's fallback counts.
"""
from __future__ import annotations


from pathlib import Path

from dashboards.artifacts import COVERAGE_STATUSES, CoverageReport, coverage_staleness
from dashboards.context import Context
from dashboards.figures import Panels, panel_keys
from dashboards.page import Page, esc, table
from dashboards.theme import STATUS_COLORS, method_color, method_label, method_order

REPO = Path(__file__).resolve().parents[2]
SIDE_LABELS = {"engine": "engine (ours)", "torch_func": "torch.func", "vjp_engine": "engine vmap(vjp)"}
FALLBACK_METRIC = "fallbacks"


def sides(report: CoverageReport) -> list[str]:
    """engine and torch.func always; the vjp column when the report has it."""
    return [s for s in SIDE_LABELS if s != "vjp_engine" or any(s in o for o in report.ops)]


def coverage_figure(report: CoverageReport) -> dict:
    counts = {side: report.counts(side) for side in sides(report)}
    families = sorted({f for c in counts.values() for f in c},
                      key=lambda f: -sum(counts["engine"].get(f, {}).values()))
    statuses = [s for s in COVERAGE_STATUSES if any(s in fam for c in counts.values() for fam in c.values())]
    statuses += sorted({s for c in counts.values() for fam in c.values() for s in fam} - set(statuses))
    panels = Panels(list(counts), titles=[SIDE_LABELS[s] for s in counts], x_title="OpInfo ops",
                    y_extra={"autorange": "reversed"}, panel_height=max(200, 40 + 28 * len(families)))
    for side in counts:
        for status in statuses:
            panels.add({
                "type": "bar", "orientation": "h", "y": families,
                "x": [counts[side].get(f, {}).get(status, 0) for f in families], "name": status,
                "marker": {"color": STATUS_COLORS.get(status, "#8c564b")},
                "hovertemplate": f"{SIDE_LABELS[side]} · %{{y}}<br>{status}: %{{x}} ops<extra></extra>",
            }, side)
    panels.layout["barmode"] = "stack"
    return panels.fig


def _difference_tables(report: CoverageReport) -> str:
    ahead = [o for o in report.ops if o.get("engine") == "native" and o.get("torch_func") not in ("native", None)]
    behind = [o for o in report.ops if o.get("torch_func") == "native" and o.get("engine") != "native"]
    parts = []
    for title, ops in (("Batched natively by the engine where torch.func does not", ahead),
                       ("Batched natively by torch.func where the engine does not", behind)):
        rows = [([(esc(o["op"]), o["op"]), (esc(o.get("family")), o.get("family")),
                  (esc(o.get("engine")), o.get("engine")), (esc(o.get("torch_func")), o.get("torch_func"))], {})
                for o in sorted(ops, key=lambda o: (str(o.get("family")), str(o["op"])))]
        body = table(["op", "family", "engine", "torch.func"], rows) if rows else "<p>none</p>"
        parts.append(f"<details><summary>{esc(title)}: {len(ops)} ops</summary>{body}</details>")
    return "".join(parts)


def fallback_figure(ctx: Context) -> dict | None:
    """Per (machine, device) panel: the most fallback calls over sizes, per workload and method."""
    rows = ctx.latest_per_case([FALLBACK_METRIC])
    if rows.empty:
        return None
    # Methods that never fall back (the loop, torch.func, ...) only take room; with no fallback
    # at all there is nothing to draw (the page says so).
    active = rows.groupby("method", observed=True)["value"].max()
    rows = rows[rows["method"].isin(active[active > 0].index)]
    if rows.empty:
        return {}
    panels = Panels(panel_keys(rows), y_title="fallback calls in one run")
    for method in method_order(rows["method"].unique()):
        for (machine, device, workload), group in rows[rows["method"] == method].groupby(
                ["machine", "device", "workload"], dropna=False, observed=True):
            panels.add({
                "type": "bar", "x": [workload], "y": [group["value"].max()], "name": method_label(method),
                "offsetgroup": method, "marker": {"color": method_color(method)},
                "meta": {"machine": machine, "device": device, "workload": workload},
                "customdata": [[", ".join(group["size"].astype(str))]],
                "hovertemplate": (f"<b>{esc(method_label(method))}</b> %{{x}}<br>%{{y:g}} fallback calls "
                                  "(most over sizes %{customdata[0]})<extra></extra>"),
            }, machine, device)
    panels.layout["barmode"] = "group"
    return panels.fig


def render(ctx: Context) -> Page:
    page = Page("coverage.html", "Engine coverage", intro=(
        "<p>How much of PyTorch the engine batches. The OpInfo conformance harness runs every "
        "op of <code>op_db</code> on batched inputs through the engine and through torch.func and "
        "sorts each op into <i>native</i> (a batching rule, correct result), <i>fallback</i> "
        "(a per-example loop, correct but slow), <i>error</i>, <i>mismatch</i> (wrong result) or "
        "<i>skip</i>. The second plot counts the fallback calls each workload made in the suite "
        "(<code>track_fallbacks</code>): a fallback inside a measured workload costs a loop.</p>"))
    report = ctx.coverage
    if report is None:
        page.notice("No coverage report found in <code>results/coverage/</code>. Run "
                    "<code>make coverage</code> (or <code>vmapbench coverage</code>) to produce it, "
                    "then <code>make dashboard</code>.", "warn")
    else:
        meta = ", ".join(f"{esc(k)}: {esc(v)}" for k, v in report.meta.items() if not isinstance(v, (dict, list)))
        total = {side: sum(n for fam in report.counts(side).values() for n in fam.values()) for side in sides(report)}
        native = {side: sum(fam.get("native", 0) for fam in report.counts(side).values()) for side in sides(report)}
        summary = "; ".join(f"{SIDE_LABELS[s]}: {native[s]} of {total[s]} native" for s in total)
        stale = coverage_staleness(report, REPO)
        if stale is not None and stale.note():
            page.notice(stale.note(), "warn")
        page.figure(coverage_figure(report), title="OpInfo ops by family",
                    note=f"{summary}. Report <code>{esc(report.path.name)}</code> ({meta}).")
        page.add(_difference_tables(report))
    fig = fallback_figure(ctx)
    if fig is None:
        page.notice("The suite results record no fallback counts (<code>track_fallbacks</code>).")
    elif not fig:
        page.notice("No fallbacks: every workload and method in the latest results ran with 0 "
                    "fallback calls (<code>track_fallbacks</code>).", "good")
    else:
        page.figure(fig, title="Fallback calls per workload (latest results)")
    return page
