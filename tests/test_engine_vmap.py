"""engine.vmap: every API promise and error of the core machinery, checked against for-loops."""
from __future__ import annotations

import warnings

import pytest
import torch

import engine
from engine import DataDependentError, FallbackError, FallbackWarning, RandomnessError, VmapError

B = 4


def loop(f, *args, in_dims=0):
    """The semantics vmap must match: call f per element and stack."""
    dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    outs = [f(*[a if d is None else a.select(d, i) for a, d in zip(args, dims)]) for i in range(size)]
    if isinstance(outs[0], tuple):
        return tuple(torch.stack(o) for o in zip(*outs))
    return torch.stack(outs)


def close(a, b, **kw):
    if isinstance(a, tuple):
        return all(close(x, y, **kw) for x, y in zip(a, b))
    return type(a) is torch.Tensor and a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-5, **kw)


@pytest.fixture(autouse=True)
def _strict():
    # Core rules must not loop: any fallback in these tests is a bug.
    with engine.fallback_policy("error"):
        yield


CASES = {
    "batched_dot": (torch.dot, lambda: (torch.randn(B, 5), torch.randn(B, 5))),
    "linear_relu": (lambda x, w, b: torch.relu(x @ w + b), lambda: (torch.randn(B, 3), torch.randn(3, 6), torch.randn(6)),
                    (0, None, None)),
    "linear_batched_weights": (lambda x, w: torch.nn.functional.linear(x, w).tanh(), lambda: (torch.randn(B, 2, 3), torch.randn(B, 5, 3))),
    "clamp_min0": (lambda x: x.clamp(min=0), lambda: (torch.randn(B, 3, 2),)),
    "where": (lambda x, y: torch.where(x > 0, x, y * 2), lambda: (torch.randn(B, 3), torch.randn(B, 3))),
    "softmax_logsumexp": (lambda x: (torch.softmax(x, -1), torch.logsumexp(x, 0)), lambda: (torch.randn(B, 3, 4),)),
    "reductions": (lambda x: (x.sum(), x.mean(1), x.amax(-1), x.log_softmax(0), x.var(), x.max(1).values, x.argmax()),
                   lambda: (torch.randn(B, 3, 4),)),
    "views": (lambda x: (x.view(12), x.reshape(4, 3), x.t(), x.permute(1, 0), x.unsqueeze(-1), x[1], x[:, 1:3],
                         x.expand(2, 3, 4), x.transpose(0, 1).contiguous(), x.flatten(), x.squeeze(), x.unsqueeze(0).squeeze(0)),
              lambda: (torch.randn(B, 3, 4),)),
    "cat_stack": (lambda x, y: (torch.cat([x, y], 0), torch.stack([x, y], -1), torch.cat([x, y], -1)),
                  lambda: (torch.randn(B, 2, 3), torch.randn(B, 2, 3))),
    "matmuls": (lambda a, b, v: (a @ b, torch.mm(a, b), a @ v, torch.mv(a, v), torch.addmm(v[:3].unsqueeze(-1), a, b),
                                 torch.bmm(a.unsqueeze(0), b.unsqueeze(0))),
                lambda: (torch.randn(B, 3, 4), torch.randn(B, 4, 3), torch.randn(B, 4))),
    "matmul_right_batched": (lambda a, b, v: (a @ b, torch.mv(a, v), torch.mm(a, b)),
                             lambda: (torch.randn(3, 4), torch.randn(B, 4, 2), torch.randn(B, 4)), (None, 0, 0)),
    "factory_like": (lambda x: (torch.zeros_like(x) + x, x.new_zeros(2, 3), torch.ones_like(x), x.new_full((2,), 3.0)),
                     lambda: (torch.randn(B, 3),)),
    "scalar_rank0": (lambda x: (x * 2.5, x.sum(0), x.softmax(-1), torch.stack([x, x])), lambda: (torch.randn(B),)),
    "mixed_dtype_rank0": (lambda x, y: x + y, lambda: (torch.randn(B, dtype=torch.float64), torch.randn(3)), (0, None)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_loop(name):
    f, make, *dims = CASES[name]
    in_dims = dims[0] if dims else 0
    torch.manual_seed(0)
    args = make()
    assert close(engine.vmap(f, in_dims=in_dims)(*args), loop(f, *args, in_dims=in_dims))


@pytest.mark.parametrize("in_dims", [(0, 0), (-1, 0), (0, None), (None, 1), (-1, -1)])
def test_in_dims_patterns(in_dims):
    x, y = torch.randn(B, 3, B), torch.randn(3, B)
    if in_dims[0] == 0:
        x = torch.randn(B, 3)
    if in_dims[0] == -1:
        x = torch.randn(3, B)
    if in_dims[0] is None:
        x = torch.randn(3)
    if in_dims[1] == 0:
        y = torch.randn(B, 3)
    if in_dims[1] is None:
        y = torch.randn(3)
    f = lambda a, b: a * b.exp()  # noqa: E731
    assert close(engine.vmap(f, in_dims=in_dims)(x, y), loop(f, x, y, in_dims=in_dims))


def test_out_dims():
    x = torch.randn(B, 3, 2)
    out = engine.vmap(lambda a: (a, a.sum(0)), out_dims=(1, -1))(x)
    assert close(out[0], x.movedim(0, 1)) and close(out[1], x.sum(1).movedim(0, -1))
    # an unbatched output with an int out_dim is expanded, as in torch.func
    c = engine.vmap(lambda a: torch.ones(2), out_dims=0)(x)
    assert c.shape == (B, 2)


def test_pytrees_in_and_out():
    d = {"a": torch.randn(B, 3), "b": [torch.randn(3, B), 7]}

    def f(tree, scale):
        return {"s": tree["a"] * tree["b"][0] * tree["b"][1] * scale, "t": (tree["a"].sum(), "tag")}

    out = engine.vmap(f, in_dims=({"a": 0, "b": [1, None]}, None), out_dims={"s": 0, "t": (0, None)})(d, 2.0)
    assert close(out["s"], d["a"] * d["b"][0].T * 7 * 2.0)
    assert close(out["t"][0], d["a"].sum(1)) and out["t"][1] == "tag"


def test_kwargs_are_not_mapped():
    x = torch.randn(B, 3)
    out = engine.vmap(lambda a, *, bias: a + bias)(x, bias=torch.ones(3))
    assert close(out, x + 1)


def test_nested_vmap_three_deep_and_closure():
    x = torch.randn(2, 3, 4, 5)
    out = engine.vmap(engine.vmap(engine.vmap(lambda a: a.sin().sum())))(x)
    assert close(out, x.sin().sum(-1))
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    outer = engine.vmap(lambda u: engine.vmap(lambda v: (u * v).sum())(b))(a)
    assert close(outer, a @ b.T)
    # inner in_dims over an outer-batched value
    m = torch.randn(3, 4, 6)
    out = engine.vmap(lambda r: engine.vmap(lambda c: c.square(), in_dims=1)(r))(m)
    assert close(out, m.square().transpose(1, 2))


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 100])
def test_chunk_size_equals_unchunked(chunk):
    x, y = torch.randn(7, 3), torch.randn(3)
    f = lambda a, b: (a @ b, a.exp())  # noqa: E731
    ref = engine.vmap(f, in_dims=(0, None))(x, y)
    out = engine.vmap(f, in_dims=(0, None), chunk_size=chunk)(x, y)
    assert close(out, ref)


