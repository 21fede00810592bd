"""Factory-like ops. `new_*` depend only on their arguments, not on the values of `self`, so their
result is the same for every batch element (unbatched); `*_like` keep the batch."""
from __future__ import annotations

import torch

from engine.rules._helpers import ops_of
from engine.rules._table import RULES


def _new_rule(func):
    def rule(info, in_dims, self, *args, **kwargs):
        return func(self, *args, **kwargs), None

    return rule


def _like_rule(func):
    def rule(info, in_dims, self, *args, **kwargs):
        return func(self, *args, **kwargs), 0

    return rule


for op in ops_of("new_zeros.default", "new_ones.default", "new_empty.default", "new_full.default",
                 "new_empty_strided.default", "new_tensor.default"):
    RULES[op] = _new_rule(op)
for op in ops_of("zeros_like.default", "ones_like.default", "empty_like.default", "full_like.default"):
    RULES[op] = _like_rule(op)
