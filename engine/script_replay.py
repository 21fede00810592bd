"""A replayed graph run by torch's C++ interpreter instead of its Python forward.

An FX graph's generated forward costs a Python call per aten op: the line itself, the
OpOverload's `__call__`, the arguments parsed against the schema. On the small graphs a Hessian or
a gradient records, that is more than the kernels cost. torch.jit's interpreter runs the same ops
from a stack of values in C++. `Warmup` stands in for a signature's forward: it counts the
replays and, once their time has paid for the build (`BUILD_S`, `BUILD_REPLAYS`), records the
graph once more with torch.jit's tracer (a straight-line graph of aten calls: the trace is the
graph, op for op, with the same arguments), makes it a function of a compilation unit of its own
(freed with the entry; `torch.jit.trace` would keep it in torch's global unit for good), and keeps
it only if its first outputs equal the forward's bit for bit, with the same layouts and the same
aliasing of inputs. It runs with torch's graph optimizer off (the "no-opt" pipeline: no fusion,
no rewrites, no autodiff of its own): the same kernels, on the same arguments, in the same order.

What stays on the Python forward: graphs of few ops (`MIN_OPS`) or of heavy ones (`MAX_OP_S`),
graphs with other than aten ops (the grad-mode pins of engine.trace), in-place or random ops or
opaque objects (generators), and each call made while a torch-function or dispatch mode is active
(the interpreter does not consult them) or, for a graph whose inputs require grad, with grad
enabled. `VMAPBENCH_SCRIPTED_REPLAY=0` turns it off (docs/guide/environment.md). torch.jit is
deprecated upstream; where it is missing or refuses a graph, the forward runs as before.
"""
from __future__ import annotations

import contextlib
import copy
import operator
import os
import time
import warnings
import weakref
from typing import Any, Callable, Iterator

import torch
import torch.fx

from engine import timed_choices
from engine.graph_passes import _same_bits

__all__ = ["ENABLED", "Warmup", "build_at_once", "replay_runner", "scripted", "scripted_entries"]

ENABLED = os.environ.get("VMAPBENCH_SCRIPTED_REPLAY", "1").strip().lower() not in ("0", "false", "off", "no")
# What a build is assumed to cost: BUILD_S, plus BUILD_REPLAYS replays' time (the tracer runs the
# graph, the check runs it again, and the interpreter's first runs of a large graph took as long
# as ten replays each where measured: docs/lab). Replays are counted until their time reaches it
# (the ski-rental rule: a graph that never pays cost at most twice what it would have).
BUILD_S = 0.002
BUILD_REPLAYS = 30
MIN_CALLS = 4
# A call into the interpreter costs a few microseconds more than a Python call of the forward;
# each op then saves about one (docs/lab): graphs of fewer ops stay on the forward. So do graphs
# whose fastest replay took more than MAX_OP_S an op, where that saving is noise: there a run in
# the interpreter, which frees its intermediates in another order, could be several times slower
# than the forward's for glibc's heap (docs/lab; tests/test_script_replay.py pins the floor).
MIN_OPS = 4
MAX_OP_S = 10e-6

_get_optimize = getattr(torch._C, "_get_graph_executor_optimize", None)
_set_optimize = getattr(torch._C, "_set_graph_executor_optimize", None)
_function_mode = getattr(torch._C, "_is_torch_function_mode_enabled", None)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_grad_enabled = torch.is_grad_enabled
_perf = time.perf_counter


@contextlib.contextmanager
def build_at_once() -> Iterator[None]:
    """Inside the block, a graph is built at its MIN_CALLS-th replay whatever it costs (benchmarks
    and tests that must reach the interpreter in a few calls); process-wide, not thread-local."""
    global BUILD_S, BUILD_REPLAYS
    saved = BUILD_S, BUILD_REPLAYS
    BUILD_S, BUILD_REPLAYS = 0.0, 0
    try:
        yield
    finally:
        BUILD_S, BUILD_REPLAYS = saved


_SCRIPTED: "weakref.WeakSet[Any]" = weakref.WeakSet()  # entries whose replays run scripted


def scripted_entries() -> list[Any]:
    """The live trace entries whose replays run through the interpreter (for benchmarks and tests)."""
    return list(_SCRIPTED)


class Warmup:
    """The forward of a recorded graph, counted until a scripted run pays; then `entry.run` is
    replaced by the scripted runner (or by the forward itself where none can be built). Made by
    `replay_runner`."""

    __slots__ = ("entry", "forward", "spent", "best", "calls")

    def __init__(self, entry: Any, forward: Callable) -> None:
        self.entry = weakref.ref(entry)  # (the entry holds this object as its `run`)
        self.forward = forward
        self.spent = 0.0
        self.best = float("inf")
        self.calls = 0

    def __call__(self, *inputs: Any) -> Any:
        start = _perf()
        outs = self.forward(*inputs)
        took = _perf() - start
        self.spent += took
        self.best = min(self.best, took)
        self.calls += 1
        if (self.calls >= MIN_CALLS and self.spent >= BUILD_S + BUILD_REPLAYS * self.spent / self.calls
                and not _function_mode() and not _dispatch_modes()):  # (a mode would see the build's trace)
            entry = self.entry()
            if entry is not None and entry.run is self:
                runner = None if _heavy(entry.gm, inputs, self.best) else scripted(entry.gm, self.forward, inputs, outs)
                entry.run = runner or self.forward
                if runner is not None:
                    _SCRIPTED.add(entry)
        return outs


