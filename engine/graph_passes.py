"""Clean-up passes over a recorded aten graph (engine.trace), run once per trace before replays.

The transforms leave bookkeeping in the graph that costs time on every replay and that a graph,
unlike the eager engine, can see whole: closed-over constants to feed at call time, weight
matrices broadcast over the batch before a matmul, per-example outer products as size-1 matmuls,
identity bases pushed through the first matmul of a backward pass, reshape chains, transposes
that cancel, `x * 1`, repeated identical ops. Each pass keeps the graph's results bit-for-bit
meaningful (same values, fresh output tensors) and leaves graphs with in-place ops alone where
reordering would be unsafe.
"""
from __future__ import annotations

import math
import operator
import time
from typing import Any, Callable, Hashable

import torch
import torch.fx
from torch.utils._pytree import tree_map
from torch.utils._python_dispatch import _disable_current_modes

from engine import timed_choices
from engine._dispatch import out_of_place_view

aten = torch.ops.aten


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
        value = getattr(gm, node.target)
        ph.meta["captured_requires_grad"] = value.requires_grad  # (a captured tensor: engine.graph_passes._captured)
        by_target[node.target] = ph
        values.append(value)
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


def _writes(graph: torch.fx.Graph) -> bool:
    """Whether the graph has an op that writes into a tensor (in place or out=)."""
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
               for n in graph.nodes)


def _calls(graph: torch.fx.Graph, target: Any) -> list[torch.fx.Node]:
    """The nodes calling `target`, listed up front so a pass may replace them as it goes."""
    return [n for n in graph.nodes if n.op == "call_function" and n.target is target]


def _fold_broadcast_bmm(gm: torch.fx.GraphModule) -> bool:
    """bmm(expand(A), b) -> one mm: the batching rules of mv/mm with an unbatched matrix broadcast
    it over the batch (B copies of the weight/data matrix), which is what makes the Hessian of a
    regression posterior cost B full passes over the data. One matmul against the matrix does the
    same sums without the copies, by another kernel (so rounded differently: ARITHMETIC_PASSES)."""
    graph = gm.graph
    call = _inserter(graph)
    changed = False
    for node in _calls(graph, aten.bmm.default):
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
        changed = True
    return changed


def _outer_bmm_to_mul(gm: torch.fx.GraphModule) -> bool:
    """bmm(a [B,n,1], b [B,1,k]) -> a * b: per-example outer products (per-sample weight gradients)
    are a broadcast multiply; as a matmul with an inner size of 1 they run several times slower.
    (A matmul kernel may add the product to a zero: -0.0 comes out +0.0 there, not here.)"""
    graph = gm.graph
    changed = False
    for node in _calls(graph, aten.bmm.default):
        a, b = node.args[:2]
        va = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if not isinstance(va, torch.Tensor) or va.dim() != 3 or va.shape[2] != 1:
            continue
        with graph.inserting_before(node):
            new = _inserter(graph)(aten.mul.Tensor, (a, b))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        changed = True
    return changed


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


def _fold_identity_mm(gm: torch.fx.GraphModule) -> bool:
    """mm(I, x) -> x and mm(x, I) -> x: the one-hot basis that reverse-mode Jacobians push through
    the backward pass meets the first matmul as an identity, a full matmul of the data for nothing.
    (The matmul adds products with zero: an inf or NaN of x spreads there, not here.) Where x is
    laid out otherwise than the product (a transposed weight), it becomes a contiguous copy."""
    graph = gm.graph
    ident = _identities(graph)
    changed = False
    for node in _calls(graph, aten.mm.default):
        a, b = node.args[:2]
        keep = b if a in ident else a if b in ident else None
        if keep is None:
            continue
        keep_val, out_val = keep.meta.get("val"), node.meta.get("val")
        if not (isinstance(keep_val, torch.Tensor) and isinstance(out_val, torch.Tensor)) or keep_val.shape != out_val.shape:
            continue
        if keep_val.stride() != out_val.stride():
            # x in the product's layout: what reads it then reads it as the eager call did (a
            # transposed x would make every pointwise op after it stride through memory, and the
            # reshapes after them copy). Of a captured x, the fold makes the copy once.
            with graph.inserting_before(node):
                keep = _inserter(graph)(aten.clone.default, (keep,), {"memory_format": torch.contiguous_format})
            keep.meta["device"] = node.meta.get("device")
        node.replace_all_uses_with(keep)
        graph.erase_node(node)
        changed = True
    return changed


# A captured matmul operand is copied into its other layout where the matmul then took at most
# _LAYOUT_GAIN of the time and _LAYOUT_SAVING seconds less (timed once per process and layout,
# engine.timed_choices, so that timing noise on small matmuls decides nothing; matmuls beyond
# _LAYOUT_MAX_FLOPS are not timed: the layout matters to skinny ones).
_LAYOUT_GAIN = 0.75
_LAYOUT_SAVING = 2e-6
_LAYOUT_MAX_FLOPS = 1 << 22


