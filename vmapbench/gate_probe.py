"""One measuring process of the regression gate: every workload of one commit, in one process.

The gate (vmapbench/gate.py) runs this file in a fresh interpreter per (commit, job), with the
commit's checkout first on sys.path, so `engine` and `workloads` are the commit's. The measuring
code is the gate's own (this file and the gate checkout's suite/, loaded under the alias package
`_gate_suite`), as asv measures every commit with the current suite: a change to the measuring
code in a pull request cannot show up as a change of the code measured.

Two kinds of process:

- time (default): every workload of the commit's registry at its first quick size (else its first
  size), cpu, methods GATE_METHODS (the engine as users get it, eager, traced; torch.func and the
  loop as references). Per workload it makes each method's first call, then times the methods
  interleaved in rounds, in CPU seconds of this process (one intra-op thread), and stops when every
  ratio to torch.func is known to +-TARGET_HALFWIDTH or the workload's budget is spent (rounds
  chosen by each signal's own variance: a steady signal costs MIN_ROUNDS rounds, a noisy one more).
  The per-op overhead chain (suite/bench_overhead.py) is timed the same way against native.
  Output: {"times": {workload: {size: {method: [seconds per call, one per round]}}},
  "overhead": {method: [seconds per chain call, one per round]}, "errors": {case: message}}.
- count (--count LIB, under valgrind, see vmapbench/counts.py): the per-op chain and the workloads
  named by --workloads, each engine method's steady-state call counted twice in instructions
  (the two counts of one region show that it is deterministic). Output: {"regions": [label, ...],
  "errors": {...}}; the counts are in callgrind's dump files, one per region, read by the gate.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping

GATE_ROOT = Path(__file__).resolve().parents[1]
ALIAS = "_gate_suite"
# The methods timed: the engine as a user gets it (automatic tracing), eager (automatic tracing off:
# every first call and every function the trace cannot prove runs this path), traced and replayed;
# torch.func and the loop, the references the gated ratios divide by.
GATE_METHODS = ("engine", "engine_eager", "engine_traced", "torch_func", "loop")
# Counted per workload: the engine as users get it (its automatic trace's replay where proven) and
# eager; engine_traced replays the same kind of graph as `engine` and would cost a third more
# valgrind time (the per-op chain's engine_traced count keeps engine.trace's replay counted).
COUNT_METHODS = ("engine", "engine_eager")
CHAIN_COUNT_METHODS = ("engine", "engine_traced", "engine_auto")
COUNT_REPEATS = 2
MIN_ROUNDS = 5
MAX_ROUNDS = 25
TARGET_HALFWIDTH = 0.02
MIN_BATCH_S = 0.004
# The per-op chain's input: overhead-bound small tensors, where a dispatch-path regression shows most.
OVERHEAD_SIZE = "small"


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


def _gate_module(name: str, path: Path) -> ModuleType:
    """A module of the gate checkout by its file (the measured commit's tree is what sys.path holds)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


def halfwidth(samples: list[float]) -> float:
    """Relative half-width of a ~95% interval of the median of `samples` (order statistics'
    normal approximation: 1.57 x IQR / sqrt(n)); inf with fewer than 3 samples."""
    if len(samples) < 3:
        return math.inf
    q = statistics.quantiles(samples, n=4)
    median = statistics.median(samples)
    return math.inf if median <= 0 else 1.57 * (q[2] - q[0]) / math.sqrt(len(samples)) / median


def adaptive_samples(calls: Mapping[str, Callable[[], Any]], reference: str | None, budget_s: float,
                     clock: Callable[[], float], min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS,
                     target: float = TARGET_HALFWIDTH) -> dict[str, list[float]]:
    """Seconds per call of each callable, one figure per round, the callables interleaved (forward
    order on even rounds, reverse on odd ones). Rounds go on past `min_rounds` until every
    callable's ratio to `reference` (round by round) has a relative half-width under `target`,
    `max_rounds` are done, or `budget_s` (on `clock`) is spent."""
    def batch(fn: Callable[[], Any], number: int) -> float:
        start = clock()
        for _ in range(number):
            fn()
        return (clock() - start) / number

    number = {name: max(1, min(10_000, math.ceil(MIN_BATCH_S / max(batch(fn, 1), 1e-7)))) for name, fn in calls.items()}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    started = clock()
    for r in range(max_rounds):
        for name in order if r % 2 == 0 else reversed(order):
            samples[name].append(batch(calls[name], number[name]))
        if r + 1 < min_rounds:
            continue
        if clock() - started > budget_s:
            break
        if reference in samples:
            ref = samples[reference]
            widths = [halfwidth([a / b for a, b in zip(s, ref)]) for n, s in samples.items() if n != reference]
            if all(w < target for w in widths):
                break
    return samples


def first_size(workload: Any) -> str:
    """The size the gate measures: the first quick size, else the first of the grid (the smallest)."""
    return (tuple(workload.quick) or tuple(workload.sizes))[0]


def gate_methods(workload: Any, methods: tuple[str, ...] = GATE_METHODS) -> list[str]:
    supports = getattr(workload, "supports", lambda m: m in workload.methods)
    return [m for m in methods if supports(m)]


def registry_names() -> list[str]:
    from workloads.base import all_workloads

    return [w.name for w in all_workloads()]


def prepared(name: str, methods: tuple[str, ...], errors: dict[str, str]) -> tuple[str, dict[str, Callable[[], Any]]]:
    """(size, method -> call) of workload `name`, each call made once (its first call, and the
    automatic trace's warm-up calls); a method that fails goes to `errors`, not to the calls."""
    import functools

    from workloads.base import get

    probes = gate_suite("probes")
    workload = get(name)
    size = first_size(workload)
    try:
        state = workload.setup(workload.params(size), "cpu")
    except Exception as exc:  # noqa: BLE001 - reported as this case's failure
        errors[f"{name} {size}"] = f"setup: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        return size, {}
    calls: dict[str, Callable[[], Any]] = {}
    for method in gate_methods(workload, methods):
        try:
            probes.first_call(workload, method, state)
        except Exception as exc:  # noqa: BLE001
            errors[f"{name} {size} {method}"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            continue
        calls[method] = functools.partial(workload.run, method, state)
    return size, calls


def measure_workloads(names: list[str], budget_s: float, clock: Callable[[], float]) -> tuple[dict, dict, dict]:
    times: dict[str, dict[str, dict[str, list[float]]]] = {}
    errors: dict[str, str] = {}
    cost: dict[str, float] = {}
    for name in names:
        started = time.process_time()
        size, calls = prepared(name, GATE_METHODS, errors)
        if calls:
            times.setdefault(name, {})[size] = adaptive_samples(calls, "torch_func", budget_s, clock)
        cost[name] = time.process_time() - started
    return times, errors, cost


def chain_calls(methods: tuple[str, ...], errors: dict[str, str]) -> dict[str, Callable[[], Any]]:
    overhead = gate_suite("bench_overhead")
    x = overhead.make_input(OVERHEAD_SIZE)
    calls = {}
    for method in methods:
        try:
            call = overhead.chain_call(method, x)
            call()
            calls[method] = call
        except Exception as exc:  # noqa: BLE001
            errors[f"per-op overhead {method}"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return calls


def measure_overhead(budget_s: float, clock: Callable[[], float]) -> tuple[dict[str, list[float]], dict[str, str]]:
    errors: dict[str, str] = {}
    calls = chain_calls(tuple(gate_suite("bench_overhead").METHODS), errors)
    if "native" not in calls:
        return {}, errors
    return adaptive_samples(calls, "native", budget_s, clock), errors


def count_regions(library: str, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Count each engine method's steady-state call (COUNT_REPEATS times) of the per-op chain and of
    the workloads `names`, under callgrind. Region labels: 'chain|method|rep', 'wl|name|size|method|rep'.
    Every case is set up and called first (uninstrumented), then instrumentation is turned on once."""
    counts = _gate_module("vmapbench.counts", GATE_ROOT / "vmapbench" / "counts.py")
    requests = counts.Requests(library)
    if not requests.on_valgrind:
        raise RuntimeError("--count: this process is not running under valgrind (see vmapbench.counts.command)")
    errors: dict[str, str] = {}
    cases: list[tuple[str, Callable[[], Any]]] = []
    for method, call in chain_calls(CHAIN_COUNT_METHODS, errors).items():
        cases.append((f"chain|{method}", call))
    for name in names:
        size, calls = prepared(name, COUNT_METHODS, errors)
        cases += [(f"wl|{name}|{size}|{method}", call) for method, call in calls.items()]
    labels = []
    for label, call in cases:
        call()  # its code translated with instrumentation on, once, before it is counted
        for rep in range(COUNT_REPEATS):
            with requests.region(f"{label}|{rep}"):
                call()
            labels.append(f"{label}|{rep}")
    requests.instrument(False)
    return labels, errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="all", help="comma list of workloads, 'all' (the registry) or '' (none)")
    p.add_argument("--overhead", action="store_true", help="also measure the per-op overhead chain")
    p.add_argument("--budget", type=float, default=0.5, help="CPU seconds of one workload's timed rounds at most")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                   help="cpu: CPU seconds of this process (default; other processes' load does not count); wall")
    p.add_argument("--count", default=None, metavar="LIB",
                   help="count instructions under callgrind with this client-request library (vmapbench.counts)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    gate_suite("probes").pin_threads()
    try:
        names = registry_names() if args.workloads == "all" else [n for n in args.workloads.split(",") if n]
        if args.count:
            labels, errors = count_regions(args.count, names)
            Path(args.out).write_text(json.dumps({"regions": labels, "errors": errors,
                                                  "process_cpu_s": time.process_time()}))
            return 0
        clock = CLOCKS[args.clock]
        times, errors, cost = measure_workloads(names, args.budget, clock)
        overhead: dict[str, list[float]] = {}
        if args.overhead:
            overhead, more = measure_overhead(args.budget, clock)
            errors.update(more)
    except Exception:  # noqa: BLE001 - the whole process failed: say why, exit 3
        Path(args.out).write_text(json.dumps({"fatal": traceback.format_exc()}))
        return 3
    Path(args.out).write_text(json.dumps({"times": times, "overhead": overhead, "errors": errors,
                                          "cpu_seconds": cost, "clock": args.clock,
                                          "process_cpu_s": time.process_time()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
