"""torch.nn layers as users write them: per-sample gradients through functional_call under the
engine (eager and traced) against an explicit per-sample loop, with the for-loop fallback forbidden.

Also the layers with weights batched too (model ensembling: vmap over stacked parameters), and the
float32 path where nn.LSTM runs oneDNN's `mkldnn_rnn_layer`.
"""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state

import engine

N = 3  # samples


def _layers() -> dict:
    """name -> (module factory, input factory); inputs are a batch of N samples."""
    return {
        "Linear": (lambda: nn.Linear(5, 3), lambda: torch.randn(N, 5)),
        "TransformerEncoderLayer": (
            lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True),
            lambda: torch.randn(N, 5, 8)),
        "GRU": (lambda: nn.GRU(3, 4, batch_first=True), lambda: torch.randn(N, 5, 3)),
        "LSTM": (lambda: nn.LSTM(3, 4, batch_first=True), lambda: torch.randn(N, 5, 3)),
        "RNN": (lambda: nn.RNN(3, 4, batch_first=True), lambda: torch.randn(N, 5, 3)),
        "LSTMStackedBidirectional": (lambda: nn.LSTM(3, 4, num_layers=2, bidirectional=True), lambda: torch.randn(N, 5, 3)),
        "EmbeddingBagMean": (lambda: nn.EmbeddingBag(10, 4, mode="mean"), lambda: torch.randint(0, 10, (N, 6))),
        "EmbeddingBagSum": (lambda: nn.EmbeddingBag(10, 4, mode="sum", padding_idx=2), lambda: torch.randint(0, 10, (N, 6))),
        "EmbeddingBagMax": (lambda: nn.EmbeddingBag(10, 4, mode="max"), lambda: torch.randint(0, 10, (N, 6))),
        "Embedding": (lambda: nn.Embedding(10, 4), lambda: torch.randint(0, 10, (N, 6))),
        "GroupNorm": (lambda: nn.GroupNorm(2, 4), lambda: torch.randn(N, 4, 3, 3)),
        "InstanceNorm2d": (lambda: nn.InstanceNorm2d(4, affine=True), lambda: torch.randn(N, 4, 3, 3)),
        "LayerNorm": (lambda: nn.LayerNorm(6), lambda: torch.randn(N, 3, 6)),
        "BatchNormEval": (lambda: nn.BatchNorm1d(4).eval(), lambda: torch.randn(N, 4, 3)),
        "BatchNormTrain": (lambda: nn.BatchNorm1d(4, track_running_stats=False), lambda: torch.randn(N, 4, 3)),
        "Conv1d": (lambda: nn.Conv1d(2, 3, 3), lambda: torch.randn(N, 2, 7)),
        "Conv2d": (lambda: nn.Conv2d(2, 3, 3, padding=1), lambda: torch.randn(N, 2, 5, 5)),
        "MaxPool2d": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.MaxPool2d(2)), lambda: torch.randn(N, 2, 6, 6)),
        "Dropout0": (lambda: nn.Sequential(nn.Linear(5, 3), nn.Dropout(0.0)), lambda: torch.randn(N, 5)),
    }


LAYERS = list(_layers())


def _setup(name: str, dtype=torch.float64):
    make_module, make_input = _layers()[name]
    module = make_module().to(dtype)
    x = make_input()
    if x.is_floating_point():
        x = x.to(dtype)
    params = {k: v.detach() for k, v in module.named_parameters()}
    buffers = dict(module.named_buffers())

    def loss(p, xi):
        out = functional_call(module, (p, buffers), (xi.unsqueeze(0),))
        out = out[0] if isinstance(out, tuple) else out
        return (out * out).sum()

    return params, x, loss


def _loop(loss, params, x) -> dict:
    per_sample = []
    for i in range(x.shape[0]):
        p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        grads = torch.autograd.grad(loss(p, x[i]), list(p.values()), allow_unused=True)
        per_sample.append([torch.zeros_like(v) if g is None else g for v, g in zip(p.values(), grads)])
    return {k: torch.stack([s[j] for s in per_sample]) for j, k in enumerate(params)}


def _tol(dtype):
    return {"atol": 1e-9, "rtol": 1e-7} if dtype == torch.float64 else {"atol": 2e-5, "rtol": 1e-4}


@pytest.fixture(autouse=True)
def _no_fallback():
    with engine.fallback_policy("error"):
        yield


@pytest.mark.parametrize("name", LAYERS)
def test_per_sample_grads_match_loop(name):
    params, x, loss = _setup(name)
    expected = _loop(loss, params, x)
    torch.testing.assert_close(engine.vmap(engine.grad(loss), in_dims=(None, 0))(params, x), expected, **_tol(torch.float64))


