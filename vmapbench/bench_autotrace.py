"""Repeated calls of the default engine (automatic tracing) against torch.func, the explicit
engine.trace and the eager engine, on workloads of the registry (python -m vmapbench.bench_autotrace).

Every method's measured call is the registry's own (`Workload.setup(...).fn(method)`), prepared
(the first call, and for `engine` the two calls before an automatic replay), checked against the
workload's float64 reference, and then timed in rounds that alternate the methods (rotating
their order), all in this one process. Reported per workload: the median per-call time of each
method and the ratio to torch.func per round (median [min-max] over rounds), and what automatic
tracing decided for the workload's transforms (replayed, or eager and why).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import engine.autotrace
import workloads

METHODS = ("engine", "engine_eager", "engine_traced", "torch_func")
DEFAULT_WORKLOADS = ("psg_mlp", "logreg_hessian", "mlp_jacobian", "nn_mnist_cnn")


def _per_call(fn: Callable[[], Any], seconds: float) -> float:
    """Seconds per call, over as many calls as fit in about `seconds` (at least 3)."""
    start, n = time.perf_counter(), 0
    while n < 3 or time.perf_counter() - start < seconds:
        fn()
        n += 1
    return (time.perf_counter() - start) / n


def _autotraced(fn: Any, depth: int = 3) -> list[engine.autotrace.AutoTraced]:
    """The automatic-tracing states of the transform callables a measured call closes over."""
    found = []
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        if not callable(value):
            continue
        try:
            auto = engine.autotrace.autotraced_state(value)
        except TypeError:
            if depth:
                found.extend(_autotraced(value, depth - 1))
            continue
        if auto is not None:
            found.append(auto)
    return found


def _decisions(created: list[engine.autotrace.AutoTraced]) -> str:
    parts = []
    for auto in created:
        info = auto.traced.cache_info()
        if auto.impure is not None:
            parts.append(f"{auto.__name__}: eager ({auto.impure})")
        else:
            parts.append(f"{auto.__name__}: {info.traces} trace(s), {info.hits} replays, {auto.eager_calls} eager calls")
    return "; ".join(parts) or "no automatic trace made"


def bench(name: str, size: str | None, rounds: int, seconds: float) -> None:
    workload = workloads.get(name)
    size = size or workload.quick[0]
    state = workload.setup(workload.params(size), "cpu")
    methods = [m for m in METHODS if m in workload.methods or m == "engine_eager"]
    first = {m: workload.prepare(m, state) for m in methods}
    workload.check(state, [m for m in methods if m in workload.methods])
    times: dict[str, list[float]] = {m: [] for m in methods}
    for r in range(rounds):
        order = methods[r % len(methods):] + methods[:r % len(methods)]
        for m in order:
            times[m].append(_per_call(state.fn(m), seconds))
    print(f"== {name} [{size}] ({rounds} rounds, ~{seconds:.2f} s per method per round)")
    for m in methods:
        ratios = [t / ref for t, ref in zip(times[m], times["torch_func"])]
        print(
            f"  {m:<14} {statistics.median(times[m]) * 1e3:9.3f} ms/call   /torch_func {statistics.median(ratios):5.2f} "
            f"[{min(ratios):.2f}-{max(ratios):.2f}]   first call {first[m]:.3f} s"
        )
    print(f"  automatic tracing: {_decisions(_autotraced(state.fn('engine')))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=list(DEFAULT_WORKLOADS))
    parser.add_argument("--size", default=None, help="grid point (default: the workload's quick size)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.3, help="time per method per round")
    args = parser.parse_args()
    from suite.probes import pin_threads

    pin_threads()
    for name in args.workloads:
        bench(name, args.size, args.rounds, args.seconds)


if __name__ == "__main__":
    main()
