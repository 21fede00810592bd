"""Dispatch of aten ops on batched tensors: rule, else decomposition, else the for-loop fallback.

Everything the autograd engine runs in backward reaches this function too, which is how vmap over
the backward pass (batched vector-Jacobian products) works without special cases.
"""
from __future__ import annotations

import functools
from functools import lru_cache
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import _disable_current_modes

from engine import _gradsum
from engine._batched import BatchedTensor, LevelInfo, _active, _make_wrapper, add_batch_dim, install_dispatch, wrap
from engine._modes import EngineMode, composite_kernel
from engine._fallbacks import FallbackRecord, _note_fallback, fallback_policy, record_fallbacks  # noqa: F401  (engine's API)
from engine._opmeta import _OpMeta, op_meta, op_name, out_of_place_view  # noqa: F401  (read here and by engine.trace)
from engine._view_copies import LIVE as _VIEW_COPIES, check_writes, note_copy
from engine.custom_ops import custom_vmap_rule, run_custom_op
from engine.errors import DataDependentError, FallbackError, RandomnessError, VmapError
from engine.rules._helpers import python_binding
from engine.rules._table import PLANS, lookup
from engine.rules.random_ops import UNSUPPORTED_RANDOM, draw_unbatched, fresh_per_element, unsupported_random_error

aten = torch.ops.aten

_DATA_DEPENDENT = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default}

# ---------------------------------------------------------------------------------------------
# the dispatch
#
# Every op on a batched tensor runs the op's *plan*: a closure built once per op (engine.rules._table
# PLANS, dropped whenever a rule changes) that holds everything read from the op's schema and the
# rule table. A call then costs one dict lookup and one pass over the arguments that finds the
# level, unwraps it, and notes whether any input requires grad; the rule; and one wrapper per output.


def _find_level(args: Any, kwargs: dict) -> tuple[int | None, int]:
    level, size = None, 0
    for a in args:
        if type(a) is BatchedTensor:
            if level is None or a._level > level:
                level, size = a._level, a._elem.shape[0]
        elif type(a) in (list, tuple):
            for b in a:
                if type(b) is BatchedTensor and (level is None or b._level > level):
                    level, size = b._level, b._elem.shape[0]
    for a in kwargs.values():
        if type(a) is BatchedTensor and (level is None or a._level > level):
            level, size = a._level, a._elem.shape[0]
    return level, size


def _unwrap(args: Any, level: int) -> tuple[list, list]:
    out, dims = [], []
    for a in args:
        if type(a) is BatchedTensor and a._level == level:
            out.append(a._elem)
            dims.append(0)
        elif type(a) in (list, tuple) and any(type(b) is BatchedTensor and b._level == level for b in a):
            out.append([b._elem if type(b) is BatchedTensor and b._level == level else b for b in a])
            dims.append([0 if type(b) is BatchedTensor and b._level == level else None for b in a])
        else:
            out.append(a)
            dims.append(None)
    return out, dims


def wrap_outputs(out: Any, out_dims: Any, level: int) -> Any:
    if type(out) is torch.Tensor and out_dims == 0:  # the common case: a plain tensor batched at 0
        return wrap(out, level)
    if isinstance(out, torch.Tensor):
        if out_dims is None:
            return out
        if out_dims != 0:
            out = out.movedim(out_dims, 0)
        return add_batch_dim(out, level)
    if isinstance(out, (tuple, list)):
        if not isinstance(out_dims, (tuple, list)):
            out_dims = [out_dims] * len(out)
        return type(out)(wrap_outputs(o, d, level) for o, d in zip(out, out_dims))
    return out


