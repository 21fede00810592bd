"""Shape ops the conformance harness found looping or wrong: squeeze over a dim list (an empty list
squeezes nothing, unlike the decomposition's reading), constant padding, diagonal_scatter, and
prims.copy_to (the in-place copy decompositions emit); and the backward ops of slicing and
selecting (slice_backward, select_backward and their *_scatter forms), whose decompositions run
a dozen index/where ops each time a flat parameter vector is split into tensors."""
from __future__ import annotations

import torch

from engine.rules._helpers import lrank, materialize, norm_dim, pad_batched
from engine.rules._table import RULES
from engine.errors import DimOutOfRangeError

aten = torch.ops.aten
prims = torch.ops.prims


def squeeze_dims_rule(info, in_dims, x, dims):
    rank = lrank(x, in_dims[0])
    dims = [dims] if isinstance(dims, int) else list(dims)
    if rank == 0:  # a 0-dim element takes dims 0 and -1 (and squeezes nothing), as the op does
        for d in dims:
            if d not in (0, -1):
                raise DimOutOfRangeError(f"squeeze: Dimension out of range (expected to be in range of [-1, 0], "
                                         f"but got {d}): each element is 0-dim")
    phys = [norm_dim(d, rank) + 1 for d in dims if rank > 0]
    phys = [d for d in phys if x.shape[d] == 1]
    return x.squeeze(phys), 0  # a view even where nothing is squeezed (not the input itself)


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


def slice_scatter_rule(info, in_dims, x, src, dim=0, start=None, end=None, step=1):
    B = info.batch_size
    d = norm_dim(dim, lrank(x, in_dims[0])) + 1
    return aten.slice_scatter.default(materialize(x, in_dims[0], B), materialize(src, in_dims[1], B), d, start, end, step), 0


def select_scatter_rule(info, in_dims, x, src, dim, index):
    B = info.batch_size
    d = norm_dim(dim, lrank(x, in_dims[0])) + 1
    return aten.select_scatter.default(materialize(x, in_dims[0], B), materialize(src, in_dims[1], B), d, index), 0


def slice_backward_rule(info, in_dims, grad, input_sizes, dim, start, end, step):
    d = norm_dim(dim, len(input_sizes)) + 1
    return aten.slice_backward.default(grad, [grad.shape[0], *input_sizes], d, start, end, step), 0


def select_backward_rule(info, in_dims, grad, input_sizes, dim, index):
    d = norm_dim(dim, len(input_sizes)) + 1
    return aten.select_backward.default(grad, [grad.shape[0], *input_sizes], d, index), 0


def diagonal_backward_rule(info, in_dims, grad, input_sizes, offset, dim1, dim2):
    rank = len(input_sizes)
    d1, d2 = norm_dim(dim1, rank) + 1, norm_dim(dim2, rank) + 1
    return aten.diagonal_backward.default(grad, [grad.shape[0], *input_sizes], offset, d1, d2), 0


def copy_to_rule(info, in_dims, a, b):
    rank = lrank(a, in_dims[0])
    a.copy_(pad_batched(b, rank) if in_dims[1] is not None else b)
    return a, 0


RULES[aten.squeeze.dims] = squeeze_dims_rule
RULES[aten.squeeze.dim] = squeeze_dims_rule
RULES[aten.constant_pad_nd.default] = constant_pad_nd_rule
RULES[aten.diagonal_scatter.default] = diagonal_scatter_rule
RULES[aten.slice_scatter.default] = slice_scatter_rule
RULES[aten.select_scatter.default] = select_scatter_rule
RULES[aten.slice_backward.default] = slice_backward_rule
RULES[aten.select_backward.default] = select_backward_rule
RULES[aten.diagonal_backward.default] = diagonal_backward_rule
RULES[prims.copy_to.default] = copy_to_rule


