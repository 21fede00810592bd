"""Factory-like ops. `new_*` of a batched `self` are batched (one fresh tensor per element, as
torch.func makes them), so an in-place write of a batched value into them (`x.new_zeros(4).add_(v)`,
`x.new_empty(n).copy_(v)`) works per element; `*_like` keep the batch."""
from __future__ import annotations

import torch

from engine.rules._helpers import ops_of
from engine.rules._table import RULES

aten = torch.ops.aten


def _new_rule(func):
    def rule(info, in_dims, self, size, *args, **kwargs):
        return func(self, [self.shape[0], *size], *args, **kwargs), 0

    return rule


def _new_empty_strided(info, in_dims, self, size, stride, **kwargs):
    span = sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(n > 0 for n in size) else 0
    return aten.new_empty_strided.default(self, [self.shape[0], *size], [span, *stride], **kwargs), 0


def _like_rule(func):
    def rule(info, in_dims, self, *args, **kwargs):
        return func(self, *args, **kwargs), 0

    return rule


for op in ops_of("new_zeros.default", "new_ones.default", "new_empty.default", "new_full.default"):
    RULES[op] = _new_rule(op)
RULES[aten.new_empty_strided.default] = _new_empty_strided
for op in ops_of("zeros_like.default", "ones_like.default", "empty_like.default", "full_like.default"):
    RULES[op] = _like_rule(op)


def _new_zeros_with_same_feature_meta(info, in_dims, self, other, *, self_num_batch_dims=0):
    """Zeros shaped `self.shape[:n] + other.shape` with other's dtype and feature strides (forward-mode
    AD makes tangents with it). vmap's batch joins self's batch dims as the outermost one: self is
    taken batched (expanded when it is not) with one more batch dim, and other stands in by an
    empty tensor with one element's sizes and strides (only its metadata is read)."""
    B = info.batch_size
    s = self if in_dims[0] is not None else self.unsqueeze(0).expand(B, *self.shape)
    o = other if in_dims[1] is None else other.new_empty_strided(other.shape[1:], other.stride()[1:])
    return aten._new_zeros_with_same_feature_meta.default(s, o, self_num_batch_dims=self_num_batch_dims + 1), 0


RULES[aten._new_zeros_with_same_feature_meta.default] = _new_zeros_with_same_feature_meta
