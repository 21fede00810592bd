"""Steady-state benchmarks of every workload x size x method x device, generated from the registry.

One class per workload (named after it); parameters (size, method, device). The metrics:

- time_run: one call; on cuda the call is synchronized, so kernels are timed, not just launched.
- peakmem_run: the process's peak RSS after one call. It includes the torch import and the setup
  (hundreds of MB), so it compares methods on equal terms but is not the method's own memory:
- track_alloc_peak_bytes (cpu, torch methods): the call's memory: the peak of bytes torch's CPU
  allocator handed out during one call and held at once (measuring.memory.alloc_peak_bytes; exact,
  the same in every process).
- track_xla_memory_bytes (jax): XLA's compiled memory analysis of the jitted program: temporaries
  + outputs + arguments - aliased (measuring.memory.xla_memory).
- track_rss_delta_bytes: secondary, process-level: how far RSS rose during one call (pages, not
  tensors: 0 where the allocator reuses freed pages).
- track_cuda_peak_bytes: torch.cuda.max_memory_allocated during one call (reset before it), above
  what was allocated before it (the inputs).
- track_nvml_peak_bytes: device memory in use as NVML reports it, sampled during one call.
- track_speedup_vs_loop: the loop's time / this method's time, both timed in one process,
  interleaved, round by round (higher is better); the value is the median over the rounds, the
  rounds' figures are its samples (the dashboard's interval).
- track_ratio_vs_torch_func: this method's time / torch.func's time, likewise (1 is parity; lower
  is better).

Where the work happens. asv runs each point of each metric in a process of its own. The timed and
per-process metrics (time_run, peakmem_run, the cuda ones) build the case and make the method's
first call in their own setup (`prepared`), so a trace or compile happens outside every
measurement (its cost is bench_first_call.track_compile_seconds); the case is kept for the
process, so asv re-running setup before each sample (asv_runner >= 0.3: "setup hooks re-run")
costs nothing. The RSS growth and the ratios come from the case's pass (suite.workload_pass: one
process measures every method of a case, the other points read it).
"""
from __future__ import annotations

from typing import Any, Callable

from measuring import memory
from workloads.base import BASELINE, REFERENCE, Workload

from . import probes, selection, workload_pass
from .generate import workload_classes

probes.preload()

QUICK = selection.active_profile() == "quick"

# (workload, size, method, device) -> the prepared call, for this process (see the docstring).
_PREPARED: dict[tuple[str, str, str, str], Callable[[], Any]] = {}


def prepared(workload: Workload, size: str, method: str, device: str) -> Callable[[], Any]:
    """The measured call of the case, built and first-called once per process."""
    key = (workload.name, size, method, device)
    if key not in _PREPARED:
        state = probes.setup_case(workload, size, method, device)
        probes.first_call(workload, method, state)
        _PREPARED[key] = workload_pass.synchronized(lambda: workload.run(method, state), device)
    return _PREPARED[key]


def _once(unit: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a single-shot metric: its unit, and one process per case even when rounds > 1."""
    def mark(func: Callable[..., Any]) -> Callable[..., Any]:
        func.unit = unit  # type: ignore[attr-defined]
        func.rounds = 1  # type: ignore[attr-defined]
        return func
    return mark


def _own_case(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a metric that needs the prepared case in its process (generate.py gives it a setup)."""
    func.case_setup = prepared  # type: ignore[attr-defined]
    return func


def _round_figures(values: list[float]) -> dict[str, Any]:
    """A track's figures, one per round, in the form asv stores as a timing's samples: asv records
    their median as the value and keeps them (--record-samples) for the interval."""
    return {"samples": values, "number": 1}


class _SteadyState:
    """Base of the generated classes: the workload's case, prepared, and the metrics above."""

    workload: Workload
    version = selection.SUITE_VERSION
    timeout = 300.0  # a pass makes every method's first call; *_compiled ones compile cold
    if QUICK:
        warmup_time, repeat, rounds = 0.05, (3, 8, 0.6), 1
    else:
        warmup_time, repeat, rounds = 0.5, (5, 20, 10.0), 2

    def setup(self, size: str, method: str, device: str) -> None:
        """Every point: skip what the profile or this environment leaves out (NotImplementedError).
        Cheap: the metrics that need the prepared case have their own setup (`_own_case`)."""
        probes.check_case(self.workload, size, method, device)
        self.key = (self.workload.name, size, method, device)
        self.device = device

    def _pass(self, size: str, device: str, *methods: str) -> workload_pass.CasePass:
        return workload_pass.case_pass(self.workload, size, device, methods)

    @_own_case
    def time_run(self, size: str, method: str, device: str) -> None:
        _PREPARED[self.key]()

    @_own_case
    def peakmem_run(self, size: str, method: str, device: str) -> None:
        _PREPARED[self.key]()

    @_once("bytes")
    def track_rss_delta_bytes(self, size: str, method: str, device: str) -> int:
        case = self._pass(size, device, method)
        return case.figure(method, case.rss_bytes)

    @_once("bytes")
    def track_alloc_peak_bytes(self, size: str, method: str, device: str) -> int:
        case = self._pass(size, device, method)
        return case.figure(method, case.memory_table("alloc_bytes"))

    @_once("bytes")
    def track_xla_memory_bytes(self, size: str, method: str, device: str) -> int:
        case = self._pass(size, device, method)
        return case.figure(method, case.memory_table("xla_bytes"))

    @_own_case
    @_once("bytes")
    def track_cuda_peak_bytes(self, size: str, method: str, device: str) -> int:
        return memory.cuda_peak_bytes(_PREPARED[self.key], device)

    @_own_case
    @_once("bytes")
    def track_nvml_peak_bytes(self, size: str, method: str, device: str) -> int:
        return probes.nvml_peak_bytes(_PREPARED[self.key], device)

    @_once("ratio")
    def track_speedup_vs_loop(self, size: str, method: str, device: str) -> dict[str, Any]:
        return _round_figures(self._pass(size, device, BASELINE, method).round_ratios(BASELINE, method))

    @_once("ratio")
    def track_ratio_vs_torch_func(self, size: str, method: str, device: str) -> dict[str, Any]:
        return _round_figures(self._pass(size, device, method, REFERENCE).round_ratios(method, REFERENCE))


globals().update(workload_classes(_SteadyState, "bench_workloads"))
