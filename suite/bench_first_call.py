"""First-call benchmarks of every workload x size x method x device, generated from the registry.

Same classes and parameters as bench_workloads, but setup only builds the data and the method
(imports such as jax's, copies of the data, wrappers): the measured call is the method's first
one, where tracing and compiling happen.

- track_compile_seconds: Workload.prepare (the first call) of a traced or compiled method (and of
  jax.jit in the compiled family), with an empty TorchInductor cache, so it is the cold compile a
  user pays on a fresh machine (each benchmark runs in a fresh process: XLA's cache is empty too).
- track_fallbacks: engine fallback calls (engine.record_fallbacks) during the first call and one
  steady call of an engine method. Must be 0 for every shipped workload: a fallback is a hidden
  per-example loop.
"""
from __future__ import annotations

from workloads.base import Workload

from . import probes, selection
from .generate import workload_classes

probes.preload()


class _FirstCall:
    """Base of the generated classes: the workload's case, not yet called."""

    workload: Workload
    version = selection.SUITE_VERSION
    timeout = 600.0  # a cold torch.compile takes ~30 s on 2 cores, several minutes for big graphs
    rounds = 1

    def setup(self, size: str, method: str, device: str) -> None:
        self.state = probes.setup_case(self.workload, size, method, device)
        build = getattr(self.state, "fn", None)  # workloads.define's states build a method apart from calling it
        if build is not None:
            build(method)  # NotImplementedError here (a missing package) is a skip, as in setup_case

    def track_compile_seconds(self, size: str, method: str, device: str) -> float:
        with probes.fresh_inductor_cache():
            return probes.first_call(self.workload, method, self.state)

    track_compile_seconds.unit = "seconds"  # type: ignore[attr-defined]

    def track_fallbacks(self, size: str, method: str, device: str) -> int:
        def first_and_steady_call() -> None:
            probes.first_call(self.workload, method, self.state)
            self.workload.run(method, self.state)
        return probes.fallback_count(first_and_steady_call)

    track_fallbacks.unit = "calls"  # type: ignore[attr-defined]


globals().update(workload_classes(_FirstCall, "bench_first_call"))