def _requires_grad_in(args: tuple, kwargs: dict) -> bool:
    """Whether a tensor among the arguments (in lists too) requires grad: else autograd records no
    node for the op and engine._gradsum has nothing to note."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif type(a) in (list, tuple):
            for b in a:
                if isinstance(b, torch.Tensor) and b.requires_grad:
                    return True
    for a in kwargs.values():
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    return False


def _note(args: tuple, kwargs: dict, out: Any, level: int) -> None:
    if torch.is_grad_enabled() and _requires_grad_in(args, kwargs):
        _gradsum.note(args, kwargs, out, level)


def _build_plan(func: Any) -> Callable[[tuple, dict], Any]:
    """The plan of `func`, computed once and kept in PLANS."""
    rule = lookup(func) or custom_vmap_rule(func)
    if func in _DATA_DEPENDENT and rule is None:  # a rule may answer for the batch (engine.rules.checks)
        def plan(args: tuple, kwargs: dict) -> Any:
            if _find_level(args, kwargs)[0] is None:
                return func(*args, **kwargs)
            raise _data_dependent(func)
    elif torch.Tag.inplace_view in func.tags:
        plan = functools.partial(_run_inplace_view, func)
    elif _random_out(func):
        def plan(args: tuple, kwargs: dict) -> Any:
            raise _random_out_error(op_name(func))
    elif func in UNSUPPORTED_RANDOM:
        def plan(args: tuple, kwargs: dict) -> Any:
            raise unsupported_random_error(func)
    else:
        plan = _rule_plan(func, op_meta(func), rule)
        if op_meta(func).mutated:
            plan = _checked_writes(plan, op_meta(func).mutated, op_name(func))
    PLANS[func] = plan
    return plan


def _checked_writes(plan: Callable[[tuple, dict], Any], mutated: tuple, name: str) -> Callable[[tuple, dict], Any]:
    """`plan` of an op that writes in place, refusing a write that would show a view made a copy
    under vmap (engine._view_copies). While no such copy lives, the check is one dict's truth test."""
    live = _VIEW_COPIES

    def checked(args: tuple, kwargs: dict) -> Any:
        if live:
            check_writes(args, mutated, name)
        return plan(args, kwargs)

    return checked


def _rule_plan(func: Any, meta: _OpMeta, rule: Any) -> Callable[[tuple, dict], Any]:
    """The plan of an op with (or without) a rule; see the comment above `_find_level`."""
    op = func._op if type(func) is torch._ops.OpOverload else func  # OpOverload.__call__ is exactly ._op
    direct = _same_rank_direct(meta, rule)
    call = (python_binding(func) or op) if direct else op  # the op on the physical arguments
    general = _general_plan(func, meta, rule, op, direct, call)
    return _specialized_plan(general, func, meta, rule, direct, call)


def _same_rank_direct(meta: _OpMeta, rule: Any) -> bool:
    """Whether the op's plan may call it on the physical arguments when their ranks agree.

    Pointwise rules declare that, when every batched argument has the same logical rank (>= 1) and
    no unbatched tensor has a higher one, the rule is the op on the physical arguments (batch at 0).
    Logical rank 0 qualifies only without unbatched tensors: a batched 0-dim tensor is 1-dim
    physically, which would outrank an unbatched 0-dim tensor in type promotion; among batched
    0-dim tensors and Python scalars alone, promotion is the same physically and logically."""
    return bool(getattr(rule, "same_rank_direct", False) and meta.n_returns == 1 and not meta.has_lists
                and not meta.random and meta.mutated in ((), (0,)))


