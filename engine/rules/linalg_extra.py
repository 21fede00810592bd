"""Single-matrix linalg kernels treat every leading dim as a batch dim, so the batch dim at 0 is
just one more: call the op as is (one LAPACK batch instead of the loop), once each element is
known to be a matrix (a batch of vectors would pass physically as one matrix)."""
from __future__ import annotations

import torch

from engine.rules._helpers import leading_dims_flat, lrank, materialize, ops_of, pad_batched, require_matrices
from engine.rules._table import RULES

aten = torch.ops.aten


def _leading_batch_rule(op):
    def rule(info, in_dims, x, *args, **kwargs):
        require_matrices(x, 0, lambda: op(x[0], *args, **kwargs))
        out = op(leading_dims_flat(x), *args, **kwargs)
        return out, (tuple(0 for _ in out) if isinstance(out, (tuple, list)) else 0)

    return rule


def check_errors_rule(info, in_dims, info_tensor, api_name, is_matrix):
    # Batched info tensor: report it the way a batch of matrices is reported.
    aten._linalg_check_errors.default(info_tensor, api_name, is_matrix=False)
    return None, None


for _op in ops_of("linalg_cholesky_ex.default", "linalg_inv_ex.default", "_linalg_svd.default", "_linalg_eigh.default",
                  "linalg_eig.default", "linalg_qr.default", "linalg_lu_factor_ex.default", "linalg_ldl_factor_ex.default",
                  "_linalg_slogdet.default", "_linalg_det.default", "cholesky.default", "geqrf.default",
                  "linalg_matrix_exp.default", "_linalg_eigvals.default", "linalg_lu.default"):
    RULES[_op] = _leading_batch_rule(_op)
RULES[aten._linalg_check_errors.default] = check_errors_rule


def cdist_rule(info, in_dims, x1, x2, p, compute_mode=None):
    """Pairwise distances broadcast leading dims: both operands batched and padded to one rank."""
    B = info.batch_size
    a, b = materialize(x1, in_dims[0], B), materialize(x2, in_dims[1], B)
    rank = max(a.dim(), b.dim()) - 1
    return aten._cdist_forward.default(pad_batched(a, rank), pad_batched(b, rank), p, compute_mode), 0


RULES[aten._cdist_forward.default] = cdist_rule


def pdist_rule(info, in_dims, x, p=2):
    """pdist of each example: its condensed (upper-triangle) distance matrix, from one batched cdist
    that computes distances directly (compute_mode 2, no matrix-product shortcut), as pdist does."""
    n = x.shape[1]
    rows, cols = torch.triu_indices(n, n, 1, device=x.device)
    return aten._cdist_forward.default(x, x, p, 2)[:, rows, cols], 0


RULES[aten._pdist_forward.default] = pdist_rule


def trilinear_rule(info, in_dims, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """_trilinear (nn.functional.bilinear's kernel) as one einsum: every input names the dims it is
    not expanded along, the summed dims drop out, and batched inputs share a leading batch letter."""
    total = lrank(i1, in_dims[0]) + len(expand1)
    letters = "abcdefghijklmnopqrstuvwxy"[:total]
    specs = []
    for t, d, expand in ((i1, in_dims[0], expand1), (i2, in_dims[1], expand2), (i3, in_dims[2], expand3)):
        spec = "".join(c for i, c in enumerate(letters) if i not in set(expand))
        specs.append(("z" if d is not None else "") + spec)
    out = "z" + "".join(c for i, c in enumerate(letters) if i not in set(sumdim))
    return torch.einsum(f"{specs[0]},{specs[1]},{specs[2]}->{out}", i1, i2, i3), 0


RULES[aten._trilinear.default] = trilinear_rule
