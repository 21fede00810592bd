"""Function transforms with torch.func's names and signatures, built on PyTorch's autograd engine.

Reverse mode calls `torch.autograd.grad`; vectorizing it over cotangents (jacrev) runs the backward
formulas on batched tensors, so every row of a Jacobian comes out of one backward pass. Forward mode
(jvp/jacfwd/linearize) uses the double-vjp construction: g(u) = J^T u is linear in u, so the vjp of
g with cotangent v is J v. It needs nothing beyond reverse mode and composes with vmap as is.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from engine import _gradsum
from engine._batched import LevelInfo, _is_outer, mark_inner
from engine._vmap import vmap
from engine.errors import VmapError


class TransformError(ValueError):
    """A transform called in a way it cannot honour (non-scalar grad, bad argnums, bad has_aux output)."""


class _Depth:
    value = 0


@contextlib.contextmanager
def _nested() -> Iterator[None]:
    _Depth.value += 1
    try:
        yield
    finally:
        _Depth.value -= 1


def _fname(func: Callable) -> str:
    return getattr(func, "__name__", repr(func))


def _check_argnums(func: Callable, argnums: Any, n_args: int, api: str) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else argnums
    if not isinstance(nums, tuple) or not nums or not all(isinstance(a, int) for a in nums):
        raise TransformError(f"{api}({_fname(func)}, argnums={argnums!r}): argnums must be an int or a non-empty tuple of ints.")
    out = []
    for a in nums:
        if not -n_args <= a < n_args:
            raise TransformError(
                f"{api}({_fname(func)}, argnums={argnums!r})(<inputs>): Got argnums={a}, but only {n_args} "
                f"positional inputs were given; argnums must be in [{-n_args}, {n_args - 1}]."
            )
        out.append(a % n_args)
    if len(set(out)) != len(out):
        raise TransformError(f"{api}({_fname(func)}, argnums={argnums!r}): argnums contains duplicates.")
    return tuple(out)


def _prepare(x: Any) -> Any:
    """An input to differentiate: connected to any outer graph (so transforms nest), else a fresh leaf."""
    if not isinstance(x, torch.Tensor):
        raise TransformError(f"only tensors (or pytrees of tensors) can be differentiated, got {type(x).__name__}")
    if x.requires_grad:
        return x.view_as(x)
    return mark_inner(x.detach().requires_grad_(True))


def _create_graph(inputs: list) -> bool:
    """Keep the backward graph only when something outside will differentiate through it."""
    return torch.is_grad_enabled() and (_Depth.value > 0 or any(t.requires_grad for t in inputs if isinstance(t, torch.Tensor)))


def _outer_dependence(outputs: list, entry_seq: int) -> bool:
    """Whether outputs depend on tensors requiring grad from before the transform started (closures):
    then the result must stay differentiable for autograd outside the transform."""
    if not torch.is_grad_enabled():
        return False
    probe = LevelInfo(0, 0, "error", entry_seq)
    return any(isinstance(o, torch.Tensor) and o.requires_grad and _is_outer(o, probe) for o in outputs)


def _grads(outputs: list, inputs: list, cotangents: list, create_graph: bool, retain_graph: bool | None = None) -> list:
    pairs = [(o, c) for o, c in zip(outputs, cotangents) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not pairs:
        return [torch.zeros_like(i) for i in inputs]
    _gradsum.flush_urgent()
    gs = torch.autograd.grad(
        [o for o, _ in pairs], inputs, [c for _, c in pairs],
        create_graph=create_graph, retain_graph=True if retain_graph is None else retain_graph, allow_unused=True,
    )
    for g in gs:
        _check_no_dead_level(g)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(gs, inputs)]


def _check_no_dead_level(g: Any) -> None:
    """A gradient still batched at a vmap level that has returned would be silently wrong: refuse it.

    engine._gradsum sums such gradients over the finished batch on the edge where they leave the
    level; this guard turns any node it missed into an error instead of a wrong answer.
    """
    from engine._batched import _active, batch_levels

    dead = [lvl for lvl in batch_levels(g) if lvl not in _active]
    if dead:
        raise TransformError(
            f"engine: a gradient is still batched at a vmap level that already returned (level {dead[0]}), so it "
            "was not summed over that finished batch. This is an engine bug: please report the function. "
            "engine.functional.jacobian(..., vectorize=False) computes the same result without vmap."
        )


def _split_aux(func: Callable, out: Any, has_aux: bool, api: str) -> tuple[Any, Any]:
    if not has_aux:
        return out, None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TransformError(
            f"{api}({_fname(func)}, ..., has_aux=True): expected {_fname(func)} to return a (output, aux) tuple "
            f"of two elements, got {type(out).__name__}" + (f" of length {len(out)}" if isinstance(out, tuple) else "") + "."
        )
    return out


def _detach_aux(aux: Any) -> Any:
    return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) and not _Depth.value else t, aux)


# ------------------------------------------------------------------------------------------------
# reverse mode


def vjp(func: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """(func(*primals), vjp_fn[, aux]); vjp_fn(cotangents) returns one gradient per primal (pytrees kept)."""
    flat, spec = tree_flatten(primals)
    create = _create_graph(flat)
    entry = torch._C._autograd._get_sequence_nr()
    with torch.enable_grad(), _nested():
        inputs = [_prepare(t) for t in flat]
        out, aux = _split_aux(func, func(*tree_unflatten(inputs, spec)), has_aux, "vjp")
    flat_out, out_spec = tree_flatten(out)
    create = create or _outer_dependence(flat_out, entry)
    for o in flat_out:
        if not isinstance(o, torch.Tensor):
            raise TransformError(f"vjp({_fname(func)}, ...): outputs must be tensors (or pytrees of tensors), got {type(o).__name__}.")

    def vjp_fn(*cotangents: Any) -> tuple:
        cts = cotangents[0] if len(cotangents) == 1 and not isinstance(out, tuple) else cotangents
        flat_ct, ct_spec = tree_flatten(cts)
        if len(flat_ct) != len(flat_out):
            raise TransformError(
                f"vjp_fn: expected cotangents with the structure of the output ({out_spec}), got {ct_spec}."
            )
        for o, c in zip(flat_out, flat_ct):
            if o.shape != c.shape:
                raise TransformError(f"vjp_fn: cotangent of shape {tuple(c.shape)} for an output of shape {tuple(o.shape)}.")
        with torch.enable_grad():
            gs = _grads(flat_out, inputs, flat_ct, create_graph=create or _create_graph(flat_ct))
        return tree_unflatten(gs, spec)

    if has_aux:
        return _out(out, create), vjp_fn, _detach_aux(aux)
    return _out(out, create), vjp_fn


def _out(out: Any, keep: bool) -> Any:
    return out if keep else tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out)


def grad_and_value(func: Callable, argnums: Any = 0, has_aux: bool = False) -> Callable:
    """Like torch.func.grad_and_value: returns (gradients, value) or (gradients, (value, aux))."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any):
        nums = _check_argnums(func, argnums, len(args), "grad_and_value")
        diff = [tree_flatten(args[i]) for i in nums]
        create = _create_graph([t for flat, _ in diff for t in flat])
        entry = torch._C._autograd._get_sequence_nr()
        with torch.enable_grad(), _nested():
            prepared = [[_prepare(t) for t in flat] for flat, _ in diff]
            new_args = list(args)
            for i, (flat, spec), p in zip(nums, diff, prepared):
                new_args[i] = tree_unflatten(p, spec)
            out, aux = _split_aux(func, func(*new_args, **kwargs), has_aux, "grad_and_value")
            if not isinstance(out, torch.Tensor) or out.dim() != 0:
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise TransformError(
                    f"grad_and_value({_fname(func)})(*args): Expected f(*args) to return a scalar Tensor, got {shape}. "
                    f"Maybe you wanted to use the vjp or jacrev APIs instead?"
                )
            inputs = [t for p in prepared for t in p]
            create = create or _outer_dependence([out], entry)
            gs = _grads([out], inputs, [torch.ones_like(out)], create_graph=create, retain_graph=create)
        grads, k = [], 0
        for (flat, spec) in diff:
            grads.append(tree_unflatten(gs[k:k + len(flat)], spec))
            k += len(flat)
        g = grads[0] if isinstance(argnums, int) else tuple(grads)
        value = _out(out, create)
        if has_aux:
            return g, (value, _detach_aux(aux))
        return g, value

    return wrapper


