"""engine.trace / engine.compile: replayed graphs agree with the eager engine, and the trace's limits hold."""
from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch.func import functional_call

import engine
from engine.recorder import record
from engine.trace import TraceFallbackWarning, UntraceableError

ATOL = 1e-5


def _logreg(n: int = 200, d: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    y = (torch.rand(n, generator=g) > 0.5).float()

    def logp(w: torch.Tensor) -> torch.Tensor:
        z = X @ w
        return (y * z - torch.nn.functional.softplus(z)).sum() - 0.5 * (w * w).sum()

    return X, y, logp


def _mlp(d_in: int = 8, hidden: int = 16, d_out: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, d_out))


def test_hessian_logreg_matches_eager_on_every_call():
    _, _, logp = _logreg()
    traced = engine.trace(engine.hessian(logp))
    for seed in range(3):
        w = torch.randn(16, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(traced(w), engine.hessian(logp)(w), atol=ATOL, rtol=1e-5)
    info = traced.cache_info()
    assert (info.traces, info.hits, info.misses) == (1, 2, 1)
    assert traced.trace_seconds is not None


def test_per_sample_grads_mlp_matches_eager():
    model = _mlp()
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, t):
        out = functional_call(model, p, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, t.unsqueeze(0))

    fn = engine.vmap(engine.grad(loss), in_dims=(None, 0, 0))
    traced = engine.trace(fn)
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x, t = torch.randn(5, 8, generator=g), torch.randint(0, 3, (5,), generator=g)
        got, want = traced(params, x, t), fn(params, x, t)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=ATOL, rtol=1e-5)
    assert traced.cache_info().traces == 1


