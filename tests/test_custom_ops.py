"""Custom ops for free: torch.library.custom_op ops without a batching rule are batched by running
their Python implementation under the engine, with zero for-loop fallbacks, while backward uses the
op's own registered derivative."""
from __future__ import annotations

import pytest
import torch

import engine

_CALLS = {"scaled_sin_bwd": 0}


@torch.library.custom_op("vmapbench_test::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(x) * scale


@scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _scaled_sin_setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _scaled_sin_bwd(ctx, grad):
    _CALLS["scaled_sin_bwd"] += 1
    (x,) = ctx.saved_tensors
    return grad * torch.cos(x) * ctx.scale, None


scaled_sin.register_autograd(_scaled_sin_bwd, setup_context=_scaled_sin_setup)


@torch.library.custom_op("vmapbench_test::rowwise_sumsq", mutates_args=())
def rowwise_sumsq(x: torch.Tensor) -> torch.Tensor:
    return (x * x).sum(-1)


@rowwise_sumsq.register_fake
def _(x):
    return x.new_empty(x.shape[:-1])


def _sumsq_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _sumsq_bwd(ctx, grad):
    (x,) = ctx.saved_tensors
    return 2 * x * grad.unsqueeze(-1)


rowwise_sumsq.register_autograd(_sumsq_bwd, setup_context=_sumsq_setup)


@torch.library.custom_op("vmapbench_test::mean_and_centered", mutates_args=())
def mean_and_centered(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m = x.mean(-1, keepdim=True)
    return m.squeeze(-1), x - m


@mean_and_centered.register_fake
def _(x):
    return x.new_empty(x.shape[:-1]), torch.empty_like(x)


@torch.library.custom_op("vmapbench_test::plus_one_ruled", mutates_args=())
def plus_one_ruled(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@plus_one_ruled.register_fake
def _(x):
    return torch.empty_like(x)


def _loop(f, *xs):
    outs = [f(*(x[i] for x in xs)) for i in range(xs[0].shape[0])]
    if isinstance(outs[0], tuple):
        return tuple(torch.stack(o) for o in zip(*outs))
    return torch.stack(outs)


@pytest.mark.parametrize(
    "fn",
    [lambda x: scaled_sin(x, 2.5), rowwise_sumsq, mean_and_centered],
    ids=["pointwise", "reduction", "two_outputs"],
)
def test_custom_op_is_batched_without_fallback(fn):
    x = torch.randn(4, 3, 5)
    with engine.fallback_policy("error"), engine.record_fallbacks() as rec:
        got = engine.vmap(fn)(x)
    assert rec.total == 0
    torch.testing.assert_close(got, _loop(fn, x))


def test_custom_op_nested_and_in_dims():
    x = torch.randn(2, 5, 3)
    with engine.fallback_policy("error"):
        got = engine.vmap(engine.vmap(rowwise_sumsq, in_dims=1), in_dims=0)(x.transpose(1, 2))
    torch.testing.assert_close(got, (x * x).sum(-1))


def test_backward_uses_registered_derivative_and_batches():
    x = torch.randn(3, 4)
    before = _CALLS["scaled_sin_bwd"]
    with engine.fallback_policy("error"):
        g = engine.vmap(engine.grad(lambda v: scaled_sin(v, 3.0).sum()))(x)
    assert _CALLS["scaled_sin_bwd"] > before, "backward did not go through the op's registered derivative"
    torch.testing.assert_close(g, 3.0 * torch.cos(x))


def test_vmap_over_vjp_of_custom_op():
    x = torch.randn(4, 6)
    cot = torch.randn(5, 4)
    _, vjp_fn = engine.vjp(rowwise_sumsq, x)
    with engine.fallback_policy("error"):
        (got,) = engine.vmap(vjp_fn)(cot)
    torch.testing.assert_close(got, 2 * x.unsqueeze(0) * cot.unsqueeze(-1))


def test_registered_rule_wins_over_implementation():
    calls = []

    @engine.register_rule(torch.ops.vmapbench_test.plus_one_ruled.default)
    def _rule(info, in_dims, x):
        calls.append(in_dims)
        return x + 1, 0

    x = torch.randn(3, 2)
    got = engine.vmap(plus_one_ruled)(x)
    assert calls == [(0,)] or calls == [[0]]
    torch.testing.assert_close(got, x + 1)


def test_custom_op_db_ops_batch():
    from torch.testing._internal.custom_op_db import custom_op_db

    from engine.coverage.harness import check_op

    results = {op.name: check_op(op, torch_func=False) for op in custom_op_db if torch.float32 in op.supported_dtypes("cpu")}
    assert results, "custom_op_db is empty"
    bad = {k: (r.engine, r.detail) for k, r in results.items() if r.engine in ("mismatch",)}
    assert not bad, bad
    assert any(r.engine == "native" for r in results.values())
