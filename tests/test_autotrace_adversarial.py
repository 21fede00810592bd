"""Adversarial tests of automatic tracing (issue #25): state changed between calls the way people
really change it in PyTorch code (notebooks, training loops, configs, numpy interop, seeds,
threads, monkeypatching), after the transformed function has reached replay.

Each test builds its transformed function once, calls it until it replays (or, where the engine
may prove nothing and stay eager, until it would), changes the state, and checks every later
result bit for bit against an eager call of the same transform made with automatic tracing off
(signed zeros and NaNs included). Tests marked xfail(strict=True) name a hole the engine still
has: a replay that returns a stale result.
"""
from __future__ import annotations

import array
import collections
import contextvars
import dataclasses
import enum
import functools
import math
import struct
import threading
import types

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

import engine
from engine.autotrace import autotraced_state

WARM = 4  # calls that take a signature through eager, watched, recorded, replayed
AFTER = 3  # calls after a change: the first may be the stale replay, later ones a re-recording


def _eager(f, *args, **kwargs):
    """The same transform, called eagerly (automatic tracing off for this call only)."""
    with engine.auto_tracing(False):
        return f(*args, **kwargs)


def _exact(got, want) -> None:
    """Bit for bit: values, NaNs where NaNs are, and the sign of every zero."""
    got_flat, want_flat = tree_flatten(got)[0], tree_flatten(want)[0]
    assert len(got_flat) == len(want_flat)
    for g, w in zip(got_flat, want_flat):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
            if w.is_floating_point():
                assert torch.equal(torch.signbit(g), torch.signbit(w)), "signed zeros differ"
        else:
            assert type(g) is type(w) and (g == w or (g != g and w != w))


def _state(f):
    state = autotraced_state(f)
    assert state is not None
    return state


def _replaying(f) -> bool:
    state = autotraced_state(f)
    return state is not None and state.impure is None and state.traced.cache_info().hits > 0


def _call(f, *args, **kwargs):
    """One call of `f`, checked against an eager call with the state as it is now."""
    want = _eager(f, *args, **kwargs)
    got = f(*args, **kwargs)
    _exact(got, want)
    return got


def _warm(f, *args, replay: bool = True, **kwargs) -> None:
    """Call `f` until a replay (checked when `replay`: the point of the test is a replay)."""
    for _ in range(WARM):
        _call(f, *args, **kwargs)
    if replay:
        assert _replaying(f), f"expected a replay, state: {_state(f).impure}"


def _after(f, *args, **kwargs) -> None:
    for _ in range(AFTER):
        _call(f, *args, **kwargs)


def _module(name: str, source: str) -> types.ModuleType:
    """A user module (not a library): functions defined in it read its namespace as globals."""
    mod = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), mod.__dict__)
    return mod


X = torch.linspace(-1.5, 2.0, 12).reshape(3, 4)


# ------------------------------------------------------------------------------------------------
# numpy and raw buffers read by the function


@pytest.mark.parametrize("read", ["from_numpy", "as_tensor", "tensor"])
def test_numpy_array_in_closure_changed_in_place(read):
    table = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    to_tensor = getattr(torch, read)

    def f(x):
        return x * to_tensor(table)

    g = engine.vmap(f)
    _warm(g, X, replay=False)
    table[:] = [5.0, -6.0, 7.0, 0.5]
    _after(g, X)


NP_WEIGHTS = np.array([0.5, -1.0, 2.0, 3.0])


def _loss_with_global_numpy(w):
    return (w * torch.as_tensor(NP_WEIGHTS, dtype=w.dtype)).pow(2).sum()


def test_numpy_global_changed_in_place_under_grad():
    g = engine.vmap(engine.grad(_loss_with_global_numpy))
    x = X.clone()
    try:
        _warm(g, x, replay=False)
        NP_WEIGHTS[1] = 10.0
        _after(g, x)
    finally:
        NP_WEIGHTS[:] = [0.5, -1.0, 2.0, 3.0]


def test_numpy_array_attribute_of_a_config_object_changed_in_place():
    class Whitening:
        def __init__(self):
            self.mean = np.zeros(4, dtype=np.float32)

        def __call__(self, x):
            return x - torch.from_numpy(self.mean)

    white = Whitening()
    g = engine.vmap(white)
    _warm(g, X, replay=False)
    white.mean += 1.5  # running statistics updated in place, as a data pipeline does
    _after(g, X)


