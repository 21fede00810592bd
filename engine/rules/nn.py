"""torch.nn.functional family: convolution batched in one call instead of a loop.

Only the input batched: the batch folds into the convolution's own batch dim. The weight batched:
the batch folds into channels and `groups` grows by B (each batch element is its own group set),
which works for plain and transposed convolutions alike.
"""
from __future__ import annotations

import torch

from engine.rules._helpers import materialize
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
