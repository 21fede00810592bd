"""Group normalization (nn.GroupNorm), and batch norm's op variants on top of engine.rules.norms_fast.

`native_group_norm` and its backward:

Statistics are per (sample, group), so the vmap batch joins the kernel's N: one call for the
whole batch (PyTorch's decomposition would reach `as_strided`, which has no general rule). The
affine weight and bias are per channel and shared across N, so in the backward their gradients
are summed over N by the kernel; per batch element they must not be summed over the batch, so
they are computed here from the normalized input (grad_weight = sum(grad * x_hat), grad_bias =
sum(grad)) per element, while the input gradient comes from the kernel.

Batch norm's variants (`_native_batch_norm_legit`, `_batch_norm_with_update`) are the same computation
as `native_batch_norm` (engine.rules.norms_fast), which owns batch norm's rules, the shared running
statistics included.
"""
from __future__ import annotations

import torch

from engine.rules._helpers import materialize
from engine.rules._table import RULES
from engine.rules.norms_fast import native_batch_norm_rule

aten = torch.ops.aten


def _channel_view(w: torch.Tensor, rank: int) -> torch.Tensor:
    """A per-element [B, C] weight shaped to broadcast against [B, N, C, *spatial] (`rank` logical dims)."""
    return w.reshape(w.shape[:2] + (1,) * (rank - 2)).unsqueeze(1)


def native_group_norm_rule(info, in_dims, x, weight, bias, N, C, HxW, group, eps):
    B = info.batch_size
    xm = materialize(x, in_dims[0], B)
    xf = xm.flatten(0, 1).contiguous()  # the kernel requires it; a batch stacked innermost is not
    wd, bd = in_dims[1], in_dims[2]
    shared = wd is None and bd is None
    out, mean, rstd = aten.native_group_norm.default(xf, weight if shared else None, bias if shared else None,
                                                     B * N, C, HxW, group, eps)
    out = out.unflatten(0, (B, N))
    if not shared:
        rank = xm.dim() - 1
        if weight is not None:
            out = out * (_channel_view(weight, rank) if wd is not None else weight.reshape((C,) + (1,) * (rank - 2)))
        if bias is not None:
            out = out + (_channel_view(bias, rank) if bd is not None else bias.reshape((C,) + (1,) * (rank - 2)))
    return (out, mean.unflatten(0, (B, N)), rstd.unflatten(0, (B, N))), (0, 0, 0)


def native_group_norm_backward_rule(info, in_dims, grad_out, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    B = info.batch_size
    g = materialize(grad_out, in_dims[0], B)
    xm = materialize(x, in_dims[1], B)
    mean_m, rstd_m = materialize(mean, in_dims[2], B), materialize(rstd, in_dims[3], B)
    wd = in_dims[4]
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        # a per-element weight scales the incoming gradient instead (the kernel's weight is shared);
        # every operand contiguous: the CPU kernel reads the statistics by data pointer, strides unread
        gk = g * _channel_view(weight, g.dim() - 1) if wd is not None else g
        grad_input = aten.native_group_norm_backward.default(
            gk.flatten(0, 1).contiguous(), xm.flatten(0, 1).contiguous(), mean_m.flatten(0, 1).contiguous(),
            rstd_m.flatten(0, 1).contiguous(),
            weight if wd is None else None, B * N, C, HxW, group, [True, False, False])[0].unflatten(0, (B, N))
    g3 = g.reshape(B, N, C, HxW)
    if output_mask[1]:
        x_hat = (xm.reshape(B, N, group, -1) - mean_m.unsqueeze(-1)) * rstd_m.unsqueeze(-1)
        grad_weight = (g3 * x_hat.reshape(B, N, C, HxW)).sum((1, 3))
    if output_mask[2]:
        grad_bias = g3.sum((1, 3))
    outs = (grad_input, grad_weight, grad_bias)
    return outs, tuple(None if o is None else 0 for o in outs)


def native_batch_norm_legit_no_stats_rule(info, in_dims, x, weight, bias, training, momentum, eps):
    return native_batch_norm_rule(info, (*in_dims[:3], None, None), x, weight, bias, None, None, training, momentum, eps)


def batch_norm_with_update_rule(info, in_dims, x, weight, bias, running_mean, running_var, momentum, eps):
    """`_batch_norm_with_update`: training-mode batch norm plus the kernel's reserve tensor, which is
    empty on CPU and the same for every example."""
    outs, dims = native_batch_norm_rule(info, in_dims, x, weight, bias, running_mean, running_var, True, momentum, eps)
    reserve = torch.empty(0, dtype=torch.uint8, device=x.device)
    return (*outs, reserve), (*dims, None)


RULES[aten.native_group_norm.default] = native_group_norm_rule
RULES[aten.native_group_norm_backward.default] = native_group_norm_backward_rule
def native_batch_norm_legit_rule(info, in_dims, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """`_native_batch_norm_legit`: the same outputs and updates as `native_batch_norm`."""
    return native_batch_norm_rule(info, in_dims, x, weight, bias, running_mean, running_var, training, momentum, eps)


# Both declare their writes to running_mean/var: the rules write shared buffers as the loop does.
native_batch_norm_legit_rule.writes_shared = True
batch_norm_with_update_rule.writes_shared = True
RULES[aten._native_batch_norm_legit.default] = native_batch_norm_legit_rule
RULES[aten._native_batch_norm_legit.no_stats] = native_batch_norm_legit_no_stats_rule
RULES[aten._batch_norm_with_update.default] = batch_norm_with_update_rule