def test_numpy_array_in_a_captured_list_changed_in_place():
    bank = [np.ones(4, dtype=np.float32), np.full(4, 2.0, dtype=np.float32)]

    def f(x):
        return sum(x * torch.from_numpy(a) for a in bank)

    g = engine.vmap(f)
    _warm(g, X, replay=False)
    bank[1].fill(-3.0)
    _after(g, X)


def test_numpy_zero_dim_array_read_as_a_python_float():
    gain = np.array(2.0)

    def f(x):
        return x * float(gain)

    g = engine.vmap(f)
    _warm(g, X, replay=False)
    gain[()] = -4.0
    _after(g, X)


@pytest.mark.parametrize("kind", ["bytearray", "array.array", "memoryview"])
def test_raw_buffer_read_through_frombuffer_changed_in_place(kind):
    if kind == "bytearray":
        buf = bytearray(struct.pack("4f", 1.0, 2.0, 3.0, 4.0))
        change = lambda: buf.__setitem__(slice(0, 4), struct.pack("f", -8.0))  # noqa: E731
    elif kind == "array.array":
        buf = array.array("f", [1.0, 2.0, 3.0, 4.0])
        change = lambda: buf.__setitem__(0, -8.0)  # noqa: E731
    else:
        backing = bytearray(struct.pack("4f", 1.0, 2.0, 3.0, 4.0))
        buf = memoryview(backing)
        change = lambda: backing.__setitem__(slice(0, 4), struct.pack("f", -8.0))  # noqa: E731

    def f(x):
        return x * torch.frombuffer(buf, dtype=torch.float32)

    g = engine.vmap(f)
    _warm(g, X, replay=False)
    change()
    _after(g, X)


# ------------------------------------------------------------------------------------------------
# scalar arguments whose == hides a difference


def test_signed_zero_float_argument():
    g = engine.vmap(lambda x, s: x / s, in_dims=(0, None))
    _warm(g, X, 0.0)
    _after(g, X, -0.0)


def test_signed_zero_keyword_argument_of_grad():
    def loss(w, *, temperature):
        return (w / temperature).exp().sum()

    g = engine.grad(loss)
    w = torch.tensor([-1.0, 0.0, 1.0])
    _warm(g, w, temperature=0.0)
    _after(g, w, temperature=-0.0)


def test_signed_zero_inside_a_tuple_argument():
    g = engine.vmap(lambda x, bounds: x / bounds[0] + bounds[1], in_dims=(0, None))
    _warm(g, X, (0.0, 1.0))
    _after(g, X, (-0.0, 1.0))


def test_signed_zero_complex_argument():
    g = engine.vmap(lambda x, c: torch.view_as_real(x.to(torch.complex64) / c), in_dims=(0, None))
    _warm(g, X, complex(0.0, 0.0))
    _after(g, X, complex(-0.0, 0.0))


def test_signed_zero_numpy_float64_argument():
    g = engine.vmap(lambda x, s: x / s, in_dims=(0, None))
    _warm(g, X, np.float64(0.0), replay=False)
    _after(g, X, np.float64(-0.0))


def test_nan_payload_argument():
    quiet = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    other = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000002))[0]

    def f(x, fill):
        return torch.where(x > 0, x, torch.full_like(x, fill))

    g = engine.vmap(f, in_dims=(0, None))
    for fill in (quiet, quiet, quiet, quiet, other, other, other, quiet):
        want = _eager(g, X, fill)
        got = g(X, fill)
        _exact(got, want)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), "NaN payloads differ"


@pytest.mark.parametrize("first, then", [(True, 1), (1, 1.0), (True, 1.0), (1.0, True)], ids=["bool-int", "int-float", "bool-float", "float-bool"])
def test_scalars_equal_under_eq_but_of_another_type(first, then):
    def f(x, v):
        return x + torch.full((4,), v) * 3  # bool, int64 or float32 depending on the scalar's type

    g = engine.vmap(f, in_dims=(0, None))
    xi = torch.arange(12).reshape(3, 4)
    _warm(g, xi, first)
    _after(g, xi, then)
    assert g(xi, then).dtype == _eager(g, xi, then).dtype


