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
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from engine import _gradsum, second_order
from engine._batched import LevelInfo, _active, _is_outer, batch_levels, clock, mark_inner
from engine._dispatch import BatchedRoute
from engine._gradsum import BATCHED_NODES
from engine._guards import _Depth, requires_grad, transform_scope
from engine._repr import mark_grad_input, pop_grad, push_grad
from engine._vmap import vmap
from engine.autoswitch import departures
from engine.errors import RandomnessError, TransformError, UnsupportedInTransformError, VmapError

__all__ = ["TransformError", "grad", "grad_and_value", "hessian", "jacfwd", "jacrev", "jvp", "linearize", "vjp"]


@contextlib.contextmanager
def _nested() -> Iterator[None]:
    departures.append(None)  # not the standard state while it runs (engine.autoswitch)
    _Depth.value += 1
    try:
        yield
    finally:
        _Depth.value -= 1
        departures.pop()


@contextlib.contextmanager
def _no_inference() -> Iterator[None]:
    """Leave inference mode (keeping the grad mode) so autograd records: torch.func's transforms
    compute gradients inside `torch.inference_mode()` too."""
    if not torch.is_inference_mode_enabled():
        yield
        return
    grad_mode = torch.is_grad_enabled()
    with torch.inference_mode(False):
        torch._C._set_grad_enabled(grad_mode)
        yield


@contextlib.contextmanager
def _differentiating() -> Iterator[int]:
    """What a transform runs `func` under: grad on, inference mode off, one level deeper.

    As in torch.func (its NOTE "grad and vjp interaction with no_grad"), a `torch.no_grad()` around
    the transform does not stop it from differentiating `func`, while a `torch.no_grad()` inside
    `func` is obeyed; the grad mode at entry only decides whether the results stay connected to the
    autograd graph outside (see `_prepare` and `_out`). Yields the level's token, which marks its
    inputs for printing (engine._repr).
    """
    with _no_inference(), torch.enable_grad(), _nested():
        token = push_grad()
        try:
            yield token
        finally:
            pop_grad(token)


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


def _prepare(x: Any, connect: bool = True, token: int = 0) -> Any:
    """An input to differentiate: connected to any outer graph when `connect` (so transforms nest),
    else a fresh leaf. `connect` is False when the transform was entered with grad disabled: nothing
    outside may then differentiate through it."""
    if not isinstance(x, torch.Tensor):
        raise TransformError(f"only tensors (or pytrees of tensors) can be differentiated, got {type(x).__name__}")
    if connect and x.requires_grad:
        out = x.view_as(x)
    else:
        leaf = x.detach()
        if leaf.is_inference():
            leaf = leaf.clone()
        out = mark_inner(requires_grad(leaf))
    if token:
        mark_grad_input(out, token, x)
    return out


def _create_graph(inputs: list) -> bool:
    """Keep the backward graph only when something outside will differentiate through it."""
    return torch.is_grad_enabled() and (_Depth.value > 0 or any(t.requires_grad for t in inputs if isinstance(t, torch.Tensor)))


def _outer_dependence(outputs: list, entry: tuple) -> bool:
    """Whether outputs depend on tensors requiring grad from before the transform started (closures):
    then the result must stay differentiable for autograd outside the transform."""
    if not torch.is_grad_enabled():
        return False
    probe = LevelInfo(0, 0, "error", entry[0], stamp=entry)
    return any(isinstance(o, torch.Tensor) and o.requires_grad and _is_outer(o, probe) for o in outputs)


_run_backward = getattr(torch.autograd.graph, "_engine_run_backward", None)


def autograd_vjp(outputs: list, inputs: list, cotangents: list, create_graph: bool, retain_graph: bool) -> tuple:
    """`torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True, ...)`, less its input
    checks where they cannot fail. torch.autograd.grad compares each cotangent's size with its
    output's through torch's symbolic-shape module, whose first import (sympy's) is most of an
    eager process's first call (tests/test_lazy_imports.py); for plain tensors of equal shapes and
    matching complexness those checks pass and grad hands its arguments unchanged to the engine
    call made here. Anything else (a mismatch, a nested tensor, a tensor subclass with
    __torch_function__) goes to torch.autograd.grad, which decides and words its errors. A pass that
    may run ops on batched tensors with no vmap level alive runs under engine._dispatch.BatchedRoute."""
    if BATCHED_NODES[0] and not _active:
        with BatchedRoute():
            return _autograd_vjp(outputs, inputs, cotangents, create_graph, retain_graph)
    return _autograd_vjp(outputs, inputs, cotangents, create_graph, retain_graph)


