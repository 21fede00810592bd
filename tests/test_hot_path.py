"""The engine's eager hot path (issue #18): the shortcuts it takes give the general path's results.

Speed itself is measured by benchmarks (suite/bench_overhead.py, vmapbench/bench_ratios.py), never
asserted here: these tests pin down that each shortcut is taken only where it is exact.
"""
from __future__ import annotations

import pytest
import torch

import engine
from engine.rules._helpers import python_binding
from vmapbench import bench_ratios

aten = torch.ops.aten


@pytest.mark.parametrize("op, args", [
    (aten.sin.default, (torch.randn(3, 4),)),
    (aten.mul.Tensor, (torch.randn(3, 4), torch.randn(4))),
    (aten.mul.Tensor, (torch.randn(3, 4), 1.5)),
    (aten.sub.Tensor, (torch.randn(3, 4), torch.randn(3, 1))),
    (aten.where.self, (torch.randn(3, 4) > 0, torch.randn(3, 4), torch.randn(4))),
    (aten.pow.Tensor_Scalar, (torch.rand(3, 4), 3)),
    (aten.atan2.default, (torch.randn(3, 4), torch.rand(3, 4))),
])
def test_python_binding_computes_the_op(op, args) -> None:
    binding = python_binding(op)
    assert binding is not None, f"{op} should have a binding"
    torch.testing.assert_close(binding(*args), op(*args), rtol=0, atol=0)


def test_python_binding_of_an_inplace_op_is_the_tensor_method() -> None:
    binding = python_binding(aten.mul_.Tensor)
    x = torch.randn(3)
    expected = x * 2
    assert binding(x, 2.0) is x
    torch.testing.assert_close(x, expected)


def test_python_binding_refuses_ops_whose_positional_arguments_have_defaults() -> None:
    # leaky_relu(self, negative_slope=0.01): a call may omit the slope; the binding is not used.
    assert python_binding(aten.leaky_relu.default) is None
    assert python_binding(aten.copy_.default) is None  # copy_(self, src, non_blocking=False)


@pytest.mark.parametrize("fn", [
    lambda x, y: torch.sin(x),
    lambda x, y: x * 1.5 + 0.25,
    lambda x, y: x * y - y,
    lambda x, y: x.clone().mul_(y).add_(2.0),
    lambda x, y: torch.tanh(x).sum() * y,  # 0-dim batched times a vector
    lambda x, y: x * y.sum(),  # a vector times a 0-dim batched tensor
])
def test_unary_and_binary_plans_match_the_loop(fn) -> None:
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    expected = torch.stack([fn(a, b) for a, b in zip(x, y)])
    torch.testing.assert_close(engine.vmap(fn)(x, y), expected)


def test_binary_plan_across_nested_levels_sums_gradients_into_the_outer_input() -> None:
    """Two operands at one level whose inner levels differ: engine._gradsum must still be told, so a
    per-example gradient w.r.t. the outer-only operand sums over the inner batch."""
    w, x = torch.randn(3, 4), torch.randn(3, 5, 4)

    def loss(wi, xi):  # wi: [4] at the outer level; xi: [5, 4] mapped again inside
        return engine.vmap(lambda r: (torch.sin(r) * wi).sum())(xi).sum()

    got = engine.vmap(engine.grad(loss))(w, x)
    expected = torch.stack([torch.func.grad(lambda wi: torch.func.vmap(lambda r: (torch.sin(r) * wi).sum())(xi).sum())(wi)
                            for wi, xi in zip(w, x)])
    torch.testing.assert_close(got, expected)


def test_binary_plan_refuses_writing_batched_values_into_an_unbatched_tensor() -> None:
    out = torch.zeros(4)
    with pytest.raises(engine.VmapError, match="in place"):
        engine.vmap(lambda x: out.mul_(x))(torch.randn(3, 4))


def test_direct_ops_called_with_keywords_take_the_general_plan() -> None:
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(engine.vmap(lambda p, q: torch.add(p, q, alpha=2))(a, b), a + 2 * b)
    torch.testing.assert_close(engine.vmap(lambda p: torch.nn.functional.leaky_relu(p, 0.2))(a),
                               torch.nn.functional.leaky_relu(a, 0.2))


def test_reduction_shortcut_matches_loop() -> None:
    x = torch.randn(4, 3, 5)
    for fn in (lambda t: t.mean(-1, keepdim=True), lambda t: t.sum([0, 1]), lambda t: torch.softmax(t, 0),
               lambda t: t.max(1).values, lambda t: t.sum(0).mean(0)):
        torch.testing.assert_close(engine.vmap(fn)(x), torch.stack([fn(t) for t in x]))


