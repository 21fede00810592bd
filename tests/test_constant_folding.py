"""engine.graph_passes.fold_constants through engine.trace: what reads only captured tensors is
computed once, yet every replay still sees what an unfolded replay would."""
from __future__ import annotations

import pytest
import torch
import torch.distributions as D

import engine


def _entry(traced):
    (entry,) = traced._cache.values()
    return entry


def _logreg():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(40, 5, generator=g), (torch.rand(40, generator=g) > 0.5).float()

    def log_joint(w: torch.Tensor) -> torch.Tensor:
        prior = D.Normal(0.0, 1.0).log_prob(w).sum()
        return prior + D.Bernoulli(logits=X @ w).log_prob(y).sum()

    return X, y, log_joint


def test_distribution_checks_on_captured_values_are_folded_out_of_the_replay():
    X, y, log_joint = _logreg()
    fn = engine.vmap(engine.grad(log_joint))
    traced = engine.trace(fn)
    w = torch.randn(3, 5)
    traced(w)
    entry = _entry(traced)
    assert entry.fold is not None and len(entry.fold.gm.graph.nodes) > 3
    # the checks of Normal(0, 1)'s parameters and of y's support read no argument: none is left
    nodes = list(entry.gm.graph.nodes)
    reads_argument = set([n for n in nodes if n.op == "placeholder"][: len(entry.tensor_pos)])
    for node in nodes:
        if any(i in reads_argument for i in node.all_input_nodes):
            reads_argument.add(node)
    remaining = [n for n in nodes if n.op == "call_function" and n not in reads_argument]
    assert [n for n in remaining if n.target is not torch.ops.aten.clone.default] == []
    for seed in range(3):
        w = torch.randn(3, 5, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(traced(w), torch.func.vmap(torch.func.grad(log_joint))(w), atol=1e-5, rtol=1e-5)


def test_an_in_place_update_of_a_captured_tensor_refreshes_the_folded_values():
    X, y, log_joint = _logreg()
    traced = engine.trace(engine.grad(log_joint))
    w = torch.randn(5)
    traced(w), traced(w)
    X.mul_(0.5)  # data the folded X-only ops read
    y.copy_(1 - y)
    torch.testing.assert_close(traced(w), torch.func.grad(log_joint)(w), atol=1e-5, rtol=1e-5)


def test_an_invalid_captured_value_written_in_place_still_raises_the_distributions_error():
    y = torch.tensor([0.0, 1.0, 1.0])
    traced = engine.trace(engine.grad(lambda logit: D.Bernoulli(logits=logit.expand(3)).log_prob(y).sum()))
    x = torch.tensor([0.3])
    traced(x), traced(x)
    y[0] = 0.5  # outside Bernoulli's support: the folded check comes out False now
    with pytest.raises(ValueError, match="value"):
        traced(x)


def _guard_inputs(entry) -> list:
    """The conditions the replay's guard (the graph's last output) joins."""
    (out,) = [n for n in entry.gm.graph.nodes if n.op == "output"]
    guard = out.args[0][-1]
    if guard.target is torch.ops.aten.logical_and.default:
        return list(guard.args)
    assert guard.target is torch.ops.aten.all.default
    return list(guard.args[0].args[0])


def test_the_guard_joins_the_checks_of_captured_values_once_and_still_fails_on_either_side():
    # Normal(loc, scale) checks loc and scale (captured), the value (the argument); Bernoulli
    # checks y (captured) and its logits (computed from the argument).
    X, y, _ = _logreg()
    loc, scale = torch.zeros(5), torch.ones(5)

    def log_joint(w: torch.Tensor) -> torch.Tensor:
        return D.Normal(loc, scale).log_prob(w).sum() + D.Bernoulli(logits=X @ w).log_prob(y).sum()

    traced = engine.trace(engine.grad(log_joint))
    w = torch.randn(5)
    traced(w), traced(w)
    entry = _entry(traced)
    joined = _guard_inputs(entry)
    folded = [n for n in joined if n.op == "placeholder"]
    assert len(folded) == 1  # the captured values' checks: one folded conjunction
    assert not any(n.target is torch.ops.aten.eq.Scalar for n in entry.gm.graph.nodes)  # (b == True is b)
    torch.testing.assert_close(traced(w), torch.func.grad(log_joint)(w))
    with pytest.raises(ValueError, match="value"):
        traced(torch.full((5,), float("nan")))  # an argument's check
    traced(w)
    scale[0] = -1.0  # a captured value's check
    with pytest.raises(ValueError, match="scale"):
        traced(w)
    scale[0] = 1.0
    torch.testing.assert_close(traced(w), torch.func.grad(log_joint)(w))


def test_a_comparison_with_true_is_dropped_only_where_it_compares_bools():
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.eq(x, True).float() * x + torch.eq(x > 0, True).float()

    traced = engine.trace(engine.vmap(f))
    x = torch.tensor([[1.0, 2.0, 0.0], [-1.0, 1.0, 0.5]])
    traced(x), traced(x)
    assert torch.equal(traced(x), torch.vmap(f)(x))
    kept = [n for n in _entry(traced).gm.graph.nodes if n.target is torch.ops.aten.eq.Scalar]
    assert len(kept) == 1  # the float comparison stays


def test_a_captured_tensor_that_requires_grad_keeps_its_gradient():
    weight = torch.randn(4, requires_grad=True)
    scale = torch.tensor(3.0)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * (weight * scale).exp()).sum()

    traced = engine.trace(engine.grad(f))
    x = torch.randn(4)
    traced(x)
    for _ in range(2):  # replays: the folded weight * scale must carry its autograd graph every call
        out = traced(x)
        (g,) = torch.autograd.grad(out.sum(), weight)
        (want,) = torch.autograd.grad(torch.func.grad(f)(x).sum(), weight)
        torch.testing.assert_close(g, want, atol=1e-5, rtol=1e-5)


