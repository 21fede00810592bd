"""Timing and memory measurement shared by the CLI, the ASV suite and the profiler.

Three primitives, each taking a zero-argument callable (the measured call):

- `time_call(fn, repeat, warmup, device)`: wall times of `repeat` calls after `warmup` calls, with
  `torch.cuda.synchronize` around each call on CUDA so kernels are not timed as launched-only.
- `rss_delta_bytes(fn)`: how far the process's resident set rose above its level before the call
  (peak during the call, read from /proc, not a sample after it). Linux only; no psutil needed.
- `cuda_peak_bytes(fn, device)`: peak CUDA memory allocated during the call, above what was
  allocated before it.
- `interleaved_times(fns, repeat, device)`: several callables timed round-robin, so that load
  bursts on a shared machine hit all of them alike (what `vmapbench run` uses for its ratios).

`measure(workload, method, state, ...)` combines them into one `Measurement` for a table row.
"""
from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _is_cuda(device: str | torch.device | None) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _sync(device: str | torch.device | None) -> None:
    if _is_cuda(device):
        torch.cuda.synchronize(device)


def time_call(
    fn: Callable[[], Any], repeat: int = 5, warmup: int = 1, device: str | torch.device | None = None
) -> list[float]:
    """Wall-clock seconds of `repeat` calls of `fn`, after `warmup` untimed calls.

    On a CUDA device the queue is drained before the clock starts and before it stops, so each
    time covers the kernels the call launched.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def interleaved_times(
    fns: Mapping[str, Callable[[], Any]],
    repeat: int = 5,
    device: str | torch.device | None = None,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """Wall times of `repeat` calls of each function, taken round-robin (one call of each per round).

    On a shared or noisy machine a load burst then hits every method alike, so the ratios between
    them stay meaningful even when absolute times drift. Warm the functions up before calling this.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    times: dict[str, list[float]] = {name: [] for name in fns}
    _sync(device)
    for i in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - start)
        if on_round is not None:
            on_round(i)
    return times


def median(times: list[float]) -> float:
    return statistics.median(times)


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{_STATUS} has no {field} line; RSS measurement needs Linux procfs")


def _reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark to the current RSS (Linux >= 4.0). False if denied."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def release_free_heap() -> None:
    """Hand memory that glibc keeps in its free lists back to the OS (no-op off glibc).

    Without this, a call that reuses blocks freed by an earlier call shows no RSS growth at all.
    """
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None


def rss_delta_bytes(fn: Callable[[], Any]) -> int:
    """Peak resident-set growth (bytes) while `fn` runs, relative to the RSS just before it.

    Uses the kernel's high-water mark (VmHWM), reset first through /proc/self/clear_refs so the
    figure covers temporaries freed before `fn` returns; the C heap's free lists are trimmed first
    so reused blocks are counted too. Where the reset is not permitted, the figure only counts
    growth beyond the process's earlier peak (a lower bound, often 0).
    """
    if not _STATUS.exists():
        raise RuntimeError("rss_delta_bytes needs /proc/self/status (Linux); it is not available here")
    release_free_heap()
    if _reset_peak_rss():
        before = _status_kib("VmRSS")
    else:
        before = _status_kib("VmHWM")
    fn()
    peak = _status_kib("VmHWM")
    return max(0, peak - before) * 1024


def cuda_peak_bytes(fn: Callable[[], Any], device: str | torch.device = "cuda") -> int:
    """Peak CUDA memory allocated by PyTorch while `fn` runs, above what was allocated before."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_peak_bytes needs a CUDA device; torch.cuda.is_available() is False")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - before)


def peak_bytes(fn: Callable[[], Any], device: str | torch.device = "cpu") -> int:
    """`cuda_peak_bytes` on a CUDA device, `rss_delta_bytes` otherwise."""
    return cuda_peak_bytes(fn, device) if _is_cuda(device) else rss_delta_bytes(fn)


@dataclass
class Measurement:
    """One method of one workload at one size: what a table row or a profile header shows."""

    workload: str
    method: str
    size: str
    device: str
    first_call_s: float  # the first call: tracing / compiling happens here
    times_s: list[float]
    peak_bytes: int

    @property
    def median_s(self) -> float:
        return median(self.times_s)


def measure(workload: Any, method: str, size: str, state: Any, repeat: int = 5, warmup: int = 1,
            memory: bool = True) -> Measurement:
    """Measure `workload.run(method, state)`: first call, `repeat` timed calls, peak memory."""
    device = getattr(state, "device", "cpu")
    first = workload.prepare(method, state)
    times = time_call(lambda: workload.run(method, state), repeat=repeat, warmup=warmup, device=device)
    peak = peak_bytes(lambda: workload.run(method, state), device) if memory else 0
    return Measurement(workload.name, method, size, str(device), first, times, peak)