def test_chunk_size_one_is_a_plain_loop():
    seen = []

    def f(a):
        seen.append(type(a))
        return a * 2

    engine.vmap(f, chunk_size=1)(torch.randn(3, 2))
    assert seen == [torch.Tensor] * 3


@pytest.mark.parametrize("chunk", [2, 5, 16])
def test_chunk_size_bounds_the_batch_every_op_sees(chunk, monkeypatch):
    """Why peak memory falls with the chunk: no op of a chunked jacrev runs on more than `chunk`
    rows at once (the suite's chunked_jacobian workload measures the memory itself)."""
    import engine._vmap as vm

    sizes = []
    real_push = vm.push_level

    def spy(batch_size, randomness):
        sizes.append(batch_size)
        return real_push(batch_size, randomness)

    monkeypatch.setattr(vm, "push_level", spy)
    W = torch.randn(16, 8)
    f = lambda x: torch.tanh(W @ x)  # noqa: E731
    x = torch.randn(8)
    assert close(engine.jacrev(f, chunk_size=chunk)(x), torch.func.jacrev(f)(x))
    assert sizes and max(sizes) == min(chunk, 16)


def test_inplace_on_batched_self_and_writes_input():
    x = torch.randn(B, 3)
    expected = x * 2 + 1

    def f(a):
        a.mul_(2)
        a.add_(torch.ones(3))
        return a

    out = engine.vmap(f)(x)
    assert close(out, expected) and close(x, expected)


