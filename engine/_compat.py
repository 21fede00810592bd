"""What differs between the torch releases the project supports (pyproject: torch>=2.13,<2.16).

The engine leans on torch internals whose shape changes between releases. Each such difference is
resolved here, once, at import, so the rest of the engine names one thing whatever the release;
tests/test_compat.py checks that every shim resolves on the running torch. A shim either finds the
internal or says which one is missing: none of them substitutes a different behaviour.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

TORCH_VERSION: tuple[int, int] = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])  # type: ignore[assignment]
SUPPORTED = ((2, 13), (2, 15))  # the oldest and newest minor release supported, both inclusive

# torch.autograd.Function.apply: a Python classmethod up to 2.14, a C classmethod descriptor from 2.15.
# Both are callable as (cls, *args, **kwargs): the classmethod through its function, the descriptor
# itself.
_FUNCTION_APPLY = vars(torch.autograd.Function)["apply"]
function_apply: Callable[..., Any] = getattr(_FUNCTION_APPLY, "__func__", _FUNCTION_APPLY)


def function_apply_owner(func: Any) -> type | None:
    """The autograd.Function subclass whose original `apply` `func` is (`SomeFunction.apply`, bound
    before the engine's check was installed), or None for any other callable."""
    owner = getattr(func, "__self__", None)
    if isinstance(owner, type) and issubclass(owner, torch.autograd.Function) \
            and func == _FUNCTION_APPLY.__get__(None, owner):
        return owner
    return None