def test_jacrev_mlp_matches_eager():
    model = _mlp()
    fn = engine.jacrev(lambda x: model(x))
    traced = engine.trace(fn)
    for seed in range(2):
        x = torch.randn(8, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(traced(x), fn(x), atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(traced(x), torch.func.jacrev(model)(x), atol=ATOL, rtol=1e-5)


def test_new_signature_retraces_and_old_one_is_reused():
    traced = engine.trace(engine.grad(lambda x, scale: (scale * x.sin()).sum()))
    traced(torch.randn(4), 2.0)
    traced(torch.randn(4), 2.0)
    assert traced.cache_info().traces == 1
    traced(torch.randn(5), 2.0)  # shape
    traced(torch.randn(4, dtype=torch.float64), 2.0)  # dtype
    x = torch.randn(4)
    got = traced(x, 3.0)  # non-tensor argument by value
    torch.testing.assert_close(got, 3.0 * x.cos())
    assert traced.cache_info().traces == 4
    traced(torch.randn(5), 2.0)
    assert traced.cache_info().traces == 4


def test_lru_eviction_retraces_evicted_signature():
    traced = engine.trace(engine.grad(lambda x: (x * x).sum()), cache_size=2)
    for n in (2, 3, 4):
        traced(torch.randn(n))
    info = traced.cache_info()
    assert (info.traces, info.evictions, info.currsize, info.maxsize) == (3, 1, 2, 2)
    traced(torch.randn(4))  # still cached
    assert traced.cache_info().traces == 3
    x = torch.randn(2)  # evicted: traced again, still right
    torch.testing.assert_close(traced(x), 2 * x)
    assert traced.cache_info().traces == 4


def test_closed_over_weights_are_read_at_call_time():
    X, _, logp = _logreg(n=50, d=4)
    w = torch.randn(4)
    traced = engine.trace(engine.hessian(logp))
    before = traced(w)
    with torch.no_grad():
        X.mul_(2.0)
    after = traced(w)
    assert traced.cache_info().traces == 1
    torch.testing.assert_close(after, engine.hessian(logp)(w), atol=1e-4, rtol=1e-5)
    assert not torch.allclose(before, after)
    # nn.Module parameters captured through the module, updated like an optimizer step
    model = _mlp()
    jac = engine.trace(engine.jacrev(lambda x: model(x)))
    x = torch.randn(8)
    first = jac(x)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    torch.testing.assert_close(jac(x), torch.func.jacrev(model)(x), atol=ATOL, rtol=1e-5)
    assert not torch.allclose(first, jac(x))
    # the closed-over tensors are graph inputs, not frozen constants
    assert not any(n.op == "get_attr" for n in jac.graphs()[0].graph.nodes)


def test_many_closed_over_tensors_used_before_any_argument_are_lifted_in_order():
    # the graph starts with constants only (W1 @ x): lifting them must keep the graph well ordered
    g = torch.Generator().manual_seed(0)
    x, tangents = torch.randn(6, generator=g), torch.randn(4, 6, generator=g)
    W1, b1, W2 = torch.randn(10, 6, generator=g), torch.randn(10, generator=g), torch.randn(6, 10, generator=g)

    def mlp(x):
        return torch.tanh(W1 @ x + b1) @ W2.T

    fn = engine.vmap(lambda t: engine.jvp(mlp, (x,), (t,))[1])
    traced = engine.trace(fn)
    torch.testing.assert_close(traced(tangents), torch.func.vmap(lambda t: torch.func.jvp(mlp, (x,), (t,))[1])(tangents))
    assert len(next(iter(traced._cache.values())).constants) == 4


def _data_dependent(w: torch.Tensor) -> torch.Tensor:
    s = (w * w).sum()
    if s > 1.0:  # Python branch on a tensor value
        return s
    return -s


def test_untraceable_function_raises_a_clear_error():
    # A bool read off a tensor is a guard: the traced branch replays, the other one is refused.
    traced = engine.trace(engine.grad(_data_dependent))
    small, big = torch.full((3,), 0.1), torch.full((3,), 2.0)
    torch.testing.assert_close(traced(small), -2 * small)
    torch.testing.assert_close(traced(small * 2), -4 * small)
    with pytest.raises(UntraceableError, match="_data_dependent.*branches on tensor values"):
        traced(big)
    with pytest.raises(engine.DataDependentError, match=r"item"):  # numbers stay refused (a DataDependentError too)
        engine.trace(lambda x: x * x.sum().item())(torch.randn(3))
    # the engine's own refusal inside vmap (elements taking different branches) is reported the same way
    branchy = engine.vmap(lambda x: x if x.sum() > 0 else -x)
    with pytest.raises(UntraceableError, match="lambda"):
        engine.trace(branchy)(torch.tensor([[1.0, 2.0], [-1.0, -3.0]]))
    # data-dependent shapes too
    with pytest.raises(UntraceableError, match="nonzero"):
        engine.trace(lambda x: x[x > 0].sum())(torch.randn(6))


def test_a_branch_is_named_by_the_line_of_user_code_that_read_the_tensor():
    traced = engine.trace(engine.grad(_data_dependent))
    traced(torch.full((3,), 0.1))
    line = _data_dependent.__code__.co_firstlineno + 2  # `if s > 1.0:`
    with pytest.raises(UntraceableError, match=rf"test_trace.py:{line} \(_data_dependent\)"):
        traced(torch.full((3,), 2.0))


def test_untraceable_function_falls_back_to_eager_with_one_warning():
    traced = engine.trace(engine.grad(_data_dependent), fallback="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small, big = torch.full((3,), 0.1), torch.full((3,), 2.0)
        torch.testing.assert_close(traced(small), -2 * small)
        torch.testing.assert_close(traced(big), 2 * big)  # the other branch: really eager
        torch.testing.assert_close(traced(big * 2), 4 * big)
    assert [type(w.message) for w in caught] == [TraceFallbackWarning]
    assert traced.cache_info().traces == 1
    numbers = engine.trace(lambda x: x * x.sum().item(), fallback="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(numbers(torch.ones(3)), torch.full((3,), 3.0))
    assert [type(w.message) for w in caught] == [TraceFallbackWarning]
    assert numbers.cache_info().traces == 0


def test_random_ops_draw_fresh_values_at_each_replay():
    traced = engine.trace(engine.vmap(lambda x: x + torch.randn(3), randomness="different"))
    a, b = traced(torch.zeros(4, 3)), traced(torch.zeros(4, 3))
    assert traced.cache_info().traces == 1
    assert not torch.allclose(a, b)
    assert not torch.allclose(a[0], a[1])  # 'different': per-example draws
    same = engine.trace(engine.vmap(lambda x: x + torch.randn(3), randomness="same"))
    c, d = same(torch.zeros(4, 3)), same(torch.zeros(4, 3))
    torch.testing.assert_close(c[0], c[3])
    assert not torch.allclose(c, d)


@pytest.mark.slow
def test_compiled_hessian_matches_eager_and_reports_compile_time(monkeypatch):
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.join(root, ".inductor-cache"))
    X, _, logp = _logreg()
    compiled = engine.compile(engine.hessian(logp))
    w = torch.randn(16)
    torch.testing.assert_close(compiled(w), engine.hessian(logp)(w), atol=1e-4, rtol=1e-5)
    assert compiled.compile_seconds is not None and compiled.trace_seconds is not None
    with torch.no_grad():
        X.mul_(0.5)  # closed-over data stays live through the compiled graph too
    w2 = torch.randn(16)
    torch.testing.assert_close(compiled(w2), engine.hessian(logp)(w2), atol=1e-4, rtol=1e-5)
    assert compiled.cache_info().traces == 1


@pytest.mark.parametrize("k", [1, 3])
def test_bmm_of_a_broadcast_matrix_is_folded_into_one_mm(k):
    from engine.graph_passes import _fold_broadcast_bmm

    left, right = torch.randn(5, 6), torch.randn(6, k)
    xs, ys = torch.randn(4, 5, 6), torch.randn(4, 6, k)

    def fn(left, right, xs, ys):
        return torch.bmm(left.expand(4, 5, 6), ys), torch.bmm(xs, right.unsqueeze(0).expand(4, 6, k)) * 2

    args = (left, right, xs, ys)
    gm = record(lambda *a: list(fn(*a)), args)
    _fold_broadcast_bmm(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes]
    assert torch.ops.aten.bmm.default not in targets and targets.count(torch.ops.aten.mm.default) == 2
    for got, want in zip(gm(*args), fn(*args)):
        assert got.is_contiguous()
        torch.testing.assert_close(got, want)


def test_identity_basis_matmul_is_folded_away():
    W = torch.randn(3, 5)
    traced = engine.trace(engine.jacrev(lambda x: W @ x))
    x = torch.randn(5)
    torch.testing.assert_close(traced(x), W)
    matmuls = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.mv.default}
    backward = [n for n in traced.graphs()[0].graph.nodes if n.target in matmuls]
    assert len(backward) <= 1  # only the forward W @ x is left, not W^T @ I
    with torch.no_grad():
        W.add_(1.0)
    torch.testing.assert_close(traced(x), W)


# ------------------------------------------------------------------------------------------------
# the per-call fast paths


def test_fast_signature_leaves_match_tree_flatten():
    from collections import namedtuple

    from torch.utils._pytree import tree_flatten

    from engine.trace import _fast_signature

    x, y = torch.randn(3), torch.randn(2, 2)
    p = torch.nn.Parameter(torch.randn(4))
    covered = [
        ((x,), {}),
        ((x, 2.0, None, "s", True, 3), {}),
        (({"b": x, "a": y}, (x, 1), [y]), {}),
        ((p, x), {"scale": 2.0, "w": y}),
        ((), {}),
    ]
    for args, kwargs in covered:
        fast = _fast_signature(args, kwargs, False)
        assert fast is not None
        flat = tree_flatten((args, kwargs))[0]
        assert len(fast[1]) == len(flat) and all(a is b for a, b in zip(fast[1], flat))
    Pair = namedtuple("Pair", "a b")
    for args in [((x, (y,)),), (Pair(x, y),), ({"a": {"b": x}},), (torch.Size([2]),), (object(),)]:
        assert _fast_signature(args, {}, False) is None


def test_fast_signature_tells_apart_what_the_full_signature_does():
    from engine.trace import _fast_signature

    x = torch.randn(3)

    def key(*args, strides=False, **kwargs):
        return _fast_signature(args, kwargs, strides)[0]

    variants = [
        key(x), key(torch.randn(4)), key(x.double()), key(x.clone().requires_grad_()), key(x, 1), key(x, 1.0), key(x, True),
        key(x, 2), key((x,)), key([x]), key({"a": x}), key({"b": x}), key(x, a=1), key(x, b=1), key(x, x),
    ]
    assert len(set(variants)) == len(variants)
    with torch.no_grad():
        assert key(x) != variants[0]
    assert key(x) == variants[0] and key(torch.randn(3)) == variants[0]
    z = torch.randn(6)[::2]
    assert key(z) == key(x)  # the traced replay does not care about strides
    assert key(z, strides=True) != key(x, strides=True)  # compiled code does


def test_fast_path_retraces_when_the_signature_changes():
    fn = engine.grad(lambda x, scale, p: (scale * x.sin() * p["w"]).sum())
    traced = engine.trace(fn)
    x, p = torch.randn(4), {"w": torch.randn(4)}
    calls = [
        (x, 2.0, p),
        (torch.randn(5), 2.0, {"w": torch.randn(5)}),  # shape
        (x.double(), 2.0, {"w": p["w"].double()}),  # dtype
        (x, 3.0, p),  # non-tensor value
        (x, 3, p),  # non-tensor type
        (x, 2.0, {"w": p["w"].clone().requires_grad_()}),  # requires_grad
    ]
    for i, args in enumerate(calls):
        for _ in range(2):
            got = traced(*args)
            torch.testing.assert_close(got, args[1] * args[0].cos() * args[2]["w"].detach())
        assert traced.cache_info().traces == i + 1
    with torch.no_grad():  # grad mode
        traced(x, 2.0, p)
    assert traced.cache_info().traces == len(calls) + 1
    for args in calls:  # all still cached (cache_size 8) and found by the fast key
        traced(*args)
    info = traced.cache_info()
    assert (info.traces, info.misses, info.hits) == (len(calls) + 1, len(calls) + 1, 2 * len(calls))


def test_fast_keys_of_evicted_entries_are_dropped():
    traced = engine.trace(engine.grad(lambda x: (x * x).sum()), cache_size=2)
    for n in (2, 3, 4, 2, 3, 4):
        x = torch.randn(n)
        torch.testing.assert_close(traced(x), 2 * x)
    info = traced.cache_info()
    assert (info.traces, info.evictions, info.currsize) == (6, 4, 2)
    assert set(traced._fast.values()) <= set(traced._cache.values())
    traced.cache_clear()
    assert not traced._fast
    x = torch.randn(4)
    torch.testing.assert_close(traced(x), 2 * x)
    assert traced.cache_info().traces == 7


def test_unusual_arguments_take_the_full_path_and_still_hit_the_cache():
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    traced = engine.trace(engine.grad(lambda p: (p.a * p.b["c"]).sum()))
    a, c = torch.randn(3), torch.randn(3)
    for _ in range(3):
        got = traced(Pair(a, {"c": c}))  # gradients in the arguments' structure
        assert type(got) is Pair
        torch.testing.assert_close(got.a, c)
        torch.testing.assert_close(got.b["c"], a)
    info = traced.cache_info()
    assert (info.traces, info.hits) == (1, 2) and not traced._fast


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.sin() * 2,
        lambda x: (x.sin(), x.cos()),
        lambda x: [x.sin(), x * 3],
        lambda x: {"s": x.sin(), "c": x.cos()},
        lambda x: {"s": (x.sin(), 1.5), "n": 7, "t": [x.exp()]},
        lambda x: (x.sum(), "tag", None),
    ],
)
def test_outputs_keep_their_structure_and_are_fresh_tensors(fn):
    traced = engine.trace(fn)
    x = torch.randn(5)
    first, second = traced(x), traced(x)
    want = fn(x)
    assert type(first) is type(want)
    for got in (first, second):
        flat_got, spec_got = torch.utils._pytree.tree_flatten(got)
        flat_want, spec_want = torch.utils._pytree.tree_flatten(want)
        assert spec_got == spec_want
        for g, w in zip(flat_got, flat_want):
            if isinstance(w, torch.Tensor):
                torch.testing.assert_close(g, w)
            else:
                assert g == w
    tensors = lambda out: [t for t in torch.utils._pytree.tree_flatten(out)[0] if isinstance(t, torch.Tensor)]  # noqa: E731
    for a, b in zip(tensors(first), tensors(second)):
        assert a is not b and a.data_ptr() != b.data_ptr()