def _autograd_vjp(outputs: list, inputs: list, cotangents: list, create_graph: bool, retain_graph: bool) -> tuple:
    if (_run_backward is None or len(outputs) != len(cotangents) or not outputs
            or torch._C._has_torch_function((*outputs, *inputs, *cotangents))
            or not all(isinstance(c, torch.Tensor) and isinstance(o, torch.Tensor)
                       and not o.is_nested and not c.is_nested and c.shape == o.shape
                       and c.dtype.is_complex == o.dtype.is_complex for o, c in zip(outputs, cotangents))
            or not all(isinstance(i, torch.Tensor) for i in inputs)):
        return torch.autograd.grad(outputs, inputs, cotangents, create_graph=create_graph,
                                   retain_graph=retain_graph, allow_unused=True)
    return _run_backward(tuple(outputs), tuple(cotangents), retain_graph, create_graph, tuple(inputs), True,
                         accumulate_grad=False)


def _grads(outputs: list, inputs: list, cotangents: list, create_graph: bool, retain_graph: bool | None = None) -> list:
    pairs = [(o, c) for o, c in zip(outputs, cotangents) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not pairs:
        return [torch.zeros_like(i) for i in inputs]
    _gradsum.flush_urgent()
    gs = autograd_vjp([o for o, _ in pairs], inputs, [c for _, c in pairs], create_graph,
                      True if retain_graph is None else retain_graph)
    for g in gs:
        _check_no_dead_level(g)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(gs, inputs)]


def _check_no_dead_level(g: Any) -> None:
    """A gradient still batched at a vmap level that has returned would be silently wrong: refuse it.

    engine._gradsum sums such gradients over the finished batch on the edge where they leave the
    level; this guard turns any node it missed into an error instead of a wrong answer.
    """
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
            f"{api}({_fname(func)}, ..., has_aux=True): output of function {_fname(func)} should be a tuple: "
            f"(output, aux) if has_aux is True; got {type(out).__name__}"
            + (f" of length {len(out)}" if isinstance(out, tuple) else "") + "."
        )
    for leaf in tree_flatten(out[1])[0]:
        if not isinstance(leaf, torch.Tensor):
            raise TransformError(
                f"{api}({_fname(func)}, ..., has_aux=True): Expected tensors, got unsupported type {type(leaf)} in the "
                f"aux output; aux must be a tensor or a pytree of tensors (as in torch.func). Return Python values "
                f"outside the transform, or as tensors."
            )
    return out


class _Captures:
    """Tensors the function closes over, with their version counters at entry.

    torch.func refuses an in-place write into a captured tensor inside grad/vjp/jvp (the write
    would need a gradient the tensor cannot carry, and it would leave the tensor attached to the
    transform's graph). The engine has no per-op hook outside vmap, so it checks the tensors a
    function can reach through its closure (closure variables, shallow containers in them, the
    closures of functions and functools.partial objects they hold) after the function returns,
    and raises before any result is handed back.
    """

    def __init__(self, func: Callable) -> None:
        self.tensors: list[tuple[str, torch.Tensor, int]] = []
        self._scan(func, 0, set())

    def _scan(self, func: Any, depth: int, seen: set) -> None:
        if depth > 2 or id(func) in seen:
            return
        seen.add(id(func))
        if isinstance(func, functools.partial):
            for v in (*func.args, *func.keywords.values()):
                self._add("a functools.partial argument", v)
            self._scan(func.func, depth + 1, seen)
            return
        code, cells = getattr(func, "__code__", None), getattr(func, "__closure__", None)
        if code is None or not cells:
            return
        own = getattr(func, "__module__", None) == __name__  # the engine's wrappers hold the inputs themselves
        for name, cell in zip(code.co_freevars, cells):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(value) and not isinstance(value, (torch.Tensor, torch.nn.Module, type)):
                self._scan(value, depth + (not own), seen)
            elif not own:
                self._add(name, value)

    def _add(self, name: str, value: Any) -> None:
        items = value if isinstance(value, (list, tuple)) else value.values() if isinstance(value, dict) else (value,)
        for v in items:
            if isinstance(v, torch.Tensor) and not v.is_inference():
                self.tensors.append((name, v, v._version))

    def check(self, func: Callable, api: str) -> None:
        for name, t, version in self.tensors:
            if t._version != version:
                raise UnsupportedInTransformError(
                    f"During a grad (vjp, jvp, grad, etc) transform, the function provided ({_fname(func)}, under {api}) "
                    f"attempted to call an in-place operation that would mutate a captured Tensor ({name!r}, "
                    f"shape {tuple(t.shape)}). A 'captured' Tensor is one that is not passed as input to the "
                    f"transformed function, as torch.func also refuses. Pass it as an input (and return the new "
                    f"value), or write into a fresh tensor (e.g. {name}.clone()) instead."
                )


