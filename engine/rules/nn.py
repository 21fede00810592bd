"""torch.nn.functional family: convolution batched in one call instead of a loop.

Only the input batched: the batch folds into the convolution's own batch dim. The weight batched:
the batch folds into channels and `groups` grows by B (each batch element is its own group set),
which works for plain and transposed convolutions alike.
"""
from __future__ import annotations

import torch

from engine.rules._helpers import lrank, materialize, ops_of
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
            t = materialize(args[i], in_dims[i], B)
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