def test_a_folded_output_is_a_fresh_tensor_at_every_call():
    table = torch.arange(6.0)
    traced = engine.trace(lambda x: (x + 1, table * 2))
    x = torch.randn(2)
    traced(x)
    (_, a), (_, b) = traced(x), traced(x)
    assert a.data_ptr() != b.data_ptr()
    a.add_(100)
    torch.testing.assert_close(b, table * 2)


def test_random_ops_are_not_folded():
    traced = engine.trace(lambda x: x + torch.randn(3))
    x = torch.zeros(3)
    traced(x)
    assert not torch.equal(traced(x), traced(x))


def test_folded_values_follow_a_write_that_does_not_move_the_version_counter():
    """BatchNorm's kernels update its running statistics in place without moving their version
    counter: a fold keyed on versions alone replayed stale statistics (issue 25's net caught it)."""
    bn = torch.nn.BatchNorm1d(4)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), bn).requires_grad_(False).eval()
    traced = engine.trace(engine.vmap(lambda x: model(x[None])[0]))
    x = torch.randn(3, 4)
    traced(x)  # the recording
    traced(x)  # the first replay computes the folded values
    assert _entry(traced).fold is not None  # the statistics, expanded over the batch, read no argument
    version = bn.running_var._version
    bn.train()
    model(torch.randn(16, 4) * 3 + 1)
    bn.eval()
    assert bn.running_var._version == version  # the write that versions do not see
    want = torch.func.vmap(lambda x: model(x[None])[0])(x)
    torch.testing.assert_close(traced(x), want)  # (a fused program may differ in the last bit)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_values_follow_a_sign_only_write_through_data(dtype):
    """A write through `.data` moves no version counter either, and 0.0 -> -0.0 changes no value
    that == compares: the fold's content check compares bits (as bytes where the source allows it,
    float32 here; bfloat16, which numpy lacks, takes the general path)."""
    scale = torch.zeros(3, dtype=dtype)
    traced = engine.trace(lambda x: x / (scale + 0.0).exp().reciprocal().mul(scale))  # the fold: ops on `scale` alone
    x = torch.ones(3, dtype=dtype)
    traced(x)  # the recording
    traced(x)  # the first replay computes the folded values
    assert _entry(traced).fold is not None
    version = scale._version
    scale.data.copy_(torch.tensor([-0.0, 0.0, -0.0], dtype=dtype))
    assert scale._version == version
    got = traced(x)
    assert torch.equal(torch.signbit(got), torch.tensor([True, False, True]))  # 1 / -0.0 = -inf


def test_folded_values_follow_a_new_layout_over_the_same_memory():
    """`t.data = t.t()` gives the tensor another layout over the same memory, moving neither its
    version counter nor its data pointer: the fold's state includes the layout (the byte
    comparison alone would see the same bytes)."""
    weight = torch.arange(6.0).reshape(2, 3)
    traced = engine.trace(lambda x: x * (weight[0, 0] + weight[0, 1]))  # the fold: two elements of weight
    x = torch.ones(())
    traced(x)
    traced(x)
    assert _entry(traced).fold is not None
    version, ptr = weight._version, weight.data_ptr()
    weight.data = weight.detach().t()  # element [0, 1] is now 3.0, was 1.0
    assert (weight._version, weight.data_ptr()) == (version, ptr)
    torch.testing.assert_close(traced(x), torch.tensor(3.0))


