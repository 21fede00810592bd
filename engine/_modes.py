"""The base of the engine's TorchDispatchModes, and how they see composite ops."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_COMPOSITE_KEY = torch._C.DispatchKey.CompositeImplicitAutograd
_composite: dict[Any, bool] = {}


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


def decompose(mode: TorchDispatchMode, func: Any, args: tuple, kwargs: dict) -> Any:
    """`func` run as the ops it decomposes into, which reach `mode` again; NotImplemented when it
    is not a composite op (CompositeImplicitAutograd). A composite op reaches a mode when called
    below autograd (a batching rule, inference mode, a backward formula). Its C++ decomposition is
    run, the one an eager call runs (the Python one some ops also have imports torch's
    symbolic-shape module, sympy, at its first call)."""
    known = _composite.get(func)
    if known is None:
        known = _composite[func] = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE_KEY)
    if not known:
        return NotImplemented
    with mode:
        return func._op_dk(_COMPOSITE_KEY, *args, **kwargs)
