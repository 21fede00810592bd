"""Pointwise family: every aten op tagged `pointwise` (unary, binary, ternary, comparisons, in-place
variants, activation backwards) plus a few untagged elementwise ops. One rule: move batch dims to
the front, pad batched arguments to the largest logical rank, let broadcasting do the rest."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from engine.rules._helpers import broadcast_shapes, lrank, ops_of, pad_batched
from engine.rules._table import RULES, set_rule

aten = torch.ops.aten


def pointwise_rule(func: Any):
    mutates_first = bool(func._schema.arguments) and func._schema.arguments[0].alias_info is not None and func._schema.arguments[0].alias_info.is_write
    n_returns = len(func._schema.returns)
    out_dims = (0,) * n_returns if n_returns > 1 else 0
    op = func._op if type(func) is torch._ops.OpOverload else func  # OpOverload.__call__ is exactly ._op
    expands = func in _NOT_BROADCASTING

    def rule(info, in_dims, *args, **kwargs):
        rank = 0
        dtypes = set()
        zero_rank_batched = False
        lowest = None  # the lowest logical rank of a batched argument
        for a, d in zip(args, in_dims):
            if isinstance(a, torch.Tensor):
                r = a.dim() - (d is not None)
                if r > rank:
                    rank = r
                dtypes.add(a.dtype)
                if d is not None:
                    if lowest is None or r < lowest:
                        lowest = r
                    if r == 0:
                        zero_rank_batched = True
        if zero_rank_batched and len(dtypes) > 1:
            args = _zero_dim_to_common_dtype(func, args, in_dims, mutates_first)
        if lowest == rank:  # every batched argument already has the largest logical rank
            new = args
        else:
            new = [pad_batched(a, rank) if d is not None else a for a, d in zip(args, in_dims)]
        if expands:
            new = _expanded(new)
        out = op(*new, **kwargs)
        if zero_rank_batched and len(dtypes) > 1 and not mutates_first:
            out = _logical_dtype(func, args, in_dims, kwargs, out)
        return out, out_dims

    # engine._dispatch may skip calling this rule: when every batched argument has the same logical
    # rank (>= 1) and no unbatched tensor a higher one, or every tensor argument is a batched 0-dim
    # one, it is `func` on the physical arguments.
    rule.same_rank_direct = not expands  # type: ignore[attr-defined]
    return rule


# Ops tagged pointwise whose CPU kernel does not broadcast its tensor operands on every path:
# float32 gelu_backward goes to oneDNN, which raises on operands of different shapes (a batched
# cotangent against an unbatched input). Their operands are expanded to the common shape (views).
_NOT_BROADCASTING = {aten.gelu_backward.default}


def _expanded(args: list) -> list:
    shapes = [a.shape for a in args if isinstance(a, torch.Tensor)]
    if all(s == shapes[0] for s in shapes):
        return args
    shape = broadcast_shapes(*shapes)
    return [a.expand(shape) if isinstance(a, torch.Tensor) else a for a in args]


# Tensor arguments that take no part in type promotion (a boolean condition or mask).
_NOT_PROMOTING = {"where": (0,), "masked_fill": (1,), "masked_fill_": (1,)}


def _zero_dim_to_common_dtype(func, args, in_dims, mutates_first: bool) -> list:
    """Batched 0-dim operands cast to the dtype the op computes in for the logical shapes.

    A batched 0-dim tensor is physically 1-dim, so it would take part in type promotion as a
    dimensioned tensor: float64 (0-dim, batched) * float32 [3] would compute in float64 and round
    once more when cast back to float32, where each element alone computes in float32. Casting it
    first to the common dtype of the logical operands (torch's type promotion, 0-dim operands
    counted as 0-dim) makes the physical computation the one each element runs: the cast is the
    conversion torch applies to a 0-dim operand of another dtype.
    """
    skip = _NOT_PROMOTING.get(func._schema.name.partition("::")[2], ())
    logical = [(a.dim() - (d is not None), a.dtype)
               for i, (a, d) in enumerate(zip(args, in_dims)) if isinstance(a, torch.Tensor) and i not in skip]
    if len(logical) < 2:
        return args
    target = _common_dtype(logical)
    return [a.to(target) if (isinstance(a, torch.Tensor) and d is not None and a.dim() == 1 and a.dtype != target
                             and i not in skip and not (mutates_first and i == 0)) else a
            for i, (a, d) in enumerate(zip(args, in_dims))]


# One-element CPU tensors by (dtype, has dims): type promotion depends on operands' dtypes and on
# whether each has dimensions, never on sizes, so these stand in for any operand of the op.
_TINY: dict[tuple[torch.dtype, bool], torch.Tensor] = {}


def _tiny(dtype: torch.dtype, dims: bool) -> torch.Tensor:
    t = _TINY.get((dtype, dims))
    if t is None:
        t = _TINY[(dtype, dims)] = torch.ones((1,) if dims else (), dtype=dtype)
    return t


def _common_dtype(logical: list[tuple[int, torch.dtype]]) -> torch.dtype:
    """torch's common dtype of operands given as (logical rank, dtype): dimensioned and 0-dim
    operands promote apart and then combine by category, as TensorIterator does (computed by
    torch.result_type on stand-ins; torch._prims_common's version imports sympy on first use)."""
    dim = zero = None
    for rank, dtype in logical:
        if rank:
            dim = dtype if dim is None else torch.promote_types(dim, dtype)
        else:
            zero = dtype if zero is None else torch.promote_types(zero, dtype)
    if dim is None or zero is None:
        return dim if zero is None else zero
    with _disable_current_modes():  # (not an op of the computation: nothing records it)
        return torch.result_type(_tiny(dim, True), _tiny(zero, False))


def _logical_dtype(func, args, in_dims, kwargs, out):
    """A batched 0-dim tensor is physically 1-dim, which changes type promotion: the op's output
    dtype for the logical operands, from its kernel on one-element stand-ins (on meta where the
    kernel refuses them; torch's Python meta kernels import Dynamo on first use)."""
    tiny = [_tiny(a.dtype, (a.dim() - (d is not None)) > 0) if isinstance(a, torch.Tensor) else a
            for a, d in zip(args, in_dims)]
    try:
        with _disable_current_modes():  # (not an op of the computation: nothing records it)
            expected = func(*tiny, **kwargs)
    except Exception:  # noqa: BLE001 - refuses ones (a value check): ask the meta kernel
        expected = None
    if expected is not None:
        return _cast_like(out, expected)
    meta_args = []
    for a, d in zip(args, in_dims):
        if isinstance(a, torch.Tensor) and (d is not None or a.dim() > 0):
            shape = a.shape[1:] if d is not None else a.shape
            meta_args.append(torch.empty(shape, dtype=a.dtype, device="meta"))
        else:
            meta_args.append(a)
    try:
        expected = func(*meta_args, **kwargs)
    except Exception:  # noqa: BLE001 - meta kernel missing: keep the physical dtype
        return out
    return _cast_like(out, expected)


def _cast_like(out, expected):
    if isinstance(out, torch.Tensor):
        return out if out.dtype == expected.dtype else out.to(expected.dtype)
    return type(out)(o if o.dtype == e.dtype else o.to(e.dtype) for o, e in zip(out, expected))


def _is_out_variant(op: Any) -> bool:
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


def _tagged_pointwise_ops() -> list[Any]:
    ops = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        base, _, overload = name[6:].partition(".")
        packet = getattr(torch.ops.aten, base, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is None or torch.Tag.pointwise not in op.tags or torch.Tag.nondeterministic_seeded in op.tags:
            continue
        if _is_out_variant(op) or any("[]" in str(a.type) for a in op._schema.arguments):
            continue
        # `equal` is tagged pointwise but answers one Python bool for the whole tensor: a value that
        # differs per batch element, which engine._dispatch refuses as data-dependent.
        if any(str(r.type) != "Tensor" for r in op._schema.returns):
            continue
        ops.append(op)
    return ops


UNTAGGED = ops_of(
    "clone.default", "_to_copy.default", "detach.default", "alias.default", "lift_fresh.default",
    "fill.Scalar", "fill_.Scalar", "zero_.default", "zero.default", "copy_.default", "copy.default",
    "where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar",
    "threshold_backward.default", "gelu_backward.default", "softplus_backward.default",
    "log_sigmoid_forward.default", "log_sigmoid_backward.default", "elu_backward.default",
    "hardtanh_backward.default", "leaky_relu_backward.default", "silu_backward.default",
    "mish_backward.default", "hardsigmoid_backward.default", "hardswish_backward.default",
    "relu.default", "relu_.default", "gelu.default", "silu.default", "sigmoid_backward.default",
    "tanh_backward.default", "masked_fill.Scalar", "masked_fill_.Scalar", "isnan.default",
    "positive.default", "resolve_conj.default", "resolve_neg.default", "hardshrink_backward.default",
    "softshrink_backward.default",
    "logical_not.default", "sign.default", "nan_to_num.default", "lerp.Scalar", "lerp.Tensor",
    "_softmax_backward_data.out",  # filtered below (out variant)
    # conversions: decompositions (group_norm, layer_norm backward) call them on batched tensors
    "to.dtype", "to.dtype_layout", "to.device",
)

set_rule([op for op in _tagged_pointwise_ops() + UNTAGGED if not _is_out_variant(op)], pointwise_rule)


def _masked_fill_tensor(info, in_dims, self, mask, value):
    """masked_fill.Tensor needs a 0-dim value; a batched value becomes a where()."""
    rank = max(lrank(self, in_dims[0]), lrank(mask, in_dims[1]))
    s = pad_batched(self, rank) if in_dims[0] is not None else self
    m = pad_batched(mask, rank) if in_dims[1] is not None else mask
    if in_dims[2] is None:
        return torch.ops.aten.masked_fill.Tensor(s, m, value), 0
    if value.dim() != 1:  # each element's value must be 0-dim, as the op requires (a where() would broadcast it)
        raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.dim() - 1} dimension(s)")
    _check_values_fit(value, self.dtype)
    v = pad_batched(value, rank)
    return torch.where(m, v.to(self.dtype), s), 0


def _check_values_fit(value: torch.Tensor, dtype: torch.dtype) -> None:
    """masked_fill refuses a value its self's dtype cannot hold (1e30 into int64, a complex number
    with an imaginary part into a real tensor); the where() the batched value becomes would cast it
    silently. Where the cast can lose anything, each element's value is put through masked_fill on a
    0-dim tensor of `dtype`, so the op's own check raises its own error for the first that fails."""
    if value.dtype == dtype or (torch.promote_types(value.dtype, dtype) == dtype
                                and value.dtype.itemsize <= dtype.itemsize):
        return
    while type(value) is not torch.Tensor and hasattr(value, "_elem"):  # batched at inner levels too
        value = value._elem
    target, everywhere = torch.zeros((), dtype=dtype, device=value.device), torch.ones((), dtype=torch.bool, device=value.device)
    for v in value.reshape(-1):
        torch.ops.aten.masked_fill.Tensor(target, everywhere, v)


def _masked_fill_tensor_(info, in_dims, self, mask, value):
    out, _ = _masked_fill_tensor(info, in_dims, self, mask, value)
    self.copy_(out.expand_as(self) if out.dim() == self.dim() else out)
    return self, 0


def _fill_tensor(info, in_dims, self, value):
    if in_dims[1] is None:
        return torch.ops.aten.fill.Tensor(self, value), in_dims[0]
    shape = (value.shape[0],) + tuple(self.shape[1:] if in_dims[0] is not None else self.shape)
    return pad_batched(value, len(shape) - 1).expand(shape).clone(), 0


def _fill_tensor_(info, in_dims, self, value):
    if in_dims[1] is None:
        return self.fill_(value), 0
    self.copy_(pad_batched(value, self.dim() - 1).expand_as(self))
    return self, 0


RULES[aten.masked_fill.Tensor] = _masked_fill_tensor
RULES[aten.masked_fill_.Tensor] = _masked_fill_tensor_
RULES[aten.fill.Tensor] = _fill_tensor
RULES[aten.fill_.Tensor] = _fill_tensor_


def prims_elementwise_rule(func: Any):
    """prims elementwise ops do not broadcast: pad, then expand every tensor to the common shape."""

    def rule(info, in_dims, *args, **kwargs):
        rank = max((a.dim() - (d is not None) for a, d in zip(args, in_dims) if isinstance(a, torch.Tensor)), default=0)
        new = [pad_batched(a, rank) if d is not None else a for a, d in zip(args, in_dims)]
        shape = broadcast_shapes(*[a.shape for a in new if isinstance(a, torch.Tensor)])
        new = [a.expand(shape) if isinstance(a, torch.Tensor) and a.shape != shape else a for a in new]
        return func(*new, **kwargs), 0

    return rule


_PRIMS_ELEMENTWISE = (
    "abs acos acosh asin asinh atan atanh bessel_i0 bessel_i0e bessel_i1 bessel_i1e bessel_j0 bessel_j1 "
    "bitwise_not cbrt ceil conj_physical cos cosh digamma erf erf_inv erfc erfcx exp exp2 expm1 floor imag "
    "isfinite lgamma log log1p log2 log10 ndtri neg real reciprocal round rsqrt sign signbit sin sinh "
    "spherical_bessel_j0 sqrt tan tanh trunc add atan2 bitwise_and bitwise_or bitwise_xor div eq fmax fmin "
    "fmod gcd ge gt hypot igamma igammac le lt maximum minimum mul ne nextafter pow remainder shift_left "
    "shift_right_arithmetic sub zeta where convert_element_type"
).split()
set_rule(
    [getattr(torch.ops.prims, n).default for n in _PRIMS_ELEMENTWISE if hasattr(torch.ops.prims, n)],
    prims_elementwise_rule,
)
