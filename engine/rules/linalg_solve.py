"""Solvers and factorization helpers (solve, lstsq, triangular and Cholesky solves, LU unpacking,
Householder products, pinv): LAPACK-backed kernels that broadcast leading dims, so the batch dim is
one more leading dim once every operand carries it at the same logical rank.

Two things need care: a right-hand side that is a vector per example (torch reads a [*, n] B as a
vector only when its shape is A's without the last dim, which a batch dim can change) is made a
one-column matrix and squeezed back; and outputs that have A's own shape (LU, pivots) are reshaped
to it when A was padded to B's rank.
"""
from __future__ import annotations

import torch

from engine.rules._helpers import lrank, materialize, pad_batched, require_matrices
from engine.rules._table import RULES

aten = torch.ops.aten


def _operands(info, in_dims, *tensors):
    """Every tensor batched at 0 and padded to the largest logical rank among them."""
    B = info.batch_size
    ts = [materialize(t, d, B) for t, d in zip(tensors, in_dims)]
    rank = max(t.dim() - 1 for t in ts)
    return [pad_batched(t, rank) for t in ts]


def _one(t, d):
    """One element of an argument (itself when unbatched): to let the op raise its own error."""
    return t[0] if d is not None else t


def _is_vector_rhs(A, da, b, db) -> bool:
    la, lb = lrank(A, da), lrank(b, db)
    a_shape = A.shape[1:] if da is not None else A.shape
    b_shape = b.shape[1:] if db is not None else b.shape
    return lb == 1 or (lb == la - 1 and tuple(b_shape) == tuple(a_shape[:-1]))



def solve_ex_rule(info, in_dims, A, b, left=True, check_errors=False):
    require_matrices(A, in_dims[0], lambda: aten._linalg_solve_ex.default(_one(A, in_dims[0]), _one(b, in_dims[1]), left=left))
    B = info.batch_size
    vector = _is_vector_rhs(A, in_dims[0], b, in_dims[1])
    if vector:
        b = b.unsqueeze(-1)
    Am, bm = _operands(info, in_dims[:2], A, b)
    result, LU, pivots, status = aten._linalg_solve_ex.default(Am, bm, left=left, check_errors=check_errors)
    if vector:
        result = result.squeeze(-1)
    a_shape = A.shape[1:] if in_dims[0] is not None else A.shape
    return (result, LU.reshape(B, *a_shape), pivots.reshape(B, *a_shape[:-1]), status.reshape(B, *a_shape[:-2])), (0, 0, 0, 0)


def lu_solve_rule(info, in_dims, LU, pivots, b, left=True, adjoint=False):
    require_matrices(LU, in_dims[0], lambda: aten.linalg_lu_solve.default(
        _one(LU, in_dims[0]), _one(pivots, in_dims[1]), _one(b, in_dims[2]), left=left, adjoint=adjoint))
    LUm, bm = _operands(info, (in_dims[0], in_dims[2]), LU, b)
    piv = pad_batched(materialize(pivots, in_dims[1], info.batch_size), LUm.dim() - 2)
    return aten.linalg_lu_solve.default(LUm, piv, bm, left=left, adjoint=adjoint), 0


def solve_triangular_rule(info, in_dims, A, b, *, upper, left=True, unitriangular=False):
    require_matrices(A, in_dims[0], lambda: aten.linalg_solve_triangular.default(
        _one(A, in_dims[0]), _one(b, in_dims[1]), upper=upper, left=left, unitriangular=unitriangular))
    Am, bm = _operands(info, in_dims[:2], A, b)
    return aten.linalg_solve_triangular.default(Am, bm, upper=upper, left=left, unitriangular=unitriangular), 0


def triangular_solve_rule(info, in_dims, b, A, upper=True, transpose=False, unitriangular=False):
    bm, Am = _operands(info, in_dims[:2], b, A)
    sol, coeff = aten.triangular_solve.default(bm, Am, upper, transpose, unitriangular)
    return (sol, coeff), (0, 0)


def cholesky_solve_rule(info, in_dims, b, L, upper=False):
    bm, Lm = _operands(info, in_dims[:2], b, L)
    return aten.cholesky_solve.default(bm, Lm, upper), 0