def test_shape_chains_are_folded_but_outputs_stay_distinct():
    def fn(x, w):
        y = x.reshape(2, 3).reshape(6) * 2  # reshape of a reshape
        z = (w.t().t() @ y).reshape(4)  # transpose of a transpose; reshape to its own shape
        return y, y.reshape(6), z, x.reshape(6)

    traced = engine.trace(fn)
    x, w = torch.randn(6), torch.randn(4, 6)
    outs = traced(x, w)
    for got, want in zip(outs, fn(x, w)):
        torch.testing.assert_close(got, want)
    assert len({id(o) for o in outs}) == 4 and all(o is not x for o in outs)
    targets = [n.target for n in traced.graphs()[0].graph.nodes]
    assert torch.ops.aten.t.default not in targets
    # the graph's shape-only nodes: one reshape per output that needs one, none in between
    assert targets.count(torch.ops.aten.reshape.default) <= 3


def test_chains_of_permutations_are_one_permute_or_none():
    def fn(x, w):
        a = x.permute(2, 0, 1).transpose(0, 2).permute(1, 0, 2)  # one permute of x
        b = x.transpose(1, 2).permute(0, 2, 1)  # x itself
        m = (w * 2).t().transpose(0, 1).t()  # one t
        return a * 3, b + 1, m @ w, a

    traced = engine.trace(fn)
    x, w = torch.randn(2, 3, 4), torch.randn(5, 5)
    for _ in range(2):
        outs = traced(x, w)
        for got, want in zip(outs, fn(x, w)):
            assert torch.equal(got, want) and got.stride() == want.stride()
    views = [n.target for n in traced.graphs()[0].graph.nodes
             if n.target in (torch.ops.aten.permute.default, torch.ops.aten.transpose.int, torch.ops.aten.t.default)]
    assert len(views) == 2, views