def grad(func: Callable, argnums: Any = 0, has_aux: bool = False) -> Callable:
    """Gradient of a scalar function w.r.t. the arguments in `argnums` (torch.func.grad)."""
    gv = grad_and_value(func, argnums, has_aux)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any):
        g, value = gv(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapper


def _basis(flat: list) -> list[torch.Tensor]:
    """Rows of an identity matrix split per tensor: basis[k] has shape [total, *flat[k].shape]."""
    sizes = [t.numel() for t in flat]
    total = sum(sizes)
    ref = flat[0]
    eye = torch.eye(total, dtype=ref.dtype, device=ref.device)
    return [chunk.reshape(total, *t.shape) for chunk, t in zip(eye.split(sizes, dim=1), flat)]


def jacrev(func: Callable, argnums: Any = 0, *, has_aux: bool = False, chunk_size: int | None = None) -> Callable:
    """Jacobian by reverse mode: one vmapped backward pass over all output rows (torch.func.jacrev)."""
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise VmapError(f"jacrev: chunk_size should be None or a positive integer, got {chunk_size!r}")

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any):
        nums = _check_argnums(func, argnums, len(args), "jacrev")

        def partial(*diff):
            new_args = list(args)
            for i, d in zip(nums, diff):
                new_args[i] = d
            return func(*new_args, **kwargs)

        res = vjp(partial, *[args[i] for i in nums], has_aux=has_aux)
        out, vjp_fn = res[0], res[1]
        flat_out, out_spec = tree_flatten(out)
        if sum(o.numel() for o in flat_out) == 1:
            # One output row: a single backward pass, no vmap level (keeps jacrev(jacrev(scalar f)) level-free inside).
            rows = tree_map(lambda t: t.unsqueeze(0), vjp_fn(tree_unflatten([torch.ones_like(o) for o in flat_out], out_spec)))
        else:
            basis = _basis(flat_out)
            rows = vmap(lambda *b: vjp_fn(tree_unflatten(list(b), out_spec)), chunk_size=chunk_size)(*basis)
        # rows: tuple over argnums of pytrees of [total_out, *in_shape]; reshape per output leaf.
        sizes = [o.numel() for o in flat_out]

        def per_output(t: torch.Tensor) -> list[torch.Tensor]:
            return [p.reshape(*o.shape, *t.shape[1:]) for p, o in zip(t.split(sizes, dim=0), flat_out)]

        per_arg = []
        for r in rows:
            flat_r, r_spec = tree_flatten(r)
            split = [per_output(t) for t in flat_r]  # [in_leaf][out_leaf]
            per_arg.append([tree_unflatten([split[i][j] for i in range(len(flat_r))], r_spec) for j in range(len(flat_out))])
        # structure: output pytree of (argnums structure)
        leaves = []
        for j in range(len(flat_out)):
            by_arg = [per_arg[a][j] for a in range(len(nums))]
            leaves.append(by_arg[0] if isinstance(argnums, int) else tuple(by_arg))
        jac = tree_unflatten(leaves, out_spec)
        return (jac, res[2]) if has_aux else jac

    return wrapper


