"""Ops whose output size depends on the data (nonzero, unique, unique_consecutive) batched in one pass.

Under vmap such an op can answer only when every batch element gets the same size: the results
are then stacked, as the for-loop fallback would stack them. These rules compute all elements at
once (one nonzero, one sort), read the per-element sizes (a host sync, as the loop's stack needs)
and raise when they differ, naming the sizes, exactly where stacking the loop's results would fail.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from engine.errors import DataDependentError
from engine.rules._helpers import norm_dim
from engine.rules._table import RULES

aten = torch.ops.aten


def common_count(counts: torch.Tensor, op: str, hint: str) -> int:
    """The one size every batch element has (`counts`: one per element), else DataDependentError."""
    sizes = counts.tolist()
    if len(set(sizes)) > 1:
        shown = ", ".join(map(str, sizes[:8])) + (", ..." if len(sizes) > 8 else "")
        raise DataDependentError(
            f"vmap: {op} gives the batch elements outputs of different sizes ({shown}), so they cannot be "
            f"stacked into one batched tensor. {hint}")
    return int(sizes[0]) if sizes else 0


def nonzero_rule(info: Any, in_dims: Any, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """One nonzero over the whole batch: its rows come grouped by batch index, in each element's
    own row-major order, so dropping the batch column and splitting into equal groups is each
    element's nonzero."""
    B = x.shape[0]
    found = torch.nonzero(x)
    k = common_count(torch.bincount(found[:, 0], minlength=B), "nonzero",
                     "Use torch.nonzero_static(x, size=...) or a mask (torch.where) for a fixed size.")
    return found[:, 1:].reshape(B, k, x.dim() - 1), 0


RULES[aten.nonzero.default] = nonzero_rule


def _flat(t: torch.Tensor, keep: int) -> torch.Tensor:
    """t with its dims after the first `keep` merged into one (sizes spelled out: a -1 is
    ambiguous for an empty tensor)."""
    return t.reshape(*t.shape[:keep], math.prod(t.shape[keep:]))


def _runs(s: torch.Tensor) -> torch.Tensor:
    """[B, N, ...] -> [B, N] bool: True where a new run starts along dim 1 (the first entry, and
    every entry that differs from the one before: `!=`, so NaN starts a run of its own, as ATen's
    CPU kernels compare)."""
    starts = torch.ones(s.shape[:2], dtype=torch.bool, device=s.device)
    if s.shape[1] > 1:
        diff = s[:, 1:] != s[:, :-1]
        starts[:, 1:] = _flat(diff, 2).any(-1) if s.dim() > 2 else diff
    return starts


def _grouped(starts: torch.Tensor, op: str) -> tuple[int, torch.Tensor, torch.Tensor]:
    """From run starts [B, N]: the common run count K, each entry's run index [B, N] and the run
    lengths [B, K]."""
    B, N = starts.shape
    K = common_count(starts.sum(1), op, "Compare with a fixed set of values instead (e.g. x == values).")
    run = torch.cumsum(starts, 1) - 1
    counts = torch.zeros(B, K, dtype=torch.long, device=starts.device)
    if N:
        counts.scatter_add_(1, run, torch.ones_like(run))
    return K, run, counts


def _no_output(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(0, dtype=torch.long)


def _require_sorting_device(x: torch.Tensor, op: str) -> None:
    """The rules rely on unique's output being sorted, which torch documents for CPU and CUDA only."""
    if x.device.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"vmap: {op} is batched for CPU and CUDA tensors, where torch documents its output "
                                  f"as sorted; on {x.device.type} call it per element (a Python loop) instead")


def unique2_rule(info: Any, in_dims: Any, x: torch.Tensor, sorted: bool = True, return_inverse: bool = False,
                 return_counts: bool = False) -> tuple[Any, Any]:
    """torch.unique without dim. ATen's CPU and CUDA kernels sort whatever `sorted` says (and NaNs,
    last in the sort, stay distinct): one sort per row, runs of equal values, the run heads are the values."""
    _require_sorting_device(x, "unique")
    B = x.shape[0]
    flat = _flat(x, 1)
    s, perm = torch.sort(flat, dim=1)
    starts = _runs(s)
    K, run, counts = _grouped(starts, "unique")
    values = s[starts].reshape(B, K)
    inverse = counts_out = None
    if return_inverse:
        inverse = torch.empty_like(run).scatter_(1, perm, run).reshape(x.shape)
    if return_counts:
        counts_out = counts
    return ((values, _no_output(x) if inverse is None else inverse, _no_output(x) if counts_out is None else counts_out),
            (0, None if inverse is None else 0, None if counts_out is None else 0))


