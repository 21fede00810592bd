"""The one-kernel-call rules of engine.rules.norms_fast (batch norm, instance norm through it, layer
norm's backward) and the pointwise rule's 0-dim promotion, against a per-sample loop in float64,
eager and traced, with the for-loop fallback forbidden."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

import engine

DT = torch.float64


def _models():
    torch.manual_seed(0)

    def cnn(norm):
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), norm(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(4, 3))

    bn_eval = cnn(nn.BatchNorm2d)
    bn_eval[1].running_mean.uniform_(-0.5, 0.5)
    bn_eval[1].running_var.uniform_(0.5, 2.0)
    return {
        "batchnorm2d_eval": bn_eval.eval(),
        "batchnorm1d_eval": nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 3)).eval(),
        "batchnorm_no_stats_train": nn.Sequential(nn.Linear(5, 4), nn.Unflatten(1, (2, 2)), nn.BatchNorm1d(2, track_running_stats=False),
                                                  nn.Flatten(), nn.Linear(4, 3)),
        "instancenorm_affine": cnn(lambda c: nn.InstanceNorm2d(c, affine=True)),
        "instancenorm": cnn(nn.InstanceNorm2d),
        "layernorm": nn.Sequential(nn.Linear(5, 6), nn.LayerNorm(6), nn.Tanh(), nn.Linear(6, 3)),
        "layernorm_2d": nn.Sequential(nn.Linear(5, 6), nn.Unflatten(1, (2, 3)), nn.LayerNorm((2, 3)), nn.Flatten(), nn.Linear(6, 3)),
        "layernorm_no_affine": nn.Sequential(nn.Linear(5, 6), nn.LayerNorm(6, elementwise_affine=False), nn.Linear(6, 3)),
    }


INPUTS = {"batchnorm2d_eval": (3, 6, 6), "instancenorm_affine": (3, 6, 6), "instancenorm": (3, 6, 6)}


@pytest.mark.parametrize("name", list(_models()))
def test_per_sample_gradients_match_the_loop(name):
    model = _models()[name].to(DT)
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = dict(model.named_buffers())

    def loss(p, x, t):
        out = functional_call(model, (p, buffers), (x.unsqueeze(0),))
        return nn.functional.cross_entropy(out, t.unsqueeze(0))

    x = torch.randn(4, *INPUTS.get(name, (5,)), dtype=DT)
    t = torch.randint(0, 3, (4,))
    want = [torch.func.grad(loss)(params, x[i], t[i]) for i in range(4)]
    fn = engine.vmap(engine.grad(loss), in_dims=(None, 0, 0))
    with engine.fallback_policy("error"):
        for got in (fn(params, x, t), engine.trace(fn)(params, x, t)):
            for k in params:
                torch.testing.assert_close(got[k], torch.stack([w[k] for w in want]), msg=f"{name}: {k}")


def test_batch_norm_with_batched_weights_and_running_statistics_matches_the_loop():
    # an ensemble: each element has its own affine parameters and running statistics (training mode)
    x, w, b = torch.randn(3, 4, 2, 5, dtype=DT), torch.rand(3, 2, dtype=DT) + 0.5, torch.randn(3, 2, dtype=DT)
    rm, rv = torch.randn(3, 2, dtype=DT), torch.rand(3, 2, dtype=DT) + 0.5
    rm_loop, rv_loop = rm.clone(), rv.clone()

    def f(x, w, b, rm, rv):
        return nn.functional.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3).sin().sum()

    want = torch.stack([torch.func.grad(f, argnums=(0, 1, 2))(x[i], w[i], b[i], rm_loop[i], rv_loop[i])[1] for i in range(3)])
    with engine.fallback_policy("error"):
        got = engine.vmap(engine.grad(f, argnums=(0, 1, 2)))(x, w, b, rm, rv)[1]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(rm, rm_loop)
    torch.testing.assert_close(rv, rv_loop)
    # unbatched running statistics are updated as by each element in turn in the loop (natively, engine.rules.norms)
    shared_m, shared_v = rm[0].clone(), rv[0].clone()
    loop_m, loop_v = shared_m.clone(), shared_v.clone()
    want = torch.stack([nn.functional.batch_norm(x[i], loop_m, loop_v, w[i], b[i], training=True, momentum=0.3) for i in range(3)])
    with engine.fallback_policy("error"):
        got = engine.vmap(lambda x, w, b: nn.functional.batch_norm(x, shared_m, shared_v, w, b, training=True, momentum=0.3))(x, w, b)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(shared_m, loop_m)
    torch.testing.assert_close(shared_v, loop_v)


def test_a_batched_0dim_tensor_does_not_promote_like_a_dimensioned_one():
    # float64 0-dim (batched) times float32 [3]: the result is float32, computed as torch does per element
    s = torch.tensor([0.1, 1 / 3, 2.7182818284590451], dtype=torch.float64)
    v = torch.tensor([1 / 7, 3.3, -0.6], dtype=torch.float32)
    for op in (torch.mul, torch.add, torch.div, torch.sub):
        want = torch.stack([op(si, v) for si in s])
        for got in (engine.vmap(lambda si: op(si, v))(s), engine.vmap(lambda si: op(v, si))(s)):
            assert got.dtype == torch.float32
        torch.testing.assert_close(engine.vmap(lambda si: op(si, v))(s), want, rtol=0, atol=0)
        torch.testing.assert_close(engine.vmap(lambda si: op(v, si))(s), torch.stack([op(v, si) for si in s]), rtol=0, atol=0)


@pytest.mark.parametrize("kwargs", [{}, {"padding_idx": 2}, {"scale_grad_by_freq": True}, {"padding_idx": 0, "scale_grad_by_freq": True}])
def test_embedding_per_sample_gradients_match_the_loop(kwargs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(7, 3, **kwargs), nn.Flatten(), nn.Linear(15, 2)).to(DT)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x):
        return functional_call(model, p, (x.unsqueeze(0),)).square().sum()

    x = torch.randint(0, 7, (4, 5))
    x[0, :3] = 2  # repeated rows (and the padding row) in one element
    want = [torch.func.grad(loss)(params, x[i]) for i in range(4)]
    fn = engine.vmap(engine.grad(loss), in_dims=(None, 0))
    with engine.fallback_policy("error"):
        for got in (fn(params, x), engine.trace(fn)(params, x)):
            for k in params:
                torch.testing.assert_close(got[k], torch.stack([w[k] for w in want]), msg=k)


def test_embedding_of_batched_tables_matches_the_loop():
    # an ensemble: each element its own table, shared or own indices
    w, idx = torch.randn(3, 6, 2, dtype=DT), torch.randint(0, 6, (3, 4))
    with engine.fallback_policy("error"):
        torch.testing.assert_close(engine.vmap(nn.functional.embedding)(idx, w), torch.stack([w[i][idx[i]] for i in range(3)]))
        torch.testing.assert_close(engine.vmap(nn.functional.embedding, in_dims=(None, 0))(idx[0], w),
                                   torch.stack([w[i][idx[0]] for i in range(3)]))
        g = engine.vmap(engine.grad(lambda w: nn.functional.embedding(idx[0], w).sin().sum()))(w)
    torch.testing.assert_close(g, torch.stack([torch.func.grad(lambda w: nn.functional.embedding(idx[0], w).sin().sum())(w[i]) for i in range(3)]))
