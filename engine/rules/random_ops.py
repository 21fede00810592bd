"""Random ops with a batched argument, honouring vmap's `randomness`:
'different' draws per element (the physical op does), 'same' draws one logical tensor for all."""
from __future__ import annotations

import torch

from engine._batched import add_batch_dim
from engine._opmeta import op_meta
from engine.errors import RandomnessError
from engine.rules._helpers import materialize, ops_of, pad_batched
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
    """bernoulli(probs): probabilities differ per element, so 'same' has no single draw (refused)."""
    if info.randomness == "same":
        raise _same_with_batched_input(aten.bernoulli.default)
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
    """bernoulli_(self, p): fills self; 'same' draws one logical tensor and copies it to every element
    (refused when p is batched: per-element probabilities have no single draw)."""

    def rule(info, in_dims, self, p=0.5, *, generator=None):
        if info.randomness == "same" and isinstance(p, torch.Tensor) and in_dims[1] is not None:
            # probabilities that differ per element have no single draw to share (torch.func refuses too)
            raise _same_with_batched_input(func)
        if info.randomness == "same":
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
    """uniform_/normal_/exponential_/random_/cauchy_/geometric_/log_normal_ on a batched self: one
    physical fill for the whole batch, in torch.func's order of the random stream."""

    def rule(info, in_dims, self, *args, **kwargs):
        if info.randomness == "same":
            draw = torch.empty(self.shape[1:], dtype=self.dtype, device=self.device)
            func(draw, *args, **kwargs)
            self.copy_(draw.expand_as(self))
        else:
            func(self, *args, **kwargs)
        return self, 0

    return rule


for op in ops_of("uniform_.default", "normal_.default", "exponential_.default", "random_.default", "random_.from", "random_.to",
                 "cauchy_.default", "geometric_.default", "log_normal_.default"):
    RULES[op] = _fill_random_inplace(op)


# ---------------------------------------------------------------------------------------------
# torch.func's rules for the rest: one physical draw for the whole batch (so the random stream is
# consumed in torch.func's order, bit for bit with the same seed), and 'same' refused where the
# op's input differs per element (there is no single logical draw to share).


def _same_with_batched_input(func) -> RandomnessError:
    return RandomnessError(
        f"vmap: Vmap does not currently support same randomness with a batched tensor input "
        f"({func._schema.name}): the input differs per batch element, so there is no single draw to share. "
        f"Use randomness='different', or draw with an unbatched input outside the batched computation."
    )


def _pointwise_random(func):
    """normal(mean, std) / poisson / binomial / _standard_gamma / multinomial with batched inputs:
    'different' calls the op once on the physical tensors, 'same' is refused (as torch.func does)."""

    def rule(info, in_dims, *args, **kwargs):
        if info.randomness == "same":
            raise _same_with_batched_input(func)
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        rank = max(args[i].dim() - (in_dims[i] is not None) for i in tensors)
        new = list(args)
        for i in tensors:
            new[i] = pad_batched(materialize(args[i], in_dims[i], info.batch_size), rank)
        return func(*new, **kwargs), 0

    return rule


def _multinomial(info, in_dims, self, num_samples, replacement=False, *, generator=None):
    if info.randomness == "same":
        raise _same_with_batched_input(aten.multinomial.default)
    if self.dim() == 3:  # [B, M, S]: one multinomial over B*M rows
        out = aten.multinomial.default(self.flatten(0, 1), num_samples, replacement, generator=generator)
        return out.unflatten(0, self.shape[:2]), 0
    return aten.multinomial.default(self, num_samples, replacement, generator=generator), 0


for op in ops_of("normal.Tensor_float", "normal.float_Tensor", "normal.Tensor_Tensor", "poisson.default",
                 "binomial.default", "_standard_gamma.default", "_sample_dirichlet.default"):
    RULES[op] = _pointwise_random(op)
RULES[aten.multinomial.default] = _multinomial


def _size_position(func) -> int | None:
    for i, a in enumerate(func._schema.arguments):
        if a.name == "size" and not a.kwarg_only:
            return i
    return None


