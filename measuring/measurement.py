"""`Measurement`, one method of one workload at one size as a table row or a profile header shows
it, and `measure`, which takes one from a workload.

A workload here is anything with `name`, `prepare(method, state)` and `run(method, state)` (the
registry's `workloads.base.Workload`); nothing of workloads/ is imported, as measuring/ stands below it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from measuring import stats
from measuring.memory import method_peak_bytes
from measuring.timer import time_call


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
        return stats.median(self.times_s)


def measure(workload: Any, method: str, size: str, state: Any, repeat: int = 5, warmup: int = 1,
            memory: bool = True) -> Measurement:
    """Measure `workload.run(method, state)`: first call (`workload.prepare`), `repeat` timed calls,
    and the memory of one steady call (`method_peak_bytes`; 0 without `memory`)."""
    device = getattr(state, "device", "cpu")
    first = workload.prepare(method, state)
    times = time_call(lambda: workload.run(method, state), repeat=repeat, warmup=warmup, device=device)
    call = state.fn(method) if method == "jax" else (lambda: workload.run(method, state))
    peak = method_peak_bytes(call, method, device) if memory else 0
    return Measurement(workload.name, method, size, str(device), first, times, peak)
