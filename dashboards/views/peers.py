"""Peers and limits: how far each method (ours and the peers: JAX, Opacus, BackPACK, ...) is from
the limit of its workload, and the largest batch each fits in a memory budget.

- Distance to the limit: at each run's latest commit, every method's time over the time of the
  workload's limit method (theme.LIMIT_METHODS: the closed form / hand-vectorized code), with the
  interval of numbers.change. 1× is the limit; workloads without a limit method are listed.
- Memory limit: results/memlimit/<machine>/<commit8>.json (vmapbench memlimit, see
  dashboards.artifacts.load_memlimit): per workload and method the largest batch that ran within
  the budget, with its time per call there; methods that failed or were skipped say why.
- Against jax.jit, compile cost included: results/peer_ratios/<machine>/<commit8>.json
  (`python -m vmapbench.peer_ratios --write`): per workload ours (the default path after
  engine.settle()), jax.jit and torch.func per call, ours / jax with the interval of its per-round
  ratios, and ours' and jax's cold and warm first calls and break-even calls against torch.func.
  A tier that costs more than it saves shows here, beside what it saves.
Methods are read from the data (no fixed list): a method this dashboard has never heard of still
gets a column, after the known ones.
"""
from __future__ import annotations

import math

import pandas as pd

from dashboards.artifacts import PeerReport, load_memlimit, load_peer_ratios
from dashboards.context import Context
from dashboards.figures import ratio_bars
from dashboards.numbers import KEY, change, figure_of, format_estimate, rows_by
from dashboards.page import Page, esc, table
from dashboards.theme import LIMIT_METHODS, format_value, method_color, method_label, method_order
from measuring.stats import Estimate, estimate


def distances(ctx: Context) -> tuple[pd.DataFrame, list[str]]:
    """(rows of (machine, device, workload, size, method, limit, value, lo, hi, n), workloads
    without a limit method) at each run's latest commit."""
    cells = ctx.latest_cells
    out, without = [], set()
    if cells.empty:
        return pd.DataFrame(), []
    for key, group in rows_by(cells, KEY):
        by = {r["method"]: r for r in group}
        limit = next((m for m in LIMIT_METHODS if m in by and figure_of(by[m], "time")), None)
        if limit is None:
            without.add(key[2])
            continue
        base = figure_of(by[limit], "time").est
        for method, r in by.items():
            t = figure_of(r, "time")
            # The limit against itself is 1 exactly (not a ratio of two noisy readings).
            delta = change(base, t.est) if t and method != limit else (
                Estimate(1.0, 1.0, 1.0, 1) if t else None)
            if delta is None:
                continue
            out.append(dict(zip(KEY, key), method=method, limit=limit, value=delta.value, lo=delta.lo,
                            hi=delta.hi, n=delta.n, time=t.text("seconds")))
    with_limit = {r["workload"] for r in out}
    return pd.DataFrame(out), sorted(without - with_limit)


def _distance_figure(machine: str, rows: pd.DataFrame) -> dict:
    bars = [{"method": r["method"], "device": r["device"], "workload": r["workload"],
             "x": f"{r['workload']} {r['size']}", "est": Estimate(r["value"], r["lo"], r["hi"], int(r["n"])),
             "customdata": [_text(r), r["time"], method_label(r["limit"])]} for r in rows.to_dict("records")]
    return ratio_bars(machine, bars, y_title="time ÷ the limit's time (×, log; dotted: the limit)",
                      hover="%{customdata[0]} the time of %{customdata[2]}<br>time %{customdata[1]}",
                      label=lambda m: esc(method_label(m)), color=method_color,
                      order=method_order(rows["method"].unique()))


def _text(r: dict) -> str:
    return format_estimate(Estimate(r["value"], r["lo"], r["hi"], int(r["n"])), "x")


def _distance_table(rows: pd.DataFrame) -> str:
    methods = method_order(rows["method"].unique())
    headers = ["device", "workload · size", "limit"] + [method_label(m) for m in methods]
    body = []
    for (machine, device, workload, size), group in rows_by(rows, KEY):
        by = {r["method"]: r for r in group}
        cells = [(esc(device), device), (f"<b>{esc(workload)}</b><br><small>{esc(size)}</small>", workload),
                 (esc(method_label(group[0]["limit"])), None)]
        for m in methods:
            r = by.get(m)
            cells.append((f"{esc(_text(r))}<br><small>{esc(r['time'])}</small>" if r else "—",
                          r["value"] if r else None))
        body.append((cells, {"machine": machine, "device": device, "workload": workload}))
    return table(headers, body, css="vb-compact")


