"""`engine.auto_trace`: repeated calls run the recorded graph, only once the replay is shown safe.

The engine's eager path pays Python per op; `engine.trace` removes that but makes the user promise
that the function is a pure function of its arguments. `auto_trace(fn)` asks for that promise in
a narrower form and checks what it can, so that the common case (the same transformed function
called again and again with arguments of the same signature) runs at traced speed.

The proof obligation. A replay of the graph recorded for a signature returns what an eager call
would, when for that signature the function
1. runs the same tensor ops in the same order on every call: its Python control flow depends only
   on the signature (shapes, dtypes, non-tensor arguments) and on Python state that is not
   rebound between calls;
2. has no effect visible to Python other than its result (the replay runs no Python: a counter
   it increments, a list it appends to, a print, would not happen);
3. reads only tensors that are its arguments or that it reaches through bindings the trace saw
   (closed-over and global tensors are replayed as the same live objects; rebinding them is 1.).

What is checked, and what the user still promises by opting in:
- control flow on tensor *values* (`.item()`, `if t:`, `float(t)`) is caught by the trace, which
  then runs the function eagerly for that signature (engine.trace's fallback="eager");
- the bindings the function can read through names are recorded as a *guard*: every closure cell
  and every global name used by the function and, transitively, by the Python functions it reaches
  through those bindings (engine.vmap/grad wrappers, helpers, partials, bound methods). Before each
  call the guard is compared by identity with the one the graphs were recorded under: a rebinding
  (a closure variable or a global assigned anew, an `int` counter incremented) sends the call to the
  eager path and drops the graphs;
- a function that rebinds anything in its guard *while it runs* (`global n; n += 1`) has a side
  effect: it is marked impure and always runs eagerly;
- the first call of every guard state runs eagerly, so a replay only ever follows a clean eager
  call with the same bindings;
- NOT checked (the user's promise): mutation inside objects whose binding stays the same (a list
  or dict changed in place, a module attribute or `self.x` set), I/O, and state read through
  anything but names (e.g. `getattr` on strings). Functions that do these must not be wrapped.
"""
from __future__ import annotations

import functools
import types
from typing import Any, Callable

import torch

from engine.trace import TracedFunction

__all__ = ["AutoTraced", "auto_trace"]

_MAX_FUNCTIONS = 256  # a bound on the functions walked for the guard (deep helper graphs are cut off)
_LIBRARIES = frozenset({"torch", "engine", "functools"})


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _guard_slots(fn: Callable) -> list[tuple[Any, Any]]:
    """(container, key) pairs whose current value the guard reads: ("cell", cell) for closure cells,
    (globals dict, name) for global names; for `fn` and every Python function reachable from it."""
    slots: list[tuple[Any, Any]] = []
    seen: set[int] = set()
    stack = [fn]
    while stack and len(seen) < _MAX_FUNCTIONS:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, functools.partial):
            stack.extend((obj.func, *obj.args, *obj.keywords.values()))
            continue
        if isinstance(obj, types.MethodType):
            stack.append(obj.__func__)
            continue
        if not isinstance(obj, types.FunctionType):
            wrapped = getattr(obj, "__wrapped__", None)
            if wrapped is not None:
                stack.append(wrapped)
            if isinstance(obj, torch.nn.Module):
                stack.append(type(obj).forward)
            elif not isinstance(obj, type) and isinstance(getattr(type(obj), "__call__", None), types.FunctionType):
                stack.append(type(obj).__call__)
            continue
        for cell in obj.__closure__ or ():
            slots.append(("cell", cell))
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell (a name assigned later)
                pass
        if obj.__module__ is not None and obj.__module__.split(".")[0] in _LIBRARIES:
            continue  # library globals are not rebound by user code; their closures were followed
        namespace = obj.__globals__
        for name in sorted(_code_names(obj.__code__)):
            if name in namespace:
                slots.append((namespace, name))
                value = namespace[name]
                if not isinstance(value, types.ModuleType):
                    stack.append(value)
    return slots


_EMPTY = object()


def _read(slot: tuple[Any, Any]) -> Any:
    container, key = slot
    if container == "cell":
        try:
            return key.cell_contents
        except ValueError:
            return _EMPTY
    return container.get(key, _EMPTY)


class AutoTraced:
    """Callable returned by `auto_trace`; see the module docstring for when it replays."""

    def __init__(self, fn: Callable, cache_size: int = 8):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.traced = TracedFunction(fn, fallback="eager", cache_size=cache_size)
        self.impure = False
        self.eager_calls = 0
        self._slots = _guard_slots(fn)
        self._verified: tuple | None = None  # the guard values a clean eager call ran under

    def _snapshot(self) -> tuple:
        return tuple(_read(s) for s in self._slots)

    def _same(self, snapshot: tuple) -> bool:
        verified = self._verified
        return verified is not None and all(a is b for a, b in zip(snapshot, verified))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.impure:
            self.eager_calls += 1
            return self.fn(*args, **kwargs)
        before = self._snapshot()
        if self._same(before):
            traces = self.traced.cache_info().traces
            out = self.traced(*args, **kwargs)
            if self.traced.cache_info().traces != traces and any(a is not b for a, b in zip(before, self._snapshot())):
                self._mark_impure()  # the recording call (a real run) rebound what it reads
            return out
        # New bindings (or the first call): graphs recorded under the old ones are void.
        self.traced.cache_clear()
        self._verified = None
        self.eager_calls += 1
        out = self.fn(*args, **kwargs)
        after = self._snapshot()
        if any(a is not b for a, b in zip(before, after)):
            self._mark_impure()  # it rebinds what it reads: a side effect the replay would not do
        else:
            self._verified = before
        return out

    def _mark_impure(self) -> None:
        self.impure = True
        self._verified = None
        self.traced.cache_clear()


def auto_trace(fn: Callable, *, cache_size: int = 8) -> AutoTraced:
    """Run `fn` eagerly until it is shown safe to replay, then replay its recorded graphs.

    `fn` is any composition of engine transforms (`engine.vmap(f)`, `engine.vmap(engine.grad(f))`,
    ...). The first call (and the first after a binding `fn` reads changed) is eager; later calls
    with the same input signature replay the graph engine.trace records, as long as the names `fn`
    reads are bound to the same objects. Functions that branch on tensor values run eagerly for
    that signature; functions that rebind what they read while running always run eagerly. What
    the caller promises by wrapping: `fn` does not mutate objects in place (lists, dicts, module
    attributes) or do I/O as a side effect, and reads no state except through names (module docstring).
    """
    if not callable(fn):
        raise TypeError(f"engine.auto_trace: fn must be callable, got {type(fn).__name__}")
    if not isinstance(cache_size, int) or cache_size < 1:
        raise ValueError(f"engine.auto_trace: cache_size must be a positive int, got {cache_size!r}")
    return AutoTraced(fn, cache_size)
