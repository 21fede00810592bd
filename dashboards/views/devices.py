"""Devices: one workload's methods on the CPU and on CUDA side by side.

Per workload and size measured on both devices, one figure of three panels: the time per call on
each device, the GPU-over-CPU speed-up of each method (CPU time / CUDA time), and the peak memory
of one call on each (the CUDA allocator's peak and NVML's whole-device peak; on the CPU the
resident set's growth). A CUDA run is paired with the CPU run of the same machine where it has one,
else with the CPU run measured last: the two may then be different machines, as the title says.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from dashboards.context import MEMORY_METRICS, TIME_METRIC, Context
from dashboards.figures import Panels, byte_scale
from dashboards.page import Page, esc
from dashboards.theme import format_value, method_label, method_order, natural_key

DEVICE_COLORS = {"cpu": "#4c78a8", "cuda": "#76b900"}
NVML_COLOR = "#3d6b00"
SPEEDUP_COLOR = "#e45756"
PANELS = ("time", "speed-up", "memory")


def pairs(times: pd.DataFrame) -> list[tuple[str, str]]:
    """(cpu run, cuda run) pairs: each CUDA run with its machine's CPU run, else the CPU run whose
    newest result is the newest."""
    runs = times.drop_duplicates(["machine", "device"])[["machine", "host", "device"]]
    cpu = runs[runs["device"] == "cpu"]
    if cpu.empty:
        return []
    newest = times[times["device"] == "cpu"].groupby("machine", observed=True)["date"].max()
    fallback = str(newest.sort_values().index[-1])
    out = []
    for run, host in runs[runs["device"] == "cuda"][["machine", "host"]].itertuples(index=False):
        same = cpu[cpu["host"] == host]["machine"].tolist()
        out.append((str(same[0]) if same else fallback, str(run)))
    return out


def _memory(ctx: Context, run: str, device: str, workload: str, size: str) -> dict[str, dict[str, float]]:
    """metric -> {method: bytes} of one run's case, for the device's memory metrics that exist."""
    out: dict[str, dict[str, float]] = {}
    rows = ctx.latest_per_case(list(MEMORY_METRICS[device]))
    rows = rows[(rows["machine"] == run) & (rows["device"] == device) & (rows["workload"] == workload)
                & (rows["size"] == size)]
    for metric in MEMORY_METRICS[device]:
        got = rows[rows["metric"] == metric]
        if not got.empty:
            out[metric] = dict(zip(got["method"], got["value"]))
    return out


def device_figure(ctx: Context, times: pd.DataFrame, workload: str, size: str, cpu_run: str,
                  cuda_run: str) -> dict[str, Any]:
    """The three panels of one workload and size: time per device, speed-up, peak memory."""
    sides = {"cpu": (cpu_run, times[(times["machine"] == cpu_run) & (times["device"] == "cpu")]),
             "cuda": (cuda_run, times[(times["machine"] == cuda_run) & (times["device"] == "cuda")])}
    seconds = {d: dict(zip(r["method"], r["value"])) for d, (_, r) in sides.items()}
    methods = method_order(set(seconds["cpu"]) | set(seconds["cuda"]))
    labels = [method_label(m) for m in methods]
    panels = Panels(PANELS, titles=["time per call (log)", "GPU over CPU: cpu time / cuda time (log)",
                                    "peak memory of one call"], shared_y=False, x_extra={"type": "category"})
    meta = {"workload": workload}
    for device, (run, _) in sides.items():
        values = [seconds[device].get(m) for m in methods]
        panels.add({"type": "bar", "x": labels, "y": values, "name": f"{device} · {run}",
                    "marker": {"color": DEVICE_COLORS[device]}, "offsetgroup": device,
                    "meta": {**meta, "machine": run, "device": device},
                    "customdata": [format_value(v, "seconds") for v in values],
                    "hovertemplate": f"<b>%{{x}}</b> on {esc(device)}<br>%{{customdata}} per call<extra></extra>"},
                   "time")
    speedup = [seconds["cpu"][m] / seconds["cuda"][m] if m in seconds["cpu"] and m in seconds["cuda"]
               and seconds["cuda"][m] else None for m in methods]
    panels.add({"type": "bar", "x": labels, "y": speedup, "name": "GPU over CPU", "marker": {"color": SPEEDUP_COLOR},
                "meta": {**meta, "machine": cuda_run, "device": "cuda"},
                "customdata": [format_value(v, "x") for v in speedup],
                "hovertemplate": "<b>%{x}</b><br>%{customdata} faster on cuda<extra></extra>"}, "speed-up")
    memory = [("cpu", metric, values) for metric, values in _memory(ctx, cpu_run, "cpu", workload, size).items()][:1]
    memory += [("cuda", metric, values) for metric, values in _memory(ctx, cuda_run, "cuda", workload, size).items()
               if metric != "peakmem"]
    divisor, unit = byte_scale([v for _, _, values in memory for v in values.values()])
    for device, metric, values in memory:
        color = NVML_COLOR if metric == "nvml_peak_bytes" else DEVICE_COLORS[device]
        ys = [values[m] / divisor if m in values else None for m in methods]
        panels.add({"type": "bar", "x": labels, "y": ys, "name": f"{device}: {metric}", "offsetgroup": metric,
                    "marker": {"color": color}, "meta": {**meta, "machine": sides[device][0], "device": device},
                    "customdata": [format_value(values.get(m), "bytes") for m in methods],
                    "hovertemplate": f"<b>%{{x}}</b> {esc(metric)}<br>%{{customdata}}<extra></extra>"}, "memory")
    layout = panels.layout
    layout["yaxis"].update(type="log", title={"text": "seconds per call"})
    layout["yaxis2"].update(type="log", title={"text": "× (above 1: faster on cuda)"})
    layout["yaxis3"].update(title={"text": unit})
    layout["shapes"].append({"type": "line", "xref": "x2 domain", "x0": 0, "x1": 1, "yref": "y2", "y0": 1, "y1": 1,
                             "line": {"color": "#555", "dash": "dot", "width": 1}})
    layout.update(barmode="group", bargap=0.2, height=layout["height"] + 60,
                  legend={"orientation": "h", "y": -0.35, "font": {"size": 11}})
    return panels.fig


def render(ctx: Context) -> Page:
    page = Page("devices.html", "Devices", intro=(
        "<p>Each workload's methods on the CPU and on CUDA, at the sizes measured on both: the time "
        "per call on each device (asv's <code>time_run</code>, each CUDA call synchronised), the GPU "
        "over CPU speed-up of each method (the CPU time over the CUDA time: above 1, faster on the "
        "GPU), and the peak memory of one call (on CUDA the caching allocator's peak, reset before "
        "the call, and NVML's peak of the whole device, the CUDA context included; on the CPU the "
        "peak of tensor bytes torch's allocator held during the call). A CUDA run is paired with the CPU run of its own machine where it "
        "has one, else with the newest CPU run: the titles name both. CUDA results come from "
        "<code>.ci/gpu-check all</code> on a GPU machine (docs/guide/gpu.md). "
        f"{ctx.measured_note()}</p>"))
    times = ctx.latest_per_case([TIME_METRIC])
    if not times.empty:
        times = times[times["device"].isin(["cpu", "cuda"])]
    found = pairs(times) if not times.empty else []
    shown = 0
    for cpu_run, cuda_run in found:
        on = times[times["machine"].isin([cpu_run, cuda_run])]
        for workload in sorted(on["workload"].unique()):
            w = on[on["workload"] == workload]
            cpu_sizes = set(w[(w["machine"] == cpu_run) & (w["device"] == "cpu")]["size"].dropna())
            cuda_sizes = set(w[(w["machine"] == cuda_run) & (w["device"] == "cuda")]["size"].dropna())
            for size in sorted(cpu_sizes & cuda_sizes, key=natural_key):
                fig = device_figure(ctx, w[w["size"] == size], workload, size, cpu_run, cuda_run)
                same = "" if cpu_run.split("/")[0] == cuda_run.split("/")[0] else " (two machines)"
                page.figure(fig, title=f"{workload} [{size}] · cpu: {cpu_run} · cuda: {cuda_run}{same}",
                            workload=workload)
                shown += 1
    if not shown:
        page.notice("No workload has results on both cpu and cuda at one size. The CPU results come "
                    "from <code>make bench</code>; the CUDA ones from <code>.ci/gpu-check all</code> on "
                    "a GPU machine, committed under <code>results/&lt;machine&gt;/</code>.", "warn")
    return page