def _captured(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes fold_constants computes once: the captured tensors (placeholders _lift_constants
    made, of tensors that do not require grad, small enough that the fold always keeps what it
    computed from them: see Fold) and the foldable ops that read only them."""
    if _writes(graph):
        return set()  # (fold_constants leaves such graphs alone)
    return _computed_from(graph, {
        node for node in graph.nodes if node.op == "placeholder" and node.meta.get("captured_requires_grad") is False
        and isinstance(node.meta.get("val"), torch.Tensor) and node.meta["val"].numel() <= FOLD_WATCH_ELEMENTS})


def _computed_from(graph: torch.fx.Graph, roots: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """`roots` and the foldable ops that read nothing else (factory ops included): what
    fold_constants computes once when `roots` are the captured tensors."""
    done = set(roots)
    for node in graph.nodes:
        if node not in done and _foldable(node) and all(i in done for i in node.all_input_nodes):
            done.add(node)
    return done


def _flipped_strides(val: Any) -> tuple[int, int] | None:
    """The strides of a dense matrix's other layout (row-major <-> column-major); None where it has
    no other (a size-1 dim, or neither layout)."""
    if not isinstance(val, torch.Tensor) or val.dim() != 2 or min(val.shape) < 2 or val.numel() > FOLD_WATCH_ELEMENTS:
        return None
    rows, cols = (int(s) for s in val.shape)
    return {(cols, 1): (1, rows), (1, rows): (cols, 1)}.get(tuple(val.stride()))


def _faster_layouts(a: Any, b: Any, options: list[tuple[bool, bool]]) -> tuple[bool, bool]:
    """Which of mm(a, b)'s operands to lay out otherwise ((flip a, flip b)), by timing mm on random
    operands of those layouts against the recorded ones, interleaved, best of 5 rounds; once per
    process and key (engine.timed_choices)."""
    key = ("mm-layout", _LAYOUT_RULE, tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), a.dtype,
           tuple(options), torch.get_num_threads())
    return timed_choices.decided(key, lambda: _time_layouts(a, b, options))


def _time_layouts(a: Any, b: Any, options: list[tuple[bool, bool]]) -> tuple[bool, bool]:
    """`_faster_layouts`' timing: the option that took at most _LAYOUT_GAIN of the time and
    _LAYOUT_SAVING seconds less than the recorded layouts, else (False, False)."""
    def operand(val: Any, flip: bool) -> torch.Tensor:
        stride = _flipped_strides(val) if flip else val.stride()
        return torch.empty_strided(val.shape, stride, dtype=val.dtype).uniform_(-1, 1)

    none = (False, False)
    with _disable_current_modes(), torch.no_grad():
        pairs = {o: (operand(a, o[0]), operand(b, o[1])) for o in [none, *options]}
        for x, y in pairs.values():
            torch.mm(x, y)  # (first calls pay for lazy set-up)
        calls = {o: (lambda x=x, y=y: torch.mm(x, y)) for o, (x, y) in pairs.items()}
        number = max(1, min(100, int(1e-4 / max(timed_choices.once(calls[none]), 1e-7))))
        best = timed_choices.fastest(calls, 5, number)
    choice = min(pairs, key=best.__getitem__)
    if best[choice] > _LAYOUT_GAIN * best[none] or best[none] - best[choice] < _LAYOUT_SAVING * number:
        choice = none
    return choice


_LAYOUT_RULE = timed_choices.rule(_time_layouts, _LAYOUT_GAIN, _LAYOUT_SAVING)


def _relayout(graph: torch.fx.Graph, node: torch.fx.Node, x: torch.fx.Node) -> torch.fx.Node:
    """x copied into its other layout, inserted before `node` (meta values made directly)."""
    val = x.meta["val"]
    rows, cols = (int(s) for s in val.shape)

    def call(target: Any, args: tuple, shape: tuple[int, int], stride: tuple[int, int], **kwargs: Any) -> torch.fx.Node:
        new = graph.call_function(target, args, kwargs)
        new.meta["val"] = torch.empty_strided(shape, stride, dtype=val.dtype, device="meta")
        new.meta["device"] = node.meta.get("device")
        return new

    with graph.inserting_before(node):
        if tuple(val.stride()) == (1, rows):  # column-major -> row-major
            return call(aten.clone.default, (x,), (rows, cols), (cols, 1), memory_format=torch.contiguous_format)
        xt = call(aten.t.default, (x,), (cols, rows), (1, cols))
        copy = call(aten.clone.default, (xt,), (cols, rows), (rows, 1), memory_format=torch.contiguous_format)
        return call(aten.t.default, (copy,), (rows, cols), (1, rows))


def _mm_operand_layout(gm: torch.fx.GraphModule) -> bool:
    """mm(a, W) with W captured: W copied once (by the fold) into its other layout where the
    matmul runs faster so, timed on this machine (a CPU matmul's speed depends on its operands'
    layouts, several times over for skinny ones: a tall matrix times a row-major matrix of a few
    columns). The same sums, by another kernel path (so rounded otherwise: ARITHMETIC_PASSES);
    the choice may differ from machine to machine."""
    graph = gm.graph
    const = None
    changed = False
    for node in _calls(graph, aten.mm.default):
        if getattr(node.meta.get("device"), "type", None) != "cpu":
            continue
        a, b = node.args[:2]
        va, vb = _node_val(a), _node_val(b)
        if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.dtype == vb.dtype
                and va.dtype in (torch.float32, torch.float64) and va.dim() == vb.dim() == 2):
            continue
        if va.shape[0] * va.shape[1] * vb.shape[1] > _LAYOUT_MAX_FLOPS:
            continue
        if const is None:
            const = _captured(graph)
        flip_a = a in const and _flipped_strides(va) is not None
        flip_b = b in const and _flipped_strides(vb) is not None
        options = [o for o in ((True, False), (False, True), (True, True)) if (flip_a or not o[0]) and (flip_b or not o[1])]
        if not options:
            continue
        fa, fb = _faster_layouts(va, vb, options)
        if not (fa or fb):
            continue
        node.args = (_relayout(graph, node, a) if fa else a, _relayout(graph, node, b) if fb else b, *node.args[2:])
        changed = True
    return changed


def _slice_range(node: torch.fx.Node) -> tuple[tuple, int, int, int] | None:
    """(input sizes, dim, start, end) of slice_backward(grad, sizes, dim, start, end, 1), the
    range normalised as Python slicing does; None if it is not one, or its grad's length differs."""
    if not _is_call(node, aten.slice_backward.default) or node.kwargs or len(node.args) != 6:
        return None
    grad, sizes, dim, start, end, step = node.args
    val = _node_val(grad)
    if step != 1 or not isinstance(val, torch.Tensor) or not all(type(x) is int for x in (dim, start, end)):
        return None
    sizes = tuple(sizes)
    if not all(type(x) is int for x in sizes) or not -len(sizes) <= dim < len(sizes):
        return None
    dim %= len(sizes)
    start, end, _ = slice(start, end).indices(sizes[dim])
    if end <= start or tuple(val.shape) != sizes[:dim] + (end - start,) + sizes[dim + 1:]:
        return None
    return sizes, dim, start, end


def _slice_sums_to_cat(gm: torch.fx.GraphModule) -> bool:
    """A sum of slice_backwards of one size over disjoint ranges -> a cat of their gradients (zeros
    in any gap) plus 0.0: the gradient of a flat vector cut into parts, assembled without a
    zero-filled full-size tensor and a full-size add per part. Each element of the sum is one
    part's value plus zeros, which is that value plus 0.0, bit for bit (-0.0 included); the add
    runs on other operands than the eager call's adds (ARITHMETIC_PASSES)."""
    graph = gm.graph
    if _writes(graph):
        return False  # (the cat reads the parts later than the slice_backwards did)
    changed = False
    for node in reversed(list(graph.nodes)):  # (outermost sums first; the inner ones go with them)
        if node._erased or not _is_call(node, aten.add.Tensor) or node.kwargs or len(node.args) != 2:
            continue
        val = node.meta.get("val")
        if not (isinstance(val, torch.Tensor) and val.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)):
            continue
        inner, leaves, todo = [], [], list(node.args)
        while todo:
            x = todo.pop()
            if _is_call(x, aten.add.Tensor) and not x.kwargs and len(x.args) == 2 and len(x.users) == 1:
                inner.append(x)
                todo.extend(x.args)
            else:
                leaves.append(x)
        ranges = [_slice_range(x) for x in leaves]
        if any(r is None for r in ranges) or any(len(x.users) != 1 for x in leaves):
            continue
        sizes, dim = ranges[0][:2]
        if any(r[:2] != (sizes, dim) for r in ranges) or tuple(val.shape) != sizes \
                or any(_node_val(x.args[0]).dtype != val.dtype for x in leaves):
            continue
        parts = sorted(((r[2], r[3], leaf) for r, leaf in zip(ranges, leaves)), key=operator.itemgetter(0))
        if any(a[1] > b[0] for a, b in zip(parts, parts[1:])):
            continue  # overlapping ranges add up: not a cat
        ends = [(0, 0), *((a, b) for a, b, _ in parts), (sizes[dim], sizes[dim])]
        gaps = [(a[1], b[0]) for a, b in zip(ends, ends[1:]) if b[0] > a[1]]
        device = node.meta.get("device")
        if gaps and device is None:
            continue  # (a gap's zeros need the device)
        pieces = [(a, leaf.args[0]) for a, _, leaf in parts]
        with graph.inserting_before(node):
            for a, b in gaps:  # zeros (built once, by the fold)
                shape = list(sizes[:dim] + (b - a,) + sizes[dim + 1:])
                gap = graph.call_function(aten.zeros.default, (shape,), {
                    "dtype": val.dtype, "layout": torch.strided, "device": device, "pin_memory": False})
                gap.meta["val"] = torch.empty(shape, dtype=val.dtype, device="meta")
                gap.meta["device"] = device
                pieces.append((a, gap))
            pieces = [piece for _, piece in sorted(pieces, key=operator.itemgetter(0))]
            cat = graph.call_function(aten.cat.default, (pieces, dim))
            total = graph.call_function(aten.add.Tensor, (cat, 0.0))
        for new in (cat, total):
            new.meta["val"] = torch.empty(sizes, dtype=val.dtype, device="meta")
            new.meta["device"] = device
        node.replace_all_uses_with(total)
        for dead in (node, *inner, *leaves):
            graph.erase_node(dead)
        changed = True
    return changed