def test_rnn_hook_is_class_level_and_no_global_module_hook_is_registered() -> None:
    from torch.nn.modules import module as nn_module

    seen = []

    def f(x):
        seen.append(len(nn_module._global_forward_pre_hooks))
        return torch.nn.functional.linear(x, torch.ones(2, 3))

    engine.vmap(f)(torch.randn(4, 3))
    assert seen == [0]
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 2)
    x = torch.randn(4, 5, 1, 3)
    expected = torch.stack([lstm(xi)[0] for xi in x])
    torch.testing.assert_close(engine.vmap(lambda xi: lstm(xi)[0])(x), expected)


def test_guards_stay_installed_and_inert_outside_transforms() -> None:
    engine.vmap(torch.sin)(torch.randn(2, 3))
    installed = torch.Tensor.requires_grad_
    engine.grad(lambda x: x.sum())(torch.randn(3))
    assert torch.Tensor.requires_grad_ is installed  # not patched again per call
    t = torch.randn(2).requires_grad_()
    assert t.requires_grad
    with pytest.raises(RuntimeError, match="requires_grad_"):
        engine.grad(lambda x: (x.detach().requires_grad_() * x).sum())(torch.randn(3))


def test_bench_ratios_selects_registry_workloads_with_both_methods() -> None:
    chosen = bench_ratios.candidates("per_sample_grads", None)
    assert chosen and all(bench_ratios.eager_method(w) and "torch_func" in w.methods for w in chosen)
    assert {w.name for w in chosen} >= {"nn_logreg", "psg_mlp"}
    ratios = bench_ratios.round_ratios(lambda: sum(range(200)), lambda: sum(range(100)), rounds=3, min_batch_s=0.001)
    assert len(ratios) == 3 and all(r > 0 for r in ratios)


def test_bench_ratios_report_runs_one_workload(capsys) -> None:
    medians = bench_ratios.report(bench_ratios.candidates(None, ["nn_logreg"]), rounds=1, min_batch_s=0.001)
    assert list(medians) == ["nn_logreg"] and medians["nn_logreg"] > 0
    assert "geomean" in capsys.readouterr().out


def test_bench_ratios_default_engine_is_the_auto_traced_method(capsys) -> None:
    w = bench_ratios.candidates(None, ["nn_logreg"], engine="default")[0]
    assert bench_ratios.engine_method(w, "default") == "engine"
    assert bench_ratios.engine_method(w, "eager") == "engine_eager"
    with pytest.raises(ValueError, match="eager"):
        bench_ratios.engine_method(w, "traced")
    medians = bench_ratios.report([w], rounds=1, min_batch_s=0.001, engine="default")
    assert medians["nn_logreg"] > 0 and "engine/torch_func" in capsys.readouterr().out


def test_one_tensor_plan_matches_loop_nested_and_under_grad() -> None:
    x = torch.randn(3, 4, 5, 6)

    def shape_ops(t):  # t: [5, 6]
        return t.transpose(0, 1).reshape(-1).unsqueeze(0).expand(2, -1).sum(0).view(6, 5)

    inner = torch.stack([torch.stack([shape_ops(b) for b in a]) for a in x])
    torch.testing.assert_close(engine.vmap(engine.vmap(shape_ops))(x), inner)
    grads = engine.vmap(engine.grad(lambda t: (shape_ops(t) ** 2).sum()))(x[0])
    torch.testing.assert_close(grads, torch.stack([torch.func.grad(lambda t: (shape_ops(t) ** 2).sum())(t) for t in x[0]]))


def _dim_shortcuts() -> list:
    """Every dim op whose plan shortcut calls a Python binding (engine.rules.reductions)."""
    from engine.rules._table import RULES

    found = []
    for op, rule in RULES.items():
        physical = getattr(rule, "physical", None)
        if getattr(physical, "binding", None) is not None:
            found.append(pytest.param(op, physical, id=str(op)))
    return found