def unique_consecutive_rule(info: Any, in_dims: Any, x: torch.Tensor, return_inverse: bool = False,
                            return_counts: bool = False, dim: int | None = None) -> tuple[Any, Any]:
    """Runs of equal entries (dim None) or equal slices along `dim`, per element: the run heads."""
    B = x.shape[0]
    if dim is None:
        flat = _flat(x, 1)
        starts = _runs(flat)
        K, run, counts = _grouped(starts, "unique_consecutive")
        values = flat[starts].reshape(B, K)
        inverse = run.reshape(x.shape) if return_inverse else _no_output(x)
        return ((values, inverse, counts if return_counts else _no_output(x)),
                (0, 0 if return_inverse else None, 0 if return_counts else None))
    d = norm_dim(dim, x.dim() - 1) + 1
    moved = x.movedim(d, 1)
    starts = _runs(moved)
    K, run, counts = _grouped(starts, "unique_consecutive")
    heads = starts.nonzero()[:, 1].reshape(B, K)
    values = torch.gather(moved, 1, heads.reshape((B, K) + (1,) * (moved.dim() - 2)).expand((B, K) + moved.shape[2:]))
    # ATen's dim kernel returns the inverse and the counts whether asked or not
    return (values.movedim(1, d), run, counts), (0, 0, 0)


def _lex_order(rows: torch.Tensor) -> torch.Tensor:
    """[B, S, R] -> [B, S]: the order that sorts each element's S rows lexicographically (stable
    sorts from the last column to the first)."""
    B, S, R = rows.shape
    order = torch.arange(S, device=rows.device).expand(B, S)
    for c in range(R - 1, -1, -1):
        key = torch.gather(rows[:, :, c], 1, order)
        order = torch.gather(order, 1, torch.sort(key, dim=1, stable=True).indices)
    return order


def unique_dim_rule(info: Any, in_dims: Any, x: torch.Tensor, dim: int, sorted: bool = True,
                    return_inverse: bool = False, return_counts: bool = False) -> tuple[Any, Any]:
    """torch.unique with dim: each element's slices along `dim` sorted lexicographically (as ATen's
    CPU and CUDA kernels always do), runs of equal slices, the run heads. ATen sorts with `<`, which
    orders no NaN: a NaN leaves its order unspecified, so the rule raises rather than pick one."""
    _require_sorting_device(x, "unique(dim=...)")
    B = x.shape[0]
    d = norm_dim(dim, x.dim() - 1) + 1
    moved = x.movedim(d, 1)
    rows = _flat(moved, 2)
    if (x.is_floating_point() or x.is_complex()) and bool(torch.isnan(rows).any()):
        raise DataDependentError("vmap: unique(dim=...) of slices holding NaN: ATen's sort leaves their order "
                                 "unspecified, so no batched answer can match it; replace NaNs first (torch.nan_to_num)")
    order = _lex_order(rows)
    s = torch.gather(rows, 1, order.unsqueeze(-1).expand(rows.shape))
    starts = _runs(s)
    K, run, counts = _grouped(starts, "unique(dim=...)")
    heads = torch.gather(order, 1, starts.nonzero()[:, 1].reshape(B, K))
    values = torch.gather(moved, 1, heads.reshape((B, K) + (1,) * (moved.dim() - 2)).expand((B, K) + moved.shape[2:]))
    inverse = torch.empty_like(run).scatter_(1, order, run)
    return (values.movedim(1, d), inverse, counts), (0, 0, 0)


RULES[aten._unique2.default] = unique2_rule
RULES[aten.unique_consecutive.default] = unique_consecutive_rule
RULES[aten.unique_dim.default] = unique_dim_rule
