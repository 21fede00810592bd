"""Histograms (histc, histogram, histogramdd) batched per element with the kernel's own binning.

Each example's values are binned exactly as ATen's CPU kernel bins them (histc: the linear formula
`(x - left) * bins / (right - left)` truncated, in the input dtype; histogram/histogramdd: the
bin whose edges hold the value, i.e. the binary search the kernel's local search agrees with),
the rightmost bin closed, values outside the outer edges (and NaN) dropped. The bin ids are then
offset by example so one index_add fills every example's histogram at once.

Bin edges built from a bin count come from torch.linspace per example: linspace's rounding
depends on its SIMD lane layout, so only linspace itself reproduces the edges bit for bit.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from engine.rules._helpers import materialize
from engine.rules._table import RULES

aten = torch.ops.aten


def _outer_edges(x: torch.Tensor, rng: Sequence[float] | None, widen: float) -> list[tuple[float, float]]:
    """(leftmost, rightmost) per example and dim of x [B, N, D], as the kernel selects them."""
    B, N, D = x.shape
    if rng is not None:
        pairs = [(float(rng[2 * d]), float(rng[2 * d + 1])) for d in range(D)]
        out = [pairs] * B
    elif N > 0:
        lo, hi = x.aminmax(dim=1)
        # .item() (not .tolist()) so engine.trace sees the data-dependent read and refuses to bake it
        out = [[(lo[b, d].item(), hi[b, d].item()) for d in range(D)] for b in range(B)]
    else:  # no values: the kernel's default range [0, 1] (not a widened point)
        out = [[(0.0, 1.0)] * D for _ in range(B)]
    fixed = []
    for pairs in out:
        row = []
        for lo, hi in pairs:
            if not (abs(lo) != float("inf") and abs(hi) != float("inf") and lo == lo and hi == hi):
                raise ValueError(f"histogram: range of [{lo}, {hi}] is not finite")
            if lo > hi:
                raise ValueError(f"histogram: min should not exceed max, but got min {lo} max {hi}")
            if lo == hi:
                lo, hi = lo - widen, hi + widen
            row.append((lo, hi))
        fixed.append(row)
    return fixed


def _linspace_edges(outer: list[list[tuple[float, float]]], bins: Sequence[int], dtype: torch.dtype,
                    device: Any) -> list[torch.Tensor]:
    """Per dim, the [B, bins+1] edges torch.linspace gives each example."""
    return [torch.stack([torch.linspace(row[d][0], row[d][1], bins[d] + 1, dtype=dtype, device=device)
                         for row in outer]) for d in range(len(bins))]


def _fill(x: torch.Tensor, edges: list[torch.Tensor], weight: torch.Tensor | None, density: bool,
          linear: bool) -> torch.Tensor:
    """Histograms [B, *bins] of x [B, N, D] over per-example edges (each [B, n_d + 1])."""
    B, N, D = x.shape
    nbins = [e.shape[1] - 1 for e in edges]
    inside = torch.ones(B, N, dtype=torch.bool, device=x.device)
    flat = torch.zeros(B, N, dtype=torch.long, device=x.device)
    for d, e in enumerate(edges):
        v, left, right = x[..., d], e[:, :1], e[:, -1:]
        inside &= (v >= left) & (v <= right)
        if linear:
            pos = ((v - left) * nbins[d] / (right - left)).to(torch.long)
        else:
            pos = torch.searchsorted(e.contiguous(), v.contiguous(), right=True) - 1
        pos = torch.where(pos >= nbins[d], nbins[d] - 1, pos).clamp_min(0)  # the rightmost bin is closed
        flat = flat * nbins[d] + pos
    total = 1
    for n in nbins:
        total *= n
    flat = torch.where(inside, flat, 0) + torch.arange(B, device=x.device).unsqueeze(1) * total
    w = torch.ones(B, N, dtype=x.dtype, device=x.device) if weight is None else weight.reshape(B, N)
    w = torch.where(inside, w, 0)  # values outside add +0 (no change) rather than being indexed out: traceable
    hist = torch.zeros(B * total, dtype=x.dtype, device=x.device)
    hist.index_add_(0, flat.reshape(-1), w.reshape(-1))
    hist = hist.reshape(B, *nbins)
    if density:
        hist = hist / hist.reshape(B, -1).sum(1).reshape((B,) + (1,) * D)
        for d, e in enumerate(edges):
            shape = [B] + [1] * D
            shape[d + 1] = nbins[d]
            hist = hist / e.diff(dim=1).reshape(shape)
    return hist


def _points(x: torch.Tensor, B: int, dims: int | None) -> torch.Tensor:
    """x as [B, N, D]: D = 1 for histc/histogram, the last dim for histogramdd."""
    return x.reshape(B, -1, 1) if dims is None else x.reshape(B, -1, dims)


def _weight(weight: torch.Tensor | None, dw: Any, B: int) -> torch.Tensor | None:
    return None if weight is None else materialize(weight, dw, B)


def histc_rule(info, in_dims, x, bins=100, min=0, max=0):
    if not x.is_floating_point():
        raise RuntimeError(f"torch.histc: input tensor must be floating point, got {x.dtype}")
    if bins <= 0:
        raise RuntimeError(f"torch.histc(): bins must be > 0, but got {bins} for dim 0")
    B = info.batch_size
    pts = _points(x, B, None)
    lo, hi = float(min), float(max)
    rng = None if lo == hi else (lo, hi)
    outer = _outer_edges(pts, rng, 1.0)
    return _fill(pts, _linspace_edges(outer, [bins], x.dtype, x.device), None, False, linear=True), 0


def histogram_bin_ct_rule(info, in_dims, x, bins=100, *, range=None, weight=None, density=False):
    B = info.batch_size
    x = materialize(x, in_dims[0], B)
    pts = _points(x, B, None)
    edges = _linspace_edges(_outer_edges(pts, range, 0.5), [bins], x.dtype, x.device)
    w = _weight(weight, in_dims[2] if len(in_dims) > 2 else None, B)
    return (_fill(pts, edges, w, density, linear=False), edges[0]), (0, 0)


def histogram_bins_tensor_rule(info, in_dims, x, bins, *, weight=None, density=False):
    B = info.batch_size
    x = materialize(x, in_dims[0], B)
    e = materialize(bins, in_dims[1], B)
    w = _weight(weight, in_dims[2] if len(in_dims) > 2 else None, B)
    return (_fill(_points(x, B, None), [e], w, density, linear=False), e.clone()), (0, 0)


def _dd_edges(x, B, bins, range):
    pts = _points(x, B, x.shape[-1])
    return pts, _linspace_edges(_outer_edges(pts, range, 0.5), list(bins), x.dtype, x.device)


def histogramdd_bin_edges_rule(info, in_dims, x, bins, *, range=None, weight=None, density=False):
    B = info.batch_size
    _, edges = _dd_edges(materialize(x, in_dims[0], B), B, bins, range)
    return list(edges), [0] * len(edges)


def histogramdd_from_bin_cts_rule(info, in_dims, x, bins, *, range=None, weight=None, density=False):
    B = info.batch_size
    pts, edges = _dd_edges(materialize(x, in_dims[0], B), B, bins, range)
    w = _weight(weight, in_dims[2] if len(in_dims) > 2 else None, B)
    return _fill(pts, edges, w, density, linear=False), 0


def histogramdd_from_bin_tensors_rule(info, in_dims, x, bins, *, weight=None, density=False):
    B = info.batch_size
    x = materialize(x, in_dims[0], B)
    dbins = in_dims[1] if isinstance(in_dims[1], list) else [in_dims[1]] * len(bins)
    edges = [materialize(e, d, B) for e, d in zip(bins, dbins)]
    w = _weight(weight, in_dims[2] if len(in_dims) > 2 else None, B)
    return _fill(_points(x, B, x.shape[-1]), edges, w, density, linear=False), 0


RULES[aten.histc.default] = histc_rule
RULES[aten.histogram.bin_ct] = histogram_bin_ct_rule
RULES[aten.histogram.bins_tensor] = histogram_bins_tensor_rule
RULES[aten._histogramdd_bin_edges.default] = histogramdd_bin_edges_rule
RULES[aten._histogramdd_from_bin_cts.default] = histogramdd_from_bin_cts_rule
RULES[aten._histogramdd_from_bin_tensors.default] = histogramdd_from_bin_tensors_rule
