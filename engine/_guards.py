"""What torch.func refuses inside a transformed function, refused the same way by the engine.

torch.func checks these in C++ while its transform stack is non-empty: `Tensor.requires_grad_()`
(which is also how `torch.autograd.functional.*` fails inside a transform), `Tensor.retain_grad()`,
and `autograd.Function.apply` of a Function without functorch support. The engine has no C++ hook,
so it puts checking wrappers around those three entry points, once per process (the first transform
installs them), and the wrappers are inert while no transformed function runs: they check a depth
counter and call the original. Installing and removing them around every transform call cost more than
the calls they guard (issue #18); an inert wrapper costs one Python call outside transforms. Engine code that must mark its own leaves calls `requires_grad(t)`, which bypasses the
check.

Under `vmap` alone (no grad transform running) they raise too, as in torch.func, although
`torch.autograd.grad` inside `engine.vmap` would give exact per-example gradients there: the engine
allowed it until issue #26 made torch.func's behaviour the bar. Per-example gradients come from
`engine.vmap(engine.grad(f))`, and `engine.functional.*` (torch.autograd.functional's API) may be
called inside `engine.vmap`.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from engine._compat import function_apply, function_apply_owner
from engine._repr import tensor_repr
from engine.autoswitch import departures
from engine.errors import UnsupportedInTransformError

_ORIGINAL_REQUIRES_GRAD = torch.Tensor.requires_grad_
_ORIGINAL_RETAIN_GRAD = torch.Tensor.retain_grad
_lock = threading.Lock()


class _StateLocal(threading.local):
    depth = 0   # transforms (vmap, grad, vjp, jvp, ...) currently running a user function
    vmap = 0    # of which vmaps
    own = False  # the engine's own requires_grad() is running (see `requires_grad`)


class _DepthLocal(threading.local):
    """Differentiating transforms (grad, vjp, jvp, jacrev, jacfwd) running on this thread: their
    state lives here, below the transforms that count it and the automatic tracing that reads it."""

    value = 0


# Per thread: a transform running in one thread must not change what a transform in another does
# (process-wide, a grad in one thread made another thread's results require grad).
_State = _StateLocal()
_Depth = _DepthLocal()


def requires_grad(t: torch.Tensor, flag: bool = True) -> torch.Tensor:
    """`t.requires_grad_(flag)` for the engine's own leaves, allowed inside transforms. A
    __torch_function__ mode (make_fx, a user's mode) re-dispatches the call through
    `torch.Tensor.requires_grad_`, the checking wrapper: the flag lets it through there."""
    own = _State.own
    _State.own = True
    try:
        return _ORIGINAL_REQUIRES_GRAD(t, flag)
    finally:
        _State.own = own


def _requires_grad_(self: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    if not _State.depth or _State.own:  # no transform running a user function, or the engine's own leaf
        return _ORIGINAL_REQUIRES_GRAD(self, requires_grad)
    raise UnsupportedInTransformError(
        "You are attempting to call Tensor.requires_grad_() (or perhaps using torch.autograd.functional.* "
        "APIs) inside of a function being transformed by an engine transform (vmap, grad, jacrev, ...), "
        "as torch.func also refuses. Call requires_grad_() outside the transform, or use the engine's "
        "transforms (engine.grad, engine.vjp, engine.functional.*) instead of torch.autograd.functional."
    )


def _retain_grad(self: torch.Tensor) -> None:
    if not _State.depth:
        return _ORIGINAL_RETAIN_GRAD(self)
    raise UnsupportedInTransformError(
        "You are attempting to call Tensor.retain_grad() inside of a function being transformed by an "
        "engine transform (vmap, grad, jacrev, ...), as torch.func also refuses. Return the intermediate "
        "(e.g. as has_aux output) or differentiate with respect to it instead."
    )


def _is_engine_function(cls: type) -> bool:
    """The engine's own Functions and those torch.library generates for custom ops (which torch.func
    runs through the op's registered autograd, not through this check)."""
    return cls.__module__.split(".")[0] == "engine" or cls.__module__ == "torch._library.autograd"


def _apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    if _State.depth and not _is_engine_function(cls):
        name = cls.__name__
        if cls.setup_context is torch.autograd.function._SingleLevelFunction.setup_context:
            raise UnsupportedInTransformError(
                f"In order to use an autograd.Function ({name}) with engine transforms (vmap, grad, jvp, jacrev, "
                f"...), it must override the setup_context staticmethod, as torch.func requires. Move the "
                f"ctx.save_for_backward calls of forward(ctx, ...) into setup_context(ctx, inputs, output); see "
                f"https://pytorch.org/docs/main/notes/extending.func.html"
            )
        if _State.vmap and not getattr(cls, "generate_vmap_rule", False) and "vmap" not in vars(cls):
            raise UnsupportedInTransformError(
                f"To use autograd.Function {name} with vmap, you must either override the vmap staticmethod "
                f"or set generate_vmap_rule=True (as torch.func requires)."
            )
    return function_apply(cls, *args, **kwargs)


class _Installed:
    done = False


def _install() -> None:
    """Put the checking wrappers in place for the rest of the process (they are inert at depth 0)."""
    with _lock:
        if not _Installed.done:
            torch.Tensor.requires_grad_ = _requires_grad_  # type: ignore[method-assign]
            torch.Tensor.retain_grad = _retain_grad  # type: ignore[method-assign]
            torch.autograd.Function.apply = classmethod(_apply)  # type: ignore[method-assign,assignment]
            torch.Tensor.__repr__ = tensor_repr  # type: ignore[method-assign]  # engine._repr: inert outside grad transforms
            _Installed.done = True


class transform_scope:  # noqa: N801 - used as `with transform_scope(...)`, like a function
    """Active while a transform runs the user's function: the checks above are in force. A class
    rather than a generator context manager: it is entered on every transform call."""

    __slots__ = ("is_vmap",)

    def __init__(self, is_vmap: bool = False) -> None:
        self.is_vmap = is_vmap

    def __enter__(self) -> None:
        if not _Installed.done:
            _install()
        departures.append(None)  # a transform runs: not the standard state (engine.autoswitch)
        with _lock:  # threads share the counters: no lost update may leave the checks on for good
            _State.depth += 1
            _State.vmap += self.is_vmap

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _State.depth -= 1
            _State.vmap -= self.is_vmap
        departures.pop()


def checked(func: Any) -> Any:
    """`SomeFunction.apply` passed to a transform as the function itself was bound before the check
    was put in place: route it through the check."""
    cls = function_apply_owner(func)
    if cls is not None:
        return lambda *args, **kwargs: _apply(cls, *args, **kwargs)
    return func