def test_inplace_into_unbatched_raises():
    with pytest.raises(VmapError, match="in place into a tensor that is not batched.*out-of-place"):
        engine.vmap(lambda a: torch.zeros(3).add_(a))(torch.randn(B, 3))


def test_inplace_shape_ops():
    x = torch.randn(B, 3)
    out = engine.vmap(lambda a: a.clone().unsqueeze_(0).transpose_(0, 1))(x)
    assert close(out, x.unsqueeze(1).transpose(1, 2))


def test_differentiable_boundary():
    x = torch.randn(B, 3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    out = engine.vmap(lambda a: (a.sin() * w).sum())(x)
    gx, gw = torch.autograd.grad(out.sum(), (x, w))
    assert close(gx, x.cos() * w) and close(gw, x.sin().sum(0))


def test_module_forward_then_backward_outside():
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    x = torch.randn(B, 3)
    engine.vmap(m)(x).pow(2).sum().backward()
    g = m.weight.grad.clone()
    m.zero_grad()
    m(x).pow(2).sum().backward()
    assert close(g, m.weight.grad)


# ---- fallback API -------------------------------------------------------------------------------

def _no_rule_op():
    # An op the core families do not batch and PyTorch does not decompose: it must loop.
    # (bincount with a minlength the values stay under: one output shape for every example)
    return lambda a: torch.ops.aten.bincount.default((a * 4).long(), None, 4)


def test_fallback_warns_names_op_and_counts():
    engine._fallbacks._FallbackState.warned.discard("aten::bincount.default")
    x = torch.rand(B, 10)
    with engine.fallback_policy("warn"), warnings.catch_warnings(record=True) as w, engine.record_fallbacks() as rec:
        warnings.simplefilter("always")
        out = engine.vmap(_no_rule_op())(x)
        engine.vmap(_no_rule_op())(x)
    assert close(out, loop(_no_rule_op(), x))
    msgs = [str(m.message) for m in w if issubclass(m.category, FallbackWarning)]
    assert msgs == ["Batching rule not implemented for aten::bincount.default; falling back to slow (for loop) implementation"]
    assert rec.counts["aten::bincount.default"] == 2


def test_fallback_error_and_silent():
    x = torch.rand(B, 10)
    with pytest.raises(FallbackError, match="aten::bincount.default"):
        engine.vmap(_no_rule_op())(x)
    with engine.fallback_policy("silent"), warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.vmap(_no_rule_op())(x)
    with pytest.raises(ValueError, match="fallback_policy"):
        with engine.fallback_policy("loud"):
            pass


def test_register_rule_wins_and_validates():
    calls = []

    @engine.register_rule(torch.ops.aten.bincount.default)
    def rule(info, in_dims, x, weights=None, minlength=0):
        calls.append(info.batch_size)
        return torch.stack([torch.bincount(x[i], weights, minlength) for i in range(x.shape[0])]), 0

    try:
        x = torch.rand(B, 10)
        assert close(engine.vmap(_no_rule_op())(x), loop(_no_rule_op(), x))
        assert calls == [B]
    finally:
        engine.rules.RULES.pop(torch.ops.aten.bincount.default, None)
    with pytest.raises(TypeError, match="aten op"):
        engine.register_rule(torch.sin)


# ---- randomness -----------------------------------------------------------------------------------

def test_randomness_modes():
    x = torch.zeros(B, 3)
    with pytest.raises(RandomnessError, match="randomness error mode"):
        engine.vmap(lambda a: a + torch.randn(3))(x)
    with pytest.raises(RandomnessError):
        engine.vmap(lambda a: torch.rand_like(a))(x)
    same = engine.vmap(lambda a: a + torch.randn(3), randomness="same")(x)
    assert torch.equal(same[0], same[1])
    diff = engine.vmap(lambda a: a + torch.randn(3), randomness="different")(x)
    assert diff.shape == (B, 3) and not torch.equal(diff[0], diff[1])
    like = engine.vmap(lambda a: torch.rand_like(a), randomness="different")(x)
    assert not torch.equal(like[0], like[1])
    like_same = engine.vmap(lambda a: torch.rand_like(a), randomness="same")(x)
    assert torch.equal(like_same[0], like_same[1])
    drop = engine.vmap(lambda a: torch.nn.functional.dropout(a + 1, 0.5), randomness="same")(torch.zeros(B, 50))
    assert torch.equal(drop[0], drop[1])
    with pytest.raises(VmapError, match="randomness"):
        engine.vmap(lambda a: a, randomness="sometimes")


def test_random_out_watch_is_entered_once_and_only_where_needed():
    """The __torch_function__ mode that refuses random out= calls (engine._random_out) costs a Python
    call per torch call: vmap enters it for 'same'/'different' only, and nested vmaps share the
    outermost one (an inner vmap in 'error' mode under an outer 'same' still refuses randn(out=))."""
    depths = []

    def f(a):
        depths.append(torch._C._len_torch_function_stack())
        return a + 1

    x = torch.zeros(B, 2, 3)
    engine.vmap(f)(x[0])
    engine.vmap(f, randomness="same")(x[0])
    engine.vmap(engine.vmap(f, randomness="different"), randomness="same")(x)
    engine.vmap(engine.vmap(f, randomness="same"))(x)
    assert depths == [0, 1, 1, 1]
    with pytest.raises(RandomnessError, match="calling out variants"):
        engine.vmap(engine.vmap(lambda a: torch.randn(3, out=torch.zeros(3)) + a), randomness="same")(x)


# ---- errors ---------------------------------------------------------------------------------------

def test_error_mismatched_batch_sizes():
    with pytest.raises(VmapError, match=r"same size in the mapped dimension.*\[3, 4\]"):
        engine.vmap(torch.add)(torch.randn(3), torch.randn(4))


def test_error_in_dims_structure():
    with pytest.raises(VmapError, match="in_dims is not compatible with the structure"):
        engine.vmap(torch.add, in_dims=(0, 0, 0))(torch.randn(3), torch.randn(3))
    with pytest.raises(VmapError, match="in_dims is not compatible"):
        engine.vmap(lambda d: d["a"], in_dims=({"b": 0},))({"a": torch.randn(3)})
    with pytest.raises(VmapError, match="expected `in_dims` to be int or a"):
        engine.vmap(torch.sin, in_dims="0")(torch.randn(3))


def test_error_in_dim_out_of_range():
    with pytest.raises(VmapError, match="in_dim=2.*dimensionality 2"):
        engine.vmap(torch.sin, in_dims=2)(torch.randn(3, 4))


def test_error_int_in_dim_for_non_tensor():
    with pytest.raises(VmapError, match="in_dim=0 for an input but the input is of type float"):
        engine.vmap(lambda a, s: a * s, in_dims=(0, 0))(torch.randn(3), 2.0)


def test_error_no_batched_input():
    with pytest.raises(VmapError, match="At least one of the inputs must be a Tensor mapped"):
        engine.vmap(torch.sin, in_dims=None)(torch.randn(3))


def test_error_out_dims_none_for_batched_output():
    with pytest.raises(VmapError, match="out_dims=None.*batched"):
        engine.vmap(torch.sin, out_dims=None)(torch.randn(3))


def test_error_out_dims_structure():
    with pytest.raises(VmapError, match="out_dims is not compatible"):
        engine.vmap(lambda a: (a, a), out_dims=(0, 0, 0))(torch.randn(3))


def test_error_data_dependent():
    with pytest.raises(DataDependentError, match=r"\.item\(\)"):
        engine.vmap(lambda a: a.sum().item())(torch.randn(3, 2))
    with pytest.raises(DataDependentError):
        engine.vmap(lambda a: a * 2 if a.sum() > 0 else a)(torch.randn(3, 2))


def test_error_chunk_size():
    with pytest.raises(VmapError, match="chunk_size should be None or a positive integer"):
        engine.vmap(torch.sin, chunk_size=0)


def test_nested_vmap_closure_backward_outside():
    """A tensor requiring grad closed over by two nested vmaps gets its gradient summed over both."""
    X = torch.randn(3, 4, requires_grad=True)
    Y = torch.randn(5, 4)
    w = torch.randn(4, requires_grad=True)
    out = engine.vmap(lambda a: engine.vmap(lambda b: (a * b * w).sum())(Y))(X)
    ref = (X[:, None, :] * Y[None] * w).sum(-1)
    got = torch.autograd.grad(out.sum(), (X, w))
    want = torch.autograd.grad(ref.sum(), (X, w))
    assert close(out, ref) and all(type(g) is torch.Tensor and close(g, r) for g, r in zip(got, want))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("with_n", [False, True], ids=["input[C]", "input[N,C]"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "class-weights"])
def test_nll_loss_rule_forward_backward_double_backward(reduction, with_n, weighted):
    """nll_loss has its own rule (batch folded into N, reduction per element); no decomposition."""
    import torch.func as tf
    import torch.nn.functional as F

    torch.manual_seed(0)
    N, C = 3, 5
    x = torch.randn(B, N, C) if with_n else torch.randn(B, C)
    t = torch.randint(0, C, x.shape[:-1])
    w = torch.rand(C) if weighted else None

    def f(xi, ti):
        return F.nll_loss(F.log_softmax(xi, -1), ti, weight=w, reduction=reduction, ignore_index=2)

    def scalar(xi, ti):
        return f(xi, ti).sum()

    with engine.fallback_policy("error"), engine.record_fallbacks() as rec:
        assert close(engine.vmap(f)(x, t), loop(f, x, t), equal_nan=True)
        assert close(engine.vmap(f, in_dims=(0, None))(x, t[0]), loop(f, x, t[0], in_dims=(0, None)), equal_nan=True)
        assert close(engine.vmap(engine.grad(scalar))(x, t), tf.vmap(tf.grad(scalar))(x, t), equal_nan=True)
        assert close(engine.hessian(lambda v: scalar(v, t[0]))(x[0]), tf.hessian(lambda v: scalar(v, t[0]))(x[0]))
    assert rec.total == 0


def test_nll_loss_rule_batched_class_weights():
    import torch.nn.functional as F

    torch.manual_seed(0)
    x, t, W = torch.randn(B, 3, 5), torch.randint(0, 5, (B, 3)), torch.rand(B, 5)
    for reduction in ("none", "mean", "sum"):
        def f(xi, ti, wi):
            return F.nll_loss(F.log_softmax(xi, -1), ti, weight=wi, reduction=reduction, ignore_index=1)
        assert close(engine.vmap(f)(x, t, W), loop(f, x, t, W))
        assert close(engine.vmap(engine.grad(lambda *a: f(*a).sum()))(x, t, W),
                     loop(torch.func.grad(lambda *a: f(*a).sum()), x, t, W))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("case", ["same", "target-unbatched", "pos_weight", "weight-batched", "scalar", "target-broadcast"])
def test_binary_cross_entropy_with_logits_rule(reduction, case):
    """binary_cross_entropy_with_logits has its own rule (the kernel once over the broadcast
    operands, the reduction per element), equal to the loop, its gradients to torch.func's."""
    import torch.func as tf

    from engine.rules._table import RULES

    assert torch.ops.aten.binary_cross_entropy_with_logits.default in RULES
    torch.manual_seed(0)
    red = {"none": 0, "mean": 1, "sum": 2}[reduction]
    shape_x, shape_t = {"scalar": ((), ()), "target-broadcast": ((4,), (3, 4))}.get(case, ((3, 4), (3, 4)))
    x = torch.randn(B, *shape_x, dtype=torch.float64)
    t = torch.rand(*shape_t, dtype=torch.float64) if case == "target-unbatched" else torch.rand(B, *shape_t, dtype=torch.float64)
    w = torch.rand(B, *shape_t, dtype=torch.float64) if case == "weight-batched" else None
    pw = torch.rand(4, dtype=torch.float64) + 0.5 if case == "pos_weight" else None
    dims = (0, None if case == "target-unbatched" else 0, 0 if w is not None else None)

    def f(xi, ti, wi):
        return torch.ops.aten.binary_cross_entropy_with_logits.default(xi, ti, wi, pw, red)

    def scalar(xi, ti, wi):
        return f(xi, ti, wi).sum()

    if case == "target-broadcast":  # torch's backward and torch.func's gradient differ there: refused
        with pytest.raises(RuntimeError, match="broadcasts to the loss's"):
            engine.vmap(f, in_dims=dims)(x, t, w)
        return
    with engine.fallback_policy("error"):
        assert close(engine.vmap(f, in_dims=dims)(x, t, w), loop(f, x, t, w, in_dims=dims))
        assert close(engine.vmap(engine.grad(scalar), in_dims=dims)(x, t, w), tf.vmap(tf.grad(scalar), in_dims=dims)(x, t, w))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)), ((), ())])
