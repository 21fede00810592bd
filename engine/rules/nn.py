"""torch.nn.functional family: convolution batched in one call instead of a loop.

Only the input batched: the batch folds into the convolution's own batch dim. The weight batched:
the batch folds into channels and `groups` grows by B (each batch element is its own group set),
which works for plain and transposed convolutions alike. The backward of a weight shared by the
batch (per-sample gradients) needs the groups trick for the weight's and bias's gradients only: the
input's is one plain convolution backward with the batch in N.
"""
from __future__ import annotations

import functools

import torch

from engine.rules._helpers import lrank, materialize, ops_of, pad_batched
from engine.rules._table import RULES

aten = torch.ops.aten


def convolution_rule(info, in_dims, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    xd, wd = in_dims[0], in_dims[1]
    bd = in_dims[2] if len(in_dims) > 2 else None
    B = info.batch_size
    if wd is None and bd is None:
        # x: [B, N, C, *spatial] -> [B*N, C, *spatial]; unbatched (no N) inputs are [B, C, *spatial] already.
        unbatched_input = x.dim() == weight.dim()
        xx = x if unbatched_input else x.flatten(0, 1)
        out = aten.convolution.default(xx, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        if not unbatched_input:
            out = out.unflatten(0, (B, x.shape[1]))
        return out, 0
    xm = materialize(x, xd, B)                                    # [B, N, C, *s] or [B, C, *s]
    unbatched_input = xm.dim() - 1 == weight.dim() - (wd is not None) - 1   # logical input has no N dim
    if unbatched_input:
        xm = xm.unsqueeze(1)
    xf = xm.transpose(0, 1).flatten(1, 2)                         # [N, B*C, *s]
    wm = materialize(weight, wd, B)                               # [B, O, C/g, *k] (or [B, C, O/g, *k] transposed)
    wf = wm.flatten(0, 1)
    bf = None
    if bias is not None:
        bf = materialize(bias, bd, B).flatten(0, 1)
    out = aten.convolution.default(xf, wf, bf, stride, padding, dilation, transposed, output_padding, groups * B)
    out = out.unflatten(1, (B, -1))                               # [N, B, O, *s]
    if unbatched_input:
        return out.squeeze(0), 0
    return out, 1


RULES[aten.convolution.default] = convolution_rule


def _fold_into_n(op, spatial: int):
    """Pooling-style ops take [N, C, *spatial] or [C, *spatial]: the batch becomes (part of) N."""

    def rule(info, in_dims, *args, **kwargs):
        B = info.batch_size
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ref = tensors[0]
        has_n = lrank(args[ref], in_dims[ref]) == spatial + 2
        new = list(args)
        n = None
        for i in tensors:
            # contiguous: some CPU pooling backward kernels index raw memory and crash on
            # expanded (stride-0) inputs.
            t = materialize(args[i], in_dims[i], B).contiguous()
            if has_n:
                n = t.shape[1]
                t = t.flatten(0, 1)
            new[i] = t
        out = op(*new, **kwargs)
        if not has_n:
            return out, (tuple(0 for _ in out) if isinstance(out, tuple) else 0)
        if isinstance(out, tuple):
            return tuple(o.unflatten(0, (B, n)) for o in out), tuple(0 for _ in out)
        return out.unflatten(0, (B, n)), 0

    return rule


_POOLS = {
    1: ["avg_pool1d.default", "adaptive_max_pool1d.default"],
    2: ["avg_pool2d.default", "avg_pool2d_backward.default", "max_pool2d_with_indices.default",
        "max_pool2d_with_indices_backward.default", "_adaptive_avg_pool2d.default", "_adaptive_avg_pool2d_backward.default",
        "adaptive_max_pool2d.default", "adaptive_max_pool2d_backward.default", "upsample_nearest2d.default",
        "upsample_bilinear2d.default", "reflection_pad2d.default", "replication_pad2d.default"],
    3: ["avg_pool3d.default", "avg_pool3d_backward.default", "max_pool3d_with_indices.default",
        "max_pool3d_with_indices_backward.default", "_adaptive_avg_pool3d.default", "_adaptive_avg_pool3d_backward.default",
        "adaptive_max_pool3d.default", "adaptive_max_pool3d_backward.default"],
}
for _spatial, _names in _POOLS.items():
    for _op in ops_of(*_names):
        RULES[_op] = _fold_into_n(_op, _spatial)


def convolution_backward_rule(info, in_dims, grad_out, x, weight, bias_sizes, stride, padding, dilation, transposed,
                              output_padding, groups, output_mask):
    """The forward's groups trick applied to the backward: batch folded into channels, groups * B.

    grad_input comes back as [N, B*C, ...] and grad_weight / grad_bias as [B*O, ...], so each batch
    element keeps its own weight gradient (folding into N would sum them)."""
    B = info.batch_size
    wd = in_dims[2]
    no_n = x.dim() - (in_dims[1] is not None) == weight.dim() - (wd is not None) - 1
    go = materialize(grad_out, in_dims[0], B)
    xm = materialize(x, in_dims[1], B)
    if no_n:
        go, xm = go.unsqueeze(1), xm.unsqueeze(1)
    bsz = None if bias_sizes is None else [B * bias_sizes[0]]
    if wd is None:
        return _backward_of_a_shared_weight(B, no_n, go, xm, weight, bsz, stride, padding, dilation,
                                            transposed, output_padding, groups, output_mask)
    wf = materialize(weight, wd, B).flatten(0, 1)
    gi, gw, gb = aten.convolution_backward.default(_groups_form(go), _groups_form(xm), wf, bsz, stride, padding,
                                                   dilation, transposed, output_padding, groups * B, output_mask)
    if gi is not None:  # [N, B*C, *s]
        gi = gi.unflatten(1, (B, -1))
        gi = (gi.squeeze(0), 0) if no_n else (gi, 1)
    return _backward_outputs(B, gi, gw, gb)


def _groups_form(t: torch.Tensor) -> torch.Tensor:
    """[B, N, C, *s] -> [N, B*C, *s]: each batch element's channels a group set of their own."""
    return t.transpose(0, 1).flatten(1, 2)


def _backward_of_a_shared_weight(B, no_n, go, xm, weight, bsz, stride, padding, dilation, transposed,
                                 output_padding, groups, output_mask):
    """An unbatched weight (per-sample gradients of a model: vmap over the examples): the input's
    gradient is one plain convolution backward with the batch folded into N (the weight is the same
    for every element); only the weight's and bias's gradients need the groups trick, for which the
    kernel reads no weight values (its shape only: an expanded one-element tensor stands for the
    B copies). The groups form of the input gradient is slower than the plain one on large convolutions,
    and so is materializing B copies of the weight."""
    gi = gw = gb = None
    if output_mask[0]:
        gi = aten.convolution_backward.default(go.flatten(0, 1), xm.flatten(0, 1), weight, None, stride, padding,
                                               dilation, transposed, output_padding, groups, [True, False, False])[0]
        gi = gi.unflatten(0, (B, -1))                             # [B, N, C, *s]
        gi = (gi.squeeze(1), 0) if no_n else (gi, 0)
    if output_mask[1] or output_mask[2]:
        shape = (B * weight.shape[0], *weight.shape[1:])
        stand_in = weight.new_empty(()).expand(shape)
        _, gw, gb = aten.convolution_backward.default(_groups_form(go), _groups_form(xm), stand_in, bsz, stride,
                                                      padding, dilation, transposed, output_padding, groups * B,
                                                      [False, output_mask[1], output_mask[2]])
    return _backward_outputs(B, gi, gw, gb)


def _backward_outputs(B, gi, gw, gb):
    """(grad_input as (tensor, batch dim) or None, grad_weight [B*O, ...], grad_bias [B*O]) as the
    rule's outputs and their batch dims."""
    outs, dims = [gi[0] if gi is not None else None], [gi[1] if gi is not None else None]
    outs.append(None if gw is None else gw.unflatten(0, (B, -1)))
    dims.append(None if gw is None else 0)
    outs.append(None if gb is None else gb.unflatten(0, (B, -1)))
    dims.append(None if gb is None else 0)
    return tuple(outs), tuple(dims)


RULES[aten.convolution_backward.default] = convolution_backward_rule


def native_layer_norm_rule(info, in_dims, x, normalized_shape, weight, bias, eps):
    """Normalization runs over trailing dims, so the leading batch dim needs nothing; a batched
    affine weight/bias is applied after an unweighted normalization."""
    B = info.batch_size
    xm = materialize(x, in_dims[0], B)
    wd = in_dims[2] if len(in_dims) > 2 else None
    bd = in_dims[3] if len(in_dims) > 3 else None
    if wd is None and bd is None:
        return aten.native_layer_norm.default(xm, normalized_shape, weight, bias, eps), (0, 0, 0)
    out, mean, rstd = aten.native_layer_norm.default(xm, normalized_shape, None, None, eps)
    rank = xm.dim() - 1
    if weight is not None:
        out = out * (pad_batched(weight, rank) if wd is not None else weight)
    if bias is not None:
        out = out + (pad_batched(bias, rank) if bd is not None else bias)
    return (out, mean, rstd), (0, 0, 0)


RULES[aten.native_layer_norm.default] = native_layer_norm_rule


# nll_loss takes self [N, C] or [C] and target [N] or []: the batch folds into N and the op runs once
# with reduction 'none'; the reduction is then done per batch element. (Its decomposition runs ~20
# ops of gather/where on the batched wrapper, the whole cost of cross_entropy in per-sample grads.)
_NONE, _MEAN, _SUM = 0, 1, 2


def _nll_fold(info, in_dims, x, target):
    """x as [B*N, C] and target as [B*N]; returns them with N (1 when the logical input is [C])."""
    B = info.batch_size
    xm, tm = materialize(x, in_dims[0], B), materialize(target, in_dims[1], B)
    has_n = xm.dim() == 3
    n = xm.shape[1] if has_n else 1
    return xm.reshape(B * n, xm.shape[-1]), tm.reshape(B * n), n, has_n


def _nll_weights(info, weight, wd, target, ignore_index, n, dtype):
    """Per batch element and position, the class weight of its target, 0 where ignored ([B, n])."""
    B = info.batch_size
    kept = (target != ignore_index).reshape(B, n)
    if weight is None:
        return kept.to(dtype)
    safe = torch.where(kept, target.reshape(B, n), 0)
    return torch.gather(materialize(weight, wd, B), 1, safe) * kept


def nll_loss_forward_rule(info, in_dims, x, target, weight, reduction, ignore_index):
    B = info.batch_size
    xf, tf, n, has_n = _nll_fold(info, in_dims, x, target)
    w = _nll_weights(info, weight, in_dims[2], tf, ignore_index, n, x.dtype)
    per = aten.nll_loss_forward.default(xf, tf, None, _NONE, ignore_index)[0].reshape(B, n) * w
    total = w.sum(1)
    if reduction == _NONE:
        if has_n:  # PyTorch's total_weight is 0 here
            return (per, torch.zeros((), dtype=x.dtype, device=x.device)), (0, None)
        return (per.reshape(B), total), (0, 0)
    out = per.sum(1)
    if reduction == _MEAN:
        out = out / total
    return (out, total), (0, 0)


def nll_loss_backward_rule(info, in_dims, grad_out, x, target, weight, reduction, ignore_index, total_weight):
    B = info.batch_size
    xf, tf, n, _ = _nll_fold(info, in_dims[1:3], x, target)
    g = materialize(grad_out, in_dims[0], B)
    if reduction == _NONE:
        g = g.reshape(B, n)
    else:
        if reduction == _MEAN:
            g = g / materialize(total_weight, in_dims[6], B)
        g = g.reshape(B, 1)
    g = g * _nll_weights(info, weight, in_dims[3], tf, ignore_index, n, x.dtype)
    one = torch.ones((), dtype=x.dtype, device=x.device)
    gi = aten.nll_loss_backward.default(g.reshape(B * n), xf, tf, None, _NONE, ignore_index, one)
    return gi.reshape(materialize(x, in_dims[1], B).shape), 0


RULES[aten.nll_loss_forward.default] = nll_loss_forward_rule
RULES[aten.nll_loss_backward.default] = nll_loss_backward_rule


# binary_cross_entropy_with_logits: its decomposition runs about ten ops on the batched wrapper
# (the loss of torch.distributions' Bernoulli and of logistic models). The kernel runs once on
# every operand broadcast to the examples' common shape with reduction 'none', and the reduction
# is then done per batch element. Target, weight and pos_weight broadcast to the input's shape; an
# input that would itself broadcast is refused (below).
def _broadcast_operands(B: int, operands: list) -> tuple[list, tuple]:
    """The (tensor, in_dim) operands of a pointwise loss, batched ones padded to a common rank, and
    the shape [B, *the examples' common shape] they broadcast to."""
    rank = max(t.dim() - (d is not None) for t, d in operands)
    padded = [pad_batched(t, rank) if d is not None else t for t, d in operands]
    # (torch._C._infer_size: torch.broadcast_shapes imports torch's symbolic-shape module)
    shape = (B, *functools.reduce(torch._C._infer_size, [p.shape[1:] if d is not None else p.shape
                                                        for p, (_, d) in zip(padded, operands)]))
    return padded, shape


def _reduced_per_element(loss, reduction):
    """A [B, ...] loss of reduction 'none' reduced per batch element, as `reduction` asks."""
    if reduction == _NONE or loss.dim() == 1:
        return loss, 0
    dims = tuple(range(1, loss.dim()))
    return (loss.mean(dims) if reduction == _MEAN else loss.sum(dims)), 0


def binary_cross_entropy_with_logits_rule(info, in_dims, x, target, weight=None, pos_weight=None, reduction=_MEAN):
    operands = [(x, in_dims[0]), (target, in_dims[1])]
    operands += [(t, d) for t, d in zip((weight, pos_weight), in_dims[2:4]) if t is not None]
    padded, shape = _broadcast_operands(info.batch_size, operands)
    logical = list(x.shape[1:] if in_dims[0] is not None else x.shape)
    if list(shape[1:]) != logical:
        # torch's backward formula for an input smaller than the loss (it sums the input's gradient
        # over the broadcast dims without the mean's share) differs from torch.func's gradient
        raise RuntimeError(
            f"binary_cross_entropy_with_logits: the input's shape {logical} broadcasts to the loss's "
            f"{list(shape[1:])}, and its gradient would not be torch.func's. Give the input the target's "
            "shape, as torch.nn.functional.binary_cross_entropy_with_logits requires.")
    xe, te = padded[0].expand(shape), padded[1].expand(shape)
    w = padded[2] if weight is not None else None
    pw = padded[-1] if pos_weight is not None else None
    return _reduced_per_element(aten.binary_cross_entropy_with_logits.default(xe, te, w, pw, _NONE), reduction)


RULES[aten.binary_cross_entropy_with_logits.default] = binary_cross_entropy_with_logits_rule


# mse_loss: its Python decomposition (which imports torch's symbolic-shape module at its first
# call) runs on the batched wrapper otherwise. The kernel runs once on both operands broadcast to
# the examples' common shape with reduction 'none', and the reduction is done per batch element;
# the backward computes the kernel's own formula, 2 (input - target) grad, over each example's
# input size for 'mean'.
def _mse_operands(info, in_dims, x, target):
    (xp, tp), shape = _broadcast_operands(info.batch_size, [(x, in_dims[0]), (target, in_dims[1])])
    return xp, tp, shape


def mse_loss_rule(info, in_dims, x, target, reduction=_MEAN):
    xp, tp, shape = _mse_operands(info, in_dims, x, target)
    return _reduced_per_element(aten.mse_loss.default(xp.expand(shape), tp.expand(shape), _NONE), reduction)


def mse_loss_backward_rule(info, in_dims, grad, x, target, reduction):
    B = info.batch_size
    xp, tp, shape = _mse_operands(info, in_dims[1:3], x, target)
    g = materialize(grad, in_dims[0], B)
    g = g.reshape((B,) + (1,) * (len(shape) - 1)) if reduction != _NONE else pad_batched(g, len(shape) - 1)
    numel = 1
    for s in (x.shape[1:] if in_dims[1] is not None else x.shape):
        numel *= s
    norm = 2.0 / numel if reduction == _MEAN else 2.0
    return norm * (xp - tp) * g, 0


RULES[aten.mse_loss.default] = mse_loss_rule
RULES[aten.mse_loss_backward.default] = mse_loss_backward_rule
