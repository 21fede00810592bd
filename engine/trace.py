"""Trace once, replay fast: `engine.trace` and `engine.compile`.

The engine pays tens of microseconds of Python per op (the batched tensor's dispatch, the rules,
autograd's bookkeeping). For a fixed input signature all of that decides the same thing every
call, so it is run once: the whole computation (batching rules and the backward passes included)
is recorded with `make_fx` as an FX graph of aten ops on plain tensors, cleaned of the
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
- Python control flow on tensor values (`.item()`, `if t:`, `float(t)`) and ops whose output shape
  depends on data (`nonzero`, boolean masking) would be frozen into the graph: they raise
  `UntraceableError` (a `DataDependentError`), or with `fallback="eager"` warn once and run
  eagerly. `.tolist()`/`.numpy()` on plain tensors bypass PyTorch's dispatcher and cannot be
  detected: do not use them in a traced function;
- random ops stay ops in the graph, so each replay draws fresh values.
"""
from __future__ import annotations

import functools
import math
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
# and value, and grad mode. Anything else (tensor subclasses other than Parameter, namedtuples,
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
        return (t, x)
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
    """Turn `get_attr` tensor constants into trailing placeholders; return the tensors to feed them.

    All placeholders are inserted before any get_attr node is erased: the insertion point (the
    first node after the placeholders) may itself be one of them.
    """
    graph = gm.graph
    anchor = next(n for n in graph.nodes if n.op != "placeholder")
    lifted = [
        n for n in graph.nodes if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.Tensor)
    ]
    by_target: dict[str, torch.fx.Node] = {}
    values: list[torch.Tensor] = []
    for node in lifted:
        if node.target in by_target:
            continue
        with graph.inserting_before(anchor):
            ph = graph.placeholder(f"lifted_{node.target}")
        ph.meta.update(node.meta)
        by_target[node.target] = ph
        values.append(getattr(gm, node.target))
    for node in lifted:
        node.replace_all_uses_with(by_target[node.target])
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


def _same_shape(a: Any, b: Any) -> bool:
    va, vb = _node_val(a), _node_val(b)
    return isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.shape == vb.shape


def _is_call(node: Any, target: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target


_VIEW_RESHAPES = frozenset({
    aten.reshape.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default,
})


def _reshape_source(node: torch.fx.Node) -> tuple[Any, bool] | None:
    """If `node` holds its input's elements in the same row-major order, (that input, whether
    the op is a view); else None. Such ops are reshapes, whatever they are called."""
    if node.op != "call_function" or not node.args:
        return None
    t, src = node.target, node.args[0]
    if t in _VIEW_RESHAPES:
        return src, True
    if t is aten.expand.default and _same_shape(src, node):
        return src, True
    if t is operator.getitem and _is_call(src, aten.split_with_sizes.default) and len(src.args[1]) == 1:
        return src.args[0], True
    if t is aten.cat.default and len(src) == 1:
        return src[0], False
    return None


def _transpose_of(node: Any) -> tuple[Any, tuple[int, int]] | None:
    """(input, the two swapped dims) if `node` is a transpose (t of a matrix, or transpose.int)."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.args):
        return None
    val = _node_val(node)
    if not isinstance(val, torch.Tensor) or val.dim() < 2:
        return None
    if node.target is aten.t.default:
        return node.args[0], (0, 1)
    if node.target is aten.transpose.int:
        nd = val.dim()
        return node.args[0], tuple(sorted((node.args[1] % nd, node.args[2] % nd)))
    return None


def _fresh(node: Any) -> bool:
    """Whether `node` allocates its result (an op whose schema returns no alias of an input), so
    that the tensor is new at every replay and no view of a graph input."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function"):
        return False
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and all(r.alias_info is None for r in target._schema.returns)


def _is_one(x: Any) -> bool:
    return type(x) in (int, float) and x == 1


