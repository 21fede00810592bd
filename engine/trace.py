"""Trace once, replay fast: `engine.trace` and `engine.compile`.

The engine pays tens of microseconds of Python per op (the batched tensor's dispatch, the rules,
autograd's bookkeeping). For a fixed input signature all of that decides the same thing every
call, so it is run once: the whole computation (batching rules and the backward passes included)
is recorded with `make_fx` as an FX graph of aten ops on plain tensors, and later calls replay
that graph. `engine.compile` hands the same graph to `torch.compile`.

What a trace may not capture, and how it is handled:
- tensors the function reads without taking them as arguments (closed-over weights) become graph
  inputs fed with the live tensor objects at every replay, so in-place updates of them are seen;
  rebinding a closure variable to a *different* tensor object is not seen (the trace keeps the
  object it saw);
- Python control flow on tensor values (`.item()`, `if t:`, `float(t)`) and ops whose output shape
  depends on data (`nonzero`, boolean masking) would be frozen into the graph: they raise
  `UntraceableError` (a `DataDependentError`), or with `fallback="eager"` warn once and run
  eagerly. `.tolist()`/`.numpy()` on plain tensors bypass PyTorch's dispatcher and cannot be
  detected: do not use them in a traced function;
- random ops stay ops in the graph, so each replay draws fresh values.
"""
from __future__ import annotations

import functools
import operator
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from engine.errors import DataDependentError

aten = torch.ops.aten

__all__ = ["CacheInfo", "TracedFunction", "UntraceableError", "compile", "trace"]


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
    return ("V", type(x), x)


def _signature(args: tuple, kwargs: dict) -> tuple[Hashable, list, Any]:
    flat, spec = tree_flatten((args, kwargs))
    key = (spec, tuple(_leaf_key(x) for x in flat), torch.is_grad_enabled())
    return key, flat, spec


# ------------------------------------------------------------------------------------------------
# the data-dependence guard used while tracing


class _DataGuard(TorchDispatchMode):
    """Refuses ops that hand tensor data to Python or give data-dependent shapes while tracing."""

    _REFUSED_TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)
    _REFUSED = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default, aten.item.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self._REFUSED or any(t in func.tags for t in self._REFUSED_TAGS):
            name = func.name()
            raise UntraceableError(
                f"the function calls {name}, whose result depends on tensor values (`.item()`, "
                f"`if tensor:`, `float(tensor)`, boolean masking, nonzero). A recorded graph would freeze one "
                f"outcome. Use tensor ops instead (torch.where, masked arithmetic), or pass fallback='eager' to "
                f"run such a function without tracing."
            )
        return func(*args, **(kwargs or {}))


# ------------------------------------------------------------------------------------------------
# graph clean-up


_NO_OPS = (aten.detach.default, aten.alias.default)


