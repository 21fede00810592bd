"""Memory: each method's memory per call against size, and the chunk_size trade-off of time vs memory.

The figure is the allocator's: on CPU the peak of bytes torch's allocator handed out during one
call and held at once (`track_alloc_peak_bytes`, exact: the same in every process), on CUDA the
caching allocator's peak during one call above the inputs (`track_cuda_peak_bytes`, else NVML's).
The jax method's is XLA's compiled memory analysis of its program (`track_xla_memory_bytes`:
temporaries + outputs + arguments). Results from before the allocator figures fall back on the
process's RSS growth and then on asv's whole-process `peakmem_run`; the RSS growth is otherwise
shown beside the bars' figure as a secondary, process-level reading, labelled as such.
"""
from __future__ import annotations

import pandas as pd

from dashboards.context import MEMORY_METRICS, SECONDARY_MEMORY_METRIC, TIME_METRIC, XLA_MEMORY_METRIC, Context
from dashboards.figures import Panels, byte_scale, grouped_bars, panel_keys
from dashboards.page import Page, esc
from dashboards.theme import format_value, method_color, method_label, method_order

ALL_MEMORY = tuple(dict.fromkeys([*(m for ms in MEMORY_METRICS.values() for m in ms), XLA_MEMORY_METRIC]))
# What each memory metric counts, as the page's notes and hovers say it.
COUNTS = {
    "alloc_peak_bytes": "torch allocator peak of one call",
    "cuda_peak_bytes": "CUDA caching allocator peak of one call",
    "xla_memory_bytes": "XLA compiled program: temporaries + outputs + arguments",
    "nvml_peak_bytes": "device memory in use (NVML), sampled during one call",
    "rss_delta_bytes": "process RSS growth during one call (pages)",
    "peakmem": "whole process peak RSS (asv peakmem_run)",
}
CASE = ["machine", "device", "workload", "size", "method"]


def memory_rows(ctx: Context) -> pd.DataFrame:
    """Latest memory measurement per case: the preferred metric of each (machine, device,
    workload), and XLA's figure for the methods that metric has none for (jax)."""
    rows = ctx.latest_per_case(ALL_MEMORY)
    if rows.empty:
        return rows
    picked = []
    for (machine, device, workload), group in rows.groupby(["machine", "device", "workload"], dropna=False,
                                                           observed=True):
        prefs = MEMORY_METRICS.get(device, MEMORY_METRICS["cpu"])
        present = set(group["metric"])
        metric = next((m for m in prefs if m in present), None)
        chosen = group[group["metric"] == metric] if metric is not None else group.iloc[0:0]
        xla = group[(group["metric"] == XLA_MEMORY_METRIC) & ~group["method"].isin(set(chosen["method"]))]
        if not chosen.empty or not xla.empty:
            picked.append(pd.concat([chosen, xla]))
    return pd.concat(picked) if picked else rows.iloc[0:0]


def _hover_texts(ctx: Context, rows: pd.DataFrame) -> list[str]:
    """Per bar: its bytes and what they count, and the process's RSS growth (secondary) beside
    an allocator figure where the same case has one."""
    rss = ctx.latest_per_case([SECONDARY_MEMORY_METRIC])
    secondary = {} if rss.empty else {tuple(r[:-1]): r[-1] for r in rss[CASE + ["value"]].itertuples(index=False)}
    texts = []
    for rec in rows[CASE + ["metric", "value"]].itertuples(index=False):
        text = f"{format_value(rec.value, 'bytes')} ({COUNTS.get(rec.metric, rec.metric)})"
        other = secondary.get(tuple(rec[:5]))
        if rec.metric != SECONDARY_MEMORY_METRIC and other is not None:
            text += f"<br>process RSS growth, secondary: {format_value(other, 'bytes')}"
        texts.append(text)
    return texts


def chunk_column(ctx: Context, rows: pd.DataFrame) -> str | None:
    for column in ctx.size_columns_of(rows):
        if "chunk" in column and rows[column].nunique() > 1:
            return column
    return None


def tradeoff_figure(ctx: Context, times: pd.DataFrame, mems: pd.DataFrame, chunk: str) -> dict:
    keys = ["machine", "device", "method", "size"]
    joined = times[keys + ["workload", chunk, "value"]].merge(
        mems[keys + ["value", "metric"]], on=keys, suffixes=("_time", "_mem"))
    others = [c for c in ctx.size_columns_of(times) if c != chunk and times[c].nunique() > 1]
    if others:
        joined = joined.merge(times[keys + others].drop_duplicates(keys), on=keys, how="left")
    panels = Panels(panel_keys(joined), x_title="time per call (s, log)",
                    y_title="memory of one call (bytes, log)", log_x=True, log_y=True)
    order = method_order(joined["method"].unique())
    groups = sorted(joined.groupby(["machine", "device", "method"] + others, dropna=False, observed=True),
                    key=lambda g: (order.index(g[0][2]), tuple(map(str, g[0][3:]))))
    for (machine, device, method, *rest), series in groups:
        series = series.sort_values(chunk)
        suffix = ", ".join(f"{c}={v:g}" for c, v in zip(others, rest))
        name = f"{method_label(method)}{f' ({suffix})' if suffix else ''}"
        panels.add({
            "type": "scatter", "x": series["value_time"].tolist(), "y": series["value_mem"].tolist(),
            "mode": "lines+markers+text", "text": [f"{v:g}" for v in series[chunk]],
            "textposition": "top center", "name": name, "line": {"color": method_color(method)},
            "meta": {"machine": machine, "device": device, "workload": series["workload"].iloc[0]},
            "customdata": [[format_value(t, "seconds"), format_value(m, "bytes"), s, mt]
                           for t, m, s, mt in zip(series["value_time"], series["value_mem"], series["size"],
                                                  series["metric"])],
            "hovertemplate": (f"<b>{esc(name)}</b><br>%{{customdata[2]}}<br>time %{{customdata[0]}}"
                              "<br>memory %{customdata[1]} (%{customdata[3]})<extra></extra>"),
        }, machine, device)
    return panels.fig


