"""Whether one run of a function had any effect visible to Python besides its result.

Automatic tracing (engine.autotrace) replays a recorded graph of tensor ops: no Python runs. That
is only what an eager call would do when the eager call's Python did nothing the replay skips.
`watch()` proves this for one real run by observing it with `sys.setprofile` and checking every
piece of code that ran outside torch and the engine:

- every Python frame of such code must have bytecode without stores outside its own locals:
  no STORE_GLOBAL/DELETE_GLOBAL, no STORE_ATTR/DELETE_ATTR (`self.x = ...`), no STORE_SUBSCR/
  DELETE_SUBSCR/STORE_SLICE (`captured[k] = ...`), no stores to `nonlocal` variables, no STORE_NAME.
  The instruction sets of Python 3.11 to 3.13 were reviewed for these; on another Python no user
  code is proven pure (a new instruction could store unseen). The
  check is static and per code object (cached), so it refuses a store on a path the run did not
  take as well: conservative, never wrong the other way. The one exception: a list/dict/set the
  frame built itself (`fresh_locals`) may be filled (`d[k] = v`, `out.append(t)`);
- every C function such code calls must be on a whitelist: pure builtins (len, isinstance, min,
  ...), math/operator functions, read-only methods of the builtin containers and strings, torch
  ops (torch.*, torch._C._nn/_linalg/_special/_fft functions and Tensor methods) except those that
  change global state or hand tensor data to Python (manual_seed, set_*, Tensor.tolist/numpy/
  item/data_ptr, requires_grad_, ...). print, file/stream writes, Python `random`, `time`,
  numpy, list.append on a list the frame did not build, and every other C call are refused;
- a stateful torch entry point (Tensor.backward, Module.train/eval/register_*/to/apply,
  torch.manual_seed, optimizer steps, ...) called from such code is refused.

Torch's and the engine's own Python code, and the standard library when called from them (not
from user code), are trusted. typing_extensions counts as standard library: it is typing's
backport, torch depends on it, and importing it patches typing's internals with its own functions
(typing._collect_parameters, whose check reads its caller's frame with sys._getframe), so a generic
subscripted inside torch runs its code too (seen with torch 2.11 on Python 3.12, where that made
every function eager). These are trusted: they are the machinery whose ops the trace records. A user function
they call back (the transformed function, a Module's forward, a hook) is checked like any user
code. Third-party packages other than torch are user code.

Code the garbage collector runs in the middle of the watched run (the callbacks of `gc.callbacks`,
finalizers and weakref callbacks of the objects a collection frees) is not checked: it runs on top
of whatever frame an allocation interrupted, at a time the function does not decide (a test
framework timing collections with a `gc.callbacks` entry made every function it ran through a
collection eager for good). A `gc.collect()` the function calls is a C call like any other.

`watch()` also reports the nn.Modules that ran (their state is then guarded by the caller) and the
global names user frames read or write through their module's namespace (by the
instructions that do: an attribute that shares a global's name is not one).
"""
from __future__ import annotations

import dis
import gc
import os
import sys
import sysconfig
import threading
import types
from typing import Any, Iterator

import contextlib

import torch
import typing_extensions