def _check_outputs(func: Callable, flat_out: list, api: str) -> None:
    if not flat_out:
        raise TransformError(f"{api}: Expected {_fname(func)} to be a function that has non-empty output (got no tensors).")
    for o in flat_out:
        if not isinstance(o, torch.Tensor):
            raise TransformError(
                f"{api}: expected {_fname(func)}(*primals) to return only tensors (or pytrees of tensors), "
                f"got unsupported type {type(o)}."
            )


def _detach_aux(aux: Any, keep: bool = True) -> Any:
    with _no_inference():  # as in `_out`
        return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) and (not keep or not _Depth.value) else t, aux)


# ------------------------------------------------------------------------------------------------
# reverse mode


def vjp(func: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """(func(*primals), vjp_fn[, aux]); vjp_fn(cotangents) returns one gradient per primal (pytrees kept)."""
    flat, spec = tree_flatten(primals)
    outer = torch.is_grad_enabled()
    create = _create_graph(flat)
    # Whether gradients made later by vjp_fn are differentiable by autograd outside, when vjp_fn is
    # called with grad enabled: decided by the grad mode of that call, not of this one (torch.func:
    # vjp under no_grad, vjp_fn outside it gives gradients that depend on the primals).
    outside = _Depth.value > 0 or any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat)
    entry = clock()
    with _differentiating() as token:
        # connected to the primals' graph even under no_grad, for that later vjp_fn
        inputs = [_prepare(t, True, token) for t in flat]
        captures = _Captures(func)
        versions = [i._version for i in inputs]
        with transform_scope(), second_order.decomposed(_Depth.value >= 2):
            raw = func(*tree_unflatten(inputs, spec))
        captures.check(func, "vjp")
        _check_connected_writes(func, "vjp(f, *primals)", flat, inputs, inputs, versions)
        out, aux = _split_aux(func, raw, has_aux, "vjp")
    flat_out, out_spec = tree_flatten(out)
    _check_outputs(func, flat_out, "vjp(f, *primals)")
    with torch.enable_grad():
        outside = outside or _outer_dependence(flat_out, entry)
    create = create or (outer and outside)

    def vjp_fn(cotangents: Any, *more: Any, retain_graph: bool = True, create_graph: bool | None = None) -> tuple:
        """The gradients for `cotangents` (one per output, with the outputs' structure), like
        torch.func's `vjp_fn(cotangents, retain_graph=True, create_graph=None)`. Extra positional
        bools/None are those two flags (torch.func's positional form); extra positional tensors
        spread a tuple output's cotangents over the arguments (`vjp_fn(ca, cb)` for `(a, b)`)."""
        if more and len(more) <= 2 and all(m is None or isinstance(m, bool) for m in more):
            retain_graph, create_graph = (*more, create_graph)[:2] if len(more) == 2 else (more[0], create_graph)
            more = ()
        cts = _match_cotangents(cotangents, more, out_spec)
        flat_ct = tree_flatten(cts)[0]
        for o, c in zip(flat_out, flat_ct):
            if not isinstance(c, torch.Tensor):
                raise TransformError(f"vjp_fn: expected a tensor cotangent for each output, got a {type(c).__name__}.")
            if o.shape != c.shape:
                raise TransformError(f"vjp_fn: cotangent of shape {tuple(c.shape)} for an output of shape {tuple(o.shape)}.")
        # The graph is kept when something outside differentiates through the result (the engine's
        # rule, which gives torch.func's results) and grad is enabled at this call (under no_grad the
        # gradients are constants, as torch.func's); create_graph=False drops it as torch.func does,
        # and True asks for nothing more: with no outer transform, torch.func's graph ends at the
        # level that returns, so its gradients come back constant too.
        make_graph = create_graph is not False and torch.is_grad_enabled() and (outside or _create_graph(flat_ct))
        with _no_inference(), torch.enable_grad():
            gs = _grads(flat_out, inputs, flat_ct, create_graph=make_graph, retain_graph=retain_graph)
        return tree_unflatten(gs, spec)

    if has_aux:
        return _out(out, create), vjp_fn, _detach_aux(aux, create)
    return _out(out, create), vjp_fn


