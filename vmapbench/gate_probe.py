"""One measuring process of the regression gate: every gated case of one commit, in one process.

The gate (vmapbench/gate.py) runs this file in a fresh interpreter per (commit, round), with the
commit's checkout first on sys.path, so `engine` and `workloads` are the commit's. The measuring
code is the gate's own (this file and the gate checkout's suite/probes.py, loaded under the alias
package `_gate_suite`), as asv measures every commit with the current suite: a change to the
measuring code in a pull request cannot show up as a change of the code measured.

Per workload (its first quick size, cpu; compiled methods left out: a cold compile costs ~30 s here)
it builds the case once, makes each method's first call, then times all its methods interleaved
(probes.interleaved_seconds): the method/torch.func and loop/method ratios of one process are
what the gate compares, because a busy machine slows every method of a round alike. The engine's
per-op overhead chain (suite/bench_overhead.py) is measured the same way against native.

Output: one JSON object written to --out: {"times": {workload: {size: {method: seconds}}},
"overhead": {method: seconds per chain call}, "errors": {"workload size method": message}}.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

GATE_ROOT = Path(__file__).resolve().parents[1]
ALIAS = "_gate_suite"


def gate_suite(module: str) -> ModuleType:
    """`module` of the gate checkout's suite/ package, imported as `_gate_suite.<module>`."""
    if ALIAS not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            ALIAS, GATE_ROOT / "suite" / "__init__.py", submodule_search_locations=[str(GATE_ROOT / "suite")])
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules[ALIAS] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{ALIAS}.{module}")


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


def measure_workloads(names: list[str], budget_s: float, rounds: int, skip_methods: set[str],
                      clock: Callable[[], float]) -> tuple[dict, dict, dict]:
    import functools

    from workloads.base import get

    probes = gate_suite("probes")
    times: dict[str, dict[str, dict[str, float]]] = {}
    errors: dict[str, str] = {}
    cost: dict[str, float] = {}
    for name in names:
        started = time.process_time()
        workload = get(name)
        for size in workload.quick[:1]:
            try:
                state = workload.setup(workload.params(size), "cpu")
            except Exception as exc:  # noqa: BLE001 - reported as this case's failure
                errors[f"{name} {size}"] = f"setup: {type(exc).__name__}: {exc}"
                continue
            calls: dict[str, Callable[[], Any]] = {}
            # engine_eager (automatic tracing off) is gated too: every first call, and every function
            # the automatic trace cannot prove identical, runs the eager path.
            extra = ("engine_eager",) if getattr(workload, "supports", None) and workload.supports("engine_eager") else ()
            for method in (*workload.methods, *(m for m in extra if m not in workload.methods)):
                if method in skip_methods:
                    continue
                try:
                    probes.first_call(workload, method, state)
                except Exception as exc:  # noqa: BLE001
                    errors[f"{name} {size} {method}"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                    continue
                calls[method] = functools.partial(workload.run, method, state)
            if calls:
                times.setdefault(name, {})[size] = probes.interleaved_seconds(
                    calls, "cpu", rounds=rounds, budget_s=budget_s, clock=clock)
        cost[name] = time.process_time() - started
    return times, errors, cost


# The per-op chain's input the gate times: overhead-bound small tensors, where a dispatch-path
# regression shows most (suite/bench_overhead.SIZES).
OVERHEAD_SIZE = "small"


def measure_overhead(budget_s: float, rounds: int, clock: Callable[[], float]) -> tuple[dict[str, float], dict[str, str]]:
    import torch

    overhead = gate_suite("bench_overhead")
    probes = gate_suite("probes")
    x = overhead.make_input(OVERHEAD_SIZE)
    calls, errors = {}, {}
    for method in overhead.METHODS:
        try:
            call = overhead.chain_call(method, x)
            call()
            calls[method] = call
        except Exception as exc:  # noqa: BLE001
            errors[f"per-op overhead {method}"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if "native" not in calls:
        return {}, errors
    return probes.interleaved_seconds(calls, "cpu", rounds=rounds, budget_s=budget_s, clock=clock), errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="", help="comma list of workloads (empty: none)")
    p.add_argument("--overhead", action="store_true", help="also measure the per-op overhead chain")
    p.add_argument("--budget", type=float, default=0.6, help="seconds of one interleaved measurement")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--skip-methods", default="", help="comma list of methods not measured")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                   help="cpu: CPU seconds of this process (default; other processes' load does not count); wall")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    gate_suite("probes").pin_threads()
    names = [n for n in args.workloads.split(",") if n]
    try:
        clock = CLOCKS[args.clock]
        times, errors, cost = measure_workloads(names, args.budget, args.rounds,
                                                {m for m in args.skip_methods.split(",") if m}, clock)
        overhead: dict[str, float] = {}
        if args.overhead:
            overhead, more = measure_overhead(args.budget, args.rounds, clock)
            errors.update(more)
    except Exception:  # noqa: BLE001 - the whole process failed: say why, exit 3
        Path(args.out).write_text(json.dumps({"fatal": traceback.format_exc()}))
        return 3
    Path(args.out).write_text(json.dumps({"times": times, "overhead": overhead, "errors": errors,
                                          "cpu_seconds": cost, "clock": args.clock}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