def _views_as_reshapes(gm: torch.fx.GraphModule) -> None:
    """view -> reshape. The rewrites above may change the strides of some tensors (a bmm made one
    mm, a product made a multiply), so a view that was valid at trace time may not be at replay;
    reshape is the same view whenever one exists and copies only when none does."""
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


def _permutation_of(node: Any) -> tuple[Any, tuple[int, ...]] | None:
    """(input, the permutation of its dims) if `node` is a permute, a transpose or a t: the dim i of
    the result is the dim perm[i] of the input."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.args):
        return None
    val = _node_val(node)
    if not isinstance(val, torch.Tensor) or val.dim() < 1:
        return None
    nd = val.dim()
    if node.target is aten.t.default:
        return (node.args[0], (1, 0)) if nd == 2 else None
    if node.target is aten.transpose.int:
        perm = list(range(nd))
        i, j = node.args[1] % nd, node.args[2] % nd
        perm[i], perm[j] = j, i
        return node.args[0], tuple(perm)
    if node.target is aten.permute.default:
        return node.args[0], tuple(d % nd for d in node.args[1])
    return None


def _may_stand_in_for_output(node: torch.fx.Node) -> bool:
    """Whether `node` may replace an output it is viewed as: it allocates its result (fresh at
    every replay, no view of a graph input) and is not an output itself (outputs stay distinct)."""
    return _fresh(node) and not any(u.op == "output" for u in node.users)


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


def _kept_operand(node: torch.fx.Node, src: Any) -> Any:
    """`src` where `node` computes the same values as it (x * 1, x ** 1) and has its shape and
    dtype; else None."""
    if isinstance(src, torch.fx.Node) and _same_shape(src, node) and _node_val(src).dtype == _node_val(node).dtype:
        return src
    return None


def _simplify(gm: torch.fx.GraphModule) -> None:
    """Remove the bookkeeping that batching rules and backward formulas leave in a recorded graph.

    Each op is a dispatcher round trip of several microseconds in a replayed graph, and a small
    jacrev graph is mostly such ops; a Hessian graph also recomputes the function's value only to
    take ones_like of it (the seed of the backward pass). Rewrites, in one forward sweep:
    - chains of reshape-like ops (reshape, squeeze, unsqueeze, same-shape expand, a one-piece
      split or cat) -> one reshape of the chain's source, or the source itself if its shape is kept;
    - a permutation (permute, transpose, t) of a permutation -> one permute of the first's input,
      or that input where the two cancel;
    - x * 1, x * ones, x ** 1, b == True (b bool) -> x, b (same dtype and shape);
    - ones_like/zeros_like(x), x ** 0 -> ones/zeros of x's shape, so the value of x is no longer
      needed (backward formulas of powers leave x ** 1 and x ** 0 in second derivatives);
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
        elif (outer := _permutation_of(node)) is not None and (inner := _permutation_of(outer[0])) is not None:
            # A permutation of a permutation: one view of the first's input with the same sizes
            # and strides (none at all where they cancel), so what reads it reads the same.
            # (An output stays a view of its own where its input may not stand in for it.)
            composed = tuple(inner[1][d] for d in outer[1])
            source = inner[0]
            if composed == tuple(range(len(composed))) and (not is_output or _may_stand_in_for_output(source)):
                keep, view_only = source, True
            else:
                node.target, node.args, node.kwargs = aten.permute.default, (source, list(composed)), {}
        elif node.target in (aten.mul.Tensor, aten.mul.Scalar) and _is_one(node.args[1]):
            keep = _kept_operand(node, node.args[0])
        elif node.target is aten.mul.Tensor and _is_call(node.args[1], aten.ones.default):
            keep = _kept_operand(node, node.args[0])
        elif node.target is aten.mul.Tensor and _is_call(node.args[0], aten.ones.default):
            keep = _kept_operand(node, node.args[1])
        elif node.target is aten.eq.Scalar and node.args[1] is True:
            keep = _kept_operand(node, node.args[0])  # (b == True is b where b is bool: a condition read off a tensor)
        elif node.target is aten.pow.Tensor_Scalar and _is_one(node.args[1]):
            keep = _kept_operand(node, node.args[0])  # ATen copies the base for an exponent of 1
        elif node.target in (aten.ones_like.default, aten.zeros_like.default) or (
                node.target is aten.pow.Tensor_Scalar and type(node.args[1]) in (int, float) and node.args[1] == 0):
            # (pow(x, 0): ATen fills its result with ones, NaNs and infinities of x included)
            val = _node_val(node)
            device = node.meta.get("device", getattr(val, "device", None))
            if isinstance(val, torch.Tensor) and val.is_contiguous() and device is not None and device.type != "meta":
                make = aten.zeros.default if node.target is aten.zeros_like.default else aten.ones.default
                node.target, node.args = make, (list(val.shape),)
                node.kwargs = {"dtype": val.dtype, "layout": val.layout, "device": device, "pin_memory": False}
        if keep is None and (key := _cse_key(node)) is not None:
            first = seen.setdefault(key, node)
            if first is not node:
                keep, view_only = first, True  # the same op on the same inputs: the same aliasing
        if not isinstance(keep, torch.fx.Node):
            continue
        if is_output and not (view_only and _may_stand_in_for_output(keep)):
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


