"""`engine.vmap`: argument checking, entering/leaving a level, chunking."""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils._pytree import _broadcast_to_and_flatten, tree_flatten, tree_unflatten

from engine._batched import BatchedTensor, enter, is_batched_at, leave, pop_level, push_level
from engine._dispatch import VmapMode
from engine._guards import checked, transform_scope
from engine._random_out import random_out_refusal
from engine.errors import OutDimError, VmapError
from engine.rules.rnn import batched_initial_state

_RANDOMNESS = ("error", "different", "same")


def vmap(
    func: Callable,
    in_dims: Any = 0,
    out_dims: Any = 0,
    randomness: str = "error",
    *,
    chunk_size: int | None = None,
) -> Callable:
    """Vectorize `func` over a batch dimension: `vmap(f)(x) == torch.stack([f(x[i]) for i in range(B)])`.

    `in_dims`/`out_dims` are an int, None, or a pytree prefix of the positional args/outputs
    (negative dims allowed); keyword arguments are passed unmapped. `randomness` is 'error',
    'different' or 'same'. `chunk_size` splits the batch into chunks run one after another (less
    peak memory); `chunk_size=1` runs a plain Python loop.
    """
    if randomness not in _RANDOMNESS:
        raise VmapError(f"vmap: randomness must be one of {_RANDOMNESS}, got {randomness!r}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise VmapError(f"vmap: chunk_size should be None or a positive integer, got {chunk_size!r}")
    if not callable(func):
        raise VmapError(f"vmap: func must be callable, got {type(func).__name__}")

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        flat_dims = _tensor_in_dims(in_dims, args)
        if flat_dims is not None:  # every argument a tensor: args is its own flat list (no pytree walk)
            flat_args, spec = list(args), None
        else:
            flat_args, spec = tree_flatten(args)
            flat_dims = _flat_in_dims(func, in_dims, args, spec)
        size = _batch_size(func, flat_args, flat_dims)
        if chunk_size is None or chunk_size >= size:
            return _vmap_call(func, flat_args, flat_dims, spec, size, out_dims, randomness, kwargs)
        return _chunked(func, flat_args, flat_dims, spec, size, out_dims, randomness, kwargs, chunk_size)

    return wrapped


def _fname(func: Callable) -> str:
    return getattr(func, "__name__", repr(func))


def _tensor_in_dims(in_dims: Any, args: tuple) -> list | None:
    """The flat in_dims when every positional argument is a tensor and in_dims is an int, None or a
    flat tuple of those of matching length (the common call: no pytree to walk); else None."""
    for a in args:
        if not isinstance(a, torch.Tensor):
            return None
    if in_dims is None or type(in_dims) is int:
        return [in_dims] * len(args)
    if type(in_dims) is tuple and len(in_dims) == len(args) and all(d is None or type(d) is int for d in in_dims):
        return list(in_dims)
    return None


def _flat_in_dims(func: Callable, in_dims: Any, args: tuple, spec: Any) -> list:
    # A top-level list is refused as torch.func refuses it: the positional arguments are a tuple,
    # so a list prefix would only match by a conversion torch.func does not make (and a list
    # argument's in_dims is then ambiguous). Lists deeper in the tree match list arguments.
    if not isinstance(in_dims, (int, tuple)) and in_dims is not None:
        hint = f" Pass a tuple: in_dims={tuple(in_dims)!r}." if isinstance(in_dims, list) else ""
        raise VmapError(
            f"vmap({_fname(func)}, in_dims={in_dims!r}, ...): expected `in_dims` to be int or a (potentially "
            f"nested) tuple matching the structure of inputs, got: {type(in_dims).__name__}.{hint}"
        )
    if isinstance(in_dims, tuple) and len(in_dims) != len(args):
        raise VmapError(
            f"vmap({_fname(func)}, in_dims={in_dims!r}, ...)(<inputs>): in_dims is not compatible with the "
            f"structure of `inputs`: in_dims has {len(in_dims)} elements but there are {len(args)} positional inputs."
        )
    flat = _broadcast_to_and_flatten(in_dims, spec)
    if flat is None:
        raise VmapError(
            f"vmap({_fname(func)}, in_dims={in_dims!r}, ...)(<inputs>): in_dims is not compatible with the "
            f"structure of `inputs`. in_dims must be a pytree prefix of the inputs' structure {spec}."
        )
    return flat


def _batch_size(func: Callable, flat_args: list, flat_dims: list) -> int:
    sizes = []
    for i, (a, d) in enumerate(zip(flat_args, flat_dims)):
        if d is None:
            continue
        if not isinstance(d, int):
            raise VmapError(f"vmap({_fname(func)}, ...): in_dims entries must be int or None, got {d!r} for input {i}.")
        if not isinstance(a, torch.Tensor):
            raise VmapError(
                f"vmap({_fname(func)}, in_dims=..., ...)(<inputs>): Got in_dim={d} for an input but the input is of "
                f"type {type(a).__name__}. We cannot vmap over non-Tensor arguments, please use None as the "
                f"respective in_dim."
            )
        if not -a.dim() <= d < a.dim():
            raise VmapError(
                f"vmap({_fname(func)}, in_dims=..., ...)(<inputs>): Got in_dim={d} for some input, but that input is a "
                f"Tensor of dimensionality {a.dim()} so expected in_dim to satisfy -{a.dim()} <= in_dim < {a.dim()}."
            )
        sizes.append((i, a.shape[d]))
    if not sizes:
        raise VmapError(
            f"vmap({_fname(func)}, in_dims=..., ...)(<inputs>): At least one of the inputs must be a Tensor mapped "
            f"over a dimension (in_dims was None for every input, or there are no tensor inputs)."
        )
    if len({s for _, s in sizes}) > 1:
        detail = ", ".join(f"input {i} has size {s}" for i, s in sizes)
        raise VmapError(
            f"vmap({_fname(func)}, in_dims=..., ...)(<inputs>): Expected all tensors to have the same size in the "
            f"mapped dimension, got sizes {[s for _, s in sizes]} for the mapped dimension ({detail})."
        )
    return sizes[0][1]


def _vmap_call(func, flat_args, flat_dims, spec, size, out_dims, randomness, kwargs):
    info = push_level(size, randomness)
    try:
        batched = [
            a if d is None else enter(a if d % a.dim() == 0 else a.movedim(d, 0), info.level, size)
            for a, d in zip(flat_args, flat_dims)
        ]
        for b, a, d in zip(batched, flat_args, flat_dims):
            if d is not None and d % a.dim():
                b._vb_shown = (b._elem, a, d % a.dim())  # printed as the caller gave it (engine._repr)
        with VmapMode(info), transform_scope(is_vmap=True), batched_initial_state(), random_out_refusal(randomness):
            out = checked(func)(*(batched if spec is None else tree_unflatten(batched, spec)), **kwargs)
        entries = {id(b): a for b, a in zip(batched, flat_args) if b is not a}
        return _unwrap_outputs(func, out, out_dims, info.level, size, entries)
    finally:
        pop_level(info)


def _unwrap_outputs(func, out, out_dims, level, size, entries=None):
    if type(out_dims) is int and isinstance(out, torch.Tensor):  # one tensor out: no pytree walk
        return _unwrap_one(func, 0, out, out_dims, level, size, entries)
    flat_out, out_spec, flat_dims = _out_dims_for(func, out, out_dims)
    result = [_unwrap_one(func, i, o, d, level, size, entries) for i, (o, d) in enumerate(zip(flat_out, flat_dims))]
    return tree_unflatten(result, out_spec)


def _unwrap_one(func, i, o, d, level, size, entries=None):
    """Output `i` of the vmapped function with its batch moved to out_dim `d` (None: unbatched);
    `entries` maps id(batched entry) -> the input it entered as (for view identity)."""
    if not isinstance(o, torch.Tensor):
        if d is not None:
            raise VmapError(
                f"vmap({_fname(func)}, ...): `{_fname(func)}` returned a {type(o).__name__} at output {i}; only "
                f"tensors can be batched. Return a tensor, or pass out_dims=None for that output."
            )
        return o
    if d is None:
        if is_batched_at(o, level):
            raise VmapError(
                f"vmap({_fname(func)}, ..., out_dims=None)(<inputs>): output {i} is batched (it depends on a "
                f"mapped input), so it has no single value to return with out_dims=None. Use an int out_dim."
            )
        return o
    if not isinstance(d, int):
        raise VmapError(f"vmap({_fname(func)}, ...): out_dims entries must be int or None, got {d!r}.")
    nd = o.dim() + 1
    if not -nd <= d < nd:
        raise OutDimError(
            f"vmap({_fname(func)}, ..., out_dims={d}): Dimension out of range: output {i} has {nd} dims (batch "
            f"dim included), so out_dim must satisfy -{nd} <= out_dim < {nd}."
        )
    base = _view_source(o, entries) if entries and type(o) is BatchedTensor else None
    if base is None and entries and id(o) in entries and o._version == 0:
        a = entries[id(o)]
        if o._elem is a and d % nd == 0:
            return a  # the input itself, returned untouched: torch.func returns that tensor too
        if type(a) is torch.Tensor and type(o._elem) is torch.Tensor and _same_geometry(o._elem.movedim(0, d), a):
            return a  # the same, entered at another dim and asked back at it (Tensor.contiguous returned self)
    if base is not None and o._elem is base._elem and base._version == 0 and d % nd == 0 and o._level == level:
        a = entries[id(base)]
        if base._elem is a:
            # A view op whose rule handed back the input's physical tensor (transpose of a 0-dim
            # element): the result is the input itself, as torch.func returns it (`result is x`),
            # with or without gradients (the graph in between is the identity).
            return a
    t = leave(o, level, size)
    if base is not None:
        a = entries[id(base)]
        t = _as_view_of_input(t, a, base)
        if type(t) is BatchedTensor and type(a) is BatchedTensor:
            # Batched at an outer level: a view made here is recorded nowhere the outer vmap looks
            # (its ops ran below autograd's view tracking), so the relation is kept on the wrapper
            # for `_view_source` of the outer vmap, which re-views the plain result there.
            t._vb_view_of = a
    return t if d % nd == 0 else t.movedim(0, d)


def _same_geometry(t: torch.Tensor, a: torch.Tensor) -> bool:
    """Whether `t` is `a`'s memory with `a`'s sizes, strides and offset (the same tensor seen twice)."""
    return (t.shape == a.shape and t.stride() == a.stride() and t.storage_offset() == a.storage_offset()
            and t.dtype == a.dtype and torch._C._is_alias_of(t, a))


def _view_source(o: torch.Tensor, entries: dict) -> Any:
    """The batched entry (a key of `entries`) that `o` is a view of, or None: `o._base`, or the
    relation an inner vmap recorded on a wrapper it returned (`_vb_view_of`), followed through
    views of views (a movedim for out_dims, an inner vmap's result viewed again here)."""
    b = o._base if o._base is not None else getattr(o, "_vb_view_of", None)
    for _ in range(16):
        if b is None or id(b) in entries:
            return b
        b = b._base if b._base is not None else getattr(b, "_vb_view_of", None)
    return None


def _as_view_of_input(t: torch.Tensor, a: torch.Tensor, entry: torch.Tensor) -> torch.Tensor:
    """`t`, an output whose logical tensor is a view of input `a` (made by view ops from `entry`, the
    batched tensor `a` entered as), as a view of `a` itself: `result._base is a` (or `a`'s own base)
    as under torch.func.

    Rules run inside __torch_dispatch__, where PyTorch records no views (ADInplaceOrView is above
    it): the physical result shares `a`'s memory but has no `_base` and its own version counter,
    so an in-place write through it would escape autograd's checks on `a`. The same memory is
    re-viewed here, outside dispatch, with the result's sizes, strides and offset (no copy). When
    gradients flow, the fresh view's graph (as_strided of `a`) is the output's exact derivative as
    long as nothing was written in place into `entry` or its views (its version is still 0); else,
    and for other dtypes or conj/neg bits, the result is left as is.
    """
    if type(t) is not torch.Tensor or type(a) is not torch.Tensor:
        return t
    grad = torch.is_grad_enabled() and (t.requires_grad or a.requires_grad)
    if grad:
        if entry._version != 0:
            return t
    elif t._base is not None and t is not a:  # already a recorded view (of the entry's movedim, or an expansion)
        return t
    if t is a:  # a view op whose rule returned the input's own memory (squeeze of a 0-dim element)
        return a.view_as(a)
    if not (torch._C._is_alias_of(t, a) and a.is_conj() == t.is_conj() and a.is_neg() == t.is_neg()
            and a.device == t.device):
        return t
    if a.dtype == t.dtype:
        return a.as_strided(t.shape, t.stride(), t.storage_offset())
    if grad:  # a dtype-changing view (real, imag, view_as_real/complex) is re-viewed without gradients only
        return t
    return _dtype_view_of(a, t)


def _dtype_view_of(a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """`t`, a real view of complex `a`'s memory (torch.real, imag, view_as_real) or a complex view of
    real `a`'s (view_as_complex), as a view of `a`: `a`'s whole storage viewed flat and
    reinterpreted by view_as_real/view_as_complex (views that keep `_base`), then strided as `t`
    is. Other dtype pairs, or a storage the pairing does not fit, leave `t` as is."""
    n = a.untyped_storage().nbytes() // a.element_size()
    try:
        if a.is_complex() and t.dtype == a.dtype.to_real():
            flat = torch.view_as_real(a.as_strided((n,), (1,), 0)).flatten()
        elif t.is_complex() and a.dtype == t.dtype.to_real() and n % 2 == 0:
            flat = torch.view_as_complex(a.as_strided((n // 2, 2), (2, 1), 0))
        else:
            return t
        return flat.as_strided(t.shape, t.stride(), t.storage_offset())
    except RuntimeError:
        return t


def _chunked(func, flat_args, flat_dims, spec, size, out_dims, randomness, kwargs, chunk_size):
    starts = range(0, size, chunk_size)
    if chunk_size == 1:
        # A plain loop: each element called on its own and stacked, no batching machinery.
        parts = [
            _call_single(func, flat_args, flat_dims, spec, i, kwargs)
            for i in range(size)
        ]
        return _stack_parts(func, parts, out_dims, size)
    parts = []
    for s in starts:
        chunk_args = [a if d is None else a.narrow(d, s, min(chunk_size, size - s)) for a, d in zip(flat_args, flat_dims)]
        parts.append(_vmap_call(func, chunk_args, flat_dims, spec, min(chunk_size, size - s), out_dims, randomness, kwargs))
    return _cat_parts(func, parts, out_dims)


def _call_single(func, flat_args, flat_dims, spec, i, kwargs):
    args = [a if d is None else a.select(d, i) for a, d in zip(flat_args, flat_dims)]
    with transform_scope(is_vmap=True):
        return func(*(args if spec is None else tree_unflatten(args, spec)), **kwargs)


def _out_dims_for(func, out, out_dims):
    """The outputs flattened, their spec, and one out_dim per output. out_dims is a pytree prefix
    of the outputs (a list matches a list output only, as in torch.func); a function returning one
    tensor also accepts a 1-tuple `(d,)`, as torch.func does."""
    flat, out_spec = tree_flatten(out)
    if isinstance(out, torch.Tensor) and type(out_dims) is tuple and len(out_dims) == 1:
        out_dims = out_dims[0]
    dims = _broadcast_to_and_flatten(out_dims, out_spec)
    if dims is None:
        raise VmapError(
            f"vmap({_fname(func)}, ..., out_dims={out_dims!r})(<inputs>): out_dims is not compatible with the "
            f"structure of `outputs`. out_dims has structure {tree_flatten(out_dims)[1]} but outputs has structure "
            f"{out_spec}. Give one int or None per output, nested as the outputs are (tuples for tuples, lists "
            f"for lists), or one int for all."
        )
    return flat, out_spec, dims


def _stack_parts(func, parts, out_dims, size):
    """Per-element outputs of the chunk_size=1 loop, stacked along each output's out_dim."""
    return _combine_parts(func, parts, out_dims, torch.stack)


def _cat_parts(func, parts, out_dims):
    """Per-chunk outputs, concatenated along each output's out_dim."""
    return _combine_parts(func, parts, out_dims, torch.cat)


def _combine_parts(func, parts, out_dims, combine):
    flats = []
    for p in parts:
        flat, out_spec, dims = _out_dims_for(func, p, out_dims)
        flats.append(flat)
    result = []
    for j, d in enumerate(dims):
        column = [f[j] for f in flats]
        if d is None:
            result.append(column[0])
        elif not isinstance(column[0], torch.Tensor):
            raise VmapError(f"vmap({_fname(func)}, ...): output {j} is a {type(column[0]).__name__}; only tensors can be batched.")
        else:
            result.append(combine(column, d))
    return tree_unflatten(result, out_spec)
