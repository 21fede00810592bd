"""The one timer: callables timed round by round, interleaved, one callable's calls (`time_call`),
and a first call (`first_call_seconds`).

Why interleaved: on a shared machine a load burst or a slow phase of the CPU falls on whichever
call runs at that moment. Timed one round of each callable after another, the calls of a round
run moments apart, so a ratio of two callables taken round by round cancels what the machine did
to both, where their separate medians would not.

`rounds` is the one loop that runs measured calls between clock reads. Every timing path is a
use of it: `time_call`; `vmapbench run`'s per-call rounds; the ASV suite's batches
(suite.probes.interleaved_samples); the regression gate's rounds of several commits in one process
(vmapbench/gate_probe.py, paired_samples); the side-by-side scripts (vmapbench/bench_*.py).
What they differ in are its options:

- a `Batch` per callable: the calls of one round, in units of calls between two clock reads; a
  round's figure is the fastest unit, per call (with one unit a batch: its mean per call).
  `batch_for` sizes batches from each callable's single-call time (`single_calls`);
- `clock`: wall time (`time.perf_counter`) by default, or e.g. `time.process_time`;
- `device`: on CUDA every unit's clock stops after a synchronisation (the call's kernels are in
  its time), and the queue is drained before the first unit (`drain_each`: before every unit);
- `alternate`: forward order on even rounds, reverse on odd ones (a call's position in the round
  moves its time); `rotate`: round r starts at the (r mod n)-th of n callables, so that with more
  than two each takes every position in turn; `orders`: a cycle of orders given whole, round r
  timing `orders[r % len(orders)]` (each a permutation of the callables);
- `collect`: the garbage collector never runs inside a batch (as timeit does it): what is alive
  at the start is frozen out of its walks, each batch runs with it off and is followed by an
  untimed collection, so a collection does not land in whichever batch crossed its threshold;
- `before(key)`: untimed work before a callable's batch (the gate activates a commit's modules
  and re-warms the calls whose caches another commit's activation disturbed);
- `warmup_rounds` made and not recorded (with `warmup_batches`, batches of their own), and
  `stop`, which may end the rounds early.
"""
from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar

import torch

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Batch:
    """How one callable is timed in a round: `calls` calls, in units of `unit` calls between two
    clock reads (`calls // unit` units; at least one)."""

    calls: int = 1
    unit: int = 1


ONE = Batch()