@pytest.mark.parametrize("batched", [(0, 0), (0, None), (None, 0)])
def test_mse_loss_rule(reduction, shapes, batched):
    """mse_loss and its backward have their own rules (the kernel over the broadcast operands, the
    reduction per element; the backward's own formula per element): equal to the loop, and so
    are the gradients (either operand, either batched) and second derivatives, per element by
    torch.func (whose vmap of a broadcast target's gradient raises)."""
    import torch.func as tf
    import torch.nn.functional as F

    from engine.rules._table import RULES

    assert {torch.ops.aten.mse_loss.default, torch.ops.aten.mse_loss_backward.default} <= set(RULES)
    torch.manual_seed(0)
    x = torch.randn(((B,) if batched[0] == 0 else ()) + shapes[0], dtype=torch.float64)
    t = torch.randn(((B,) if batched[1] == 0 else ()) + shapes[1], dtype=torch.float64)

    def f(a, b):
        return torch.ops.aten.mse_loss.default(a.sin(), b, {"none": 0, "mean": 1, "sum": 2}[reduction])

    def scalar(a, b):
        return f(a, b).sum()

    with engine.fallback_policy("error"):
        assert close(engine.vmap(f, in_dims=batched)(x, t), loop(f, x, t, in_dims=batched))
        for argnums in (0, 1):
            got = engine.vmap(engine.grad(scalar, argnums=argnums), in_dims=batched)(x, t)
            assert close(got, loop(tf.grad(scalar, argnums=argnums), x, t, in_dims=batched))
        if shapes[0] == shapes[1] and reduction != "none":
            got = engine.vmap(engine.hessian(scalar), in_dims=batched)(x, t)
            assert close(got, loop(tf.hessian(scalar), x, t, in_dims=batched))
    # F.mse_loss on a batch of examples' outputs, differentiated outside the vmap (grad of a mean)
    w, X, y = torch.randn(4, dtype=torch.float64), torch.randn(B, 4, dtype=torch.float64), torch.randn(B, dtype=torch.float64)
    per = lambda v, vmap: vmap(lambda xi, yi: F.mse_loss(xi @ v, yi, reduction=reduction))(X, y).sum()
    assert close(engine.grad(lambda v: per(v, engine.vmap))(w), tf.grad(lambda v: per(v, tf.vmap))(w))