def test_int_argument_changes_integer_division():
    g = engine.vmap(lambda x, d: torch.div(x, d, rounding_mode="floor"), in_dims=(0, None))
    xi = torch.arange(-6, 6).reshape(3, 4)
    _warm(g, xi, 4)
    _after(g, xi, -4)
    _after(g, xi, 4.0)


# ------------------------------------------------------------------------------------------------
# Python modules reached by the function


HELPERS_SRC = """
import torch
SCALE = 2.0
def scale(x):
    return x * SCALE
def shift(x):
    return x + 1.0
"""


def test_module_in_closure_function_attribute_replaced():
    helpers = _module("adv_helpers_closure", HELPERS_SRC)

    def f(x):
        return helpers.scale(x).sin()

    g = engine.vmap(f)
    _warm(g, X)
    helpers.scale = helpers.shift  # `helpers.scale = other_scale`, the monkeypatch of a helper
    _after(g, X)


def test_module_in_closure_constant_rebound():
    helpers = _module("adv_helpers_const", HELPERS_SRC)

    def f(x):
        return x * helpers.SCALE

    g = engine.vmap(f)
    _warm(g, X)
    helpers.SCALE = -3.0
    _after(g, X)


def test_module_as_default_argument_function_replaced():
    helpers = _module("adv_helpers_default", HELPERS_SRC)

    def f(x, h=helpers):
        return h.scale(x)

    g = engine.vmap(f)
    _warm(g, X)
    helpers.scale = helpers.shift
    _after(g, X)


def test_module_held_by_a_config_object_function_replaced():
    helpers = _module("adv_helpers_attr", HELPERS_SRC)

    class Model:
        def __init__(self, ops):
            self.ops = ops

        def __call__(self, x):
            return self.ops.scale(x).cos()

    g = engine.vmap(Model(helpers))
    _warm(g, X)
    helpers.scale = helpers.shift
    _after(g, X)


def test_global_of_another_module_rebound():
    other = _module("adv_other_globals", HELPERS_SRC)
    g = engine.vmap(other.scale)  # a function defined in another module, reading its globals
    _warm(g, X)
    other.SCALE = 7.0
    _after(g, X)


def test_attribute_of_a_global_module_read_with_getattr():
    other = _module("adv_getattr_mod", HELPERS_SRC)
    globals()["_ADV_CFG"] = other
    try:
        def f(x):
            return x * getattr(_ADV_CFG, "SCALE")  # noqa: F821 (set just above, as a notebook does)

        g = engine.vmap(f)
        _warm(g, X)
        other.SCALE = -5.0
        _after(g, X)
    finally:
        del globals()["_ADV_CFG"]


# ------------------------------------------------------------------------------------------------
# notebooks: globals rebound, deleted and redefined


def _nb_act(x):
    return x.tanh()


def _nb_loss(w):
    return _nb_act(w).sum() * _NB_SCALE  # noqa: F821


def test_notebook_rebinds_a_global_helper_and_a_global_scalar():
    global _nb_act
    g = engine.vmap(engine.grad(_nb_loss))
    old_act = _nb_act
    globals()["_NB_SCALE"] = 2.0
    try:
        _warm(g, X)
        _nb_act = torch.sigmoid  # a cell re-run with another activation
        _after(g, X)
        globals()["_NB_SCALE"] = 0.5
        _after(g, X)
    finally:
        _nb_act = old_act
        del globals()["_NB_SCALE"]


def test_notebook_deletes_a_global_then_redefines_it():
    def f(x):
        return _NB_OFFSET(x)  # noqa: F821

    globals()["_NB_OFFSET"] = lambda x: x + 1.0
    g = engine.vmap(f)
    try:
        _warm(g, X)
        del globals()["_NB_OFFSET"]
        with pytest.raises(NameError):
            g(X)
        globals()["_NB_OFFSET"] = lambda x: x * -2.0
        _after(g, X)
    finally:
        globals().pop("_NB_OFFSET", None)


def test_closure_rebinding_through_a_nonlocal_setter():
    def make():
        temperature = 1.0

        def f(x):
            return (x / temperature).softmax(-1)

        def set_temperature(t):
            nonlocal temperature
            temperature = t

        return f, set_temperature

    f, set_temperature = make()
    g = engine.vmap(f)
    _warm(g, X)
    set_temperature(0.25)
    _after(g, X)