def render(ctx: Context) -> Page:
    page = Page("memory.html", "Memory", intro=(
        "<p>Memory of one call per method at each measured size (bars grouped by size, in "
        "KiB/MiB/GiB). On CPU: the peak of tensor bytes torch's allocator handed out during one call "
        "and held at once (<code>track_alloc_peak_bytes</code>: every allocation of the call, "
        "compiled programs' buffers and Opacus' and BackPACK's included; exact, the same bytes in "
        "every process; inputs allocated before the call are not counted). On CUDA: the caching "
        "allocator's peak during the call above what was allocated before it "
        "(<code>track_cuda_peak_bytes</code>). The <b>jax</b> bars are XLA's compiled memory "
        "analysis of the jitted program (<code>track_xla_memory_bytes</code>: temporaries + "
        "outputs + arguments, its inputs included), so they sit above the torch methods' by the "
        "inputs' size. The process's RSS growth (<code>track_rss_delta_bytes</code>) is a "
        "secondary, process-level figure (pages, not tensors: often 0 where the allocator reuses "
        "freed memory), shown in the hover; it stands in for the bars only in results that predate "
        "the allocator figures, and asv's whole-process <code>peakmem_run</code> only where "
        "neither exists. Vectorizing trades memory for time: the batched methods hold every "
        "example's intermediates at once. Where a workload sweeps <code>chunk_size</code>, the "
        "last plot shows that trade-off directly: time against the same memory figure, each point "
        "labelled with its chunk size (vmap's <code>chunk_size</code> bounds memory at the cost of "
        f"time). The memory-limit experiment (peers page) uses the same measure. {ctx.measured_note()}</p>"))
    mems = memory_rows(ctx)
    if mems.empty:
        page.notice("No memory measurements yet: run <code>make bench</code>.", "warn")
        return page
    for workload in sorted(mems["workload"].unique()):
        w_rows = mems[mems["workload"] == workload]
        mixed = w_rows.groupby("device", observed=True)["metric"].nunique().max() > 1
        used = "; ".join(
            f"{d}: <code>{esc(m)}</code> ({esc(COUNTS.get(m, m))}"
            + (f", {', '.join(esc(method_label(x)) for x in sorted(g['method'].unique()))}"
               if m == XLA_MEMORY_METRIC else
               f", {', '.join(esc(x) for x in sorted(g['machine'].unique()))}" if mixed else "") + ")"
            for (d, m), g in w_rows.groupby(["device", "metric"], observed=True))
        divisor, unit = byte_scale(w_rows["value"])
        bars = w_rows.assign(text=_hover_texts(ctx, w_rows))
        # Sizes a decade or more apart: a log axis, so the small ones still read (0 is not drawn).
        positive = w_rows["value"][w_rows["value"] > 0]
        log = len(positive) > 1 and positive.max() > 30 * positive.min()
        fig = grouped_bars(bars, y_title=f"memory of one call ({unit}{', log' if log else ''})",
                           color=method_color, label=method_label, order=method_order(w_rows["method"].unique()),
                           hover="%{customdata}", divisor=divisor, log_y=log, shared_y=False)
        sizes = w_rows["size"].nunique()
        zero = w_rows[w_rows["value"] <= 0]
        rss_zero = int((zero["metric"] == SECONDARY_MEMORY_METRIC).sum())
        page.figure(fig, title=workload, workload=workload, note=(
            f"bytes per call — {used}; {sizes} size{'s' if sizes != 1 else ''} measured"
            + (f"; {len(zero) - rss_zero} bar(s) at 0: the call allocated no tensor" if len(zero) > rss_zero else "")
            + (f"; {rss_zero} RSS bar(s) at 0: the growth stayed below the page granularity or memory "
               "was reused" if rss_zero else "") + "."))
    missing = sorted(set(ctx.latest_per_case([TIME_METRIC])["workload"].dropna()) - set(mems["workload"]))
    if missing:
        page.notice("Timed but without a memory measurement: "
                    + ", ".join(f"<code>{esc(w)}</code>" for w in missing) + ".")
    page.add("<h2>chunk_size: time against memory</h2>")
    times = ctx.latest_per_case([TIME_METRIC])
    shown = 0
    for workload in sorted(times["workload"].unique()) if not times.empty else []:
        w_times = times[times["workload"] == workload]
        chunk = chunk_column(ctx, w_times)
        if chunk is None:
            continue
        fig = tradeoff_figure(ctx, w_times, mems[mems["workload"] == workload], chunk)
        if fig["data"]:
            page.figure(fig, title=f"{workload}: time vs memory by {chunk}", workload=workload)
            shown += 1
    if not shown:
        page.notice("No workload in these results sweeps a chunk size parameter, so there is no "
                    "trade-off to plot.")
    return page
