"""Properties of the graph passes that change a replay's ops (engine.graph_passes.ARITHMETIC_PASSES),
checked on random functions: a replay gives the eager call's bits where the pass claims them
(slice_sums_to_cat), and stays within the dtype's tolerance and follows captured tensors written
in place where it claims only that (mm_operand_layout, whatever layouts it picks)."""
from __future__ import annotations

from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine import graph_passes
from engine.autotrace import autotraced_state

CALLS = 5  # first call, watched call, recording call, then replays
PART_FUNCTIONS = {
    "sin": torch.sin,
    "square": lambda t: t * t,
    "exp": torch.exp,
    "signed_zero": lambda t: t * torch.tensor([-0.0, 2.0, -0.0, -1.5]).repeat(t.shape[-1])[: t.shape[-1]],
    "tanh": torch.tanh,
}


def _replays(f, *args):
    with engine.auto_tracing(True):
        for _ in range(CALLS):
            f(*args)
    state = autotraced_state(f)
    assert state.impure is None, state.impure
    (entry,) = state.traced._cache.values()
    return entry


@settings(max_examples=30, deadline=None)
@given(
    size=st.integers(2, 24),
    parts=st.lists(st.tuples(st.integers(0, 24), st.integers(1, 12), st.sampled_from(sorted(PART_FUNCTIONS))),
                   min_size=2, max_size=5),
    batch=st.sampled_from([0, 3]),
    seed=st.integers(0, 2**16),
)
def test_a_vector_cut_into_parts_replays_its_eager_bits(size, parts, batch, seed):
    ranges = [(min(start, size - 1), min(start + length, size), name) for start, length, name in parts]

    def f(theta):
        return sum(PART_FUNCTIONS[name](theta[s:e]).sum() for s, e, name in ranges)

    g = engine.grad(f) if not batch else engine.vmap(engine.grad(f))
    theta = torch.randn(*([batch] if batch else []), size, generator=torch.Generator().manual_seed(seed))
    theta[..., ::3] = -0.0  # signed zeros where the parts' products make them
    entry = _replays(g, theta)
    got = g(theta)
    with engine.auto_tracing(False):
        eager = g(theta)
    assert torch.equal(got, eager) and torch.equal(got.signbit(), eager.signbit()), entry.rewrites


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(2, 40), k=st.integers(2, 40), n=st.integers(2, 40),
    transposed=st.booleans(), weight_left=st.booleans(), pick=st.integers(0, 3), seed=st.integers(0, 2**16),
)
def test_a_relaid_captured_operand_keeps_the_product_and_follows_writes(m, k, n, transposed, weight_left, pick, seed):
    gen = torch.Generator().manual_seed(seed)
    stored = torch.randn(n, k, generator=gen) if transposed else torch.randn(k, n, generator=gen)
    W = stored.t() if transposed else stored  # [k, n], row- or column-major

    def u(row):  # row: [k] (weight on the right) or [n] (on the left)
        return torch.tanh(row @ W.t()) if weight_left else torch.tanh(row @ W)

    x = torch.randn(m, n if weight_left else k, generator=gen)

    def choose(a, b, options):  # whichever layouts the timing would pick, by the drawn number
        return ([(False, False)] + list(options))[pick % (len(options) + 1)]

    with mock.patch.object(graph_passes, "_faster_layouts", choose):
        f = engine.vmap(u)
        _replays(f, x)
        torch.testing.assert_close(f(x), torch.func.vmap(u)(x))
        stored.mul_(-0.5)  # a write into the captured weight: the fold's copy must follow it
        torch.testing.assert_close(f(x), torch.func.vmap(u)(x))