def test_jacrev_graph_has_no_leftover_shape_ops():
    model = _mlp()
    traced = engine.trace(engine.jacrev(lambda x: model(x)))
    x = torch.randn(8)
    torch.testing.assert_close(traced(x), torch.func.jacrev(model)(x), atol=ATOL, rtol=1e-5)
    targets = [n.target for n in traced.graphs()[0].graph.nodes if n.op == "call_function"]
    shape_ops = {torch.ops.aten.reshape.default, torch.ops.aten.t.default, torch.ops.aten.split_with_sizes.default}
    assert sum(t in shape_ops for t in targets) <= 4


def test_hessian_graph_does_not_recompute_the_function_value():
    _, _, logp = _logreg()
    traced = engine.trace(engine.hessian(logp))
    w = torch.randn(16)
    torch.testing.assert_close(traced(w), torch.func.hessian(logp)(w), atol=1e-4, rtol=1e-5)
    targets = {n.target for n in traced.graphs()[0].graph.nodes}
    # ones_like(f(w)) seeds the backward pass; only its shape is needed, not f(w)
    assert torch.ops.aten.softplus.default not in targets and torch.ops.aten.ones_like.default not in targets


def test_second_derivatives_of_powers_drop_their_powers_of_one_and_zero():
    def rosenbrock(x):
        return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

    traced = engine.trace(engine.hessian(rosenbrock))
    for seed in range(3):
        x = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(traced(x), torch.func.hessian(rosenbrock)(x), rtol=1e-12, atol=1e-12)
    nodes = [n for n in traced.graphs()[0].graph.nodes if n.op == "call_function"]
    exponents = [n.args[1] for n in nodes if n.target is torch.ops.aten.pow.Tensor_Scalar]
    assert exponents and not any(e in (0, 1) for e in exponents), exponents
    assert not any(n.target is torch.ops.aten.mul.Tensor and torch.ops.aten.ones.default in
                   [getattr(a, "target", None) for a in n.args] for n in nodes)


