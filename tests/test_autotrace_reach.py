"""Automatic tracing reaches replay where the state a function reads is provably unchanged, even
when the objects it reaches also hold state it never reads (registry workloads stayed eager for
these reasons: psg_*, bayes_*, tutorial_ensemble); and it still starts over when state it does
read changes."""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

import engine
from engine.autotrace import autotraced_state

CALLS = 6

# Globals named like attributes the functions below read (`F.softplus`, `t.tanh`): a function
# reading `F.softplus` does not read the global `softplus`, so what it holds (state whose
# attributes differ per thread, an iterator a replay would not advance) is not the function's.
softplus = threading.local()
tanh = iter(range(3))
scale = 2.0


def _attribute_reads(x: torch.Tensor) -> torch.Tensor:
    return (F.softplus(x) * x.tanh()).sum()


def _calls(f, *args):
    """CALLS calls of f (the engine's default path), each compared with the eager call."""
    outs = [f(*args) for _ in range(CALLS)]
    with engine.auto_tracing(False):
        ref = f(*args)
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    return outs


def _hits(f, *args) -> int:
    f(*args)
    state = autotraced_state(f)
    assert state is not None and state.impure is None, state and state.impure
    return state.traced.cache_info().hits


def test_an_attribute_named_like_an_unprovable_global_is_not_a_global_read():
    x = torch.randn(5)
    g = engine.grad(_attribute_reads)
    _calls(g, x)
    assert _hits(g, x) >= CALLS - 2


def _reads_scale(x: torch.Tensor) -> torch.Tensor:
    return (x * scale).sum() + sum(v * scale for v in x.unbind())


def test_a_global_read_in_the_function_and_in_its_comprehension_is_still_guarded():
    global scale
    x = torch.randn(4)
    g = engine.grad(_reads_scale)
    _calls(g, x)
    assert _hits(g, x) > 0
    try:
        scale = -1.0
        torch.testing.assert_close(g(x), torch.full((4,), -2.0))
        torch.testing.assert_close(engine.grad(_reads_scale)(x), torch.full((4,), -2.0))
    finally:
        scale = 2.0
