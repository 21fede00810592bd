"""Reductions and other ops with a `dim` argument: shift logical dims past the batch dim.

Three shapes of op share two helpers: ops taking `dim` (an int or a list; None or [] meaning
"all dims" for list-dim reductions) and full reductions without `dim`, which are run as the
dim variant over a flattened view. A batched 0-dim tensor is handled as a 1-element vector.
"""
from __future__ import annotations

from typing import Any

import torch

from engine.rules._helpers import batch_size, dim_binding, materialize, ops_of
from engine.rules._table import RULES

aten = torch.ops.aten


def _arg(args: list, kwargs: dict, pos: int, name: str, default: Any) -> tuple[Any, str]:
    if len(args) > pos:
        return args[pos], "pos"
    if name in kwargs:
        return kwargs[name], "kw"
    return default, "default"


def dim_rule(func: Any, dim_pos: int, n_tensors: int = 1, all_when_none: bool = True):
    """Rule for an op whose first `n_tensors` args share a logical shape and which takes `dim` at `dim_pos`."""
    schema_arg = func._schema.arguments[dim_pos]
    dim_name = schema_arg.name
    default = schema_arg.default_value if schema_arg.has_default_value() else None
    is_list = "List" in str(schema_arg.type) or "[]" in str(schema_arg.type)
    kw_only = schema_arg.kwarg_only
    op = func._op  # OpOverload.__call__ is exactly ._op

    def rule(info, in_dims, *args, **kwargs):
        if len(args) > dim_pos and in_dims[0] == 0 and (n_tensors == 1 or in_dims[1] == 0):
            # The common call (every tensor batched, dim given, logical rank >= 1): shift dim, run the op.
            new_dim = _common_dim(args[dim_pos], args[0].dim() - 1, is_list)
            if new_dim is not None:
                out = op(*args[:dim_pos], new_dim, *args[dim_pos + 1:], **kwargs)
                return (out, tuple(0 for _ in out)) if isinstance(out, (tuple, list)) else (out, 0)
        args = list(args)
        size = batch_size(args, in_dims)
        for i in range(n_tensors):
            if isinstance(args[i], torch.Tensor):
                args[i] = materialize(args[i], in_dims[i], size)
        rank = args[0].dim() - 1
        scalar = rank == 0
        if scalar:
            # a 0-dim element taken as [1]: an argument a 0-dim tensor cannot take (unbind's dim,
            # kthvalue's k > 1) would pass, so one element checks the call first (its own error)
            op(*[a[0] if i < n_tensors and isinstance(a, torch.Tensor) else a for i, a in enumerate(args)], **kwargs)
            for i in range(n_tensors):
                if isinstance(args[i], torch.Tensor):
                    args[i] = args[i].unsqueeze(-1)
            rank = 1
        dim, where = _arg(args, kwargs, dim_pos, dim_name, default)
        if is_list and isinstance(dim, int):
            dim = [dim]
        if dim is None or (is_list and len(dim) == 0):
            if not all_when_none:  # e.g. argmax(dim=None): over the flattened tensor
                for i in range(n_tensors):
                    args[i] = args[i].reshape(size, -1)
                new_dim: Any = 1 if not is_list else [1]
            else:
                new_dim = list(range(1, rank + 1))
        elif is_list:
            new_dim = [_shift(d, rank, scalar) for d in dim]
        else:
            new_dim = _shift(dim, rank, scalar)
        if where == "kw" or (kw_only and where == "default"):
            kwargs = dict(kwargs, **{dim_name: new_dim})
        elif where == "pos" or (not kw_only and dim_pos <= len(args)):
            while len(args) < dim_pos:
                a = func._schema.arguments[len(args)]
                args.append(a.default_value)
            if len(args) == dim_pos:
                args.append(new_dim)
            else:
                args[dim_pos] = new_dim
        else:
            kwargs = dict(kwargs, **{dim_name: new_dim})
        out = func(*args, **kwargs)
        if scalar:
            out = _unscalar(out)
        if isinstance(out, (tuple, list)):
            return out, tuple(0 for _ in out)
        return out, 0

    binding = dim_binding(func) if dim_pos == 1 and n_tensors == 1 else None
    if binding is not None:
        rule.physical = _physical_dim_call(binding, is_list)  # type: ignore[attr-defined]
        rule.physical.binding = binding  # type: ignore[attr-defined]  (tests/test_hot_path.py checks it)
    return rule