def test_a_product_with_ones_that_broadcasts_or_is_the_output_stays():
    widen = engine.trace(lambda x: x * torch.ones(3, 4))
    x = torch.randn(4)
    assert widen(x).shape == (3, 4) and torch.equal(widen(x), x.expand(3, 4))
    same = engine.trace(lambda x: x * torch.ones_like(x))
    out = same(x)
    assert out is not x and out.data_ptr() != x.data_ptr() and torch.equal(out, x)
    promote = engine.trace(lambda x: x * torch.ones(4, dtype=torch.float64))
    assert promote(x).dtype == torch.float64


def test_simplify_keeps_random_draws_and_distinct_outputs():
    traced = engine.trace(lambda x: x + torch.randn(3) - torch.randn(3))
    assert traced(torch.zeros(3)).abs().sum() > 0  # two draws, not one shared by CSE
    traced = engine.trace(lambda x: (x.sin(), x.sin(), x.t().t(), (x * 2).t().t()))
    x = torch.randn(3, 4)
    outs = traced(x)
    assert outs[0] is not outs[1] and outs[2] is not x
    torch.testing.assert_close(outs[2], x)
    torch.testing.assert_close(outs[3], x * 2)
    assert outs[3].data_ptr() != traced(x)[3].data_ptr()


def test_folding_never_turns_a_copied_output_into_a_view_of_an_input():
    def fn(x):  # each output is a copy in eager (the reshapes of non-contiguous views copy)
        return x[:, :2].reshape(6).reshape(3, 2), x.t().reshape(12).reshape(4, 3), x.t().t() * 1

    traced = engine.trace(fn)
    x = torch.randn(3, 4)
    outs = traced(x)
    for got, want in zip(outs, fn(x)):
        torch.testing.assert_close(got, want)
        assert got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_graphs_with_in_place_ops_replay_correctly():
    def fn(x):
        y = x.clone()
        v = y.reshape(2, 3)
        v.add_(1.0)  # writes through a view: the graph must keep it
        return y.reshape(6).reshape(3, 2) * 1

    traced = engine.trace(fn)
    x = torch.randn(6)
    torch.testing.assert_close(traced(x), fn(x))
    torch.testing.assert_close(traced(x), fn(x))