# Binary ops and comparisons given a Python number -> their overload taking the number as a tensor
# (engine.replay_contract logs both forms alike).
SCALAR_TWINS = {
    aten.mul.Tensor: aten.mul.Tensor, aten.mul.Scalar: aten.mul.Tensor,
    aten.add.Tensor: aten.add.Tensor, aten.add.Scalar: aten.add.Tensor,
    aten.sub.Tensor: aten.sub.Tensor, aten.sub.Scalar: aten.sub.Tensor,
    aten.div.Tensor: aten.div.Tensor, aten.div.Scalar: aten.div.Tensor,
    aten.rsub.Scalar: aten.rsub.Tensor, aten.rsub.Tensor: aten.rsub.Tensor,
    aten.eq.Scalar: aten.eq.Tensor, aten.ne.Scalar: aten.ne.Tensor, aten.lt.Scalar: aten.lt.Tensor,
    aten.le.Scalar: aten.le.Tensor, aten.gt.Scalar: aten.gt.Tensor, aten.ge.Scalar: aten.ge.Tensor,
    aten.eq.Tensor: aten.eq.Tensor, aten.ne.Tensor: aten.ne.Tensor, aten.lt.Tensor: aten.lt.Tensor,
    aten.le.Tensor: aten.le.Tensor, aten.gt.Tensor: aten.gt.Tensor, aten.ge.Tensor: aten.ge.Tensor,
}
_SCALAR_COMPARES = frozenset({
    aten.eq.Tensor, aten.ne.Tensor, aten.lt.Tensor, aten.le.Tensor, aten.gt.Tensor, aten.ge.Tensor})
