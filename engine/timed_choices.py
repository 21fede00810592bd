"""The engine's choices made by timing, taken once per process and key.

A few choices are made by timing two ways of doing one thing on this machine: which layout of a
matmul's operands is faster (graph_passes), whether a recorded graph replays through the
TorchScript interpreter or its Python forward (script_replay), whether watching a fold's large
sources pays (graph_passes.Fold). Near a threshold such a choice goes either way with the
machine's noise, so two copies of the same code can settle on different paths and differ in
speed with no change of code. So each choice is taken once per process for its key
(`decided`) and every later graph with that key reuses it.

`TABLE` is where they are kept. A host that loads several copies of the engine in one process
(vmapbench's regression gate loads base, head and a twin of head side by side) points every
copy's `TABLE` at one dict: copies of the same code then reach the same state, and a copy whose
rule changed decides for itself, because a key names the rule (`rule`: the deciding function's
code and its thresholds) besides what is timed.

This module is also the engine's one home for timing and its statistics (`fastest`, `median`):
the engine sits below measuring/ (measuring.timer, measuring.stats) and imports nothing of it.
"""
from __future__ import annotations

import hashlib
import math
import statistics
import timeit
import types
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar

import torch

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

TABLE: dict[Hashable, Any] = {}


def decided(key: Hashable, decide: Callable[[], T]) -> T:
    """TABLE[key], after `decide()` made it where no copy of the engine in this process has yet."""
    table = TABLE
    try:
        return table[key]
    except KeyError:
        value = table[key] = decide()
        return value


def rule(fn: Callable[..., Any], *thresholds: Hashable) -> tuple:
    """What names a choice's rule in its key: `fn`'s name and a digest of its bytecode and
    constants (the same source gives the same digest in every copy), and `thresholds`."""
    digest = hashlib.blake2b(digest_size=8)
    _digest_code(fn.__code__, digest)
    return (fn.__code__.co_qualname, digest.hexdigest(), *thresholds)


def fastest(calls: Mapping[K, Callable[[], Any]], rounds: int, number: int) -> dict[K, float]:
    """Each callable's fastest of `rounds` timings of `number` calls, the callables taken in turn
    within a round (timeit's clock, the collector off while timing), so that a load burst falls
    on all of them alike."""
    best = dict.fromkeys(calls, math.inf)
    for _ in range(rounds):
        for key, fn in calls.items():
            best[key] = min(best[key], timeit.timeit(fn, number=number))
    return best


def once(fn: Callable[[], Any]) -> float:
    """Seconds of one call of `fn` (what a batch size is derived from)."""
    return timeit.timeit(fn, number=1)


def median(values: Sequence[float]) -> float:
    """The upper median: a value that was measured, for an even count too."""
    return statistics.median_high(values)


def layout(t: torch.Tensor) -> tuple:
    """One tensor's layout as a graph's code sees it: sizes, strides, dtype, device, its conj and
    neg bits and whether it requires grad."""
    return (t.shape, t.stride(), t.dtype, t.device, t.is_conj(), t.is_neg(), t.requires_grad)


def layouts(values: Any) -> tuple:
    """What a timing depends on of `values` (a graph's inputs): each tensor's sizes, strides,
    dtype and device; the type of anything else."""
    return tuple((tuple(v.shape), v.stride(), v.dtype, v.device.type) if isinstance(v, torch.Tensor) else type(v)
                 for v in values)


def _digest_code(code: types.CodeType, digest: Any) -> None:
    """`code`'s bytecode and constants into `digest`, nested functions' code included (by content:
    a code object's repr names its address and file, which differ between copies)."""
    digest.update(code.co_code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _digest_code(const, digest)
        else:
            digest.update(repr(const).encode())
