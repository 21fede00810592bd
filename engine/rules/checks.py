"""Whole-tensor checks (`torch._is_all_true`, `torch._is_any_true`): reduced over the batch too.

torch.distributions validates its arguments with `if not torch._is_all_true(valid): raise ...`.
The answer is one Python bool for the whole call, so under vmap it is reduced over every batch
element as well, as torch.func does: the check then fires when any one element is invalid, and
the raise names that distribution and argument. The result is unbatched, so the `.item()` that
follows is not data-dependent for the engine (and becomes a guard under engine.trace).
"""
from __future__ import annotations

import torch

from engine.rules._table import RULES

aten = torch.ops.aten


def _whole_batch(op):
    def rule(info, in_dims, x):
        return op(x), None

    return rule


for _op in (aten._is_all_true.default, aten._is_any_true.default):
    RULES[_op] = _whole_batch(_op)