_SCALAR_FLOATS = (torch.float32, torch.float64)


def scalar_operand(x: Any, number: Any) -> bool:
    """Whether `x op number` (op in SCALAR_TWINS) may take `number` as a 0-d tensor of x's dtype:
    x a float32/float64 CPU tensor, `number` an int64-range int or a float."""
    if type(number) not in (int, float) or (type(number) is int and not -(1 << 63) <= number < (1 << 63)):
        return False
    return isinstance(x, torch.Tensor) and x.dtype in _SCALAR_FLOATS and x.device.type in ("cpu", "meta")


def _scalars_as_tensors(gm: torch.fx.GraphModule, captured_fixed: bool) -> list[torch.Tensor]:
    """x * 2.0 (add, sub, div, rsub and the comparisons alike) on a float32/float64 CPU tensor ->
    x * c, c a 0-d tensor of x's dtype fed like a captured tensor (the new trailing placeholders'
    values are returned). A Python number reaches the kernel as a float64 or int64 0-d tensor that
    TensorIterator converts to x's dtype at every call (an allocation and a copy, about as long as
    the op itself on a small tensor); c is that conversion's result, made once by the same cast, so
    the kernel reads the same operand: the same bits (tests/test_graph_pass_properties.py). c's
    dtype is x's when recorded: x must not depend on a captured tensor, whose dtype a replay of
    engine.trace follows, unless `captured_fixed` (automatic tracing, whose guard fails on a
    captured tensor's new dtype). Numbers the fold reads are left to it (it converts them once), as
    are graphs with writes, which it leaves alone."""
    graph = gm.graph
    if _writes(graph):
        return []
    graph.eliminate_dead_code()  # (a placeholder for a dead op's number would be fed for nothing)
    captured = {node for node in graph.nodes if "captured_requires_grad" in node.meta}
    folded = _computed_from(graph, captured)  # (their numbers go with them into the fold)
    varying: set[torch.fx.Node] = set()  # nodes whose dtype follows a captured tensor's
    if not captured_fixed:
        for node in graph.nodes:
            if node in captured or any(i in varying for i in node.all_input_nodes):
                varying.add(node)
    made: dict[tuple, torch.fx.Node] = {}
    values: list[torch.Tensor] = []
    anchor = next(n for n in graph.nodes if n.op != "placeholder")
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in SCALAR_TWINS]:
        if len(node.args) != 2 or set(node.kwargs) - {"alpha"}:
            continue
        x, number = node.args
        val, xval = _node_val(node), _node_val(x)
        out_dtype = torch.bool if SCALAR_TWINS[node.target] in _SCALAR_COMPARES else getattr(xval, "dtype", None)
        if node in folded or x in varying or node.meta.get("device") != _CPU or not scalar_operand(xval, number) \
                or not (isinstance(val, torch.Tensor) and val.dtype == out_dtype):
            continue
        key = (type(number), number, math.copysign(1.0, number), xval.dtype)  # (0.0 and -0.0 differ)
        c = made.get(key)
        if c is None:
            with _disable_current_modes():
                source = torch.tensor(number, dtype=torch.int64 if type(number) is int else torch.float64)
                values.append(source.to(xval.dtype))  # (TensorIterator's cast)
            with graph.inserting_before(anchor):
                c = made[key] = graph.placeholder(f"number_{len(values) - 1}")
            c.meta["val"] = torch.empty((), dtype=xval.dtype, device="meta")
            c.meta["device"] = _CPU
        node.target = SCALAR_TWINS[node.target]
        node.args = (x, c)
    return values


_CPU = torch.device("cpu")


def _out_of_place_views(gm: torch.fx.GraphModule) -> None:
    """In-place view ops (squeeze_, unsqueeze_, transpose_ ...) on tensors made inside the graph
    -> their out-of-place views.

    Autograd's formulas apply them to fresh results (matmul's backward squeezes its product in
    place); they only change the metadata of their tensor, yet they count as mutations, which
    keeps the other passes away from the whole graph. the recording points every later use of the
    tensor at the in-place node, so when the tensor is made inside the graph (not an input, whose
    caller would see the change) and nothing reads it after the op except through the op, the
    out-of-place view computes the same thing.
    """
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if torch.Tag.inplace_view not in target.tags:
            continue
        src = node.args[0]
        if not isinstance(src, torch.fx.Node) or src.op != "call_function":
            continue
        if any(order[u] > order[node] for u in src.users if u is not node):
            continue
        replacement = out_of_place_view(target)
        if replacement is not None:
            node.target = replacement


def _out_of_place_op(target: Any) -> Any:
    """aten.div_.Tensor -> aten.div.Tensor (the functional twin of an in-place op), or None: the
    overload that takes the same arguments (engine._opmeta.out_of_place_view, which serves any
    in-place op), not the one of the same name: pow_.Scalar's is pow.Tensor_Scalar."""
    name = target._schema.name.split("::")[1]
    if not name.endswith("_") or name.endswith("__"):
        return None
    return out_of_place_view(target)


