"""The Python state a recorded graph was made under, and a cheap check that it is unchanged.

A graph recorded from a run of `fn` bakes in every Python value the run read: closure variables,
globals, attributes of the objects it reached (a Module's `training` flag, its hooks, which
Parameter objects it holds, a float attribute used as a scale), the contents of captured lists
and dicts. `StateGuard(roots)` walks what is reachable from the roots (the function, and the
nn.Modules and global names engine.purity saw the run use) and records, for every container on
the way, the identity of what it holds: closure cells, global names, `__dict__` values, list and
dict entries, a Module's parameters, buffers, submodules and hook tables; for tensors reached, the
metadata a graph depends on (shape, strides, dtype, device, requires_grad: a tensor's *values* are
read live by the replay). `holds()` compares the current state with the recorded one by identity
(container sizes and tensor metadata by equality). User classes (not torch's or the engine's)
are walked too: their attributes and methods.

What it cannot see is refused rather than trusted: an iterator or generator reachable from the
function (a replay would not advance it), or more reachable state than `MAX_ITEMS` (guarding it
would cost more than the replay saves): `unprovable` names it, and the caller keeps eager.
Python modules are not walked, but the attributes of user modules named by the code are guarded
like globals (`config.SCALE`).
"""
from __future__ import annotations

import functools
import operator
import types
from typing import Any, Iterable

import torch
from torch.distributions import Distribution as _Distribution

from engine.purity import _is_torch_or_engine

__all__ = ["StateGuard"]

MAX_ITEMS = 20000
_LIBRARIES = frozenset({"torch", "engine", "functools", "builtins", "typing", "collections", "abc", "numpy", "math"})
_EMPTY = object()
_MODULE_DICTS = (
    "_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
    "_backward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
)
_ATOMS = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _is_library(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] in _LIBRARIES


def _tensor_meta(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device, t.requires_grad)


def torch_globals() -> tuple:
    """Process-wide torch settings that change what the same Python computes (the default dtype of
    factories, matmul precision, torch.distributions' argument checks); the default device and
    autocast are modes the caller refuses outright."""
    return (_default_dtype(), _matmul_precision(), _Distribution._validate_args)


_default_dtype = torch._C.get_default_dtype
_matmul_precision = torch._C._get_float32_matmul_precision

def _global_hook_dicts() -> list[dict]:
    from torch.nn.modules import module as nn_module

    names = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
             "_global_backward_pre_hooks", "_global_forward_hooks_always_called")
    return [getattr(nn_module, n) for n in names if isinstance(getattr(nn_module, n, None), dict)]


