"""Indexing family: gather and index_select in one call (their decompositions loop on index ops)."""
from __future__ import annotations

import torch

from engine.rules._helpers import lrank, materialize, norm_dim
from engine.rules._table import RULES

aten = torch.ops.aten


def gather_rule(info, in_dims, x, dim, index, sparse_grad=False):
    B = info.batch_size
    rank = lrank(x, in_dims[0])
    d = norm_dim(dim, rank)
    xm = materialize(x, in_dims[0], B)
    im = materialize(index, in_dims[2], B)
    if rank == 0:  # 0-dim gather: logical shapes are [] so physical ones are [B]
        return aten.gather.default(xm, 0, im, sparse_grad=sparse_grad), 0
    if im.dim() == 1:  # 0-dim index against a >=1-dim input
        im = im.view((B,) + (1,) * rank)
    return aten.gather.default(xm, d + 1, im, sparse_grad=sparse_grad), 0


def index_select_rule(info, in_dims, x, dim, index):
    B = info.batch_size
    rank = lrank(x, in_dims[0])
    d = norm_dim(dim, rank)
    if in_dims[2] is None:
        if in_dims[0] is None:
            return aten.index_select.default(x, dim, index), None
        return aten.index_select.default(x, d + 1 if rank else 0, index.reshape(-1) if rank else index), 0
    xm = materialize(x, in_dims[0], B)
    idx = index.reshape(B, -1)                                   # 0-dim indices become [B, 1]
    if rank == 0:
        return torch.gather(xm, 0, idx.reshape(B)), 0
    shape = list(xm.shape)
    shape[d + 1] = idx.shape[1]
    view = [B] + [1] * rank
    view[d + 1] = idx.shape[1]
    return torch.gather(xm, d + 1, idx.view(view).expand(shape)), 0


RULES[aten.gather.default] = gather_rule
RULES[aten.index_select.default] = index_select_rule