def lstsq_rule(info, in_dims, A, b, rcond=None, *, driver=None):
    require_matrices(A, in_dims[0], lambda: aten.linalg_lstsq.default(_one(A, in_dims[0]), _one(b, in_dims[1]), rcond, driver=driver))
    B = info.batch_size
    vector = _is_vector_rhs(A, in_dims[0], b, in_dims[1])
    if vector:
        b = b.unsqueeze(-1)
    Am, bm = _operands(info, in_dims[:2], A, b)
    sol, residuals, rank, sv = aten.linalg_lstsq.default(Am, bm, rcond, driver=driver)
    if vector:
        sol = sol.squeeze(-1)
        if residuals.numel():
            residuals = residuals.squeeze(-1)
    # Outputs a driver does not compute are empty tensors without the batch dims: the same for every example.
    outs, dims = [sol], [0]
    for o in (residuals, rank, sv):
        batched = o.dim() > 0 and o.shape[0] == B and o.numel() > 0
        outs.append(o)
        dims.append(0 if batched else None)
    return tuple(outs), tuple(dims)


def lu_unpack_rule(info, in_dims, LU, pivots, unpack_data=True, unpack_pivots=True):
    B = info.batch_size
    P, L, U = aten.lu_unpack.default(materialize(LU, in_dims[0], B), materialize(pivots, in_dims[1], B),
                                     unpack_data, unpack_pivots)
    # An output not asked for (unpack_data/unpack_pivots False) is a 1-D empty tensor, the same for
    # every element; an asked-for one is a batch of matrices, empty or not (a batch of 0 x 3 x 3
    # matrices is still batched: reading emptiness as "unbatched" expanded it into a wrong shape).
    return (P, L, U), tuple(0 if o.dim() > 1 else None for o in (P, L, U))


def householder_product_rule(info, in_dims, A, tau):
    B = info.batch_size
    return aten.linalg_householder_product.default(materialize(A, in_dims[0], B), materialize(tau, in_dims[1], B)), 0


def cholesky_inverse_rule(info, in_dims, L, upper=False):
    require_matrices(L, 0, lambda: aten.cholesky_inverse.default(L[0], upper))
    return aten.cholesky_inverse.default(L, upper), 0


def pinv_rule(info, in_dims, x, atol=None, rtol=None, hermitian=False):
    B = info.batch_size
    x = materialize(x, in_dims[0], B)
    require_matrices(x, 0, lambda: aten.linalg_pinv.atol_rtol_tensor(x[0], hermitian=hermitian))
    batch_rank = x.dim() - 3  # logical batch dims of the matrix
    tols = []
    for t, d in ((atol, in_dims[1] if len(in_dims) > 1 else None), (rtol, in_dims[2] if len(in_dims) > 2 else None)):
        if isinstance(t, torch.Tensor):
            t = pad_batched(materialize(t, d, B), batch_rank)
        tols.append(t)
    return aten.linalg_pinv.atol_rtol_tensor(x, atol=tols[0], rtol=tols[1], hermitian=hermitian), 0


RULES[aten._linalg_solve_ex.default] = solve_ex_rule
RULES[aten.linalg_lu_solve.default] = lu_solve_rule
RULES[aten.linalg_solve_triangular.default] = solve_triangular_rule
RULES[aten.triangular_solve.default] = triangular_solve_rule
RULES[aten.cholesky_solve.default] = cholesky_solve_rule
RULES[aten.linalg_lstsq.default] = lstsq_rule
RULES[aten.lu_unpack.default] = lu_unpack_rule
RULES[aten.linalg_householder_product.default] = householder_product_rule
RULES[aten.cholesky_inverse.default] = cholesky_inverse_rule
RULES[aten.linalg_pinv.atol_rtol_tensor] = pinv_rule


def _all_batched(op, cores: tuple | None = None):
    """Ops whose operands must share the batch dims (ormqr, ldl_solve): batch them all. Where the op
    broadcasts its operands' own batch dims (ldl_solve; `cores` gives each operand's number of
    non-batch dims), each is padded with size-1 dims after the vmap batch dim to the largest number
    of batch dims, so the vmap dim lines up with the vmap dim (an element [0, 2, 2] beside [2, 5]
    broadcasts to [0, 2, 5]; without padding the vmap dim of one met a batch dim of the other)."""

    def rule(info, in_dims, *args, **kwargs):
        B = info.batch_size
        new = [materialize(a, d, B) if isinstance(a, torch.Tensor) else a for a, d in zip(args, in_dims)]
        if cores is not None:
            lead = max(lrank(a, d) - c for a, d, c in zip(args, in_dims, cores))
            new = [pad_batched(a, lead + c) for a, c in zip(new, cores)]
        return op(*new, **kwargs), 0

    return rule


RULES[aten.ormqr.default] = _all_batched(aten.ormqr.default)
RULES[aten.linalg_ldl_solve.default] = _all_batched(aten.linalg_ldl_solve.default, cores=(2, 1, 2))
