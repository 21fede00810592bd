"""First-call benchmarks of every workload x size x method x device, generated from the registry.

Same classes and parameters as bench_workloads.

- track_compile_seconds: Workload.prepare (the first call) of a traced or compiled method (and of
  jax.jit in the compiled family), with an empty TorchInductor cache, so it is the cold compile a
  user pays on a fresh machine (each benchmark runs in a fresh process: XLA's cache is empty too).
  Its own setup only builds the data and the method (imports such as jax's, copies of the data,
  wrappers): the measured call is the method's first one, where tracing and compiling happen.
- track_fallbacks: engine fallback calls (engine.record_fallbacks) during the first call and one
  steady call of an engine method, counted in the case's pass (suite.workload_pass, shared with
  bench_workloads). Must be 0 for every shipped workload: a fallback is a hidden per-example loop.
- track_torch_fallbacks: torch.func's own fallback calls (ops torch's vmap has no batching rule
  for, which it runs as a loop: its fallback warnings) during the same calls of torch.func, counted
  in the same pass: what a torch release changed for torch.func (the Torch versions page).
"""
from __future__ import annotations

from workloads.base import Workload

from . import probes, selection, workload_pass
from .generate import workload_classes

probes.preload()


def _built(workload: Workload, size: str, method: str, device: str) -> None:
    """track_compile_seconds' own setup: the case's state with the method built, not yet called."""
    state = probes.setup_case(workload, size, method, device)
    build = getattr(state, "fn", None)  # workloads.define's states build a method apart from calling it
    if build is not None:
        build(method)  # NotImplementedError here (a missing package) is a skip, as in setup_case
    _BUILT[(workload.name, size, method, device)] = state


_BUILT: dict[tuple[str, str, str, str], object] = {}


class _FirstCall:
    """Base of the generated classes: the workload's case, not yet called."""

    workload: Workload
    version = selection.SUITE_VERSION
    timeout = 600.0  # a cold torch.compile of a big graph on a small machine takes minutes
    rounds = 1

    def setup(self, size: str, method: str, device: str) -> None:
        probes.check_case(self.workload, size, method, device)
        self.key = (self.workload.name, size, method, device)

    def track_compile_seconds(self, size: str, method: str, device: str) -> float:
        with probes.fresh_inductor_cache():
            return probes.first_call(self.workload, method, _BUILT[self.key])

    track_compile_seconds.unit = "seconds"  # type: ignore[attr-defined]
    track_compile_seconds.case_setup = _built  # type: ignore[attr-defined]

    def track_fallbacks(self, size: str, method: str, device: str) -> int:
        case = workload_pass.case_pass(self.workload, size, device, (method,))
        if method in case.fallbacks_skipped:
            raise probes.SkipNotImplemented(case.fallbacks_skipped[method])
        return case.figure(method, case.fallbacks)

    track_fallbacks.unit = "calls"  # type: ignore[attr-defined]

    def track_torch_fallbacks(self, size: str, method: str, device: str) -> int:
        case = workload_pass.case_pass(self.workload, size, device, (method,))
        return case.figure(method, case.torch_fallbacks)

    track_torch_fallbacks.unit = "calls"  # type: ignore[attr-defined]


globals().update(workload_classes(_FirstCall, "bench_first_call"))