def _heavy(gm: torch.fx.GraphModule, inputs: tuple, best: float) -> bool:
    """Whether `gm`'s fastest replay, `best` (the first ones warm up), took more than MAX_OP_S an
    op: taken once per process for a graph and its inputs' layout (engine.timed_choices), so that
    a graph near the threshold does not run scripted in one copy and on the forward in another."""
    key = ("replay-heavy", _HEAVY_RULE, MAX_OP_S, gm.code, timed_choices.layouts(inputs))
    return timed_choices.decided(key, lambda: best > MAX_OP_S * _op_count(gm))


_HEAVY_RULE = timed_choices.rule(_heavy)


def replay_runner(entry: Any, forward: Callable) -> Callable:
    """What a new entry replays with: a Warmup where its graph could be scripted, else `forward`."""
    return Warmup(entry, forward) if ENABLED and _eligible_graph(entry.gm) else forward


def _op_count(gm: torch.fx.GraphModule) -> int:
    return sum(node.op == "call_function" and node.target is not operator.getitem for node in gm.graph.nodes)


def _eligible(gm: torch.fx.GraphModule, inputs: tuple) -> bool:
    """Plain strided tensors into an eligible graph (`_eligible_graph`)."""
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided for t in inputs) \
        and _eligible_graph(gm)


def _eligible_graph(gm: torch.fx.GraphModule) -> bool:
    """A straight-line graph of at least MIN_OPS functional, deterministic aten ops."""
    if _get_optimize is None or _set_optimize is None or _function_mode is None:
        return False
    if _op_count(gm) < MIN_OPS:
        return False
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function":
            return False
        target = node.target
        if target is operator.getitem:
            continue
        if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable:
            return False
        if torch.Tag.nondeterministic_seeded in target.tags or torch.Tag.nondeterministic_bitwise in target.tags:
            return False
    return True


def _same_outputs(outs: Any, got: Any, inputs: tuple) -> bool:
    if not isinstance(outs, (list, tuple)) or len(outs) != len(got):
        return False
    held = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    for a, b in zip(outs, got):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if (a.dtype, a.shape, a.stride(), a.device, a.storage_offset()) != (b.dtype, b.shape, b.stride(), b.device, b.storage_offset()):
            return False
        if a.numel() and (a.untyped_storage().data_ptr() in held) != (b.untyped_storage().data_ptr() in held):
            return False  # one is a view of an input, the other not
        if not _same_bits(b, a):
            return False
    return True


def scripted(gm: torch.fx.GraphModule, forward: Callable, inputs: tuple, outs: Any) -> Callable | None:
    """A runner of `gm` through torch.jit's interpreter that returned, on `inputs`, exactly what
    `forward` returned (`outs`); None where the graph is not eligible, cannot be traced, or differs."""
    if not ENABLED or not _eligible(gm, inputs):
        return None
    needs_grad = any(t.requires_grad for t in inputs)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # torch.jit's deprecation notices, tracer warnings
            traced = _traceable(gm) or forward
            # The tracer's graph, made a function of a unit of its own (torch.jit.trace would keep
            # every function it makes in torch's global unit for the life of the process).
            graph, outs_traced = torch.jit._get_trace_graph(lambda *args: tuple(traced(*args)), inputs)
            unit = torch._C.CompilationUnit()
            function = unit.create_function("replay", graph)
            run = _runner(function, forward, needs_grad, single=len(outs_traced) == 1)
            got = run(*inputs)
    except Exception:  # noqa: BLE001 - a graph the tracer or the interpreter refuses keeps its forward
        return None
    return run if _same_outputs(outs, got, inputs) else None


# Comparisons with a bool scalar (`x == True`, what torch.distributions' support checks record):
# the tracer keeps the scalar a bool, and no TorchScript schema takes (Tensor, bool). Compared as
# the int it equals, the result is the same in every dtype (a bool tensor is compared as integers
# either way); the outputs are checked against the forward's all the same.
_COMPARISONS = frozenset(
    getattr(torch.ops.aten, name).Scalar for name in ("eq", "ne", "lt", "le", "gt", "ge")
)


def _traceable(gm: torch.fx.GraphModule) -> Callable | None:
    """A forward of `gm` with its comparisons' bool scalars as ints, or None where it has none."""
    nodes = [n for n in gm.graph.nodes if n.target in _COMPARISONS and type(n.args[1]) is bool]
    if not nodes:
        return None
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        if node.target in _COMPARISONS and type(node.args[1]) is bool:
            node.args = (node.args[0], int(node.args[1]), *node.args[2:])
    return torch.fx.GraphModule(gm, graph).forward


def _runner(function: Any, forward: Callable, needs_grad: bool, single: bool) -> Callable:
    """`function` run with the optimizer off (a tuple of outputs, as the forward's list), or
    `forward` where a mode is active or autograd would record (see the module docstring)."""
    get_optimize, set_optimize, function_mode = _get_optimize, _set_optimize, _function_mode

    def run(*inputs: Any) -> Any:
        if function_mode() or _dispatch_modes() or (needs_grad and _grad_enabled()):
            return forward(*inputs)
        optimize = get_optimize()
        set_optimize(False)  # thread-local: the no-opt pipeline, the recorded ops as they are
        try:
            out = function(*inputs)
        finally:
            set_optimize(optimize)
        return (out,) if single else out

    run.forward = forward  # type: ignore[attr-defined]  # (for inspection and tests)
    return run