def _memlimit_cell(r: dict | None, best: float | None) -> tuple[str, int | None]:
    """One method's search: the largest batch that fit and its time per call, marked when a limit
    other than memory stopped the search (the probe time limit, or the search cap: '≥'); a search
    where nothing fit, failed or was skipped says so, with the reason."""
    if r is None:
        return "—", None
    reason = r["reason"] if isinstance(r["reason"], str) else ""
    limited_by = r.get("limited_by") if isinstance(r.get("limited_by"), str) else None
    if r["status"] == "ok" and _num(r["max_batch"]):
        batch = int(r["max_batch"])
        t = format_value(r["time_at_max_s"], "seconds") if _num(r["time_at_max_s"]) else "n/a"
        mark = ' class="vb-best"' if batch == best else ""
        shown = f"≥{batch}" if limited_by == "cap" else str(batch)
        note = {"time": "<br><small><b>time limit</b></small>", "cap": "<br><small>search cap</small>"}.get(
            limited_by or "", "")
        return (f'<div{mark} title="{esc(reason)}">{shown}<br><small>{esc(t)} per call</small>{note}</div>',
                batch)
    if r["status"] == "ok":  # the search ran, and not even the smallest batch fit
        what = {"time": "too slow", "memory": "over budget"}.get(limited_by or "", "none fits")
        return (f'<span title="{esc(reason)}">none fits ({what})</span><br><small>{esc(reason[:60])}</small>', 0)
    return (f'<span title="{esc(reason)}">{esc(r["status"])}</span>'
            + (f"<br><small>{esc(reason[:60])}</small>" if reason else ""), None)


def _memlimit_section(page: Page, ctx: Context) -> None:
    page.add("<h2>Largest batch within a memory budget</h2>")
    report = load_memlimit(ctx.results.results_dir) if ctx.results.results_dir else pd.DataFrame()
    if report.empty:
        page.notice("No memory-limit results in <code>results/memlimit/&lt;machine&gt;/</code>. Run "
                    "the experiment with <code>vmapbench memlimit</code> (it binary-searches, in a "
                    "child process with a memory limit, the largest batch each method fits).")
        return
    page.add("<p>Each cell: the largest batch that ran within the budget, found by real probes "
             "under the memory limit, and its time per call there. <b>time limit</b>: the next "
             "batch probed was slower than the probe time limit, so the batch that fits in memory "
             "may be larger; ≥ with <i>search cap</i>: the largest batch searched fit. Hover a cell "
             "for what stopped the search.</p>")
    for (machine, device, budget), rep in report.groupby(["machine", "device", "budget_bytes"], dropna=False):
        methods = method_order(rep["method"].unique())
        first = rep.iloc[0]
        commit = str(first["commit"] or "")[:8]
        settings = "".join([
            f" · probe time limit {esc(format_value(first['probe_timeout_s'], 'seconds'))}"
            if _num(first["probe_timeout_s"]) else "",
            f" · precision {float(first['precision']):.0%}" if _num(first["precision"]) else ""])
        # The device first, as in the distance table: vb-compact sizes the first two columns.
        headers = ["device", "workload · size"] + [method_label(m) for m in methods]
        body = []
        for (workload, size), group in rep.groupby(["workload", "size"], dropna=False, sort=True):
            by = {r["method"]: r for r in group.to_dict("records")}
            best = max((r["max_batch"] for r in by.values() if r["status"] == "ok" and _num(r["max_batch"])),
                       default=None)
            cells = [(esc(device), device), (f"<b>{esc(workload)}</b><br><small>{esc(size)}</small>", workload)]
            cells += [_memlimit_cell(by.get(m), best) for m in methods]
            body.append((cells, {"machine": machine, "device": device, "workload": workload}))
        page.add(f'<h3 class="vb-f" data-machine="{esc(machine)}">{esc(machine)} · {esc(device)} · budget '
                 f'{esc(format_value(budget, "bytes"))}{settings} · commit <code>{esc(commit)}</code></h3>'
                 + table(headers, body, css="vb-compact"))


