"""Shape ops the conformance harness found looping or wrong: squeeze over a dim list (an empty list
squeezes nothing, unlike the decomposition's reading), constant padding, diagonal_scatter, and
prims.copy_to (the in-place copy decompositions emit)."""
from __future__ import annotations

import torch

from engine.rules._helpers import lrank, materialize, norm_dim, pad_batched
from engine.rules._table import RULES

aten = torch.ops.aten
prims = torch.ops.prims


def squeeze_dims_rule(info, in_dims, x, dims):
    rank = lrank(x, in_dims[0])
    dims = [dims] if isinstance(dims, int) else list(dims)
    phys = [norm_dim(d, rank) + 1 for d in dims if rank > 0]
    phys = [d for d in phys if x.shape[d] == 1]
    return (x.squeeze(phys) if phys else x), 0


def constant_pad_nd_rule(info, in_dims, x, pad, value=0):
    rank = lrank(x, in_dims[0])
    if len(pad) // 2 > rank:
        raise RuntimeError(f"Length of pad should be no more than twice the number of dimensions of the input. Pad length is {len(pad)} while the input has {rank} dimensions.")
    return aten.constant_pad_nd.default(x, pad, value), 0


def diagonal_scatter_rule(info, in_dims, x, src, offset=0, dim1=0, dim2=1):
    B = info.batch_size
    rank = lrank(x, in_dims[0])
    out = materialize(x, in_dims[0], B).clone()
    diag = out.diagonal(offset, norm_dim(dim1, rank) + 1, norm_dim(dim2, rank) + 1)
    diag.copy_(materialize(src, in_dims[1], B))
    return out, 0


def copy_to_rule(info, in_dims, a, b):
    rank = lrank(a, in_dims[0])
    a.copy_(pad_batched(b, rank) if in_dims[1] is not None else b)
    return a, 0


RULES[aten.squeeze.dims] = squeeze_dims_rule
RULES[aten.squeeze.dim] = squeeze_dims_rule
RULES[aten.constant_pad_nd.default] = constant_pad_nd_rule
RULES[aten.diagonal_scatter.default] = diagonal_scatter_rule
RULES[prims.copy_to.default] = copy_to_rule
