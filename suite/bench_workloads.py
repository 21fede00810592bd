"""Steady-state benchmarks of every workload x size x method x device, generated from the registry.

One class per workload (named after it); parameters (size, method, device). setup builds the
case's seeded data and makes the method's first call, so a trace or compile happens outside every
measurement (its cost is bench_first_call.track_compile_seconds). The metrics:

- time_run: one call; on cuda the call is synchronized, so kernels are timed, not just launched.
- peakmem_run: the process's peak RSS after one call. It includes the torch import and the setup
  (hundreds of MB), so it compares methods on equal terms but is not the method's own memory:
- track_rss_delta_bytes: how far RSS rose during one call above its level before it.
- track_cuda_peak_bytes: torch.cuda.max_memory_allocated during one call (reset before it), above
  what was allocated before it (the inputs).
- track_nvml_peak_bytes: device memory in use as NVML reports it, sampled during one call.
- track_speedup_vs_loop: the loop's time / this method's time, both timed in this process,
  interleaved (higher is better).
- track_ratio_vs_torch_func: this method's time / torch.func's time, likewise (1 is parity; lower
  is better).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from workloads import measure
from workloads.base import BASELINE, REFERENCE, Workload

from . import probes, selection
from .generate import workload_classes

probes.preload()

QUICK = selection.active_profile() == "quick"
# Budget of one interleaved ratio measurement (seconds) and its rounds; see probes.interleaved_seconds.
# The quick profile's ~190 ratio cases share make bench's 10 minutes (0.4 s each, not 0.6: -35 s);
# the full profile and `python -m vmapbench.peer_ratios` measure ratios for longer.
RATIO_BUDGET = {"budget_s": 0.4, "rounds": 5} if QUICK else {"budget_s": 6.0, "rounds": 15}


def _once(unit: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a single-shot metric: its unit, and one process per case even when rounds > 1."""
    def mark(func: Callable[..., Any]) -> Callable[..., Any]:
        func.unit = unit  # type: ignore[attr-defined]
        func.rounds = 1  # type: ignore[attr-defined]
        return func
    return mark


class _SteadyState:
    """Base of the generated classes: the workload's case, prepared, and the metrics above."""

    workload: Workload
    version = selection.SUITE_VERSION
    timeout = 300.0  # setup compiles for *_compiled methods (~30 s cold on 2 cores)
    if QUICK:
        warmup_time, repeat, rounds = 0.05, (3, 8, 0.6), 1
    else:
        warmup_time, repeat, rounds = 0.5, (5, 20, 10.0), 2

    def setup(self, size: str, method: str, device: str) -> None:
        self.device = device
        self.state = probes.setup_case(self.workload, size, method, device)
        probes.first_call(self.workload, method, self.state)
        self.call = self._call_of(method)

    def _call_of(self, method: str) -> Callable[[], Any]:
        run = functools.partial(self.workload.run, method, self.state)
        if self.device == "cpu":
            return run

        def synchronized() -> Any:
            out = run()
            probes.synchronize(self.device)
            return out
        return synchronized

    def time_run(self, size: str, method: str, device: str) -> None:
        self.call()

    def peakmem_run(self, size: str, method: str, device: str) -> None:
        self.call()

    @_once("bytes")
    def track_rss_delta_bytes(self, size: str, method: str, device: str) -> int:
        return measure.rss_delta_bytes(self.call)

    @_once("bytes")
    def track_cuda_peak_bytes(self, size: str, method: str, device: str) -> int:
        return measure.cuda_peak_bytes(self.call, device)

    @_once("bytes")
    def track_nvml_peak_bytes(self, size: str, method: str, device: str) -> int:
        return probes.nvml_peak_bytes(self.call, device)

    def _interleaved(self, method: str, other: str) -> dict[str, float]:
        probes.first_call(self.workload, other, self.state)
        calls = {other: self._call_of(other), method: self.call}
        return probes.interleaved_seconds(calls, self.device, **RATIO_BUDGET)

    @_once("ratio")
    def track_speedup_vs_loop(self, size: str, method: str, device: str) -> float:
        seconds = self._interleaved(method, BASELINE)
        return seconds[BASELINE] / seconds[method]

    @_once("ratio")
    def track_ratio_vs_torch_func(self, size: str, method: str, device: str) -> float:
        seconds = self._interleaved(method, REFERENCE)
        return seconds[method] / seconds[REFERENCE]


globals().update(workload_classes(_SteadyState, "bench_workloads"))