def _cse_key(node: torch.fx.Node) -> Hashable | None:
    def freeze(x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            return (type(x), tuple(freeze(y) for y in x))
        if isinstance(x, dict):
            return (dict, tuple((k, freeze(v)) for k, v in x.items()))
        hash(x)
        if type(x) is float:
            return (float, x, math.copysign(1.0, x))  # 0.0 == -0.0, but x * 0.0 != x * -0.0
        return (type(x), x)

    if not isinstance(node.target, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded in node.target.tags:
        return None
    try:
        return (node.target, freeze(node.args), freeze(node.kwargs))
    except TypeError:
        return None


def _simplify(gm: torch.fx.GraphModule) -> None:
    """Remove the bookkeeping that batching rules and backward formulas leave in a recorded graph.

    Each op is a dispatcher round trip of several microseconds in a replayed graph, and a small
    jacrev graph is mostly such ops; a Hessian graph also recomputes the function's value only to
    take ones_like of it (the seed of the backward pass). Rewrites, in one forward sweep:
    - chains of reshape-like ops (reshape, squeeze, unsqueeze, same-shape expand, a one-piece
      split or cat) -> one reshape of the chain's source, or the source itself if its shape is kept;
    - a transpose of the same transpose -> its input;
    - x * 1 -> x (same dtype and shape);
    - ones_like/zeros_like(x) -> ones/zeros of x's shape, so the value of x is no longer needed;
    - repeated identical ops (deterministic ones only) -> the first (common subexpressions).
    The dead code these leave is removed by `_drop_no_ops`.

    Graphs with in-place ops are left alone (replacing a view could hide a mutation). A node the
    output reads is replaced only by a node it is a view of (or an identical op) that allocates
    its result and is not an output itself, and rewired only through view ops to such a node:
    outputs stay distinct objects, fresh at every call, and never views of the graph's inputs
    unless they were before.
    """
    graph = gm.graph
    ops = [n.target for n in graph.nodes if n.op == "call_function"]
    if any(isinstance(op, torch._ops.OpOverload) and op._schema.is_mutable for op in ops):
        return
    seen: dict[Hashable, torch.fx.Node] = {}
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        is_output = any(u.op == "output" for u in node.users)
        keep, view_only = None, False  # view_only: node is a view of keep (same aliasing if swapped)
        found = _reshape_source(node)
        if found is not None:
            root, views = found
            while isinstance(root, torch.fx.Node) and (up := _reshape_source(root)) is not None:
                root, views = up[0], views and up[1]
            if isinstance(root, torch.fx.Node):
                if _same_shape(root, node):
                    keep, view_only = root, views
                elif root is not node.args[0] and (not is_output or (views and _fresh(root))):
                    val = _node_val(node)
                    if isinstance(val, torch.Tensor):
                        node.target, node.args, node.kwargs = aten.reshape.default, (root, list(val.shape)), {}
        elif (outer := _transpose_of(node)) is not None:
            inner = _transpose_of(outer[0])
            if inner is not None and inner[1] == outer[1]:
                keep, view_only = inner[0], True
        elif node.target in (aten.mul.Tensor, aten.mul.Scalar) and _is_one(node.args[1]):
            src = node.args[0]
            if _same_shape(src, node) and _node_val(src).dtype == _node_val(node).dtype:
                keep = src
        elif node.target in (aten.ones_like.default, aten.zeros_like.default):
            val = _node_val(node)
            if isinstance(val, torch.Tensor) and val.is_contiguous():
                make = aten.ones.default if node.target is aten.ones_like.default else aten.zeros.default
                node.target, node.args = make, (list(val.shape),)
                node.kwargs = {"dtype": val.dtype, "layout": val.layout, "device": val.device, "pin_memory": False}
        if keep is None and (key := _cse_key(node)) is not None:
            first = seen.setdefault(key, node)
            if first is not node:
                keep, view_only = first, True  # the same op on the same inputs: the same aliasing
        if not isinstance(keep, torch.fx.Node):
            continue
        if is_output and not (view_only and _fresh(keep) and not any(u.op == "output" for u in keep.users)):
            continue
        node.replace_all_uses_with(keep)
        graph.erase_node(node)


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


class _Entry:
    """One signature's recorded graph, the live tensors it reads, and the output structure."""

    __slots__ = (
        "gm", "run", "constants", "tensor_pos", "select", "out_spec", "out_consts", "build", "eager", "compiled",
        "compile_seconds", "key", "fast_keys",
    )

    def __init__(self) -> None:
        self.gm: torch.fx.GraphModule | None = None
        self.run: Callable | None = None
        self.constants: tuple[torch.Tensor, ...] = ()
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

    def inputs(self, flat: list) -> list:
        return [flat[i] for i in self.tensor_pos] + list(self.constants)

    def call(self, flat: list) -> Any:
        select = self.select
        if select is None:
            return self.build(self.run(*flat, *self.constants))
        return self.build(self.run(*[flat[i] for i in select], *self.constants))


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


def _compile_with_inductor(gm: torch.fx.GraphModule, inputs: list, kwargs: dict) -> Callable:
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

    def __init__(self, fn: Callable, fallback: str, cache_size: int, compile_kwargs: dict | None = None):
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
        self._cache: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._fast: dict[Hashable, _Entry] = {}  # fast key -> a live, ready (traced, compiled) entry
        self._mru: _Entry | None = None  # the most recently used entry: the end of self._cache
        self._strides = compile_kwargs is not None  # compiled code asserts input strides
        self._hits = self._misses = self._traces = self._evictions = 0
        self._warned = False

    # -- public -------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fast = _fast_signature(args, kwargs, self._strides)
        if fast is not None:
            entry = self._fast.get(fast[0])
            if entry is not None:
                self._hits += 1
                if entry is not self._mru:
                    self._cache.move_to_end(entry.key)
                    self._mru = entry
                return entry.call(fast[1])
        return self._call_slow(args, kwargs, fast)

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self._hits, self._misses, self._traces, self._evictions, len(self._cache), self.cache_size)

    def cache_clear(self) -> None:
        self._cache.clear()
        self._fast.clear()
        self._mru = None

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
            return self.fn(*args, **kwargs)
        if self.compile_kwargs is not None and entry.compiled is None:
            self._compile(entry, flat)
        if fast is not None:
            self._fast[fast[0]] = entry
            entry.fast_keys.append(fast[0])
        return entry.call(flat)

    def _trace(self, flat: list, spec: Any, args: tuple, kwargs: dict) -> _Entry:
        entry = _Entry()
        entry.tensor_pos = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        entry.select = None if len(entry.tensor_pos) == len(flat) else entry.tensor_pos
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
                    stacklevel=4,
                )
            entry.eager = True
            return entry
        entry.constants = tuple(_lift_constants(gm))
        _fold_broadcast_bmm(gm)
        _outer_bmm_to_mul(gm)
        _fold_identity_mm(gm)
        _views_as_reshapes(gm)
        _simplify(gm)
        _drop_no_ops(gm)
        self._traces += 1
        self.trace_seconds = time.perf_counter() - start
        entry.gm = gm
        entry.run = gm.forward
        entry.out_spec = out_info["spec"]
        entry.out_consts = out_info["consts"]
        entry.build = _output_builder(entry.out_spec, entry.out_consts)
        return entry

    def _compile(self, entry: _Entry, flat: list) -> None:
        kwargs = self.compile_kwargs or {}
        start = time.perf_counter()
        inputs = entry.inputs(flat)
        if not _graph_outputs(entry.gm):
            compiled = entry.run  # only non-tensor results: nothing to compile
        elif _direct_inductor(kwargs):
            compiled = _compile_with_inductor(entry.gm, inputs, kwargs)
        else:
            compiled = torch.compile(entry.gm, **kwargs)
        compiled(*inputs)  # the first call: lazy initialisation (and, through torch.compile, the compile)
        entry.compile_seconds = self.compile_seconds = time.perf_counter() - start
        entry.compiled = compiled
        entry.run = compiled


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