def _general_plan(func: Any, meta: _OpMeta, rule: Any, op: Any, direct: bool,
                  call: Any) -> Callable[[tuple, dict], Any]:
    """The plan for any call of the op: the op itself without a batched argument; `call` on the
    physical arguments where `direct` and their ranks agree; else the rule (or, without one or
    with a batched keyword argument, `_without_rule`)."""
    lists, random, mutated, returns_self = meta.has_lists, meta.random, meta.mutated, meta.returns_self
    gradsum = _gradsum
    # `grad_seen`: an input requires grad (else autograd records no node); `mixed`: some tensor input
    # is not batched at exactly this one level (else every input has the same levels). _gradsum.note
    # records nothing unless both hold, so it is called only then.

    def plan(args: tuple, kwargs: dict) -> Any:
        level, top = 0, None
        for a in args:
            if type(a) is BatchedTensor:
                if a._level > level:
                    level, top = a._level, a
            elif lists and type(a) in (list, tuple):
                for b in a:
                    if type(b) is BatchedTensor and b._level > level:
                        level, top = b._level, b
        kw_batched = False
        if kwargs:
            for v in kwargs.values():
                if type(v) is BatchedTensor and v._level > level:
                    level, top = v._level, v
            kw_batched = any(type(v) is BatchedTensor and v._level == level for v in kwargs.values())
        if top is None:
            return op(*args, **kwargs)
        if gradsum._last or gradsum._urgent:
            gradsum.flush_urgent()
        grad_seen = mixed = False
        if direct and not kwargs:
            nd = top._elem.dim()
            if nd:
                uargs = []
                for a in args:
                    if type(a) is BatchedTensor:
                        if a.requires_grad:
                            grad_seen = True
                        if a._level == level:
                            e = a._elem
                            if e.dim() != nd:
                                break
                            if type(e) is BatchedTensor:
                                mixed = True
                            uargs.append(e)
                            continue
                        if a.dim() >= nd or nd == 1:
                            break
                        mixed = True
                    elif isinstance(a, torch.Tensor):
                        if a.requires_grad:
                            grad_seen = True
                        if a.dim() >= nd or nd == 1:
                            break
                        mixed = True
                    uargs.append(a)
                else:
                    if not mutated or uargs[0] is not args[0]:
                        out = call(*uargs)
                        if returns_self:
                            result = args[0]
                        else:  # engine._batched.wrap, inlined: this is the hottest line of the engine
                            result = _make_wrapper(BatchedTensor, out.shape[1:], None if out.is_contiguous() else out.stride()[1:], None, None, out.dtype, out.layout, out.device, False, False)
                            result._elem = out
                            result._level = level
                        if grad_seen and mixed and torch.is_grad_enabled():
                            gradsum.note(args, kwargs, result, level)
                        return result
                grad_seen = mixed = False
        info = _active.get(level)
        if info is None:  # autograd's backward running after the vmap returned
            info = LevelInfo(level, top._elem.shape[0], "error")
        if random and info.randomness == "error" and _draws(rule, args, kwargs):
            raise _randomness_error(func)
        if rule is None or kw_batched:
            out = _without_rule(func, info, args, kwargs)
            _note(args, kwargs, out, level)
            return out
        uargs, dims = [], []
        for a in args:
            if type(a) is BatchedTensor:
                if a.requires_grad:
                    grad_seen = True
                if a._level == level:
                    e = a._elem
                    if type(e) is BatchedTensor:
                        mixed = True
                    uargs.append(e)
                    dims.append(0)
                    continue
                mixed = True
            elif isinstance(a, torch.Tensor):
                if a.requires_grad:
                    grad_seen = True
                mixed = True
            elif lists and type(a) in (list, tuple):
                mixed = True
                if any(isinstance(b, torch.Tensor) and b.requires_grad for b in a):
                    grad_seen = True
                if any(type(b) is BatchedTensor and b._level == level for b in a):
                    uargs.append([b._elem if type(b) is BatchedTensor and b._level == level else b for b in a])
                    dims.append([0 if type(b) is BatchedTensor and b._level == level else None for b in a])
                    continue
            uargs.append(a)
            dims.append(None)
        if kwargs:
            mixed = True
            if not grad_seen:
                grad_seen = any(isinstance(v, torch.Tensor) and v.requires_grad for v in kwargs.values())
        if mutated and not getattr(rule, "writes_shared", False):  # a rule may do the loop's shared writes itself
            _check_inplace(func, meta, dims)
        out, out_dims = rule(info, dims, *uargs, **kwargs)
        result = args[mutated[0]] if returns_self else wrap_outputs(out, out_dims, level)
        if grad_seen and mixed and torch.is_grad_enabled():
            gradsum.note(args, kwargs, result, level)
        return result

    return plan


def _specialized_plan(general: Callable[[tuple, dict], Any], func: Any, meta: _OpMeta, rule: Any, direct: bool,
                      call: Any) -> Callable[[tuple, dict], Any]:
    """`general` behind a plan specialized to the op's usual calls where it has one: a direct op of
    one or two positional arguments, an op with a rule over one tensor argument."""
    if direct and meta.n_positional == 1:
        return _unary_plan(general, call, meta.returns_self)
    if direct and meta.n_positional == 2:
        return _binary_plan(general, call, meta.returns_self, str(func._schema.arguments[1].type) == "Tensor")
    if rule is not None and not direct and not meta.has_lists and not meta.random and not meta.mutated:
        args = func._schema.arguments
        others = tuple(i for i in range(1, len(args)) if not args[i].kwarg_only and "Tensor" in str(args[i].type))
        return _one_tensor_plan(general, rule, others)
    return general


def _unary_plan(general: Callable[[tuple, dict], Any], call: Any, returns_self: bool) -> Callable[[tuple, dict], Any]:
    """The plan of a pointwise op with one tensor argument (sin, tanh, relu_, ...), the most frequent
    ops of a model: called with one batched tensor and no keyword arguments, it is `call` on the
    physical tensor, rewrapped. One input has the same levels as itself, so engine._gradsum never
    records such a node and is not asked; other calls take the general plan."""
    last, urgent, flush = _gradsum._last, _gradsum._urgent, _gradsum.flush_urgent

    def plan(args: tuple, kwargs: dict) -> Any:
        if kwargs or len(args) != 1:
            return general(args, kwargs)
        a = args[0]
        if type(a) is not BatchedTensor:
            return general(args, kwargs)
        if last or urgent:
            flush()
        out = call(a._elem)
        if returns_self:
            return a
        result = _make_wrapper(BatchedTensor, out.shape[1:], None if out.is_contiguous() else out.stride()[1:], None, None, out.dtype, out.layout, out.device, False, False)
        result._elem = out
        result._level = a._level
        return result

    return plan