# ------------------------------------------------------------------------------------------------
# forward mode by double vjp


def linearize(func: Callable, *primals: Any) -> tuple[Any, Callable]:
    """(func(*primals), jvp_fn): the linearization is built once and reused by every jvp_fn call."""
    flat, spec = tree_flatten(primals)
    create = _create_graph(flat)
    with torch.enable_grad(), _nested():
        inputs = [_prepare(t) for t in flat]
        out = func(*tree_unflatten(inputs, spec))
        flat_out, out_spec = tree_flatten(out)
        dummies = [torch.zeros_like(o).requires_grad_(True) for o in flat_out]
        gx = _grads(flat_out, inputs, dummies, create_graph=True)

    def jvp_fn(*tangents: Any) -> Any:
        flat_t, t_spec = tree_flatten(tangents)
        if len(flat_t) != len(flat):
            raise TransformError(f"jvp: expected tangents with the structure of the primals ({spec}), got {t_spec}.")
        for p, t in zip(flat, flat_t):
            if p.shape != t.shape:
                raise TransformError(f"jvp: tangent of shape {tuple(t.shape)} for a primal of shape {tuple(p.shape)}.")
        with torch.enable_grad():
            live = [(g, t) for g, t in zip(gx, flat_t) if g.requires_grad]
            if not live:
                jv = [torch.zeros_like(o) for o in flat_out]
            else:
                jv = torch.autograd.grad([g for g, _ in live], dummies, [t for _, t in live],
                                         create_graph=create or _create_graph(flat_t), retain_graph=True, allow_unused=True)
                jv = [torch.zeros_like(o) if j is None else j for j, o in zip(jv, flat_out)]
        return tree_unflatten(jv, out_spec)

    return _out(out, create), jvp_fn


