"""View and shape ops: the batch dim stays at 0 and logical dims/sizes shift by one."""
from __future__ import annotations

import torch

from engine.rules._helpers import batch_size, materialize, norm_dim, ops_of, pad_batched, phys_dim, physical_rule, python_binding
from engine.rules._table import RULES, register_rule

aten = torch.ops.aten
_SLICE = aten.slice.Tensor._op  # no Python binding takes slice's (dim, start, end, step)


def _shape_rule(func):
    """view/_unsafe_view/reshape-like ops taking a size list at position 1.

    The op runs through its Python binding where it has one (`Tensor.view` for view.default,
    whose other overload takes a dtype, never a list), else its raw callable: both skip
    `OpOverload.__call__`'s frame, and a binding parses a size list faster than the boxed path
    (issue #18: view ops are pure dispatch cost)."""
    call = torch._C.TensorBase.view if func is aten.view.default else (python_binding(func) or func._op)

    def physical(x, size, *args, **kwargs):
        return call(x, [x.shape[0], *size], *args, **kwargs)

    return physical_rule(physical)


for op in ops_of("view.default", "reshape.default"):
    RULES[op] = _shape_rule(op)
# `_unsafe_view` is PyTorch's reshape of a tensor it just made (kron, einsum, matmul's result), which
# it knows to be viewable. Under vmap that tensor's layout follows its batched inputs' (a batch
# that is physically innermost), so it may not be: reshape it, a copy where the view cannot be.
RULES[aten._unsafe_view.default] = _shape_rule(aten.reshape.default)


@register_rule(aten.view.dtype)
def _view_dtype(info, in_dims, x, dtype):
    """Tensor.view(dtype): the same memory read as another dtype, a view of the physical tensor as
    torch.func's (the for-loop fallback would stack per-element views into a copy, which an
    in-place write would tell apart). Where the element size changes, the op's own checks (a 0-dim
    element cannot; the last dim must be contiguous) run first on one element, whose view is free."""
    if x.element_size() != dtype.itemsize and x.shape[0]:
        aten.view.dtype(x[0], dtype)
    return aten.view.dtype(x, dtype), 0


@register_rule(aten.view_copy.default)
@physical_rule
def _view_copy(x, size):
    """view_copy is a copy in the viewed shape, defined for any strides: a reshape, then a copy
    where the reshape was a view."""
    out = x.reshape([x.shape[0], *size])
    return out.clone() if out._base is not None or torch._C._is_alias_of(out, x) else out


@register_rule(aten.expand.default)
@physical_rule
def _expand(x, size, implicit=False):
    size = list(size)
    x = pad_batched(x, len(size))
    for i in range(len(size)):
        if size[i] == -1:
            size[i] = x.shape[i + 1]
    return x.expand([x.shape[0], *size])


@register_rule(aten.permute.default)
@physical_rule
def _permute(x, dims):
    r = x.dim() - 1
    return x.permute([0] + [phys_dim(d, r) for d in dims])


@register_rule(aten.transpose.int)
@physical_rule
def _transpose(x, d0, d1):
    """A 0-dim element is handed back as the input itself, not a view of it (dims 0 and -1 are
    checked by PyTorch above dispatch): torch.func's rule does so, and vmap then returns the
    caller's tensor (`result is x`)."""
    r = x.dim() - 1
    if r == 0:
        return x
    return x.transpose(phys_dim(d0, r), phys_dim(d1, r))


@register_rule(aten.t.default)
@physical_rule
def _t(x):
    """As torch.func: a 0-dim element comes back as the input itself (transpose's case), a 1-dim
    one as a view of it."""
    if x.dim() > 3:  # t of an element with more than 2 dims: the op's own error
        aten.t.default(x[0])
    return x.transpose(1, x.dim() - 1) if x.dim() > 1 else x


@register_rule(aten.unsqueeze.default)
@physical_rule
def _unsqueeze(x, dim):
    return x.unsqueeze(norm_dim(dim, x.dim()) + 1)


@register_rule(aten.squeeze.default)
@physical_rule
def _squeeze(x):
    dims = [i for i in range(1, x.dim()) if x.shape[i] == 1]
    return x.squeeze(dims)  # a view even where nothing is squeezed, as torch.func's