@pytest.mark.parametrize("name", LAYERS)
def test_traced_per_sample_grads_match_loop(name):
    params, x, loss = _setup(name)
    traced = engine.trace(engine.vmap(engine.grad(loss), in_dims=(None, 0)))
    traced(params, x)
    x2 = x.flip(0)
    torch.testing.assert_close(traced(params, x2), _loop(loss, params, x2), **_tol(torch.float64))
    assert traced.cache_info().traces == 1


@pytest.mark.parametrize("name", ["LSTM", "LSTMStackedBidirectional", "GRU", "TransformerEncoderLayer", "GroupNorm"])
def test_float32_per_sample_grads_match_loop(name):
    """float32 on CPU: nn.LSTM runs mkldnn_rnn_layer (forward folded, backward decomposed)."""
    params, x, loss = _setup(name, torch.float32)
    got = engine.vmap(engine.grad(loss), in_dims=(None, 0))(params, x)
    torch.testing.assert_close(got, _loop(loss, params, x), **_tol(torch.float32))


@pytest.mark.parametrize("name, dtype", [("LSTM", torch.float32), ("GRU", torch.float64), ("GroupNorm", torch.float64),
                                         ("EmbeddingBagMean", torch.float64), ("TransformerEncoderLayer", torch.float64)])
def test_ensemble_of_models_matches_loop(name, dtype):
    """vmap over stacked parameters and inputs: weights batched as well (model ensembling)."""
    make_module, make_input = _layers()[name]
    models = [make_module().to(dtype) for _ in range(N)]
    params, _ = stack_module_state(models)
    params = {k: v.detach() for k, v in params.items()}
    x = make_input()
    x = x.to(dtype) if x.is_floating_point() else x

    def loss(p, xi):
        out = functional_call(models[0], p, (xi.unsqueeze(0),))
        out = out[0] if isinstance(out, tuple) else out
        return (out * out).sum()

    got = engine.vmap(engine.grad(loss))(params, x)
    expected = _loop_each(loss, params, x)
    torch.testing.assert_close(got, expected, **_tol(dtype))


def _loop_each(loss, params, x) -> dict:
    rows = []
    for i in range(x.shape[0]):
        p = {k: v[i].clone().requires_grad_(True) for k, v in params.items()}
        rows.append(torch.autograd.grad(loss(p, x[i]), list(p.values())))
    return {k: torch.stack([r[j] for r in rows]) for j, k in enumerate(params)}


def test_rnn_with_a_given_initial_state_and_its_gradient():
    gru = nn.GRU(3, 4, num_layers=2).double()
    h0 = torch.randn(2, 1, 4, dtype=torch.float64)
    params = {k: v.detach() for k, v in gru.named_parameters()}

    def loss(p, h, xi):
        out, hn = functional_call(gru, p, (xi.unsqueeze(1), h))
        return (out * out).sum() + hn.sum()

    x = torch.randn(N, 5, 3, dtype=torch.float64)
    got = engine.vmap(engine.grad(loss, argnums=(0, 1)), in_dims=(None, None, 0))(params, h0, x)
    for i in range(N):
        p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        h = h0.clone().requires_grad_(True)
        grads = torch.autograd.grad(loss(p, h, x[i]), [*p.values(), h])
        for j, k in enumerate(params):
            torch.testing.assert_close(got[0][k][i], grads[j])
        torch.testing.assert_close(got[1][i], grads[-1])


def test_embedding_bag_offsets_and_per_sample_weights():
    weight = torch.randn(10, 4, dtype=torch.float64)
    idx = torch.randint(0, 10, (N, 7))
    offsets = torch.tensor([0, 3, 7])
    psw = torch.rand(N, 7, dtype=torch.float64)

    def loss(w, i, s):
        out = nn.functional.embedding_bag(i, w, offsets, mode="sum", per_sample_weights=s, include_last_offset=True)
        return (out ** 2).sum()

    got = engine.vmap(engine.grad(loss, argnums=(0, 2)), in_dims=(None, 0, 0))(weight, idx, psw)
    for b in range(N):
        w, s = weight.clone().requires_grad_(True), psw[b].clone().requires_grad_(True)
        gw, gs = torch.autograd.grad(loss(w, idx[b], s), (w, s))
        torch.testing.assert_close(got[0][b], gw)
        torch.testing.assert_close(got[1][b], gs)


def test_attention_with_a_mask_and_dropout_zero_is_not_random():
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    params = {k: v.detach() for k, v in mha.named_parameters()}

    def loss(p, xi):
        out, _ = functional_call(mha, p, (xi[None], xi[None], xi[None]), {"attn_mask": mask, "need_weights": False})
        return (out ** 2).sum()

    x = torch.randn(N, 5, 8, dtype=torch.float64)
    got = engine.vmap(engine.grad(loss), in_dims=(None, 0), randomness="error")(params, x)
    torch.testing.assert_close(got, _loop(loss, params, x))