def _match_cotangents(first: Any, more: tuple, out_spec: Any) -> Any:
    """The cotangents given to a vjp_fn, with exactly the outputs' pytree structure: `first` itself,
    or `(first, *more)` when spread over positional arguments. Anything else is refused (counting
    leaves alone would pair cotangents with the wrong outputs when the nesting differs)."""
    if not more and tree_flatten(first)[1] == out_spec:
        return first
    spread = (first, *more)
    if tree_flatten(spread)[1] == out_spec:
        return spread
    raise TransformError(
        f"vjp_fn: Expected pytree structure of the cotangents to match the outputs': the outputs have structure "
        f"{out_spec}, the cotangents {tree_flatten(first if not more else spread)[1]}. "
        f"Pass one cotangent per output, nested as the outputs are."
    )


def _out(out: Any, keep: bool) -> Any:
    """The function's output, detached unless something outside differentiates through it. The
    detach runs outside inference mode: under `torch.inference_mode()` a batched output (made by a
    vmap inside, not an inference tensor) cannot be detached into an inference tensor sharing its
    version counter, and torch.func returns such outputs as normal tensors too."""
    if keep:
        return out
    with _no_inference():
        return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out)


def grad_and_value(func: Callable, argnums: Any = 0, has_aux: bool = False) -> Callable:
    """Like torch.func.grad_and_value: returns (gradients, value) or (gradients, (value, aux))."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any):
        nums = _check_argnums(func, argnums, len(args), "grad_and_value")
        diff = [tree_flatten(args[i]) for i in nums]
        outer = torch.is_grad_enabled()
        create = _create_graph([t for flat, _ in diff for t in flat])
        entry = clock()
        with _differentiating() as token:
            prepared = [[_prepare(t, outer, token) for t in flat] for flat, _ in diff]
            new_args = list(args)
            for i, (flat, spec), p in zip(nums, diff, prepared):
                new_args[i] = tree_unflatten(p, spec)
            captures = _Captures(func)
            flat_in = [t for p in prepared for t in p]
            versions = [i._version for i in flat_in]
            with transform_scope(), second_order.decomposed(_Depth.value >= 2):
                raw = func(*new_args, **kwargs)
            captures.check(func, "grad")
            _check_connected_writes(func, "grad(f)(*args)", [t for flat, _ in diff for t in flat], flat_in, flat_in, versions)
            out, aux = _split_aux(func, raw, has_aux, "grad_and_value")
            if not isinstance(out, torch.Tensor) or out.dim() != 0:
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise TransformError(
                    f"grad_and_value({_fname(func)})(*args): Expected f(*args) to return a scalar Tensor, got {shape}. "
                    f"Maybe you wanted to use the vjp or jacrev APIs instead?"
                )
            inputs = [t for p in prepared for t in p]
            create = create or (outer and _outer_dependence([out], entry))
            gs = _grads([out], inputs, [torch.ones_like(out)], create_graph=create, retain_graph=create)
        grads, k = [], 0
        for (flat, spec) in diff:
            grads.append(tree_unflatten(gs[k:k + len(flat)], spec))
            k += len(flat)
        g = grads[0] if isinstance(argnums, int) else tuple(grads)
        value = _out(out, create)
        if has_aux:
            return g, (value, _detach_aux(aux, create))
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
    return [chunk.reshape((total,) + tuple(t.shape)) for chunk, t in zip(eye.split(sizes, dim=1), flat)]


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
            return [p.reshape(tuple(o.shape) + tuple(t.shape[1:])) for p, o in zip(t.split(sizes, dim=0), flat_out)]

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
    out, jvp_fn, _ = _linearize(func, primals, "linearize(func, *primals)")
    return out, jvp_fn


class _WritableAlias(torch.autograd.Function):
    """The primal `func` sees under jvp: the prepared input's memory, as a non-leaf autograd does not
    count as a view (`detach` shares storage and version counter without recording a view).

    torch.func's jvp hands `func` a dual tensor that aliases the primal, so `x.copy_(y)` (or a write
    into a view of `x`) goes through to the caller's tensor and the tangent follows the write. A
    leaf requiring grad refuses in-place writes, and a view of it too; this alias accepts them, and
    autograd records the write (CopyBackwards, CopySlices) on the alias while gradients are still
    taken with respect to the prepared input, whose value is the one before the write.

    The old-style Function (forward takes ctx): the functorch-compatible form (setup_context) binds
    its arguments through inspect.signature on every call, which is slow. torch.func refuses the old
    style under its own transforms, so there (`_writable`) the input is passed as it was before."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


