"""The Python state a recorded graph was made under, and a cheap check that it is unchanged.

A replayed graph bakes in every Python value its recording read (closure cells, globals, the
attributes, hooks, parameters and flags of reached objects and Modules, captured containers).
`StateGuard(roots)` walks what is reachable from the function and records it by identity
(container sizes and tensor metadata by equality; tensor values are read live by the replay);
`holds()` says whether it is unchanged, mostly in one call of torch's C++ guard tree
(`_NativeGuard`). What the walk cannot prove (iterators, unreadable or large buffers, more than
`MAX_ITEMS` objects) is named by `unprovable`, and the caller stays eager. The rules by class of
state and why: docs/design/replay-contract.md and docs/design/tracing.md.
"""
from __future__ import annotations

import array
import builtins
import collections
import dataclasses
import enum
import gc
import functools
import itertools
import operator
import os
import sys
import threading
import time
import types
import weakref
from typing import Any, Callable, Collection, Iterable

import torch
from torch.distributions import Distribution as _Distribution

from engine.graph_passes import layout_guard
from engine.purity import _ENGINE_DIR, _is_torch_or_engine, generated, global_names
from engine.trace import _FAST_TENSORS

__all__ = ["StateGuard"]

MAX_ITEMS = 20000
# A walk given `max_modules` (engine.autotrace's first, full walk) stops, unprovable, past this many
# Python modules: state that reaches that much of the interpreter (a JAX twin's lazy `jax` proxy
# reaches sys.modules) is guarded by the narrower walk of the code that ran, which the caller
# takes instead: such a walk nearly always ends unprovable (an iterator, a thread-local) anyway.
MAX_MODULES = 256
MAX_BUFFER_BYTES = 1 << 18  # a buffer (numpy array, bytearray, ...) guarded by content up to this size
_LIBRARIES = frozenset({"torch", "engine", "functools", "builtins", "typing", "collections", "abc", "numpy", "math"})
_EMPTY = object()
_MODULE_DICTS = (
    "_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
    "_backward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
)
# A Module's tables that only some of torch's code reads: the state-dict hooks and the
# non-persistent buffer names (Module.state_dict/_save_to_state_dict, load_state_dict/
# _load_from_state_dict), and the per-hook flags of forward hooks (Module._call_impl reads them for
# the ids of the module's and the global forward (pre-)hooks it runs). They are left unguarded
# where no such reader can run on the recorded path: no watched run ran the state-dict code
# (`StateGuard(state_dicts=False)`), the module and torch's global tables hold no forward (pre-)
# hook (those tables are guarded: a hook registered later fails the guard first), and no walked
# user code names the table. Each module has eight of them: most of a large model's guard.
_STATE_DICT_TABLES = ("_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                      "_load_state_dict_post_hooks", "_non_persistent_buffers_set")
_FORWARD_HOOK_FLAGS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called")
_FORWARD_PRE_HOOK_FLAGS = ("_forward_pre_hooks_with_kwargs",)
_ATOMS = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_BUFFERS = (bytearray, memoryview, array.array)
_MAPPING_VIEWS = (types.MappingProxyType, type({}.keys()), type({}.values()), type({}.items()))
_DESCRIPTORS = (property, staticmethod, classmethod, functools.cached_property)
_chain = itertools.chain.from_iterable
# A dataclass's own metadata (`__dataclass_fields__`'s Field objects, `__dataclass_params__`): read
# by the dataclasses module's functions (fields, asdict, replace, ...) and by code naming those
# attributes, and by nothing else once the class exists (its __init__/__eq__/__repr__ were generated
# from it then). See StateGuard._dataclass_meta_read.
_DATACLASS_META = (dataclasses.Field, type(dataclasses.dataclass(type("_Probe", (), {})).__dataclass_params__))
_DATACLASS_META_NAMES = frozenset({"__dataclass_fields__", "__dataclass_params__"})
_DATACLASSES_FILE = dataclasses.__file__


def _code_names(code: types.CodeType) -> set[str]:
    """The names a function's code reads: its co_names, and identifier-like string constants
    (`getattr(config, "SCALE")` names its attribute by a string)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
        elif isinstance(const, str) and const.isidentifier():
            names.add(const)
    return names


def _is_library(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] in _LIBRARIES


def _placed_by_user(value: Any) -> bool:
    """Whether a library module's attribute holds the user's state rather than the library's: a
    function of the user's code (a monkeypatch, `F.gelu = my_gelu`), an instance or class of a
    user class, a plain container, a tensor or other memory. Walked like a user module's values: a user closure
    reached only through `torch.nn.functional` or `functools` read a captured list that nothing
    guarded, and its replays kept the list's old contents. Library functions, classes and their
    instances, modules and atoms are the library's own and are not walked."""
    if isinstance(value, (types.ModuleType, types.BuiltinFunctionType)) or (
            isinstance(value, _ATOMS) and not hasattr(value, "__dict__")):
        return False
    if isinstance(value, types.FunctionType):
        return not (_is_library(value) or _is_torch_or_engine(value.__code__.co_filename))
    if isinstance(value, types.MethodType):  # a bound method of the user's object, or of the user's function
        return _placed_by_user(value.__func__) or _placed_by_user(value.__self__)
    if isinstance(value, functools.partial):
        return any(map(_placed_by_user, (value.func, *value.args, *value.keywords.values())))
    if isinstance(value, _DESCRIPTORS):  # a property or static/class method the user set on a library class
        return any(_placed_by_user(f) for f in (getattr(value, n, None) for n in ("fget", "fset", "fdel", "__func__", "func"))
                   if f is not None)
    if type(value) in (dict, list, set, tuple, frozenset) or isinstance(value, (torch.Tensor, *_BUFFERS)) \
            or hasattr(type(value), "__array_interface__"):  # memory: a numpy array set on numpy
        return True
    return not _is_library(value if isinstance(value, type) else type(value))


def _tensor_meta(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device, t.requires_grad)


def torch_globals() -> tuple:
    """Process-wide torch settings that change what the same Python computes (the default dtype of
    factories, matmul precision, torch.distributions' argument checks); the default device and
    autocast are modes the caller refuses outright."""
    return (_default_dtype(), float32_precision(), _Distribution._validate_args)


_default_dtype = torch._C.get_default_dtype
_matmul_precision = torch._C._get_float32_matmul_precision
_fp32_precision = getattr(torch._C, "_get_fp32_precision_getter", None)
# The (backend, op) pairs of torch's per-backend float32 precision settings (torch.backends.cuda.
# matmul.fp32_precision, torch.backends.mkldnn.conv.fp32_precision, ...).
_FP32_PRECISION_KEYS = (("generic", "all"), ("cuda", "all"), ("cuda", "matmul"), ("cuda", "conv"), ("cuda", "rnn"),
                        ("mkldnn", "all"), ("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn"))


def float32_precision() -> str | tuple[str, ...]:
    """The float32 matmul precision (torch.get_float32_matmul_precision()), or, where that raises
    (the per-backend API set a backend apart: `torch.backends.mkldnn.matmul.fp32_precision =
    "bf16"` makes the legacy getter refuse to answer), every backend's and op's setting. Never
    raises for that state: a guard that raised would make every automatically traced call fail."""
    try:
        return _matmul_precision()
    except RuntimeError:
        if _fp32_precision is None:
            raise
        return tuple(_fp32_precision(backend, op) for backend, op in _FP32_PRECISION_KEYS)


_PROBE = torch.zeros(())  # private: its metadata never changes (see _NativeGuard)

def _global_hook_dicts() -> list[dict]:
    from torch.nn.modules import module as nn_module

    names = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
             "_global_backward_pre_hooks", "_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs")
    return [getattr(nn_module, n) for n in names if isinstance(getattr(nn_module, n, None), dict)]


