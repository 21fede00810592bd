"""Triangular and Cholesky solves (MultivariateNormal, LowRankMultivariateNormal, Wishart).

Both kernels broadcast their leading (batch) dims, so a batch dim at 0 is one more broadcast dim:
a batched operand of lower logical rank than the other gets unit dims after its batch dim, an
unbatched one broadcasts as it is. One LAPACK batch instead of the for-loop.
"""
from __future__ import annotations

import torch

from engine.rules._helpers import lrank, pad_batched
from engine.rules._table import RULES

aten = torch.ops.aten


def _aligned(a, ad, b, bd):
    rank = max(lrank(a, ad), lrank(b, bd))
    return (pad_batched(a, rank) if ad is not None else a), (pad_batched(b, rank) if bd is not None else b)


def solve_triangular_rule(info, in_dims, a, b, *, upper, left=True, unitriangular=False):
    a, b = _aligned(a, in_dims[0], b, in_dims[1])
    return aten.linalg_solve_triangular.default(a, b, upper=upper, left=left, unitriangular=unitriangular), 0


def cholesky_solve_rule(info, in_dims, b, factor, upper=False):
    b, factor = _aligned(b, in_dims[0], factor, in_dims[1])
    return aten.cholesky_solve.default(b, factor, upper), 0


RULES[aten.linalg_solve_triangular.default] = solve_triangular_rule
RULES[aten.cholesky_solve.default] = cholesky_solve_rule