@register_rule(aten.select.int)
@physical_rule
def _select(x, dim, index):
    return x.select(phys_dim(dim, x.dim() - 1), index)


@register_rule(aten.slice.Tensor)
@physical_rule
def _slice(x, dim=0, start=None, end=None, step=1):
    return _SLICE(x, phys_dim(dim, x.dim() - 1), start, end, step)


@register_rule(aten.narrow.default)
@physical_rule
def _narrow(x, dim, start, length):
    return x.narrow(phys_dim(dim, x.dim() - 1), start, length)


@register_rule(aten.diagonal.default)
@physical_rule
def _diagonal(x, offset=0, dim1=0, dim2=1):
    r = x.dim() - 1
    return x.diagonal(offset, phys_dim(dim1, r), phys_dim(dim2, r))


@register_rule(aten.unfold.default)
@physical_rule
def _unfold(x, dim, size, step):
    return x.unfold(phys_dim(dim, x.dim() - 1), size, step)


def _split_rule(func):
    def rule(info, in_dims, x, split, dim=0):
        out = func(x, split, phys_dim(dim, x.dim() - 1))
        return out, tuple(0 for _ in out)

    return rule


for op in ops_of("split.Tensor", "split_with_sizes.default", "unsafe_split.Tensor", "unsafe_split_with_sizes.default",
                 "split_with_sizes_copy.default", "split_copy.Tensor"):
    RULES[op] = _split_rule(op)


@register_rule(aten.cat.default)
def _cat(info, in_dims, tensors, dim=0):
    size = batch_size([tensors], [in_dims[0]])
    ranks = [t.dim() - (d is not None) for t, d in zip(tensors, in_dims[0])]
    rank = max(ranks)
    # PyTorch's legacy rule: 1-dim empty tensors are skipped by cat whatever the dim.
    parts = [materialize(t, d, size) for t, d, r in zip(tensors, in_dims[0], ranks)
             if not (r == 1 and t.shape[-1] == 0 and rank > 1)]
    return torch.cat(parts, phys_dim(dim, rank)), 0


@register_rule(aten.stack.default)
def _stack(info, in_dims, tensors, dim=0):
    size = batch_size([tensors], [in_dims[0]])
    parts = [materialize(t, d, size) for t, d in zip(tensors, in_dims[0])]
    return torch.stack(parts, norm_dim(dim, parts[0].dim()) + 1), 0


@register_rule(aten.movedim.int)
def _movedim(info, in_dims, x, src, dst):
    r = x.dim() - 1
    return x.movedim(phys_dim(src, r), phys_dim(dst, r)), 0


@register_rule(aten.repeat.default)
def _repeat(info, in_dims, x, repeats):
    x = pad_batched(x, len(repeats))
    return x.repeat([1, *repeats]), 0


@register_rule(aten.roll.default)
def _roll(info, in_dims, x, shifts, dims=()):
    if len(dims) == 0:
        flat = x.reshape(x.shape[0], -1)
        return flat.roll(shifts, 1).view(x.shape), 0
    r = x.dim() - 1
    return x.roll(shifts, [phys_dim(d, r) for d in dims]), 0


@register_rule(aten.tril.default)
def _tril(info, in_dims, x, diagonal=0):
    return x.tril(diagonal), 0


@register_rule(aten.triu.default)
def _triu(info, in_dims, x, diagonal=0):
    return x.triu(diagonal), 0


@register_rule(aten.diag_embed.default)
def _diag_embed(info, in_dims, x, offset=0, dim1=-2, dim2=-1):
    r = x.dim() - 1 + 1  # output logical rank
    return torch.diag_embed(x, offset, phys_dim(dim1, r), phys_dim(dim2, r)), 0


@register_rule(aten.contiguous.default)
def _contiguous(info, in_dims, x, memory_format=torch.contiguous_format):
    return x.contiguous(), 0


@register_rule(aten.view_as_real.default)
def _view_as_real(info, in_dims, x):
    return torch.view_as_real(x), 0


@register_rule(aten.view_as_complex.default)
def _view_as_complex(info, in_dims, x):
    return torch.view_as_complex(x), 0
