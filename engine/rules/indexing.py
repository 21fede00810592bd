"""Indexing family: gather and index_select in one call (their decompositions loop on index ops)."""
from __future__ import annotations

import torch

from engine.rules._helpers import broadcast_shapes, lrank, materialize, norm_dim, pad_batched
from engine.rules._table import RULES

aten = torch.ops.aten


def gather_rule(info, in_dims, x, dim, index, sparse_grad=False):
    B = info.batch_size
    rank = lrank(x, in_dims[0])
    d = norm_dim(dim, rank)
    xm = materialize(x, in_dims[0], B)
    im = materialize(index, in_dims[2], B)
    if rank == 0:  # 0-dim gather: each element gathers from its own 0-dim input (one row each)
        return aten.gather.default(xm.reshape(B, 1), 1, im.reshape(B, -1), sparse_grad=sparse_grad).reshape(im.shape), 0
    if im.dim() == 1:  # 0-dim index against a >=1-dim input
        im = im.view((B,) + (1,) * rank)
    return aten.gather.default(xm, d + 1, im, sparse_grad=sparse_grad), 0


def index_select_rule(info, in_dims, x, dim, index):
    B = info.batch_size
    rank = lrank(x, in_dims[0])
    d = norm_dim(dim, rank)
    if in_dims[2] is None and in_dims[0] is None:
        return aten.index_select.default(x, dim, index), None
    xm = materialize(x, in_dims[0], B)
    if rank == 0:
        # A 0-dim input: every valid index is 0, the result is the element itself in the op's shape.
        idx_shape = index.shape[1:] if in_dims[2] is not None else index.shape
        shape = aten.index_select.default(torch.empty((), device="meta"), 0, torch.zeros(idx_shape, dtype=torch.long, device="meta")).shape
        im = materialize(index, in_dims[2], B).reshape(B, -1)
        return torch.gather(xm.reshape(B, 1), 1, im).reshape((B,) + tuple(shape)), 0
    if in_dims[2] is None:
        return aten.index_select.default(xm, d + 1, index), 0
    idx = index.reshape(B, -1)                                   # 0-dim indices become [B, 1]
    shape = list(xm.shape)
    shape[d + 1] = idx.shape[1]
    view = [B] + [1] * rank
    view[d + 1] = idx.shape[1]
    return torch.gather(xm, d + 1, idx.view(view).expand(shape)), 0


RULES[aten.gather.default] = gather_rule
RULES[aten.index_select.default] = index_select_rule


def _index_layout(indices: list) -> tuple[int, bool]:
    """(position of the first advanced index, whether the advanced indices are adjacent)."""
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not pos:
        return 0, True
    return pos[0], pos[-1] - pos[0] + 1 == len(pos)


def _expand_bool(indices: list, dims: list) -> tuple[list, list]:
    """Unbatched boolean masks become their long indices (a rank-r mask is r index tensors)."""
    out, out_dims = [], []
    for t, d in zip(indices, dims):
        if t is not None and t.dtype in (torch.bool, torch.uint8) and d is None:
            nz = t.nonzero().unbind(1)
            out.extend(nz)
            out_dims.extend([None] * len(nz))
        else:
            out.append(t)
            out_dims.append(d)
    return out, out_dims


def index_rule(info, in_dims, x, indices):
    """x[i0, i1, ...] with an arange over the batch as one more advanced index.

    The batch dim is moved just before the first advanced index, so the advanced indices stay
    adjacent exactly when they were (which decides where PyTorch puts the indexed dims).
    """
    B = info.batch_size
    idims = list(in_dims[1]) if isinstance(in_dims[1], list) else [None] * len(indices)
    indices, idims = _expand_bool(list(indices), idims)
    if any(t is not None and d is not None and t.dtype in (torch.bool, torch.uint8) for t, d in zip(indices, idims)):
        # A batched mask selects a different number of elements per batch element.
        xm = materialize(x, in_dims[0], B)
        outs = [aten.index.Tensor(xm[b], [t[b] if d is not None else t for t, d in zip(indices, idims)]) for b in range(B)]
        return torch.stack(outs), 0
    if in_dims[0] is not None and all(d is None for d in idims):
        k, adjacent = _index_layout(indices)
        out = aten.index.Tensor(x, [None] + indices)
        if adjacent:
            return out, 0
        bshape = broadcast_shapes(*[t.shape for t in indices if t is not None])
        return out, len(bshape)
    k, adjacent = _index_layout(indices)
    rank = max((t.dim() - (d is not None)) for t, d in zip(indices, idims) if t is not None)
    xm = materialize(x, in_dims[0], B).movedim(0, k)
    phys = [None] * k + [torch.arange(B, device=x.device).view((B,) + (1,) * rank)]
    for t, d in zip(indices[k:], idims[k:]):
        phys.append(pad_batched(t, rank) if (t is not None and d is not None) else t)
    out = aten.index.Tensor(xm, phys)
    return out, (k if adjacent else 0)


