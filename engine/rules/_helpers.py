"""Shared helpers of the rule families: batch dims always live at 0 (see engine._batched)."""
from __future__ import annotations

from typing import Any, Sequence

import torch


def lrank(x: torch.Tensor, d: Any) -> int:
    """Logical rank of an argument given its batch dim (0 or None)."""
    return x.dim() - (d is not None)


def norm_dim(dim: int, rank: int) -> int:
    """Normalize a logical dim (negative allowed); rank-0 tensors accept 0 and -1 like PyTorch."""
    r = max(rank, 1)
    if not -r <= dim < r:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-r}, {r - 1}], but got {dim})")
    return dim + r if dim < 0 else dim


def phys_dim(dim: int, rank: int) -> int:
    """The physical dim of logical `dim` of a batched tensor (batch at 0)."""
    return norm_dim(dim, rank) + 1


def pad_batched(x: torch.Tensor, rank: int) -> torch.Tensor:
    """View a batched x (batch at 0) as [B, 1, ..., 1, *logical] with `rank` logical dims."""
    missing = rank - (x.dim() - 1)
    if missing <= 0:
        return x
    return x.view((x.shape[0],) + (1,) * missing + tuple(x.shape[1:]))


def materialize(x: torch.Tensor, d: Any, size: int) -> torch.Tensor:
    """A batched view of x: unbatched arguments are expanded along a new dim 0."""
    if d is not None:
        return x
    return x.unsqueeze(0).expand((size,) + tuple(x.shape))


def batch_size(args: Sequence[Any], dims: Sequence[Any]) -> int:
    for a, d in zip(args, dims):
        if d == 0:
            return a.shape[0]
        if isinstance(d, list):
            for b, e in zip(a, d):
                if e == 0:
                    return b.shape[0]
    raise AssertionError("rule called without a batched argument")


def out_dims_like(out: Any, d: Any = 0) -> Any:
    if isinstance(out, (tuple, list)):
        return tuple(None if o is None else d for o in out)
    return d


def ops_of(*names: str) -> list[Any]:
    """aten OpOverloads from 'name.overload' strings, skipping those this torch build lacks."""
    found = []
    for n in names:
        base, _, overload = n.partition(".")
        packet = getattr(torch.ops.aten, base, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None:
            found.append(op)
    return found