def _common_dim(dim: Any, rank: int, is_list: bool) -> Any:
    """`dim` shifted past the batch dim for a dim op's common call (an int, or a non-empty int list
    for a list-dim op, on examples of logical rank >= 1), as the op takes it; None for any other
    call. A dim out of range raises the op's IndexError."""
    if not rank:
        return None
    if type(dim) is int:
        d = _shift(dim, rank, False)
        return [d] if is_list else d
    if is_list and dim and all(type(d) is int for d in dim):
        return [_shift(d, rank, False) for d in dim]
    return None


def _physical_dim_call(binding: Any, is_list: bool) -> Any:
    """The dispatch plan's shortcut for the common call of a dim op (`_common_dim`) through its
    Python binding; NotImplemented for any other call (dim None, a 0-dim example), which the rule
    then handles."""

    def physical(x: torch.Tensor, dim: Any = None, *rest: Any) -> Any:
        new_dim = _common_dim(dim, x.dim() - 1, is_list)
        return NotImplemented if new_dim is None else binding(x, new_dim, *rest)

    return physical


def _shift(dim: int, rank: int, scalar: bool) -> int:
    if scalar:
        if dim not in (0, -1):
            raise IndexError(f"Dimension out of range (expected to be in range of [-1, 0], but got {dim})")
        return 1
    if not -rank <= dim < rank:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})")
    return (dim + rank if dim < 0 else dim) + 1


