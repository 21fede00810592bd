"""Factory-like ops. `new_*` of a batched `self` are batched (one fresh tensor per element, as
torch.func makes them), so an in-place write of a batched value into them (`x.new_zeros(4).add_(v)`,
`x.new_empty(n).copy_(v)`) works per element; `*_like` keep the batch. linspace and logspace with
tensor endpoints batched per element are ATen's range formula over the whole batch."""
from __future__ import annotations

from typing import Any

import torch

from engine._fallbacks import _note_fallback

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


# ---------------------------------------------------------------------------------------------
# linspace / logspace with tensor endpoints: a batched start or end is one 0-dim value per element


def _endpoint(t: Any, d: Any, B: int, dtype: torch.dtype, name: str, op: str) -> torch.Tensor:
    """A [B, 1] column of one endpoint (a batched or unbatched 0-dim tensor, or a number)."""
    if isinstance(t, torch.Tensor):
        if t.dim() - (d is not None) != 0:
            raise RuntimeError(f"{op} only supports 0-dimensional start and end tensors, but got {name} with "
                               f"{t.dim() - (d is not None)} dimension(s)")
        return (t if d is not None else t.expand(B)).to(dtype).reshape(B, 1)
    return torch.full((B, 1), t, dtype=dtype)


def _spaced(info: Any, in_dims: Any, start: Any, end: Any, steps: int, base: float | None, op: Any,
            kwargs: dict) -> tuple[torch.Tensor, int]:
    """ATen's linspace/logspace kernel on every element at once: with step = (end - start) / (steps - 1),
    entry i is start + step * i in the first half and end - step * (steps - 1 - i) in the second (so
    both endpoints are exact), raised to `base` for logspace; one step is `start` itself. Integer
    dtypes truncate per SIMD lane in ATen, which no batched formula reproduces: they take the
    counted for-loop."""
    B = info.batch_size
    d0 = in_dims[0] if isinstance(start, torch.Tensor) else None
    d1 = in_dims[1] if isinstance(end, torch.Tensor) else None
    probe = [start, end]
    for j, t in enumerate(probe):  # the dtype ATen infers from the endpoints' kinds (numbers, no data)
        if isinstance(t, torch.Tensor):
            probe[j] = 1j if t.is_complex() else 1.0
    like = torch.linspace(probe[0], probe[1], 0, dtype=kwargs.get("dtype"), device=kwargs.get("device"))
    dtype, device = like.dtype, like.device
    name = "torch.logspace()" if base is not None else "torch.linspace()"
    if not (dtype.is_floating_point or dtype.is_complex):
        _note_fallback(op)
        rows = []
        for i in range(B):
            s = start[i] if d0 is not None else start
            e = end[i] if d1 is not None else end
            rows.append(op(s, e, steps, *([] if base is None else [base]), **kwargs))
        return torch.stack(rows), 0
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    s = _endpoint(start, d0, B, dtype, "start", name).to(device)
    e = _endpoint(end, d1, B, dtype, "end", name).to(device)
    if steps <= 1:
        wide = torch.complex128 if dtype.is_complex else torch.float64  # ATen: pow(base, start) in double
        out = s[:, :steps] if base is None else (base ** s[:, :steps].to(wide)).to(dtype)
        return out, 0
    step = (e - s) / (steps - 1)
    i = torch.arange(steps, device=device).to(dtype)
    half = steps // 2
    out = torch.where(torch.arange(steps, device=device) < half, s + step * i, e - step * ((steps - 1) - i))
    if base is not None:
        out = torch.pow(torch.tensor(base, dtype=dtype if dtype.is_floating_point else out.real.dtype, device=device), out)
    return out.to(dtype), 0


def _linspace_rule(op: Any) -> Any:
    def rule(info, in_dims, start, end, steps, **kwargs):
        return _spaced(info, in_dims, start, end, steps, None, op, kwargs)

    return rule


def _logspace_rule(op: Any) -> Any:
    def rule(info, in_dims, start, end, steps, base=10.0, **kwargs):
        return _spaced(info, in_dims, start, end, steps, base, op, kwargs)

    return rule


for op in ops_of("linspace.Tensor_Tensor", "linspace.Tensor_Scalar", "linspace.Scalar_Tensor"):
    RULES[op] = _linspace_rule(op)
for op in ops_of("logspace.Tensor_Tensor", "logspace.Tensor_Scalar", "logspace.Scalar_Tensor"):
    RULES[op] = _logspace_rule(op)
