"""The fused tier's XLA backend (engine.fused_xla, engine.jax_lowering): each rule agrees with
torch's op, a program follows its captured tensors (in-place writes, new memory, new strides), a
program that disagrees with the replay or aliases differently is refused, and a graph XLA cannot
take is said by name and left to inductor or the replay."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import engine
from engine import fused, fused_xla, jax_lowering
from fused_stand_in import FAKE_SOURCE

pytest.importorskip("jax")

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def xla_tier(monkeypatch):
    """Every replayed CPU signature compiled by XLA at its first replay (waited for), no trial."""
    monkeypatch.setattr(fused, "BACKEND", "xla")
    monkeypatch.setattr(fused, "TRIAL_CALLS", 0)
    yield
    fused.settle(60)


def _forced(fn, *args):
    """fn's result through a traced function whose replay runs as an XLA program, with the state."""
    traced = engine.trace(fn)
    with engine.fused_tier("force"):
        traced(*args)  # the recording
        out = traced(*args)  # the first replay compiles, waits, and runs the program
    return out, traced.tiers()[0], traced


def _xla_ran(state: dict) -> bool:
    return state["state"] == "fused"


X = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
W = torch.randn(7, 3, generator=torch.Generator().manual_seed(1))

# One function per family of rules, each checked against torch itself.
CASES = {
    "pointwise": lambda x: (x.exp() - x.sin() * x.tanh() + x.abs().sqrt().log1p() - x.sigmoid() / 3) ** 2,
    "comparisons": lambda x: torch.where(x > 0.1, x, -x) + (x <= 0).float() - x.clamp(-0.5, 0.5),
    "reductions": lambda x: torch.stack([x.sum(), x.mean(), x.amax(), x.logsumexp(0).sum(), x.sum(1).prod()]),
    "linear": lambda x: torch.nn.functional.linear(x, W.t(), torch.ones(3)) @ W.t() + torch.bmm(x[None], W[None]).sum(),
    "views": lambda x: x.t().reshape(-1, 5)[1:, ::2].unsqueeze(0).expand(2, -1, -1).permute(2, 0, 1).contiguous() * 2,
    "cat_select": lambda x: torch.cat([x[0], x[:, 3], x[-1, 1:4]]) + x.select(1, 2).sum(),
    "softmax": lambda x: torch.log_softmax(x, 1) + torch.softmax(x, 0),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (7,), torch.linspace(0.5, 1.5, 7), torch.zeros(7)),
    "indexing": lambda x: x[torch.tensor([0, 2, 2])] * x[:, torch.tensor([1, 0])].sum(),
    "activations": lambda x: torch.nn.functional.gelu(x) + torch.nn.functional.silu(x) + torch.nn.functional.softplus(x)
    + torch.nn.functional.elu(x) + torch.relu(x),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_family_of_rules_agrees_with_torch(xla_tier, name):
    fn = CASES[name]
    out, state, _ = _forced(fn, X)
    assert _xla_ran(state), state
    torch.testing.assert_close(out, fn(X), rtol=1e-5, atol=1e-5)
    x2 = torch.randn(5, 7)
    torch.testing.assert_close(engine.trace(fn)(x2), fn(x2), rtol=1e-5, atol=1e-5)


def test_sign_is_torchs_at_nan_and_negative_zero(xla_tier):
    # jnp.sign gives NaN at NaN and -0.0 at -0.0; torch.sign and torch.sgn give 0 at both.
    x = torch.tensor([[float("nan"), -0.0, 0.0, -2.5], [3.0, -1e-30, float("inf"), float("-inf")]])

    def fn(x):
        return torch.stack([torch.sign(x), torch.sgn(x) * 2])

    out, state, _ = _forced(fn, x)
    assert _xla_ran(state), state
    assert torch.equal(out, fn(x)) and not out.isnan().any()
    assert torch.equal(torch.signbit(out), torch.signbit(fn(x)))  # +0.0 where torch has +0.0


