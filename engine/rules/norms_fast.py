"""Batch norm (and so instance norm) and layer norm's backward, each one kernel call for the batch.

Without these rules the three ops ran through PyTorch's decompositions: 20-40 batched ops per
layer, the largest part of a per-sample gradient of a normalized CNN or MLP.

`native_batch_norm` (+ backward): statistics and the affine parameters are per channel, reduced
over N and the spatial dims. Folding the vmap batch into the *channels* ([B, N, C, *s] ->
[N, B*C, *s]) gives each (batch element, channel) pair its own channel, so the kernel computes the
per-element statistics, output, and per-element weight/bias gradients exactly, with per-channel
vectors (weight, bias, running stats, saved stats) repeated or flattened to B*C. instance_norm
reaches this op as a batch norm over [1, N*C, *s], so it is covered too. In training mode the
kernel writes the running statistics: batched ones are updated per element; unbatched ones with a
batched input are updated by each element in turn in the loop, which `shared_running_stats_rule`
reproduces in closed form (torch.func refuses this case), as it does for a batched statistic whose
batch is expanded (stride 0: every element's buffer is the same memory, which torch.func updates in a
copy and drops): the loop updates a shared buffer once per example, in order, r <- (1 - m) r + m s_k, so after B examples r_B = (1 - m)^B r_0 + sum_k m (1 - m)^(B-1-k) s_k. The
kernel computes every m s_k at once (per-example buffers that start at zero hold exactly m s_k after
the call, with the kernel's own unbiased-variance correction), and the closed form is then written
into each shared buffer with one in-place copy per call.

`native_layer_norm_backward`: normalization is over trailing dims, so the batch is one more
leading dim for the input gradient; the kernel's weight/bias gradients would sum over the batch,
so they are computed per element from the normalized input (as engine.rules.norms does for group
norm).
"""
from __future__ import annotations

import torch

from engine.rules._helpers import materialize
from engine.rules._table import RULES

aten = torch.ops.aten


def _fold_channels(x: torch.Tensor, d, B: int) -> torch.Tensor:
    """[B, N, C, *s] (physical, batch at 0) -> [N, B*C, *s]."""
    return materialize(x, d, B).transpose(0, 1).flatten(1, 2)


def _per_channel(t, d, B: int):
    """A per-channel vector ([C], or [B, C] batched) as [B*C]; empty saved stats (eval) stay empty."""
    if t is None:
        return None
    return materialize(t, d, B).reshape(-1)


def _one_memory(t, d):
    """A batched running statistic whose batch dim has stride 0 (expanded) is one buffer that every
    element's update writes, in turn, as a loop over its elements does: it is handled as an
    unbatched shared buffer, `t[0]`, a view of that memory (None batch dim)."""
    if t is not None and d is not None and t.dim() >= 1 and t.stride(0) == 0:
        return t[0], None
    return t, d


