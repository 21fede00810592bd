"""Gradients that leave a finished vmap level: summed over its batch, on the edge where they leave.

Autograd records ops on the batched wrapper (the Python dispatch key sits below autograd), so a
node of a vmapped op may have inputs that are batched at its level and inputs that are not (a
weight closed over from outside, a tensor of an outer level). While the level is alive, a backward
pass through that node computes one gradient per batch element for every input: exactly what a
transform inside the vmap (vmap(grad(f))) asks for. Once the level has returned, its batch is a
finished loop, and an input that was shared by every element must receive the *sum* of their
gradients, as the loop `for i: f(x[i], w)` would give `w`.

That sum cannot be done inside the backward formulas (they run in C++) nor after the backward pass
(a gradient that arrives at a tensor from two paths, one batched and one not, is already
broadcast-added by then). It is done on the edge: every node whose requires-grad inputs are
batched at different levels gets a post-hook when its levels close, and the hook reduces each
input's gradient over the levels that the input did not have and that have returned. The same
mechanism covers the forward pass (closed-over weights) and the backward passes autograd runs
with create_graph=True (jacrev of a vector-valued jacrev), so nothing else in the engine has to
special-case gradients across levels.
"""
from __future__ import annotations

from typing import Any

import torch

from engine._batched import NEVER, BatchedTensor, LevelInfo, _active, _RemoveBatchDim, batch_levels, on_level_exit, remove_batch_dim

# Records of nodes that touch a level that had already returned when they were made (a backward
# pass with create_graph=True after the vmap). They are hooked at the next chance: the next
# batched op, before the engine's next backward pass, and at the latest when the backward pass
# that made them ends (autograd's queue_callback), before anyone can differentiate them.
_urgent: list = []
_queued_for_task = [-1]  # the backward pass (graph task id) whose end already flushes _urgent
# The newest record still holds its output tensor: autograd attaches the node to it only after the
# op returns, so the node is read off it at the next batched op (or flush) and the tensor let go.
_last: list = []
# Whether autograd has recorded a node of a batched op in this process (a backward pass may then
# run ops on batched tensors after their vmap returned: engine.transforms.autograd_vjp).
BATCHED_NODES = [False]


def levels_of(x: Any) -> tuple[int, ...]:
    return tuple(batch_levels(x)) if type(x) is BatchedTensor else ()


def note(args: tuple, kwargs: dict, out: Any, level: int) -> None:
    """Called for an op at `level` while grad mode is on: remember the node autograd is about to make
    for `out` when its requires-grad inputs are batched at different levels.

    It records nothing when no input requires grad (autograd makes no node) or when every tensor
    input has the same levels (no input lacks a level, so there is nothing to sum): the dispatch
    skips the call when it saw no input that requires grad."""
    tensors = list(_tensor_args(args, kwargs))
    for a in tensors:
        if a.requires_grad:
            break
    else:
        return  # the cheap common exit: autograd records nothing
    BATCHED_NODES[0] = True
    per = [(a, levels_of(a)) for a in tensors]
    first = per[0][1]
    for _, lv in per:
        if lv != first:
            break
    else:
        return  # every input has every level
    union = {lvl for _, lv in per for lvl in lv}
    edges = []
    for t, lv in per:
        if not t.requires_grad or len(lv) == len(union):
            continue  # it has every level: nothing to sum for it
        lacking = union.difference(lv)
        if t.grad_fn is None and _made_inside(t, lacking):
            continue  # a transform's own input made inside the level: its gradient is asked for there
        edges.append((t.grad_fn if t.grad_fn is not None else t, t.output_nr if t.grad_fn is not None else None, frozenset(lv)))
    if not edges:
        return
    anchor = _first_tensor(out)
    if anchor is None:
        return
    if _last:
        resolve_last()
    if all(lvl in _active for lvl in union):
        target = _active[max(union)].pending
    else:
        target = _urgent
        task = torch._C._current_graph_task_id()
        if task != -1 and task != _queued_for_task[0]:
            _queued_for_task[0] = task
            torch.autograd.Variable._execution_engine.queue_callback(flush_urgent)
    _last.append((anchor, edges, target))



def _made_inside(leaf: torch.Tensor, levels: set[int]) -> bool:
    """Whether `leaf` was made (engine._batched.mark_inner) after every one of `levels` started."""
    stamp = getattr(leaf, "_vb_seq", NEVER)
    for lvl in levels:
        info = _active.get(lvl)
        if info is None or stamp < info.stamp:
            return False
    return True


def resolve_last() -> None:
    """Swap the newest record's output tensor for the autograd node that now hangs on it."""
    anchor, edges, target = _last.pop()
    node = anchor.grad_fn
    if node is not None:
        target.append((node, edges))


def _tensor_args(args: tuple, kwargs: dict):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif type(a) in (list, tuple):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b
    for a in kwargs.values():
        if isinstance(a, torch.Tensor):
            yield a


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for o in out:
            if isinstance(o, torch.Tensor):
                return o
    return None


def flush(records: list) -> None:
    """Attach the summing hook to the nodes of `records` that still exist."""
    if _last:
        resolve_last()
    while records:
        node, edges = records.pop()
        slots: dict[int, frozenset] = {}
        for i, (fn, nr) in enumerate(node.next_functions):
            if fn is None:
                continue
            for key, out_nr, lv in edges:
                if out_nr is None:
                    if getattr(fn, "variable", None) is key:
                        slots[i] = lv
                elif fn is key and nr == out_nr:
                    slots[i] = lv
        if slots:
            node.register_hook(_SumHook(slots))


def flush_urgent() -> None:
    if _last:
        resolve_last()
    if _urgent:
        flush(_urgent)


def flush_level(info: LevelInfo) -> None:
    """At the end of `info`'s vmap: hook its nodes (the newest record may not be resolved yet)."""
    if _last:
        resolve_last()
    if info.pending:
        flush(info.pending)


on_level_exit(flush_level)


class _SumHook:
    """Post-hook of one node: per input slot, sum the gradient over returned levels it lacks."""

    __slots__ = ("slots",)

    def __init__(self, slots: dict[int, frozenset]):
        self.slots = slots

    def __call__(self, grad_inputs: tuple, grad_outputs: tuple) -> tuple | None:
        changed = False
        new = list(grad_inputs)
        for i, keep in self.slots.items():
            g = new[i]
            if type(g) is not BatchedTensor:
                continue
            for lvl in batch_levels(g):
                if lvl not in keep and lvl not in _active:
                    g = sum_level(g, lvl)
                    changed = True
            new[i] = g
        return tuple(new) if changed else None


def sum_level(g: torch.Tensor, level: int) -> torch.Tensor:
    """`g` summed over the batch of `level` (one of its levels), differentiably when it requires grad
    (create_graph=True backward passes differentiate through the sum)."""
    if g.requires_grad and torch.is_grad_enabled():
        return _RemoveBatchDim.apply(g, level, _size_of(g, level)).sum(0)
    return remove_batch_dim(g, level, 0).sum(0)


def _size_of(g: Any, level: int) -> int:
    while type(g) is BatchedTensor:
        if g._level == level:
            return g._elem.shape[0]
        g = g._elem
    raise AssertionError(f"tensor is not batched at level {level}")
