"""Random ops with a batched argument, honouring vmap's `randomness`:
'different' draws per element (the physical op does), 'same' draws one logical tensor for all."""
from __future__ import annotations

import torch

from engine.rules._helpers import ops_of, pad_batched
from engine.rules._table import RULES

aten = torch.ops.aten


def _like_rule(func):
    def rule(info, in_dims, self, *args, **kwargs):
        if info.randomness == "same":
            return func(self[0], *args, **kwargs), None
        return func(self, *args, **kwargs), 0

    return rule


for op in ops_of("rand_like.default", "randn_like.default", "randint_like.default", "randint_like.low_dtype"):
    RULES[op] = _like_rule(op)


def _bernoulli_p(info, in_dims, self, p, *, generator=None):
    """bernoulli(self, p): a draw shaped like self."""
    if info.randomness == "same" and in_dims[0] is not None:
        return aten.bernoulli.p(self[0], p, generator=generator), None
    return aten.bernoulli.p(self, p, generator=generator), 0


def _bernoulli(info, in_dims, self, *, generator=None):
    """bernoulli(probs): probabilities differ per element; 'same' shares the uniform draws."""
    if info.randomness == "same":
        u = torch.rand(self.shape[1:], dtype=self.dtype, device=self.device, generator=generator)
        return (u < self).to(self.dtype), 0
    return aten.bernoulli.default(self, generator=generator), 0


def _native_dropout(info, in_dims, x, p, train):
    if not train or p == 0:
        return (x.clone(), torch.ones_like(x, dtype=torch.bool)), (0, 0)
    shape = x.shape if info.randomness == "different" else x.shape[1:]
    keep = torch.rand(shape, device=x.device) >= p
    if info.randomness == "same":
        keep = keep.unsqueeze(0).expand_as(x)
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    return (x * keep * scale, keep), (0, 0)


RULES[aten.bernoulli.p] = _bernoulli_p
RULES[aten.bernoulli.default] = _bernoulli
RULES[aten.native_dropout.default] = _native_dropout


def _bernoulli_inplace(func):
    """bernoulli_(self, p): fills self; 'same' draws one logical tensor and copies it to every element."""

    def rule(info, in_dims, self, p=0.5, *, generator=None):
        if info.randomness == "same" and isinstance(p, torch.Tensor) and in_dims[1] is not None:
            # per-element probabilities, one shared uniform draw
            u = torch.rand(self.shape[1:], dtype=self.dtype, device=self.device, generator=generator)
            self.copy_((u < pad_batched(p, self.dim() - 1)).to(self.dtype).expand_as(self))
        elif info.randomness == "same":
            draw = torch.empty(self.shape[1:], dtype=self.dtype, device=self.device)
            func(draw, p, generator=generator)
            self.copy_(draw.expand_as(self))
        else:
            p_phys = pad_batched(p, self.dim() - 1) if isinstance(p, torch.Tensor) and in_dims[1] is not None else p
            func(self, p_phys, generator=generator)
        return self, 0

    return rule


for op in ops_of("bernoulli_.float", "bernoulli_.Tensor"):
    RULES[op] = _bernoulli_inplace(op)


def _fill_random_inplace(func):
    """uniform_/normal_/exponential_ on a batched self."""

    def rule(info, in_dims, self, *args, **kwargs):
        if info.randomness == "same":
            draw = torch.empty(self.shape[1:], dtype=self.dtype, device=self.device)
            func(draw, *args, **kwargs)
            self.copy_(draw.expand_as(self))
        else:
            func(self, *args, **kwargs)
        return self, 0

    return rule


for op in ops_of("uniform_.default", "normal_.default", "exponential_.default", "random_.default", "random_.from", "random_.to"):
    RULES[op] = _fill_random_inplace(op)