RULES[aten.index.Tensor] = index_rule


def index_put_rule(info, in_dims, x, indices, values, accumulate=False):
    """x[i0, i1, ...] = values with the same batch-arange index as index_rule; values are moved
    to where the batch dim lands in the indexed view."""
    B = info.batch_size
    idims = list(in_dims[1]) if isinstance(in_dims[1], list) else [None] * len(indices)
    rank_x = lrank(x, in_dims[0])
    xm = materialize(x, in_dims[0], B)
    vm = materialize(values, in_dims[2], B)
    if len(indices) == 1 and indices[0] is not None and indices[0].dtype in (torch.bool, torch.uint8) \
            and lrank(values, in_dims[2]) == 0:
        # x[mask] = v with one value (torch.distributions' clean-up of edge cases): a select, with
        # no data-dependent shape whichever of x, mask and v is batched.
        mask = materialize(indices[0], idims[0], B).bool()
        mask = mask.reshape(mask.shape + (1,) * (rank_x + 1 - mask.dim()))  # a mask of x's leading dims
        v = pad_batched(vm, rank_x)
        return torch.where(mask, xm + v if accumulate else v.to(xm.dtype), xm), 0
    indices, idims = _expand_bool(list(indices), idims)
    if any(t is not None and d is not None and t.dtype in (torch.bool, torch.uint8) for t, d in zip(indices, idims)):
        outs = [aten.index_put.default(xm[b], [t[b] if d is not None else t for t, d in zip(indices, idims)], vm[b], accumulate) for b in range(B)]
        return torch.stack(outs), 0
    k, adjacent = _index_layout(indices)
    lshapes = [t.shape[1:] if d is not None else t.shape for t, d in zip(indices, idims) if t is not None]
    bshape = broadcast_shapes(*lshapes)
    n_adv = len(lshapes)
    indexed_rank = len(bshape) + rank_x - n_adv
    rank = len(bshape)
    if n_adv and all(d is None for d in idims):
        # indices shared by the batch: the batch dim is one more sliced dim (None), as in
        # index_rule; the indexed view keeps it first, or after the advanced dims where those
        # are not adjacent. (An arange index would make every update a point of its own.)
        vphys = pad_batched(vm, indexed_rank)
        out = aten.index_put.default(xm, [None, *indices], vphys if adjacent else vphys.movedim(0, rank), accumulate)
        return out, 0
    phys = [None] * k + [torch.arange(B, device=x.device).view((B,) + (1,) * rank)]
    for t, d in zip(indices[k:], idims[k:]):
        phys.append(pad_batched(t, rank) if (t is not None and d is not None) else t)
    vphys = pad_batched(vm, indexed_rank).movedim(0, k if adjacent else 0)
    out = aten.index_put.default(xm.movedim(0, k), phys, vphys, accumulate)
    return out.movedim(k, 0), 0


def index_put__rule(info, in_dims, x, indices, values, accumulate=False):
    """In place: the out-of-place result written back into the (batched) x."""
    out, _ = index_put_rule(info, in_dims, x, indices, values, accumulate)
    x.copy_(out)
    return x, 0


RULES[aten.index_put.default] = index_put_rule
RULES[aten.index_put_.default] = index_put__rule


