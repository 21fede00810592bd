"""What automatic tracing costs over an explicit `engine.trace` of the same function, as the model
grows (python -m vmapbench.bench_guards).

Automatic tracing replays the same recorded graph as engine.trace; what it adds per call is its
own bookkeeping: the outermost-call check, the signature lookup and the guard that the Python
state the recording read is unchanged (engine.guardstate). This measures that addition on a tiny
function and on an MLP of 2, 16 and 64 blocks (Linear + Tanh, parameters frozen so the replay is
allowed), `vmap(grad(loss))` over a batch of 8. The two callables are timed batch by batch,
alternating (measuring.timer.rounds), in CPU seconds of this process (time.process_time: what
other processes' load does not inflate), and reported as the median [quartiles] of the per-pair ratio auto/trace, with the
guard check alone (StateGuard.holds, the full path's) and the replay path's check alone (the
check of the state and the arguments, AutoTraced._memo) in microseconds, for each side of the
guards' check (`--guards`): in Python, as a process runs until Dynamo is imported (most of a small
model's calls, engine.guardstate.NATIVE_IMPORT_S), and native. Both run on the replay tier (the
fused tier off): what is measured is the bookkeeping, not which tier a signature reached.

`--count` gives the same comparison in instructions per call instead (valgrind's callgrind, through
measuring.counts: deterministic where CPU times on a shared machine are not): the process reruns
itself under callgrind and counts `COUNT_CALLS` calls of each callable, and of the two checks.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

import engine
from engine import guardstate
from engine.autotrace import autotraced_state
from measuring import counts, stats, timer

DEFAULT_BLOCKS = (0, 2, 16, 64)  # 0: the tiny function
COUNT_CALLS = 20  # calls counted per callable under callgrind
_SIDE = {"never": "python", "now": "native"}  # the guards' check, by engine.guardstate.NATIVE_GUARDS


def _model(blocks: int) -> Callable[[torch.Tensor], torch.Tensor]:
    if blocks == 0:
        return lambda x: (x.sin() * 2).sum()
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(16, 16), torch.nn.Tanh()]
    net = torch.nn.Sequential(*layers).requires_grad_(False)
    return lambda x: net(x).sum()


def _fastest(fn: Callable[[], Any], calls: int = 200, units: int = 3) -> float:
    """CPU seconds per call of `fn`: the fastest of `units` units of `calls` calls."""
    return timer.rounds({"": fn}, 1, batches={"": timer.Batch(units * calls, calls)}, clock=time.process_time)[""][0]


def _pair(blocks: int, guards: str = "now") -> tuple[Callable, Callable, Any, torch.Tensor]:
    """(auto-traced, engine.trace'd, the AutoTraced, input) of one model size, both replaying, the
    guards checking natively (`guards="now"`: a long run's state, NATIVE_IMPORT_S) or in Python
    ("never": a process that has not imported Dynamo, most of a small model's calls)."""
    guardstate.NATIVE_GUARDS = guards
    loss = _model(blocks)
    auto = engine.vmap(engine.grad(loss))
    traced = engine.trace(engine.vmap(engine.grad(loss)))
    x = torch.randn(8, 16)
    for _ in range(6):  # seen, verified, recorded, replayed (the full path builds the native check), memo built
        auto(x)
        traced(x)
    state = autotraced_state(auto)
    if state is None or state.impure is not None or state.traced.cache_info().hits == 0:
        raise RuntimeError(f"bench_guards: the {blocks}-block model did not reach replay ({state and state.impure})")
    return auto, traced, state, x


def measure(blocks: int, rounds: int = 15, budget: float = 0.02, guards: str = "now") -> dict[str, Any]:
    """Interleaved auto vs trace timings for one model size and guard side; see the module docstring."""
    auto, traced, state, x = _pair(blocks, guards)
    calls = {"trace": lambda: traced(x), "auto": lambda: auto(x)}
    once = timer.single_calls({"trace": calls["trace"]}, batches={"trace": timer.Batch(3, 3)}, clock=time.process_time)
    number = max(1, int(budget / once["trace"]))
    batches = {key: timer.Batch(number, number) for key in calls}
    samples = timer.rounds(calls, rounds, batches=batches, clock=time.process_time, alternate=True)
    ratios = [a / t for a, t in zip(samples["auto"], samples["trace"])]
    guard = state._guard
    holds = _fastest(guard.holds) if guard is not None else float("nan")
    check = _replay_check(state, x)
    checks = _fastest(check) if check is not None else float("nan")
    q1, median, q3 = stats.quartiles(ratios)
    return {
        "blocks": blocks, "guards": guards, "trace_us": stats.median(samples["trace"]) * 1e6, "auto_us": stats.median(samples["auto"]) * 1e6,
        "ratio": median, "ratio_q1": q1, "ratio_q3": q3, "guard_us": holds * 1e6,
        "check_us": checks * 1e6,
    }


def _replay_check(state: Any, x: torch.Tensor) -> Callable[[], Any] | None:
    """The replay path's check of the state and the arguments (native: one C call; or the Python
    memo), or None where none was built."""
    memo = state._memo
    if memo is None:
        return None
    values, args = memo.values, (x,)
    if not memo.check((args, values)):
        raise RuntimeError("bench_guards: the replay path's check does not hold for the measured call")
    return lambda: memo.check((args, values))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vmapbench.bench_guards", description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, nargs="+", default=list(DEFAULT_BLOCKS), help="model sizes (0: a tiny function)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--guards", nargs="+", choices=("now", "never"), default=["never", "now"],
                   help="the guards' check: in Python (never: before Dynamo is imported) and/or native (now)")
    p.add_argument("--count", action="store_true", help="instructions per call under callgrind instead of CPU time")
    p.add_argument("--count-child", metavar="LIB", help=argparse.SUPPRESS)  # the process callgrind runs
    args = p.parse_args(argv)
    if args.count:
        return _count(args)
    torch.set_num_threads(args.threads)
    with engine.fused_tier(False):
        if args.count_child:
            return _count_child(args)
        return _report(args)


def _count(args: argparse.Namespace) -> int:
    """Rerun under callgrind (--count-child) and print its counts per call."""
    why = counts.available()
    if why is not None:
        print(f"bench_guards --count: {why}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        library = counts.build_requests(out / "lib")
        command = [*counts.command(out), sys.executable, "-m", "vmapbench.bench_guards", "--count-child", str(library),
                   "--threads", str(args.threads), "--guards", *args.guards, "--blocks", *map(str, args.blocks)]
        subprocess.run(command, check=True)
        dumped = counts.read_dumps(out)
    print(f"{'model':>12} {'guards':>7} {'trace instr':>12} {'auto instr':>12} {'auto/trace':>10} {'guard instr':>12} {'check instr':>12}")
    for guards in args.guards:
        for blocks in args.blocks:
            name = "tiny fn" if blocks == 0 else f"{blocks} blocks"
            trace, auto, guard = (dumped[f"{guards}:{blocks}:{what}"] / COUNT_CALLS for what in ("trace", "auto", "guard"))
            check = dumped.get(f"{guards}:{blocks}:check", float("nan") * COUNT_CALLS) / COUNT_CALLS
            print(f"{name:>12} {_SIDE[guards]:>7} {trace:12.0f} {auto:12.0f} {auto / trace:10.3f} {guard:12.0f} {check:12.0f}",
                  flush=True)
    return 0


def _count_child(args: argparse.Namespace) -> int:
    requests = counts.Requests(args.count_child)
    for guards in args.guards:
        for blocks in args.blocks:
            auto, traced, state, x = _pair(blocks, guards)
            guard = state._guard
            measured = [("trace", lambda: traced(x)), ("auto", lambda: auto(x)), ("guard", guard.holds)]
            check = _replay_check(state, x)
            if check is not None:
                measured.append(("check", check))
            for label, fn in measured:
                fn()
                with requests.region(f"{guards}:{blocks}:{label}"):
                    for _ in range(COUNT_CALLS):
                        fn()
    return 0


def _report(args: argparse.Namespace) -> int:
    print(f"{'model':>12} {'guards':>7} {'trace us':>10} {'auto us':>10} {'auto/trace [q1-q3]':>22} {'guard us':>9} {'check us':>9}")
    for guards in args.guards:
        for blocks in args.blocks:
            m = measure(blocks, args.rounds, guards=guards)
            name = "tiny fn" if blocks == 0 else f"{blocks} blocks"
            ratio = f"{m['ratio']:.3f} [{m['ratio_q1']:.2f}-{m['ratio_q3']:.2f}]"
            print(f"{name:>12} {_SIDE[guards]:>7} {m['trace_us']:10.1f} {m['auto_us']:10.1f} {ratio:>22} {m['guard_us']:9.1f}"
                  f" {m['check_us']:9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
