"""Printing a tensor inside a transform the way torch.func prints it.

torch.func wraps a tensor once per transform level it belongs to and prints each wrapper:
`BatchedTensor(lvl=L, bdim=D, value=...)` for vmap, `GradTrackingTensor(lvl=L, value=...)` for
grad/vjp/jvp, where L numbers the transforms running from the outermost (1) in, and the innermost
`value` is the plain tensor. The engine has a wrapper for vmap only: a differentiating transform's
input is a plain tensor (or a batched one) that autograd records. So the levels a tensor belongs
to are found here: its vmap levels from its BatchedTensor nesting, its grad levels from the
engine's marks on the inputs of the differentiating transforms still running (`mark_grad_input`)
that its autograd graph reaches. A tensor reaching none of them prints as PyTorch prints it.

Printing only: nothing here is read by any computation.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

from engine._batched import BatchedTensor, _active, clock

# Differentiating transforms running (all threads, as vmap's `_active`): token -> entry stamp.
_grads_active: dict[int, tuple] = {}
_tokens = itertools.count(1)
_ORIGINAL_REPR = torch.Tensor.__repr__
_KEY = "vb_grad_level"


def push_grad() -> int:
    """A differentiating transform starts running its function: its token."""
    token = next(_tokens)
    _grads_active[token] = clock()
    return token


def pop_grad(token: int) -> None:
    _grads_active.pop(token, None)


def mark_grad_input(t: torch.Tensor, token: int, source: torch.Tensor) -> None:
    """`t`, an input the transform `token` differentiates (made from `source`, an alias of it): a
    leaf carries the token itself, a connected input (a view of an outer input) carries it on its
    autograd node. A batched source's printed batch dim (a vmap input's) carries over."""
    if t.grad_fn is None:
        t._vb_grad_level = token
    else:
        t.grad_fn.metadata[_KEY] = token
    if type(source) is BatchedTensor and type(t) is BatchedTensor:
        shown = _shown(source)
        if shown is not None:
            t._vb_shown = (t._elem,) + shown


def _shown(t: BatchedTensor) -> tuple | None:
    """(the caller's tensor, its batch dim) for a vmap input entered at a dim other than 0 whose
    physical tensor is still the one it entered with (an in-place view op such as transpose_
    replaces it), else None."""
    shown = getattr(t, "_vb_shown", None)
    return shown[1:] if shown is not None and shown[0] is t._elem else None


def _lvl(stamp: tuple) -> int:
    """torch.func's level number of the transform entered at `stamp`: 1 + those running that started before it."""
    grads, vmaps = list(_grads_active.values()), list(_active.values())  # copies: other threads may enter or leave
    return 1 + sum(s < stamp for s in grads) + sum(i.stamp < stamp for i in vmaps)


def _grad_tokens(t: torch.Tensor) -> set[int]:
    """The running differentiating transforms whose inputs `t`'s autograd graph reaches."""
    found = set()
    own = getattr(t, "_vb_grad_level", None)
    if own is not None:
        found.add(own)
    fn = t.grad_fn
    stack, seen = ([fn] if fn is not None else []), set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        token = node.metadata.get(_KEY) if hasattr(node, "metadata") else None
        if token is not None:
            found.add(token)
        variable = getattr(node, "variable", None)
        if variable is not None and getattr(variable, "_vb_grad_level", None) is not None:
            found.add(variable._vb_grad_level)
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return {tok for tok in found if tok in _grads_active}


def _indent(text: str) -> str:
    return "\n".join("    " + line if line else line for line in text.split("\n"))


def _wrap_grads(tokens: set[int], above: int, inner: str) -> str:
    """`inner` wrapped in a GradTrackingTensor per token whose level is above `above`, innermost first."""
    for lvl in sorted(_lvl(_grads_active[t]) for t in tokens):
        if lvl > above:
            inner = f"GradTrackingTensor(lvl={lvl}, value=\n{_indent(inner)}\n)"
    return inner


def tensor_repr(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
    """torch.Tensor.__repr__ while differentiating transforms run (installed by engine._guards)."""
    if not _grads_active or type(self) is not torch.Tensor:
        return _ORIGINAL_REPR(self, *args, **kwargs)
    tokens = _grad_tokens(self) if self.requires_grad else set()
    if not tokens:
        return _ORIGINAL_REPR(self, *args, **kwargs)
    return _wrap_grads(tokens, 0, _ORIGINAL_REPR(self.detach(), *args, **kwargs))


def batched_repr(self: BatchedTensor) -> str:
    """torch.func's format: `BatchedTensor(lvl=L, bdim=D, value=` then the physical tensor's repr
    indented, with D the dim the caller's tensor was batched at for a vmap input (the engine keeps
    every batch dim at 0: the input is shown as it was given), 0 otherwise; and the levels of the
    differentiating transforms above it as GradTrackingTensor wrappers."""
    info = _active.get(self._level)
    lvl = _lvl(info.stamp) if info is not None else 1
    shown = _shown(self)
    value, bdim = (repr(self._elem), 0) if shown is None else (repr(shown[0]), shown[1])
    tokens = _grad_tokens(self) if _grads_active and self.requires_grad else set()
    text = f"BatchedTensor(lvl={lvl}, bdim={bdim}, value=\n{_indent(value)}\n)"
    return _wrap_grads(tokens, lvl, text)


BatchedTensor.__repr__ = batched_repr  # type: ignore[method-assign, assignment]