# prims the refs-based decompositions (group_norm, var_mean, ...) emit: without these they loop.
def _prims_reduction(op):
    def rule(info, in_dims, x, dims, *args, **kwargs):
        rank = lrank(x, in_dims[0])
        pd = None if dims is None else [norm_dim(d, rank) + 1 for d in dims]
        if pd is None:
            pd = list(range(1, x.dim()))
        return op(x, pd, *args, **kwargs), 0

    return rule


def prims_div_rule(info, in_dims, a, b):
    B = info.batch_size
    a = materialize(a, in_dims[0], B) if isinstance(a, torch.Tensor) else a
    b = materialize(b, in_dims[1], B) if isinstance(b, torch.Tensor) else b
    return prims.div.default(a, b), 0


def broadcast_in_dim_rule(info, in_dims, a, shape, broadcast_dimensions):
    B = info.batch_size
    return prims.broadcast_in_dim.default(a, [B, *shape], [0, *[d + 1 for d in broadcast_dimensions]]), 0


RULES[prims.sum.default] = _prims_reduction(prims.sum.default)
RULES[prims.var.default] = _prims_reduction(prims.var.default)
RULES[prims.div.default] = prims_div_rule
RULES[prims.broadcast_in_dim.default] = broadcast_in_dim_rule


def _reach(size, stride) -> int:
    """The highest element offset a strided view reaches from its start (+1): its memory span."""
    return sum((n - 1) * st for n, st in zip(size, stride)) + 1


def _as_strided_physical(func, x, size, stride, storage_offset):
    """as_strided on the physical tensor: the batch keeps its own stride, so example i reads at
    `storage_offset + i * batch_stride`, the offset taken relative to example 0 (torch.func's rule:
    each example behaves as if it were its own tensor). A view reaching past one example's memory
    would read its neighbour's: refused, as torch.func refuses it."""
    span = _reach(x.shape[1:], x.stride()[1:]) if all(n > 0 for n in x.shape) else 0
    offset = x.storage_offset() if storage_offset is None else storage_offset
    start = offset - x.storage_offset()
    if x.shape[0] > 1 and x.stride(0) != 0 and x.stride(0) < span:
        # The examples' memory interleaves (the batch dim is not outermost in memory, e.g. stacked
        # at dim -1): allowed when the view reads only the example's own elements (stft's framing
        # of a 1-D signal whose stride is the batch size), checked position by position.
        if not _reads_only_own(x, size, stride, start):
            raise RuntimeError(
                "vmap: Calling Tensor.as_strided is not supported unless the batch dims being vmapped over are at "
                "the front of the tensor (in memory layout), or the view reads only each element's own memory. "
                "Call .contiguous() on the input first."
            )
        return func(x, [x.shape[0], *size], [x.stride(0), *stride], offset)
    if all(n > 0 for n in size) and (start < 0 or start + _reach(size, stride) > span):
        raise RuntimeError(
            f"vmap: as_strided(size={list(size)}, stride={list(stride)}, storage_offset={storage_offset}) would read "
            f"memory outside each batch element (each spans {span} elements from storage offset "
            f"{x.storage_offset()}), so different elements would see each other's data. Use view ops instead."
        )
    return func(x, [x.shape[0], *size], [x.stride(0), *stride], offset)


_OWN_CHECK_LIMIT = 1 << 22  # positions compared at most; larger interleaved views are refused


def _offsets(size, stride) -> torch.Tensor:
    """Every memory offset a strided view of `size`/`stride` reads, relative to its start."""
    out = torch.zeros((), dtype=torch.int64)
    for n, st in zip(size, stride):
        out = out.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * st
    return out.reshape(-1)