def _out_of_place_writes(gm: torch.fx.GraphModule) -> None:
    """In-place arithmetic on tensors made inside the graph (x.div_(n) in a loss's mean, autograd's
    in-place accumulations) -> its out-of-place twin, where nothing could see the difference: the
    written tensor is a fresh allocation of the graph (no input, no view), every other reader of
    it ran before the write and none of them is a view of it (so no alias reads the written value
    later). Such writes otherwise mark the whole graph as mutating, which keeps the clean-up
    passes, constant folding and the fused tier away from it."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or not node.args:
            continue
        if not target._schema.is_mutable or torch.Tag.inplace_view in target.tags:
            continue
        src = node.args[0]
        if not _fresh(src) or src.target is aten.empty.memory_format:
            continue
        others = [u for u in src.users if u is not node]
        if any(order[u] > order[node] or not _fresh(u) for u in others):
            continue
        twin = _out_of_place_op(target)
        if twin is None or target._schema.arguments[0].alias_info is None:
            continue
        node.target = twin


# The passes that change a graph's arithmetic on purpose: another kernel for the same sums, or a
# product dropped whose only effect was on infinities, NaNs and the sign of zero. A graph one of
# them rewrote does not round like its eager call (engine.replay_contract); the others keep every
# rounding op of the graph on the operands it had.
ARITHMETIC_PASSES: dict[str, Callable[[torch.fx.GraphModule], bool]] = {
    "fold_broadcast_bmm": _fold_broadcast_bmm,
    "outer_bmm_to_mul": _outer_bmm_to_mul,
    "fold_identity_mm": _fold_identity_mm,
    "mm_operand_layout": _mm_operand_layout,
    "slice_sums_to_cat": _slice_sums_to_cat,
}


def clean_up(gm: torch.fx.GraphModule, captured_fixed: bool = False) -> tuple[list[torch.Tensor], tuple[str, ...]]:
    """Run every pass on `gm` in place, in order. Return the closed-over tensors that became its
    trailing inputs (to be fed, live, at every replay; then the numbers made tensors) and the
    ARITHMETIC_PASSES that rewrote it.
    `captured_fixed`: a replay runs only with the captured tensors' recorded dtypes (automatic
    tracing's guard checks them)."""
    constants = _lift_constants(gm)
    _out_of_place_views(gm)
    _out_of_place_writes(gm)
    rewrites = tuple(name for name, rewrite in ARITHMETIC_PASSES.items() if rewrite(gm))
    _views_as_reshapes(gm)
    _simplify(gm)
    constants += _scalars_as_tensors(gm, captured_fixed)
    _drop_no_ops(gm)  # (recompiles the graph's code for all of them)
    return constants, rewrites