@pytest.mark.parametrize("check", ["native", "python"])
def test_folded_values_follow_a_new_dtype_over_the_same_memory(check, monkeypatch):
    """`t.data = t.view(torch.int32)` keeps the memory, its bytes, the sizes and strides, and moves
    no version counter: only the dtype says the values changed (float bits read as integers). The
    fold's layout check includes the dtype (the replay returned the float results before), with
    torch's TensorGuards and with the Python comparison used where a torch lacks them."""
    if check == "python":
        monkeypatch.delattr(torch._C._dynamo.guards, "TensorGuards")
    weight = torch.randn(4)
    traced = engine.trace(lambda x: x + weight * 2)  # the fold: weight * 2
    x = torch.randn(4)
    traced(x)
    traced(x)
    assert _entry(traced).fold is not None
    version, ptr = weight._version, weight.data_ptr()
    weight.data = weight.view(torch.int32)
    assert (weight._version, weight.data_ptr()) == (version, ptr)
    torch.testing.assert_close(traced(x), x + weight * 2)


def _large_fold(monkeypatch, gain: float):
    """A traced function whose fold reads one captured tensor above FOLD_WATCH_ELEMENTS, with the
    pay rule's threshold set to `gain` (0: always watched; inf: never), after its first replay."""
    from engine import graph_passes

    monkeypatch.setattr(graph_passes, "FOLD_WATCH_GAIN", gain)
    weight = torch.randn(graph_passes.FOLD_WATCH_ELEMENTS + 7)
    traced = engine.trace(lambda x: x + weight.tanh() * 2)  # the fold: weight.tanh() * 2
    x = torch.randn(weight.shape)
    traced(x)  # the recording
    traced(x)  # the first replay computes the folded values and decides
    fold = _entry(traced).fold
    assert fold is not None
    return traced, fold, weight, x


def test_a_large_source_is_watched_where_comparing_pays_and_writes_still_refresh(monkeypatch):
    traced, fold, weight, x = _large_fold(monkeypatch, 0.0)
    assert fold._watchable is True
    assert fold.values() is fold.values()  # kept: not recomputed while the source is unchanged
    version = weight._version
    weight.data[5] = -weight.data[5]  # a write that moves no version counter
    assert weight._version == version
    torch.testing.assert_close(traced(x), x + weight.tanh() * 2, rtol=0, atol=0)


def test_a_large_source_is_recomputed_where_comparing_does_not_pay(monkeypatch):
    traced, fold, weight, x = _large_fold(monkeypatch, float("inf"))
    assert fold._watchable is False and fold._contents == []  # no copy of the source kept
    assert fold.values() is not fold.values()
    weight.mul_(2)
    torch.testing.assert_close(traced(x), x + weight.tanh() * 2, rtol=0, atol=0)


def test_sources_beyond_the_byte_limit_are_never_copied(monkeypatch):
    from engine import graph_passes

    monkeypatch.setattr(graph_passes, "FOLD_WATCH_BYTES", 0)
    traced, fold, weight, x = _large_fold(monkeypatch, 0.0)
    assert fold._watchable is False and fold._contents == []


def test_large_sources_off_the_cpu_are_never_copied():
    """The comparison of a large source keeps a copy of it: on a device that would be device
    memory (a peak the suite reports), so large sources there are recomputed as before."""
    from engine import graph_passes

    gm = torch.fx.symbolic_trace(lambda w: w * 2)
    large = torch.empty(graph_passes.FOLD_WATCH_ELEMENTS + 1, device="meta")
    assert graph_passes.Fold(gm, [large])._watchable is False
    assert graph_passes.Fold(gm, [torch.empty(large.shape)])._watchable is None  # the same on the CPU: decided later


def test_a_guard_regrouped_in_a_graph_with_nothing_to_fold_runs_as_rewritten():
    from engine.graph_passes import fold_constants
    from engine.recorder import record

    aten = torch.ops.aten

    def checks(x, y):
        a = aten._is_all_true.default(aten.eq.Tensor(x, x))
        b = aten._is_all_true.default(aten.gt.Scalar(y, 0))
        return [x + y, aten.all.default(aten.stack.default([a, b]))]

    gm = record(checks, [torch.randn(3), torch.rand(3)])
    assert fold_constants(gm, 2, []) is None  # nothing reads only captured tensors
    assert "logical_and" in gm.code and "stack" not in gm.code  # the forward is the graph as rewritten
    x, y = torch.randn(3), torch.rand(3)
    assert gm(x, y)[1].item() and not gm(x, -y)[1].item() and not gm(torch.full((3,), float("nan")), y)[1].item()
