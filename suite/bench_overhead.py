"""Per-op cost of the engine: a chain of pointwise ops and row reductions inside vmap.

A chain of `N_OPS` cheap ops (pointwise and a keepdim mean per block) on a [B, ...] input,
vmapped over its B rows. On the small size the time is per-op dispatch cost; on the large one it
is arithmetic and memory traffic, where a method's copies and layouts show. Two modes:

- `vmap`: `vmap(chain)(x)`;
- `grad`: `vmap(grad(lambda r: chain(r).sum()))(x)`, per-row gradients: the backward pass's ops
  run through the batching rules too (vmap over backward).

Methods: `native` (the same chain on the whole batch, no vmap, plain autograd for `grad`: the
floor), `torch_func` (torch.func), `engine` (engine eager: inside `engine.auto_tracing(False)`) and
`engine_traced` (engine.trace of the same transform, replayed) and `engine_auto` (engine.auto_trace
of it, what the engine does by default: eager first, watched, recorded, then replayed).

- time_chain: one call.
- track_overhead_us_per_op: (method's time - native's time) / N_OPS, in microseconds, both timed
  in this process, interleaved (lower is better).
- track_ratio_vs_torch_func: method's time / torch.func's, interleaved in this process.

AutoTraceOverhead: what automatic tracing (on by default) costs per call over an explicit
`engine.trace` of the same function, on the replay tier, for a tiny function and MLPs of 2, 16
and 64 blocks (the models of `python -m vmapbench.bench_guards`):

- track_ratio_vs_trace: the default call's CPU time / engine.trace's, round by round,
  interleaved in one process (time.process_time), the median over rounds (lower is better; 1.0
  would be free guards; issue #25 asks for at most 1.10 on every size).

`python -m suite.bench_overhead` prints µs/op of every method and the ratios to torch.func for
every size and mode, each measured interleaved in one process, `--repeat` times (min-max range).
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import torch

from measuring import stats

from . import probes, selection

BLOCKS = 8
OPS_PER_BLOCK = 8
N_OPS = BLOCKS * OPS_PER_BLOCK
SIZES: dict[str, tuple[int, ...]] = {"small": (64, 8, 16), "large": (64, 64, 128)}
MODES = ("vmap", "grad")
METHODS = ("native", "torch_func", "engine", "engine_traced", "engine_auto")


def pointwise_chain(x: torch.Tensor) -> torch.Tensor:
    """N_OPS cheap ops that keep values bounded (so no inf/nan creeps in): per block six pointwise
    ops, a mean over the last dim and the subtraction of it."""
    for i in range(BLOCKS):
        x = torch.sin(x)
        x = x * 1.5
        x = x + 0.25 * i
        x = torch.tanh(x)
        x = x - x.mean(-1, keepdim=True)
        x = x * torch.sigmoid(x)
        x = x.exp()
    return x


def _row_loss(x: torch.Tensor) -> torch.Tensor:
    return pointwise_chain(x).sum()


def _native_grad(x: torch.Tensor) -> torch.Tensor:
    """Per-row gradients without vmap: rows do not interact, so the gradient of the batch sum is them."""
    with torch.enable_grad():
        leaf = x.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(pointwise_chain(leaf).sum(), leaf)
    return g


def make_input(size: str, device: str = "cpu") -> torch.Tensor:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; valid: {', '.join(SIZES)}")
    return torch.randn(SIZES[size], generator=torch.Generator().manual_seed(0)).to(_tensor_device(device))


def _tensor_device(device: str) -> str:
    """`device`, or the CPU for 'cuda' under the CUDA stand-in (a dry run; absent at older commits)."""
    try:
        from workloads.cuda_standin import tensor_device
    except ImportError:
        return device
    return str(tensor_device(device))


def _eager(batched: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
    """The engine's eager path: automatic tracing off (where this commit has it)."""
    import engine

    if not hasattr(engine, "auto_tracing"):
        return batched(x)
    with engine.auto_tracing(False):
        return batched(x)


