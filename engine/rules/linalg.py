"""Matrix products: `torch.matmul` broadcasts over leading dims, so a batch dim at 0 is just one
more broadcast dim; vector operands get a trailing unit dim so they are never mistaken for it."""
from __future__ import annotations

import torch

from engine.rules._helpers import lrank, pad_batched
from engine.rules._table import register_rule

aten = torch.ops.aten


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul, except that a contraction of size 1 (per-example outer products: the weight
    gradient of a linear layer for one example) is a broadcast multiply. As a batched matmul with an
    inner size of 1 it runs several times slower, and it is the bulk of per-sample gradients. And a
    product whose rows the batch folded into is laid out for the CPU's GEMM (`_rows_product`)."""
    if a.dim() >= 2 and b.dim() >= 2 and a.shape[-1] == 1 and a.dtype == b.dtype:
        return a * b
    if a.dim() == 3 and b.dim() == 2 and _column_major_rows(a):
        return _rows_product(a.flatten(0, 1), b).view(a.shape[0], a.shape[1], b.shape[1])
    return torch.matmul(a, b)


# Output widths for which a column-major left operand is multiplied the other way round (below).
_NARROW = range(2, 33)


def _column_major_rows(a: torch.Tensor) -> bool:
    """A CPU [B, n, k] whose B*n rows fold into one column-major [B*n, k] view (the batch folded
    into the rows of a product of examples, whose memory has the contraction dim outermost: the
    weight gradient of a batched backward), where the flattening is a view."""
    if a.device.type != "cpu" or not a.dtype.is_floating_point or a.shape[0] * a.shape[1] < 2:
        return False
    s0, s1, s2 = a.stride()
    return s1 == 1 and s0 == a.shape[1] and s2 >= a.shape[0] * a.shape[1]


def _rows_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for a column-major a [M, k]: as (b^T @ a^T)^T where the output is narrow. The CPU's
    GEMM (MKL) multiplies a transposed left operand into a narrow output on a slow path (a batched
    weight gradient of a narrow layer is such a product); at 64 columns the two are within 1.3x, at one it is a matrix-vector
    product either way. Same values up to the summation order of one GEMM against another."""
    if b.shape[1] in _NARROW and b.stride(1) == 1:
        return (b.t() @ a.t()).t()
    return a @ b


def _check_ranks(name: str, a: torch.Tensor, da, b: torch.Tensor, db, ra: int, rb: int) -> None:
    """The per-example rank check the unbatched kernel would make: a batch dim must never stand in
    for a missing operand dim (bmm of [B,3,3,2] and [2,2] is not a matrix product of examples)."""
    la, lb = lrank(a, da), lrank(b, db)
    if la != ra or lb != rb:
        raise RuntimeError(
            f"Shape mismatch: Got incorrect dims for {name}(a, b). a has dim {la} and b has dim {lb} but expected "
            f"them to have dim {ra} and dim {rb} (per batch element, inside vmap)."
        )


@register_rule(aten.mm.default)
def _mm(info, in_dims, a, b):
    _check_ranks("mm", a, in_dims[0], b, in_dims[1], 2, 2)
    if in_dims[0] is None:
        # Only the right operand is batched: one [n, k] @ [k, B*m] product, not B small ones.
        size, k, m = b.shape
        flat = b.movedim(0, 1).reshape(k, size * m)
        return (a @ flat).view(a.shape[0], size, m), 1
    return _matmul(a, b), 0


@register_rule(aten.bmm.default)
def _bmm(info, in_dims, a, b):
    _check_ranks("bmm", a, in_dims[0], b, in_dims[1], 3, 3)
    return _matmul(a, b), 0


@register_rule(aten.mv.default)
def _mv(info, in_dims, a, v):
    _check_ranks("mv", a, in_dims[0], v, in_dims[1], 2, 1)
    if in_dims[0] is None:
        # Only the vector is batched: [B, k] @ [k, n] is a single matrix product.
        return v @ a.transpose(0, 1), 0
    if in_dims[1] is None:
        return torch.matmul(a, v), 0
    return torch.matmul(a, v.unsqueeze(-1)).squeeze(-1), 0


@register_rule(aten.dot.default)
@register_rule(aten.vdot.default)
def _dot(info, in_dims, a, b):
    _check_ranks("dot", a, in_dims[0], b, in_dims[1], 1, 1)
    if in_dims[0] is not None and in_dims[1] is not None:
        return torch.matmul(a.unsqueeze(-2), b.unsqueeze(-1)).reshape(a.shape[0]), 0
    if in_dims[0] is not None:
        return torch.matmul(a, b), 0
    return torch.matmul(b, a), 0


@register_rule(aten.outer.default)
def _outer(info, in_dims, a, b):
    return a.unsqueeze(-1) * b.unsqueeze(-2), 0


def _any(dims) -> bool:
    return any(d is not None for d in dims)


def _add_bias(bias, bias_dim, prod, beta, alpha, rank, prod_batched=True):
    """beta * bias + alpha * prod, and the result's out_dim. With beta == 0 the bias's values are
    ignored (NaN included) as the op ignores them; a product of unbatched operands is then the same
    for every element (out_dim None), not a batched tensor."""
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod, (0 if prod_batched else None)
    if bias_dim is not None:
        bias = pad_batched(bias, rank)
    return prod + (bias if beta == 1 else bias * beta), 0


@register_rule(aten.addmm.default)
def _addmm(info, in_dims, bias, a, b, *, beta=1, alpha=1):
    return _add_bias(bias, in_dims[0], _matmul(a, b), beta, alpha, 2, _any(in_dims[1:]))


@register_rule(aten.addmv.default)
def _addmv(info, in_dims, bias, a, v, *, beta=1, alpha=1):
    return _add_bias(bias, in_dims[0], torch.matmul(a, v.unsqueeze(-1)).squeeze(-1), beta, alpha, 1, _any(in_dims[1:]))


@register_rule(aten.baddbmm.default)
def _baddbmm(info, in_dims, bias, a, b, *, beta=1, alpha=1):
    return _add_bias(bias, in_dims[0], _matmul(a, b), beta, alpha, 3, _any(in_dims[1:]))


@register_rule(aten.addbmm.default)
def _addbmm(info, in_dims, bias, a, b, *, beta=1, alpha=1):
    prod = torch.matmul(a, b).sum(-3)
    return _add_bias(bias, in_dims[0], prod, beta, alpha, 2, _any(in_dims[1:]))


@register_rule(aten.addr.default)
def _addr(info, in_dims, bias, u, v, *, beta=1, alpha=1):
    return _add_bias(bias, in_dims[0], u.unsqueeze(-1) * v.unsqueeze(-2), beta, alpha, 2, _any(in_dims[1:]))