# Python numbers as the second operand of a Tensor-Tensor op (`x * 1.5` reaches the engine as
# mul.Tensor(x, 1.5): torch wrapped the number in a tensor and unwrapped it for Python). Handing the
# number back to the op's binding makes torch wrap it again on every op (issue #18); a cached
# 0-dim tensor of the other operand's dtype computes the same thing, bit for bit, where:
# - that dtype is float32 or float64: the result dtype is that dtype either way, and the kernel reads
#   the wrapped number cast to it, which is the cached tensor's value (half and bfloat16 read a
#   wrapped number in float: not the same);
# - the number is a float other than 0.0/-0.0 (equal keys with different signs) and NaN (a key that
#   never matches), or an int that the dtype holds exactly; never a bool;
# - the other operand is a plain strided CPU tensor that does not require grad (the cached tensor
#   is never saved for a backward pass, which an inference-mode tensor could not be).
# tests/test_hot_path.py checks the results against torch.func bit for bit.
_SCALAR_EXACT = {torch.float32: 2 ** 24, torch.float64: 2 ** 53}
_SCALARS: dict[Any, dict] = {dtype: {} for dtype in _SCALAR_EXACT}
_SCALARS_KEPT = 256  # per dtype; the cache starts over when full


def _scalar_operand(b: Any, e: torch.Tensor) -> Any:
    """The cached 0-dim tensor that stands for the Python number `b` beside `e`, or None."""
    cache = _SCALARS.get(e.dtype)
    if cache is None or type(e) is not torch.Tensor or not e.is_cpu or e.layout is not torch.strided or e.requires_grad:
        return None
    kind = type(b)
    if kind is float:
        if b == 0.0 or b != b:
            return None
    elif kind is not int or abs(b) > _SCALAR_EXACT[e.dtype]:
        return None
    t = cache.get(b)
    if t is None:
        if len(cache) >= _SCALARS_KEPT:
            cache.clear()
        # Made outside any dispatch mode: under engine.trace's recording it is then a captured
        # constant, as it is for every later recording that finds it cached, so the recordings of
        # one function give one graph (and one key in the fused tier's disk index).
        with _disable_current_modes(), torch.inference_mode(False), torch.no_grad():
            t = cache[b] = torch.tensor(b, dtype=e.dtype)
    return t


def _binary_plan(general: Callable[[tuple, dict], Any], call: Any, returns_self: bool, tensor_other: bool) -> Callable[[tuple, dict], Any]:
    """The plan of a pointwise op with two operands (mul, add, sub_, ...) for its two most frequent
    calls, without keyword arguments: a batched tensor with a Python scalar (one tensor: nothing for
    engine._gradsum; passed as a cached 0-dim tensor where `tensor_other`, the op taking a Tensor
    there, and `_scalar_operand` has one), and two tensors batched at the same level with the same
    rank (engine._gradsum asked only when their inner levels differ). Other calls take the general
    plan."""
    last, urgent, flush, note = _gradsum._last, _gradsum._urgent, _gradsum.flush_urgent, _gradsum.note
    is_grad_enabled = torch.is_grad_enabled
    scalar = _scalar_operand if tensor_other else None

    def plan(args: tuple, kwargs: dict) -> Any:
        if kwargs or len(args) != 2:
            return general(args, kwargs)
        a, b = args
        if type(a) is not BatchedTensor:
            return general(args, kwargs)
        level = a._level
        ea = a._elem
        if type(b) is BatchedTensor:
            eb = b._elem
            if b._level != level or eb.dim() != ea.dim():
                return general(args, kwargs)
        elif isinstance(b, torch.Tensor):
            return general(args, kwargs)
        else:
            eb = None
        if last or urgent:
            flush()
        if eb is not None:
            out = call(ea, eb)
        else:
            other = scalar(b, ea) if scalar is not None else None
            out = call(ea, b if other is None else other)
        if returns_self:
            result = a
        else:
            result = _make_wrapper(BatchedTensor, out.shape[1:], None if out.is_contiguous() else out.stride()[1:], None, None, out.dtype, out.layout, out.device, False, False)
            result._elem = out
            result._level = level
        if (eb is not None and (type(ea) is BatchedTensor or type(eb) is BatchedTensor)
                and (a.requires_grad or b.requires_grad) and is_grad_enabled()):
            note(args, kwargs, result, level)
        return result

    return plan