class Fold:
    """The part of a recorded graph that reads only captured tensors (closed-over data, a
    distribution's parameters given as numbers, factory ops such as ones/eye), computed once and
    fed to the graph as trailing inputs instead of recomputed at every replay.

    Captured tensors stay live (an in-place update of them is seen by later replays), so the folded
    values are recomputed whenever one of their sources changed: another data pointer or layout
    (sizes, strides, dtype, device, conjugate/negative bits), or contents that differ bit for bit
    from those the values were computed from. The contents are compared, not version counters,
    because not every write moves one: BatchNorm's kernels update its running statistics in place
    without it, and a write through `t.data` moves another counter. Sources up to
    FOLD_WATCH_ELEMENTS each are always compared. Larger ones (CPU tensors, up to FOLD_WATCH_BYTES
    in all) are compared where that pays: at their first computation the values' time is set against one
    comparison's, and the sources are watched from then on only if recomputing cost more than
    FOLD_WATCH_GAIN comparisons (a Jacobian's basis times a wide layer's weight), else the values
    are recomputed on every call, as they always are beyond FOLD_WATCH_BYTES (the comparison keeps
    a copy of the sources). Whenever a source requires grad under grad mode, they are recomputed
    on every call (their autograd graph belongs to that call), as the unfolded graph would.
    """

    __slots__ = ("gm", "sources", "_layout", "_ptrs", "_values", "_contents", "_live", "_watchable")

    def __init__(self, gm: torch.fx.GraphModule, sources: list[torch.Tensor]) -> None:
        self.gm = gm
        self.sources = sources
        # The sources' layout as the values were computed: their data pointers, and a check of
        # everything else a source's layout is (sizes, strides, dtype, device, the dispatch keys
        # that carry the conjugate and negative bits, requires_grad): torch's TensorGuards, one
        # C call for all sources (a Python tuple of them cost twice the content comparison).
        # None: no values kept.
        self._layout: Callable[..., bool] | None = None
        self._ptrs: list[int] = []
        self._values: tuple = ()
        self._contents: list = []  # bytearrays (the byte path) or clones (_same_bits)
        # The sources' memory as memoryviews (taken with the contents, while the layout holds
        # they see exactly the sources' bytes), with `_contents` their bytes in bytearrays: a replay
        # compares them by one memcmp per source (a bytearray compares with anything that exposes
        # a buffer, without a copy) instead of torch.equal's dispatch and kernel (a fifth of the
        # time on a few KB); None where a source needs _same_bits (see _byte_views).
        self._live: list[memoryview] | None = None
        # True: compared; False: recomputed on every call; None: large, decided at the first computation.
        self._watchable: bool | None = False
        if all(t.layout == torch.strided for t in sources):
            if all(t.numel() <= FOLD_WATCH_ELEMENTS for t in sources):
                self._watchable = True
            elif (all(t.device.type == "cpu" for t in sources)  # (a copy in host memory, not on a device)
                  and sum(t.numel() * t.element_size() for t in sources) <= FOLD_WATCH_BYTES):
                self._watchable = None

    def values(self) -> tuple:
        """The folded values for the sources as they are now.

        The same tuple object is returned only while every source keeps the data pointer, sizes
        and strides it had when the values were computed (engine.fused.FusedProgram relies on it:
        it checks the values' and the sources' layout once per tuple)."""
        sources = self.sources
        # (the layout too: the byte path's memoryviews keep the layout they were taken with, and
        # `t.data = t.t()` gives another layout over the same memory, moving neither the version
        # nor the data pointer. The version counter is not read: the contents are compared, and a
        # write moves no counter where it goes through `.data`.)
        layout = self._layout
        if layout is not None and list(map(_data_ptr, sources)) == self._ptrs and layout(*sources):
            if self._contents_hold(sources):
                if not torch.is_grad_enabled() or not any(t.requires_grad for t in sources):
                    return self._values
        start = time.perf_counter()
        values = tuple(self.gm(*sources))
        spent = time.perf_counter() - start
        if self._watchable is False or (torch.is_grad_enabled() and any(t.requires_grad for t in sources)):
            self._layout = None
        else:
            self._ptrs = list(map(_data_ptr, sources))
            self._layout = _layout_check(sources)
            self._live = _byte_views(sources)
            if self._live is not None:
                self._contents = [bytearray(v) for v in self._live]
            else:
                self._contents = [t.detach().clone() for t in sources]
            if self._watchable is None:  # large sources: watched only where comparing them pays
                self._watchable = self._watch_pays(sources, spent)
                if not self._watchable:
                    self._layout, self._live, self._contents = None, None, []
        self._values = values
        return values

    def _watch_pays(self, sources: list[torch.Tensor], spent: float) -> bool:
        """Whether comparing the sources' contents costs under 1/FOLD_WATCH_GAIN of computing the
        values (`spent`): timed once per process for a fold and its sources' layout
        (engine.timed_choices)."""
        def decide() -> bool:
            start = time.perf_counter()
            same = self._contents_hold(sources)
            return same and spent > FOLD_WATCH_GAIN * (time.perf_counter() - start)

        key = ("fold-watch", _FOLD_RULE, FOLD_WATCH_GAIN, self.gm.code, timed_choices.layouts(sources))
        return timed_choices.decided(key, decide)

    def _contents_hold(self, sources: list[torch.Tensor]) -> bool:
        """Whether the sources' contents are bit for bit the saved ones (memcmp on the byte path)."""
        live = self._live
        if live is not None:
            return all(map(operator.eq, self._contents, live))
        return all(map(_same_bits, sources, self._contents))


_data_ptr = torch.Tensor.data_ptr


def layout_guard(tensors: Any) -> Callable[..., bool] | None:
    """`check(*ts)`: whether tensors have the layout these have now (sizes, strides, dtype, device,
    dispatch keys, which carry the conjugate and negative bits, requires_grad; not the data
    pointer), in one C call: torch's TensorGuards (what torch.compile's guards check tensors
    with). None where this torch lacks it or refuses the tensors."""
    try:
        return torch._C._dynamo.guards.TensorGuards(
            *tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors]).check
    except (AttributeError, TypeError, RuntimeError):
        return None


def _layout_check(tensors: list[torch.Tensor]) -> Callable[..., bool]:
    """`layout_guard`, or the same comparison in Python where there is none. A check that answers
    False only costs the fold a recomputation."""
    check = layout_guard(tensors)
    if check is None:
        saved = [timed_choices.layout(t) for t in tensors]
        return lambda *ts: [timed_choices.layout(t) for t in ts] == saved
    return check


FOLD_WATCH_ELEMENTS = 1 << 16  # sources up to this size are compared to keep their folded values
FOLD_WATCH_BYTES = 1 << 26  # larger sources, up to this many bytes in all, where comparing pays (Fold)
FOLD_WATCH_GAIN = 4  # ... where recomputing the values cost more than this many comparisons of them
_FOLD_RULE = timed_choices.rule(Fold._watch_pays)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(t: torch.Tensor, saved: torch.Tensor) -> bool:
    """Bit-for-bit equality: the values' bits compared as integers (-0.0 differs from 0.0, a NaN
    equals the same NaN); a tensor that cannot be viewed so compares values and sign bits."""
    if t.is_complex():
        t, saved = torch.view_as_real(t.resolve_conj()), torch.view_as_real(saved)
    if not t.is_floating_point():
        return torch.equal(t, saved)
    bits = _BITS.get(t.element_size())
    if bits is not None and t.is_contiguous():
        return torch.equal(t.view(bits), saved.view(bits))
    return torch.equal(t, saved) and torch.equal(torch.signbit(t), torch.signbit(saved))


def _byte_views(tensors: list[torch.Tensor]) -> list[memoryview] | None:
    """Memoryviews of the tensors' memory, on which comparing bytes is _same_bits' comparison (bit
    for bit: -0.0 differs from 0.0, a NaN equals the same NaN): contiguous CPU tensors of a dtype
    numpy has, without a conjugate or negative bit; None when one is not (the general path)."""
    out = []
    for t in tensors:
        if t.device.type != "cpu" or not t.is_contiguous() or t.is_conj() or t.is_neg():
            return None
        try:
            out.append(memoryview(t.detach().numpy()))
        except (TypeError, RuntimeError, ValueError):  # a dtype numpy lacks (bfloat16), or no numpy
            return None
    return out


