"""Engine coverage: OpInfo ops the engine batches natively, by fallback, or not at all, per family
and per batch-dim pattern, against torch.func on the same ops (from the coverage report), and the
suite's fallback counts.
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


def _pattern_names(report: CoverageReport) -> list[str]:
    """The batch-dim patterns the report's ops ran under, in the harness's order of first appearance."""
    names: list[str] = []
    for o in report.ops:
        for p in o.get("patterns") or {}:
            if p not in names:
                names.append(p)
    return names


def pattern_figure(report: CoverageReport) -> dict | None:
    """Per batch-dim pattern (batch at 0, -1, middle; stacked or a view; expanded; one argument
    batched; out_dims=-1): how many ops each side batches natively, by fallback, wrongly or not at
    all; None for a report written before the harness kept patterns."""
    names = _pattern_names(report)
    if not names:
        return None
    panel_sides = [s for s in ("engine", "torch_func") if s in sides(report)]
    panels = Panels(panel_sides, titles=[SIDE_LABELS[s] for s in panel_sides], y_title="OpInfo ops")
    for side in panel_sides:
        for status in ("native", "fallback", "mismatch", "error"):
            panels.add({
                "type": "bar", "x": names, "name": status,
                "y": [sum(1 for o in report.ops if (o.get("patterns") or {}).get(p, {}).get(side) == status) for p in names],
                "marker": {"color": STATUS_COLORS.get(status, "#8c564b")},
                "hovertemplate": f"{SIDE_LABELS[side]} · batch dims %{{x}}<br>{status}: %{{y}} ops<extra></extra>",
            }, side)
    panels.layout["barmode"] = "stack"
    return panels.fig


def _pattern_table(report: CoverageReport) -> str:
    """Ops not native under every pattern on some side: one cell per pattern, 'engine / torch.func'."""
    names = _pattern_names(report)
    if not names:
        return ""
    rows = []
    for o in sorted(report.ops, key=lambda o: str(o["op"])):
        pats = o.get("patterns") or {}
        if all(c.get(s) in ("native", None) for c in pats.values() for s in ("engine", "torch_func")):
            continue
        cells = [(esc(o["op"]), o["op"])]
        for p in names:
            c = pats.get(p, {})
            cells.append((f"{esc(c.get('engine', '-'))} / {esc(c.get('torch_func', '-'))}", c.get("engine")))
        rows.append((cells, {}))
    body = table(["op", *names], rows) if rows else "<p>none</p>"
    return (f"<details><summary>Ops not native under every batch-dim pattern: {len(rows)} "
            f"(each cell: engine / torch.func)</summary>{body}</details>")


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
        fig = pattern_figure(report)
        if fig is not None:
            page.figure(fig, title="OpInfo ops by batch-dim pattern", note=(
                "Each op's worst status over its samples under each pattern: <code>0</code>, "
                "<code>-1</code>, <code>mid</code> a batch dim stacked there (contiguous; at -1 its "
                "stride is 1), <code>.view</code> the same position as a non-contiguous view, "
                "<code>expand</code> a stride-0 batch, <code>first</code> / <code>first-1</code> / "
                "<code>last-1</code> one tensor argument batched (at 0 or -1), <code>out-1</code> "
                "out_dims=-1."))
            page.add(_pattern_table(report))
    fig = fallback_figure(ctx)
    if fig is None:
        page.notice("The suite results record no fallback counts (<code>track_fallbacks</code>).")
    elif not fig:
        page.notice("No fallbacks: every workload and method in the latest results ran with 0 "
                    "fallback calls (<code>track_fallbacks</code>).", "good")
    else:
        page.figure(fig, title="Fallback calls per workload (latest results)")
    return page