def native_batch_norm_rule(info, in_dims, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        (running_mean, d_mean), (running_var, d_var) = _one_memory(running_mean, in_dims[3]), _one_memory(running_var, in_dims[4])
        in_dims = (*in_dims[:3], d_mean, d_var, *in_dims[5:])
    if training and any(t is not None and d is None for t, d in ((running_mean, in_dims[3]), (running_var, in_dims[4]))):
        return shared_running_stats_rule(info, in_dims, x, weight, bias, running_mean, running_var, training, momentum, eps)
    B = info.batch_size
    xf = _fold_channels(x, in_dims[0], B)
    C = xf.shape[1] // B
    stats = [_per_channel(running_mean, in_dims[3], B), _per_channel(running_var, in_dims[4], B)]
    rmf, rvf = stats
    out, save_mean, save_invstd = aten.native_batch_norm.default(
        xf, _per_channel(weight, in_dims[1], B), _per_channel(bias, in_dims[2], B), rmf, rvf, training, momentum, eps)
    if training:
        for t, tf in ((running_mean, rmf), (running_var, rvf)):
            if t is not None and tf.data_ptr() != t.data_ptr():  # reshape copied: write the update back
                t.copy_(tf.view(t.shape))
    saved = [(s.unflatten(0, (B, C)), 0) if s.numel() else (s, None) for s in (save_mean, save_invstd)]
    return (out.unflatten(1, (B, C)), saved[0][0], saved[1][0]), (1, saved[0][1], saved[1][1])


def shared_running_stats_rule(info, in_dims, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """`native_batch_norm` in training mode where a running statistic is not batched (see the module
    docstring): per-example statistics from one kernel call, then the loop's sequential update in
    closed form, written once into each shared buffer."""
    B = info.batch_size
    stats, dims, shared = [], [], []
    for t, d in ((running_mean, in_dims[3]), (running_var, in_dims[4])):
        if t is not None and d is None:
            per_example = torch.zeros((B,) + tuple(t.shape), dtype=t.dtype, device=t.device)
            stats.append(per_example)
            dims.append(0)
            shared.append((t, per_example))
        else:
            stats.append(t)
            dims.append(d)
    outs, out_dims = native_batch_norm_rule(info, (*in_dims[:3], *dims, *in_dims[5:]), x, weight, bias, *stats,
                                            training, momentum, eps)
    decay = 1.0 - momentum
    # weight of example k's contribution m s_k after the B - 1 - k updates that follow it
    weights = [decay ** (B - 1 - k) for k in range(B)]
    with torch.no_grad():
        for t, contributions in shared:
            w = torch.tensor(weights, dtype=contributions.dtype, device=t.device).reshape((B,) + (1,) * t.dim())
            t.copy_(t * (decay ** B) + (contributions * w).sum(0))
    return outs, out_dims


def native_batch_norm_backward_rule(info, in_dims, grad_out, x, weight, running_mean, running_var, save_mean,
                                    save_invstd, train, eps, output_mask):
    B = info.batch_size
    gf, xf = _fold_channels(grad_out, in_dims[0], B), _fold_channels(x, in_dims[1], B)
    C = xf.shape[1] // B
    vecs = [_per_channel(t, d, B) for t, d in zip((weight, running_mean, running_var, save_mean, save_invstd), in_dims[2:7])]
    gi, gw, gb = aten.native_batch_norm_backward.default(gf, xf, *vecs, train, eps, output_mask)
    outs = (None if gi is None else gi.unflatten(1, (B, C)),
            None if gw is None else gw.unflatten(0, (B, C)),
            None if gb is None else gb.unflatten(0, (B, C)))
    return outs, (None if gi is None else 1, None if gw is None else 0, None if gb is None else 0)


def native_layer_norm_backward_rule(info, in_dims, grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    B = info.batch_size
    g, xm = materialize(grad_out, in_dims[0], B), materialize(x, in_dims[1], B)
    # (contiguous: the CPU kernel reads the saved statistics by their data pointer, strides unread;
    # an unbatched one expanded along the batch would be read past its memory)
    mean_m, rstd_m = materialize(mean, in_dims[3], B).contiguous(), materialize(rstd, in_dims[4], B).contiguous()
    wd = in_dims[5]
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        # the input gradient depends on grad * weight only: a per-element weight scales grad instead
        gk = g * weight.reshape((B,) + (1,) * (g.dim() - weight.dim()) + tuple(weight.shape[1:])) if wd is not None else g
        grad_input = aten.native_layer_norm_backward.default(
            gk, xm, normalized_shape, mean_m, rstd_m, weight if wd is None else None, None, [True, False, False])[0]
    lead = tuple(range(1, g.dim() - len(normalized_shape)))  # the logical leading dims, summed per element
    if output_mask[1] and weight is not None:
        prod = g * ((xm - mean_m) * rstd_m)
        grad_weight = prod.sum(lead) if lead else prod
    if output_mask[2] and bias is not None:
        grad_bias = g.sum(lead) if lead else g
    outs = (grad_input, grad_weight, grad_bias)
    return outs, tuple(None if o is None else 0 for o in outs)


RULES[aten.native_batch_norm.default] = native_batch_norm_rule
RULES[aten.native_batch_norm_backward.default] = native_batch_norm_backward_rule
RULES[aten.native_layer_norm_backward.default] = native_layer_norm_backward_rule
