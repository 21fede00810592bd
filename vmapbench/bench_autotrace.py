"""Repeated calls of the default engine (automatic tracing) against torch.func, the explicit
engine.trace and the eager engine, on workloads of the registry (python -m vmapbench.bench_autotrace).

Every method's measured call is the registry's own (`Workload.setup(...).fn(method)`), prepared
(the first call, and for `engine` the two calls before an automatic replay), checked against the
workload's float64 reference, and then timed call by call, the methods alternating (their order
rotating each repeat: measuring.timer.rounds), all in this one process, so that load on a shared
machine hits all alike. Reported per workload: the median per-call time of each method, the
median [quartiles] of the ratio of each call to the torch.func call next to it, and what automatic
tracing decided for the workload's transforms (replayed, or eager and why).
"""
from __future__ import annotations

import argparse
from typing import Any

import engine.autotrace
import workloads
from measuring import stats, timer

METHODS = ("engine", "engine_eager", "engine_traced", "torch_func")
DEFAULT_WORKLOADS = ("psg_mlp", "logreg_hessian", "mlp_jacobian", "nn_mnist_cnn")


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


def bench(name: str, size: str | None, repeats: int) -> None:
    workload = workloads.get(name)
    size = size or workload.quick[0]
    state = workload.setup(workload.params(size), "cpu")
    methods = [m for m in METHODS if workload.supports(m)]
    first = {m: workload.prepare(m, state) for m in methods}
    workload.check(state, methods)
    times = timer.rounds({m: state.fn(m) for m in methods}, repeats, rotate=True)
    print(f"== {name} [{size}] ({repeats} calls per method, alternating)")
    for m in methods:
        low, mid, high = stats.quartiles([t / ref for t, ref in zip(times[m], times["torch_func"])])
        print(
            f"  {m:<14} {stats.median(times[m]) * 1e3:9.3f} ms/call   /torch_func {mid:5.2f} "
            f"[{low:.2f}-{high:.2f}]   first call {first[m]:.3f} s"
        )
    print(f"  automatic tracing: {_decisions(_autotraced(state.fn('engine')))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=list(DEFAULT_WORKLOADS))
    parser.add_argument("--size", default=None, help="grid point (default: the workload's quick size)")
    parser.add_argument("--repeats", type=int, default=40, help="timed calls per method")
    args = parser.parse_args()
    from suite.probes import pin_threads

    pin_threads()
    for name in args.workloads:
        bench(name, args.size, args.repeats)


if __name__ == "__main__":
    main()