def _one_tensor_plan(general: Callable[[tuple, dict], Any], rule: Any, others: tuple[int, ...]) -> Callable[[tuple, dict], Any]:
    """The plan of an out-of-place op with a rule (views, reductions, shape ops: transpose, view,
    unsqueeze, sum.dim_IntList, ...) for its most frequent call: one batched tensor first, no other
    tensor (`others`: the positions where the schema allows one), no keyword arguments. A rule with
    a `physical` (engine.rules._helpers.physical_rule, reductions' dim shortcut) is called on the
    physical tensor directly; else the rule runs with in_dims [0, None, ...]. One tensor input has
    the same levels as itself, so engine._gradsum is not asked. Other calls take the general plan."""
    last, urgent, flush = _gradsum._last, _gradsum._urgent, _gradsum.flush_urgent
    physical = getattr(rule, "physical", None)

    def plan(args: tuple, kwargs: dict) -> Any:
        if kwargs or not args:
            return general(args, kwargs)
        a = args[0]
        if type(a) is not BatchedTensor:
            return general(args, kwargs)
        n = len(args)
        for i in others:
            if i < n and isinstance(args[i], torch.Tensor):
                return general(args, kwargs)
        if last or urgent:
            flush()
        level = a._level
        out, out_dims = NotImplemented, 0
        if physical is not None:
            out = physical(a._elem, *args[1:])
        if out is NotImplemented:
            info = _active.get(level)
            if info is None:  # autograd's backward running after the vmap returned
                info = LevelInfo(level, a._elem.shape[0], "error")
            out, out_dims = rule(info, [0] + [None] * (n - 1), a._elem, *args[1:])
        if type(out) is torch.Tensor and out_dims == 0:
            result = _make_wrapper(BatchedTensor, out.shape[1:], None if out.is_contiguous() else out.stride()[1:], None, None, out.dtype, out.layout, out.device, False, False)
            result._elem = out
            result._level = level
            return result
        return wrap_outputs(out, out_dims, level)

    return plan


def batched_dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run `func` on arguments some of which are batched: the op's plan (built on first use)."""
    plan = PLANS.get(func)
    if plan is None:
        plan = _build_plan(func)
    return plan(args, kwargs)


_NO_KWARGS: dict = {}  # shared empty kwargs: plans and rules never mutate their kwargs


