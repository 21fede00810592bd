"""Trace once, replay fast: `engine.trace` and `engine.compile`.

The engine pays tens of microseconds of Python per op (the batched tensor's dispatch, the rules,
autograd's bookkeeping). For a fixed input signature all of that decides the same thing every
call, so it is run once: the whole computation (batching rules and the backward passes included)
is recorded (`engine.recorder`) as an FX graph of aten ops on plain tensors, cleaned of the
bookkeeping the transforms leave behind (shape-only chains, transpose pairs, the forward value a
backward seed only needs the shape of, repeated ops), and later calls replay that graph.
`engine.compile` hands the same graph to inductor directly (see `compile`).

Per call, what is left is finding the graph for the arguments: a cheap key read off plain tensors,
scalars and flat containers of them (`_fast_signature`) finds it without the general pytree
flatten and hash, which would cost more than a small compiled graph's whole computation.

What a trace may not capture, and how it is handled:
- tensors the function reads without taking them as arguments (closed-over weights) become graph
  inputs fed with the live tensor objects at every replay, so in-place updates of them are seen;
  rebinding a closure variable to a *different* tensor object is not seen (the trace keeps the
  object it saw);
- a Python bool read off a tensor (`if t.all():`, the argument checks of torch.distributions)
  becomes a guard: the graph also computes whether each such condition comes out as it did when
  traced, and a replay where one does not runs the function eagerly instead, so an invalid input
  raises the function's own error (a distribution's ValueError naming the parameter) rather than
  computing NaN; if it does not raise, the inputs took another branch: `UntraceableError`, or with
  `fallback="eager"` the eager result (warned once);
- int/float values read in Python (`.item()`, `float(t)`) and ops whose output shape depends on
  data (`nonzero`, boolean masking) would be frozen into the graph: they raise `UntraceableError`
  (a `DataDependentError`), or with `fallback="eager"` warn once and run eagerly. Integer indexing
  (`index.Tensor` without boolean masks) is recorded like any op. `.tolist()`/`.numpy()` on plain
  tensors bypass PyTorch's dispatcher and cannot be detected: do not use them in a traced function;
- random ops stay ops in the graph, so each replay draws fresh values.
"""
from __future__ import annotations

import contextlib
import functools
import operator
import struct
import sys
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator

import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten

from engine import fused, purity, script_replay
from engine._modes import EngineMode
from engine.autoswitch import running
from engine.errors import DataDependentError
from engine.graph_passes import Fold, clean_up, fold_constants
from engine.recorder import record

aten = torch.ops.aten
_fused_switch = fused._local
_FUSED_OFF = fused.OFF
_perf_counter = time.perf_counter

__all__ = ["CacheInfo", "Entry", "TracedFunction", "UntraceableError", "compile", "compile_with_inductor", "trace"]


class UntraceableError(DataDependentError):
    """The function's behaviour depends on tensor values, so one recorded graph cannot stand for it."""


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    traces: int
    evictions: int
    currsize: int
    maxsize: int


# ------------------------------------------------------------------------------------------------
# signatures


_PACK_DOUBLE = struct.Struct("<d").pack
_RECORDING = threading.RLock()


def exact_value(x: Any) -> Hashable:
    """A key of a Python value that tells apart what `==` and hash() do not: 0.0 and -0.0, NaN
    payloads, 1, 1.0 and True (the type is part of it). A graph bakes a scalar argument in as a
    constant, so two calls share a graph only where their scalars are the same bits."""
    if isinstance(x, float):
        return type(x), _PACK_DOUBLE(x)
    if isinstance(x, complex):
        return type(x), (_PACK_DOUBLE(x.real), _PACK_DOUBLE(x.imag))
    return type(x), x


def _leaf_key(x: Any) -> Hashable:
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), x.dtype, x.device, x.requires_grad, x.layout)
    try:
        hash(x)
    except TypeError:
        raise TypeError(
            f"engine.trace: a non-tensor argument of type {type(x).__name__} is not hashable, so calls cannot be "
            f"told apart by its value. Pass it as a tensor, close over it, or make it hashable (e.g. a tuple)."
        ) from None
    return ("V", *exact_value(x))


def _signature(args: tuple, kwargs: dict, strides: bool = False) -> tuple[Hashable, list, Any]:
    flat, spec = tree_flatten((args, kwargs))
    if strides:
        leaves = tuple(_leaf_key(x) + (x.stride(),) if isinstance(x, torch.Tensor) else _leaf_key(x) for x in flat)
    else:
        leaves = tuple(_leaf_key(x) for x in flat)
    key = (spec, leaves, torch.is_grad_enabled())
    return key, flat, spec