__all__ = ["Observation", "generated", "global_names", "watch"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_DIRS = tuple(
    os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
_SITE_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
# Third-party modules that stand for the standard library (see the module docstring).
_STDLIB_BACKPORTS = frozenset({os.path.realpath(typing_extensions.__file__)})

# Bytecode that writes somewhere other than the frame's own locals. STORE_SLICE is Python 3.12's
# `captured[i:j] = v` (3.11 builds a slice and stores it with STORE_SUBSCR).
_EFFECT_OPS = frozenset({
    "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_ATTR", "DELETE_ATTR", "STORE_SUBSCR", "DELETE_SUBSCR",
    "STORE_SLICE", "STORE_NAME", "DELETE_NAME", "IMPORT_STAR",
})
# The Pythons whose instruction sets were read for the above (every opcode new in 3.12 and 3.13
# reviewed: STORE_SLICE stores; `import *` became CALL_INTRINSIC_1 INTRINSIC_IMPORT_STAR; keyword
# names moved from KW_NAMES to a LOAD_CONST before CALL_KW; the rest load, store locals, jump or
# build). On another Python a new instruction could store unseen, so no user code is proven pure
# there: automatic tracing runs it eagerly, and says why.
_REVIEWED_PYTHONS = ((3, 11), (3, 12), (3, 13))
_PYTHON = sys.version_info[:2]

# Not id/hash (identity differs per call while the signature does not) nor repr/format (a tensor's
# text reads its values outside the dispatcher).
_PURE_BUILTINS = frozenset({
    "abs", "all", "any", "bin", "callable", "chr", "divmod", "getattr", "hasattr", "hex", "isinstance",
    "issubclass", "iter", "len", "max", "min", "oct", "ord", "pow", "round", "sorted", "sum", "__build_class__",
})
_PURE_MODULES = frozenset({"math", "cmath", "operator", "_operator", "_functools"})
_READ_METHODS = {
    dict: frozenset({"get", "keys", "values", "items", "copy", "__contains__", "__getitem__", "__len__", "fromkeys"}),
    list: frozenset({"index", "count", "copy", "__getitem__", "__len__", "__contains__"}),
    tuple: frozenset({"index", "count", "__getitem__", "__len__", "__contains__"}),
    set: frozenset({"union", "intersection", "difference", "issubset", "issuperset", "copy", "__contains__"}),
    frozenset: frozenset({"union", "intersection", "difference", "issubset", "issuperset", "copy", "__contains__"}),
    str: frozenset({
        "format", "join", "split", "rsplit", "startswith", "endswith", "lower", "upper", "strip", "lstrip",
        "rstrip", "replace", "find", "rfind", "index", "count", "partition", "rpartition", "isdigit", "isidentifier",
    }),
    torch.Size: frozenset({"numel", "index", "count", "__getitem__", "__len__"}),
}
# Torch C functions and Tensor methods that change process state or give tensor data to Python
# (which the trace cannot see: `.tolist()` and `.numpy()` bypass the dispatcher).
_TORCH_REFUSED = frozenset({
    "tolist", "numpy", "item", "data_ptr", "untyped_storage", "storage", "requires_grad_", "retain_grad",
    "set_", "resize_", "resize_as_", "share_memory_", "_fix_weakref", "register_hook", "backward",
    "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "set_default_dtype",
    "set_default_device", "set_num_threads", "set_printoptions", "save", "load", "__setstate__",
    "_set_grad_enabled", "set_grad_enabled", "__array__", "__index__", "__int__", "__float__", "__bool__",
})
# Torch's decorator modules: the wrappers they put around API functions (torch.manual_seed is
# wrapped by `_disable_dynamo` once dynamo is loaded) are looked through to find the real caller.
_WRAPPER_FILES = frozenset(
    os.path.join(_TORCH_DIR, *parts) for parts in (("_compile.py",), ("_dynamo", "eval_frame.py"), ("utils", "_contextlib.py"))
)
_TORCH_C_MODULES = frozenset({"torch._C._nn", "torch._C._linalg", "torch._C._special", "torch._C._fft", "torch._C._nested"})
# Torch Python entry points that change state, or read tensor values outside the dispatcher (a
# tensor's text), when user code calls them.
_STATEFUL_TORCH_NAMES = frozenset({
    "__repr__", "__str__", "__format__", "__array__", "tolist", "numpy",
    "backward", "manual_seed", "seed", "set_rng_state", "fork_rng", "train", "eval", "requires_grad_",
    "zero_grad", "step", "apply", "_apply", "to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type",
    "share_memory", "load_state_dict", "add_module", "register_module", "register_buffer", "register_parameter",
    "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
    "register_full_backward_pre_hook", "register_backward_hook", "register_hook", "register_parametrization",
    "remove", "retain_grad", "save", "load", "set_default_dtype", "set_default_device", "use_deterministic_algorithms",
    "__setattr__", "__delattr__", "__setitem__", "__delitem__", "append", "extend", "insert", "pop", "update", "clear",
})


def _is_torch_or_engine(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or filename.startswith(_ENGINE_DIR) or filename.startswith("<eval_with_key>")


def _is_helper(code: types.CodeType) -> bool:
    """Standard-library code, and generated dunders (a dataclass's __init__, a namedtuple's
    __new__): trusted when torch or the engine call them, checked when user code does.

    Decided once per code object (`_helper_codes`): the profiler asks at every call of a frame
    that is not torch's or the engine's, and torch's tracer calls contextlib, functools and typing
    hundreds of thousands of times in one recording, where `os.path.realpath` (a system call per
    path component) at every call would cost more than the rest of the watched recording."""
    verdict = _helper_codes.get(code)
    if verdict is None:
        filename = code.co_filename
        if filename.startswith("<frozen "):
            verdict = True
        elif filename.startswith("<"):
            verdict = code.co_name.startswith("__") and code.co_name.endswith("__")
        else:
            path = os.path.realpath(filename)
            verdict = (path.startswith(_STDLIB_DIRS) and not any(m in path for m in _SITE_MARKERS)) \
                or path in _STDLIB_BACKPORTS
        _helper_codes[code] = verdict
    return verdict


_helper_codes: dict[types.CodeType, bool] = {}


_FRESH, _OTHER, _COMPREHENSION = "fresh", "other", "comprehension"
_BUILDS = frozenset({"BUILD_LIST", "BUILD_MAP", "BUILD_SET", "BUILD_CONST_KEY_MAP"})
_SIMPLE_LOADS = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME"})
_MUTATORS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add", "discard", "sort",
    "reverse", "popitem", "__setitem__", "__delitem__",
})
_fresh_cache: dict[types.CodeType, frozenset[str]] = {}


def fresh_locals(code: types.CodeType) -> frozenset[str]:
    """Local variables that only ever hold a list/dict/set the frame built itself (`out = []`,
    `d = {}`, `xs = [f(v) for v in vs]`): mutating them is local to the frame. Found by a small
    stack simulation per line that tags values built by BUILD_LIST/MAP/SET or a comprehension and
    forgets every tag at any other instruction that is not a plain load, store or swap; a local
    qualifies when every store into it stores a tagged value (arguments and closure cells never)."""
    cached = _fresh_cache.get(code)
    if cached is not None:
        return cached
    stores: dict[str, bool] = {}
    stack: list[str] = []
    for ins in dis.get_instructions(code):
        op = ins.opname
        if ins.starts_line is not None:
            stack = []
        if op in ("RESUME", "NOP", "PRECALL", "CACHE", "EXTENDED_ARG"):
            continue
        if op in _BUILDS:
            _resize(stack, len(stack) + dis.stack_effect(ins.opcode, ins.arg) - 1)
            stack.append(_FRESH)
        elif op == "LOAD_CONST" and isinstance(ins.argval, types.CodeType) and ins.argval.co_name in ("<listcomp>", "<setcomp>", "<dictcomp>"):
            stack.append(_COMPREHENSION)
        elif op == "MAKE_FUNCTION" and ins.arg == 0 and stack and stack[-1] == _COMPREHENSION:
            pass
        elif op == "CALL" and ins.arg == 0 and len(stack) >= 2 and stack[-2] == _COMPREHENSION:
            del stack[-2:]
            stack.append(_FRESH)
        elif op in _SIMPLE_LOADS:
            stack.append(_OTHER)
        elif op == "GET_ITER" and stack:
            stack[-1] = _OTHER
        elif op == "SWAP" and ins.arg <= len(stack):
            stack[-1], stack[-ins.arg] = stack[-ins.arg], stack[-1]
        elif op == "COPY" and ins.arg <= len(stack):
            stack.append(stack[-ins.arg])
        elif op == "STORE_FAST":
            value = stack.pop() if stack else _OTHER
            stores[ins.argval] = stores.get(ins.argval, True) and value == _FRESH
        else:  # anything else: forget what the stack holds
            effect = dis.stack_effect(ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None)
            stack = [_OTHER] * max(0, len(stack) + effect)
    n_args = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    excluded = set(code.co_varnames[:n_args]) | set(code.co_cellvars)
    fresh = frozenset(name for name, ok in stores.items() if ok and name not in excluded)
    _fresh_cache[code] = fresh
    return fresh


def _resize(stack: list, n: int) -> None:
    del stack[max(0, n):]


# Bytecode that reads or writes a name in the module's namespace (LOAD_NAME: a class body's or
# module-level code's fallback to globals; an import binds a name that is then read).
_GLOBAL_OPS = frozenset({
    "LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME", "STORE_NAME", "DELETE_NAME",
    "LOAD_FROM_DICT_OR_GLOBALS", "IMPORT_NAME",
})
_global_cache: dict[types.CodeType, frozenset[str]] = {}
_GLOBAL_OPCODES = frozenset(dis.opmap[name] for name in _GLOBAL_OPS if name in dis.opmap)
# LOAD_GLOBAL's argument holds its name's index shifted left by one from Python 3.11 on (the low
# bit says whether a NULL is pushed too).
_LOAD_GLOBAL_SHIFT = 1 if sys.version_info >= (3, 11) else 0
_LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
_EXTENDED_ARG = dis.EXTENDED_ARG


def _scan_global_names(code: types.CodeType) -> set[str]:
    """The names `_GLOBAL_OPS` instructions of `code` (not its nested code) name: what
    `dis.get_instructions` gives as their argval, read from the raw bytecode (two bytes an
    instruction; inline caches read as CACHE, an opcode outside the set) without building an
    Instruction per instruction: a guard's first walk reads hundreds of code objects."""
    raw, names, found = code.co_code, code.co_names, set()
    ext = 0
    for i in range(0, len(raw), 2):
        op = raw[i]
        if op == _EXTENDED_ARG:
            ext = (ext | raw[i + 1]) << 8
            continue
        if op in _GLOBAL_OPCODES:
            arg = ext | raw[i + 1]
            found.add(names[arg >> _LOAD_GLOBAL_SHIFT if op == _LOAD_GLOBAL else arg])
        ext = 0
    return found


def global_names(code: types.CodeType) -> frozenset[str]:
    """The names this code (and the code nested in it: comprehensions, lambdas, inner functions)
    reads or writes through its module's namespace, by the instructions that do.

    Not co_names: those also hold every attribute name (`F.cross_entropy` puts `cross_entropy`
    there), and a global that merely shares an attribute's name is state the code never reads;
    following it walked whatever that global reaches (a lazy module proxy, `sys.modules`, the
    whole interpreter) and made functions unprovable for nothing. Cached per code object."""
    cached = _global_cache.get(code)
    if cached is not None:
        return cached
    names = _scan_global_names(code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    result = _global_cache[code] = frozenset(names)
    return result


_code_verdicts: dict[types.CodeType, str | None] = {}

# Callables that call the callables they are given from C (map, itertools, functools, a key= of
# sorted/min/max/list.sort): sys.setprofile reports the C functions that Python frames call, not
# those C calls, so `sum(map(random.getrandbits, [8]))` would draw unseen and a replay would
# freeze the draw. Code that names one is not proven pure (it runs eagerly; results stay exact).
_HIGHER_ORDER = frozenset({
    "map", "filter", "starmap", "accumulate", "groupby", "filterfalse", "dropwhile", "takewhile",
    "reduce", "partial", "partialmethod", "methodcaller", "defaultdict",
})


def _kw_names(code: types.CodeType, ins: dis.Instruction) -> tuple:
    """The keyword names of a call (Python 3.11's KW_NAMES holds an index into co_consts)."""
    names = ins.argval if isinstance(ins.argval, tuple) else (
        code.co_consts[ins.arg] if ins.arg is not None and ins.arg < len(code.co_consts) else ())
    return names if isinstance(names, tuple) else ()


def _call_kw_names(instructions: list, i: int) -> tuple:
    """The keyword names of Python 3.13's CALL_KW: the tuple its LOAD_CONST pushed just before
    (anything else: ("key",), so an unreadable call counts as one that may pass key=)."""
    names = instructions[i - 1].argval if i and instructions[i - 1].opname == "LOAD_CONST" else None
    return names if isinstance(names, tuple) else ("key",)


def code_effect(code: types.CodeType) -> str | None:
    """Why this code object may write outside its own locals (None: it cannot). Cached.

    A subscript store into a fresh local (`d[k] = v` right after `d = {}`) is local."""
    verdict = _code_verdicts.get(code, False)
    if verdict is not False:
        return verdict
    verdict = None
    if _PYTHON not in _REVIEWED_PYTHONS:
        verdict = (f"{code.co_name}: Python {_PYTHON[0]}.{_PYTHON[1]}'s bytecode has not been reviewed by engine.purity "
                   f"(it knows {', '.join(f'{a}.{b}' for a, b in _REVIEWED_PYTHONS)}): a store it does not know could "
                   f"go unseen")
        _code_verdicts[code] = verdict
        return verdict
    instructions = list(dis.get_instructions(code))
    for i, ins in enumerate(instructions):
        # the container sits below the key (subscript) or below start and stop (3.12's slice store)
        reach = 3 if ins.opname == "STORE_SLICE" else 2
        if ins.opname in ("STORE_SUBSCR", "DELETE_SUBSCR", "STORE_SLICE") and i >= reach:
            container, keys = instructions[i - reach], instructions[i - reach + 1:i]
            if container.opname == "LOAD_FAST" and container.argval in fresh_locals(code) \
                    and all(k.opname in _SIMPLE_LOADS for k in keys):
                continue
        if ins.opname in _EFFECT_OPS or (ins.opname == "CALL_INTRINSIC_1" and ins.argrepr == "INTRINSIC_IMPORT_STAR"):
            verdict = f"{ins.opname} {ins.argrepr or ins.argval}"
        elif ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_ATTR", "LOAD_METHOD") and ins.argval in _HIGHER_ORDER:
            verdict = (f"a call through {ins.argval}, which calls what it is given from C, where the purity "
                       f"watch cannot see it")
        elif (ins.opname == "KW_NAMES" and "key" in _kw_names(code, ins)) or (
                ins.opname == "CALL_KW" and "key" in _call_kw_names(instructions, i)):
            verdict = "a call with key=, whose key function is called from C, where the purity watch cannot see it"
        elif ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in code.co_freevars:
            verdict = f"a store to the nonlocal {ins.argval}"
        if verdict is not None:
            verdict = f"{code.co_name} ({code.co_filename}:{ins.positions.lineno if ins.positions else code.co_firstlineno}) does {verdict}"
            break
    _code_verdicts[code] = verdict
    return verdict


def c_call_effect(fn: Any) -> str | None:
    """Why calling this C function from user code may have an effect (None: it is pure or a torch op)."""
    name = getattr(fn, "__name__", "?")
    owner = getattr(fn, "__self__", None)
    module = getattr(fn, "__module__", None)
    if isinstance(owner, types.ModuleType):
        mod = owner.__name__
        if mod == "builtins":
            return None if name in _PURE_BUILTINS else f"the builtin {name}()"
        if mod in _PURE_MODULES:
            return None
        if mod in _TORCH_C_MODULES:
            return None if name not in _TORCH_REFUSED else f"{mod}.{name}"
        return f"{mod}.{name}()"
    if owner is None and module is not None and (module == "torch" or module.startswith("torch.")):
        refused = name in _TORCH_REFUSED or name.startswith(("set_", "_set"))
        return f"torch.{name}" if refused else None
    if isinstance(owner, torch.Tensor):
        return f"Tensor.{name}" if name in _TORCH_REFUSED else None
    if isinstance(owner, type) and owner.__module__.split(".")[0] == "torch" and name not in _TORCH_REFUSED:
        return None  # a static/class method of a torch class (torch.Tensor.add via the class, torch.Size)
    for kind, methods in _READ_METHODS.items():
        if type(owner) is kind:
            return None if name in methods else f"{kind.__name__}.{name}()"
    return f"{type(owner).__name__}.{name}()"


class Observation:
    """What `watch()` saw of one run: `effects` (why it is not pure; empty if it is), the nn.Modules
    that ran, and (namespace dict, name) pairs of the global names user code could read."""

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.effect_codes: dict[types.CodeType, str] = {}  # the user code each effect was made by (its first)
        self.modules: dict[int, torch.nn.Module] = {}
        self.global_slots: dict[tuple[int, str], tuple[dict, str]] = {}
        self.user_codes: set[types.CodeType] = set()
        self.state_dicts = False  # torch's state-dict code ran (engine.guardstate._STATE_DICT_TABLES)

    @property
    def pure(self) -> bool:
        return not self.effects


def generated(code: types.CodeType) -> bool:
    """Code compiled at run time from a string (exec/eval: dataclass and namedtuple methods,
    torch's make_fx signature lambdas, a user's eval'd function), not read from a file."""
    return code.co_filename.startswith("<") and not code.co_filename.startswith("<frozen ")


_MODULE_CALL_CODES = frozenset(
    f.__code__ for f in (torch.nn.Module._call_impl, torch.nn.Module._wrapped_call_impl) if hasattr(f, "__code__")
)


# The nn.Module methods that read a module's state-dict hooks and non-persistent buffer names.
_STATE_DICT_CODES = frozenset(
    getattr(torch.nn.Module, name).__code__ for name in (
        "state_dict", "_save_to_state_dict", "load_state_dict", "_load_from_state_dict",
    ) if hasattr(getattr(torch.nn.Module, name, None), "__code__")
)


class _Profiler:
    """The sys.setprofile callback of one watched run (on the watching thread only)."""

    def __init__(self, obs: Observation) -> None:
        self.obs = obs
        self.trust: dict[types.CodeType, bool] = {}  # code -> torch/engine code (True) or not
        # Torch/engine code a call event needs nothing more of than its frame noted as trusted: not
        # Module.__call__, the state-dict methods or a stateful entry point (most events of a
        # watched run are the engine's and torch's own calls).
        self.plain: set[types.CodeType] = set()
        self.frames: dict[int, bool] = {}  # id(frame) -> trusted, for the frames on the stack
        self.collecting = False  # a garbage collection is running (its callbacks and finalizers)

    def _trusted(self, frame: types.FrameType) -> bool:
        trusted = self.frames.get(id(frame))
        if trusted is not None:
            return trusted
        code = frame.f_code
        own = self.trust.get(code)
        if own is None:
            own = self.trust[code] = _is_torch_or_engine(code.co_filename)
        if own:
            trusted = True
        elif _is_helper(code):
            back = frame.f_back
            trusted = back is not None and self._trusted(back)  # stdlib helpers of torch are torch's
        else:
            trusted = False
        self.frames[id(frame)] = trusted
        return trusted

    @staticmethod
    def _fresh_mutation(frame: types.FrameType, fn: Any) -> bool:
        """A list/dict/set method that mutates an object the calling frame built itself."""
        owner = getattr(fn, "__self__", None)
        if type(owner) not in (list, dict, set) or getattr(fn, "__name__", "") not in _MUTATORS:
            return False
        names = fresh_locals(frame.f_code)
        if not names:
            return False
        local = frame.f_locals
        return any(local.get(name) is owner for name in names)

    def _effect(self, code: types.CodeType, why: str) -> None:
        self.obs.effects.append(why)
        self.obs.effect_codes.setdefault(code, why)

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if self.collecting or event == "c_return":
            return
        if event == "call":
            code = frame.f_code
            if code in self.plain:
                self.frames[id(frame)] = True  # (a new frame may reuse a dead one's id)
                return
            self.frames.pop(id(frame), None)  # a new frame may reuse a dead one's id
            if code in _MODULE_CALL_CODES:
                module = frame.f_locals.get("self")
                if isinstance(module, torch.nn.Module):
                    self.obs.modules[id(module)] = module
            elif code in _STATE_DICT_CODES:
                self.obs.state_dicts = True
            if self._trusted(frame):
                if self.trust.get(code) and code.co_name not in _STATEFUL_TORCH_NAMES \
                        and code not in _MODULE_CALL_CODES and code not in _STATE_DICT_CODES:
                    self.plain.add(code)
                back = frame.f_back
                while back is not None and back.f_code.co_filename in _WRAPPER_FILES:
                    back = back.f_back
                # (An API entry point, not a closure: a weakref callback of torch's, `remove`, runs
                # on top of whatever frame the garbage collector interrupted.)
                if back is not None and code.co_name in _STATEFUL_TORCH_NAMES and "<locals>" not in code.co_qualname \
                        and not self._trusted(back):
                    self._effect(back.f_code, f"{code.co_qualname} (a torch call a replay would not repeat) from {back.f_code.co_name}")
                return
            if code not in self.obs.user_codes:
                self.obs.user_codes.add(code)
                why = code_effect(code)
                if why is not None:
                    self._effect(code, why)
                namespace = frame.f_globals
                for name in global_names(code):
                    if name in namespace:
                        self.obs.global_slots[(id(namespace), name)] = (namespace, name)
        elif event == "c_call":
            if self.frames.get(id(frame)) or self._trusted(frame):
                return
            why = c_call_effect(arg)
            if why is not None and not self._fresh_mutation(frame, arg):
                self._effect(frame.f_code, f"{frame.f_code.co_name} calls {why}")
        elif event == "return":
            self.frames.pop(id(frame), None)


_watching = threading.local()


def can_watch() -> bool:
    """Whether this thread is free to be watched (no other profiler, e.g. cProfile, installed)."""
    return sys.getprofile() is None and not getattr(_watching, "active", False)


def _collection_starts(phase: str, info: dict) -> None:
    """First of gc.callbacks while a watch runs: what runs from here to `_collection_ends` is the
    collector's, not the watched function's (on the thread the collection runs on)."""
    profiler = getattr(_watching, "profiler", None)
    if phase == "start" and profiler is not None:
        profiler.collecting = True


def _collection_ends(phase: str, info: dict) -> None:
    """Last of gc.callbacks while a watch runs (see `_collection_starts`)."""
    profiler = getattr(_watching, "profiler", None)
    if phase == "stop" and profiler is not None:
        profiler.collecting = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Inside the block, a watch of this thread sees nothing: for the engine's own work within a
    watched run (a recorded graph's passes and generated code), which runs none of the watched
    function's code and would otherwise pay a Python callback per call it makes."""
    profiler = getattr(_watching, "profiler", None)
    if profiler is None or sys.getprofile() is not profiler:
        yield
        return
    sys.setprofile(None)
    try:
        yield
    finally:
        sys.setprofile(profiler)


@contextlib.contextmanager
def watch() -> Iterator[Observation]:
    """Observe the code run inside the block (this thread). Check `can_watch()` first."""
    obs = Observation()
    profiler = _Profiler(obs)
    _watching.active = True
    _watching.profiler = profiler
    gc.callbacks.insert(0, _collection_starts)
    gc.callbacks.append(_collection_ends)
    sys.setprofile(profiler)
    try:
        yield obs
    finally:
        sys.setprofile(None)
        gc.callbacks.remove(_collection_starts)
        gc.callbacks.remove(_collection_ends)
        _watching.profiler = None
        _watching.active = False