class _Record(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_dim_shortcuts_cover_the_common_reductions() -> None:
    ops = {p.values[0] for p in _dim_shortcuts()}
    assert {aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten._softmax.default, aten.cumsum.default} <= ops


@pytest.mark.parametrize("op, physical", _dim_shortcuts())
def test_dim_shortcut_binding_dispatches_the_op_itself(op, physical) -> None:
    """The binding a dim shortcut calls must resolve to the op, not a sibling overload, for every
    argument pattern the dispatcher can hand it: dim an int or a list, each trailing positional
    argument left out (its default) or given, both ways for a bool."""
    import itertools

    trailing = [a for a in op._schema.arguments if not a.kwarg_only][2:]
    choices = [[True, False] if str(a.type) == "bool" else [a.default_value] for a in trailing]
    required = sum(not a.has_default_value() for a in trailing)
    rests = {combo[:k] for combo in itertools.product(*choices) for k in range(required, len(combo) + 1)}
    checked = 0
    for dim in (1, -1, [1], [0, 2]):
        for rest in sorted(rests, key=len):
            x = torch.randn(2, 3, 4, 5)
            with _Record() as rec:
                try:
                    out = physical(x, dim, *rest)
                except RuntimeError:  # the op's own refusal (half_to_float on CPU): it still ran
                    out = None
            if out is NotImplemented:
                continue
            assert rec.ops and rec.ops[0] is op, f"{op} called as ({dim}, {rest}) dispatched {rec.ops}"
            checked += 1
    assert checked


@pytest.mark.parametrize("fn", [
    lambda x: x.mean(-1, keepdim=True),
    lambda x: x.sum([0, 1]),
    lambda x: x.amax(0),
    lambda x: torch.softmax(x, -1),
    lambda x: x.cumsum(1),
    lambda x: x.sum(-1).sum(0),  # down to a 0-dim example: the rule, not the shortcut
    lambda x: x.transpose(0, 1).unsqueeze(-1).expand(4, 3, 2).permute(2, 0, 1).select(1, 2),
    lambda x: x.view(-1).narrow(0, 1, 5).unsqueeze(0).t(),
])
def test_shortcut_plans_match_the_loop(fn) -> None:
    x = torch.randn(5, 3, 4)
    expected = torch.stack([fn(a) for a in x])
    torch.testing.assert_close(engine.vmap(fn)(x), expected)


def test_dim_shortcut_raises_on_bad_dims_as_the_rule_does() -> None:
    with pytest.raises(IndexError, match="Dimension out of range"):
        engine.vmap(lambda x: x.sum(3))(torch.randn(5, 3, 4))


_SCALARS = [1.5, 1.1, -2.25, 1e-40, 1e39, -0.0, 0.0, float("nan"), float("inf"), 3, -7, 2 ** 24 + 1, 2 ** 60, True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("op", ["mul", "add", "sub", "div", "rsub", "true_divide", "pow", "mul_", "add_"])
def test_python_number_operands_match_torch_func_bit_for_bit(op, dtype) -> None:
    """A Python number beside a batched tensor (`x * 1.5`) may be passed to the op as a cached 0-dim
    tensor (engine._dispatch._scalar_operand): the result must be torch.func's, bit for bit and in
    dtype, for every kind of number, including signed zeros, NaN, ints past float precision and bools.
    (torch.func, not the loop, is the reference: a kernel may round differently on a whole batch
    than on one row, as pow does with an int exponent; both vmaps run it on the batch.)"""
    x = (torch.randn(4, 3) * 3).to(dtype)
    fns = {
        "mul": lambda r, b: r * b, "add": lambda r, b: r + b, "sub": lambda r, b: r - b, "div": lambda r, b: r / b,
        "rsub": lambda r, b: b - r, "true_divide": lambda r, b: torch.true_divide(r, b),
        "pow": lambda r, b: r ** b,  # pow.Tensor_Scalar: a Scalar in the schema, never a cached tensor
        "mul_": lambda r, b: r.clone().mul_(b), "add_": lambda r, b: r.clone().add_(b),
    }
    fn = fns[op]
    for b in _SCALARS:
        try:
            expected = torch.func.vmap(lambda r: fn(r, b))(x)
        except RuntimeError as exc:
            with pytest.raises(type(exc)):
                engine.vmap(lambda r: fn(r, b))(x)
            continue
        got = engine.vmap(lambda r: fn(r, b))(x)
        assert got.dtype == expected.dtype, (op, b)
        assert torch.equal(got.isnan(), expected.isnan()), (op, b)
        same = torch.where(expected.isnan(), torch.zeros_like(expected), expected)
        gotz = torch.where(got.isnan(), torch.zeros_like(got), got)
        assert torch.equal(gotz, same) and torch.equal(torch.signbit(gotz), torch.signbit(same)), (op, b, got, expected)


def test_scalar_operand_is_cached_only_where_exact() -> None:
    from engine._dispatch import _SCALARS_KEPT, _scalar_operand

    f32 = torch.randn(3)
    assert _scalar_operand(1.5, f32) is _scalar_operand(1.5, f32)  # cached
    assert _scalar_operand(1.5, f32).dtype == torch.float32
    for b in (0.0, -0.0, float("nan"), True, 2 ** 24 + 1, 1 + 2j):
        assert _scalar_operand(b, f32) is None, b
    assert _scalar_operand(1.5, f32.half()) is None  # reads a wrapped number in float
    assert _scalar_operand(1.5, torch.arange(3)) is None  # an int tensor: the result would not be float
    assert _scalar_operand(1.5, f32.clone().requires_grad_()) is None
    for i in range(_SCALARS_KEPT + 5):  # many distinct numbers: the cache stays bounded
        _scalar_operand(i + 0.5, f32)
    from engine._dispatch import _SCALARS

    assert len(_SCALARS[torch.float32]) <= _SCALARS_KEPT