def chain_call(method: str, x: torch.Tensor, mode: str = "vmap") -> Callable[[], Any]:
    """The measured call of `method` in `mode` on the batch `x`; NotImplementedError if it cannot run here."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if method == "native":
        fn = pointwise_chain if mode == "vmap" else _native_grad
        return lambda: fn(x)
    if method == "torch_func":
        batched = torch.func.vmap(pointwise_chain if mode == "vmap" else torch.func.grad(_row_loss))
        return lambda: batched(x)
    probes.require_method(method)
    import engine

    batched = engine.vmap(pointwise_chain if mode == "vmap" else engine.grad(_row_loss))
    if method == "engine":
        return lambda: _eager(batched, x)
    if method == "engine_traced":
        traced = engine.trace(batched)
        return lambda: traced(x)
    if method == "engine_auto":
        if not hasattr(engine, "auto_trace"):
            raise NotImplementedError("engine.auto_trace does not exist at this commit")
        auto = engine.auto_trace(batched)
        auto(x), auto(x)  # the calls before the first replay (eager, then eager and watched)
        return lambda: auto(x)
    raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")


# The overhead-bound size `make bench` times (the gate times it too: vmapbench/gate_probe.py).
QUICK_SIZE = "small"


def _first_called(method: str, x: torch.Tensor, mode: str, device: str) -> dict[str, Callable[[], Any]]:
    """The calls of `method` and of the two it is compared with, each called once (traces happen here)."""
    calls = {m: chain_call(m, x, mode) for m in dict.fromkeys(("native", "torch_func", method))}
    for name, call in calls.items():
        try:
            call()  # first call: the trace happens here
        except NotImplementedError as exc:  # torch's "could not run op": a failure, not a skip
            raise RuntimeError(f"{name}: the first call raised NotImplementedError: {exc}") from exc
    probes.synchronize(device)
    return calls


_PREPARED: dict[tuple[str, str, str, str], dict[str, Callable[[], Any]]] = {}


class PerOpOverhead:
    params = [list(METHODS), list(SIZES), list(MODES), list(selection.ALL_DEVICES)]
    param_names = ["method", "size", "mode", "device"]
    version = selection.SUITE_VERSION
    timeout = 180.0
    quick = selection.active_profile() == "quick"
    if quick:
        warmup_time, repeat, rounds = 0.05, (3, 8, 0.6), 1
    else:
        warmup_time, repeat, rounds = 0.5, (5, 20, 10.0), 2

    def setup(self, method: str, size: str, mode: str, device: str) -> None:
        probes.pin_threads()
        devices = selection.active_devices()
        if device not in devices:
            raise NotImplementedError(f"device {device} is not in this run's devices {','.join(devices)}")
        if device == "cuda" and not torch.cuda.is_available():
            raise NotImplementedError("cuda is not available on this machine (torch.cuda.is_available() is False)")
        probes.check_fork(device)
        self.device = device
        if self.quick and size != QUICK_SIZE:
            raise NotImplementedError(f"the quick profile times the {QUICK_SIZE} chain only (10 min budget); "
                                      f"the full profile and `python -m suite.bench_overhead` time {size}")
        key = (method, size, mode, device)
        if key not in _PREPARED:  # asv re-runs setup before every sample of time_chain: build once
            _PREPARED[key] = _first_called(method, make_input(size, device), mode, device)
        self.calls = _PREPARED[key]

    def time_chain(self, method: str, size: str, mode: str, device: str) -> None:
        self.calls[method]()
        if self.device != "cpu":
            probes.synchronize(self.device)

    def _interleaved(self, names: tuple[str, ...]) -> dict[str, float]:
        calls = {n: self.calls[n] for n in dict.fromkeys(names)}
        return probes.interleaved_seconds(calls, self.device, rounds=7, budget_s=0.6 if self.quick else 3.0)

    def track_overhead_us_per_op(self, method: str, size: str, mode: str, device: str) -> float:
        seconds = self._interleaved(("native", method))
        return (seconds[method] - seconds["native"]) / N_OPS * 1e6

    track_overhead_us_per_op.unit = "us/op"  # type: ignore[attr-defined]
    track_overhead_us_per_op.rounds = 1  # type: ignore[attr-defined]
    track_overhead_us_per_op.skip_params = [("native", s, m, d) for s in SIZES for m in MODES for d in selection.ALL_DEVICES]  # type: ignore[attr-defined]

    def track_ratio_vs_torch_func(self, method: str, size: str, mode: str, device: str) -> float:
        seconds = self._interleaved(("torch_func", method))
        return seconds[method] / seconds["torch_func"]

    track_ratio_vs_torch_func.unit = "ratio"  # type: ignore[attr-defined]
    track_ratio_vs_torch_func.rounds = 1  # type: ignore[attr-defined]
    track_ratio_vs_torch_func.skip_params = [  # type: ignore[attr-defined]
        (m, s, mo, d) for m in ("native", "torch_func") for s in SIZES for mo in MODES for d in selection.ALL_DEVICES
    ]


AUTO_MODELS = ("tiny", "blocks=2", "blocks=16", "blocks=64")


def auto_model(model: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The loss a row of `vmap(grad(loss))` computes: `tiny` (sin, scale, sum) or an MLP of
    `blocks=N` Linear(16, 16) + Tanh blocks, parameters frozen (a result that needs no grad is what
    automatic tracing replays). Built here, not imported, so that older commits can be measured."""
    if model == "tiny":
        return lambda x: (x.sin() * 2).sum()
    if not model.startswith("blocks=") or model not in AUTO_MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(AUTO_MODELS)}")
    layers: list[torch.nn.Module] = []
    for _ in range(int(model.split("=")[1])):
        layers += [torch.nn.Linear(16, 16), torch.nn.Tanh()]
    net = torch.nn.Sequential(*layers).requires_grad_(False)
    return lambda x: net(x).sum()