def is_cuda(device: str | torch.device | None) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def synchronize(device: str | torch.device | None) -> None:
    """Wait for the device's queued work (nothing off CUDA)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def rounds(
    calls: Mapping[K, Callable[[], Any]],
    count: int,
    *,
    batches: Mapping[K, Batch] | None = None,
    clock: Callable[[], float] | None = None,
    device: str | torch.device | None = None,
    alternate: bool = False,
    rotate: bool = False,
    orders: Sequence[Sequence[K]] | None = None,
    drain_each: bool = False,
    collect: bool = False,
    warmup_rounds: int = 0,
    warmup_batches: Mapping[K, Batch] | None = None,
    before: Callable[[K], None] | None = None,
    stop: Callable[[int, Mapping[K, list[float]], Callable[[], float]], Any] | None = None,
) -> dict[K, list[float]]:
    """Seconds per call of each callable in each of `count` rounds (lists aligned by round), the
    callables timed one after another within a round (see the module docstring for the options).
    The warm-up rounds time `warmup_batches` (default: `batches`).

    `stop(r, samples, elapsed)` runs after recorded round `r` (0-based); a true result ends the
    rounds. `elapsed()` is the time on `clock` since the recorded rounds began.
    """
    if count < 1:
        raise ValueError(f"rounds needs a count >= 1, got {count}")
    if alternate + rotate + (orders is not None) > 1:
        raise ValueError("rounds: alternate, rotate and orders are three orders; pick one")
    clock = clock or time.perf_counter  # looked up per call: a clock patched into this module applies
    batches = batches or {}
    order = list(calls)
    samples: dict[K, list[float]] = {key: [] for key in order}
    if orders is not None:
        orders = [list(o) for o in orders]
        if not orders or any(len(o) != len(order) or set(o) != set(order) for o in orders):
            raise ValueError("rounds: every one of `orders` must list each callable once")
    cuda = is_cuda(device)

    warm = batches if warmup_batches is None else warmup_batches

    def timed(key: K, keep: bool = True) -> float:
        fn, batch = calls[key], (batches if keep else warm).get(key, ONE)
        if before is not None:
            before(key)
        if cuda and (drain_each or before is not None):
            synchronize(device)
        if collect:
            gc.disable()
        try:
            fastest = math.inf
            for _ in range(max(1, batch.calls // batch.unit)):
                start = clock()
                for _ in range(batch.unit):
                    fn()
                if cuda:
                    synchronize(device)
                fastest = min(fastest, clock() - start)
        finally:
            if collect:
                gc.enable()
        if collect:
            gc.collect()
        return fastest / batch.unit

    def round_order(r: int) -> list[K]:
        if orders is not None:
            return orders[r % len(orders)]
        if rotate:
            k = r % len(order)
            return order[k:] + order[:k]
        return order[::-1] if alternate and r % 2 else order

    def one_round(r: int, keep: bool) -> None:
        for key in round_order(r):
            seconds = timed(key, keep)
            if keep:
                samples[key].append(seconds)

    # (frozen for the rounds only, unless the caller had frozen it: a freeze left behind hides
    # everything alive from gc.get_objects() for the rest of the process)
    thaw = collect and gc.get_freeze_count() == 0
    if collect:
        gc.collect()
        gc.freeze()
    try:
        if cuda and not drain_each:
            synchronize(device)
        for r in range(warmup_rounds):
            one_round(r, keep=False)
        started = clock() if stop is not None else 0.0
        for r in range(count):
            one_round(r, keep=True)
            if stop is not None and stop(r, samples, lambda: clock() - started):
                break
    finally:
        if thaw:
            gc.unfreeze()
    return samples


def single_calls(calls: Mapping[K, Callable[[], Any]], **options: Any) -> dict[K, float]:
    """Seconds of one call of each callable, in order (one round of `rounds` with `options`; at
    least `1e-7` seconds, so that batch sizes derived from it stay finite): what `batch_for` sizes from."""
    return {key: max(seconds[0], 1e-7) for key, seconds in rounds(calls, 1, **options).items()}


def batch_for(once: float, min_batch_s: float, max_calls: int, unit_s: float | None = None,
              least: int = 1) -> Batch:
    """The batch of a callable whose single call took `once` seconds: calls enough to last at
    least `min_batch_s` (between `least` and `max_calls`), in units of calls lasting at least
    `unit_s` (None: one unit, the whole batch; else a whole number of units)."""
    calls = max(least, min(max_calls, math.ceil(min_batch_s / once)))
    if unit_s is None:
        return Batch(calls, calls)
    unit = min(max_calls, math.ceil(unit_s / once))
    return Batch(unit * math.ceil(calls / unit), unit)


def first_call_seconds(fn: Callable[[], Any], device: str | torch.device | None = None) -> float:
    """Wall-clock seconds of one call of `fn`: a method's first call, where tracing, compiling and
    caches happen, or whatever work brings it to its steady state.

    One call, never repeated, so it stands apart from `rounds`, whose calls are steady ones. On a
    CUDA device the queue is drained before the clock starts and before it stops.
    """
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def time_call(
    fn: Callable[[], Any], repeat: int = 5, warmup: int = 1, device: str | torch.device | None = None
) -> list[float]:
    """Wall-clock seconds of `repeat` calls of `fn`, after `warmup` untimed calls.

    On a CUDA device the queue is drained before the clock starts and before it stops, so each
    time covers the kernels the call launched.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    for _ in range(warmup):
        fn()
    return rounds({"": fn}, repeat, device=device)[""]
