"""clone / _to_copy with a channels-last memory_format on batched tensors.

channels_last names a layout of the *logical* 4-D (channels_last_3d: 5-D) tensor; the physical
tensor has the batch dim in front, so passing the format through would ask for channels-last of a
5-D (6-D) tensor and fail. The copy is made without the format and then laid out so each example
is channels-last with the batch dim outermost. Every other call goes to the pointwise rule.
"""
from __future__ import annotations

import torch

from engine.rules._table import RULES

aten = torch.ops.aten

_RANKS = {torch.channels_last: 4, torch.channels_last_3d: 5}


def _channels_last(x: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    """x [B, N, C, *spatial] laid out as B contiguous channels-last examples."""
    rank = x.dim() - 1
    if rank != _RANKS[fmt]:
        raise RuntimeError(f"required rank {_RANKS[fmt]} tensor to use {str(fmt).split('.')[-1]} format")
    last = list(range(3, x.dim())) + [2]
    back = [0, 1, x.dim() - 1] + list(range(2, x.dim() - 1))
    return x.permute(0, 1, *last).contiguous().permute(*back)


def _with_logical_format(op):
    base = RULES[op]

    def rule(info, in_dims, *args, **kwargs):
        fmt = kwargs.get("memory_format")
        if fmt not in _RANKS or in_dims[0] is None:
            return base(info, in_dims, *args, **kwargs)
        out, out_dims = base(info, in_dims, *args, **{**kwargs, "memory_format": torch.contiguous_format})
        return _channels_last(out, fmt), out_dims

    rule.same_rank_direct = getattr(base, "same_rank_direct", False)  # type: ignore[attr-defined]
    return rule


for _op in (aten.clone.default, aten._to_copy.default):
    RULES[_op] = _with_logical_format(_op)
