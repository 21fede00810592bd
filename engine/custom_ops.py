"""Custom ops for free: a `torch.library.custom_op` with a Python implementation and no batching
rule is batched by running that implementation on the batched arguments, so its aten ops each go
through the engine's rules (or their decompositions) instead of the for-loop fallback.

Autograd is not affected: the custom op's Autograd kernel sits above the Python dispatch key where
the engine lives, so backward still runs the op's own registered derivative (and that derivative's
ops are batched the same way under vmap). A rule registered with `engine.register_rule` for the
custom op is looked up first and wins.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from engine.errors import DataDependentError


def _opdef(func: Any) -> Any:
    if not isinstance(func, torch._ops.OpOverload) or func.namespace in ("aten", "prim", "prims"):
        return None
    from torch._library.custom_ops import OPDEFS

    return OPDEFS.get(func._schema.name)


def custom_vmap_rule(func: Any) -> Callable | None:
    """The rule given to `torch.library.register_vmap` for a custom op, used as an engine rule.

    Its signature (info with .batch_size/.randomness, in_dims, *args) is the engine's rule signature.
    """
    opdef = _opdef(func)
    return getattr(opdef, "_vmap_fn", None) if opdef is not None else None


def python_impl(func: Any) -> Callable | None:
    """The Python implementation behind a `torch.library.custom_op`, or None for any other op."""
    opdef = _opdef(func)
    if opdef is None:
        return None
    fn = getattr(opdef, "_init_fn", None)
    if fn is None:  # defined with device-specific kernels only: take the CPU one, else the default
        backends = getattr(opdef, "_backend_fns", {})
        fn = backends.get("cpu") or backends.get(None)
    return fn


def run_custom_op(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run a custom op's implementation on batched args; NotImplemented when `func` is not one.

    Ops that mutate their inputs are left to the fallback, which checks in-place writes per element;
    so are implementations that leave torch (`.numpy()`, `.item()`): they raise DataDependentError
    on batched tensors and then run per element in the fallback.
    """
    fn = python_impl(func)
    if fn is None or any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments):
        return NotImplemented
    try:
        return fn(*args, **kwargs)
    except DataDependentError:
        return NotImplemented