def _unscalar(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.reshape(out.shape[0]) if out.dim() == 2 and out.shape[1] == 1 else out
    return type(out)(_unscalar(o) for o in out)


def full_rule(dim_variant, **fixed):
    """A full reduction (no dim argument) as its dim variant over the flattened logical tensor."""

    call = dim_binding(dim_variant) or dim_variant  # the binding: cheaper (see dim_binding)

    def rule(info, in_dims, x, *args, **kwargs):
        flat = x.reshape(x.shape[0], -1)
        return call(flat, 1, *args, **kwargs, **fixed), 0

    return rule


def _dim_pos(op: Any) -> int:
    names = [a.name for a in op._schema.arguments]
    return names.index("dim") if "dim" in names else names.index("dims")


for op in ops_of(
    "sum.dim_IntList", "mean.dim", "amax.default", "amin.default", "logsumexp.default", "nansum.default",
    "var.correction", "std.correction", "var_mean.correction", "std_mean.correction", "any.dims", "all.dims",
    "count_nonzero.dim_IntList", "prod.dim_int", "any.dim", "all.dim", "max.dim", "min.dim",
    "_softmax.default", "_log_softmax.default", "cumsum.default", "cumprod.default", "logcumsumexp.default",
    "cummax.default", "cummin.default", "sort.default", "sort.stable", "median.dim", "nanmedian.dim", "mode.default",
    "squeeze.dim", "squeeze.dims", "var.dim", "std.dim", "norm.ScalarOpt_dim", "nanmean.default",
    "unbind.int", "special_logsumexp.default", "linalg_vector_norm.default", "kthvalue.default",
    "topk.default", "norm.ScalarOpt_dim_dtype", "argsort.default", "argsort.stable", "hash_tensor.default",
):
    RULES[op] = dim_rule(op, _dim_pos(op))
for op in ops_of("argmax.default", "argmin.default"):
    RULES[op] = dim_rule(op, 1, all_when_none=False)
# two same-shaped tensors, then dim: the softmax backwards
SHORT_SOFTMAX_BYTES = 32  # a float32 softmax dim shorter than this many bytes: by formula (below)


def softmax_backward_rule(func: Any, log: bool):
    """The softmax backwards: the kernel over the shifted dim, except for a float32 softmax over a
    last dim shorter than SHORT_SOFTMAX_BYTES, where torch's CPU kernel runs each row without its
    vector loop (about twice the time of the formula below); there torch's own decomposition,
    broadcasting an unbatched argument instead of expanding it:
    log: grad - exp(out) * sum(grad); plain: grad * out - out * sum(grad * out)."""
    kernel = dim_rule(func, 2, n_tensors=2)

    def rule(info, in_dims, *args, **kwargs):
        if kwargs or len(args) != 4:
            return kernel(info, in_dims, *args, **kwargs)
        grad, out, dim, input_dtype = args
        gd, od = in_dims[0], in_dims[1]
        if not (isinstance(grad, torch.Tensor) and isinstance(out, torch.Tensor) and type(dim) is int) \
                or not grad.dtype == out.dtype == input_dtype == torch.float32 or grad.device.type != "cpu":
            return kernel(info, in_dims, *args)
        shape = grad.shape[gd is not None:]
        if not shape or shape != out.shape[od is not None:] or dim not in (-1, len(shape) - 1) \
                or shape[-1] * grad.element_size() >= SHORT_SOFTMAX_BYTES:
            return kernel(info, in_dims, *args)
        g = grad if gd is not None else grad.unsqueeze(0)
        y = out if od is not None else out.unsqueeze(0)
        if log:
            return g - y.exp() * g.sum(-1, keepdim=True), 0
        gy = g * y
        return gy - y * gy.sum(-1, keepdim=True), 0

    return rule


for op in ops_of("_softmax_backward_data.default"):
    RULES[op] = softmax_backward_rule(op, log=False)
for op in ops_of("_log_softmax_backward_data.default"):
    RULES[op] = softmax_backward_rule(op, log=True)

# full reductions
RULES[aten.sum.default] = full_rule(aten.sum.dim_IntList)
RULES[aten.mean.default] = full_rule(aten.mean.dim)
RULES[aten.prod.default] = full_rule(aten.prod.dim_int)
RULES[aten.max.default] = full_rule(aten.amax.default)
RULES[aten.min.default] = full_rule(aten.amin.default)
RULES[aten.all.default] = full_rule(aten.all.dim)
RULES[aten.any.default] = full_rule(aten.any.dim)


def flip_rule(info, in_dims, x, dims):
    """flip over a dim list, where an empty list flips nothing (not "all dims" as for reductions)."""
    rank = x.dim() - 1
    shifted = [_shift(d, rank, rank == 0) for d in dims]  # checks the dims even where nothing flips
    # flip copies even where it flips nothing: handing back `x` would make the result share the
    # input's memory, and a write into it would change the input
    return (x.flip(shifted) if shifted and rank > 0 else x.clone()), 0


def aminmax_rule(info, in_dims, x, *, dim=None, keepdim=False):
    rank = x.dim() - 1
    if dim is None:  # over every element: flatten each example, then put the kept dims back
        lo, hi = aten.aminmax.default(x.reshape(x.shape[0], -1), dim=1)
        if keepdim:
            lo, hi = lo.reshape((-1,) + (1,) * rank), hi.reshape((-1,) + (1,) * rank)
        return (lo, hi), (0, 0)
    if rank == 0:
        lo, hi = aten.aminmax.default(x.unsqueeze(-1), dim=1, keepdim=keepdim)
        return ((lo.squeeze(-1), hi.squeeze(-1)) if keepdim else (lo, hi)), (0, 0)
    return aten.aminmax.default(x, dim=_shift(dim, rank, False), keepdim=keepdim), (0, 0)


def median_full_rule(dim_variant):
    """median()/nanmedian() of every element: the dim variant's values over each flattened example."""

    def rule(info, in_dims, x):
        return dim_variant(x.reshape(x.shape[0], -1), 1)[0], 0

    return rule


RULES[aten.flip.default] = flip_rule
RULES[aten.aminmax.default] = aminmax_rule
RULES[aten.median.default] = median_full_rule(aten.median.dim)
RULES[aten.nanmedian.default] = median_full_rule(aten.nanmedian.dim)


def segment_reduce_rule(info, in_dims, data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                        unsafe=False, initial=None):
    """Segments along a logical axis: the batch dim joins the leading dims, which segment_reduce
    takes per row when lengths/offsets carry them too (the same segments for every example)."""
    B = data.shape[0]
    ax = axis + (data.dim() - 1) if axis < 0 else axis

    for name, t in (("lengths", lengths), ("offsets", offsets)):
        if t is not None and t.dim() - 1 != ax:
            raise RuntimeError(f"segment_reduce(): Expected axis to be the last dimension of {name} but got {ax}.")

    def lead(t):
        return None if t is None else t.unsqueeze(0).expand((B,) + tuple(t.shape)).contiguous()

    out = aten.segment_reduce.default(data, reduce, lengths=lead(lengths), indices=indices, offsets=lead(offsets),
                                      axis=ax + 1, unsafe=unsafe, initial=initial)
    return out, 0


RULES[aten.segment_reduce.default] = segment_reduce_rule
