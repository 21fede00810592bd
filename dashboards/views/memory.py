"""Memory: peak memory against size per method, and the chunk_size trade-off of time vs memory.

The memory metric depends on the device: on CUDA the allocator's peak during one call
(`track_cuda_peak_bytes`, else NVML's), on CPU the growth of the process's RSS during one call
(`track_rss_delta_bytes`), and asv's whole-process `peakmem_run` only when neither was recorded
(it includes the torch import, so it compares methods but is not their own memory).
"""
from __future__ import annotations

import pandas as pd

from dashboards.context import MEMORY_METRICS, TIME_METRIC, Context
from dashboards.figures import Panels, byte_scale, grouped_bars, panel_keys
from dashboards.page import Page, esc
from dashboards.theme import format_value, method_color, method_label, method_order

ALL_MEMORY = tuple(dict.fromkeys(m for ms in MEMORY_METRICS.values() for m in ms))


def memory_rows(ctx: Context) -> pd.DataFrame:
    """Latest memory measurement per case, in the preferred metric of each (machine, device, workload)."""
    rows = ctx.latest_per_case(ALL_MEMORY)
    if rows.empty:
        return rows
    picked = []
    for (machine, device, workload), group in rows.groupby(["machine", "device", "workload"], dropna=False,
                                                           observed=True):
        prefs = MEMORY_METRICS.get(device, MEMORY_METRICS["cpu"])
        present = set(group["metric"])
        metric = next((m for m in prefs if m in present), None)
        if metric is not None:
            picked.append(group[group["metric"] == metric])
    return pd.concat(picked) if picked else rows.iloc[0:0]


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
                    y_title="peak memory (bytes, log)", log_x=True, log_y=True)
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
        "<p>Peak memory of one call per method at each measured size (bars grouped by size, "
        "in KiB/MiB/GiB): on CUDA "
        "the allocator's peak during the call above the inputs (<code>track_cuda_peak_bytes</code>), "
        "on CPU how far the process's resident memory grew during the call "
        "(<code>track_rss_delta_bytes</code>); asv's whole-process <code>peakmem_run</code> stands "
        "in only where neither was recorded. Vectorizing trades memory for time: the batched "
        "methods hold every example's intermediates at once. Where a workload sweeps "
        "<code>chunk_size</code>, the last plot shows that trade-off directly: time against memory, "
        "each point labelled with its chunk size (vmap's <code>chunk_size</code> bounds memory at "
        f"the cost of time). {ctx.measured_note()}</p>"))
    mems = memory_rows(ctx)
    if mems.empty:
        page.notice("No memory measurements yet: run <code>make bench</code>.", "warn")
        return page
    for workload in sorted(mems["workload"].unique()):
        w_rows = mems[mems["workload"] == workload]
        used = ", ".join(f"{d}: <code>{esc(m)}</code>" for d, m in
                         w_rows[["device", "metric"]].drop_duplicates().itertuples(index=False))
        divisor, unit = byte_scale(w_rows["value"])
        bars = w_rows.assign(text=[format_value(v, "bytes") for v in w_rows["value"]])
        # Sizes a decade or more apart: a log axis, so the small ones still read (0 is not drawn).
        positive = w_rows["value"][w_rows["value"] > 0]
        log = len(positive) > 1 and positive.max() > 30 * positive.min()
        fig = grouped_bars(bars, y_title=f"peak memory of one call ({unit}{', log' if log else ''})",
                           color=method_color, label=method_label, order=method_order(w_rows["method"].unique()),
                           hover="%{customdata}", divisor=divisor, log_y=log, shared_y=False)
        sizes = w_rows["size"].nunique()
        zero = int((w_rows["value"] <= 0).sum())
        page.figure(fig, title=workload, workload=workload, note=(
            f"metric — {used}; {sizes} size{'s' if sizes != 1 else ''} measured"
            + (f"; {zero} bar(s) at 0: the call's growth stayed below the RSS page granularity "
               "or memory was freed" if zero else "") + "."))
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
