"""Layer norm as plain ops where a transform differentiates its function twice.

torch's double backward of layer norm (`layer_norm_double_backward`, FunctionsManual.cpp) writes in
place into temporaries made from one operand with values from another. Under vmap those operands
can belong to different batching levels (a Hessian per point through Linear -> LayerNorm: the
cotangent batched over the basis, the saved input over the points), and a batched write into an
unbatched tensor is refused (VmapError), as torch.func refuses it; torch.func itself never meets
it, because its batched mode decomposes `native_layer_norm_backward`. Here autograd records the
fused op's node before the engine sees the op, so the forward is decomposed instead, into ops whose
derivatives of every order are out-of-place: only while a second derivative is being built (the
function of a jvp/jacfwd/hessian, or of a grad/vjp inside another), so first-order gradients keep
the fused kernel. Anything the decomposition would not reproduce exactly as the op does (a shape
the op refuses, a low-precision dtype the kernel accumulates in float32) goes to the op itself.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_LAYER_NORMS = (F.layer_norm, torch.layer_norm)
_EXACT_DTYPES = (torch.float32, torch.float64)


class _Local(threading.local):
    active = False


_local = _Local()


class _Decompose(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _LAYER_NORMS:
            out = _layer_norm(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                cudnn_enable: bool = True) -> torch.Tensor | None:
    """F.layer_norm by mean, var and rsqrt; None where the op itself must answer."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not isinstance(input, torch.Tensor) or input.dtype not in _EXACT_DTYPES or not shape:
        return None
    if input.dim() < len(shape) or tuple(input.shape[-len(shape):]) != shape:
        return None
    for t in (weight, bias):
        if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != input.dtype):
            return None
    dims = tuple(range(-len(shape), 0))
    mean = input.mean(dims, keepdim=True)
    out = (input - mean) * torch.rsqrt(input.var(dims, correction=0, keepdim=True) + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


@contextlib.contextmanager
def decomposed(enabled: bool = True) -> Iterator[None]:
    """Run the body with layer norm decomposed (see the module), once per thread however deep."""
    if not enabled or _local.active:
        yield
        return
    _local.active = True
    try:
        with _Decompose():
            yield
    finally:
        _local.active = False
