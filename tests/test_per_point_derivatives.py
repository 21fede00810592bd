"""Per-point derivatives through each functional layer, against an explicit loop.

`vmap(jacrev(f))` and `vmap(jacfwd(f))` nest two batching levels: the inner one (the basis of
cotangents or tangents) meets tensors batched only by the outer one (the points), and the rules
see operands of different batching, unbatched saved statistics, expanded views. The OpInfo
conformance suite batches one level at a time; this table runs each layer of torch.nn.functional
(and a few tensor ops such layers are built from) on a small fresh net through jacrev, vmap(jacrev),
vmap(jacfwd), hessian and vmap(hessian), each against `torch.autograd.functional` per point.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import engine

_g = torch.Generator().manual_seed(5)


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_g)


W6 = _r(6, 6)
CONV1, CONV2, CONV3, CONVT = _r(3, 2, 3), _r(3, 2, 3, 3), _r(2, 1, 2, 2, 2), _r(2, 3, 3)
EMB = _r(10, 4)
BILINEAR = _r(2, 3, 3)
AFFINE_W, AFFINE_B = _r(6), _r(6)


def lin(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ W6.T)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return lin(x).reshape(2, 3)


# name -> f(x: [6]) -> tensor
LAYERS = {
    # activations: their backward is a pointwise op of the cotangent and the input
    "gelu": lambda x: F.gelu(lin(x) * 2),
    "gelu_tanh": lambda x: F.gelu(lin(x) * 2, approximate="tanh"),
    "silu_softplus_elu": lambda x: torch.cat([F.silu(x), F.softplus(x), F.elu(x)]),
    "mish_hardswish_hardsigmoid": lambda x: torch.cat([F.mish(x), F.hardswish(x * 3), F.hardsigmoid(x * 3)]),
    "relu_leaky_hardtanh_logsigmoid": lambda x: torch.cat([F.relu(x), F.leaky_relu(x), F.hardtanh(x * 2), F.logsigmoid(x)]),
    "shrinks_and_friends": lambda x: torch.cat([F.softsign(x), F.tanhshrink(x), F.softshrink(x, 0.3), F.hardshrink(x, 0.3),
                                                F.threshold(x, 0.1, 2.0), F.relu6(x * 4), F.selu(x), F.celu(x, 0.5)]),
    "glu_prelu": lambda x: torch.cat([F.glu(lin(x)), F.prelu(x.reshape(2, 3), torch.tensor([0.2, 0.3, 0.1])).flatten()]),
    "dropouts_eval": lambda x: torch.cat([F.dropout(lin(x), 0.5, training=False), F.alpha_dropout(lin(x), 0.5, training=False)]),
    # normalizations: their backward kernels read saved statistics
    "layer_norm": lambda x: F.layer_norm(lin(x), (6,), AFFINE_W, AFFINE_B),
    "layer_norm_plain": lambda x: F.layer_norm(lin(x), (6,)),
    "layer_norm_rows": lambda x: F.layer_norm(_rows(x), (3,), AFFINE_W[:3], AFFINE_B[:3]).flatten(),
    "layer_norm_after_linear": lambda x: F.layer_norm(x @ W6.T, (6,), AFFINE_W, AFFINE_B),
    "layer_norm_of_the_input": lambda x: F.layer_norm(x, (6,)),
    "layer_norm_2d": lambda x: F.layer_norm(torch.cat([lin(x), x]).reshape(2, 2, 3), (2, 3)).flatten(),
    "rms_norm": lambda x: F.rms_norm(_rows(x), (3,), torch.tensor([1.0, 2.0, 0.5])).flatten(),
    "group_norm": lambda x: F.group_norm(lin(x).reshape(1, 6, 1), 2, AFFINE_W, AFFINE_B).flatten(),
    "group_norm_4": lambda x: F.group_norm(torch.cat([lin(x), x]).reshape(1, 4, 3), 2, AFFINE_W[:4], AFFINE_B[:4]).flatten(),
    "instance_norm": lambda x: F.instance_norm(lin(x).reshape(1, 2, 3)).flatten(),
    "instance_norm_affine": lambda x: F.instance_norm(torch.cat([lin(x), x]).reshape(1, 2, 6), weight=AFFINE_W[:2],
                                                      bias=AFFINE_B[:2]).flatten(),
    "batch_norm_eval": lambda x: F.batch_norm(_rows(x), AFFINE_B[:3], AFFINE_W[:3].abs() + 0.5, AFFINE_W[3:], AFFINE_B[3:]).flatten(),
    "batch_norm_train": lambda x: F.batch_norm(torch.cat([lin(x), x]).reshape(4, 3), None, None, training=True).flatten(),
    "local_response_norm": lambda x: F.local_response_norm(lin(x).reshape(1, 3, 2), 2).flatten(),
    "normalize_cosine": lambda x: torch.cat([F.normalize(_rows(x), dim=1).flatten(), F.cosine_similarity(_rows(x), x.reshape(2, 3))]),
    # convolutions and pooling
    "conv1d": lambda x: F.conv1d(x.reshape(1, 2, 3), CONV1, padding=1).flatten(),
    "conv1d_strided_dilated": lambda x: F.conv1d(x.reshape(1, 2, 3), CONV1, padding=2, stride=2, dilation=2).flatten(),
    "conv2d": lambda x: F.conv2d(torch.cat([x, x]).reshape(1, 2, 2, 3), CONV2, padding=1).flatten(),
    "conv3d": lambda x: F.conv3d(x.reshape(1, 1, 1, 2, 3), CONV3, padding=1).flatten(),
    "conv_transpose1d": lambda x: F.conv_transpose1d(x.reshape(1, 2, 3), CONVT, stride=2).flatten(),
    "max_pool1d_2d_3d": lambda x: torch.cat([F.max_pool1d(lin(x).reshape(1, 2, 3), 2, 1).flatten(),
                                             F.max_pool2d(lin(x).reshape(1, 1, 2, 3), 2, 1).flatten(),
                                             F.max_pool3d(lin(x).reshape(1, 1, 1, 2, 3), (1, 2, 2), 1).flatten()]),
    "avg_pools": lambda x: torch.cat([F.avg_pool2d(lin(x).reshape(1, 1, 2, 3), 2, 1, count_include_pad=False).flatten(),
                                      F.avg_pool3d(lin(x).reshape(1, 1, 1, 2, 3), (1, 2, 2), 1).flatten(),
                                      F.avg_pool1d(lin(x).reshape(1, 1, 6), 3, 2, 1, ceil_mode=True).flatten()]),
    "adaptive_pools": lambda x: torch.cat([F.adaptive_avg_pool1d(lin(x).reshape(1, 1, 6), 4).flatten(),
                                           F.adaptive_max_pool1d(lin(x).reshape(1, 1, 6), 4).flatten(),
                                           F.adaptive_avg_pool2d(lin(x).reshape(1, 1, 2, 3), (1, 2)).flatten(),
                                           F.adaptive_max_pool2d(lin(x).reshape(1, 1, 2, 3), (1, 2)).flatten()]),
    "lp_pool1d": lambda x: F.lp_pool1d(lin(x).reshape(1, 1, 6).abs() + 0.1, 2, 2).flatten(),
    "max_unpool1d": lambda x: F.max_unpool1d(*F.max_pool1d(lin(x).reshape(1, 1, 6), 2, return_indices=True), 2).flatten(),
    # resampling and rearranging
    "interpolate_nearest_linear": lambda x: torch.cat([F.interpolate(lin(x).reshape(1, 1, 6), scale_factor=2).flatten(),
                                                       F.interpolate(lin(x).reshape(1, 1, 6), scale_factor=2, mode="linear").flatten(),
                                                       F.interpolate(lin(x).reshape(1, 1, 6), size=4, mode="area").flatten()]),
    "interpolate_bilinear_bicubic_trilinear": lambda x: torch.cat([
        F.interpolate(lin(x).reshape(1, 1, 2, 3), scale_factor=2, mode="bilinear").flatten(),
        F.interpolate(lin(x).reshape(1, 1, 2, 3), size=(3, 4), mode="bicubic", align_corners=True).flatten(),
        F.interpolate(lin(x).reshape(1, 1, 1, 2, 3), scale_factor=(1, 2, 1), mode="trilinear").flatten()]),
    "pads": lambda x: torch.cat([F.pad(lin(x).reshape(1, 1, 6), (2, 2), mode="reflect").flatten(),
                                 F.pad(lin(x).reshape(1, 1, 6), (2, 1), mode="replicate").flatten(),
                                 F.pad(lin(x).reshape(1, 1, 6), (2, 1), mode="circular").flatten()]),
    "pixel_and_channel_shuffles": lambda x: torch.cat([
        F.pixel_shuffle(torch.cat([x, x]).reshape(1, 4, 3, 1), 2).flatten(),
        F.pixel_unshuffle(torch.cat([lin(x), x]).reshape(1, 1, 4, 3)[:, :, :, :2], 2).flatten(),
        F.channel_shuffle(lin(x).reshape(1, 6, 1), 2).flatten()]),
    "unfold": lambda x: F.unfold(lin(x).reshape(1, 1, 2, 3), 2).flatten(),
    "grid_sample_affine_grid": lambda x: torch.cat([
        F.grid_sample(lin(x).reshape(1, 1, 2, 3), torch.tanh(x[:4]).reshape(1, 1, 2, 2), align_corners=False).flatten(),
        F.affine_grid(lin(x).reshape(1, 2, 3), [1, 1, 2, 2], align_corners=False).flatten()]),
    # embeddings and indexing
    "embedding": lambda x: torch.cat([(EMB[torch.tensor([1, 3, 3, 7])] * lin(x)[:4, None]).flatten(),
                                      F.embedding(torch.tensor([1, 3, 3]), EMB * x[0]).flatten()]),
    "embedding_bag": lambda x: F.embedding_bag(torch.tensor([1, 2, 4, 5, 4]), EMB * x[0] + x[1], torch.tensor([0, 2]),
                                               mode="mean").flatten(),
    "index_put_scatter": lambda x: torch.cat([
        torch.zeros(8).index_put((torch.tensor([1, 3, 3]),), lin(x)[:3], accumulate=True),
        torch.zeros(4).scatter_add(0, torch.tensor([0, 1, 1, 3, 2, 0]), lin(x)),
        torch.zeros(4).scatter_reduce(0, torch.tensor([0, 1, 1, 3, 2, 0]), lin(x), "amax", include_self=False)]),
    "gather_select_mask": lambda x: torch.cat([
        torch.gather(_rows(x), 1, torch.tensor([[0, 2], [1, 1]])).flatten(), lin(x).index_select(0, torch.tensor([5, 0, 0])),
        lin(x).masked_select(torch.tensor([1, 0, 1, 1, 0, 1], dtype=torch.bool))]),
    # reductions, scans, sorting
    "softmax_log_softmax_softmin": lambda x: torch.cat([F.softmax(lin(x), -1), F.log_softmax(_rows(x), 0).flatten(), F.softmin(lin(x), 0)]),
    "scans": lambda x: torch.cat([lin(x).cumsum(0), lin(x).cumprod(0), torch.logcumsumexp(lin(x), 0), torch.cummax(lin(x), 0)[0]]),
    "sort_topk_order_stats": lambda x: torch.cat([lin(x).sort()[0], lin(x).topk(2)[0],
                                                  torch.stack([lin(x).kthvalue(2)[0], lin(x).median(), lin(x).nanmedian()])]),
    "reductions": lambda x: torch.cat([_rows(x).max(1)[0], _rows(x).amin(0), _rows(x).logsumexp(1), _rows(x).prod(1),
                                       torch.stack([lin(x).std(), lin(x).var(correction=0), lin(x).norm(),
                                                    torch.linalg.vector_norm(lin(x), 3), torch.linalg.matrix_norm(_rows(x))])]),
    "distances": lambda x: torch.cat([F.pdist(lin(x).reshape(3, 2)), torch.cdist(lin(x).reshape(3, 2), x.reshape(3, 2)).flatten(),
                                      F.pairwise_distance(_rows(x), x.reshape(2, 3))]),
    # attention and recurrent cells
    "attention": lambda x: torch.cat([
        F.scaled_dot_product_attention(lin(x).reshape(1, 2, 3), x.reshape(1, 2, 3), lin(x).reshape(1, 2, 3)).flatten(),
        F.scaled_dot_product_attention(lin(x).reshape(1, 2, 3), x.reshape(1, 2, 3), lin(x).reshape(1, 2, 3), is_causal=True).flatten()]),
    "rnn_cells": lambda x: torch.cat([
        torch._VF.gru_cell(x.reshape(2, 3), _rows(x), W6[:, :3].repeat(2, 1)[:9], W6[:, 3:].repeat(2, 1)[:9], None, None).flatten(),
        torch._VF.lstm_cell(x.reshape(2, 3), (_rows(x), x.reshape(2, 3)), W6[:, :3].repeat(2, 1), W6[:, 3:].repeat(2, 1), None, None)[1].flatten(),
        torch._VF.rnn_tanh_cell(x.reshape(2, 3), _rows(x), W6[:3, :3], W6[3:, 3:], None, None).flatten()]),
    "bilinear_einsum_baddbmm": lambda x: torch.cat([
        F.bilinear(x.reshape(2, 3), _rows(x), BILINEAR).flatten(), torch.einsum("ij,jk,k->i", _rows(x), W6[:3, :3], x[:3]),
        torch.baddbmm(x.reshape(1, 2, 3)[:, :, :2], lin(x).reshape(1, 2, 3), x.reshape(1, 3, 2)).flatten()]),
    # losses, unreduced
    "regression_losses": lambda x: torch.cat([
        F.mse_loss(lin(x), x, reduction="none"), F.huber_loss(lin(x), x * 2, reduction="none", delta=0.5),
        F.smooth_l1_loss(lin(x), x * 2, reduction="none", beta=0.5), F.l1_loss(lin(x), x * 0.5, reduction="none"),
        F.gaussian_nll_loss(lin(x), x, torch.full((6,), 0.5) + x.abs(), reduction="none"),
        F.poisson_nll_loss(lin(x), x.abs(), reduction="none")]),
    "classification_losses": lambda x: torch.cat([
        F.cross_entropy(_rows(x), torch.tensor([0, 2]), label_smoothing=0.1, reduction="none"),
        F.nll_loss(F.log_softmax(_rows(x), 1), torch.tensor([1, 2]), reduction="none"),
        F.binary_cross_entropy(torch.sigmoid(lin(x)), torch.full((6,), 0.3), reduction="none"),
        F.binary_cross_entropy_with_logits(lin(x), torch.full((6,), 0.3), pos_weight=torch.full((6,), 2.0), reduction="none"),
        F.kl_div(F.log_softmax(lin(x), 0), F.softmax(x, 0), reduction="none"),
        F.multi_margin_loss(_rows(x), torch.tensor([0, 2]), reduction="none"),
        F.multilabel_soft_margin_loss(_rows(x), torch.tensor([[0.0, 1, 1], [1, 0, 0]]), reduction="none")]),
    "margin_losses": lambda x: torch.cat([
        F.triplet_margin_loss(_rows(x), x.reshape(2, 3), x.reshape(2, 3).flip(0), reduction="none"),
        F.margin_ranking_loss(lin(x), x, torch.sign(x), reduction="none"),
        F.hinge_embedding_loss(lin(x), torch.sign(x), reduction="none"),
        F.cosine_embedding_loss(_rows(x), x.reshape(2, 3), torch.tensor([1.0, -1.0]), reduction="none")]),
    "ctc_loss": lambda x: F.ctc_loss(F.log_softmax(lin(x).reshape(3, 1, 2), 2), torch.tensor([[1]]), torch.tensor([3]),
                                     torch.tensor([1]), reduction="none"),
    # linear algebra, spectral, special functions
    "linalg": lambda x: torch.cat([
        torch.linalg.matrix_exp(0.3 * lin(x)[:4].reshape(2, 2)).flatten(),
        torch.linalg.inv(torch.eye(2) + 0.3 * lin(x)[:4].reshape(2, 2)).flatten(),
        torch.linalg.det(torch.eye(2) + lin(x)[:4].reshape(2, 2)).reshape(1),
        torch.linalg.slogdet(torch.eye(2) * 2 + lin(x)[:4].reshape(2, 2))[1].reshape(1),
        torch.linalg.solve(torch.eye(3) * 2 + 0.3 * lin(x).repeat(2)[:9].reshape(3, 3), x[:3]),
        torch.linalg.cholesky(torch.eye(2) * 2 + torch.outer(lin(x)[:2], lin(x)[:2])).flatten()]),
    "decompositions": lambda x: torch.cat([
        torch.linalg.qr(lin(x).reshape(3, 2) + torch.eye(3, 2))[1].flatten(),
        torch.linalg.eigvalsh(torch.diag(torch.tensor([1.0, 2.0, 3.0])) + 0.1 * (lin(x).repeat(2)[:9].reshape(3, 3)
                                                                                 + lin(x).repeat(2)[:9].reshape(3, 3).T)),
        torch.linalg.svdvals(_rows(x) + torch.eye(2, 3))]),
    "fft": lambda x: torch.cat([torch.view_as_real(torch.fft.rfft(lin(x))).flatten(),
                                torch.fft.irfft(torch.fft.rfft(lin(x)) * torch.fft.rfft(x), n=6),
                                torch.fft.fft(_rows(x), dim=1).abs().flatten()]),
    "special_and_binary": lambda x: torch.cat([
        torch.special.erfinv(0.5 * lin(x)), torch.lgamma(x.abs() + 1), torch.digamma(x.abs() + 1), torch.special.i0(lin(x)),
        torch.special.xlogy(x.abs(), lin(x).abs() + 1), torch.atan2(lin(x), x), torch.hypot(lin(x), x),
        torch.fmod(lin(x), 0.3), torch.remainder(lin(x), 0.3), torch.addcmul(x, lin(x), x, value=0.5),
        torch.lerp(x, lin(x), torch.sigmoid(x)), torch.where(x > 0, lin(x).clamp(-0.5, 0.5), x ** 2)]),
    "structure": lambda x: torch.cat([lin(x).roll(2), lin(x).flip(0), _rows(x).tril().flatten(), _rows(x).triu(1).flatten(),
                                      torch.diag_embed(lin(x)).flatten()]),
}

X = _r(4, 6)


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)


@pytest.fixture(autouse=True)
def _eager():
    """The eager engine; ops without a batching rule take the loop fallback (exact: it is the loop)."""
    with engine.auto_tracing(False), engine.fallback_policy("silent"):
        yield


def _torch_answer(compute):
    """torch's own result, or None where torch has no derivative for one of the layer's ops (its
    backward's backward is not implemented; which ops depends on the torch release)."""
    try:
        return compute()
    except (RuntimeError, NotImplementedError) as e:
        if "derivative for" not in str(e):
            raise
        return None


def _matches(call, expected) -> None:
    """The engine's result equals `expected`, or, where torch has no such derivative (None), the
    engine raises torch's error: a result equals the loop's or the call raises."""
    if expected is None:
        with pytest.raises((RuntimeError, NotImplementedError), match="derivative for"):
            call()
    else:
        _close(call(), expected)


@pytest.mark.parametrize("name", LAYERS)
def test_jacobians_per_point_match_the_loop(name):
    """The engine's forward mode is reverse mode twice (as torch.autograd.functional.jvp), so its
    jacfwd needs each op's double backward, where torch.func's jacfwd uses forward formulas."""
    f = LAYERS[name]
    loop = torch.stack([torch.autograd.functional.jacobian(f, x) for x in X])
    _close(engine.jacrev(f)(X[0]), loop[0])
    _close(engine.vmap(engine.jacrev(f))(X), loop)
    twice_reverse = _torch_answer(lambda: torch.autograd.functional.jvp(f, X[0], torch.ones(6)))
    _matches(lambda: engine.vmap(engine.jacfwd(f))(X), None if twice_reverse is None else loop)


@pytest.mark.parametrize("name", LAYERS)
def test_hessians_per_point_match_the_loop(name):
    """vmap(hessian) of a nonlinear function of the layer: the backward's cotangent then depends on
    the point, and the double backward meets three batching levels."""
    def f(x):
        return LAYERS[name](x).sin().sum()

    loop = _torch_answer(lambda: torch.stack([torch.autograd.functional.hessian(f, x) for x in X[:2]]))
    _matches(lambda: engine.vmap(engine.hessian(f))(X[:2]), loop)


@pytest.mark.parametrize("name", LAYERS)
def test_hessian_matches_the_loop(name):
    def f(x):
        return LAYERS[name](x).sum()

    _matches(lambda: engine.hessian(f)(X[0]), _torch_answer(lambda: torch.autograd.functional.hessian(f, X[0])))