class StateGuard:
    """Identity snapshot of the state reachable from `roots`; see the module docstring."""

    _names_done = 0

    def __init__(self, roots: Iterable[Any], slots: Iterable[tuple[dict, str]] = (),
                 ran: Collection[types.CodeType] | None = None, state_dicts: bool = True,
                 max_modules: int | None = None) -> None:
        self._ran = ran  # the user code that ran (engine.purity); None: walk every function reached
        self._max_modules = max_modules  # (see MAX_MODULES)
        self._state_dicts = state_dicts  # torch's state-dict code may run (see _STATE_DICT_TABLES)
        self._tables: list[tuple[str, Any]] = []  # (name, table) of Modules, left unwalked (see _unread_tables)
        self.walked: set[types.CodeType] = set()  # the code of the functions walked (reached, and run where `ran` is given)
        self._skipped: dict[int, types.FunctionType] = {}  # functions not walked: their code did not run
        self._wrapped: set[int] = set()  # functions another callable wraps (`__wrapped__`): walked whether or not they ran
        self.cells: list[types.CellType] = []
        self.names: list[tuple[dict, str]] = []  # (namespace dict, name)
        self.dicts: list[Any] = []  # dicts (and user classes' mappingproxies) whose keys and values are guarded
        self.seqs: list[Any] = []  # lists/tuples/sets whose items are guarded
        self.tensors: list[torch.Tensor] = []
        self.objects: list[Any] = []  # whose class is guarded (a parametrization swaps a Module's class)
        self.slotted: list[tuple[Any, str]] = []  # (object, slot name): `__slots__` attributes
        self.buffers: list[tuple[Any, tuple]] = []  # (object exposing memory, (format, shape, strides, bytes) recorded)
        self.generators: list[torch.Generator] = []  # random generators reached (shadow verification restores them)
        self._weakrefs: list[weakref.ref] = []  # live weak references reached (see _weak_only)
        self.unprovable: str | None = None
        self._library_types: set[type] = {torch.Tensor}  # classes whose methods torch's code calls
        self._seen: set[int] = set()
        self._names_seen: set[tuple[int, str]] = set()
        self._pymodules: list[types.ModuleType] = []  # Python modules reached, however
        self._attr_names: set[str] = set()  # every name the walked user code reads
        self._module_reached = False  # an nn.Module was reached: its global hook tables are guarded
        # Dataclass metadata reached where `ran` is given, walked only if code that reads it ran.
        self._meta: list[Any] | None = [] if ran is not None else None
        stack = list(roots)
        for namespace, name in slots:  # globals the run read: guarded, and what they hold walked
            self._name(namespace, name, stack)
        self._walk(stack)
        if self.unprovable is None:
            self.unprovable = self._weak_only()
        self._guard_library_namespaces()
        self._split_tables()
        self._record()

    def _walk(self, stack: list) -> None:
        """Walk what `stack` holds, then what the walked code's reads reach in turn (attributes of
        the modules reached, nn.Module's global hooks, tables a name read makes guarded, dataclass
        metadata, user values in library namespaces), until nothing new is reached or the state
        is found unprovable."""
        done = 0
        hooks_guarded = False
        while self.unprovable is None:
            self._drain(stack)
            # Attribute reads through the modules reached: new modules or names may come from
            # what these slots hold, so repeat until nothing new is reached.
            for module in self._pymodules[done:] if len(self._attr_names) == self._names_done else self._pymodules:
                self._module_attrs(module, stack)
            done, self._names_done = len(self._pymodules), len(self._attr_names)
            # nn.Module's global hooks run in Module.__call__ alone: guarded where an nn.Module is
            # reached. (A Module the function makes and calls is one the watched run saw running:
            # the caller passes those as roots; one only another branch would call is code the
            # verified run did not run, which the recording is watched for, engine.autotrace.)
            if not stack and not hooks_guarded and self._module_reached:
                hooks_guarded = True
                for d in _global_hook_dicts():
                    self._dict(d, stack)
            if not stack:
                self._reach_read(stack)
            if not stack:
                break

    def _drain(self, stack: list) -> None:
        """Visit until `stack` is empty, or the state is found unprovable (too large included)."""
        while stack and self.unprovable is None:
            self._visit(stack.pop(), stack)
            if len(self._seen) > MAX_ITEMS:
                self.unprovable = f"more than {MAX_ITEMS} objects of state are reachable from the function"
            elif self._max_modules is not None and len(self._pymodules) > self._max_modules:
                self.unprovable = f"more than {self._max_modules} Python modules are reachable from the function"

    def _reach_read(self, stack: list) -> None:
        """Onto the empty `stack`, the state left unwalked that the walked code turned out to read:
        a Module's table it names, dataclass metadata, and what the user put into a library
        namespace under a name it reads (`torch.Tensor.scaled = lambda ...`), in that order, the
        first that gives anything."""
        if self._tables:  # a table walked user code names is guarded after all
            named = [t for name, t in self._tables if name in self._attr_names]
            self._tables = [(name, t) for name, t in self._tables if name not in self._attr_names]
            stack.extend(named)
        if not stack and self._meta and self._dataclass_meta_read():
            stack.extend(self._meta)  # walked from now on, like any object
            self._meta = None
            self._seen.difference_update(id(m) for m in stack)
        if not stack:
            # The library namespaces below are guarded by version, not walked; what the user
            # put there under a name the user code reads is the user's state, walked like it.
            for namespace in _library_namespaces(self._library_types):
                for name in sorted(self._attr_names.intersection(namespace)):
                    value = namespace[name]
                    if id(value) not in self._seen and _placed_by_user(value):
                        stack.append(value)

    def _guard_library_namespaces(self) -> None:
        """Guard by version, not walked, the namespaces of what torch's own code calls without user
        code naming it (nn.GELU.forward -> F.gelu, Module.__call__ -> Linear.forward, x.sin()):
        a monkeypatch moves their tags."""
        for namespace in _library_namespaces(self._library_types):
            if id(namespace) not in self._seen:
                self._seen.add(id(namespace))
                self.dicts.append(namespace)

    def _split_tables(self) -> None:
        """The lists the checks read, split from what the walk collected."""
        self._plain = [d for d in self.dicts if isinstance(d, dict)]  # dicts, OrderedDicts: version tags
        self._others = [d for d in self.dicts if not isinstance(d, dict)]  # classes' mappingproxies
        self._seqs_checked = [q for q in self.seqs if not isinstance(q, (tuple, frozenset))]
        self._namespaces = [ns for ns, _ in self.names]
        self._keys = [name for _, name in self.names]
        self._slot_objects = [o for o, _ in self.slotted]
        self._slot_names = [n for _, n in self.slotted]

    def _record(self) -> None:
        """Record the state walked (what the checks compare with) and set up the checks: version
        tags, the classes' namespaces, the tensors' layouts, the native checks' bookkeeping."""
        self.recorded = self._read()
        self._versions = _dict_versions(self._plain)
        self._tensor_guard = None  # torch's C++ check of the tensors' metadata, built with the native check
        self._tag_checker: Callable[[], bool] | None = None  # _PythonMemo's state check, made at its first build
        # The classes' namespaces, the plain dicts behind their mappingproxies (a write to one,
        # `Cls.attr = v`, moves its version tag; None: some proxy is not a class's plain dict),
        # checked by tag by both checks; and, for the Python check (see _holds_by_tags), the
        # tensors' layouts by torch's TensorGuards (one C call; no Dynamo import).
        behind = [gc.get_referents(proxy) for proxy in self._others]
        self._class_dicts = [refs[0] for refs in behind] \
            if all(len(refs) == 1 and type(refs[0]) is dict for refs in behind) else None
        self._class_versions = None if self._class_dicts is None or self._versions is None \
            else list(map(_dict_version, self._class_dicts))
        self._rest_items = self.recorded[4][2 * sum(map(len, self._others)):]  # items less the classes' keys and values
        self._layouts = layout_guard(self.tensors) if self.tensors else None
        self._fast_misses = 0
        # Whether the tags pay (see holds): calls they served minus _REBUILD_CALLS per rebuild,
        # capped at _CREDIT_CAP. `progress` counts the calls served (AutoTraced sets its trace's
        # replay-hit counter; without one every miss is charged and none is credited).
        self.progress: Callable[[], int] = _no_progress
        self._credit = 0
        self._miss_mark = 0
        # The native checks by grad mode (index False/True: each embeds torch's global state, grad
        # mode included, as it was when built), or None where this torch has no C++ guards.
        self._natives: list | None = None
        # Tags but no native check yet: it is built once native_checks_pay() (see there).
        self._deferred = self._versions is not None
        if self._deferred and native_checks_pay():
            self._go_native()

    def _go_native(self) -> None:
        """Build the C++ checks (this grad mode's native check, the tensors' metadata guard)."""
        self._deferred = False
        self._tensor_guard = _tensor_guard(self.tensors)
        native = _NativeGuard.build(self)
        if native is not None:
            self._natives = [None, None]
            self._natives[native.grad] = native

    @property
    def _native(self) -> "_NativeGuard | None":
        """The native check for the current grad mode, if built (for inspection and tests)."""
        return None if self._natives is None else self._natives[torch.is_grad_enabled()]

    def _dataclass_meta_read(self) -> bool:
        """Whether code that ran could read a dataclass's metadata: a function of the dataclasses
        module (fields, asdict, astuple, replace, ...) ran, or any code that ran or was walked
        names `__dataclass_fields__` / `__dataclass_params__` (as an attribute or a string: a
        library reading them directly, however it was reached). Otherwise a Field's attributes
        are read by no run, like the code of a function that never ran: the Field objects stay
        guarded where they are held (the fields dict, by identity), but what they hold is not
        walked. In a frozen dataclass the Fields are most of the slotted attributes reached."""
        if self._attr_names & _DATACLASS_META_NAMES:
            return True
        return any(code.co_filename == _DATACLASSES_FILE or not _DATACLASS_META_NAMES.isdisjoint(_code_names(code))
                   for code in self._ran or ())

    # -- walking ------------------------------------------------------------------------------

    def _name(self, namespace: dict, name: str, stack: list, walk: bool = True) -> None:
        key = (id(namespace), name)
        if key in self._names_seen:
            return
        self._names_seen.add(key)
        self.names.append((namespace, name))
        value = namespace.get(name, _EMPTY)
        if value is _EMPTY:
            return
        if walk or isinstance(value, types.ModuleType) or _placed_by_user(value):
            stack.append(value)

    def _weak_only(self) -> str | None:
        """Why the state cannot be guarded if a live referent of a weak reference reached is
        reached only through weak references. Held by the guard, it would outlive the user's
        last reference (torch.func lets it die, and `ref() is None` then comes true); not held, a
        replay of the branch taken while it lived would miss its death. A referent the walk also
        reached through strong references (nn.LSTM's `_flat_weight_refs` to its own parameters)
        lives while what holds it does, and that is guarded: it dies only after a change the guard
        sees. A dead referent stays dead: nothing to guard."""
        for ref in self._weakrefs:
            target = ref()
            if target is not None and id(target) not in self._seen:
                return (f"it reaches a {type(target).__name__} only through a weak reference: a replay would "
                        "keep it alive or miss its death")
        return None

    def _module_attrs(self, module: types.ModuleType, stack: list) -> None:
        """Guard, like globals, the attributes of a reached module that the user code reads
        (`helpers.scale`, `np.exp`, `config.SCALE`); a library's values are not walked, but what a
        user put there is (`_placed_by_user`: `F.gelu = my_gelu`, a helper set on functools)."""
        namespace = module.__dict__
        # (by its name, read from its dict: a getattr would run a module-level __getattr__)
        walk = str(namespace.get("__name__", "")).split(".")[0] not in _LIBRARIES
        if walk and "__getattr__" in namespace:
            # PEP 562 in a user module: a name the module lacks comes from its __getattr__, which
            # is walked like any function read, and every name read is guarded, absent ones by
            # their absence (one set later shadows __getattr__). (A library's, torch's lazy
            # submodule loader, is the library's own.)
            self._name(namespace, "__getattr__", stack)
            names = self._attr_names
        else:
            names = self._attr_names.intersection(namespace)
        for attr in sorted(names):
            self._name(namespace, attr, stack, walk)

    def _dict(self, d: dict, stack: list) -> None:
        if id(d) in self._seen:  # a Module's hook tables are reached both by name and as values
            return
        self._seen.add(id(d))
        self.dicts.append(d)
        stack.extend(d.values())

    def _visit(self, obj: Any, stack: list) -> None:
        if isinstance(obj, _ATOMS) and not hasattr(obj, "__dict__"):  # (a float subclass may carry attributes)
            return
        if isinstance(obj, dict):
            self._dict(obj, stack)
            return
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        if self._meta is not None and type(obj) in _DATACLASS_META:
            self._meta.append(obj)
            return
        if isinstance(obj, torch.Tensor):
            self._visit_tensor(obj, stack)
            return
        if isinstance(obj, _MAPPING_VIEWS):  # d.values(), MappingProxyType(d): the dict behind it
            for d in gc.get_referents(obj):
                if isinstance(d, dict):
                    self._dict(d, stack)
            return
        if isinstance(obj, weakref.ref):  # see _weak_only
            if obj() is not None:
                self._weakrefs.append(obj)
            return
        if isinstance(obj, torch.Generator):
            self.generators.append(obj)
            return
        if isinstance(obj, types.ModuleType):
            self._pymodules.append(obj)
            return
        if isinstance(obj, _DESCRIPTORS):  # a class attribute computed by a function
            stack.extend(f for f in (getattr(obj, a, None) for a in ("fget", "fset", "fdel", "__func__", "func")) if f is not None)
            return
        if isinstance(obj, _BUFFERS) or hasattr(type(obj), "__array_interface__") or hasattr(type(obj), "__cuda_array_interface__"):
            self._buffer(obj)
            return
        if isinstance(obj, type):
            if not _is_library(obj):
                self._visit_class(obj, stack)
            return
        if isinstance(obj, (types.BuiltinFunctionType, types.CodeType)):
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
        if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            self.seqs.append(obj)
            stack.extend(obj)
            return
        if isinstance(obj, threading.local):
            self.unprovable = "it reaches a threading.local, whose attributes differ from thread to thread"
            return
        if isinstance(obj, dict):
            self._dict(obj, stack)
            return
        if isinstance(obj, types.GeneratorType) or (hasattr(type(obj), "__next__") and not isinstance(obj, torch.nn.Module)):
            self.unprovable = f"it reaches an iterator ({type(obj).__name__}), which a replay would not advance"
            return
        self._visit_instance(obj, stack)

    def _visit_tensor(self, obj: torch.Tensor, stack: list) -> None:
        """A tensor: its metadata, its `.grad` where a leaf requires grad, its Python attributes."""
        self.tensors.append(obj)
        if obj.is_leaf and obj.requires_grad:  # `.grad` (a new tensor after zero_grad(set_to_none))
            self.slotted.append((obj, "grad"))
            if obj.grad is not None:
                stack.append(obj.grad)
        self._dict(obj.__dict__, stack)  # Python attributes set on it (`p.lr_scale = 0.1`)
        self.slotted.append((obj, "__dict__"))  # and the dict itself (`t.__dict__ = {...}`)

    def _visit_class(self, cls: type, stack: list) -> None:
        """A user class: its attributes and methods (`Config.scale`), its bases, its metaclass."""
        self.dicts.append(cls.__dict__)
        stack.extend(cls.__dict__.values())
        stack.extend(b for b in cls.__bases__ if b is not object)
        meta = type(cls)  # a user metaclass's attributes read through the class (`Config.gains`)
        if meta is not type and str(meta.__module__).split(".")[0] not in sys.stdlib_module_names:
            stack.append(meta)

    def _visit_instance(self, obj: Any, stack: list) -> None:
        """Any other object: a Module's tables, its instance dict, its slots, its class and the
        class's user `__call__`."""
        unread: frozenset[str] = frozenset()
        if isinstance(obj, torch.nn.Module):
            unread = self._visit_module(obj, stack)
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):
            self._visit_attrs(obj, attrs, unread, stack)
        for name in _slot_names(type(obj)):
            self.slotted.append((obj, name))
            value = getattr(obj, name, _EMPTY)
            if value is not _EMPTY:
                stack.append(value)
        stack.append(type(obj))
        call = getattr(type(obj), "__call__", None)
        if isinstance(call, types.FunctionType) and not _is_library(call):
            stack.append(call)

    def _visit_module(self, module: torch.nn.Module, stack: list) -> frozenset[str]:
        """An nn.Module's hook and child tables (but those no reader can reach) and its class's
        forward; returns the names of the tables left unread."""
        self._module_reached = True
        self._library_types.add(type(module))
        unread = self._unread_tables(module)
        for name in _MODULE_DICTS:
            d = module.__dict__.get(name)
            if isinstance(d, dict) and name not in unread:
                self._dict(d, stack)
        stack.append(type(module).forward)
        return unread

    def _visit_attrs(self, obj: Any, attrs: dict, unread: frozenset[str], stack: list) -> None:
        """An object's instance dict: its values walked (the `unread` tables set aside, see
        _unread_tables), the dict itself and the object's class guarded."""
        wrapped = attrs.get("__wrapped__")
        if isinstance(wrapped, types.FunctionType):  # an lru_cache: its result may come from an earlier run
            self._wrapped.add(id(wrapped))
            if self._skipped.pop(id(wrapped), None) is not None:
                self._function(wrapped, stack)
        if unread and id(attrs) not in self._seen:
            self._seen.add(id(attrs))
            self.dicts.append(attrs)  # (its version tag still moves when a table is rebound)
            for name, value in attrs.items():
                if name in unread:
                    self._tables.append((name, value))
                else:
                    stack.append(value)
        else:
            self._dict(attrs, stack)
        self.objects.append(obj)
        self.slotted.append((obj, "__dict__"))  # `obj.__dict__ = {...}` replaces the dict guarded above

    def _unread_tables(self, module: torch.nn.Module) -> frozenset[str]:
        """The names of `module`'s tables no reader can reach on the recorded path (see
        _STATE_DICT_TABLES)."""
        from torch.nn.modules import module as nn_module

        attrs = module.__dict__
        unread: list[str] = [] if self._state_dicts else list(_STATE_DICT_TABLES)
        if not attrs.get("_forward_hooks") and not nn_module._global_forward_hooks:
            unread += _FORWARD_HOOK_FLAGS
        if not attrs.get("_forward_pre_hooks") and not nn_module._global_forward_pre_hooks:
            unread += _FORWARD_PRE_HOOK_FLAGS
        return frozenset(unread)

    def _function(self, fn: types.FunctionType, stack: list) -> None:
        if self._ran is not None and fn.__code__ not in self._ran and id(fn) not in self._wrapped and not (
                _is_library(fn) or _is_torch_or_engine(fn.__code__.co_filename) or generated(fn.__code__)):
            self._skipped[id(fn)] = fn
            return  # user code that never ran reads nothing (see "Code that ran" above)
        self.walked.add(fn.__code__)
        # The cells of the engine's own closures (a transform's options and the function it wraps,
        # transform_entry's `auto`) are walked but not guarded: no code rebinds them once the
        # closure exists but transform_entry's `auto`, which no traced run reads (tests/
        # test_autotrace_quick.py audits the engine's code for that), so their identity cannot
        # change. What they hold is walked and guarded like any other state.
        guarded = not fn.__code__.co_filename.startswith(_ENGINE_DIR)
        for cell in fn.__closure__ or ():
            if guarded:
                self.cells.append(cell)
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell (a name assigned later)
                pass
        stack.extend(fn.__defaults__ or ())
        if fn.__kwdefaults__:  # a dict: `f.__kwdefaults__["scale"] = ...` writes into it
            self._dict(fn.__kwdefaults__, stack)
        if _is_library(fn) or _is_torch_or_engine(fn.__code__.co_filename):
            # Library globals are not rebound by user code; its closures were followed. (The
            # file, not __module__: functools.wraps gives the engine's wrappers the user's.)
            return
        # A function's code and defaults can be swapped in place (autoreload, `f.__defaults__ = ...`),
        # and its attributes read like any object's (`helper.scale`, or `helper.__dict__ = {...}`).
        self.slotted += [(fn, "__code__"), (fn, "__defaults__"), (fn, "__kwdefaults__"), (fn, "__dict__")]
        self._dict(fn.__dict__, stack)
        namespace = fn.__globals__
        self._attr_names |= _code_names(fn.__code__)
        for name in sorted(global_names(fn.__code__)):  # read as globals (not `F.cross_entropy`'s attribute)
            if name in namespace:
                self._name(namespace, name, stack)
            else:  # resolved from builtins: a global of that name defined later shadows it
                self._name(namespace, name, stack, walk=False)
                # and the builtins entry itself: a name the user put there (`builtins.GAINS = [...]`)
                # or a builtin replaced (`builtins.len = ...`) is the user's state
                table = namespace.get("__builtins__", builtins)
                table = table if isinstance(table, dict) else vars(table)
                if name in table:  # (_name walks what the user put there)
                    self._name(table, name, stack, walk=False)

    def _buffer(self, obj: Any) -> None:
        """Memory a replay cannot watch change: guarded by a copy of its bytes, or unprovable."""
        try:
            view = memoryview(obj)
        except (TypeError, ValueError):
            self.unprovable = f"it reaches a {type(obj).__name__} whose memory cannot be read from the CPU, so a change of its contents would go unseen"
            return
        if view.nbytes > MAX_BUFFER_BYTES:
            self.unprovable = (
                f"it reaches a {type(obj).__name__} of {view.nbytes} bytes (more than {MAX_BUFFER_BYTES} to compare on every "
                f"call); convert it to a tensor once, outside the function, so that a replay reads it live"
            )
            return
        self.buffers.append((obj, _buffer_state(view)))

    # -- checking -----------------------------------------------------------------------------

    def _read(self) -> tuple[list, ...]:
        """The guarded state now, by group (see holds)."""
        cells = []
        for cell in self.cells:
            try:
                cells.append(cell.cell_contents)
            except ValueError:
                cells.append(_EMPTY)
        plain, others = self._plain, self._others
        return (
            [torch_globals(), *map(len, others), *map(len, self._seqs_checked)],
            cells,
            list(map(dict.get, self._namespaces, self._keys, itertools.repeat(_EMPTY))),
            [*map(len, plain), *_chain(plain), *_chain(map(dict.values, plain))],
            [*_chain(others), *_chain(d.values() for d in others), *_chain(self._seqs_checked),
             *map(type, self.objects), *map(getattr, self._slot_objects, self._slot_names, itertools.repeat(_EMPTY))],
            list(map(_tensor_meta, self.tensors)),
        )

    def holds(self) -> bool:
        """Whether the state is as recorded: every guarded value the same object, container sizes,
        tensor metadata and buffer contents equal.

        The dicts (a Module's parameter, buffer, submodule and hook tables, `__dict__`s, captured
        dicts) and the tensors' metadata, the bulk of a model's state, are checked first by their
        version tags and by torch's C++ tensor guard (the one torch.compile's guards run on): a
        dict's version tag moves on every write into it, so an unchanged tag proves unchanged
        contents without reading them. Where a tag moved, the contents are compared by identity (a
        write that restored what was there, as torch.func.functional_call does, still holds), and
        the tags are taken anew; a guard whose tags move more often than they pay for their
        rebuilds (see _REBUILD_CALLS) stops using them. The rest is
        compared group by group, stopping at the first difference, by C-level maps."""
        natives = self._natives
        native = None if natives is None else natives[torch.is_grad_enabled()]
        if native is not None and native.holds():
            return True
        if self._deferred and native_checks_pay():
            self._go_native()
            return self.holds()
        if natives is None:  # no native check: not built yet, not buildable, or the tags given up
            return self._holds_by_tags() if self._versions is not None else self._holds(full=True)
        if not self._holds(full=True):
            return False
        if native is not None:  # it failed where Python holds: a tag moved, or torch's global state differs from its build's
            progress = self.progress()
            self._credit = min(self._credit + progress - self._miss_mark, _CREDIT_CAP) - _REBUILD_CALLS
            self._miss_mark = progress
            self._fast_misses += 1
            if self._credit <= -_FAST_MISSES * _REBUILD_CALLS:
                self._versions = self._natives = None
                return True
            self._versions = list(map(_dict_version, self._plain))
            natives[:] = [None, None]  # they hold the old tags
        native = _NativeGuard.build(self)  # (a grad mode's first, or anew)
        if native is not None:
            natives[native.grad] = native
        return True

    def _holds_by_tags(self) -> bool:
        """holds() without a native check: the tags and the tensors' metadata compared in Python,
        the rest as always; where a tag moved and the contents held, the tags are taken anew. Its
        time counts toward native_checks_pay()."""
        start = time.perf_counter()
        try:
            classes = self._class_dicts
            if list(map(_dict_version, self._plain)) == self._versions and (not self.tensors or self._tensors_hold()) \
                    and (not classes or list(map(_dict_version, classes)) == self._class_versions):
                return self._holds(full=False, classes=classes is None)
            if not self._holds(full=True):
                return False
            self._versions = list(map(_dict_version, self._plain))
            if classes is not None:
                self._class_versions = list(map(_dict_version, classes))
            return True
        finally:
            _python_checks_s[0] += time.perf_counter() - start

    def _tensors_hold(self) -> bool:
        """The tensors' layouts as recorded: by the native check's tensor guard where built, else by
        TensorGuards (which checks their dispatch keys and type too: a difference there sends
        _holds_by_tags to the full comparison), else in Python."""
        if self._tensor_guard is not None:
            return self._tensor_guard.check(self.tensors)
        if self._layouts is not None:
            return self._layouts(*self.tensors)
        return list(map(_tensor_meta, self.tensors)) == self.recorded[-1]

    def _holds(self, full: bool, classes: bool = True) -> bool:
        """The state compared with the recorded one; `full`: the plain dicts' entries and the
        tensors' metadata too (else their tags were compared); `classes`: the classes' namespaces
        item by item (else their tags were compared)."""
        # An empty group is skipped: what a small function's guard holds is mostly empty groups,
        # and building an iterator over one costs as much as comparing a few items.
        sizes, cells, names, plain_entries, items, metas = self.recorded
        plain, others, seqs = self._plain, self._others, self._seqs_checked
        if sizes[0] != torch_globals():
            return False
        if len(sizes) > 1 and not all(map(operator.eq, map(len, itertools.chain(others, seqs)), sizes[1:])):
            return False
        if cells:
            try:
                same = all(map(operator.is_, map(_cell_contents, self.cells), cells))
            except ValueError:  # a cell is empty (emptied, or empty when recorded): compare one by one
                same = all(map(operator.is_, self._read()[1], cells))
            if not same:
                return False
        if names and not all(map(operator.is_, map(dict.get, self._namespaces, self._keys,
                                                   itertools.repeat(_EMPTY)), names)):
            return False
        if full and plain:
            if not all(map(operator.eq, map(len, plain), plain_entries)):
                return False
            now = itertools.chain(_chain(plain), _chain(map(dict.values, plain)))
            if not all(map(operator.is_, now, itertools.islice(plain_entries, len(plain), None))):
                return False
        if full and metas and list(map(_tensor_meta, self.tensors)) != metas:
            return False
        if not classes:
            items = self._rest_items
        if items:
            rest = (_chain(seqs), map(type, self.objects),
                    map(getattr, self._slot_objects, self._slot_names, itertools.repeat(_EMPTY)))
            now = itertools.chain(_chain(others), _chain(d.values() for d in others), *rest) if classes \
                else itertools.chain(*rest)
            if not all(map(operator.is_, now, items)):
                return False
        return not self.buffers or all(_buffer_state(memoryview(o)) == recorded for o, recorded in self.buffers)