def _writable(inputs: list) -> list:
    """The primals `func` is called with (see `_WritableAlias`)."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return inputs
    return [_WritableAlias.apply(i) for i in inputs]


def _check_connected_writes(func: Callable, api: str, flat: list, inputs: list, given: list, versions: list) -> None:
    """Refuse an in-place write into an input that requires grad from outside the transform (an
    outer transform's input, or a tensor the caller made require grad). The input is then a view of
    that tensor (`_prepare`) and gradients are taken with respect to it after the write, so nested
    grads and jvps gave wrong values, silently. torch.func refuses these writes too (an in-place
    write into a view of its level's leaf, or a captured tensor mutated under an outer transform)."""
    for i, (p, inp, g, v) in enumerate(zip(flat, inputs, given, versions)):
        if g._version != v and inp.grad_fn is not None and p.requires_grad:
            raise TransformError(
                f"{api}: {_fname(func)} wrote in place into input {i} (flattened), which requires grad outside "
                f"this transform (an outer transform differentiates it, or it was made to require grad): the "
                f"gradients would miss the write. Write into a clone (x = x.clone()) inside the function."
            )


def _linearize(func: Callable, primals: tuple, api: str, has_aux: bool = False, strict: bool = False) -> tuple[Any, Callable, Any]:
    flat, spec = tree_flatten(primals)
    outer = torch.is_grad_enabled()
    create = _create_graph(flat)
    with _differentiating() as token:
        inputs = [_prepare(t, outer, token) for t in flat]
        captures = _Captures(func)
        with transform_scope(), second_order.decomposed():
            given = _writable(inputs)
            versions = [g._version for g in given]
            raw = func(*tree_unflatten(given, spec))
        captures.check(func, api.split("(")[0])
        _check_connected_writes(func, api, flat, inputs, given, versions)
        out, aux = _split_aux(func, raw, has_aux, api.split("(")[0])
        flat_out, out_spec = tree_flatten(out)
        _check_outputs(func, flat_out, api)
        # ones, not zeros: J^T u is linear in u, but some backward formulas are not smooth at u = 0
        # (logcumsumexp's takes log|u| under a where: its derivative there is 0 * inf, NaN)
        dummies = [requires_grad(torch.ones_like(o)) for o in flat_out]
        try:
            gx = _grads(flat_out, inputs, dummies, create_graph=True)
        except RuntimeError as e:
            written = [i for i, (g, v) in enumerate(zip(given, versions)) if g._version != v]
            if written and "modified by an inplace operation" in str(e):
                raise TransformError(
                    f"{api}: {_fname(func)} wrote in place into primal {written[0]} (flattened) after an op had saved "
                    f"its earlier value for the derivative. torch.func computes the tangent alongside each op; this "
                    f"engine differentiates the recorded graph afterwards and needs that saved value. Write into a "
                    f"clone of the primal (x = x.clone()) or do the in-place write before the ops that read it."
                ) from e
            raise

    def jvp_fn(*tangents: Any) -> Any:
        flat_t, t_spec = tree_flatten(tangents)
        if len(flat_t) != len(flat):
            raise TransformError(f"{api}: expected tangents with the structure of the primals ({spec}), got {t_spec}.")
        for i, (p, t) in enumerate(zip(flat, flat_t)):
            if not isinstance(t, torch.Tensor):
                raise TransformError(f"{api}: Expected tangents to only contain Tensors, got {type(t)}")
            if t.dtype != p.dtype:  # torch.func.linearize's check and wording
                raise TransformError(
                    f"{api}: tangent:{i} with dtype {t.dtype} in flattened pytree doesn't match the dtype {p.dtype} "
                    f"of the corresponding primal. Cast the tangent with `tangent.to(primal.dtype)`."
                )
            if p.shape != t.shape:
                raise TransformError(
                    f"{api}: Trying to set a forward gradient that has a different size than that of the original "
                    f"Tensor: tangent of shape {tuple(t.shape)} for a primal of shape {tuple(p.shape)}."
                )
        with _no_inference(), torch.enable_grad():
            live = [(g, t) for g, t in zip(gx, flat_t) if g.requires_grad]
            jv = [None] * len(flat_out)
            if live:
                jv = list(autograd_vjp([g for g, _ in live], dummies, [t for _, t in live],
                                       create or _create_graph(flat_t), True))
        if strict and any(j is None for j in jv):
            raise TransformError(
                f"{api.split('(')[0]}(f, primals, tangents, strict=True): The output of f is independent of the inputs. "
                f"This is not allowed with strict=True."
            )
        return tree_unflatten([torch.zeros_like(o) if j is None else j for j, o in zip(jv, flat_out)], out_spec)

    return _out(out, create), jvp_fn, (_detach_aux(aux, create) if has_aux else None)


def jvp(func: Callable, primals: Any, tangents: Any, *, strict: bool = False, has_aux: bool = False) -> tuple:
    """(func(*primals), J @ tangents) like torch.func.jvp: `primals` is a tuple, `tangents` has its structure."""
    api = "jvp(f, primals, tangents)"
    if not isinstance(primals, tuple):
        raise TransformError(f"{api}: Expected primals to be a tuple. E.g. it should be valid to call f(*primals).")
    flat_p, p_spec = tree_flatten(primals)
    flat_t, t_spec = tree_flatten(tangents)
    if p_spec != t_spec:
        raise TransformError(
            f"{api}: Expected primals and tangents to have the same python structure. For example, if primals is a "
            f"tuple of 3 tensors, tangents also must be. Got primals with structure {p_spec} and tangents with "
            f"structure {t_spec}"
        )
    for name, leaves in (("primals", flat_p), ("tangents", flat_t)):
        if not leaves:
            raise TransformError(f"{api}: Expected {name} to contain at least one Tensor.")
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor):
                raise TransformError(f"{api}: Expected {name} to only contain Tensors, got {type(leaf)}")
    _check_tangent_dtypes(flat_p, flat_t, api)
    out, fn, aux = _linearize(func, primals, api, has_aux=has_aux, strict=strict)
    jv = fn(*tangents)
    return (out, jv, aux) if has_aux else (out, jv)


def _check_tangent_dtypes(flat_p: list, flat_t: list, api: str) -> None:
    """torch.func.jvp refuses integer tangents (ValueError) and otherwise carries each tangent in its
    own dtype, so the output tangent's dtype follows each op's type promotion (float64 through sin of
    a float32 primal, float16 through a reshape). This jvp runs reverse mode over the primal's dtype
    and cannot reproduce that, so a tangent whose dtype differs from its primal's is refused."""
    for i, (p, t) in enumerate(zip(flat_p, flat_t)):
        if not (t.is_floating_point() or t.is_complex()):
            raise TransformError(f"{api}: Expected tangent to be floating point or complex, but got: {t.dtype}")
        if t.dtype != p.dtype:
            raise TransformError(
                f"{api}: tangent {i} has dtype {t.dtype} but its primal has dtype {p.dtype}. torch.func.jvp would carry "
                f"the tangent in {t.dtype} through the computation (the output tangent's dtype then follows each op's "
                f"type promotion); this engine computes the tangent in the primal's dtype, so it refuses rather than "
                f"return a different dtype. Cast the tangent with `tangent.to(primal.dtype)`."
            )


def _same_rng_state(before: torch.Tensor) -> bool:
    """Whether the CPU generator's state is still `before`: compared outside any TorchDispatchMode,
    as engine bookkeeping (a trace's guard mode would refuse the comparison as a read of values)."""
    with _disable_current_modes():
        return torch.equal(before, torch.get_rng_state())


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
        # f runs once, outside the vmap over the basis; under randomness='error' a draw in it must
        # still raise as torch.func's (which runs f inside that vmap): the global stream moved
        before = torch.get_rng_state() if randomness == "error" else None
        out, jvp_fn, _ = _linearize(partial, tuple(diff), "jacfwd(f, ...)")
        if before is not None and not _same_rng_state(before):
            raise RandomnessError(
                f"jacfwd({getattr(func, '__name__', 'f')}, ...): called random operation while in randomness error "
                f"mode. Pass randomness='same' or 'different' to jacfwd, or draw outside the transformed function.")
        flat_in, in_spec = tree_flatten(diff)
        basis = _basis(flat_in)
        cols = vmap(lambda *b: jvp_fn(*tree_unflatten(list(b), in_spec)), randomness=randomness)(*basis)
        flat_cols, out_spec = tree_flatten(cols)  # each [total_in, *out_shape]
        sizes = [t.numel() for t in flat_in]
        leaves = []
        for c in flat_cols:
            out_shape = c.shape[1:]
            parts = [p.movedim(0, -1).reshape(tuple(out_shape) + tuple(t.shape)) for p, t in zip(c.split(sizes, dim=0), flat_in)]
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