def jvp(func: Callable, primals: Any, tangents: Any, *, has_aux: bool = False) -> tuple:
    """(func(*primals), J @ tangents) like torch.func.jvp; primals and tangents are tuples."""
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
        raise TransformError("jvp(f, primals, tangents): primals and tangents must be tuples (e.g. jvp(f, (x,), (v,))).")
    if len(primals) != len(tangents):
        raise TransformError(f"jvp: got {len(primals)} primals but {len(tangents)} tangents; they must match.")
    if has_aux:
        aux_box = []

        def f(*p):
            o, a = _split_aux(func, func(*p), True, "jvp")
            aux_box.append(a)
            return o

        out, fn = linearize(f, *primals)
        return out, fn(*tangents), _detach_aux(aux_box[0])
    out, fn = linearize(func, *primals)
    return out, fn(*tangents)


def jacfwd(func: Callable, argnums: Any = 0, has_aux: bool = False, *, randomness: str = "error") -> Callable:
    """Jacobian by forward mode: a vmapped jvp over the input basis (torch.func.jacfwd)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any):
        nums = _check_argnums(func, argnums, len(args), "jacfwd")
        aux_box = []

        def partial(*diff):
            new_args = list(args)
            for i, d in zip(nums, diff):
                new_args[i] = d
            o = func(*new_args, **kwargs)
            if has_aux:
                o, a = _split_aux(func, o, True, "jacfwd")
                aux_box.append(a)
            return o

        diff = [args[i] for i in nums]
        out, jvp_fn = linearize(partial, *diff)
        flat_in, in_spec = tree_flatten(diff)
        basis = _basis(flat_in)
        cols = vmap(lambda *b: jvp_fn(*tree_unflatten(list(b), in_spec)), randomness=randomness)(*basis)
        flat_cols, out_spec = tree_flatten(cols)  # each [total_in, *out_shape]
        sizes = [t.numel() for t in flat_in]
        leaves = []
        for c in flat_cols:
            out_shape = c.shape[1:]
            parts = [p.movedim(0, -1).reshape(*out_shape, *t.shape) for p, t in zip(c.split(sizes, dim=0), flat_in)]
            per_arg, k = [], 0
            for a in range(len(nums)):
                n_leaves = len(tree_flatten(diff[a])[0])
                per_arg.append(tree_unflatten(parts[k:k + n_leaves], tree_flatten(diff[a])[1]))
                k += n_leaves
            leaves.append(per_arg[0] if isinstance(argnums, int) else tuple(per_arg))
        jac = tree_unflatten(leaves, out_spec)
        return (jac, _detach_aux(aux_box[0])) if has_aux else jac

    return wrapper


def hessian(func: Callable, argnums: Any = 0) -> Callable:
    """Hessian of a scalar function: reverse-over-reverse, jacrev(jacrev(func)) (torch.func.hessian's result)."""
    return jacrev(jacrev(func, argnums), argnums)