# The fast signature: for the argument shapes almost every call has (plain tensors, Python scalars,
# and flat tuples/lists/dicts of them), a key built by direct attribute reads instead of a general
# pytree flatten plus a nested key. It is cheaper by an order of magnitude (the flatten and the
# hash of the TreeSpec are most of a small compiled graph's per-call cost) and maps to a cache
# entry found once through the full signature. It must determine the full signature: equal fast
# keys imply equal full keys. So it records the positional arity, every container's exact type
# (and a dict's keys in order), the keyword names, each leaf's kind, each tensor's shape, dtype,
# device, requires_grad, layout (and strides when compiled code asserts them), each scalar's type
# and exact value (exact_value: the bits of a float), and grad mode. Anything else (tensor subclasses other than Parameter, namedtuples,
# nesting, other leaf types) returns None and takes the full path. The leaves come out in
# tree_flatten's order, so an entry's input positions apply to either.
_FAST_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
_FAST_SCALARS = frozenset({int, float, bool, complex, str, type(None)})
_FAST_SEQUENCES = frozenset({tuple, list})


def _fast_leaf(x: Any, flat: list, strides: bool) -> Hashable | None:
    t = type(x)
    if t in _FAST_TENSORS:
        flat.append(x)
        if strides:
            return (x.shape, x.dtype, x.device, x.requires_grad, x.layout, x.stride())
        return (x.shape, x.dtype, x.device, x.requires_grad, x.layout)
    if t in _FAST_SCALARS:
        flat.append(x)
        return exact_value(x)
    return None


def _fast_arg(x: Any, flat: list, strides: bool) -> Hashable | None:
    """Key of one argument (a leaf, or a flat tuple/list/dict of leaves); None if not covered."""
    key = _fast_leaf(x, flat, strides)
    if key is not None:
        return key
    t = type(x)
    if t in _FAST_SEQUENCES:
        keys = []
        for item in x:
            k = _fast_leaf(item, flat, strides)
            if k is None:
                return None
            keys.append(k)
        return (t, tuple(keys))
    if t is dict:
        keys = []
        for item in x.values():
            k = _fast_leaf(item, flat, strides)
            if k is None:
                return None
            keys.append(k)
        return (t, tuple(x), tuple(keys))
    return None


def _fast_signature(args: tuple, kwargs: dict, strides: bool) -> tuple[Hashable, list] | None:
    """(fast key, leaves in tree_flatten order), or None when the arguments need the full path.

    Key shapes cannot collide: a tensor's is a 5/6-tuple starting with a torch.Size, a scalar's a
    2-tuple (scalar type, value), a sequence's a 2-tuple (tuple/list type, tuple), a dict's a
    3-tuple starting with dict.
    """
    flat: list = []
    parts: list = [torch.is_grad_enabled(), len(args)]
    for a in args:
        t = type(a)
        if t in _FAST_TENSORS:  # inlined: the overwhelmingly common case
            flat.append(a)
            if strides:
                parts.append((a.shape, a.dtype, a.device, a.requires_grad, a.layout, a.stride()))
            else:
                parts.append((a.shape, a.dtype, a.device, a.requires_grad, a.layout))
            continue
        k = _fast_arg(a, flat, strides)
        if k is None:
            return None
        parts.append(k)
    if kwargs:
        parts.append(tuple(kwargs))
        for v in kwargs.values():
            k = _fast_arg(v, flat, strides)
            if k is None:
                return None
            parts.append(k)
    return tuple(parts), flat


# ------------------------------------------------------------------------------------------------
# the data-dependence guard used while tracing


_PLAIN = (torch.Tensor, torch.nn.Parameter)