def _lift_constants(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """Turn `get_attr` tensor constants into trailing placeholders; return the tensors to feed them."""
    graph = gm.graph
    anchor = next(n for n in graph.nodes if n.op != "placeholder")
    by_target: dict[str, torch.fx.Node] = {}
    values: list[torch.Tensor] = []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        ph = by_target.get(node.target)
        if ph is None:
            with graph.inserting_before(anchor):
                ph = graph.placeholder(f"lifted_{node.target}")
            ph.meta.update(node.meta)
            by_target[node.target] = ph
            values.append(value)
        node.replace_all_uses_with(ph)
        graph.erase_node(node)
    for target in by_target:
        delattr(gm, target)
    return values


def _broadcast_source(node: Any) -> tuple[Any, tuple[int, int]] | None:
    """If `node` is an unbatched matrix expanded over a leading batch dim, return (that matrix, its shape)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is aten.view.default:
        node = node.args[0]
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is aten.expand.default):
        return None
    src = node.args[0]
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() < 2 or any(s != 1 for s in val.shape[:-2]):
        return None
    sizes = node.args[1]
    if len(sizes) != 3 or tuple(sizes[1:]) != tuple(val.shape[-2:]):
        return None
    return src, (int(val.shape[-2]), int(val.shape[-1]))


def _node_val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x


def _inserter(graph: torch.fx.Graph) -> Callable:
    """graph.call_function that also fills meta['val'] (shape inference for the later passes)."""

    def call(target: Any, args: tuple, kwargs: dict | None = None) -> torch.fx.Node:
        node = graph.call_function(target, args, kwargs or {})
        vals = tree_map(_node_val, (args, kwargs or {}))
        try:
            node.meta["val"] = target(*vals[0], **vals[1])
        except Exception:  # noqa: BLE001 - a missing shape only disables later folds
            pass
        return node

    return call


def _fold_broadcast_bmm(gm: torch.fx.GraphModule) -> None:
    """bmm(expand(A), b) -> one mm: the batching rules of mv/mm with an unbatched matrix broadcast
    it over the batch (B copies of the weight/data matrix), which is what makes the Hessian of a
    regression posterior cost B full passes over the data. One matmul against the matrix does the
    same arithmetic without the copies."""
    graph = gm.graph
    call = _inserter(graph)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.bmm.default:
            continue
        a, b = node.args[:2]
        out_val = node.meta.get("val")
        if not isinstance(out_val, torch.Tensor):
            continue
        batch, n, k = (int(s) for s in out_val.shape)
        lhs, rhs = _broadcast_source(a), _broadcast_source(b)
        with graph.inserting_before(node):
            if rhs is not None:  # a [B,n,m] @ M [m,k]
                src, (m, _) = rhs
                mat = call(aten.view.default, (src, [m, k]))
                flat = call(aten.reshape.default, (a, [batch * n, m]))
                new = call(aten.view.default, (call(aten.mm.default, (flat, mat)), [batch, n, k]))
            elif lhs is not None:  # M [n,m] @ b [B,m,k]  ==  (b^T [B*k,m] @ M^T)^T
                src, (_, m) = lhs
                mat_t = call(aten.t.default, (call(aten.view.default, (src, [n, m])),))
                flat = call(aten.reshape.default, (call(aten.transpose.int, (b, 1, 2)), [batch * k, m]))
                prod = call(aten.view.default, (call(aten.mm.default, (flat, mat_t)), [batch, k, n]))
                new = call(aten.transpose.int, (prod, 1, 2))
                if k != 1:
                    new = call(aten.clone.default, (new,), {"memory_format": torch.contiguous_format})
            else:
                continue
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)


def _outer_bmm_to_mul(gm: torch.fx.GraphModule) -> None:
    """bmm(a [B,n,1], b [B,1,k]) -> a * b: per-example outer products (per-sample weight gradients)
    are a broadcast multiply; as a matmul with an inner size of 1 they run several times slower."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.bmm.default:
            continue
        a, b = node.args[:2]
        va = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if not isinstance(va, torch.Tensor) or va.dim() != 3 or va.shape[2] != 1:
            continue
        with graph.inserting_before(node):
            new = _inserter(graph)(aten.mul.Tensor, (a, b))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)


_SHAPE_ONLY = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.unsqueeze.default, aten.clone.default, aten.contiguous.default, aten.alias.default,
    aten.detach.default,
}
_TRANSPOSES = {aten.t.default, aten.transpose.int, aten.permute.default}


def _squeezed_shape(node: torch.fx.Node) -> tuple[int, ...] | None:
    val = node.meta.get("val")
    return tuple(int(s) for s in val.shape if s != 1) if isinstance(val, torch.Tensor) else None