def _foldable(node: torch.fx.Node) -> bool:
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and not target._schema.is_mutable
        and torch.Tag.nondeterministic_seeded not in target.tags
        and isinstance(node.meta.get("val"), torch.Tensor)
    )


def _is_condition(x: Any) -> bool:
    val = _node_val(x)
    return isinstance(val, torch.Tensor) and val.dtype == torch.bool and val.dim() == 0


def _condition(graph: torch.fx.Graph, target: Any, args: tuple) -> torch.fx.Node:
    """A node of a 0-d bool value (a stack of them: 1-d), its meta value made directly: the meta
    kernels of these ops are Python decompositions whose first use imports sympy (most of a
    second, in the recording call)."""
    node = graph.call_function(target, args)
    first = args[0][0] if target is aten.stack.default else args[0]
    shape = (len(args[0]),) if target is aten.stack.default else ()
    node.meta["val"] = torch.empty(shape, dtype=torch.bool, device="meta")
    node.meta["device"] = first.meta.get("device")
    return node


def _split_conjunctions(graph: torch.fx.Graph, const: set[torch.fx.Node]) -> bool:
    """all(stack(conditions)), the replay's guard (engine.trace's `all_hold`), with the conditions
    that read only captured tensors (`const`) joined apart, so that the fold computes their
    conjunction once; two conditions left are joined by one logical_and instead of a stack and a
    reduction. A conjunction of bools in any order and grouping is the same bool. Returns whether
    it rewrote the graph."""
    changed = False
    for node in _calls(graph, aten.all.default):
        stack = node.args[0]
        if not (_is_call(stack, aten.stack.default) and len(stack.users) == 1 and not node.kwargs):
            continue
        items = list(stack.args[0])
        if len(items) < 2 or not all(_is_condition(i) for i in items) \
                or len({i.meta.get("device") for i in items}) != 1:
            continue
        fixed = [i for i in items if i in const]
        live = list(dict.fromkeys(i for i in items if i not in const))  # (b and b is b)
        if not live:
            continue  # (folded whole)
        with graph.inserting_before(node):
            if len(fixed) > 1:
                joined = _condition(graph, aten.all.default, (_condition(graph, aten.stack.default, (fixed,)),))
                const.update((joined, joined.args[0]))
                fixed = [joined]
            items = fixed + live
            if len(items) == 2:
                both = _condition(graph, aten.logical_and.default, tuple(items))
            elif len(items) < len(stack.args[0]):  # (joined or deduplicated: else it is as it was)
                both = _condition(graph, aten.all.default, (_condition(graph, aten.stack.default, (items,)),))
            else:
                continue
        both.meta.update(node.meta)
        node.replace_all_uses_with(both)
        graph.erase_node(node)
        graph.erase_node(stack)
        changed = True
    return changed


def fold_constants(gm: torch.fx.GraphModule, n_args: int, constants: list[torch.Tensor]) -> Fold | None:
    """Move every op that reads no argument (only captured tensors and constants) out of `gm`
    into a `Fold`; its results become new trailing placeholders of `gm`, after the captured ones.

    `n_args` leading placeholders are the call's tensors, the next `len(constants)` the captured
    tensors. Graphs with in-place ops are left alone, as are random ops. A folded value the graph
    returns is returned as a clone (a fresh tensor per call, as before). Returns None when nothing
    folds.
    """
    graph = gm.graph
    if _writes(graph):
        return None
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    captured = {ph: constants[i] for i, ph in enumerate(placeholders[n_args:n_args + len(constants)])}
    const = _computed_from(graph, set(captured)) - set(captured)
    split = _split_conjunctions(graph, const)
    frontier = [n for n in graph.nodes if n in const and any(u not in const for u in n.users)]
    if not frontier:
        if split:
            gm.recompile()
        return None
    # the folding graph: the captured placeholders it reads, then the const nodes the frontier needs
    needed: set[torch.fx.Node] = set()
    stack = list(frontier)
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        needed.add(node)
        stack.extend(node.all_input_nodes)
    fold_graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    sources = []
    for ph, tensor in captured.items():
        if ph in needed:
            env[ph] = fold_graph.placeholder(ph.name)
            sources.append(tensor)
    for node in graph.nodes:
        if node in needed and node not in env:
            env[node] = fold_graph.node_copy(node, lambda n: env[n])
    fold_graph.output([env[n] for n in frontier])
    fold_gm = torch.fx.GraphModule(torch.nn.Module(), fold_graph)
    # the recorded graph reads the folded values as trailing placeholders
    last = placeholders[-1]
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    for i, node in enumerate(frontier):
        with graph.inserting_after(last):
            ph = graph.placeholder(f"folded_{i}")
        ph.meta.update(node.meta)
        last = ph
        for user in list(node.users):
            if user in const:
                continue
            if user is output:
                with graph.inserting_before(output):
                    fresh = graph.call_function(aten.clone.default, (ph,))
                fresh.meta.update(node.meta)
                user.replace_input_with(node, fresh)
            else:
                user.replace_input_with(node, ph)
    graph.eliminate_dead_code()
    gm.recompile()
    return Fold(fold_gm, sources)