def draw_unbatched(func, info, args: tuple, kwargs: dict):
    """A random op with no batched argument under randomness='different' (VmapMode calls this).

    As torch.func: a factory draws once with the batch prepended to its size; an op on an unbatched
    tensor (rand_like, bernoulli, native_dropout, multinomial, normal(0., std)) draws once with every
    tensor argument expanded over the batch; anything else (randperm) draws once per element. An
    in-place fill of an unbatched tensor cannot hold a draw per element and is refused.
    """
    B = info.batch_size
    if op_meta(func).mutated:
        raise RandomnessError(
            f"vmap: Cannot ask for different inplace randomness on an unbatched tensor ({func._schema.name}). "
            f"This will appear like same randomness. Create the tensor with an out-of-place random op (e.g. "
            f"torch.randn) or make it batched first."
        )
    pos = _size_position(func)
    args = list(args)
    if pos is not None and pos < len(args):
        args[pos] = [B, *args[pos]]
        return add_batch_dim(func(*args, **kwargs), info.level)
    if pos is not None and "size" in kwargs:
        kwargs = dict(kwargs, size=[B, *kwargs["size"]])
        return add_batch_dim(func(*args, **kwargs), info.level)
    if args and isinstance(args[0], torch.Tensor) and func is aten.multinomial.default and args[0].dim() == 2:
        x = args[0]
        out = func(x.unsqueeze(0).expand(B, *x.shape).flatten(0, 1), *args[1:], **kwargs)
        return add_batch_dim(out.unflatten(0, (B, x.shape[0])), info.level)
    if any(isinstance(a, torch.Tensor) for a in args):
        # every tensor argument, wherever it stands (normal(mean: float, std: Tensor)), expanded
        args = [a.unsqueeze(0).expand(B, *a.shape) if isinstance(a, torch.Tensor) else a for a in args]
        out = func(*args, **kwargs)
        if isinstance(out, (tuple, list)):
            return type(out)(add_batch_dim(o, info.level) for o in out)
        return add_batch_dim(out, info.level)
    return add_batch_dim(torch.stack([func(*args, **kwargs) for _ in range(B)]), info.level)


def fresh_per_element(func, info, args: tuple, kwargs: dict):
    """`empty_like` / `new_empty` / `empty` of unbatched arguments under randomness='different' (VmapMode calls this).

    In the loop each iteration makes its own uninitialized tensor, so a batched one is the same
    thing; it lets an in-place draw into it (F.dropout's noise: `empty_like(x).bernoulli_(1 - p)`,
    feature dropout's `new_empty(...)`) draw per element as torch.func's dropout does for an unbatched
    input, in the same order from the random stream (one draw over [B, *shape]), instead of being
    refused as an in-place draw into an unbatched tensor.
    """
    B = info.batch_size
    if func is aten.empty_like.default:
        x = args[0]
        out = func(x.unsqueeze(0).expand(B, *x.shape), *args[1:], **kwargs)
    elif func is aten.new_empty.default:
        out = func(args[0], [B, *args[1]], *args[2:], **kwargs)
    else:
        out = func([B, *args[0]], *args[1:], **kwargs)
    return add_batch_dim(out, info.level)


# ---------------------------------------------------------------------------------------------
# Random ops torch.func has no rule for and refuses in every randomness mode, with or without a
# batched argument ("we do not yet support aten::rrelu"): refused the same way (engine._dispatch
# asks before any rule, decomposition or loop). rrelu draws its slopes in training mode only; in
# eval mode it is leaky_relu, which the error names as the op to call.

UNSUPPORTED_RANDOM = frozenset(ops_of(
    "rrelu_with_noise.default", "rrelu_with_noise_.default", "rrelu_with_noise_functional.default",
))


def unsupported_random_error(func) -> RandomnessError:
    return RandomnessError(
        f"vmap: we do not yet support {func._schema.name} (torch.rrelu, F.rrelu, nn.RReLU) inside vmap, in any "
        f"randomness mode, as torch.func does not. In eval mode (training=False) rrelu is "
        f"F.leaky_relu(x, negative_slope=(lower + upper) / 2): call that instead; in training mode draw the "
        f"slopes outside vmap (torch.empty_like(x).uniform_(lower, upper)) and apply them with torch.where."
    )