class _DataGuard(EngineMode):
    """Watches the ops that hand tensor data to Python or give data-dependent shapes while tracing.

    A Python bool read off a tensor (`if torch._is_all_true(valid):` in torch.distributions'
    argument checks, `if (x > 0).all():`) becomes a guard: the condition the trace saw is recorded
    as a graph op and every replay checks it (see `Entry.call`). An int or float read (`.item()`,
    `float(t)`) would freeze a value into the graph and is refused, as are ops whose output shape
    depends on values (nonzero, boolean masks); `index.Tensor` with integer indices, `one_hot`
    with `num_classes` and `repeat_interleave` with `output_size` have value-independent shapes
    and are recorded like any op.
    """

    _REFUSED_TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)
    _REFUSED = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default, aten.item.default}

    def __init__(self) -> None:
        super().__init__()
        self.conditions: list[torch.Tensor] = []  # 0-dim bool tensors (graph values) that must hold
        self.places: list[str] = []  # where each condition was read, for error messages
        # The undo log: (storage, its contents before the trace's first write into it) for every
        # storage that existed before the trace (an input, a captured tensor) and was written to.
        self.saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
        self.fresh: set[int] = set()  # data pointers of the storages the trace's ops created
        self.grad_modes: list[bool] = []  # the grad mode each GRAD_MODE_KERNELS call ran in, in order

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.is_mutable:
            self._save_before_write(func, args, kwargs)
        if func in GRAD_MODE_KERNELS:
            self.grad_modes.append(torch.is_grad_enabled())
        out = self._dispatch(func, args, kwargs)
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            # (a ZeroTensor, `_efficientzerotensor` in backward formulas, has no storage to read)
            if type(t) in _PLAIN and t.layout == torch.strided and t.numel() and not t._is_zerotensor():
                self.fresh.add(t.untyped_storage().data_ptr())
        return out

    def _save_before_write(self, func: Any, args: tuple, kwargs: dict) -> None:
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            t = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            if type(t) not in _PLAIN or t.layout != torch.strided or not t.numel():
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in self.fresh or ptr in self.saved:
                continue
            with _disable_current_modes():
                self.saved[ptr] = (storage, storage.clone())

    def undo_writes(self) -> None:
        """Put back what the trace wrote into tensors that existed before it (after a refusal)."""
        with _disable_current_modes(), torch.no_grad():
            for storage, before in self.saved.values():
                storage.copy_(before)
        self.saved.clear()

    def _dispatch(self, func, args, kwargs):
        if func is aten.is_nonzero.default or (func is aten._local_scalar_dense.default and args[0].dtype == torch.bool):
            return self._guard(func, args[0])
        if (func in self._REFUSED or any(t in func.tags for t in self._REFUSED_TAGS)) and not _shape_is_static(func, args, kwargs):
            name = func.name()
            raise UntraceableError(
                f"the function calls {name}, whose result depends on tensor values (`.item()`, "
                f"`float(tensor)`, boolean masking, nonzero). A recorded graph would freeze one "
                f"outcome. Use tensor ops instead (torch.where, masked arithmetic), or pass fallback='eager' to "
                f"run such a function without tracing."
            )
        return func(*args, **kwargs)

    def _guard(self, func: Any, t: torch.Tensor) -> bool:
        with _disable_current_modes():
            value = bool(func(t))
        # Recorded now (the ops below reach the tracer), so a later in-place write to `t` cannot change it.
        if func is aten.is_nonzero.default:
            cond = aten.ne.Scalar(t, 0) if value else aten.eq.Scalar(t, 0)
        else:
            cond = aten.eq.Scalar(t, value)
        self.conditions.append(cond.reshape(()))
        self.places.append(_user_frame())
        return value

    def all_hold(self) -> torch.Tensor:
        """One graph value: whether every recorded condition holds (the replay's guard).

        The conditions live where the tensors they were read off live: a model on CUDA whose
        torch.distributions checks also read a CPU scalar gives conditions on both. Each device's
        are reduced there; the answers meet on the CPU, where the replay reads the guard anyway.
        """
        per_device: dict[torch.device, list[torch.Tensor]] = {}
        for c in self.conditions:
            per_device.setdefault(c.device, []).append(c)
        if len(per_device) == 1:
            return torch.stack(self.conditions).all()
        return torch.stack([torch.stack(cs).all().cpu() for cs in per_device.values()]).all()


# Kernels whose result depends on the grad mode they run in, not only on their arguments: oneDNN's
# LSTM layer (nn.LSTM on CPU in float32) takes its training primitive under grad mode and its
# inference one under no_grad, which round differently (1.6e-7 on a 100-wide layer). Automatic
# tracing replays under no_grad, so a recorded call of one is pinned to the grad mode it was
# recorded in (`_in_grad_mode`): the replay then equals the eager call bit for bit.
GRAD_MODE_KERNELS = frozenset({aten.mkldnn_rnn_layer.default})


def _in_grad_mode(op: Any, recorded: bool, *args: Any, **kwargs: Any) -> Any:
    """`op(*args, **kwargs)` in the grad mode it was recorded in. Replayed under no_grad where it was
    recorded under grad mode, its tensor arguments are detached: the kernel sees grad mode, and
    autograd records nothing, as the replay under no_grad means."""
    now = torch.is_grad_enabled()
    if now is recorded:
        return op(*args, **kwargs)
    if recorded:
        args, kwargs = tree_map_only(torch.Tensor, torch.Tensor.detach, (args, kwargs))
    torch._C._set_grad_enabled(recorded)
    try:
        return op(*args, **kwargs)
    finally:
        torch._C._set_grad_enabled(now)