class StateGuard:
    """Identity snapshot of the state reachable from `roots`; see the module docstring."""

    def __init__(self, roots: Iterable[Any], slots: Iterable[tuple[dict, str]] = ()) -> None:
        self.cells: list[types.CellType] = []
        self.names: list[tuple[dict, str]] = []  # (namespace dict, name)
        self.dicts: list[Any] = []  # dicts (and user classes' mappingproxies) whose keys and values are guarded
        self.seqs: list[Any] = []  # lists/tuples/sets whose items are guarded
        self.tensors: list[torch.Tensor] = []
        self.objects: list[Any] = []  # whose class is guarded (a parametrization swaps a Module's class)
        self.unprovable: str | None = None
        self._seen: set[int] = set()
        self._names_seen: set[tuple[int, str]] = set()
        for namespace, name in slots:
            self._name(namespace, name, [])
        for d in _global_hook_dicts():
            self._dict(d, [])
        stack = list(roots)
        while stack and self.unprovable is None:
            self._visit(stack.pop(), stack)
            if len(self._seen) > MAX_ITEMS:
                self.unprovable = f"more than {MAX_ITEMS} objects of state are reachable from the function"
        self.recorded = self._read()

    # -- walking ------------------------------------------------------------------------------

    def _name(self, namespace: dict, name: str, stack: list) -> None:
        key = (id(namespace), name)
        if key in self._names_seen:
            return
        self._names_seen.add(key)
        self.names.append((namespace, name))
        value = namespace.get(name, _EMPTY)
        if value is _EMPTY:
            return
        if isinstance(value, types.ModuleType):
            return
        stack.append(value)

    def _dict(self, d: dict, stack: list) -> None:
        self.dicts.append(d)
        stack.extend(d.values())

    def _visit(self, obj: Any, stack: list) -> None:
        if isinstance(obj, _ATOMS) or obj is None:
            return
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            self.tensors.append(obj)
            return
        if isinstance(obj, type):
            if not _is_library(obj):  # a user class: its attributes and methods (`Config.scale`)
                self.dicts.append(obj.__dict__)
                stack.extend(obj.__dict__.values())
                stack.extend(b for b in obj.__bases__ if b is not object)
            return
        if isinstance(obj, (types.ModuleType, types.BuiltinFunctionType, types.CodeType)):
            return
        if isinstance(obj, types.FunctionType):
            self._function(obj, stack)
            return
        roots = getattr(type(obj), "_guard_roots", None)
        if roots is not None:  # a traced wrapper: the state is its function's, not its caches
            stack.extend(roots(obj))
            return
        if isinstance(obj, types.MethodType):
            stack.extend((obj.__func__, obj.__self__))
            return
        if isinstance(obj, functools.partial):
            stack.extend((obj.func, *obj.args, *obj.keywords.values()))
            self.seqs.append(obj.args)
            self._dict(obj.keywords, stack)
            return
        if isinstance(obj, (list, tuple, set, frozenset)):
            self.seqs.append(obj)
            stack.extend(obj)
            return
        if isinstance(obj, dict):
            self._dict(obj, stack)
            return
        if isinstance(obj, types.GeneratorType) or (hasattr(type(obj), "__next__") and not isinstance(obj, torch.nn.Module)):
            self.unprovable = f"it reaches an iterator ({type(obj).__name__}), which a replay would not advance"
            return
        if isinstance(obj, torch.nn.Module):
            for name in _MODULE_DICTS:
                d = obj.__dict__.get(name)
                if isinstance(d, dict):
                    self._dict(d, stack)
            stack.append(type(obj).forward)
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):
            self._dict(attrs, stack)
            self.objects.append(obj)
        stack.append(type(obj))
        call = getattr(type(obj), "__call__", None)
        if isinstance(call, types.FunctionType) and not _is_library(call):
            stack.append(call)

    def _function(self, fn: types.FunctionType, stack: list) -> None:
        for cell in fn.__closure__ or ():
            self.cells.append(cell)
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell (a name assigned later)
                pass
        stack.extend(fn.__defaults__ or ())
        stack.extend((fn.__kwdefaults__ or {}).values())
        if _is_library(fn) or _is_torch_or_engine(fn.__code__.co_filename):
            # Library globals are not rebound by user code; its closures were followed. (The
            # file, not __module__: functools.wraps gives the engine's wrappers the user's.)
            return
        namespace = fn.__globals__
        names = _code_names(fn.__code__)
        for name in sorted(names):
            if name not in namespace:
                continue
            self._name(namespace, name, stack)
            value = namespace[name]
            if isinstance(value, types.ModuleType) and not _is_library(value) and value.__name__.split(".")[0] not in _LIBRARIES:
                for attr in sorted(names):  # `config.SCALE`: the attribute read through a user module
                    if attr in value.__dict__:
                        self._name(value.__dict__, attr, stack)

    # -- checking -----------------------------------------------------------------------------

    def _read(self) -> tuple[list, list]:
        idents: list[Any] = []
        sizes: list[int] = []
        for cell in self.cells:
            try:
                idents.append(cell.cell_contents)
            except ValueError:
                idents.append(_EMPTY)
        idents.extend([ns.get(name, _EMPTY) for ns, name in self.names])
        for d in self.dicts:
            sizes.append(len(d))
            idents.extend(d)
            idents.extend(d.values())
        for s in self.seqs:
            sizes.append(len(s))
            idents.extend(s)
        idents.extend([type(o) for o in self.objects])
        return idents, [torch_globals(), *sizes, *[_tensor_meta(t) for t in self.tensors]]

    def holds(self) -> bool:
        """Whether the state is as recorded (identity of every guarded value, tensor metadata)."""
        idents, metas = self._read()
        old_idents, old_metas = self.recorded
        return metas == old_metas and len(idents) == len(old_idents) and all(map(operator.is_, idents, old_idents))