def _loss(w: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    z = torch.nn.functional.layer_norm(torch.tanh(x @ w), (3,))
    return torch.nn.functional.cross_entropy(z, t)


def test_per_sample_gradients_and_hessians_match_torch_func(xla_tier):
    """Backward formulas (tanh, layer norm, log-softmax, nll-loss) through vmap(grad) and a
    vmapped Hessian, against torch.func."""
    t = torch.tensor([0, 2, 1, 1, 0])
    grads = engine.vmap(engine.grad(_loss), in_dims=(None, 0, 0))
    out, state, _ = _forced(lambda w, x, t: grads(w, x[:, None], t[:, None]), W, X, t)
    assert _xla_ran(state), state
    want = torch.func.vmap(torch.func.grad(_loss), in_dims=(None, 0, 0))(W, X[:, None], t[:, None])
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)

    def logp(w: torch.Tensor) -> torch.Tensor:
        z = X.double() @ w
        return torch.distributions.Normal(0.0, 1.0).log_prob(w).sum() - torch.nn.functional.softplus(z).sum()

    ws = torch.randn(4, 7, dtype=torch.float64)
    out, state, _ = _forced(engine.vmap(engine.hessian(logp)), ws)
    assert _xla_ran(state), state
    torch.testing.assert_close(out, torch.func.vmap(torch.func.hessian(logp))(ws))


def _expanded_chain(x: torch.Tensor, y: torch.Tensor) -> tuple:
    """Elementwise work on expanded values, mixed with whole ones (one by a rule that needs its
    operands shaped alike), truth reductions of them, and an expanded value that leaves the graph."""
    e = x[:, None].expand(4, 6)  # (4, 1) seen as (4, 6)
    z = torch.lgamma(e * 0.5 + 1.0) + torch.digamma(e.exp() + 1.0)
    z = torch.where(e > 0, z, -z) * y + (e - y).abs()
    return z, (e > -10).all(), e.sigmoid(), y[None].expand(2, 4, 6).sum(0), aten.gelu_backward(e, y)