def _scatter_rule(op):
    def rule(info, in_dims, x, dim, index, *rest, **kwargs):
        B = info.batch_size
        rank = lrank(x, in_dims[0])
        xm = materialize(x, in_dims[0], B)
        im = materialize(index, in_dims[2], B)
        rest = list(rest)
        if rest and isinstance(rest[0], torch.Tensor):
            rest[0] = materialize(rest[0], in_dims[3], B)
        if rank == 0:  # 0-dim self/index/src: work on [B, 1] and drop the unit dim again
            xm, im = xm.reshape(B, 1), im.reshape(B, 1)
            if rest and isinstance(rest[0], torch.Tensor):
                rest[0] = rest[0].reshape(B, 1)
            return op(xm, 1, im, *rest, **kwargs).reshape(B), 0
        return op(xm, norm_dim(dim, rank) + 1, im, *rest, **kwargs), 0

    return rule


for _op in (aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce,
            aten.scatter_add.default, aten.scatter_reduce.two):
    RULES[_op] = _scatter_rule(_op)


def take_rule(info, in_dims, x, index):
    B = info.batch_size
    xm = materialize(x, in_dims[0], B).reshape(B, -1)
    im = materialize(index, in_dims[1], B)
    flat = im.reshape(B, -1)
    flat = torch.where(flat < 0, flat + xm.shape[1], flat)
    return torch.gather(xm, 1, flat).reshape(im.shape), 0


RULES[aten.take.default] = take_rule


def index_reduce_rule(info, in_dims, x, dim, index, source, reduce, *, include_self=True):
    """index_reduce as scatter_reduce: the 1-D index spread over source's shape along `dim`, so a
    per-example index is just a batched index tensor."""
    B = info.batch_size
    rank = lrank(x, in_dims[0])
    d = norm_dim(dim, rank) + 1
    xm = materialize(x, in_dims[0], B)
    src = pad_batched(materialize(source, in_dims[3], B), rank)
    idx = materialize(index, in_dims[2], B).reshape(B, -1)
    if rank == 0:  # 0-dim self and source: work on [B, 1]
        xm, src = xm.reshape(B, 1), src.reshape(B, 1)
    view = [B] + [1] * (src.dim() - 1)
    view[d] = idx.shape[1]
    out = aten.scatter_reduce.two(xm, d, idx.view(view).expand(src.shape), src, reduce, include_self=include_self)
    return (out.reshape(B) if rank == 0 else out), 0


def put_rule(info, in_dims, x, index, source, accumulate=False):
    """put with flat indices: each example's indices shifted to its own block of one flat tensor."""
    B = info.batch_size
    xm = materialize(x, in_dims[0], B)
    n = xm[0].numel()
    idx = materialize(index, in_dims[1], B).reshape(B, -1)
    idx = torch.where(idx < 0, idx + n, idx) + torch.arange(B, device=idx.device).unsqueeze(1) * n
    src = materialize(source, in_dims[2], B).reshape(-1)
    return aten.put.default(xm.reshape(-1), idx.reshape(-1), src, accumulate).reshape(xm.shape), 0


def masked_scatter_rule(info, in_dims, x, mask, source):
    """Each example consumes its own source in order: the k-th True of its mask takes source[k]."""
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype {mask.dtype}")
    B = info.batch_size
    xm, mm = materialize(x, in_dims[0], B), materialize(mask, in_dims[1], B)
    logical = broadcast_shapes(xm.shape[1:], mm.shape[1:])
    xm = pad_batched(xm, len(logical)).expand(B, *logical).reshape(B, -1)
    mm = pad_batched(mm, len(logical)).expand(B, *logical).reshape(B, -1)
    src = materialize(source, in_dims[2], B).reshape(B, -1)
    if src.shape[1] == 0:
        if mm.any():
            raise RuntimeError("masked_scatter: expected source to have at least as many elements as ones in mask")
        return xm.clone().reshape(B, *logical), 0
    pos = (mm.long().cumsum(1) - 1).clamp(min=0)
    if pos.max() >= src.shape[1] and (mm & (pos >= src.shape[1])).any():
        raise RuntimeError("masked_scatter: expected source to have at least as many elements as ones in mask")
    taken = torch.gather(src, 1, pos.clamp(max=src.shape[1] - 1))
    return torch.where(mm, taken, xm).reshape(B, *logical), 0


RULES[aten.index_reduce.default] = index_reduce_rule
RULES[aten.put.default] = put_rule
RULES[aten.masked_scatter.default] = masked_scatter_rule