def _identities(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes whose value, with size-1 dims dropped, is an identity matrix (jacrev/hessian's basis).

    Row-major reshapes keep it one; transposes of a symmetric matrix do too; so do expands to the
    same shape, single-input cat and the one chunk of a split into a single piece.
    """
    ident: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        t, args = node.target, node.args
        if t is aten.eye.default and len(args) == 1:
            ident.add(node)
            continue
        src = args[0] if args else None
        if t is aten.cat.default and len(args[0]) == 1:
            src = args[0][0]
        elif t is operator.getitem:
            parent = args[0]
            ok = (
                isinstance(parent, torch.fx.Node) and parent.target is aten.split_with_sizes.default
                and len(parent.args[1]) == 1 and parent.args[0] in ident
            )
            if ok:
                ident.add(node)
            continue
        elif t is aten.expand.default:
            sv, nv = getattr(src, "meta", {}).get("val"), node.meta.get("val")
            if not (isinstance(sv, torch.Tensor) and isinstance(nv, torch.Tensor) and sv.shape == nv.shape):
                continue  # a real broadcast repeats the matrix
        elif t not in _SHAPE_ONLY and t not in _TRANSPOSES:
            continue
        if not (isinstance(src, torch.fx.Node) and src in ident):
            continue
        shape, src_shape = _squeezed_shape(node), _squeezed_shape(src)
        if shape is not None and shape == src_shape and len(shape) == 2:
            ident.add(node)
    return ident


def _fold_identity_mm(gm: torch.fx.GraphModule) -> None:
    """mm(I, x) -> x and mm(x, I) -> x: the one-hot basis that reverse-mode Jacobians push through
    the backward pass meets the first matmul as an identity, a full matmul of the data for nothing."""
    graph = gm.graph
    ident = _identities(graph)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.mm.default:
            continue
        a, b = node.args[:2]
        keep = b if a in ident else a if b in ident else None
        if keep is None:
            continue
        keep_val, out_val = keep.meta.get("val"), node.meta.get("val")
        if not (isinstance(keep_val, torch.Tensor) and isinstance(out_val, torch.Tensor)) or keep_val.shape != out_val.shape:
            continue
        node.replace_all_uses_with(keep)
        graph.erase_node(node)


def _views_as_reshapes(gm: torch.fx.GraphModule) -> None:
    """view -> reshape. The rewrites above change the strides of some tensors (mm(I, x) -> x keeps
    x's layout), so a view that was valid at trace time may not be at replay; reshape is the same
    view whenever one exists and copies only when none does."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (aten.view.default, aten._unsafe_view.default):
            node.target = aten.reshape.default


def _drop_no_ops(gm: torch.fx.GraphModule) -> None:
    """Remove detach/alias nodes (autograd bookkeeping that is a no-op on replayed plain tensors)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _NO_OPS:
            if any(u.op == "output" for u in node.users):
                continue  # keep outputs distinct objects from the inputs
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    graph.eliminate_dead_code()
    gm.recompile()


# ------------------------------------------------------------------------------------------------
# traced entries


class _Entry:
    """One signature's recorded graph, the live tensors it reads, and the output structure."""

    __slots__ = ("gm", "run", "constants", "tensor_pos", "out_spec", "out_consts", "eager", "compiled", "compile_seconds")

    def __init__(self) -> None:
        self.gm: torch.fx.GraphModule | None = None
        self.run: Callable | None = None
        self.constants: list[torch.Tensor] = []
        self.tensor_pos: list[int] = []
        self.out_spec: Any = None
        self.out_consts: list[tuple[int, Any]] = []
        self.eager = False
        self.compiled: Callable | None = None
        self.compile_seconds: float | None = None

    def call(self, flat: list) -> Any:
        inputs = [flat[i] for i in self.tensor_pos]
        inputs.extend(self.constants)
        outs = list(self.run(*inputs))
        for i, v in self.out_consts:
            outs.insert(i, v)
        return tree_unflatten(outs, self.out_spec)


class TracedFunction:
    """Callable returned by `engine.trace`: replays one recorded aten graph per input signature."""

    def __init__(self, fn: Callable, fallback: str, cache_size: int, compile_kwargs: dict | None = None):
        if fallback not in ("error", "eager"):
            raise ValueError(f"engine.trace: fallback must be 'error' or 'eager', got {fallback!r}")
        if not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"engine.trace: cache_size must be a positive int, got {cache_size!r}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.fallback = fallback
        self.cache_size = cache_size
        self.compile_kwargs = compile_kwargs
        self.trace_seconds: float | None = None
        self.compile_seconds: float | None = None
        self._cache: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._hits = self._misses = self._traces = self._evictions = 0
        self._warned = False

    # -- public -------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, flat, spec = _signature(args, kwargs)
        entry = self._cache.get(key)
        if entry is not None:
            self._hits += 1
            self._cache.move_to_end(key)
        else:
            self._misses += 1
            entry = self._trace(flat, spec, args, kwargs)
            self._cache[key] = entry
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
                self._evictions += 1
            if entry.eager:
                return self.fn(*args, **kwargs)
        if entry.eager:
            return self.fn(*args, **kwargs)
        if self.compile_kwargs is not None and entry.compiled is None:
            self._compile(entry, flat)
        return entry.call(flat)

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self._hits, self._misses, self._traces, self._evictions, len(self._cache), self.cache_size)

    def cache_clear(self) -> None:
        self._cache.clear()

    def graphs(self) -> list[torch.fx.GraphModule]:
        """The recorded graphs, least recently used first (for inspection and tests)."""
        return [e.gm for e in self._cache.values() if e.gm is not None]

    # -- internals ----------------------------------------------------------------------------

    def _trace(self, flat: list, spec: Any, args: tuple, kwargs: dict) -> _Entry:
        entry = _Entry()
        entry.tensor_pos = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        fn = self.fn
        out_info: dict[str, Any] = {}

        def flat_fn(*tensors: torch.Tensor) -> list:
            leaves = list(flat)
            for i, t in zip(entry.tensor_pos, tensors):
                leaves[i] = t
            a, kw = tree_unflatten(leaves, spec)
            with _DataGuard():
                out = fn(*a, **kw)
            flat_out, out_spec = tree_flatten(out)
            out_info["spec"] = out_spec
            out_info["consts"] = [(i, o) for i, o in enumerate(flat_out) if not isinstance(o, torch.Tensor)]
            return [o for o in flat_out if isinstance(o, torch.Tensor)]

        start = time.perf_counter()
        try:
            gm = make_fx(flat_fn, tracing_mode="real")(*[flat[i] for i in entry.tensor_pos])
        except DataDependentError as err:
            if self.fallback == "error":
                raise UntraceableError(f"engine.trace: cannot trace {_name(fn)}: {err}") from err
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"engine.trace: {_name(fn)} cannot be traced ({err}); running it eagerly for this signature.",
                    TraceFallbackWarning,
                    stacklevel=3,
                )
            entry.eager = True
            return entry
        entry.constants = _lift_constants(gm)
        _fold_broadcast_bmm(gm)
        _outer_bmm_to_mul(gm)
        _fold_identity_mm(gm)
        _views_as_reshapes(gm)
        _drop_no_ops(gm)
        self._traces += 1
        self.trace_seconds = time.perf_counter() - start
        entry.gm = gm
        entry.run = gm.forward
        entry.out_spec = out_info["spec"]
        entry.out_consts = out_info["consts"]
        return entry

    def _compile(self, entry: _Entry, flat: list) -> None:
        start = time.perf_counter()
        compiled = torch.compile(entry.gm, **self.compile_kwargs)
        inputs = [flat[i] for i in entry.tensor_pos] + entry.constants
        compiled(*inputs)  # compiles (or loads from inductor's on-disk cache)
        entry.compile_seconds = self.compile_seconds = time.perf_counter() - start
        entry.compiled = compiled
        entry.run = compiled


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
    """`trace(fn)`, with each recorded graph compiled by `torch.compile(**torch_compile_kwargs)`.

    The compile runs on the first call of each signature and its duration is exposed separately
    as `.compile_seconds` (`.trace_seconds` is the trace alone). Inductor's on-disk caches (under
    TORCHINDUCTOR_CACHE_DIR) are used, so a later process loads the compiled code instead of
    compiling it again.
    """
    return TracedFunction(fn, fallback, cache_size, compile_kwargs=dict(torch_compile_kwargs))