def auto_and_traced(model: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(the default call `engine.vmap(engine.grad(loss))(x)`, brought to replay; engine.trace of the
    same transform), for a batch of 8 rows. NotImplementedError where this commit has no automatic
    tracing, or the default call does not reach replay (the figure would not be the guards' cost)."""
    import engine

    if not hasattr(engine, "auto_tracing") or not hasattr(engine, "fused_tier"):
        raise NotImplementedError("automatic tracing (engine.auto_tracing) does not exist at this commit")
    from engine.autotrace import autotraced_state

    try:  # the settled state: a long-running process's guards check natively (guardstate.NATIVE_IMPORT_S)
        from engine import guardstate

        guardstate.NATIVE_GUARDS = "now"
    except ImportError:
        pass
    torch.manual_seed(0)
    loss = auto_model(model)
    auto = engine.vmap(engine.grad(loss))
    traced = engine.trace(engine.vmap(engine.grad(loss)))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    with engine.fused_tier(False):
        for _ in range(4):  # eager, watched, recorded, replayed
            auto(x), traced(x)
    state = autotraced_state(auto)
    if state is None or state.impure is not None or state.traced.cache_info().hits == 0:
        raise NotImplementedError(f"{model}: the default call did not reach replay ({state and state.impure})")
    return (lambda: auto(x)), (lambda: traced(x))


class AutoTraceOverhead:
    params = [list(AUTO_MODELS)]
    param_names = ["model"]
    version = selection.SUITE_VERSION
    timeout = 300.0
    quick = selection.active_profile() == "quick"

    def setup(self, model: str) -> None:
        probes.pin_threads()
        if "cpu" not in selection.active_devices():
            raise NotImplementedError("AutoTraceOverhead measures on cpu, which is not in this run's devices")
        self.auto, self.traced = auto_and_traced(model)

    def track_ratio_vs_trace(self, model: str) -> float:
        import engine

        with engine.fused_tier(False):  # the replay tier on both sides: the guards' cost, not a tier's
            samples = probes.interleaved_samples({"auto": self.auto, "trace": self.traced}, "cpu", rounds=9,
                                                 budget_s=1.0 if self.quick else 4.0, clock=time.process_time)
        return stats.median(a / t for a, t in zip(samples["auto"], samples["trace"]))

    track_ratio_vs_trace.unit = "ratio"  # type: ignore[attr-defined]
    track_ratio_vs_trace.rounds = 1  # type: ignore[attr-defined]


def report(sizes: list[str], modes: list[str], repeat: int, budget_s: float, device: str = "cpu") -> list[dict]:
    """Per (size, mode): µs/op of each method (median over `repeat` interleaved measurements) and the
    ratios to torch.func with their min-max over the repeats. Returns the rows it printed."""
    rows = []
    for size in sizes:
        x = make_input(size, device)
        for mode in modes:
            calls = {m: chain_call(m, x, mode) for m in METHODS}
            outs = {m: c() for m, c in calls.items()}
            for m in METHODS[1:]:
                torch.testing.assert_close(outs[m], outs["native"], rtol=1e-4, atol=1e-5)
            runs = [probes.interleaved_seconds(calls, device, rounds=7, budget_s=budget_s) for _ in range(repeat)]
            us = {m: stats.median(r[m] for r in runs) / N_OPS * 1e6 for m in METHODS}
            ratio = {m: [r[m] / r["torch_func"] for r in runs] for m in METHODS}
            traced_vs_eager = [r["engine_traced"] / r["engine"] for r in runs]
            cells = "  ".join(f"{m} {us[m]:8.2f}" for m in METHODS)
            ratios = "  ".join(
                f"{m}/tf {stats.median(ratio[m]):.2f} [{min(ratio[m]):.2f}-{max(ratio[m]):.2f}]" for m in ("native", "engine", "engine_traced", "engine_auto")
            )
            print(f"{size:<6}{mode:<5} us/op: {cells}\n            {ratios}  traced/eager {stats.median(traced_vs_eager):.2f} "
                  f"[{min(traced_vs_eager):.2f}-{max(traced_vs_eager):.2f}]", flush=True)
            rows.append({"size": size, "mode": mode, "us_per_op": us, "ratio_vs_torch_func": ratio, "traced_vs_eager": traced_vs_eager})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m suite.bench_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma list of {', '.join(SIZES)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved measurements per case (default 5)")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per interleaved measurement (default 1.0)")
    args = parser.parse_args(argv)
    threads = probes.pin_threads()
    print(f"torch {torch.__version__}, {threads} threads, {N_OPS} ops per chain, sizes {SIZES}, "
          f"median of {args.repeat} interleaved measurements [min-max]", flush=True)
    report(args.sizes.split(","), args.modes.split(","), max(1, args.repeat), args.budget)


if __name__ == "__main__":
    main()
