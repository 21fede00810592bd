"""Per-op overhead of the engine: a chain of small pointwise ops inside vmap.

A chain of `N_OPS` pointwise ops on a [64, 128] input, vmapped over its 64 rows, is dominated by
per-op dispatch cost rather than arithmetic. Methods: `native` (the same chain on the whole
batch, no vmap: the floor), `torch_func` (torch.func.vmap), `engine` (engine.vmap, eager) and
`engine_traced` (engine.trace of the vmapped chain, replayed).

- time_chain: one call of the chain.
- track_overhead_us_per_op: (method's time - native's time) / N_OPS, in microseconds, both timed
  in this process, interleaved (lower is better).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from . import probes, selection

N_OPS = 40
BATCH, WIDTH = 64, 128
METHODS = ("native", "torch_func", "engine", "engine_traced")


def pointwise_chain(x: torch.Tensor) -> torch.Tensor:
    """N_OPS cheap pointwise ops that keep values bounded (so no inf/nan creeps in)."""
    for i in range(N_OPS // 4):
        x = torch.sin(x)
        x = x * 1.5
        x = x + 0.25 * i
        x = torch.tanh(x)
    return x


def chain_call(method: str, x: torch.Tensor) -> Callable[[], Any]:
    """The measured call of `method` on the batch `x`; NotImplementedError if it cannot run here."""
    if method == "native":
        return lambda: pointwise_chain(x)
    if method == "torch_func":
        batched = torch.func.vmap(pointwise_chain)
        return lambda: batched(x)
    try:
        import engine
    except ImportError as exc:
        raise NotImplementedError(f"the engine does not import at this commit: {exc}") from None
    if not hasattr(engine, "vmap"):
        raise NotImplementedError("engine.vmap does not exist at this commit")
    batched = engine.vmap(pointwise_chain)
    if method == "engine":
        return lambda: batched(x)
    if method == "engine_traced":
        if not hasattr(engine, "trace"):
            raise NotImplementedError("engine.trace does not exist at this commit")
        traced = engine.trace(batched)
        return lambda: traced(x)
    raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")


class PerOpOverhead:
    params = [list(METHODS), list(selection.ALL_DEVICES)]
    param_names = ["method", "device"]
    version = selection.SUITE_VERSION
    timeout = 120.0
    quick = selection.active_profile() == "quick"
    if quick:
        warmup_time, repeat, rounds = 0.05, (3, 8, 0.6), 1
    else:
        warmup_time, repeat, rounds = 0.5, (5, 20, 10.0), 2

    def setup(self, method: str, device: str) -> None:
        probes.pin_threads()
        devices = selection.active_devices()
        if device not in devices:
            raise NotImplementedError(f"device {device} is not in this run's devices {','.join(devices)}")
        if device == "cuda" and not torch.cuda.is_available():
            raise NotImplementedError("cuda is not available on this machine (torch.cuda.is_available() is False)")
        self.device = device
        x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(0)).to(device)
        self.calls = {m: chain_call(m, x) for m in ("native", method)}
        try:
            self.calls[method]()  # first call: the trace happens here
        except NotImplementedError as exc:  # torch's "could not run op": a failure, not a skip
            raise RuntimeError(f"{method}: the first call raised NotImplementedError: {exc}") from exc
        probes.synchronize(device)

    def time_chain(self, method: str, device: str) -> None:
        self.calls[method]()
        if self.device != "cpu":
            probes.synchronize(self.device)

    def track_overhead_us_per_op(self, method: str, device: str) -> float:
        seconds = probes.interleaved_seconds(self.calls, device, rounds=7, budget_s=0.6 if self.quick else 3.0)
        return (seconds[method] - seconds["native"]) / N_OPS * 1e6

    track_overhead_us_per_op.unit = "us/op"  # type: ignore[attr-defined]
    track_overhead_us_per_op.rounds = 1  # type: ignore[attr-defined]
    track_overhead_us_per_op.skip_params = [("native", d) for d in selection.ALL_DEVICES]  # type: ignore[attr-defined]
