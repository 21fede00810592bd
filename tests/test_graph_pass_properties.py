"""Properties of the graph passes that change a replay's ops, checked on random functions: a
replay gives the eager call's bits where the pass claims them (slice_sums_to_cat, the numbers
made tensors by _scalars_as_tensors), and stays within the dtype's tolerance and follows captured
tensors written in place where it claims only that (mm_operand_layout, whatever layouts it picks)."""
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


SCALAR_OPS = {
    "mul": lambda x, s: x * s,
    "add": lambda x, s: x + s,
    "add_alpha": lambda x, s: torch.add(x, s, alpha=-3),
    "sub_alpha": lambda x, s: torch.sub(x, s, alpha=0.3),
    "div": lambda x, s: x / s,
    "rsub": lambda x, s: s - x,
    "lt": lambda x, s: x < s,
    "ge": lambda x, s: x >= s,
    "eq": lambda x, s: x == s,
}
NUMBERS = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.1, -0.0, 1e-40, 1e-310, 3.5e38, 1e300, 1 / 3]))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.bool else t.view({4: torch.int32, 8: torch.int64}[t.element_size()])


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(sorted(SCALAR_OPS)), number=NUMBERS, dtype=st.sampled_from([torch.float32, torch.float64]),
       transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_a_number_made_a_tensor_gives_the_eager_bits(op, number, dtype, transposed, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(6, 5, generator=gen) * torch.randn(6, 5, generator=gen).mul(30).exp()).to(dtype)
    x.view(-1)[:8] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, 1e-310, -3e38])
    x = x.t() if transposed else x
    f = SCALAR_OPS[op]
    traced = engine.trace(lambda x: f(x, number))
    traced(x)
    got = traced(x)
    (entry,) = traced._cache.values()
    numbers = [n for n in entry.gm.graph.nodes
               if n.target in graph_passes.SCALAR_TWINS and type(n.args[1]) in (int, float, bool)]
    assert not numbers, entry.gm.code  # the pass took every number
    want = f(x, number)
    assert got.dtype == want.dtype and got.stride() == want.stride() and torch.equal(_bits(got), _bits(want))


_PERMUTATIONS = ("permute", "transpose", "t")


@settings(max_examples=40, deadline=None)
@given(rank=st.integers(2, 4), steps=st.lists(st.tuples(st.sampled_from(_PERMUTATIONS), st.randoms(use_true_random=False)),
                                               min_size=2, max_size=5), seed=st.integers(0, 2 ** 16))
def test_a_chain_of_permutations_replays_the_same_view(rank, steps, seed):
    # _simplify makes a chain of permute/transpose/t one permute of its input (or the input):
    # the replay reads the same elements through the same strides, so products of it keep their
    # bits, and the chain's own result keeps its layout.
    shape = (2, 3, 4, 5)[:rank]
    ops = []
    for kind, rng in steps:
        if kind == "permute":
            dims = list(range(rank))
            rng.shuffle(dims)
            ops.append(lambda t, d=tuple(dims): t.permute(d))
        elif kind == "transpose":
            i, j = rng.randrange(rank), rng.randrange(rank)
            ops.append(lambda t, i=i, j=j: t.transpose(i, j))
        elif rank == 2:
            ops.append(lambda t: t.t())

    def chain(x):
        for op in ops:
            x = op(x)
        return x

    def f(x, w):
        y = chain(x)
        return (y * w.reshape(-1)[: y.shape[-1]]).sum(-1), y

    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    w = torch.randn(8, generator=torch.Generator().manual_seed(seed + 1))
    traced = engine.trace(f)
    traced(x, w)
    got = traced(x, w)
    want = f(x, w)
    for g, e in zip(got, want):
        assert torch.equal(g, e) and g.stride() == e.stride()
    views = [n for n in traced.graphs()[0].graph.nodes
             if n.target in (torch.ops.aten.permute.default, torch.ops.aten.transpose.int, torch.ops.aten.t.default)]
    assert len(views) <= 1, [(n.target, n.args) for n in views]