def test_expanded_values_are_computed_compact_and_agree_with_torch(xla_tier):
    """An expanded tensor's elementwise ops run on its distinct elements (jax_lowering.Broadcast:
    lgamma and digamma see a (4, 1) operand, not (4, 6)), and the program agrees with torch."""
    x, y = torch.randn(4), torch.randn(4, 6)
    out, state, _ = _forced(_expanded_chain, x, y)
    assert _xla_ran(state), state
    for got, want in zip(out, _expanded_chain(x, y)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    import jax

    gm = make_fx(_expanded_chain)(x, y)
    meta, _ = jax_lowering.observe(gm, [x, y])
    jaxpr = str(jax.make_jaxpr(jax_lowering.lower(gm, meta))(x.numpy(), y.numpy()))
    heavy = [line for line in jaxpr.splitlines() if "lgamma" in line or "digamma" in line]
    assert heavy and all("f32[4,1]" in line and "f32[4,6]" not in line for line in heavy), heavy


def test_a_truth_reduction_of_an_empty_expanded_value_is_torchs(xla_tier):
    """all() over a value expanded to no elements is True whatever its one row holds."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x[:, None].expand(3, 0) > 0).all().float() + x.sum()

    x = -torch.ones(3)
    out, state, _ = _forced(f, x)
    assert _xla_ran(state), state
    assert torch.equal(out, f(x))


def _shared_rates(z: torch.Tensor) -> tuple:
    """One exp read by two consumers (a formula and a check of the same values), one by one."""
    r = z.exp()
    return r * z + r.sum(), (r >= 0).all(), z.tanh() * 2


def test_a_transcendental_value_read_twice_is_computed_once_and_agrees(xla_tier):
    """An exp read by a check and by a formula, large enough, is behind an optimization barrier
    (XLA would compute it, and what feeds it, in each consumer's fusion); a tanh read once, or a
    small exp, is not."""
    import jax

    for n, barriers in [(64, 1), (8, 0)]:
        z = torch.randn(n, 32, generator=torch.Generator().manual_seed(n)) * 0.1
        out, state, _ = _forced(_shared_rates, z)
        assert _xla_ran(state), state
        for got, want in zip(out, _shared_rates(z)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        gm = make_fx(_shared_rates)(z)
        meta, _ = jax_lowering.observe(gm, [z])
        jaxpr = str(jax.make_jaxpr(jax_lowering.lower(gm, meta))(z.numpy()))
        assert jaxpr.count("optimization_barrier") == barriers, jaxpr


def _bounds(x: torch.Tensor, s: torch.Tensor) -> tuple:
    return ((x >= 0).all(), (x > s).all(), (0.5 < x).all(), (s < x).all(), (x <= 2).all(),
            (x.abs() < s + 3).all(), (x == 0).all(), (x >= 0.25).any())


@pytest.mark.parametrize("case", ["positive", "a NaN", "below", "empty", "integers"])
def test_bounds_on_every_element_compare_one_extreme_and_agree(xla_tier, case):
    """`all(x >= s)` and its kin (a number or a one-element bound, on either side) lower to a
    comparison of x's min or max, not a truth reduction, and agree with torch: NaN included; an
    empty tensor and the other checks (==, any) keep the truth reduction."""
    import jax

    x = {"positive": torch.linspace(0.6, 1.9, 12), "a NaN": torch.tensor([0.7, float("nan"), 1.0]),
         "below": torch.tensor([0.7, -0.1, 3.0]), "empty": torch.zeros(0),
         "integers": torch.tensor([1, 2, 0])}[case]
    s = torch.tensor(0.55)
    gm = make_fx(_bounds)(x, s)
    meta, _ = jax_lowering.observe(gm, [x, s])
    program = jax_lowering.lower(gm, meta)
    with jax.enable_x64(True):  # (as the tier runs a program with 64-bit inputs)
        got = [bool(v) for v in jax.jit(program)(x.numpy(), s.numpy())]
        jaxpr = str(jax.make_jaxpr(program)(x.numpy(), s.numpy()))
    assert got == [bool(v) for v in _bounds(x, s)]
    extremes = jaxpr.count("reduce_min") + jaxpr.count("reduce_max")
    truths = jaxpr.count("reduce_and") + jaxpr.count("reduce_or")
    assert (extremes, truths) == ((0, 8) if case == "empty" else (6, 2)), jaxpr


@pytest.mark.parametrize("dims", [1, 2])
def test_grouped_convolution_gradients_agree_with_torch(xla_tier, dims):
    """convolution_backward with groups, stride, padding and dilation (the weight gradient has its
    own lowering there), and per-sample conv gradients through vmap(grad), against torch."""
    g = torch.Generator().manual_seed(3)
    size = (11,) * dims
    x = torch.randn(2, 6, *size, generator=g, dtype=torch.float64)
    w = torch.randn(9, 2, *(3,) * dims, generator=g, dtype=torch.float64)
    stride, padding, dilation = [2] * dims, [1] * dims, [2] * dims
    out = aten.convolution(x, w, None, stride, padding, dilation, False, [0] * dims, 3)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)

    def backward(grad, x, w):
        return aten.convolution_backward(grad, x, w, [9], stride, padding, dilation, False, [0] * dims, 3,
                                         [True, True, True])

    got, state, _ = _forced(backward, grad, x, w)
    assert _xla_ran(state), state
    for a, b in zip(got, backward(grad, x, w)):
        torch.testing.assert_close(a, b)

    conv = torch.nn.functional.conv1d if dims == 1 else torch.nn.functional.conv2d

    def loss(w, xi):
        return conv(xi[None], w, stride=2, padding=1, dilation=2).tanh().sum()

    xs = torch.randn(4, 6, *size, generator=g, dtype=torch.float64)
    w1 = torch.randn(5, 6, *(3,) * dims, generator=g, dtype=torch.float64)
    grads = engine.vmap(engine.grad(loss), in_dims=(None, 0))
    got, state, _ = _forced(grads, w1, xs)
    assert _xla_ran(state), state
    torch.testing.assert_close(got, torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(w1, xs))


POOLS = {  # kernel, stride, padding, dilation, ceil_mode
    "plain": ([2, 2], [], [0, 0], [1, 1], False),
    "overlapping": ([3, 2], [1, 2], [1, 0], [1, 1], False),
    "padded_dilated": ([3, 3], [2, 2], [1, 1], [2, 1], False),
    "ceil": ([2, 3], [2, 2], [0, 1], [1, 1], True),
}


@pytest.mark.parametrize("case", sorted(POOLS))
def test_max_pooling_picks_torchs_maxima_and_routes_gradients_alike(xla_tier, case):
    """max_pool2d_with_indices: the same maxima and indices as torch's kernel (the first of equal
    maxima, NaN taken, -inf windows, padding, dilation, ceil_mode), its backward the same gradient;
    and per-sample gradients of a small CNN with pooling through vmap(grad), against torch.func."""
    kernel, stride, padding, dilation, ceil_mode = POOLS[case]
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-3, 4, (2, 3, 9, 8), generator=g).double()  # small integers: many ties
    x[0, 0, 2, 3] = float("nan")
    x[0, 1, 4:, :5] = float("-inf")
    x[1, 2, 0, 0] = x[1, 2, 0, 1] = float("nan")

    def forward(x):
        return aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)

    (got, at), state, _ = _forced(forward, x)
    assert _xla_ran(state), state
    want, want_at = forward(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(at, want_at)
    grad = torch.randn(want.shape, generator=g, dtype=torch.float64)

    def backward(grad, x, at):
        return aten.max_pool2d_with_indices_backward(grad, x, kernel, stride, padding, dilation, ceil_mode, at)

    got, state, _ = _forced(backward, grad, x, want_at)
    assert _xla_ran(state), state
    torch.testing.assert_close(got, backward(grad, x, want_at))

    w = torch.randn(4, 3, 3, 3, generator=g, dtype=torch.float64)

    def loss(w, xi):
        y = torch.nn.functional.conv2d(xi[None], w, padding=1).relu()
        return torch.nn.functional.max_pool2d(y, kernel, stride or None, padding, dilation, ceil_mode).square().sum()

    xs = torch.randn(5, 3, 9, 8, generator=g, dtype=torch.float64)
    grads = engine.vmap(engine.grad(loss), in_dims=(None, 0))
    got, state, _ = _forced(grads, w, xs)
    assert _xla_ran(state), state
    torch.testing.assert_close(got, torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(w, xs))


def test_a_program_follows_its_captured_tensors(xla_tier):
    """The program keeps the captured tensors' arrays between calls (sharing their memory): an
    in-place write is seen, and a tensor given other memory, strides or values by `.data` is
    handed to XLA again, never read stale."""
    c = torch.randn(5, 7)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * c).exp().sum(0)

    out, state, traced = _forced(f, X)
    assert _xla_ran(state), state
    torch.testing.assert_close(out, f(X))
    with engine.fused_tier(True):  # (the tests' default is off: VMAPBENCH_FUSED=0, conftest)
        with torch.no_grad():
            c.mul_(-2.0)  # the same memory, other bytes
        torch.testing.assert_close(traced(X), f(X))
        c.data = torch.randn(7, 5).t()  # other memory, other strides
        torch.testing.assert_close(traced(X), f(X))
        c.data = torch.randn(5, 7)
        torch.testing.assert_close(traced(X), f(X))
    assert traced.tiers()[0]["state"] == "fused"


def test_a_held_tensor_given_new_memory_of_its_layout_is_handed_to_xla_again(xla_tier, monkeypatch):
    """The same tensor object at another address, with the layout the program was compiled for
    (`.data` set to a tensor like it): its new memory is passed, never the array of the old one."""
    c = torch.randn(5, 7)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * c).exp().sum(0)

    out, state, traced = _forced(f, X)
    assert _xla_ran(state), state
    ran = []
    monkeypatch.setattr(fused_xla._Call, "__call__", lambda self, inputs, call=fused_xla._Call.__call__: ran.append(1) or call(self, inputs))
    with engine.fused_tier(True):  # (the tests' default is off: VMAPBENCH_FUSED=0, conftest)
        for seed in range(3):
            c.data = torch.randn(5, 7, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(traced(X), f(X))
    assert len(ran) == 3, "the program did not run"


def test_an_argument_passed_again_is_held_and_followed(xla_tier, monkeypatch):
    """A call's own argument that is the same tensor at the same address twice running is held
    as an XLA array sharing its memory; what the program then computes follows the tensor: an
    in-place write, new memory of the same layout (`.data`), another tensor, and back."""
    w = torch.randn(7, 3)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).tanh().sum(0)

    out, state, traced = _forced(f, X, w)
    assert _xla_ran(state), state
    calls = []
    monkeypatch.setattr(fused_xla._Call, "__call__",
                        lambda self, inputs, call=fused_xla._Call.__call__: calls.append(self) or call(self, inputs))
    other = torch.randn(7, 3)
    with engine.fused_tier(True):  # (the tests' default is off: VMAPBENCH_FUSED=0, conftest)
        for step in range(4):
            torch.testing.assert_close(traced(X, w), f(X, w))
        held = [h for h in calls[-1].held[:calls[-1].arguments] if h and h[2] is not None]
        assert any(h[0] is w for h in held), "an argument passed again was not held"
        w.mul_(2)  # in place, same memory
        torch.testing.assert_close(traced(X, w), f(X, w))
        w.data = torch.randn(7, 3)  # the same object, new memory of its layout
        torch.testing.assert_close(traced(X, w), f(X, w))
        torch.testing.assert_close(traced(X, other), f(X, other))
        torch.testing.assert_close(traced(X, w), f(X, w))
        torch.testing.assert_close(traced(X, w), f(X, w))
    assert len(calls) == 9, "the program did not run on every call"


def _unaligned(*shape: int) -> torch.Tensor:
    """A tensor 16 bytes into torch's memory: aligned as torch's kernels need, not as XLA shares."""
    n = 1
    for s in shape:
        n *= s
    base = torch.randn(n + 4, generator=torch.Generator().manual_seed(n))
    t = base[4:].view(*shape)
    assert t.data_ptr() % 64 == 16
    return t


def test_inputs_xla_would_copy_are_staged_and_followed(xla_tier, monkeypatch):
    """A captured tensor and a repeated argument whose memory XLA does not share are each copied
    into a staging tensor of the program's; what it computes follows them (in-place writes,
    other tensors, writes through numpy's view, a transposed one), and a call that finds the
    staging tensors in use passes its own inputs."""
    c, w, ct = _unaligned(5, 7), _unaligned(7, 3), _unaligned(3, 7).t()

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x * c).exp() @ (w.tanh() + ct)

    out, state, traced = _forced(f, X, w)
    assert _xla_ran(state), state
    calls = []
    monkeypatch.setattr(fused_xla._Call, "__call__",
                        lambda self, inputs, call=fused_xla._Call.__call__: calls.append(self) or call(self, inputs))
    with engine.fused_tier(True):  # (the tests' default is off: VMAPBENCH_FUSED=0, conftest)
        for _ in range(3):
            torch.testing.assert_close(traced(X, w), f(X, w))
        staged = [h[0] for h in calls[-1].held if h and len(h) == 5]
        assert all(any(t is s for t in staged) for s in (c, w, ct)), "an input was not staged"
        with torch.no_grad():
            c.mul_(-0.5)
            w.add_(1.0)
        torch.testing.assert_close(traced(X, w), f(X, w))
        ct.numpy()[1] *= 3.0  # (no version counter moves)
        w.numpy()[0] = 0.25
        torch.testing.assert_close(traced(X, w), f(X, w))
        other = _unaligned(7, 3) * 2
        torch.testing.assert_close(traced(X, other), f(X, other))
        assert calls[-1].staging.acquire(blocking=False)  # as if another thread's call were copying
        try:
            torch.testing.assert_close(traced(X, w * 3), f(X, w * 3))
        finally:
            calls[-1].staging.release()
        torch.testing.assert_close(traced(X, w), f(X, w))
    assert len(calls) == 8, "the program did not run on every call"


def test_expanded_and_transposed_inputs_reach_xla_without_a_copy():
    """An input of stride 0 is passed as its one row, a transposed one in memory order."""
    base = torch.randn(3, 1)
    expanded, transposed = base.expand(3, 4), torch.randn(4, 3).t()
    fe, ft = fused_xla._Feed(expanded), fused_xla._Feed(transposed)
    assert fe.passed == (3, 1) and fe.array(expanded).ctypes.data == base.data_ptr()
    assert ft.passed == (4, 3) and ft.array(transposed).ctypes.data == transposed.data_ptr()


def test_a_program_that_disagrees_with_the_replay_is_refused(xla_tier, monkeypatch):
    monkeypatch.setitem(jax_lowering.RULES, aten.exp.default, lambda x: x * 2)  # a wrong rule
    out, state, traced = _forced(lambda x: x.exp() + 1, X)
    assert state["state"] == "failed" and "differs from the replay" in state["error"], state
    torch.testing.assert_close(out, X.exp() + 1, rtol=0, atol=0)  # the replay answered


def test_an_output_that_views_an_input_stays_with_the_replay():
    gm = make_fx(lambda x: (x.t(), x + 1))(X)
    with pytest.raises(fused_xla.XlaRejected, match="shares memory"):
        fused_xla.compile_graph(gm, [X])


def test_an_op_without_a_rule_is_named(xla_tier):
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.special.i0(x) + 1

    out, state, _ = _forced(f, X)
    assert state["state"] == "ineligible" and "i0" in state["error"], state
    torch.testing.assert_close(out, f(X), rtol=0, atol=0)


def test_auto_chooses_xla_where_it_can_and_inductor_elsewhere(monkeypatch):
    monkeypatch.setattr(fused, "BACKEND", "auto")
    gm = make_fx(lambda x: torch.special.i0(x))(X)
    plain = make_fx(lambda x: x * 2)(X)
    assert fused._backend_for(plain, [X]) == "xla"
    assert fused._backend_for(gm, [X]) == "inductor"
    random = make_fx(lambda x: x + torch.rand_like(x))(X)
    assert fused._backend_for(random, [X]) == "inductor"  # a program must draw what the replay draws


@pytest.mark.parametrize("on_disk", [True, False])
def test_auto_takes_inductors_program_where_it_is_on_disk(monkeypatch, on_disk):
    """Under auto a signature whose inductor program is on disk loads it (at no compile cost);
    otherwise XLA compiles it, at XLA's cost."""
    monkeypatch.setattr(fused, "BACKEND", "auto")
    monkeypatch.setattr(fused.Tier, "_known", lambda self, entry, inputs: on_disk)

    class Entry:
        gm = make_fx(lambda x: x * 2)(X)

    entry = Entry()
    tier = fused.Tier(entry)
    tier._choose(entry, [X])
    assert (tier.backend, tier.cost) == (("inductor", 0.0) if on_disk else ("xla", fused._xla_cost()))


def test_without_jax_the_tier_says_so_once_and_uses_inductor(monkeypatch):
    monkeypatch.setattr(fused, "BACKEND", "auto")
    monkeypatch.setattr(fused_xla, "available", lambda: "jax is not installed (pip install 'jax[cpu]')")
    monkeypatch.setattr(fused, "_SAID", set())
    plain = make_fx(lambda x: x * 2)(X)
    with pytest.warns(RuntimeWarning, match="XLA is not usable here"):
        assert fused._backend_for(plain, [X]) == "inductor"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fused._backend_for(plain, [X]) == "inductor"  # said once


def test_the_pay_rule_uses_the_measured_xla_compile(monkeypatch):
    monkeypatch.setattr(fused, "HISTORY", [])
    assert fused._xla_cost() >= fused.XLA_COMPILE_S
    fused.HISTORY.extend({"backend": "xla", "seconds": s, "error": None} for s in (0.1, 0.2, 5.0))
    import sys

    expected = 0.2 + (0.0 if "jax" in sys.modules else fused.JAX_IMPORT_S)
    assert fused._xla_cost() == pytest.approx(expected)


@pytest.mark.parametrize("backend", ["auto", "xla"])
def test_an_xla_program_that_lost_its_trial_counts_on_toward_inductor_under_auto(monkeypatch, backend):
    """The trial's verdict (Tier.slower) on an XLA program: under `auto` the signature replays and
    counts on toward inductor at inductor's cost, as one XLA refused does; under `xla` it stays on
    the replay for good."""
    monkeypatch.setattr(fused, "BACKEND", backend)
    traced = engine.trace(lambda x: x * 2 + 1)
    x = torch.randn(4)
    traced(x)
    (entry,) = traced._cache.values()
    tier = fused.Tier(entry)
    tier.state, tier.backend, tier.cost = "fused", "xla", 0.5
    entry.fused, entry.tier = object(), None
    tier.slower(entry, 2e-3, 1e-3)
    assert entry.fused is None and "replay is kept" in tier.error
    if backend == "auto":
        assert (tier.state, tier.backend, tier.cost, entry.tier) == ("replay", "inductor", fused.COLD_COMPILE_S, tier)
        assert tier.error.startswith("XLA: ")
    else:
        assert (tier.state, tier.backend, entry.tier) == ("slower", "xla", None)
    torch.testing.assert_close(traced(x), x * 2 + 1)


_DISPATCH = """
import sys
if sys.argv[1] == "user": import jax
from engine import fused_xla
fused_xla._import_jax()
from jax._src import xla_bridge
print(xla_bridge._CPU_ENABLE_ASYNC_DISPATCH.value)
"""


@pytest.mark.parametrize("first, asynchronous", [("tier", "False"), ("user", "True")])
def test_the_tiers_own_jax_runs_programs_on_the_calling_thread(first, asynchronous):
    """Where the tier imports jax, XLA's CPU programs run inline (no pool thread spinning after
    each call); a jax the user imported first keeps its dispatch."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _DISPATCH, first], cwd=root, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == asynchronous


def test_the_agreement_check_follows_assert_closes_rule():
    """fused_xla._difference: within atol + rtol * |expected| passes, NaN only where the replay has
    NaN, an infinity only as itself; what differs is named."""
    e = torch.tensor([1.0, -2.0, float("nan"), float("inf"), float("-inf"), 0.0])
    assert fused_xla._difference(e.clone(), e, 1e-5, 1e-6) is None
    assert fused_xla._difference(e + torch.tensor([1e-6, -1e-5, 0, 0, 0, 5e-7]), e, 1e-5, 1e-6) is None
    beyond = e.clone()
    beyond[1] = -2.001
    assert "1 of 6 elements" in fused_xla._difference(beyond, e, 1e-5, 1e-6)
    for i, v in [(2, 1.0), (0, float("nan")), (3, 1e30), (4, float("inf")), (5, float("inf"))]:
        wrong = e.clone()
        wrong[i] = v
        assert fused_xla._difference(wrong, e, 1e-5, 1e-6) is not None, (i, v)
    for e, g in [(torch.full((2, 3), 1e-6), torch.full((2, 3), 2e-6))]:
        assert fused_xla._difference(g, e, 0.0, 1e-6) is None
        assert fused_xla._difference(g, e, 0.0, 5e-7) is not None


@pytest.mark.parametrize("inductor", ["wins", "loses", "fails"])
def test_under_auto_an_xla_program_climbs_to_inductors(monkeypatch, tmp_path, inductor):
    """auto: the XLA program first; its calls then count toward inductor's compile, whose program
    is tried against the XLA one, and the faster kept (a stand-in for inductor's output; which
    side is faster is set by the trial's threshold); where inductor fails the XLA program runs on.
    Every call's result is right throughout."""
    inductor_wins = inductor == "wins"
    monkeypatch.setattr(fused, "BACKEND", "auto")
    monkeypatch.setattr(fused, "MIN_REPLAYS", 2)
    monkeypatch.setattr(fused, "TRIAL_CALLS", 2)
    monkeypatch.setattr(fused, "SLOWER", 1e9)  # the XLA program passes its trial against the replay
    monkeypatch.setattr(fused, "COLD_COMPILE_S", 0.0)
    monkeypatch.setattr(fused, "_xla_cost", lambda: 0.0)
    monkeypatch.setattr(fused, "INDEX", fused.GraphIndex(tmp_path))
    compiles = []

    def stand_in(job):
        compiles.append(job.backend)
        if inductor == "fails":
            raise RuntimeError("inductor could not compile the graph: a stand-in's failure")
        if not inductor_wins:
            monkeypatch.setattr(fused, "SLOWER", 0.0)  # inductor's program loses to the XLA one
        return FAKE_SOURCE

    monkeypatch.setattr(fused._COMPILER, "_compile", stand_in)
    traced = engine.trace(lambda x: x * 2 + 1)
    x = torch.randn(6)
    states = []
    with engine.fused_tier(True):
        for _ in range(40):
            torch.testing.assert_close(traced(x), x * 2 + 1)
            fused.settle(60)
            (state,) = traced.tiers()
            states.append((state["state"], state["backend"]))
    if inductor == "fails":
        assert states[-1] == ("fused", "xla") and traced.tiers()[0]["error"].startswith("inductor: "), states
        assert traced._cache[next(iter(traced._cache))].fused.source == "xla"
        return
    assert states.index(("fused", "xla")) < states.index(("fused", "inductor")), states
    assert compiles == ["inductor"]
    (entry,) = traced._cache.values()
    program = entry.fused
    assert type(program) is fused.FusedProgram, program
    if inductor_wins:
        assert states[-1] == ("fused", "inductor") and program.source == FAKE_SOURCE
        calls = program.call.__globals__["CALLS"][0]
        with engine.fused_tier(True):
            torch.testing.assert_close(traced(x), x * 2 + 1)
        assert program.call.__globals__["CALLS"][0] == calls + 1
    else:
        assert states[-1] == ("fused", "xla") and program.source == "xla"
        assert "XLA program's" in traced.tiers()[0]["error"]


@pytest.mark.parametrize("chosen", [None, "xla"])
def test_force_under_auto_compiles_inductors_program(monkeypatch, chosen):
    """force waits for the compile, so under auto it compiles the program auto ends with,
    inductor's, also where an earlier unforced call had chosen XLA for the signature."""
    monkeypatch.setattr(fused, "BACKEND", "auto")
    traced = engine.trace(lambda x: x * 2 + 1)
    x = torch.randn(4)
    traced(x)
    (entry,) = traced._cache.values()
    tier = fused.Tier(entry)
    tier.backend = chosen
    promoted = []
    monkeypatch.setattr(tier.__class__, "promote", lambda self, inputs, wait: promoted.append((self.backend, wait)))
    tier.seen(1e-4, [x], fused.FORCE)
    assert promoted == [("inductor", True)]


_EXIT_IN_FLIGHT = """
import atexit
import time
import torch
from torch.fx.experimental.proxy_tensor import make_fx

def report():  # registered before the engine's own exit handlers: runs after them
    print("done" if job.done.is_set() else "in flight", job.error, flush=True)

atexit.register(report)
from engine import fused, fused_xla

fused_xla._import_jax()  # loaded here: the compiler thread goes straight to XLA's C++ compile

def chain(x):  # its compile takes far longer than the script's exit
    for i in range(24):
        x = torch.tanh(x * 1.001 + i) if i % 2 else torch.sin(x) @ torch.ones(8, 8)
    return x

x = torch.randn(8, 8)
job = fused.Job(None, [], [], "exit", None, backend="xla", gm=make_fx(chain)(x), inputs=[x], arguments=1)
fused._XLA.submit(job)
while not fused._XLA._queue.empty():  # until the compiler thread has taken it: in flight at exit
    time.sleep(0.001)
"""


def test_a_process_that_exits_during_an_xla_compile_waits_for_it_and_exits_cleanly(run_in_tree):
    """A script that ends while the tier compiles: its exit waits for the compile in flight (the
    compiler thread, back in Python after finalization began, would abort the process)."""
    done = run_in_tree(ROOT, _EXIT_IN_FLIGHT)
    assert (done.returncode, done.stdout.strip().splitlines()[-1:]) == (0, ["done None"]), done.stderr[-2000:]


def test_a_closed_compiler_takes_no_new_job():
    compiler = fused._Compiler()
    assert compiler.close(1.0)
    job = fused.Job(None, [], [], "late", None, backend="xla")
    compiler.submit(job)
    assert job.done.is_set() and job.error == fused.CLOSED and compiler.pending() == 0


_USER_FLAGS = """
import torch
from engine import fused_xla

torch.set_num_threads(1)
jax = fused_xla._import_jax()
jax.jit(lambda x: x * 2 + 1)(jax.numpy.ones(3)).block_until_ready()
"""


def test_the_users_xla_flags_reach_xla_when_the_tier_starts_it(tmp_path, monkeypatch, run_in_tree):
    """The tier adds its single-thread flag to a user's XLA_FLAGS without hiding any of them (XLA's
    parser ignores every flag after a word that is not one): here, the user's dump folder fills."""
    dump = tmp_path / "dump"
    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to={dump}")
    run_in_tree(ROOT, _USER_FLAGS).check_returncode()
    assert dump.is_dir() and any(dump.iterdir()), "XLA ignored the user's --xla_dump_to"


@pytest.mark.parametrize("users", [None, "3"])
def test_the_tiers_xla_pool_is_one_thread_where_torch_is_unless_the_user_sized_it(users, monkeypatch, xla_pool_in_child):
    """XLA's intra-op pool is one thread per core unless PJRT_NPROC says otherwise; at torch's one
    thread the tier makes it one (a user's own size is kept)."""
    if users is None:
        if len(os.sched_getaffinity(0)) < 2:
            pytest.skip("XLA's default pool is one thread on one core: nothing to tell apart")
        monkeypatch.delenv("PJRT_NPROC", raising=False)
    else:
        monkeypatch.setenv("PJRT_NPROC", users)
    monkeypatch.delenv("NPROC", raising=False)
    assert xla_pool_in_child("from engine import fused_xla\njax = fused_xla._import_jax()") == int(users or 1)


_POOL_SIZE = """
import os
import torch
from engine import fused_xla

os.sched_getaffinity = lambda pid: set(range(8))  # eight cores, torch on two of them
torch.set_num_threads(2)
fused_xla._import_jax()
print(os.environ.get("PJRT_NPROC"), os.environ.get("XLA_FLAGS"))
"""


def test_the_tiers_xla_pool_follows_torchs_thread_count(monkeypatch, run_in_tree):
    """At a thread count between one and the core count the pool is sized to it, and Eigen stays
    on the pool (the flag is for one thread only)."""
    for name in ("PJRT_NPROC", "NPROC", "XLA_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    done = run_in_tree(ROOT, _POOL_SIZE)
    done.check_returncode()
    assert done.stdout.split() == ["2", "None"]