def _cell_or_empty(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


# The Python memo's state check (see _PythonMemo) lists groups of up to this many items as one
# comparison each, larger ones as one C-level map: a Python comparison costs about what a few
# items of a map do.
_INLINE_ITEMS = 8


def _tag_check(guard: StateGuard) -> Callable[[], bool]:
    """`check()`: True only where `guard._holds_by_tags()` would find the state as recorded with
    its tags unchanged (False: let it decide), as one generated function of straight comparisons,
    not the generic loops over groups that are mostly empty. The float32 precision and
    validate_args default are left to the caller (_PythonMemo's, as the native memo's, compares
    them inline). Any exception means False to the caller."""
    ns: dict[str, Any] = {"dv": _dict_version, "E": _EMPTY, "is_": operator.is_, "eq": operator.eq,
                          "repeat": itertools.repeat, "chain": itertools.chain, "flat": _chain,
                          "cell": _cell_or_empty, "dget": dict.get, "G": guard, "ddt": _default_dtype,
                          "buf": _buffer_state}
    conds: list[str] = []

    def const(value: Any) -> str:
        name = f"k{len(ns)}"
        ns[name] = value
        return name

    def each(inline: str, mapped: str, *columns: list) -> None:
        """One comparison per row where few (`inline`), else one C-level map over the columns."""
        rows = list(zip(*columns))
        if len(rows) <= _INLINE_ITEMS:
            conds.extend(inline.format(*map(const, row)) for row in rows)
        elif rows:
            conds.append(mapped.format(*(const(list(c)) for c in columns)))

    sizes, cells, names, entries, items, _ = guard.recorded
    # The plain dicts: those recorded empty (most of a Module's hook tables) by being empty still
    # (the same contents, what their tags prove; a truth test costs a fraction of a tag's read),
    # the others by their tags as taken last (read at each call: they are taken anew where they
    # moved and the contents held).
    empty = [d for d, n in zip(guard._plain, entries) if n == 0]
    tagged = [(i, d) for i, (d, n) in enumerate(zip(guard._plain, entries)) if n != 0]
    if empty:
        conds.append(f"not any({const(empty)})")
    if tagged and len(tagged) <= _INLINE_ITEMS:
        conds.append("(V := G._versions) is not None")
        conds.extend(f"dv({const(d)}) == V[{i}]" for i, d in tagged)
    elif tagged:
        indices, dicts = zip(*tagged)
        conds.append(f"tuple(map(dv, {const(list(dicts))})) == {const(operator.itemgetter(*indices))}(G._versions)")
    if guard.tensors:
        conds.append("G._tensors_hold()")
    classes = guard._class_dicts
    if classes:
        conds.append(f"list(map(dv, {const(classes)})) == G._class_versions")
    conds.append(f"ddt() is {const(sizes[0][0])}")
    each("len({}) == {}", "all(map(eq, map(len, {}), {}))", [*guard._others, *guard._seqs_checked], sizes[1:])
    each("cell({}) is {}", "all(map(is_, map(cell, {}), {}))", guard.cells, cells)
    each("dget({}, {}, E) is {}", "all(map(is_, map(dget, {}, {}, repeat(E)), {}))", guard._namespaces, guard._keys, names)
    # items as _holds(full=False) reads them: the classes' keys and values (unless their tags are
    # compared), the mutable sequences' items (lengths compared above), the objects' classes, the
    # slotted attributes
    variable = 2 * sum(map(len, guard._others)) if classes is None else 0
    skipped = 0 if classes is None else 2 * sum(map(len, guard._others))
    variable += sum(map(len, guard._seqs_checked))
    rest = items[skipped:]
    if variable:
        now = "flat(G._seqs_checked)" if classes is not None \
            else "chain(flat(G._others), flat(d.values() for d in G._others), flat(G._seqs_checked))"
        conds.append(f"all(map(is_, {now}, {const(rest[:variable])}))")
    rest = rest[variable:]
    each("type({}) is {}", "all(map(is_, map(type, {}), {}))", guard.objects, rest[:len(guard.objects)])
    each("getattr({}, {}, E) is {}", "all(map(is_, map(getattr, {}, {}, repeat(E)), {}))",
         guard._slot_objects, guard._slot_names, rest[len(guard.objects):])
    if guard.buffers:
        each("buf(memoryview({})) == {}", "all(map(eq, map(buf, map(memoryview, {})), {}))", *zip(*guard.buffers))
    source = "def check():\n    return (" + "\n            and ".join(conds) + ")\n"
    exec(compile(source, "<engine.guardstate tag check>", "exec"), ns)
    return ns["check"]


def _flattener(args: tuple) -> Callable[[tuple], list | None] | None:
    """None where `args` are plain tensors (their tuple is the flat list); else `flatten(args)`:
    the tensors in engine.trace's leaf order (a dict's values in its key order), or None where the
    call's arguments are not built like these (number, container types, a dict's keys in order,
    a sequence's length). What is inside is left to the layout check (TensorGuards: each one a
    tensor of the exact type). Raises TypeError for other arguments (numbers, nesting)."""
    shapes: list[Any] = []
    for a in args:
        t = type(a)
        if t in _FAST_TENSORS:
            shapes.append(None)
        elif t is dict and all(type(v) in _FAST_TENSORS for v in a.values()):
            shapes.append((dict, tuple(a)))
        elif (t is list or t is tuple) and all(type(v) in _FAST_TENSORS for v in a):
            shapes.append((t, len(a)))
        else:
            raise TypeError("arguments other than tensors and flat containers of them")
    if all(s is None for s in shapes):
        return None
    count = len(args)

    def flatten(args: tuple) -> list | None:
        if len(args) != count:
            return None
        flat: list = []
        for a, shape in zip(args, shapes):
            if shape is None:
                flat.append(a)
            elif shape[0] is dict:
                if type(a) is not dict or tuple(a) != shape[1]:
                    return None
                flat += a.values()
            else:
                if type(a) is not shape[0] or len(a) != shape[1]:
                    return None
                flat += a
        return flat

    return flatten


def _flat_layouts(args: tuple) -> tuple[Callable[[tuple], list | None] | None, Any, Callable[..., bool]]:
    """A memo's view of a call's arguments: (`_flattener(args)`, the tensors it checks, their
    TensorGuards check). Raises TypeError where the arguments have no such check."""
    flatten = _flattener(args)
    flat = args if flatten is None else flatten(args)
    layouts = layout_guard(flat)
    if layouts is None:
        raise TypeError("no layout guard for these arguments")
    return flatten, flat, layouts


class _PythonMemo:
    """A call's arguments and a StateGuard's state proved in one Python function, for a guard with
    version tags and no native check (before native_checks_pay(): no Dynamo import): the
    arguments by torch's TensorGuards (type, dispatch keys, dtype, device, requires_grad, sizes,
    strides: engine.trace's signature key of plain tensors, and more) and their number; the grad
    mode, torch-function modes, inference mode and autocast (what the native check's global-state
    guard and `engine.autotrace._outermost` check); the state by `_tag_check`. It has the native
    memo's interface, so engine.autotrace's replay path runs either inline (the float32 precision,
    validate_args, engine levels, dispatch modes and compile flag are checked there). Its seconds
    count toward native_checks_pay(); once that answers yes, it answers False and the full path
    builds the native check."""

    values: tuple = ()
    rest = False
    base = None  # (a native memo's argument-free check; none here)

    def __init__(self, guard: StateGuard, args: tuple, entry: Any) -> None:
        self.flatten, flat, layouts = _flat_layouts(args)
        if guard._tag_checker is None:
            guard._tag_checker = _tag_check(guard)
        tags, count, grad = guard._tag_checker, len(flat), torch.is_grad_enabled()
        functions, inference, autocast = torch._C._len_torch_function_stack, torch.is_inference_mode_enabled, \
            torch._C._is_any_autocast_enabled
        enabled, clock, spent = torch.is_grad_enabled, time.perf_counter, _python_checks_s

        def check(pair: tuple) -> bool:  # pair: (the call's tensors, flattened where `flatten`; ())
            start = clock()
            args = pair[0]
            holds = (len(args) == count and layouts(*args) and enabled() is grad and not functions()
                     and not inference() and not autocast() and guard._natives is None
                     and not (guard._deferred and native_checks_pay()) and tags())
            spent[0] += clock() - start  # (one that raised is not charged: the full path runs next)
            return holds

        self.check, self.guard, self.entry, self.grad = check, guard, entry, grad
        self.precision = float32_precision()
        self.read_precision = _matmul_precision if isinstance(self.precision, str) else float32_precision
        self.validate = _Distribution._validate_args

    @classmethod
    def build(cls, guard: StateGuard, args: tuple, entry: Any) -> "_PythonMemo | None":
        """The memo of `args` (plain strided tensors, or flat dicts, lists and tuples of them: a
        parameter dict) under `guard`, or None where it cannot be made (no tags, a native check
        built, other arguments, tensors TensorGuards refuses)."""
        if guard._versions is None or guard._natives is not None:
            return None
        try:
            return cls(guard, args, entry)
        except (AttributeError, TypeError, RuntimeError, ValueError, SyntaxError):
            return None


class _FlatArgsMemo:
    """The native memo's counterpart for arguments its tree does not take (flat dicts, lists and
    tuples of tensors: a parameter dict): the arguments flattened and checked as _PythonMemo
    does (`_flattener`, TensorGuards), the state and torch's ambient state by the guard's own
    native check (`base`), the rest inline in engine.autotrace as for any memo."""

    values: tuple = ()

    def __init__(self, native: "_NativeGuard", args: tuple, entry: Any) -> None:
        self.flatten, flat, layouts = _flat_layouts(args)
        if self.flatten is None:
            raise TypeError("plain tensors: the native memo proves them")
        count, state, values = len(flat), native.check, native.values

        def check(pair: tuple) -> bool:  # pair: (the call's tensors, flattened; ())
            args = pair[0]
            return len(args) == count and layouts(*args) and state(values)

        self.check, self.entry, self.base, self.guard, self.grad = check, entry, native, native.guard, native.grad
        self.precision, self.read_precision, self.validate = native.precision, native.read_precision, native.validate
        self.rest, self._rest = native.rest, native._rest

    @classmethod
    def build(cls, native: "_NativeGuard", args: tuple, entry: Any) -> "_FlatArgsMemo | None":
        try:
            return cls(native, args, entry)
        except (AttributeError, TypeError, RuntimeError, ValueError):
            return None


class _ManagerKind(enum.Enum):  # torch._dynamo.guards.GuardManagerType, without importing Dynamo
    GUARD_MANAGER = 1


def _same(m: Any, value: Any, name: str) -> None:
    """Guard node `m` to hold `value`, by identity."""
    m.add_id_match_guard(id(value), [name], None)


def _add_args(root: Any, args: tuple) -> bool:
    """Guard the call's arguments, item 0 of the value checked: their number and each one's tensor
    metadata; False where one is not a plain strided tensor."""
    kind = _ManagerKind.GUARD_MANAGER
    held = root.tuple_getitem_manager(0, "args", None, kind)
    held.add_length_check_guard(len(args), ["len(args)"], None)
    for j, t in enumerate(args):
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
            return False
        held.tuple_getitem_manager(j, f"args[{j}]", None, kind).add_tensor_match_guard(
            t, list(t.shape), list(t.stride()), f"args[{j}]", [f"args[{j}]"], None, type(t), torch._C._dispatch_keys(t)
        )
    return True


def _add_tensors(guard: StateGuard, manager: Callable[[Any, str], Any], owners: dict[int, Any]) -> None:
    """Each tensor's metadata by torch's tensor-match guard (on its slots' node where it has one)."""
    for i, t in enumerate(guard.tensors):
        node = owners.get(id(t))  # (its `grad` and `__dict__` slots' node: one item fewer)
        (manager(t, "tensor") if node is None else node).add_tensor_match_guard(
            t, list(t.shape), list(t.stride()), f"tensor[{i}]", [f"tensor[{i}]"], None, type(t), torch._C._dispatch_keys(t)
        )


class _NativeGuard:
    """The identity and version checks of a StateGuard as one tree of torch's C++ guards (the guard
    manager torch.compile's guards run on), checked in one call without a Python frame per item.

    It checks what the Python comparison (`StateGuard._holds`) checks, by the cheapest exact means:
    every guarded dict by its version tag (which moves on every write into it), every tensor by
    torch's tensor-match guard (type, dispatch keys, dtype, device, requires_grad, sizes, strides),
    closure cells, guarded names, `__slots__`/function attributes and list items by the identity
    of what they hold (the recorded objects are kept alive by the StateGuard, so an id cannot be
    reused), an absent name by its absence, objects by their exact class, mutable sequences by
    length. What it cannot express (a cell or attribute recorded empty, the contents of a
    non-empty set or deque, a mappingproxy whose mapping is not a plain dict, buffers compared by
    bytes, torch's process settings) stays with a short Python check, `rest`; classes'
    mappingproxies are checked by the version tag of the dict behind them. A failing check is not a verdict: the
    caller compares in Python, which forgives a write that restored what was there."""

    __slots__ = ("root", "check", "values", "rest_cells", "rest_slotted", "rest_seqs", "rest_others", "guard", "grad",
                 "precision", "read_precision", "validate", "rest", "entry", "base")
    flatten = None  # (the arguments a memo proves are plain tensors: their tuple is the flat list)

    def __init__(self) -> None:
        self.root: Any = None
        self.check: Any = None  # root.check, bound once (a pybind attribute lookup costs ~400 instructions a call)
        self.values: list = []
        self.rest_cells: list[types.CellType] = []
        self.rest_slotted: list[tuple[Any, str]] = []
        self.rest_seqs: list[tuple[Any, list]] = []
        self.rest_others = True  # whether `_rest` compares the classes' mappingproxies item by item
        self.guard: StateGuard | None = None
        self.grad = True  # the grad mode it was built under (its global-state guard checks it)
        self.precision: str | tuple = ""  # the float32 precision when built (no C++ guard reads it): float32_precision()
        self.read_precision: Any = _matmul_precision
        self.validate: bool | None = None  # torch.distributions' validate_args default when built
        self.rest = False  # whether anything is left to `_rest`
        # A check that also proves the call's arguments (see `build`'s `args`): the trace entry
        # their signature leads to, and the argument-free check it was built beside.
        self.entry: Any = None
        self.base: "_NativeGuard | None" = None

    @classmethod
    def build(cls, guard: StateGuard, args: tuple | None = None) -> "_NativeGuard | None":
        """The native check of `guard`'s recorded state, or None where this torch lacks the C++
        guards (the Python comparison then runs alone).

        With `args` (plain strided tensors), the check also proves that a call's arguments have
        their metadata (type, dispatch keys, dtype, device, sizes, strides, requires_grad) and
        number, checked as `check((args, values))`: what engine.trace's signature key of such
        arguments is made of (with the grad mode, which the global-state guard checks), in the
        same C call, so a call that passes needs no key built in Python (engine.autotrace)."""
        try:
            return cls._build(guard, args)
        except (AttributeError, TypeError, RuntimeError, ValueError):
            return None

    @classmethod
    def _build(cls, guard: StateGuard, args: tuple | None = None) -> "_NativeGuard | None":
        self = cls()
        self.guard = guard
        root = self.root = torch._C._dynamo.guards.RootGuardManager()
        self.check = root.check
        state = root
        if args is not None:  # the value checked is (args, values)
            if not _add_args(root, args):
                return None
            state = root.tuple_getitem_manager(1, "state", None, _ManagerKind.GUARD_MANAGER)
        values = self.values

        def manager(value: Any, name: str) -> Any:
            values.append(value)
            return state.list_getitem_manager(len(values) - 1, name, None, _ManagerKind.GUARD_MANAGER)

        self._add_ambient(manager)
        owners, instance_dicts = self._add_slotted(guard, manager)
        self._add_dicts(guard, manager, instance_dicts)
        _add_tensors(guard, manager, owners)
        self._add_values(guard, manager)
        for obj in guard.objects:  # (on the node of its slots where it has one: one item fewer)
            node = owners.get(id(obj))
            (manager(obj, "object") if node is None else node).add_type_match_guard(id(type(obj)), ["type"], None)
        self.rest = bool(self.rest_cells or self.rest_slotted or self.rest_seqs or guard.buffers
                         or (guard._others and self.rest_others))
        if not root.check(values if args is None else (args, values)):
            return None  # it does not check what it was built from: leave it to Python
        return self

    def _add_ambient(self, manager: Callable[[Any, str], Any]) -> None:
        """Torch's ambient state, as it is now (the caller checks at the outermost call, with the
        recorded process settings): torch's global-state guard (grad mode, autocast on every
        device, the default dtype, deterministic algorithms, the thread count, torch-function
        enablement), the torch-function mode stack (empty), a tensor-match guard on a private
        tensor (the thread's included and excluded dispatch keys enter its check: inference mode
        excludes the autograd keys). The float32 matmul precision and torch.distributions'
        validate_args default are compared in Python (`holds`, and engine.autotrace's replay
        path, which runs `holds` inline): a C++ node costs more than the class attribute's read."""
        root = self.root
        self.grad = torch.is_grad_enabled()
        self.precision = float32_precision()
        # What the replay path reads it with: the legacy getter (one C call) while it answers; where
        # it raised when built, every setting (a Python function: that state is rare).
        self.read_precision = _matmul_precision if isinstance(self.precision, str) else float32_precision
        self.validate = _Distribution._validate_args
        root.add_global_state_guard(torch._C._dynamo.guards.GlobalStateGuard(), ["torch's global state"], None)
        root.add_torch_function_mode_stack_guard([], ["no torch function mode"], None)
        probe = _PROBE
        manager(probe, "probe").add_tensor_match_guard(
            probe, list(probe.shape), list(probe.stride()), "probe", ["probe"], None, type(probe), torch._C._dispatch_keys(probe)
        )

    def _add_slotted(self, guard: StateGuard,
                     manager: Callable[[Any, str], Any]) -> tuple[dict[int, Any], dict[int, Any]]:
        """The slotted attributes by the identity of what they hold (one node per object, its slots
        below it; an empty slot is left to `_rest`); returns the objects' nodes by id and, by id of
        each instance dict, the node that reaches it."""
        kind = _ManagerKind.GUARD_MANAGER
        owners: dict[int, Any] = {}  # one manager per object, its slots below it
        instance_dicts: dict[int, Any] = {}  # id of an object's __dict__ -> the node that reaches it
        for obj, name in guard.slotted:
            value = getattr(obj, name, _EMPTY)
            if value is _EMPTY:
                self.rest_slotted.append((obj, name))
                continue
            m = owners.get(id(obj))
            if m is None:
                m = owners[id(obj)] = manager(obj, "object")
            if type(obj) is types.FunctionType and name == "__code__":  # read directly, not through getattr
                m = m.code_manager(name, value, kind)
            elif type(obj) is types.FunctionType and name == "__defaults__" and value is not None:
                m = m.func_defaults_manager(name, value, kind)
            elif type(obj) is types.FunctionType and name == "__kwdefaults__" and value is not None:
                m = m.func_kwdefaults_manager(name, value, kind)
            elif name == "__dict__" and (type(obj) is types.FunctionType or _standard_dict(type(obj))):
                m = m.get_generic_dict_manager(name, None, kind)  # the instance dict itself, not through getattr
            else:
                m = m.getattr_manager(name, name, None, kind)
            _same(m, value, name)
            if name == "__dict__":
                instance_dicts[id(value)] = m  # its version tag is checked on this node (below)
        return owners, instance_dicts

    def _add_dicts(self, guard: StateGuard, manager: Callable[[Any, str], Any],
                   instance_dicts: dict[int, Any]) -> None:
        """The plain dicts by version tag (an object's __dict__ on the node that reaches it), the
        empty ones by their emptiness, the classes' namespaces by version."""
        empty: list[dict] = []
        for d in guard._plain:
            node = instance_dicts.get(id(d))  # (an object's __dict__: on the node that reaches it, one item fewer)
            if node is None and not d:
                empty.append(d)
                continue
            (manager(d, "dict") if node is None else node).add_dict_version_guard(d, ["dict version"], None)
        # Empty dicts (most of a Module's hook and child tables): an empty dict's contents are its
        # emptiness, so "all still empty" proves what their version tags would, and `any` over them
        # is one C loop reading each size, about a third of a node per dict.
        if empty:
            manager(empty, "empty dicts").add_lambda_guard(_all_empty, ["dicts still empty"], None)
        # Classes' mappingproxies: the plain dict behind each (a class's namespace; a write to it,
        # `Cls.attr = v`, moves its version tag) by version, not item by item in `_rest` on every
        # call; all or none, as `_rest` compares them as one run.
        if guard._class_dicts is not None:
            for d in guard._class_dicts:
                manager(d, "class namespace").add_dict_version_guard(d, ["dict version"], None)
            self.rest_others = False

    def _add_values(self, guard: StateGuard, manager: Callable[[Any, str], Any]) -> None:
        """Closure cells and guarded names by the identity of what they hold (an absent name by its
        absence), mutable sequences by length and a list's items by identity; what cannot be
        expressed (an empty cell, a set's or deque's items) is left to `_rest`."""
        kind = _ManagerKind.GUARD_MANAGER
        for cell, value in zip(guard.cells, guard.recorded[1]):
            if value is _EMPTY:
                self.rest_cells.append(cell)
            else:
                _same(manager(cell, "cell").getattr_manager("cell_contents", "cell_contents", None, kind), value, "cell")
        for (namespace, name), value in zip(guard.names, guard.recorded[2]):
            m = manager(namespace, "namespace")
            if value is _EMPTY:
                m.add_dict_contains_guard(False, name, [f"{name} absent"], None)
            else:
                _same(m.dict_getitem_manager(name, name, None, kind), value, name)
        for q in guard._seqs_checked:
            m = manager(q, "sequence")
            m.add_length_check_guard(len(q), ["len"], None)
            if type(q) is list:
                for j, item in enumerate(q):
                    _same(m.list_getitem_manager(j, f"[{j}]", None, kind), item, f"[{j}]")
            elif len(q):
                self.rest_seqs.append((q, list(q)))

    def holds(self) -> bool:
        """Whether the state is as recorded (True proves it; False sends the caller to Python).
        engine.autotrace.AutoTraced._call runs this inline: keep the two alike."""
        try:
            if not self.check(self.values):
                return False
        except Exception:  # an accessor that raises (a property of a user class): let Python decide
            return False
        if float32_precision() != self.precision or _Distribution._validate_args is not self.validate:
            return False
        return not self.rest or self._rest()

    def _rest(self) -> bool:
        guard = self.guard
        for cell in self.rest_cells:
            try:
                cell.cell_contents
                return False  # recorded empty, now filled
            except ValueError:
                pass
        if any(getattr(o, n, _EMPTY) is not _EMPTY for o, n in self.rest_slotted):
            return False
        for q, items in self.rest_seqs:
            if len(q) != len(items) or not all(map(operator.is_, q, items)):
                return False
        others = guard._others
        if others and self.rest_others:
            recorded = guard.recorded[4]
            now = itertools.chain(_chain(others), _chain(d.values() for d in others))
            n = sum(map(len, others)) * 2
            if not all(map(operator.eq, map(len, others), guard.recorded[0][1:1 + len(others)])):
                return False
            if not all(map(operator.is_, now, itertools.islice(recorded, n))):
                return False
        return all(_buffer_state(memoryview(o)) == recorded for o, recorded in guard.buffers)


# When a guard stops using tags: a rebuild of its native check after tags moved (contents
# restored) costs about what the tags save on _REBUILD_CALLS calls. Each rebuild is charged that
# much against the calls the tags served since the last one (their credit, at most _CREDIT_CAP
# calls), and a guard whose credit reaches -_FAST_MISSES rebuilds' worth stops using them. So a
# state flipped and restored on every call (torch.func.functional_call) drops the tags at its
# third call, one flipped every other call within some tens of calls, while one changed now and
# then (a lazy import's first write into a watched module, another module swapped in for a
# while, a setting toggled between phases of a program) keeps them: one rebuild per change,
# instead of the full Python check on every call for the rest of the process.
_FAST_MISSES = 3
_REBUILD_CALLS = 8
_CREDIT_CAP = 64


def _no_progress() -> int:
    return 0


def _standard_dict(cls: type) -> bool:
    """Whether `getattr(obj, "__dict__")` of a `cls` instance is the dict at its instance-dict slot
    (what a native check's generic-dict accessor reads without an attribute lookup): the class's
    `__dict__` is the descriptor Python gives a class defined in Python, and attribute access is
    not overridden. Asked at every build, not cached: a class's attributes can be rebound."""
    if cls.__getattribute__ is not object.__getattribute__:
        return False
    for klass in cls.__mro__:
        desc = vars(klass).get("__dict__")
        if desc is not None:
            return (type(desc) is types.GetSetDescriptorType and desc.__objclass__ is klass
                    and bool(klass.__flags__ & _HEAPTYPE))
    return False


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement or type()


def _all_empty(dicts: list[dict]) -> bool:
    """Whether every dict of `dicts` is empty (a native check's lambda guard)."""
    return not any(dicts)


_dict_version = getattr(getattr(torch._C._dynamo, "guards", None), "dict_version", None)

# Building a native check makes torch import Dynamo's guard module (its C++ guard tree reads an
# enum from there), once per process: `NATIVE_IMPORT_S`, what that import took where measured
# (docs/lab), more than a small guard's Python check costs in a hundred thousand calls. So guards
# check in Python until Dynamo is imported anyway (torch.compile, a user's import)
# or this process's Python checks have cost `NATIVE_IMPORT_S` in all; then the import is paid, at
# most twice what the cheaper choice would have cost (the ski-rental rule; tests/test_lazy_imports.py).
# NATIVE_GUARDS ("auto"; "now": build at once; "never": Python only), from VMAPBENCH_NATIVE_GUARDS,
# lets tests and benchmarks pick a side.
NATIVE_IMPORT_S = 0.6
NATIVE_GUARDS = os.environ.get("VMAPBENCH_NATIVE_GUARDS", "auto")
if NATIVE_GUARDS not in ("auto", "now", "never"):
    raise ValueError(f"VMAPBENCH_NATIVE_GUARDS={NATIVE_GUARDS!r}: use auto (the default), now or never")
_python_checks_s = [0.0]  # seconds spent in StateGuard._holds_by_tags, process-wide
_NATIVE_NEEDS = "torch._dynamo.guards"  # the module a native check's build imports


def native_checks_pay() -> bool:
    """Whether guards should build their native check now (see NATIVE_IMPORT_S)."""
    if NATIVE_GUARDS != "auto":
        return NATIVE_GUARDS == "now"
    return _NATIVE_NEEDS in sys.modules or _python_checks_s[0] >= NATIVE_IMPORT_S


def _dict_versions(dicts: list[dict]) -> list[int] | None:
    """The version tags of `dicts`, or None where this torch/Python does not expose them (or they
    do not move on a write: checked once)."""
    if _dict_version is None:
        return None
    probe: dict = {}
    before = _dict_version(probe)
    probe[0] = 0
    if _dict_version(probe) == before:
        return None
    return list(map(_dict_version, dicts))


def _tensor_guard(tensors: list[torch.Tensor]) -> Any:
    """torch's C++ guard manager over `tensors`' metadata (type, dispatch keys, dtype, device,
    requires_grad, sizes, strides), or None where this torch has none (Python compares then)."""
    if not tensors:
        return None
    try:
        root = torch._C._dynamo.guards.RootGuardManager()
        for i, t in enumerate(tensors):
            root.list_getitem_manager(i, f"tensor[{i}]", t, _ManagerKind.GUARD_MANAGER).add_tensor_match_guard(
                t, list(t.shape), list(t.stride()), f"tensor[{i}]", [f"tensor[{i}]"], None, type(t), torch._C._dispatch_keys(t)
            )
        return root if root.check(tensors) else None
    except (AttributeError, TypeError, RuntimeError):
        return None


_cell_contents = operator.attrgetter("cell_contents")


def _library_namespaces(classes: Iterable[type]) -> list[dict]:
    """torch.nn.functional's globals and the dicts of the library classes in `classes`' MROs."""
    namespaces = [vars(torch.nn.functional)]
    for cls in {klass for c in classes for klass in c.__mro__ if klass is not object and _is_library(klass)}:
        namespaces += [d for d in gc.get_referents(cls.__dict__) if isinstance(d, dict)]
    return namespaces


def _buffer_state(view: memoryview) -> tuple:
    """What a reader of the buffer sees: its layout (an array's shape or dtype set in place keeps
    its bytes) and its bytes."""
    return view.format, view.shape, view.strides, view.tobytes()


def _slot_names(cls: type) -> list[str]:
    """The `__slots__` attributes of a user class (and its user bases), `__dict__`/`__weakref__` aside."""
    names: list[str] = []
    for klass in cls.__mro__:
        if _is_library(klass) or klass is object:
            continue
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                names.append(f"_{klass.__name__.lstrip('_')}{name}" if name.startswith("__") and not name.endswith("__") else name)
    return names
