"""Side-by-side timings of traced/compiled engine transforms against torch.func (python -m vmapbench.bench_trace).

Every pair is measured in this one process, alternating the contenders call by call
(measuring.timer.rounds), and the median of `--repeats` calls after warm-up is reported with the
ratio engine / reference. The first-call trace latency and the compile latency are reported as
measured.
"""
from __future__ import annotations

import argparse
import os
from typing import Callable

import torch
from torch.func import functional_call

import engine
from engine.trace import TracedFunction
from measuring import stats, timer


def _median_times(fns: list[Callable[[], object]], repeats: int, warmup: int) -> list[float]:
    """Median seconds per call of each of `fns`, called in turn in `repeats` rounds
    (measuring.timer.rounds) after `warmup` unrecorded rounds."""
    samples = timer.rounds(dict(enumerate(fns)), repeats, warmup_rounds=warmup)
    return [stats.median(samples[i]) for i in range(len(fns))]


def _first_call_s(fn: Callable[[], object]) -> float:
    """Seconds of one call of `fn`, as it comes (no warm-up: a first call's latency)."""
    return timer.time_call(fn, repeat=1, warmup=0)[0]


def _logreg(n: int, d: int):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g) / d**0.5
    y = (torch.rand(n, generator=g) > 0.5).to(X.dtype)

    def logp(w: torch.Tensor) -> torch.Tensor:
        z = X @ w
        return (y * z - torch.nn.functional.softplus(z)).sum() - 0.5 * (w * w).sum()

    def closed_form(w: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(X @ w)
        return -(X.T @ (X * (p * (1 - p)).unsqueeze(1)) + torch.eye(d))

    return logp, closed_form, torch.randn(d, generator=g)


def _small_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    small = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    for p in small.parameters():
        p.requires_grad_(False)
    return small


def _row(name: str, t_engine: float, t_ref: float, ref: str) -> str:
    return f"{name:<44} engine {t_engine * 1e6:9.1f} us   {ref:<22} {t_ref * 1e6:9.1f} us   ratio {t_engine / t_ref:5.2f}x"


def _check(a: object, b: object) -> None:
    fa, _ = torch.utils._pytree.tree_flatten(a)
    fb, _ = torch.utils._pytree.tree_flatten(b)
    for x, y in zip(fa, fb):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


def bench_replay(repeats: int, warmup: int) -> None:
    print("== traced replay vs torch.func eager ==")
    cases = []
    for d in (16, 64):
        logp, _, w = _logreg(1000, d)
        cases.append((f"hessian logreg N=1000 D={d}", engine.hessian(logp), torch.func.hessian(logp), (w,)))

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    params = {k: v.detach() for k, v in mlp.named_parameters()}

    def loss(p, x, t):
        out = functional_call(mlp, p, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, t.unsqueeze(0))

    x, t = torch.randn(64, 784), torch.randint(0, 10, (64,))
    cases.append((
        "per-sample grads MLP 784-128-10 B=64",
        engine.vmap(engine.grad(loss), in_dims=(None, 0, 0)),
        torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0)),
        (params, x, t),
    ))

    small = _small_mlp()
    cases.append(("jacrev MLP 16-32-8", engine.jacrev(small), torch.func.jacrev(small), (torch.randn(16),)))

    for name, eng, ref, args in cases:
        traced = engine.trace(eng)
        traced(*args)
        _check(traced(*args), ref(*args))
        t_eng, t_ref = _median_times([lambda: traced(*args), lambda: ref(*args)], repeats, warmup)
        with engine.auto_tracing(False):  # the eager path, not the engine's automatic replay
            (t_eager,) = _median_times([lambda: eng(*args)], max(5, repeats // 4), 1)  # apart: context only
        print(_row(name, t_eng, t_ref, "torch.func eager"), f"  (trace {traced.trace_seconds:.2f} s, untraced engine {t_eager * 1e6:.0f} us)")


def _first_calls(ours: TracedFunction, theirs: Callable, args: tuple, what: str) -> None:
    first = _first_call_s(lambda: ours(*args))
    print(f"  engine.compile first call {first:.2f} s = trace {ours.trace_seconds:.2f} s + compile {ours.compile_seconds:.2f} s")
    print(f"  torch.compile({what}) first call {_first_call_s(lambda: theirs(*args)):.2f} s")


def bench_compiled(repeats: int, warmup: int) -> None:
    print("== compiled engine vs torch.compile(torch.func) ==")
    print("-- hessian logreg N=1000 D=64 (and the closed form)")
    logp, closed_form, w = _logreg(1000, 64)
    ours = engine.compile(engine.hessian(logp))
    theirs = torch.compile(torch.func.hessian(logp))
    _first_calls(ours, theirs, (w,), "torch.func.hessian")
    _check(ours(w), closed_form(w))
    _check(theirs(w), closed_form(w))
    t_ours, t_theirs, t_closed = _median_times([lambda: ours(w), lambda: theirs(w), lambda: closed_form(w)], repeats, warmup)
    print(_row("compiled hessian D=64", t_ours, t_theirs, "torch.compile(func)"))
    print(_row("compiled hessian D=64", t_ours, t_closed, "closed form (eager)"))

    # A small function, where the per-call overhead around the compiled code is the whole cost.
    print("-- jacrev MLP 16-32-8")
    small, x = _small_mlp(), torch.randn(16)
    ours = engine.compile(engine.jacrev(small))
    theirs = torch.compile(torch.func.jacrev(small))
    _first_calls(ours, theirs, (x,), "torch.func.jacrev")
    _check(ours(x), torch.func.jacrev(small)(x))
    _check(theirs(x), torch.func.jacrev(small)(x))
    t_ours, t_theirs = _median_times([lambda: ours(x), lambda: theirs(x)], max(repeats, 300), warmup)
    print(_row("compiled jacrev MLP 16-32-8", t_ours, t_theirs, "torch.compile(func)"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile comparisons (~1 min of compiling)")
    args = parser.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".inductor-cache"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} calls after {args.warmup} warm-up rounds")
    bench_replay(args.repeats, args.warmup)
    if not args.no_compile:
        bench_compiled(args.repeats, args.warmup)


if __name__ == "__main__":
    main()