def _num(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _ms(seconds: object) -> str:
    return format_value(seconds, "seconds") if _num(seconds) else "—"


def _calls(n: object) -> str:
    """Break-even calls as peer_ratios writes them: a count, inf (never: its steady call is not
    faster than torch.func's), or NaN / missing (not measured)."""
    if isinstance(n, (int, float)) and not isinstance(n, bool):
        if n == math.inf:
            return "never"
        return f"{int(n)}" if math.isfinite(n) else "—"
    return "—"


def _peer_row(r: dict) -> tuple[list[tuple[str, object]], dict]:
    samples = r.get("samples") or {}
    seconds = r.get("seconds") or {}
    first = r.get("first_call") or {}
    even = r.get("break_even") or {}
    ours = str(r.get("ours") or "")
    vs_jax: tuple[str, object] = ("—", None)
    if samples.get(ours) and samples.get("jax"):
        per_round = [a / b for a, b in zip(samples[ours], samples["jax"]) if _num(a) and _num(b) and b > 0]
        if per_round:
            est = estimate(per_round)
            css = ' class="vb-best"' if est.hi < 1 else ""
            vs_jax = (f"<span{css}>{esc(format_estimate(est, 'x'))}</span>", est.value)

    def first_calls(method: str) -> str:
        f = first.get(method) or {}
        return f"{esc(_ms(f.get('cold')))} / {esc(_ms(f.get('warm')))}"

    state = r.get("fused_state")
    cells = [(f"<b>{esc(r['workload'])}</b><br><small>{esc(r.get('size', ''))}</small>", r["workload"]),
             (f"{esc(method_label(ours))}" + (f"<br><small>{esc(str(state)[:60])}</small>" if state else ""), ours),
             (esc(_ms(seconds.get(ours))), seconds.get(ours)), (esc(_ms(seconds.get("jax"))), seconds.get("jax")),
             (esc(_ms(seconds.get("torch_func"))), seconds.get("torch_func")), vs_jax,
             (first_calls(ours), (first.get(ours) or {}).get("cold")), (esc(_calls(even.get(ours))), None),
             (first_calls("jax"), (first.get("jax") or {}).get("cold")), (esc(_calls(even.get("jax"))), None)]
    failed = {**(r.get("failed") or {}), **(r.get("skipped") or {})}
    if failed:
        cells[0] = (cells[0][0] + "".join(f'<br><small title="{esc(why)}">{esc(m)}: {esc(str(why)[:50])}</small>'
                                          for m, why in failed.items()), r["workload"])
    return cells, {"workload": r["workload"]}


def _peer_ratios_section(page: Page, ctx: Context) -> None:
    page.add("<h2>Against jax.jit, compile cost included</h2>")
    reports: list[PeerReport] = load_peer_ratios(ctx.results.results_dir) if ctx.results.results_dir else []
    if not reports:
        page.notice("No peer comparison in <code>results/peer_ratios/&lt;machine&gt;/</code>. Run "
                    "<code>python -m vmapbench.peer_ratios --write</code> (ours, jax.jit, torch.func and the "
                    "other peers timed interleaved in one process, first calls cold and warm).")
        return
    page.add("<p>From <code>python -m vmapbench.peer_ratios</code>: every method timed interleaved in one "
             "process, per call (median of the rounds); <b>ours ÷ jax</b> is the median of the per-round "
             "ratios with its interval (highlighted where the whole interval is below 1). <b>First call, "
             "cold / warm</b>: a fresh build's first call with nothing cached (ours: trace plus the fused "
             "tier's compile; jax: trace plus XLA compile), then a second build's (ours loads its program "
             "from the on-disk index). <b>Break-even</b>: calls after which the method, first call "
             "included, has cost less than as many torch.func calls (never: its steady call is not "
             "faster).</p>")
    headers = ["workload · size", "ours", "ours per call", "jax per call", "torch.func per call", "ours ÷ jax",
               "ours first call, cold / warm", "ours break-even", "jax first call, cold / warm",
               "jax break-even"]
    for rep in reports:
        body = [_peer_row(r) for r in rep.rows]
        threads = f" · {esc(str(rep.threads))} thread(s)" if rep.threads is not None else ""
        page.add(f'<h3 class="vb-f" data-machine="{esc(rep.machine)}">{esc(rep.machine)} · {esc(rep.device)}{threads} · commit '
                 f'<code>{esc(rep.commit[:8])}</code></h3>' + table(headers, body, css="vb-compact"))


def render(ctx: Context) -> Page:
    page = Page("peers.html", "Peers & limits", intro=(
        "<p>Every method side by side, ours and the peers a user would pick (torch.func, JAX "
        "jit(vmap), Opacus, BackPACK, ...). <b>Distance to the limit</b>: each method's time per "
        "call over the time of the workload's closed form / hand-vectorized code at the latest "
        "commit, with the interval spanned by the two times' intervals (1× is the limit; the "
        "table also gives the time). <b>Memory limit</b>: the largest batch each method ran "
        "within a fixed memory budget (<code>vmapbench memlimit</code>), with its time per call at "
        f"that batch. {ctx.measured_note()}</p>"))
    page.add("<h2>Distance to the limit</h2>")
    rows, without = distances(ctx)
    if rows.empty:
        page.notice("No workload at the latest commit has a limit method (closed form) timed.")
    else:
        for machine in sorted(rows["machine"].unique()):
            mine = rows[rows["machine"] == machine]
            page.figure(_distance_figure(machine, mine), title=f"Time over the limit — {machine}",
                        machine=machine)
            page.add(_distance_table(mine))
    if without:
        page.notice("No closed form / hand-vectorized method to measure against: "
                    + ", ".join(f"<code>{esc(w)}</code>" for w in without) + ".")
    _memlimit_section(page, ctx)
    _peer_ratios_section(page, ctx)
    return page
