"""nn.EmbeddingBag: `_embedding_bag` and its backwards, each as one kernel call for the batch.

The kernel reduces bags of rows of one weight table, the bags given by offsets into a flat index
list. The batch is folded into that structure: element b's bags follow element b-1's (offsets
shifted by b*n, n indices per element), and when the weight table is per element too (ensembles)
or a gradient per element is wanted (the backward), element b's table is rows [b*V, (b+1)*V) of a
stacked [B*V, D] table (indices shifted by b*V). The kernel's bookkeeping outputs (offset2bag,
bag sizes, argmax rows) are returned per element in element-local numbering, so the backward
rule folds them again the same way.
"""
from __future__ import annotations

import functools

import torch

from engine.errors import VmapError
from engine.rules._helpers import materialize
from engine.rules._table import RULES

aten = torch.ops.aten
_MAX = 2


def _shift(t: torch.Tensor, B: int, step: int) -> torch.Tensor:
    """[B, ...] local numbers -> flat global numbers (element b's shifted by b*step); negative
    entries (no row, e.g. an empty bag's argmax) stay as they are."""
    shifts = torch.arange(B, device=t.device).view((B,) + (1,) * (t.dim() - 1)) * step
    return torch.where(t >= 0, t + shifts, t).flatten(0, 1)


def _unshift(t: torch.Tensor, B: int, step: int) -> torch.Tensor:
    t = t.unflatten(0, (B, -1))
    shifts = torch.arange(B, device=t.device).view((B,) + (1,) * (t.dim() - 1)) * step
    return torch.where(t >= 0, t - shifts, t)


def _fold_offsets(offsets: torch.Tensor, B: int, n: int, include_last_offset: bool) -> torch.Tensor:
    """Per-element offsets [B, nb(+1)] into one offsets list over the folded [B*n] indices."""
    if include_last_offset:
        starts = _shift(offsets[:, :-1], B, n)
        return torch.cat([starts, starts.new_full((1,), B * n)])
    return _shift(offsets, B, n)


def _forward(kernel, info, in_dims, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
             per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """`kernel` is `_embedding_bag` or `_embedding_bag_forward_only` (no grad needed): same
    arguments and outputs, so one rule folds the batch for both."""
    B = info.batch_size
    wd = in_dims[0]
    idx = materialize(indices, in_dims[1], B)
    if idx.dim() != 2:
        raise VmapError("vmap: _embedding_bag expects 1-D indices per batch element (F.embedding_bag flattens 2-D input).")
    n = idx.shape[1]
    V = weight.shape[-2]
    if wd is not None and padding_idx >= 0:
        raise VmapError(
            "vmap: nn.EmbeddingBag with padding_idx and a weight that differs per batch element has no batching rule; "
            "vmap over the inputs only, or drop padding_idx."
        )
    table = weight.flatten(0, 1) if wd is not None else weight
    flat_idx = _shift(idx, B, V) if wd is not None else idx.flatten()
    offs = materialize(offsets, in_dims[2], B)
    nb = offs.shape[1] - (1 if include_last_offset else 0)
    psw_d = in_dims[6] if len(in_dims) > 6 else None
    psw = None if per_sample_weights is None else materialize(per_sample_weights, psw_d, B).flatten()
    out, offset2bag, bag_size, max_idx = kernel(
        table, flat_idx, _fold_offsets(offs, B, n, include_last_offset), scale_grad_by_freq, mode, sparse, psw,
        include_last_offset, padding_idx)
    offset2bag = _unshift(offset2bag, B, nb) if offset2bag.numel() else offset2bag
    if mode == _MAX and max_idx.numel():
        max_idx = _unshift(max_idx, B, V) if wd is not None else max_idx.unflatten(0, (B, nb))
    elif max_idx.numel():
        max_idx = max_idx.unflatten(0, (B, nb))
    outs = (out.unflatten(0, (B, nb)), offset2bag, bag_size.unflatten(0, (B, nb)), max_idx)
    return outs, tuple(0 if o.numel() else None for o in outs[:2]) + (0, 0 if max_idx.numel() else None)


def _fold_bookkeeping(in_dims, B, indices, offsets, offset2bag, bag_size, maximum_indices, mode, V):
    """The backward's index arguments folded for a stacked [B*V, D] gradient table."""
    idx = materialize(indices, in_dims[0], B)
    n = idx.shape[1]
    sizes = materialize(bag_size, in_dims[3], B)
    nb = sizes.shape[1]
    offs = materialize(offsets, in_dims[1], B)
    folded_offsets = _fold_offsets(offs, B, n, offs.shape[1] == nb + 1)
    o2b = _shift(materialize(offset2bag, in_dims[2], B), B, nb) if offset2bag.numel() else offset2bag
    if maximum_indices.numel():
        mi = materialize(maximum_indices, in_dims[4], B)
        mi = _shift(mi, B, V) if mode == _MAX else mi.flatten(0, 1)
    else:
        mi = maximum_indices
    return _shift(idx, B, V), folded_offsets, o2b, sizes.flatten(), mi


def embedding_bag_backward_rule(info, in_dims, grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                                scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    """Per-element weight gradients: a [B*V, D] gradient table (so nothing is summed over the
    batch), with rows of padding_idx zeroed per element (the kernel skips only element 0's)."""
    if sparse:
        raise VmapError("vmap: nn.EmbeddingBag(sparse=True) has no batching rule for its backward; use sparse=False.")
    B, V = info.batch_size, num_weights
    g = materialize(grad, in_dims[0], B)
    idx, offs, o2b, sizes, mi = _fold_bookkeeping(in_dims[1:6], B, indices, offsets, offset2bag, bag_size,
                                                  maximum_indices, mode, V)
    psw = None if per_sample_weights is None else materialize(per_sample_weights, in_dims[10], B).flatten()
    out = aten._embedding_bag_backward.default(g.flatten(0, 1), idx, offs, o2b, sizes, mi, B * V, scale_grad_by_freq,
                                               mode, False, psw, padding_idx)
    out = out.unflatten(0, (B, V))
    if padding_idx >= 0:
        out = out.index_fill(1, torch.tensor([padding_idx], device=out.device), 0)
    return out, 0


def per_sample_weights_backward_rule(info, in_dims, grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    B = info.batch_size
    g = materialize(grad, in_dims[0], B)
    nb = g.shape[1]
    idx = materialize(indices, in_dims[2], B)
    n = idx.shape[1]
    wd = in_dims[1]
    if wd is not None and padding_idx >= 0:
        raise VmapError("vmap: nn.EmbeddingBag with padding_idx and a per-element weight has no batching rule.")
    table = weight.flatten(0, 1) if wd is not None else weight
    flat_idx = _shift(idx, B, weight.shape[-2]) if wd is not None else idx.flatten()
    offs = materialize(offsets, in_dims[3], B)
    o2b = _shift(materialize(offset2bag, in_dims[4], B), B, nb)
    out = aten._embedding_bag_per_sample_weights_backward.default(
        g.flatten(0, 1), table, flat_idx, _fold_offsets(offs, B, n, offs.shape[1] == nb + 1), o2b, mode, padding_idx)
    return out.unflatten(0, (B, n)), 0


RULES[aten._embedding_bag.default] = functools.partial(_forward, aten._embedding_bag.default)
RULES[aten._embedding_bag_forward_only.default] = functools.partial(_forward, aten._embedding_bag_forward_only.default)
RULES[aten._embedding_bag_backward.default] = embedding_bag_backward_rule
RULES[aten._embedding_bag_per_sample_weights_backward.default] = per_sample_weights_backward_rule
