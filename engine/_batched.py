"""The batched tensor: a logical tensor backed by a physical tensor with one extra (batch) dim.

Invariants that keep every rule simple:
- the batch dim of the physical tensor (`_elem`) is always dim 0;
- a BatchedTensor of level L only ever wraps tensors batched at levels < L (higher levels are
  outermost), so nested vmap and closures over outer-batched values dispatch one level at a time.
The wrapper reports the logical shape and strides, so PyTorch's composite ops (which inspect
strides to choose view or copy) and autograd see the per-example tensor.

This is the bottom layer of the engine (engine._gradsum, then engine._dispatch build on it) and
imports neither: engine._dispatch installs the tensor's `__torch_dispatch__` (`install_dispatch`)
and engine._gradsum registers what runs when a level returns (`on_level_exit`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from engine._view_copies import note_copy
from engine.errors import DataDependentError


@dataclass
class LevelInfo:
    """What a rule may ask about the vmap it runs under (mirrors torch.library's VmapInfo)."""

    level: int
    batch_size: int
    randomness: str = "error"
    # autograd sequence number at entry: graph nodes older than this were built outside the level
    seq: int = 0
    # (autograd sequence number, engine clock) at entry, compared with leaves' mark_inner stamps:
    # the clock orders a leaf and a level made with no autograd node in between (see `clock`)
    stamp: tuple = (0, 0)
    # autograd nodes of this level to hook when it returns (engine._gradsum)
    pending: list = field(default_factory=list)


_level_counter = itertools.count(1)
_ticks = itertools.count(1)
# Stamp of a leaf never marked by a transform: older than every level.
NEVER: tuple = (-1, -1)


def clock() -> tuple:
    """Now, as (autograd sequence number, engine tick). Autograd's number alone does not move
    when no graph node is made, so a transform's input marked just before a vmap starts (grad of
    a vmap over a closure) would tie with the level's entry; the tick breaks the tie."""
    return torch._C._autograd._get_sequence_nr(), next(_ticks)
_active: dict[int, LevelInfo] = {}
# Called with a level's info after it left `_active` (engine._gradsum hooks the level's nodes there).
_level_exit_hooks: list[Callable[[LevelInfo], None]] = []


def on_level_exit(hook: Callable[[LevelInfo], None]) -> None:
    """Run `hook(info)` whenever a level returns (after it is no longer active)."""
    _level_exit_hooks.append(hook)


def push_level(batch_size: int, randomness: str) -> LevelInfo:
    now = clock()
    info = LevelInfo(next(_level_counter), batch_size, randomness, now[0], stamp=now)
    _active[info.level] = info
    return info


def pop_level(info: LevelInfo) -> None:
    _active.pop(info.level, None)
    for hook in _level_exit_hooks:
        hook(info)


def level_info(level: int, batch_size: int) -> LevelInfo:
    """The info of a live level, or (for autograd's backward running after vmap returned) a stand-in."""
    info = _active.get(level)
    return info if info is not None else LevelInfo(level, batch_size, "error")


class BatchedTensor(torch.Tensor):
    """Logical view of `_elem` without its dim 0, belonging to vmap level `_level`."""

    # Slots, not the instance dict: every op makes one of these, and a slot is set and read
    # without a dict (issue #18). Other attributes still go to the dict torch.Tensor provides.
    __slots__ = ("_elem", "_level")
    _elem: torch.Tensor
    _level: int

    @staticmethod
    def __new__(cls, elem: torch.Tensor, level: int) -> "BatchedTensor":
        return wrap(elem, level)

    # No Python hop above autograd: every op goes straight to __torch_dispatch__ (gradients that
    # leave a returned level are summed by engine._gradsum's node hooks instead).
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # replaced by install_dispatch
        raise RuntimeError("engine._batched: no dispatch installed; import engine (engine._dispatch installs it).")

    def __repr__(self) -> str:
        """torch.func's format: `BatchedTensor(lvl=L, bdim=0, value=` then the physical tensor's repr
        indented, where L counts the vmaps from the outermost (1) in, not the engine's level id."""
        depth = sum(1 for level in _active if level <= self._level) or 1
        value = "\n".join("    " + line if line else line for line in repr(self._elem).split("\n"))
        return f"BatchedTensor(lvl={depth}, bdim=0, value=\n{value}\n)"

    def is_contiguous(self, memory_format: torch.memory_format = torch.contiguous_format) -> bool:  # type: ignore[override]
        """The logical tensor's answer for the default format. Other formats (channels_last, ...) are
        refused, as torch.func refuses them: the layout a rule gives a result with the batch dim in
        front is not the layout each element would have had, so the answer would not be the
        per-example one that code branching on it expects."""
        if memory_format is not torch.contiguous_format:
            from engine.errors import VmapError
            raise VmapError(
                f"vmap: is_contiguous(memory_format={memory_format}) cannot be answered for a batched tensor "
                f"(only torch.contiguous_format can): call .contiguous(memory_format={memory_format}) "
                f"instead of asking, or ask outside vmap."
            )
        return torch.Tensor.is_contiguous(self)

    # Tensor.tolist()/numpy() on a batched tensor are data-dependent: say so, do not segfault.
    def tolist(self):  # type: ignore[override]
        raise DataDependentError("vmap: .tolist() on a batched tensor depends on its data; return the tensor instead.")

    def numpy(self, *args, **kwargs):  # type: ignore[override]
        raise DataDependentError("vmap: .numpy() on a batched tensor depends on its data; return the tensor from the vmapped function instead.")


_make_wrapper = torch.Tensor._make_wrapper_subclass


def wrap(elem: torch.Tensor, level: int) -> BatchedTensor:
    """`elem` (batch at dim 0) as a BatchedTensor of `level`: the hot constructor, every argument of
    the wrapper positional (size, strides, storage offset, memory format, dtype, layout, device,
    pin_memory, requires_grad). A contiguous `elem` passes no strides: the wrapper's default
    (contiguous) strides are then its logical strides, and building them in C++ is cheaper
    than parsing a strides tuple (issue #18)."""
    r = _make_wrapper(BatchedTensor, elem.shape[1:], None if elem.is_contiguous() else elem.stride()[1:], None, None, elem.dtype, elem.layout, elem.device, False, False)
    r._elem = elem
    r._level = level
    return r


def install_dispatch(fn: Callable[..., Any]) -> None:
    """Make `fn(cls, func, types, args=(), kwargs=None)` the batched tensor's __torch_dispatch__."""
    BatchedTensor.__torch_dispatch__ = classmethod(fn)  # type: ignore[method-assign, assignment]


def is_batched_at(x: Any, level: int) -> bool:
    return type(x) is BatchedTensor and x._level == level


def batch_levels(x: Any) -> list[int]:
    levels = []
    while type(x) is BatchedTensor:
        levels.append(x._level)
        x = x._elem
    return levels


def add_batch_dim(x: torch.Tensor, level: int) -> torch.Tensor:
    """Make `x` (whose logical dim 0 is the batch of `level`) a tensor batched at `level`.

    When `x` is itself batched at higher levels (autograd's backward of a nested transform hands us
    such tensors), the new level is pushed underneath them to keep levels nested.
    """
    if type(x) is BatchedTensor and x._level > level:
        # x logical [B_L, ...]; x._elem [B_M, B_L, ...]: batch the inner tensor at L with B_L first.
        inner = add_batch_dim(_raw_movedim(x._elem, 1, 0), level)
        return wrap(inner, x._level)
    return wrap(x, level)


def remove_batch_dim(x: torch.Tensor, level: int, batch_size: int) -> torch.Tensor:
    """Inverse of add_batch_dim: the logical tensor with `level`'s batch as its dim 0.

    An `x` not batched at `level` is expanded (it is the same for every batch element).
    """
    if type(x) is BatchedTensor:
        if x._level == level:
            return x._elem
        if x._level > level:
            inner = remove_batch_dim(x._elem, level, batch_size)  # [B_L, B_M, ...] or expanded
            return wrap(_raw_movedim(inner, 0, 1), x._level)
    return x.unsqueeze(0).expand(batch_size, *x.shape)


def _raw_movedim(t: torch.Tensor, src: int, dst: int) -> torch.Tensor:
    return t.movedim(src, dst)


class _AddBatchDim(torch.autograd.Function):
    """Differentiable entry into vmap: autograd outside the engine sees through the boundary."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, level: int, batch_size: int):  # type: ignore[override]
        ctx.level, ctx.batch_size = level, batch_size
        return add_batch_dim(x, level)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        # Differentiable itself, so double backward (create_graph=True) sees through the boundary.
        return leave(grad, ctx.level, ctx.batch_size), None, None


class _RemoveBatchDim(torch.autograd.Function):
    """Differentiable exit from vmap."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, level: int, batch_size: int):  # type: ignore[override]
        ctx.level, ctx.batch_size = level, batch_size
        out = remove_batch_dim(x, level, batch_size)
        # A fresh alias: the physical tensor may be a leaf of another graph, which must not be re-parented.
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return enter(grad, ctx.level, ctx.batch_size), None, None


def enter(x: torch.Tensor, level: int, batch_size: int) -> torch.Tensor:
    """`x` (batch at dim 0) as a vmap input of `level`. A conjugate or negative view is resolved
    first (a copy): rules run below PyTorch's Conjugate/Negative keys and would read its raw memory
    (engine.rules.complex_ops). In-place writes that would show the copy (into it, or into the
    viewed tensor while it lives) are refused (engine._view_copies)."""
    if x.is_conj() or x.is_neg():
        view = x
        x = x.resolve_conj().resolve_neg()
        note_copy(x, view, "the conjugate/negative view passed to vmap")
    if x.requires_grad and torch.is_grad_enabled():
        return _AddBatchDim.apply(x, level, batch_size)
    return add_batch_dim(x, level)


def leave(x: torch.Tensor, level: int, batch_size: int) -> torch.Tensor:
    if x.requires_grad and torch.is_grad_enabled() and is_batched_at(x, level):
        return _RemoveBatchDim.apply(x, level, batch_size)
    return remove_batch_dim(x, level, batch_size)


def mark_inner(t: torch.Tensor) -> torch.Tensor:
    """Stamp a leaf made by a transform (grad's input) with its creation time, so a vmap level
    entered before it treats gradients into it per example rather than summing them."""
    t._vb_seq = clock()
    return t


_ACCUMULATE_GRAD = torch._C._functions.AccumulateGrad


def _is_outer(t: torch.Tensor, info: LevelInfo) -> bool:
    """Whether gradients into `t` flow to something built before `info`'s vmap started.

    A walk of the autograd graph from `t` that stops at the first node older than `info.seq`
    (or a leaf not stamped inside); AccumulateGrad nodes (leaves) are told apart by type, which
    costs no failed attribute lookup on every other node."""
    fn = t.grad_fn
    if fn is None:
        return getattr(t, "_vb_seq", NEVER) < info.stamp
    entry, stamp = info.seq, info.stamp
    stack, seen = [fn], set()
    push, add = stack.append, seen.add
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        add(node)
        if type(node) is _ACCUMULATE_GRAD:  # a leaf
            if getattr(node.variable, "_vb_seq", NEVER) < stamp:
                return True
            continue
        if node._sequence_nr() < entry:
            return True
        for n, _ in node.next_functions:
            if n is not None and n not in seen:
                push(n)
    return False