def _torch_dispatch(cls: type, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
    plan = PLANS.get(func)
    if plan is None:
        plan = _build_plan(func)
    return plan(args, kwargs or _NO_KWARGS)


install_dispatch(_torch_dispatch)


def _without_rule(func: Any, info: LevelInfo, args: tuple, kwargs: dict) -> Any:
    """An op without a rule (or with a batched keyword argument): a custom op's own implementation,
    else its decomposition, else the for-loop fallback. An out= variant is refused first (`_check_out`)."""
    _check_out(func, info.level, kwargs)
    if not op_meta(func).mutated:
        custom = run_custom_op(func, args, kwargs)
        if custom is not NotImplemented:
            return custom
        decomposed = _try_decomposition(func, args, kwargs, info)
        if decomposed is not NotImplemented:
            return decomposed
    else:
        written = _inplace_by_twin(func, info, args, kwargs)
        if written is not NotImplemented:
            return written
    return fallback(func, info, args, kwargs)


def _check_out(func: Any, level: int, kwargs: dict) -> None:
    """Refuse an out= variant called with an out= tensor while an input is batched."""
    meta = op_meta(func)
    for name in meta.out_names:
        out = kwargs.get(name)
        if isinstance(out, torch.Tensor):
            # Refused whether or not `out` is batched, as torch.func refuses it: an unbatched out= would
            # take every element's write into the same memory, and a batched one is resized per element
            # when the result's shape differs (a slice of the batch resized over its neighbours' memory).
            batched = type(out) is BatchedTensor and out._level == level
            why = ("each element's result would be resized inside the batched out= tensor" if batched else
                   "it is not batched, so each batch element would write into the same memory")
            raise VmapError(
                f"vmap: {op_name(func)} writes its result into out= ({name!r}) while an input is batched: {why}. "
                f"Call the op without out= and use its result (torch.func refuses out= ops under vmap too)."
            )


def _inplace_by_twin(func: Any, info: LevelInfo, args: tuple, kwargs: dict) -> Any:
    """`x.foo_(...)` without a rule of its own as `x.copy_(foo(x, ...))`, both batched by their
    rules (copysign_, mish_, threshold_, index_fill_, scatter_reduce_): torch.func batches these
    in place too. Only where that is exactly the in-place op: self is batched at this level (else
    the check refuses, as the fallback would), nothing is random, and the out-of-place result has
    self's logical shape and dtype (else the fallback runs the op and raises the op's own error)."""
    meta = op_meta(func)
    if meta.mutated != (0,) or not meta.returns_self or meta.random:
        return NotImplemented
    twin = out_of_place_view(func)
    if twin is None or (lookup(twin) is None and _decomposition_for(twin) is None):
        return NotImplemented
    self = args[0]
    if type(self) is not BatchedTensor or self._level != info.level:
        return NotImplemented
    result = twin(*args, **kwargs)
    if not isinstance(result, torch.Tensor) or result.shape != self.shape or result.dtype != self.dtype:
        return NotImplemented
    return self.copy_(result)


def _draws(rule: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a call of an op tagged random draws: its rule may know that this one does not
    (attention with dropout_p=0, engine.rules.attention)."""
    deterministic = getattr(rule, "deterministic_when", None)
    return deterministic is None or not deterministic(args, kwargs)


def _run_inplace_view(func: Any, args: tuple, kwargs: dict) -> Any:
    level = _find_level(args, kwargs)[0]
    if level is None:
        return func(*args, **kwargs)
    if _gradsum._last or _gradsum._urgent:
        _gradsum.flush_urgent()
    out = _inplace_view(func, args, kwargs)
    _note(args, kwargs, out, level)
    return out


def _inplace_view(func: Any, args: tuple, kwargs: dict) -> Any:
    """squeeze_/unsqueeze_/transpose_/t_/...: run the out-of-place view, then retarget `self`.

    The wrapper's own sizes are updated the way PyTorch's wrapper subclasses do it: by running the
    op on the wrapper itself with dispatch disabled and meta kernels selected.
    """
    self = args[0]
    if type(self) is not BatchedTensor or self._level != _find_level(args, kwargs)[0]:
        raise VmapError(f"vmap: {op_name(func)} changes the shape of an unbatched tensor in place inside vmap; use the out-of-place op.")
    out_of_place = out_of_place_view(func)
    if out_of_place is None:
        raise VmapError(f"vmap: {op_name(func)} has no out-of-place twin to batch it with; use an out-of-place view op.")
    result = batched_dispatch(out_of_place, args, kwargs)
    new = result._elem
    # A view that changed nothing (squeeze_ of no size-1 dim) keeps the physical tensor itself, so a
    # returned input is still recognised as the caller's tensor when vmap exits.
    if not (new.shape == self._elem.shape and new.stride() == self._elem.stride()
            and new.storage_offset() == self._elem.storage_offset()):
        self._elem = new
    with torch.utils._mode_utils.no_dispatch():
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            func(*args, **kwargs)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)
    return self


def _check_inplace(func: Any, meta: _OpMeta, dims: list) -> None:
    if any(d is not None for d in dims) and any(dims[i] is None for i in meta.mutated):
        raise VmapError(
            f"vmap: {op_name(func)} writes in place into a tensor that is not batched (argument "
            f"{func._schema.arguments[meta.mutated[0]].name!r}) with a batched value. Each batch element "
            f"would write into the same memory. Use the out-of-place op instead (e.g. `x = x.add(y)` "
            f"instead of `x.add_(y)`), or make the written tensor batched."
        )


def _data_dependent(func: Any) -> DataDependentError:
    return DataDependentError(
        f"vmap: {op_name(func)} needs the value of a batched tensor in Python (e.g. `.item()`, "
        f"`if tensor:`, `float(tensor)`), which differs per batch element. Data-dependent Python control "
        f"flow cannot be vmapped: use tensor ops such as torch.where instead."
    )


def _random_out(func: Any) -> bool:
    """A random op's out= variant (randn.out, normal.Tensor_Tensor_out)."""
    return torch.Tag.nondeterministic_seeded in func.tags and any(a.is_out for a in func._schema.arguments)


def _random_out_error(name: str) -> RandomnessError:
    """`name`: the op (aten::randn.out) or torch function (torch.randn) called with out=."""
    return RandomnessError(
        f"vmap: we do not yet support calling out variants of random operations inside of vmap ({name}): "
        f"an unbatched out= tensor holds one draw for the whole batch (not one per element under randomness="
        f"'different'), and a batched one would be resized per element; torch.func refuses them in every "
        f"randomness mode. Call the op without out= and use its result (or copy it into the tensor outside vmap)."
    )


def _randomness_error(func: Any) -> RandomnessError:
    return RandomnessError(
        f"vmap: called random operation while in randomness error mode ({op_name(func)}). Please either use the "
        f"'same' or 'different' randomness flags on vmap or perform the randomness operation out of vmap "
        f"('different': independent draws per batch element; 'same': one draw for the whole batch)."
    )


# Decomposition: prefer running a composite op as its parts (each batched by a rule) to looping.
@lru_cache(maxsize=None)
def _decomposition_for(func: Any) -> Any:
    """A composite op's C++ decomposition (engine._modes.composite_kernel), else torch's Python one."""
    kernel = composite_kernel(func)
    if kernel is not None:
        return kernel
    from torch._decomp import decomposition_table

    return decomposition_table.get(func)


class _DecompositionFailed(Exception):
    pass


def _try_decomposition(func: Any, args: tuple, kwargs: dict, info: LevelInfo) -> Any:
    """`func` run as its parts, each batched by its rule; NotImplemented where it has no
    decomposition or the decomposition fails (the fallback then decides). The parts run under the
    level's VmapMode, as the op's own call did: without a mode, torch dispatches each part on the
    batched tensor by its subclass, which first asks whether it is a DTensor and so imports
    torch.distributed.tensor (with sympy, a third of a second) at the first."""
    decomp = _decomposition_for(func)
    if decomp is None:
        return NotImplemented
    _check_arguments(func, args, kwargs, info.level)
    _DecompGuard.depth += 1
    try:
        if _DecompGuard.depth > 8:  # a decomposition that calls itself back: give up on decomposing
            return NotImplemented
        with VmapMode(info):
            out = decomp(*args, **kwargs)
    except (FallbackError, DataDependentError, RandomnessError):
        raise
    except Exception:  # noqa: BLE001 - the loop below raises the real error if there is one
        return NotImplemented
    finally:
        _DecompGuard.depth -= 1
    return out


class _DecompGuard:
    depth = 0


# Signatures (op, argument shapes/dtypes, other arguments) whose per-element call the op accepts.
_ACCEPTED: set = set()
_ACCEPTED_KEPT = 4096


def _signature(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype, x.device.type)
    if type(x) in (list, tuple):
        return tuple(_signature(b) for b in x)
    return x if isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)) else repr(x)


