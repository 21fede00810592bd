"""The replay executor side by side: each workload's default path with its replays on the recorded
graph's Python forward and on torch.jit's interpreter (engine.script_replay), alternated in this
one process (python -m vmapbench.bench_replay).

Each workload's `engine` method (the default path, fused tier off) is called until its signatures
replay and their interpreter runners are built (at once here: `script_replay.build_at_once`). Then
every round times a batch of calls with every scripted entry switched to its forward, and a
batch with them switched back, in alternating order (measuring.timer.rounds), in CPU seconds of
this process (time.process_time). Reported: the median per call of each side and the median
[quartiles] of the per-round ratio interpreter / forward, with how many of the workload's graphs
run scripted.
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Sequence

import torch

import engine
from engine import script_replay
from measuring import stats, timer

# The families issue #44's item 2 holds to jax.jit: what runs by default.
FAMILIES = ("bayes_logreg", "bayes_models", "hessians")
WARM_CALLS = 12


def measure(name: str, rounds: int = 15, budget: float = 0.05) -> dict[str, Any]:
    """Interleaved forward vs interpreter timings of one workload's default path; see the module docstring."""
    import workloads
    from measuring.sizes import default_size

    w = workloads.get(name)
    state = w.setup(w.params(default_size(w)), "cpu")
    build = getattr(state, "fn", None)
    call = build("engine") if build is not None else (lambda: w.run("engine", state))
    # the entries scripted before, held (an entry freed meanwhile could leave its id to a new one)
    held = script_replay.scripted_entries()
    before = set(map(id, held))
    with script_replay.build_at_once():
        for _ in range(WARM_CALLS):
            call()
    entries = [e for e in script_replay.scripted_entries() if id(e) not in before]
    runners = [(e, e.run) for e in entries if getattr(e.run, "forward", None) is not None]
    row: dict[str, Any] = {"workload": name, "size": default_size(w), "scripted": len(runners)}
    if not runners:
        return row

    def side(scripted: bool) -> None:
        for entry, runner in runners:
            entry.run = runner if scripted else runner.forward

    sides = {False: call, True: call}  # the same call; `side` switches the entries before each batch
    once = timer.single_calls({True: call}, clock=time.process_time)[True]
    number = timer.batch_for(once, budget, max_calls=1_000_000).calls
    try:
        samples = timer.rounds(sides, rounds, batches={k: timer.Batch(number, number) for k in sides},
                               clock=time.process_time, alternate=True, before=side)
    finally:
        side(True)
    ratios = [s / f for f, s in zip(samples[False], samples[True])]
    q1, median, q3 = stats.quartiles(ratios)
    row.update(forward_us=stats.median(samples[False]) * 1e6, script_us=stats.median(samples[True]) * 1e6,
               ratio=median, ratio_q1=q1, ratio_q3=q3)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    import workloads

    p = argparse.ArgumentParser(prog="python -m vmapbench.bench_replay", description=__doc__.splitlines()[0])
    p.add_argument("-w", "--workload", action="append", help="a workload (repeatable); default: the Bayesian and Hessian families")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if not script_replay.ENABLED:
        raise SystemExit("bench_replay: VMAPBENCH_SCRIPTED_REPLAY=0 turns off what it measures")
    torch.set_num_threads(args.threads)
    names = args.workload or [w.name for w in workloads.all_workloads()
                              if w.family in FAMILIES and "engine" in w.methods]
    print(f"{'workload':>24} {'graphs':>6} {'forward us':>11} {'scripted us':>12} {'scripted/forward [q1-q3]':>26}")
    with engine.fused_tier(False):
        for name in names:
            m = measure(name, args.rounds)
            if "ratio" not in m:
                print(f"{name:>24} {0:>6} {'-':>11} {'-':>12} {'(no graph scripted)':>26}", flush=True)
                continue
            ratio = f"{m['ratio']:.3f} [{m['ratio_q1']:.2f}-{m['ratio_q3']:.2f}]"
            print(f"{name:>24} {m['scripted']:>6} {m['forward_us']:11.1f} {m['script_us']:12.1f} {ratio:>26}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
