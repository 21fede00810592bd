"""nn.Embedding: `embedding` and `embedding_dense_backward`, one kernel call for the batch.

Their decompositions (index + index_put with accumulate on the batched wrapper) were half the
time of a per-sample gradient of an embedding model. Each batch element's indices are offset by
b * num_weights, so the batch becomes B stacked tables: the forward reads element b's own rows of
a batched weight, and the backward accumulates element b's gradient into its own table (counts for
`scale_grad_by_freq` are then per element, as in the loop). `padding_idx` is compared with the
indices before the offset: those positions' gradients are zeroed and the kernel gets no padding.
"""
from __future__ import annotations

import torch

from engine.rules._helpers import materialize
from engine.rules._table import RULES

aten = torch.ops.aten


def _offsets(indices: torch.Tensor, B: int, num_weights: int) -> torch.Tensor:
    """Element b's indices (physical, batch at 0) shifted into table b of B stacked tables."""
    step = torch.arange(B, device=indices.device, dtype=indices.dtype) * num_weights
    return indices + step.reshape((B,) + (1,) * (indices.dim() - 1))


def embedding_rule(info, in_dims, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    B = info.batch_size
    wd, idd = in_dims[0], in_dims[1]
    if wd is None:  # the table is shared: the batch is one more leading dim of the indices
        return aten.embedding.default(weight, indices, padding_idx, scale_grad_by_freq, sparse), 0
    idx = _offsets(materialize(indices, idd, B), B, weight.shape[1])
    return aten.embedding.default(weight.flatten(0, 1), idx, -1, scale_grad_by_freq, sparse), 0


def embedding_dense_backward_rule(info, in_dims, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    B = info.batch_size
    g, idx = materialize(grad_output, in_dims[0], B), materialize(indices, in_dims[1], B)
    if padding_idx >= 0:
        g = g * (idx != padding_idx).unsqueeze(-1).to(g.dtype)
    out = aten.embedding_dense_backward.default(g, _offsets(idx, B, num_weights), B * num_weights, -1, scale_grad_by_freq)
    return out.unflatten(0, (B, num_weights)), 0


RULES[aten.embedding.default] = embedding_rule
RULES[aten.embedding_dense_backward.default] = embedding_dense_backward_rule