def _check_arguments(func: Any, args: tuple, kwargs: dict, level: int) -> None:
    """Raise the op's own error when the per-element call is one the op refuses.

    A decomposition checks less than the op (index_add's decomposition broadcasts a source of the
    wrong shape where index_add refuses it), so running it on the batch would answer silently
    where every element's call raises. The op itself runs once on the first element of each new
    signature (op, shapes, dtypes, other arguments; meta kernels skip some of these checks), and
    its error, if it raises one, is raised. Random ops are not run (the check would draw)."""
    if op_meta(func).random:
        return
    try:
        key = (func, _signature(args), _signature(tuple(sorted(kwargs.items()))))
        hash(key)
    except TypeError:
        return
    if key in _ACCEPTED:
        return
    if _find_level(args, kwargs)[1]:
        func(*_slice(args, 0, level), **_slice_kwargs(kwargs, 0, level))
    if len(_ACCEPTED) >= _ACCEPTED_KEPT:
        _ACCEPTED.clear()
    _ACCEPTED.add(key)


# ---------------------------------------------------------------------------------------------
# the for-loop fallback


def _slice(x: Any, i: int, level: int) -> Any:
    if type(x) is BatchedTensor and x._level == level:
        return x._elem[i]
    if type(x) in (list, tuple):
        return type(x)(_slice(b, i, level) for b in x)
    return x


def fallback(func: Any, info: LevelInfo, args: tuple, kwargs: dict) -> Any:
    """Run `func` once per batch element and stack: correct for any op, slow for all of them."""
    meta = op_meta(func)
    if not meta.returns_tensors:
        raise _data_dependent(func)
    _note_fallback(func)
    level = info.level
    size = _find_level(args, kwargs)[1]
    if meta.mutated:
        dims = [0 if (type(a) is BatchedTensor and a._level == level) else None for a in args]
        _check_inplace(func, meta, dims)
    same = meta.random and info.randomness == "same"
    rng = _RngReplay(args, kwargs.get("generator")) if same else None
    results = []
    for i in range(size):
        if rng is not None:
            rng.restore()
        results.append(func(*_slice(args, i, level), **_slice_kwargs(kwargs, i, level)))
    if meta.returns_self:
        return args[meta.mutated[0]]
    out = _stack_results(results, level)
    if _returns_view(func):
        _note_stacked_views(func, args, out, level)
    return out


def _returns_view(func: Any) -> bool:
    """Whether `func` returns a view of an input (a return aliased, not written: `Tensor(a)`)."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def _note_stacked_views(func: Any, args: tuple, out: Any, level: int) -> None:
    """The fallback's result of a view op is a stack of per-element views: a copy where torch.func
    has a view. Recorded as such (engine._view_copies), so in-place writes that would show it raise."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    bases = [a for a in args if type(a) is BatchedTensor and a._level == level]
    for o in outs:
        if isinstance(o, torch.Tensor):
            for b in bases:
                note_copy(o, b, f"{op_name(func)} (run per element by the for-loop fallback)")