def test_in_place_views_of_fresh_tensors_become_views_and_the_graph_is_cleaned():
    """matmul's backward squeezes its product in place; on a tensor made inside the graph that is
    a plain view, so the other passes (and dead-code elimination) still run."""
    W = torch.randn(5, 4)

    def fn(x):
        y = x @ W.T            # fresh
        z = y.view(-1)         # a view taken before the in-place op keeps its shape
        y.squeeze_(0)
        y.unsqueeze_(1).transpose_(0, 1)
        return z * 2, y * 1

    traced = engine.trace(fn)
    x = torch.randn(1, 4)
    for got, want in zip(traced(x), fn(x)):
        torch.testing.assert_close(got, want)
    targets = [n.target for n in traced.graphs()[0].graph.nodes if n.op == "call_function"]
    assert not any(t._schema.is_mutable for t in targets)
    # in-place views of an input still change the caller's tensor, as in eager
    traced_input = engine.trace(lambda a: a.unsqueeze_(0) * 2)
    a = torch.randn(3)
    traced_input(a)
    assert a.shape == (1, 3)


# ------------------------------------------------------------------------------------------------
# compile options


def test_compile_kwargs_map_to_inductor_config_or_torch_compile():
    from engine.trace import _direct_inductor, _inductor_patches

    assert _direct_inductor({}) and _direct_inductor({"mode": "max-autotune-no-cudagraphs", "dynamic": False})
    assert _direct_inductor({"backend": "inductor", "fullgraph": True, "options": {"max_autotune": True}})
    assert not _direct_inductor({"backend": "eager"}) and not _direct_inductor({"disable": True})
    assert _inductor_patches({}) == {}
    assert _inductor_patches({"mode": "max-autotune-no-cudagraphs"})["max_autotune"] is True
    assert _inductor_patches({"options": {"epilogue-fusion": False}}) == {"epilogue_fusion": False}
    with pytest.raises(ValueError, match="mode or options"):
        engine.compile(lambda x: x, mode="max-autotune", options={"max_autotune": True})


