"""Engine eager / torch.func time ratios of registry workloads (python -m vmapbench.bench_ratios).

Issue #18's per-sample-gradient goal is stated as a ratio measured side by side in one process:
for every workload of the registry whose methods include both the engine's eager method and
`torch_func` (by default the `per_sample_grads` family: the torch.nn models called through
functional_call), both are built at the workload's quick size (else its first, smallest size) and
timed alternately, round by round; a round's ratio is engine time / torch.func time of batches of
calls lasting at least `--min-batch` seconds each. Printed per workload: the median ratio over the
rounds and its 10-90% spread; at the end the geometric mean and the worst median.

The engine's eager method is `engine_eager` where the workload supports it (automatic tracing off:
every workload with `engine`) and `engine` otherwise (at commits where the engine did not trace by
default). `--engine default` measures `engine` as users get it instead (automatic tracing on, its
eager, watched and recording calls made before timing). `--profile` prints a cProfile of the
engine's calls of each selected workload (slowest first).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
from typing import Any, Callable

import torch

from measuring import stats, timer
from suite import probes
from workloads.base import Workload, all_workloads, get


def eager_method(workload: Workload) -> str | None:
    """The engine's eager method of `workload` ('engine_eager', else 'engine'), None if it has neither."""
    for method in ("engine_eager", "engine"):
        if workload.supports(method):
            return method
    return None


def measured_size(workload: Workload) -> str:
    """The workload's quick size, else its first (smallest) size."""
    return workload.quick[0] if workload.quick else workload.sizes[0]


def engine_method(workload: Workload, engine: str) -> str | None:
    """The engine method measured: the eager one (`engine` = 'eager'), or `engine` ('default')."""
    if engine == "eager":
        return eager_method(workload)
    if engine == "default":
        return "engine" if workload.supports("engine") else None
    raise ValueError(f"engine must be 'eager' or 'default', got {engine!r}")


def candidates(family: str | None, names: list[str] | None, engine: str = "eager") -> list[Workload]:
    """Workloads with the engine method and torch_func: `names`, else every one of `family`."""
    chosen = [get(n) for n in names] if names else all_workloads(family)
    return [w for w in chosen if engine_method(w, engine) is not None and "torch_func" in w.methods]


MAX_CALLS = 1_000_000  # calls in one batch at most: a bound no workload call reaches


def round_ratios(a: Callable[[], Any], b: Callable[[], Any], rounds: int, min_batch_s: float) -> list[float]:
    """Per round, seconds per call of `a` / of `b`, the two timed one after the other (order
    alternating round by round, measuring.timer.rounds) in batches of at least `min_batch_s`."""
    a(), b()  # warm-up (and first-call work such as building rule plans)
    calls = {"a": a, "b": b}
    batches = {key: timer.batch_for(once, min_batch_s, MAX_CALLS) for key, once in timer.single_calls(calls).items()}
    samples = timer.rounds(calls, rounds, batches=batches, alternate=True)
    return [ta / tb for ta, tb in zip(samples["a"], samples["b"])]


def _calls(workload: Workload, method: str) -> tuple[Callable[[], Any], Callable[[], Any], Any]:
    size = measured_size(workload)
    state = workload.setup(workload.params(size), "cpu")
    workload.check(state, methods=[method, "torch_func"])
    workload.prepare(method, state)  # the default engine's calls before its replays
    return (lambda: workload.run(method, state)), (lambda: workload.run("torch_func", state)), size


def report(workloads: list[Workload], rounds: int, min_batch_s: float, profile: bool = False,
           engine: str = "eager") -> dict[str, float]:
    """Print and return the median engine/torch.func ratio of each workload."""
    medians: dict[str, float] = {}
    for w in workloads:
        method = engine_method(w, engine)
        engine_call, reference_call, size = _calls(w, method)
        ratios = round_ratios(engine_call, reference_call, rounds, min_batch_s)
        med = stats.median(ratios)
        lo, hi = stats.spread(ratios, 0.1)
        medians[w.name] = med
        print(f"{w.name:<22} {size:<20} {method}/torch_func {med:5.2f}  [{lo:.2f}-{hi:.2f}]", flush=True)
        if profile:
            prof = cProfile.Profile()
            prof.runcall(lambda: [engine_call() for _ in range(20)])
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if medians:
        geomean = stats.geomean(medians.values())
        worst = max(medians, key=medians.__getitem__)
        print(f"geomean {geomean:.3f}   worst {medians[worst]:.2f} ({worst})   {len(medians)} workloads", flush=True)
    return medians


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vmapbench.bench_ratios", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="per_sample_grads", help="workload family (default per_sample_grads; 'all' for every family)")
    parser.add_argument("--workloads", default="", help="comma list of workload names (overrides --family)")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds per workload (default 30)")
    parser.add_argument("--min-batch", type=float, default=0.02, help="seconds per timed batch of calls (default 0.02)")
    parser.add_argument("--engine", choices=("eager", "default"), default="eager",
                        help="the engine measured: eager (automatic tracing off, default) or as users get it")
    parser.add_argument("--profile", action="store_true", help="cProfile the engine's calls of each workload")
    args = parser.parse_args(argv)
    threads = probes.pin_threads()
    family = None if args.family == "all" else args.family
    names = [n for n in args.workloads.split(",") if n] or None
    print(f"torch {torch.__version__}, {threads} threads, {args.rounds} rounds, median ratio [10%-90%]", flush=True)
    report(candidates(family, names, args.engine), max(1, args.rounds), args.min_batch, args.profile, args.engine)


if __name__ == "__main__":
    main()