def _reads_only_own(x, size, stride, start: int) -> bool:
    """Whether the view (offset `start` from each example's first element) reads only positions
    that belong to the example itself (x's per-example sizes and strides)."""
    own_n, view_n = 1, 1
    for n in x.shape[1:]:
        own_n *= n
    for n in size:
        view_n *= n
    if view_n == 0:
        return True
    if own_n == 0 or own_n > _OWN_CHECK_LIMIT or view_n > _OWN_CHECK_LIMIT:
        return False
    return bool(torch.isin(_offsets(size, stride) + start, _offsets(x.shape[1:], x.stride()[1:])).all())


def as_strided_rule(info, in_dims, x, size, stride, storage_offset=None):
    return _as_strided_physical(aten.as_strided.default, x, size, stride, storage_offset), 0


def _own_storage(x: torch.Tensor) -> torch.Tensor:
    """x (batch at 0) copied so that each element has memory of its own, laid out as `x[i].clone()`
    lays out one element (dense strides kept, else contiguous), one element after the other."""
    like = torch.empty_like(x[0])  # called with at least two elements
    own = x.new_empty_strided(tuple(x.shape), (max(like.numel(), 1), *like.stride()))
    return own.copy_(x)


def as_strided_copy_rule(info, in_dims, x, size, stride, storage_offset=None):
    """A copy, unlike as_strided, need not alias its input: where the elements' memory interleaves
    (a batch dim innermost), each element is first given memory of its own, as a loop over the
    elements (each its own tensor) sees it, and is read there."""
    span = _reach(x.shape[1:], x.stride()[1:]) if all(n > 0 for n in x.shape) else 0
    if x.shape[0] > 1 and x.stride(0) != 0 and x.stride(0) < span:
        offset = x.storage_offset() if storage_offset is None else storage_offset
        if not _reads_only_own(x, size, stride, offset - x.storage_offset()):
            x, storage_offset = _own_storage(x), offset - x.storage_offset()
    return _as_strided_physical(aten.as_strided.default, x, size, stride, storage_offset).clone(), 0


RULES[aten.as_strided.default] = as_strided_rule
RULES[aten.as_strided_copy.default] = as_strided_copy_rule


def as_strided_scatter_rule(info, in_dims, x, src, size, stride, storage_offset=None):
    out = materialize(x, in_dims[0], info.batch_size).contiguous().clone()
    _as_strided_physical(aten.as_strided.default, out, size, stride, storage_offset).copy_(
        materialize(src, in_dims[1], info.batch_size))
    return out, 0


RULES[aten.as_strided_scatter.default] = as_strided_scatter_rule


def _unfold(copy: bool):
    def rule(info, in_dims, x, dimension, size, step):
        rank = lrank(x, in_dims[0])
        if rank == 0:  # a 0-dim example unfolds like a 1-element vector into one window of `size` 1
            return aten.unfold.default(x.unsqueeze(1), 1, size, step).reshape(x.shape[0], size), 0
        out = aten.unfold.default(x, norm_dim(dimension, rank) + 1, size, step)
        return (out.clone() if copy else out), 0

    return rule


RULES[aten.unfold.default] = _unfold(copy=False)
RULES[aten.unfold_copy.default] = _unfold(copy=True)


def resize_rule(info, in_dims, x, size, *, memory_format=None):
    """Each example is its own tensor under vmap, so resizing one keeps the first numel(size) of its
    values in (contiguous) order. Growing would expose uninitialized memory: refused."""
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        raise RuntimeError(f"vmap: resize_ with memory_format={memory_format} is not supported; resize to a "
                           "contiguous tensor and convert it with .contiguous(memory_format=...)")
    B = x.shape[0]
    n = 1
    for s in size:
        n *= int(s)
    have = x[0].numel() if B else 0
    if n > have:
        raise RuntimeError(f"vmap: resize_ to {tuple(size)} grows each example from {have} to {n} elements; "
                           "the new elements would be uninitialized memory. Build the tensor with torch.zeros "
                           "or torch.cat instead.")
    return x.reshape(B, -1)[:, :n].reshape((B,) + tuple(size)).clone(), 0


RULES[aten.resize.default] = resize_rule