def test_compile_with_another_backend_goes_through_torch_compile():
    model = _mlp()
    compiled = engine.compile(engine.jacrev(lambda x: model(x)), backend="eager")
    x = torch.randn(8)
    torch.testing.assert_close(compiled(x), torch.func.jacrev(model)(x), atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(compiled(x), torch.func.jacrev(model)(x), atol=ATOL, rtol=1e-5)
    assert compiled.compile_seconds is not None and compiled.cache_info().traces == 1


def test_compile_through_torch_compile_leaves_distribution_validation_on(monkeypatch):
    # dynamo's first torch.compile in a process switches torch.distributions' validate_args
    # default off for good; engine.compile must put it back, or every later invalid parameter
    # computes NaN instead of raising. The patch runs once per process: let it run again here.
    from torch._dynamo.eval_frame import TorchPatcher

    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)
    TorchPatcher.patch.cache_clear()
    compiled = engine.compile(engine.grad(lambda x: (x.sin() * x).sum()), backend="eager")
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), torch.func.grad(lambda x: (x.sin() * x).sum())(x))
    assert torch.distributions.Distribution._validate_args is True
    with pytest.raises(ValueError, match="scale"):
        engine.vmap(lambda s: torch.distributions.Normal(0.0, s).log_prob(torch.zeros(())))(torch.tensor([1.0, -1.0]))


def _with_inductor_cache(monkeypatch) -> None:
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.join(root, ".inductor-cache"))


@pytest.mark.slow
def test_compiled_jacrev_matches_eager_and_strides_are_part_of_the_signature(monkeypatch):
    _with_inductor_cache(monkeypatch)
    model = _mlp()
    compiled = engine.compile(engine.jacrev(lambda x: model(x)))
    x = torch.randn(8)
    want = torch.func.jacrev(model)(x)
    first, second = compiled(x), compiled(x)
    torch.testing.assert_close(first, want, atol=ATOL, rtol=1e-5)
    assert first.data_ptr() != second.data_ptr()  # fresh outputs
    assert compiled.compile_seconds is not None and compiled.cache_info().traces == 1
    strided = torch.randn(16)[::2]  # same shape, other strides: compiled code is specialised to strides
    torch.testing.assert_close(compiled(strided), torch.func.jacrev(model)(strided), atol=ATOL, rtol=1e-5)
    assert compiled.cache_info().traces == 2
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)  # closed-over parameters stay live through the compiled graph
    torch.testing.assert_close(compiled(x), torch.func.jacrev(model)(x), atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("make", [engine.trace, engine.compile], ids=["trace", "compile"])
def test_writes_into_inputs_and_closures_happen_once_per_call(make):
    """The tracing call returns the traced run's results instead of replaying, and the compile
    warm-up runs on copies: a function that writes into its arguments or closed-over tensors
    writes once per call, the first call included."""
    counter = torch.zeros(())

    def fn(x):
        x.add_(1.0)
        counter.add_(1.0)
        return x * 2

    traced = make(fn)
    x = torch.zeros(3)
    torch.testing.assert_close(traced(x), torch.full((3,), 2.0))
    assert x.tolist() == [1.0, 1.0, 1.0] and counter.item() == 1.0
    torch.testing.assert_close(traced(x), torch.full((3,), 4.0))
    assert x.tolist() == [2.0, 2.0, 2.0] and counter.item() == 2.0


def _write_then_branch(x: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    acc.add_(x)  # a write into an input ...
    if (x > 0).all():  # ... and a branch on tensor values (a replay guard)
        return x * 2
    return -x


def test_a_guarded_function_that_writes_into_its_inputs_is_not_replayed():
    """A replay checks its guard only after the graph's writes: a failing guard would then rerun the
    function eagerly and write a second time. Such functions are refused (or run eagerly, each
    write applied exactly once)."""
    with pytest.raises(UntraceableError, match="writes into its inputs"):
        engine.trace(_write_then_branch)(torch.ones(3), torch.zeros(3))
    traced = engine.trace(_write_then_branch, fallback="eager")
    acc, want = torch.zeros(3), torch.zeros(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in (torch.ones(3), -torch.ones(3), 2 * torch.ones(3)):
            torch.testing.assert_close(traced(x, acc), _write_then_branch(x, want))
    torch.testing.assert_close(acc, want)
    assert [type(w.message) for w in caught] == [TraceFallbackWarning]