def _slice_kwargs(kwargs: dict, i: int, level: int) -> dict:
    return {k: _slice(v, i, level) for k, v in kwargs.items()} if kwargs else kwargs


def _stack_results(results: list, level: int) -> Any:
    first = results[0]
    if isinstance(first, torch.Tensor):
        return add_batch_dim(torch.stack(results), level)
    if isinstance(first, (tuple, list)):
        return type(first)(_stack_results([r[j] for r in results], level) for j in range(len(first)))
    if first is None:
        return None
    raise DataDependentError(f"vmap: an op returned a non-tensor value ({type(first).__name__}) inside vmap; it depends on the data.")


class _RngReplay:
    """Replays the same random stream for each batch element (randomness='same' in the fallback)."""

    def __init__(self, args: Any, generator: Any = None):
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        # an explicit generator= draws from its own stream, which must be replayed too
        self.generator = generator
        self.generator_state = generator.get_state() if generator is not None else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda)
        if self.generator is not None:
            self.generator.set_state(self.generator_state)


# ---------------------------------------------------------------------------------------------
# the mode: ops that see no batched argument (random factories) inside vmap


# Uninitialized tensors made inside the vmapped function: per element under randomness='different'
# (engine.rules.random_ops.fresh_per_element).
_FRESH = {aten.empty_like.default, aten.empty.memory_format, aten.new_empty.default}


# Ops without a batched argument reach the mode too (a closed-over weight's `t`, which a composite
# op such as linear calls above the Python key). Per op, once: `_SPECIAL` for the ops the mode must
# look at (random draws, fresh-memory factories), else the op's raw callable (`OpOverload._op`,
# what `OpOverload.__call__` runs, without its Python frame and the per-call tag scan).
_SPECIAL = object()
_PLAIN: dict[Any, Any] = {}


def _plain_call(func: Any) -> Any:
    special = func in _FRESH or torch.Tag.nondeterministic_seeded in func.tags
    call = _SPECIAL if special else (func._op if type(func) is torch._ops.OpOverload else func)
    if call is not _SPECIAL and type(func) is torch._ops.OpOverload and op_meta(func).mutated:
        call = _checked_plain(call, op_meta(func).mutated, op_name(func))
    _PLAIN[func] = call
    return call


def _checked_plain(call: Any, mutated: tuple, name: str) -> Any:
    """`call` of an op writing in place into unbatched tensors inside vmap (a closed-over tensor,
    the caller's input itself), refusing a write into the base of a view made a copy under vmap
    (engine._view_copies): `x.add_(1)` while the batched `x_i.conj()` lives."""
    live = _VIEW_COPIES

    def checked(*args: Any, **kwargs: Any) -> Any:
        if live:
            check_writes(args, mutated, name)
        return call(*args, **kwargs)

    return checked


class BatchedRoute(EngineMode):
    """Routes ops on batched tensors to their plans while no vmap level is alive: a backward pass
    through nodes a returned vmap recorded (engine.transforms.autograd_vjp). Without a mode, torch
    dispatches them by subclass, whose check for DTensor imports torch.distributed.tensor (with
    sympy, a third of a second) at its first use; the plan is the same either way."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if BatchedTensor in types:
            return _torch_dispatch(BatchedTensor, func, types, args, kwargs)
        return func(*args, **(kwargs or _NO_KWARGS))


class VmapMode(EngineMode):
    """Active while a vmapped function runs; decides what random ops without batched inputs do."""

    def __init__(self, info: LevelInfo):
        super().__init__()
        self.info = info

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or _NO_KWARGS
        if BatchedTensor in types:
            plan = PLANS.get(func)
            if plan is None:
                plan = _build_plan(func)
            return plan(args, kwargs)
        call = _PLAIN.get(func)
        if call is None:
            call = _plain_call(func)
        if call is not _SPECIAL:  # neither random nor a fresh-memory factory: the op itself
            return call(*args, **kwargs)
        if _VIEW_COPIES and op_meta(func).mutated:  # a random fill in place (normal_) of an unbatched tensor
            check_writes(args, op_meta(func).mutated, op_name(func))
        if func in _FRESH and self.info.randomness == "different":
            return fresh_per_element(func, self.info, args, kwargs)
        if func in UNSUPPORTED_RANDOM:
            raise unsupported_random_error(func)
        if torch.Tag.nondeterministic_seeded in func.tags and _draws(lookup(func), args, kwargs):
            if _random_out(func):
                raise _random_out_error(op_name(func))
            randomness = self.info.randomness
            if randomness == "error":
                raise _randomness_error(func)
            if randomness == "different":
                return draw_unbatched(func, self.info, args, kwargs)
        return func(*args, **kwargs)
