"""Inline transforms (`engine.hessian(f)(x)` written inside a loop) are cached on what they are:
the transform chain, its options and the function at its root, not the callable object."""
from __future__ import annotations

import pytest
import torch

import engine
from engine.autotrace import autotraced_state

CALLS = 6


def _loss(x: torch.Tensor) -> torch.Tensor:
    return (x.sin() * x).sum()


def test_inline_grad_in_a_loop_reaches_replay():
    x = torch.randn(5)
    outs = [engine.grad(_loss)(x) for _ in range(CALLS)]
    state = _state_after_call(engine.grad(_loss), x)
    assert state.traced.cache_info().hits >= CALLS - 3
    for out in outs:
        torch.testing.assert_close(out, torch.func.grad(_loss)(x))


def _state_after_call(f, *args):
    f(*args)
    return autotraced_state(f)


def test_inline_composition_shares_one_recording_and_matches_torch_func():
    x = torch.randn(3, 4)
    for _ in range(CALLS):
        out = engine.vmap(engine.hessian(_loss))(x)
    state = _state_after_call(engine.vmap(engine.hessian(_loss)), x)
    assert state.traced.cache_info().hits >= CALLS - 3
    torch.testing.assert_close(out, torch.func.vmap(torch.func.hessian(_loss))(x))


def test_different_options_or_functions_do_not_share():
    a = _state_after_call(engine.vmap(_loss, in_dims=0), torch.randn(2, 3))
    b = _state_after_call(engine.vmap(_loss, in_dims=1), torch.randn(3, 2))
    c = _state_after_call(engine.vmap(lambda x: _loss(x)), torch.randn(2, 3))
    d = _state_after_call(engine.grad(_loss), torch.randn(3))
    e = _state_after_call(engine.grad(_loss, argnums=(0,)), torch.randn(3))
    assert len({id(s) for s in (a, b, c, d, e)}) == 5
    assert _state_after_call(engine.vmap(_loss, in_dims=0), torch.randn(2, 3)) is a


def test_a_rebound_function_starts_over():
    def make(scale):
        def f(x):
            return (x * scale).sum()
        return f

    x = torch.randn(4)
    f = make(2.0)
    for _ in range(CALLS):
        engine.grad(f)(x)
    f = make(3.0)  # a new function object: nothing recorded for it applies
    torch.testing.assert_close(engine.grad(f)(x), torch.full((4,), 3.0))


def test_a_changed_closure_fails_the_guard_of_the_shared_recording():
    scale = [2.0]

    def f(x):
        return (x * scale[0]).sum()

    x = torch.randn(4)
    for _ in range(CALLS):
        engine.grad(f)(x)
    assert _state_after_call(engine.grad(f), x).traced.cache_info().hits > 0
    scale[0] = -1.0
    torch.testing.assert_close(engine.grad(f)(x), torch.full((4,), -1.0))


def test_bound_methods_share_by_function_and_instance():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3), requires_grad=False)

        def loss(self, x):
            return (x * self.w).sum()

    m1, m2 = Model(), Model()
    x = torch.randn(3)
    for _ in range(CALLS):
        g1 = engine.grad(m1.loss)(x)
    s1 = _state_after_call(engine.grad(m1.loss), x)
    assert s1.traced.cache_info().hits >= CALLS - 3
    assert _state_after_call(engine.grad(m2.loss), x) is not s1
    torch.testing.assert_close(g1, m1.w)
    torch.testing.assert_close(engine.grad(m2.loss)(x), m2.w)


def test_pytree_in_dims_are_keyed_exactly():
    f = lambda d: d["a"].sum()  # noqa: E731
    x = {"a": torch.randn(2, 3)}
    for _ in range(3):
        out = engine.vmap(f, in_dims=({"a": 0},))(x)
    torch.testing.assert_close(out, x["a"].sum(1))
    same = _state_after_call(engine.vmap(f, in_dims=({"a": 0},)), x)
    assert _state_after_call(engine.vmap(f, in_dims=({"a": 0},)), x) is same
    assert _state_after_call(engine.vmap(f, in_dims=({"a": 1},)), x) is not same
    # a list is not a tuple: refused as torch.func refuses it, not served by the tuple's recording
    with pytest.raises(ValueError, match="in_dims"):
        engine.vmap(f, in_dims=[{"a": 0}])(x)
