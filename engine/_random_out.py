"""Random factories called with out= inside vmap, refused before PyTorch decomposes them.

`torch.randn(3, out=y)` and `torch.rand(3, out=y, generator=g)` are composite in PyTorch: below the
Python function they are `y.resize_(3)` then `y.normal_()` / `y.uniform_()`, so engine.VmapMode
only ever sees an in-place draw into `y`, the same ops as the user writing `y.normal_()`, which
vmap accepts under randomness='same'. torch.func refuses every out= variant of a random op under
vmap (it sees the call before the decomposition); so does the engine, here, one level up: while a
vmap with randomness 'same' or 'different' runs its function, a __torch_function__ mode looks at
each torch call for a random function given an out= tensor. (Under randomness='error' every draw is
refused anyway, so no mode is entered and that path costs nothing; nested vmaps share the outermost
mode.) The mode costs a Python call per torch call on eager runs (automatic tracing's replays do not
run the function). The other random out= variants (rand.out, randint.out, normal.*_out,
bernoulli.out, ...) reach the dispatch as themselves and are refused there too
(engine._dispatch._random_out), with the same message.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from engine._dispatch import _random_out_error

# The torch functions that draw and take out= (torch.randn(..., out=y), torch.normal(m, s, out=y), ...).
_RANDOM_WITH_OUT = frozenset({
    torch.randn, torch.rand, torch.randint, torch.randperm, torch.normal, torch.bernoulli, torch.multinomial,
})


class RandomOutRefusal(TorchFunctionMode):
    """Active while a vmap with randomness 'same'/'different' runs its function: refuses a random
    torch function called with an out= tensor, as torch.func does; every other call passes through."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if kwargs:
            if func in _RANDOM_WITH_OUT and kwargs.get("out") is not None:
                raise _random_out_error(f"torch.{func.__name__}(..., out=...)")
            return func(*args, **kwargs)
        return func(*args)


_NOTHING = contextlib.nullcontext()


def random_out_refusal(randomness: str) -> contextlib.AbstractContextManager:
    """The context a vmap with this randomness runs its function in: a RandomOutRefusal for 'same'
    and 'different' unless one is already on the function-mode stack (an outer vmap's: one watch is
    enough, and each costs a Python call per torch call); nothing under 'error', where the draw
    itself is refused (engine._dispatch)."""
    if randomness == "error":
        return _NOTHING
    for i in range(torch._C._len_torch_function_stack()):
        if type(torch._C._get_function_stack_at(i)) is RandomOutRefusal:
            return _NOTHING
    return RandomOutRefusal()