def _pin_grad_modes(gm: torch.fx.GraphModule, modes: list[bool]) -> bool:
    """Wrap each recorded call of a GRAD_MODE_KERNELS op in `_in_grad_mode` with the mode it ran in
    (`modes`, in the order the recording dispatched them). False when the graph's calls and the
    dispatched ones do not pair up one to one (the caller refuses the trace)."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in GRAD_MODE_KERNELS]
    if len(nodes) != len(modes):
        return False
    for node, mode in zip(nodes, modes):
        node.args = (node.target, mode, *node.args)
        node.target = _in_grad_mode
    if nodes:
        gm.recompile()
    return True


def _shape_is_static(func: Any, args: tuple, kwargs: dict) -> bool:
    """Ops tagged as having data-dependent output shapes whose shape here depends on shapes only."""
    if func is aten.index.Tensor:
        return all(i is None or i.dtype not in (torch.bool, torch.uint8) for i in args[1])
    if func is aten.one_hot.default:
        return (args[1] if len(args) > 1 else kwargs.get("num_classes", -1)) != -1
    if func is aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is not None
    return False


def _user_frame() -> str:
    """The innermost caller outside torch and the engine (a check's location, for messages). Read
    from the frames themselves: traceback.extract_stack would read every frame's source line."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        path = code.co_filename.replace("\\", "/")
        if "/torch/" not in path and "/engine/" not in path:
            return f"{code.co_filename}:{frame.f_lineno} ({code.co_name})"
        frame = frame.f_back
    frame = sys._getframe(2)
    return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


class _GuardFailed(Exception):
    """A replay found a guarded condition that differs from the traced run's."""


# ------------------------------------------------------------------------------------------------
# traced entries


def _output_builder(spec: Any, consts: list[tuple[int, Any]]) -> Callable[[Any], Any]:
    """How to turn the graph's list of output tensors into the function's return value.

    Decided once per entry: the common structures (one tensor, a flat tuple/list/dict of tensors)
    get a direct constructor, which skips the per-call list copy, the insertion of non-tensor
    outputs and the general tree_unflatten.
    """
    if not consts:
        if spec.is_leaf():
            return operator.itemgetter(0)
        if spec.type in (tuple, list, dict) and all(spec.child(i).is_leaf() for i in range(spec.num_children)):
            if spec.type is dict:
                keys = list(spec.context)
                return lambda outs: dict(zip(keys, outs))
            return spec.type

    def build(outs: Any) -> Any:
        outs = list(outs)
        for i, v in consts:
            outs.insert(i, v)
        return tree_unflatten(outs, spec)

    return build


class Entry:
    """One signature's recorded graph, the live tensors it reads, and the output structure."""

    __slots__ = (
        "gm", "run", "constants", "tensor_pos", "select", "out_spec", "out_consts", "build", "eager", "compiled",
        "compile_seconds", "key", "fast_keys", "first", "guards", "tier", "fused", "promotion", "fold",
        "inert", "live", "rewrites", "__weakref__",
    )

    def __init__(self) -> None:
        self.gm: torch.fx.GraphModule | None = None
        self.run: Callable | None = None
        self.constants: tuple[torch.Tensor, ...] = ()  # the captured tensors, live
        self.fold: Fold | None = None  # what reads only captured tensors: fed after them, computed once
        self.tensor_pos: list[int] = []
        self.select: list[int] | None = None  # tensor_pos, or None when every leaf is a tensor, in order
        self.out_spec: Any = None
        self.out_consts: list[tuple[int, Any]] = []
        self.build: Callable[[Any], Any] = operator.itemgetter(0)
        self.eager = False
        self.compiled: Callable | None = None
        self.compile_seconds: float | None = None
        self.key: Hashable = None
        self.fast_keys: list[Hashable] = []
        self.first: list[torch.Tensor] | None = None  # the traced run's results, returned by the tracing call
        self.guards: list[str] = []  # where the guarded conditions were read; the graph's last output checks them
        # The fused tier (engine.fused): `tier` counts replays toward a compile while it may pay,
        # `promotion` keeps that state for inspection, `fused` is the compiled program once ready.
        self.tier: fused.Tier | None = None
        self.promotion: fused.Tier | None = None
        self.fused: fused.FusedProgram | None = None
        # It reads no captured tensor (so nothing folded) and no input of its signature requires
        # grad: autograd records nothing whatever the grad mode, so an automatic tracing replay
        # needs no no_grad. (Where it reads captured tensors, no_grad also spares the folded
        # values' per-call requires_grad check, Fold.values: it costs more than the switch.)
        self.inert = False
        # The positions of the graph inputs the fold does not vouch for (the call's tensors, the
        # captured tensors the fold does not read): what the fused program checks on every call
        # while the fold's values are unchanged (engine.fused.FusedProgram).
        self.live: tuple[int, ...] = ()
        # The graph passes that changed its arithmetic (graph_passes.ARITHMETIC_PASSES): where any
        # did, a replay rounds differently from the eager call (engine.replay_contract).
        self.rewrites: tuple[str, ...] = ()

    def inputs(self, flat: list) -> list:
        return [flat[i] for i in self.tensor_pos] + list(self.feed())

    def feed(self) -> tuple:
        """The graph's trailing inputs: the captured tensors, then the folded values."""
        fold = self.fold
        return self.constants if fold is None else self.constants + fold.values()

    def call(self, flat: list | tuple) -> Any:
        mode = _fused_switch.mode
        program = self.fused
        if program is not None and mode is not _FUSED_OFF:
            # the fused program, inline (a Python frame costs what a check does)
            select, fold = self.select, self.fold
            # (the fold's values: the program's proof that the folded inputs are as it checked them)
            values = None if fold is None else fold.values()
            head = flat if select is None else [flat[i] for i in select]
            inputs = [*head, *self.constants] if values is None else [*head, *self.constants, *values]
            outs = program(inputs, values, self.live)
            if outs is None:
                outs = self.run(*inputs)
        elif mode is _FUSED_OFF or self.tier is None:
            select = self.select
            if select is None:
                outs = self.run(*flat, *self.feed())
            else:
                outs = self.run(*[flat[i] for i in select], *self.feed())
        else:  # a replay while the signature may still move up to the fused tier, timed for its counters
            select = self.select
            inputs = [*flat, *self.feed()] if select is None else [*[flat[i] for i in select], *self.feed()]
            start = _perf_counter()
            outs = self.run(*inputs)
            tier = self.tier
            if tier is not None:
                tier.seen(_perf_counter() - start, inputs, mode)
        if self.guards:
            if not outs[-1]:
                raise _GuardFailed()
            outs = outs[:-1]
        return self.build(outs)


# torch.compile keywords the direct inductor path can honour: `mode` and `options` become inductor
# config patches; `fullgraph` holds trivially (the recorded graph is whole); `dynamic` has nothing
# to act on, since every new shape is a new signature and so a new trace of its own.
_INDUCTOR_KWARGS = frozenset({"backend", "mode", "options", "fullgraph", "dynamic"})


def _direct_inductor(kwargs: dict) -> bool:
    return kwargs.get("backend", "inductor") == "inductor" and set(kwargs) <= _INDUCTOR_KWARGS


def _inductor_patches(kwargs: dict) -> dict[str, Any]:
    mode, options = kwargs.get("mode"), kwargs.get("options")
    patches: dict[str, Any] = {}
    if mode is not None and mode != "default":
        from torch._inductor import list_mode_options

        patches.update(list_mode_options(mode))
    for name, value in (options or {}).items():
        patches[name.replace("-", "_")] = value
    return patches


@contextlib.contextmanager
def distribution_validation_kept() -> Iterator[None]:
    """Keep torch.distributions' process-wide validate_args default across a torch.compile.

    dynamo's first torch.compile in a process (TorchPatcher.patch) calls
    `Distribution.set_default_validate_args(False)` for good, so every distribution built later,
    in any function, eager or engine, silently stops checking its arguments: an invalid parameter
    then computes NaN instead of raising. The graph handed to torch.compile here is an aten graph
    whose argument checks are already replay guards, so it needs no such switch; the user's
    default is put back.
    """
    from torch.distributions import Distribution

    default = Distribution._validate_args
    try:
        yield
    finally:
        Distribution.set_default_validate_args(default)


def compile_with_inductor(gm: torch.fx.GraphModule, inputs: list, kwargs: dict) -> Callable:
    """Compile an already-recorded aten graph with inductor, without dynamo.

    torch.compile(gm) would have dynamo trace the graph's Python code again (redundant: it is
    already a functional aten graph) and leave a guarded, frame-evaluating wrapper around the
    compiled code, whose checks cost more than the whole computation of a small graph. Our own
    signature key does the guarding instead (it includes strides in compiled mode, since the
    compiled code asserts them). `standalone_compile` is inductor's entry point for a graph from
    outside torch.compile; it goes through AOTAutograd and inductor's on-disk caches
    (TORCHINDUCTOR_CACHE_DIR) like torch.compile does, so a later process loads instead of compiling.
    """
    from torch._inductor import standalone_compile

    patches = _inductor_patches(kwargs)
    options = {"config_patches": patches} if patches else {}
    return standalone_compile(gm, inputs, dynamic_shapes="from_example_inputs", options=options)


class TracedFunction:
    """Callable returned by `engine.trace`: replays one recorded aten graph per input signature."""

    def __init__(self, fn: Callable, fallback: str, cache_size: int, compile_kwargs: dict | None = None, auto: bool = False):
        if fallback not in ("error", "eager"):
            raise ValueError(f"engine.trace: fallback must be 'error' or 'eager', got {fallback!r}")
        if not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"engine.trace: cache_size must be a positive int, got {cache_size!r}")
        if compile_kwargs and compile_kwargs.get("mode") is not None and compile_kwargs.get("options") is not None:
            raise ValueError("engine.compile: pass either mode or options, not both (as torch.compile)")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.fallback = fallback
        self.cache_size = cache_size
        self.compile_kwargs = compile_kwargs
        self.trace_seconds: float | None = None
        self.compile_seconds: float | None = None
        self._cache: OrderedDict[Hashable, Entry] = OrderedDict()
        self._fast: dict[Hashable, Entry] = {}  # fast key -> a live, ready (traced, compiled) entry
        self._mru: Entry | None = None  # the most recently used entry: the end of self._cache
        # Strides are part of a signature: a graph replays the kernels its recording ran on those
        # layouts (engine.replay_contract), and compiled code asserts them.
        self._strides = True
        self._hits = self._misses = self._traces = self._evictions = 0
        self.guard_failures = 0  # replays whose recorded branch checks failed (run eagerly instead)
        # auto: for engine.autotrace, which has proven the result needs no grad and wants eager
        # semantics silently: no warnings, replays under no_grad, no replay of graphs that write
        # into their inputs or captured tensors.
        self._auto = auto
        self._warned = auto

    # -- public -------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(args, kwargs, _fast_signature(args, kwargs, self._strides))

    def _guard_roots(self) -> tuple:
        """What engine.guardstate walks for this wrapper: its function, not its caches."""
        return (self.fn,)

    def _call(self, args: tuple, kwargs: dict, fast: tuple[Hashable, list] | None) -> Any:
        if fast is not None:
            entry = self._fast.get(fast[0])
            if entry is not None:
                self._hits += 1
                if entry is not self._mru:
                    self._cache.move_to_end(entry.key)
                    self._mru = entry
                try:
                    return self._replay(entry, fast[1])
                except _GuardFailed:
                    return self._guard_failed(entry, args, kwargs)
        return self._call_slow(args, kwargs, fast)

    def _replay_hit(self, entry: Entry, args: tuple, kwargs: dict, flat: list) -> Any:
        """`_call`'s hit path, for engine.autotrace, which found `entry` in `_fast` itself."""
        self._hits += 1
        if entry is not self._mru:
            self._cache.move_to_end(entry.key)
            self._mru = entry
        try:
            return self._replay(entry, flat)
        except _GuardFailed:
            return self._guard_failed(entry, args, kwargs)

    def _replay(self, entry: Entry, flat: list) -> Any:
        if not self._auto or entry.inert:
            return entry.call(flat)
        grad_mode = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            return entry.call(flat)
        finally:
            torch._C._set_grad_enabled(grad_mode)

    def _eager(self, args: tuple, kwargs: dict) -> Any:
        return running(self.fn, *args, **kwargs)

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self._hits, self._misses, self._traces, self._evictions, len(self._cache), self.cache_size)

    def cache_clear(self) -> None:
        self._cache.clear()
        self._fast.clear()
        self._mru = None

    def tiers(self) -> list[dict[str, Any]]:
        """Each recorded signature's fused-tier state, least recently used first: 'state' (replay,
        pending, fused, failed, ineligible, or None when its graph cannot be fused), the replays
        counted toward the move up, the compile's (or the load's) seconds, the backend chosen
        ("xla", "inductor"; None before the choice), and any error."""
        out = []
        for e in self._cache.values():
            p = e.promotion
            job = p.job if p is not None else None
            out.append({
                "state": None if p is None else p.state,
                "replays": 0 if p is None else p.replays,
                "replay_seconds": 0.0 if p is None else p.replay_seconds,
                "compile_seconds": None if job is None else job.seconds,
                "from_disk": job is not None and job.known is not None,
                "backend": None if p is None else p.backend,
                "error": None if p is None else p.error,
            })
        return out

    def graphs(self) -> list[torch.fx.GraphModule]:
        """The recorded graphs, least recently used first (for inspection and tests)."""
        return [e.gm for e in self._cache.values() if e.gm is not None]

    # -- internals ----------------------------------------------------------------------------

    def _call_slow(self, args: tuple, kwargs: dict, fast: tuple[Hashable, list] | None) -> Any:
        """The full signature path: first calls of a signature, and arguments the fast key does not cover."""
        key, flat, spec = _signature(args, kwargs, self._strides)
        entry = self._cache.get(key)
        if entry is not None:
            self._hits += 1
            self._cache.move_to_end(key)
        else:
            self._misses += 1
            entry = self._trace(flat, spec, args, kwargs)
            entry.key = key
            self._cache[key] = entry
            if len(self._cache) > self.cache_size:
                _, evicted = self._cache.popitem(last=False)
                for k in evicted.fast_keys:
                    del self._fast[k]
                self._evictions += 1
        self._mru = entry
        if entry.eager:
            if entry.first is not None:  # refused after a complete trace: that run was this call
                first, entry.first = entry.first, None
                return entry.build(first)
            return self._eager(args, kwargs)
        if self.compile_kwargs is not None and entry.compiled is None:
            self._compile(entry, flat)
        if fast is not None:
            self._fast[fast[0]] = entry
            entry.fast_keys.append(fast[0])
        if entry.first is not None:
            # The trace ran the function for real: its results are this call's. Replaying as well
            # would run any write into an input or a closed-over tensor twice.
            first, entry.first = entry.first, None
            return entry.build(first)
        try:
            return self._replay(entry, flat)
        except _GuardFailed:
            return self._guard_failed(entry, args, kwargs)

    def _guard_failed(self, entry: Entry, args: tuple, kwargs: dict) -> Any:
        """A check the trace saw pass (or a branch it saw taken) comes out differently for these
        inputs. The function runs eagerly: an argument check then raises its own error (say, a
        distribution's ValueError naming the invalid parameter). A function that instead takes the
        other branch of its control flow cannot be replayed from this graph: UntraceableError, or
        with fallback='eager' its eager result (warned once)."""
        self.guard_failures += 1
        out = self._eager(args, kwargs)
        places = ", ".join(dict.fromkeys(entry.guards))
        message = (
            f"engine.trace: {_name(self.fn)} branches on tensor values ({places}) and these inputs take another "
            f"branch than the traced call did, so the recorded graph does not apply."
        )
        if self.fallback == "error":
            raise UntraceableError(message + " Use tensor ops instead (torch.where), or pass fallback='eager'.")
        if not self._warned:
            self._warned = True
            warnings.warn(message + " Running it eagerly for such inputs.", TraceFallbackWarning, stacklevel=3)
        return out

    def _refuse(self, entry: Entry, err: DataDependentError, hint: str = "") -> Entry:
        """`fn` cannot be replayed for this signature: UntraceableError, or with fallback='eager' the
        entry runs eagerly from now on (warned once)."""
        if self.fallback == "error":
            raise UntraceableError(f"engine.trace: cannot trace {_name(self.fn)}: {err}{hint}") from err
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"engine.trace: {_name(self.fn)} cannot be traced ({err}); running it eagerly for this signature.",
                TraceFallbackWarning,
                stacklevel=5,
            )
        entry.eager = True
        return entry

    def _trace(self, flat: list, spec: Any, args: tuple, kwargs: dict) -> Entry:
        with _RECORDING:  # one recording at a time, process-wide
            return self._record(flat, spec, args, kwargs)

    def _record(self, flat: list, spec: Any, args: tuple, kwargs: dict) -> Entry:
        entry = Entry()
        entry.tensor_pos = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        entry.select = None if len(entry.tensor_pos) == len(flat) else entry.tensor_pos
        fn = self.fn
        out_info: dict[str, Any] = {}
        guard = _DataGuard()

        def flat_fn(*tensors: torch.Tensor) -> list:
            leaves = list(flat)
            for i, t in zip(entry.tensor_pos, tensors):
                leaves[i] = t
            a, kw = tree_unflatten(leaves, spec)
            with guard:
                out = running(fn, *a, **kw)
            flat_out, out_spec = tree_flatten(out)
            out_info["spec"] = out_spec
            out_info["consts"] = [(i, o) for i, o in enumerate(flat_out) if not isinstance(o, torch.Tensor)]
            out_info["values"] = [o for o in flat_out if isinstance(o, torch.Tensor)]
            entry.guards = guard.places
            if guard.conditions:
                return out_info["values"] + [guard.all_hold()]
            return out_info["values"]

        start = time.perf_counter()
        try:
            gm = record(flat_fn, [flat[i] for i in entry.tensor_pos])
        except DataDependentError as err:
            # The eager rerun that follows must not see the writes the aborted run already made.
            guard.undo_writes()
            return self._refuse(entry, err)
        # The graph's passes run none of the function's code: a watched recording (engine.autotrace)
        # need not observe them, call by call.
        with purity.paused():
            pinned = _pin_grad_modes(gm, guard.grad_modes)
            if pinned:
                constants, entry.rewrites = clean_up(gm, captured_fixed=self._auto)
                entry.constants = tuple(constants)
                entry.fold = fold_constants(gm, len(entry.tensor_pos), list(entry.constants))
        if not pinned:
            return self._refuse(entry, UntraceableError(
                "the grad mode of its grad-mode-dependent kernels (" + ", ".join(sorted(op.name() for op in GRAD_MODE_KERNELS))
                + ") could not be matched to the recorded graph"))
        read = () if entry.fold is None else {id(t) for t in entry.fold.sources}
        entry.live = (*range(len(entry.tensor_pos)),
                      *(len(entry.tensor_pos) + i for i, t in enumerate(entry.constants) if id(t) not in read))
        if self._auto and _writes_into_inputs(gm):
            # Automatic tracing replays only graphs without writes into inputs or captured tensors
            # (whose effects on aliases and version counters it does not prove); this call was the
            # real run, the signature runs eagerly from now on.
            entry.eager = True
            entry.build = _output_builder(out_info["spec"], out_info["consts"])
            entry.first = out_info["values"]
            return entry
        if entry.guards and _writes_into_inputs(gm):
            # The guard is a graph output, known only after the graph's writes: a replay whose guard
            # fails would write once, then the eager rerun again. Refuse rather than write twice.
            err = DataDependentError(
                f"it branches on tensor values ({', '.join(dict.fromkeys(entry.guards))}) and writes into "
                f"its inputs or captured tensors in place, so a replay whose branch check fails would "
                f"apply the write twice"
            )
            self._refuse(entry, err, hint=". Return the new value instead of writing it in place, or pass "
                                          "fallback='eager'.")
            # The trace ran the function (and its writes) for real: its results are this call's.
            entry.build = _output_builder(out_info["spec"], out_info["consts"])
            entry.first = out_info["values"]
            return entry
        self._traces += 1
        self.trace_seconds = time.perf_counter() - start
        with purity.paused():
            _LazyGraphModule.force_recompile(gm)  # its code, once, now that the passes are done
        entry.gm = gm
        entry.run = script_replay.replay_runner(entry, gm.forward)
        entry.out_spec = out_info["spec"]
        entry.out_consts = out_info["consts"]
        entry.build = _output_builder(entry.out_spec, entry.out_consts)
        entry.first = out_info["values"]
        entry.inert = not entry.constants and entry.fold is None and not any(flat[i].requires_grad for i in entry.tensor_pos)
        if self.compile_kwargs is None and fused.candidate(gm):
            entry.tier = entry.promotion = fused.Tier(entry)
        return entry

    def _compile(self, entry: Entry, flat: list) -> None:
        kwargs = self.compile_kwargs or {}
        start = time.perf_counter()
        inputs = entry.inputs(flat)
        if any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable for n in entry.gm.graph.nodes):
            inputs = [t.clone(memory_format=torch.preserve_format) for t in inputs]  # the warm-up must not write twice
        with distribution_validation_kept():
            if not _graph_outputs(entry.gm):
                compiled = entry.run  # only non-tensor results: nothing to compile
            elif _direct_inductor(kwargs) and fused.candidate(entry.gm) and not _needs_grad(inputs):
                compiled = _direct_program(entry.gm, inputs, kwargs)
            elif _direct_inductor(kwargs):
                compiled = compile_with_inductor(entry.gm, inputs, kwargs)
            else:
                compiled = torch.compile(entry.gm, **kwargs)
            compiled(*inputs)  # the first call: lazy initialisation (and, through torch.compile, the compile)
        entry.compile_seconds = self.compile_seconds = time.perf_counter() - start
        entry.compiled = compiled
        entry.run = compiled