def test_integer_indexing_is_traceable_and_boolean_masks_are_not():
    W = torch.randn(10, 4)
    idx = torch.randint(0, 10, (N, 6))
    f = engine.trace(engine.vmap(engine.grad(lambda w, i: (w[i] ** 2).sum()), in_dims=(None, 0)))
    expected = torch.stack([2 * torch.zeros_like(W).index_add(0, i, W[i]) for i in idx])
    torch.testing.assert_close(f(W, idx), expected)
    with pytest.raises(engine.UntraceableError, match="index"):
        engine.trace(lambda w: w[w > 0].sum())(W)


@pytest.mark.slow
def test_compiled_per_sample_grads_with_embedding(monkeypatch):
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.join(root, ".inductor-cache"))
    model = nn.Sequential(nn.Embedding(20, 8), nn.Flatten(), nn.Linear(8 * 5, 3))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return nn.functional.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    x, y = torch.randint(0, 20, (6, 5)), torch.randint(0, 3, (6,))
    compiled = engine.compile(engine.vmap(engine.grad(loss), in_dims=(None, 0, 0)))
    expected = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    torch.testing.assert_close(compiled(params, x, y), expected, atol=1e-5, rtol=1e-5)


def test_lstm_per_sample_gradients_replay_bit_for_bit_under_automatic_tracing():
    """Two things kept nn.LSTM eager under automatic tracing: every call through functional_call
    left the module new weight-cache lists (`_flat_weights`), which the guard saw as state changed
    while it ran; and oneDNN's LSTM kernel rounds differently under no_grad, where replays run. The
    cache is handed back as it was, and the kernel is replayed in the grad mode it was recorded in."""
    import gc

    from engine.autotrace import AutoTraced

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(100, 100, batch_first=True)  # wide enough for the two primitives to round apart
    flat_before = lstm.__dict__["_flat_weights"]
    params = {k: v.detach() for k, v in lstm.named_parameters()}
    x = torch.randn(4, 8, 100)

    def loss(p, xi):
        return torch.func.functional_call(lstm, p, (xi.unsqueeze(0),))[0].square().sum()

    # (type(), not isinstance(): another test may leave a weakref proxy whose object is gone, and
    # isinstance reads the proxy's __class__, which raises)
    before = {id(o) for o in gc.get_objects() if issubclass(type(o), AutoTraced)}
    psg = engine.vmap(engine.grad(loss), in_dims=(None, 0))
    with engine.auto_tracing(False):
        eager = psg(params, x)
    replays = [psg(params, x) for _ in range(5)]
    assert lstm.__dict__["_flat_weights"] is flat_before
    assert all(i is j for i, j in zip(flat_before, lstm._parameters.values()))
    (auto,) = [o for o in gc.get_objects() if issubclass(type(o), AutoTraced) and id(o) not in before]
    assert auto.impure is None and auto.traced._hits >= 2, (auto.impure, auto.traced._hits)
    for out in replays:
        for k in eager:
            assert torch.equal(out[k], eager[k]), k


_CONVS = {
    "conv1d": (lambda: nn.Conv1d(3, 4, 3), (3, 9)),
    "conv2d_stride_padding_groups": (lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (4, 7, 7)),
    "conv2d_no_bias_dilation": (lambda: nn.Conv2d(3, 5, 3, dilation=2, bias=False), (3, 9, 8)),
    "conv3d": (lambda: nn.Conv3d(2, 3, 2), (2, 4, 4, 3)),
    "conv_transpose2d_groups": (lambda: nn.ConvTranspose2d(4, 2, 3, stride=2, groups=2, output_padding=1), (4, 5, 5)),
    "conv_transpose1d_no_bias": (lambda: nn.ConvTranspose1d(3, 5, 3, bias=False), (3, 6)),
}


@pytest.mark.parametrize("with_n", [True, False], ids=["with_n", "unbatched_element"])
@pytest.mark.parametrize("name", sorted(_CONVS))
def test_conv_backward_with_a_shared_weight_matches_the_loop(name, with_n):
    """Per-sample gradients of a convolution w.r.t. its parameters and its input at once: the rule
    for a weight shared by the batch computes the input's gradient as one plain convolution backward
    and only the weight's and bias's by the groups trick (with a shape-only stand-in weight)."""
    torch.manual_seed(0)
    make, shape = _CONVS[name]
    layer = make().double()
    params = {k: v.detach() for k, v in layer.named_parameters()}
    x = torch.randn(4, *shape, dtype=torch.float64)

    def loss(p: dict, xi: torch.Tensor) -> torch.Tensor:
        out = functional_call(layer, p, (xi.unsqueeze(0) if with_n else xi,))
        return (out.sin() * out).sum()

    with engine.fallback_policy("error"), engine.auto_tracing(False):
        got = engine.vmap(engine.grad(loss, argnums=(0, 1)), in_dims=(None, 0))(params, x)
    for i in range(x.shape[0]):
        want = torch.func.grad(loss, argnums=(0, 1))(params, x[i])
        torch.testing.assert_close(got[1][i], want[1])
        for k in params:
            torch.testing.assert_close(got[0][k][i], want[0][k])