def test_slice_select_backward_and_scatter_rules():
    """The backward ops of slicing a flat parameter vector have rules (no decomposition into index ops)."""
    import torch.func as tf

    torch.manual_seed(0)
    x, s = torch.randn(B, 6, 5), torch.randn(B, 2, 5)

    def f(v):
        return (v[1:5:2].sin() * 2).sum() + v.select(1, 2).cos().sum() + v[:, -3:].pow(2).sum()

    def g(v, w):
        return torch.slice_scatter(v, w, 0, 1, 5, 2).sum(0) + torch.select_scatter(v, w[0], 0, 3)[3]

    with engine.fallback_policy("error"), engine.record_fallbacks() as rec:
        assert close(engine.vmap(engine.grad(f))(x), tf.vmap(tf.grad(f))(x))
        flat = lambda v: f(v.reshape(6, 5))  # noqa: E731
        assert close(engine.hessian(flat)(x[0].reshape(-1)), tf.hessian(flat)(x[0].reshape(-1)))
        for dims in ((0, 0), (None, 0), (0, None)):
            assert close(engine.vmap(g, in_dims=dims)(x if dims[0] == 0 else x[0], s if dims[1] == 0 else s[0]),
                         loop(g, x if dims[0] == 0 else x[0], s if dims[1] == 0 else s[0], in_dims=dims))
    assert rec.total == 0


@pytest.mark.parametrize("width", [1, 8, 64])
def test_a_product_whose_batch_folds_into_column_major_rows_matches_the_loop(width):
    """A batched left operand whose memory has the contraction dim outermost (a batched backward's
    weight gradient) folds into a column-major [B*n, k]: multiplied the other way round where the
    output is narrow (the CPU GEMM's slow path otherwise), the same values as the loop's."""
    from engine.rules.linalg import _column_major_rows

    B, n, k = 8, 16, 64
    a = torch.randn(k, B * n).t().view(B, n, k)
    assert _column_major_rows(a)
    w = torch.randn(k, width)
    got = engine.vmap(lambda ai: ai @ w)(a)
    torch.testing.assert_close(got, torch.stack([ai @ w for ai in a]))
    got_mm = engine.vmap(lambda ai: torch.mm(ai, w))(a)
    torch.testing.assert_close(got_mm, torch.stack([ai @ w for ai in a]))
