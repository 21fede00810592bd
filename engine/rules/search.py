"""Searching ops (bucketize, searchsorted) and masked_select with an unbatched mask.

searchsorted over a 1-D sorted sequence per example becomes one N-D searchsorted: each example's
boundaries are a row, its values flattened into the matching row. masked_select with the mask the
same for every example selects the same number of elements from each, so it is one indexing op;
with a batched mask it is one masked_select over the batch, which answers when the counts agree.
"""
from __future__ import annotations

import math

import torch

from engine.rules._helpers import broadcast_shapes, lrank, materialize, pad_batched
from engine.rules.dynamic_shape import common_count
from engine.rules._table import RULES

aten = torch.ops.aten


def _searchsorted(info, seq, ds, values, dv, sorter, dsorter, **kwargs):
    B = info.batch_size
    if ds is None and dsorter is None and seq.dim() == 1:
        # the same 1-D boundaries for every example apply to values of any shape
        return aten.searchsorted.Tensor(seq, values, sorter=sorter, **kwargs), 0
    seq = materialize(seq, ds, B)
    sorter = None if sorter is None else materialize(sorter, dsorter, B)
    values = materialize(values, dv, B)
    if seq.dim() == 2:  # 1-D boundaries per example: one row each, the example's values flattened
        out = aten.searchsorted.Tensor(seq, values.reshape(B, -1), sorter=sorter, **kwargs)
        return out.reshape(values.shape), 0
    return aten.searchsorted.Tensor(seq, values, sorter=sorter, **kwargs), 0


def searchsorted_rule(info, in_dims, seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    dsorter = in_dims[2] if len(in_dims) > 2 else None
    return _searchsorted(info, seq, in_dims[0], values, in_dims[1], sorter, dsorter,
                         out_int32=out_int32, right=right, side=side)


def bucketize_rule(info, in_dims, values, boundaries, *, out_int32=False, right=False):
    if lrank(boundaries, in_dims[1]) != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({lrank(boundaries, in_dims[1])})")
    return _searchsorted(info, boundaries, in_dims[1], values, in_dims[0], None, None, out_int32=out_int32, right=right)


def masked_select_rule(info, in_dims, x, mask):
    B = info.batch_size
    x = materialize(x, in_dims[0], B)
    if in_dims[1] is not None:
        # Per-example masks: one masked_select over the whole batch keeps each example's picks
        # together, in order; it answers when every example picks the same number of elements.
        logical = broadcast_shapes(x.shape[1:], mask.shape[1:])
        x = pad_batched(x, len(logical)).expand(B, *logical)
        mask = pad_batched(mask, len(logical)).expand(B, *logical)
        picked = torch.masked_select(x, mask)
        k = common_count(mask.reshape(B, math.prod(logical)).sum(1), "masked_select with a batched mask",
                         "Use torch.where(mask, x, fill) instead.")
        return picked.reshape(B, k), 0
    logical = broadcast_shapes(x.shape[1:], mask.shape)
    x = pad_batched(x, len(logical)).expand(B, *logical)
    return x[:, mask.expand(logical)], 0


RULES[aten.searchsorted.Tensor] = searchsorted_rule
RULES[aten.bucketize.Tensor] = bucketize_rule
RULES[aten.masked_select.default] = masked_select_rule


def nonzero_static_rule(info, in_dims, x, *, size, fill_value=-1):
    """nonzero with a fixed output size: each example's nonzero positions in order (a stable sort
    puts them first), cut or padded with `fill_value` to `size` rows."""
    B, shape = x.shape[0], tuple(x.shape[1:])
    nz = (x != 0).reshape(B, -1)
    k = min(size, nz.shape[1])
    first = torch.sort((~nz).to(torch.int8), dim=1, stable=True).indices[:, :k]
    if shape:
        coords = torch.stack(torch.unravel_index(first, shape), dim=-1)
    else:
        coords = first.new_zeros(B, k, 0)
    kept = torch.arange(k, device=x.device).unsqueeze(0) < nz.sum(1, keepdim=True)
    coords = torch.where(kept.unsqueeze(-1), coords, torch.full_like(coords, fill_value))
    if size > k:
        coords = torch.cat([coords, coords.new_full((B, size - k, len(shape)), fill_value)], dim=1)
    return coords, 0


RULES[aten.nonzero_static.default] = nonzero_static_rule
