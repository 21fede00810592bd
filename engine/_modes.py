"""The base of the engine's TorchDispatchModes, and how they see composite ops."""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_COMPOSITE_KEY = torch._C.DispatchKey.CompositeImplicitAutograd
_UNSET = object()
_kernels: dict[Any, Any] = {}


class EngineMode(TorchDispatchMode):
    """A TorchDispatchMode whose handler PyTorch leaves unwrapped.

    PyTorch wraps each mode's `__torch_dispatch__` in a dynamo-disable wrapper, which imports
    Dynamo (and sympy: most of a second of a process) at the handler's first call and costs a
    call per op after. The engine's modes never run under dynamo (engine.compile compiles the
    recorded graph, not the engine), so the wrapper buys nothing here.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


def composite_kernel(func: Any) -> Callable[..., Any] | None:
    """The C++ decomposition of a composite op (CompositeImplicitAutograd), or None for other ops.

    It is what an eager call of the op runs, and what torch.func's transforms run; torch's Python
    decomposition that some of these ops also have (make_fx's and `OpOverload.decompose`'s
    choice) imports torch's symbolic-shape module (sympy, a quarter of a second) at its first call.
    """
    kernel = _kernels.get(func, _UNSET)
    if kernel is _UNSET:
        kernel = None
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE_KEY):
            kernel = functools.partial(func._op_dk, _COMPOSITE_KEY)
        _kernels[func] = kernel
    return kernel


def decompose(mode: TorchDispatchMode, func: Any, args: tuple, kwargs: dict) -> Any:
    """`func` run as the ops it decomposes into (`composite_kernel`), which reach `mode` again;
    NotImplemented when it is not a composite op. A composite op reaches a mode when called below
    autograd (a batching rule, inference mode, a backward formula)."""
    kernel = composite_kernel(func)
    if kernel is None:
        return NotImplemented
    with mode:
        return kernel(*args, **kwargs)