def _needs_grad(inputs: list) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in inputs)


def _direct_program(gm: torch.fx.GraphModule, inputs: list, kwargs: dict) -> Callable:
    """engine.compile's graph as the fused tier's program (inductor's generated call, no AOTAutograd
    wrapper: see engine.fused), replaying instead where its checks do not hold (an input needing
    autograd). Falls back to standalone_compile when the direct compile fails."""
    try:
        program = fused.compile_now(gm, inputs, _inductor_patches(kwargs))
    except (RuntimeError, ValueError):
        return compile_with_inductor(gm, inputs, kwargs)
    replay = gm.forward

    def run(*args: torch.Tensor) -> Any:
        outs = program(list(args))
        return replay(*args) if outs is None else outs

    return run


def _writes_into_inputs(gm: torch.fx.GraphModule) -> bool:
    """Whether an op of the graph writes in place into a graph input (an argument or a captured
    tensor), directly or through a view of it."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
            continue
        for arg, value in zip(target._schema.arguments, node.args):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            base = value
            while isinstance(base, torch.fx.Node) and base.op == "call_function" and _is_view(base.target):
                base = base.args[0]
            if isinstance(base, torch.fx.Node) and base.op == "placeholder":
                return True
    return False


def _is_view(target: Any) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def _graph_outputs(gm: torch.fx.GraphModule) -> list:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return list(out.args[0]) if isinstance(out.args[0], (list, tuple)) else [out.args[0]]


class TraceFallbackWarning(UserWarning):
    """`engine.trace(..., fallback='eager')` met a function it cannot trace and runs it eagerly."""


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", repr(fn))


def trace(fn: Callable, *, fallback: str = "error", cache_size: int = 8) -> TracedFunction:
    """Record `fn` (any composition of engine transforms) once per input signature and replay it.

    The signature is the pytree structure of the arguments, each tensor's shape, dtype, device,
    layout and requires_grad, the values of non-tensor arguments, and whether grad mode is on. A
    new signature traces again; at most `cache_size` signatures are kept (least recently used is
    evicted). `fallback="eager"` runs untraceable (data-dependent) functions eagerly with one
    warning instead of raising `UntraceableError`. The result exposes `.trace_seconds` (latency of
    the latest trace) and `.cache_info()`.
    """
    return TracedFunction(fn, fallback, cache_size)


def compile(fn: Callable, *, fallback: str = "error", cache_size: int = 8, **torch_compile_kwargs: Any) -> TracedFunction:  # noqa: A001
    """`trace(fn)`, with each recorded graph compiled by inductor.

    The compile runs on the first call of each signature and its duration is exposed separately
    as `.compile_seconds` (`.trace_seconds` is the trace alone). Inductor's on-disk caches (under
    TORCHINDUCTOR_CACHE_DIR) are used, so a later process loads the compiled code instead of
    compiling it again.

    `torch_compile_kwargs` are torch.compile's. With the default backend the recorded graph goes
    to inductor directly (no dynamo: the graph is already functional aten, and dynamo's guards
    would cost more per call than a small graph's arithmetic): `mode` and `options` are applied as
    inductor config, `fullgraph` always holds, and `dynamic` is ignored, because each new shape
    is a new signature and gets its own trace anyway. Any other keyword, or another `backend`,
    hands the graph to `torch.compile(graph, **torch_compile_kwargs)` as given. The signature of
    a compiled function also includes the input strides (the compiled code is specialised to them).
    """
    return TracedFunction(fn, fallback, cache_size, compile_kwargs=dict(torch_compile_kwargs))
