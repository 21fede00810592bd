"""torch.profiler around a few measured calls: a chrome trace and the aten ops that cost the most.

Runs inside the profiled child process. The tables rank `aten::` ops by *self* time (time in the
op minus the ops it called), so a composite like `aten::matmul` does not hide the `aten::mm` that
does the work. On CUDA a second ranking uses self device time (kernels each op launched).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

US_PER_S = 1e6


def profile_calls(call: Callable[[], Any], *, calls: int, max_seconds: float, cuda: bool,
                  trace_path: Path, label: str) -> tuple[Any, int]:
    """Run `call` up to `calls` times (at least once, at most ~max_seconds) under torch.profiler.

    Each call is wrapped in a `record_function(label#i)` range so iterations are visible in the
    trace. Returns (the key_averages() table, number of calls profiled).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    done = 0
    with profile(activities=activities, record_shapes=False, profile_memory=False) as prof:
        start = time.perf_counter()
        while done < max(calls, 1):
            with record_function(f"{label}#{done}"):
                call()
                if cuda:
                    torch.cuda.synchronize()
            done += 1
            if time.perf_counter() - start >= max_seconds:
                break
    prof.export_chrome_trace(str(trace_path))
    return prof.key_averages(), done


def _self_device_us(event: Any) -> float:
    # `self_device_time_total` replaced `self_cuda_time_total`; read whichever this torch has.
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def top_ops(averages: Any, *, by: str = "cpu", n: int = 15, calls: int = 1) -> list[dict[str, Any]]:
    """The `n` aten ops with the largest self time, as JSON-ready rows.

    `by` is "cpu" or "cuda". Times are microseconds per measured call (divided by `calls`);
    `percent` is the share of the self time of all aten ops.
    """
    if by not in ("cpu", "cuda"):
        raise ValueError(f"top_ops: by must be 'cpu' or 'cuda', got {by!r}")
    self_time = (lambda e: float(e.self_cpu_time_total)) if by == "cpu" else _self_device_us
    total_time = ((lambda e: float(e.cpu_time_total)) if by == "cpu"
                  else (lambda e: float(getattr(e, "device_time_total", 0.0) or 0.0)))
    ops = [e for e in averages if str(e.key).startswith("aten::")]
    grand = sum(self_time(e) for e in ops)
    ranked = sorted(ops, key=self_time, reverse=True)
    rows = []
    for e in ranked[:n]:
        spent = self_time(e)
        if spent <= 0:
            break
        rows.append({
            "op": str(e.key),
            "calls_per_call": e.count / calls,
            "self_us_per_call": spent / calls,
            "total_us_per_call": total_time(e) / calls,
            "percent": 100.0 * spent / grand if grand else 0.0,
        })
    return rows
