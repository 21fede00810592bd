"""torch.autograd.functional's API on the engine: `jacobian`, `hessian`, `vjp`, `jvp`, `vhp`, `hvp`.

`jacobian`/`hessian` with `vectorize=False` loop over output rows with one backward pass each (the
baseline); `vectorize=True` runs all rows in one vmapped backward pass through the engine.
`vjp`/`jvp`/`vhp`/`hvp` are one (double) backward pass each, with torch.autograd.functional's
signatures and results; unlike torch.autograd.functional they may be called inside `engine.vmap`
(e.g. over a batch of vectors `v`), where the engine batches their backward passes.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from engine._batched import mark_inner
from engine._guards import requires_grad
from engine._vmap import vmap
from engine.transforms import TransformError, linearize

_STRATEGIES = ("reverse-mode", "forward-mode")


def _as_tuple(x: Any, name: str, api: str) -> tuple[bool, tuple]:
    if isinstance(x, tuple):
        is_tuple, t = True, x
    elif isinstance(x, list):
        is_tuple, t = True, tuple(x)
    else:
        is_tuple, t = False, (x,)
    for i, v in enumerate(t):
        if not isinstance(v, torch.Tensor):
            raise TransformError(f"{api}: the {name} must be a Tensor or a tuple of Tensors, but element {i} is {type(v).__name__}.")
    return is_tuple, t


def _grad_inputs(inputs: tuple, create_graph: bool) -> tuple:
    return tuple(i.view_as(i) if (create_graph and i.requires_grad) else mark_inner(requires_grad(i.detach())) for i in inputs)


def jacobian(
    func: Callable,
    inputs: Any,
    create_graph: bool = False,
    strict: bool = False,
    vectorize: bool = False,
    strategy: str = "reverse-mode",
    chunk_size: int | None = None,
) -> Any:
    """Jacobian of `func` at `inputs`, structured like torch.autograd.functional.jacobian's result."""
    if strategy not in _STRATEGIES:
        raise TransformError(f"jacobian: strategy must be one of {_STRATEGIES}, got {strategy!r}")
    if strategy == "forward-mode" and not vectorize:
        raise TransformError("jacobian: strategy='forward-mode' requires vectorize=True (as in torch.autograd.functional).")
    if strategy == "forward-mode" and strict:
        raise TransformError("jacobian: strict=True is not supported with strategy='forward-mode'.")
    inputs_tuple, inputs_t = _as_tuple(inputs, "inputs", "jacobian")
    with torch.enable_grad():
        inp = _grad_inputs(inputs_t, create_graph)
        outputs = func(*inp)
        outputs_tuple, outs = _as_tuple(outputs, "outputs of the user-provided function", "jacobian")
        if strategy == "forward-mode":
            jac = _forward(func, inp, outs, create_graph)
        elif vectorize:
            jac = _reverse_vectorized(inp, outs, create_graph, strict, chunk_size)
        else:
            jac = _reverse_loop(inp, outs, create_graph, strict)
    if not create_graph:
        jac = [[j.detach() for j in row] for row in jac]
    return _structure(jac, outputs_tuple, inputs_tuple)


def _structure(jac: list, outputs_tuple: bool, inputs_tuple: bool) -> Any:
    rows = [tuple(r) if inputs_tuple else r[0] for r in jac]
    return tuple(rows) if outputs_tuple else rows[0]


def _check_strict(g: Any, i: int, j: int) -> None:
    raise RuntimeError(
        f"jacobian(strict=True): output {i} is independent of input {j}. Pass strict=False to get zeros for it."
    )


def _reverse_loop(inp: tuple, outs: tuple, create_graph: bool, strict: bool) -> list:
    jac = []
    for i, out in enumerate(outs):
        rows: list[list[torch.Tensor]] = [[] for _ in inp]
        flat = out.reshape(-1)
        for k in range(flat.numel()):
            gs = torch.autograd.grad(flat[k], inp, retain_graph=True, create_graph=create_graph, allow_unused=True) \
                if out.requires_grad else (None,) * len(inp)
            for j, g in enumerate(gs):
                if g is None:
                    if strict:
                        _check_strict(g, i, j)
                    g = torch.zeros_like(inp[j])
                rows[j].append(g)
        jac.append([
            (torch.stack(r) if r else inp[j].new_zeros((0, *inp[j].shape))).reshape(*out.shape, *inp[j].shape)
            for j, r in enumerate(rows)
        ])
    return jac


def _reverse_vectorized(inp: tuple, outs: tuple, create_graph: bool, strict: bool, chunk_size: int | None) -> list:
    jac = []
    for i, out in enumerate(outs):
        n = out.numel()
        if not out.requires_grad:
            if strict:
                _check_strict(None, i, 0)
            jac.append([inp[j].new_zeros((*out.shape, *inp[j].shape)) for j in range(len(inp))])
            continue
        basis = torch.eye(n, dtype=out.dtype, device=out.device).reshape(n, *out.shape)

        def vjp_row(v: torch.Tensor) -> tuple:
            gs = torch.autograd.grad(out, inp, v, retain_graph=True, create_graph=create_graph, allow_unused=True)
            if strict and any(g is None for g in gs):
                _check_strict(None, i, [g is None for g in gs].index(True))
            return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(gs, inp))

        rows = vmap(vjp_row, chunk_size=chunk_size)(basis)
        jac.append([r.reshape(*out.shape, *x.shape) for r, x in zip(rows, inp)])
    return jac


def _forward(func: Callable, inp: tuple, outs: tuple, create_graph: bool) -> list:
    _, jvp_fn = linearize(lambda *x: tuple(func(*x)) if isinstance(func(*x), (tuple, list)) else (func(*x),), *inp)
    sizes = [x.numel() for x in inp]
    total = sum(sizes)
    eye = torch.eye(total, dtype=inp[0].dtype, device=inp[0].device)
    basis = [c.reshape(total, *x.shape) for c, x in zip(eye.split(sizes, dim=1), inp)]
    cols = vmap(lambda *b: jvp_fn(*b))(*basis)  # per output: [total, *out.shape]
    jac = []
    for c, out in zip(cols, outs):
        parts = c.split(sizes, dim=0)
        jac.append([p.movedim(0, -1).reshape(*out.shape, *x.shape) for p, x in zip(parts, inp)])
    return jac


def hessian(
    func: Callable,
    inputs: Any,
    create_graph: bool = False,
    strict: bool = False,
    vectorize: bool = False,
    outer_jacobian_strategy: str = "reverse-mode",
) -> Any:
    """Hessian of a scalar `func` at `inputs`, structured like torch.autograd.functional.hessian's result."""
    inputs_tuple, inputs_t = _as_tuple(inputs, "inputs", "hessian")
    if outer_jacobian_strategy not in _STRATEGIES:
        raise TransformError(f"hessian: outer_jacobian_strategy must be one of {_STRATEGIES}, got {outer_jacobian_strategy!r}")

    def jac_func(*inp: torch.Tensor) -> tuple:
        out = func(*inp)
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            raise TransformError(
                f"hessian: the function given to hessian should return a single-element Tensor, got "
                f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}."
            )
        gs = torch.autograd.grad(out.reshape(()), inp, create_graph=True, allow_unused=True)
        if strict and any(g is None for g in gs):
            raise RuntimeError("hessian(strict=True): the output is independent of an input. Pass strict=False to get zeros.")
        return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(gs, inp))

    res = jacobian(jac_func, inputs_t, create_graph=create_graph, strict=strict, vectorize=vectorize,
                   strategy=outer_jacobian_strategy)
    return res if inputs_tuple else res[0][0]


# ------------------------------------------------------------------------------------------------
# vector products


def _check_v(v: Any, ref: tuple, name: str, api: str) -> tuple:
    """`v` with the structure of `ref` (the inputs or the outputs); None only for one 1-element tensor."""
    if v is None:
        if len(ref) != 1 or ref[0].numel() != 1:
            raise TransformError(
                f"{api}: The vector v can only be None if the {name} to the user-provided function is a single "
                f"Tensor with a single element."
            )
        return (torch.ones_like(ref[0]),)
    _, vs = _as_tuple(v, "v", api)
    if len(vs) != len(ref):
        raise TransformError(f"{api}: v is a tuple of invalid length: should be {len(ref)} but got {len(vs)}.")
    for i, (a, b) in enumerate(zip(vs, ref)):
        if a.shape != b.shape:
            raise TransformError(
                f"{api}: Entry {i} in v has invalid size: should be {tuple(b.shape)} but got {tuple(a.shape)}."
            )
    return vs


def _grad(outputs: tuple, inputs: tuple, grad_outputs: tuple, create_graph: bool, strict: bool, api: str,
          what: str = "output") -> tuple:
    live = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
    gs = (torch.autograd.grad([o for o, _ in live], inputs, [g for _, g in live], create_graph=create_graph,
                              allow_unused=True) if live else (None,) * len(inputs))
    if strict:
        for i, g in enumerate(gs):
            if g is None:
                raise RuntimeError(
                    f"{api}(strict=True): The {what} of the user-provided function is independent of input {i}. "
                    f"This is not allowed in strict mode."
                )
    return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(gs, inputs))


def _post(t: tuple, create_graph: bool, is_tuple: bool) -> Any:
    t = tuple(x if create_graph else x.detach() for x in t)
    return t if is_tuple else t[0]


def _scalar_output(func: Callable, inp: tuple, api: str) -> torch.Tensor:
    out = func(*inp)
    _, outs = _as_tuple(out, "outputs of the user-provided function", api)
    if len(outs) != 1 or outs[0].numel() != 1:
        raise TransformError(f"{api}: The function given to {api} should return a single Tensor with a single element.")
    return outs[0]


def vjp(func: Callable, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple:
    """(func(inputs), v^T J) like torch.autograd.functional.vjp; `v` has the structure of the outputs."""
    inputs_tuple, inputs_t = _as_tuple(inputs, "inputs", "vjp")
    with torch.enable_grad():
        inp = _grad_inputs(inputs_t, create_graph)
        outputs = func(*inp)
        outputs_tuple, outs = _as_tuple(outputs, "outputs of the user-provided function", "vjp")
        vs = _check_v(v, outs, "outputs", "vjp")
        grads = _grad(outs, inp, vs, create_graph, strict, "vjp")
    return _post(outs, create_graph, outputs_tuple), _post(grads, create_graph, inputs_tuple)


def jvp(func: Callable, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple:
    """(func(inputs), J v) like torch.autograd.functional.jvp, by the double-backward trick."""
    inputs_tuple, inputs_t = _as_tuple(inputs, "inputs", "jvp")
    with torch.enable_grad():
        inp = _grad_inputs(inputs_t, create_graph)
        vs = _check_v(v, inp, "input", "jvp")
        outputs = func(*inp)
        outputs_tuple, outs = _as_tuple(outputs, "outputs of the user-provided function", "jvp")
        dummies = tuple(requires_grad(torch.zeros_like(o)) for o in outs)
        g = _grad(outs, inp, dummies, True, strict, "jvp")
        jv = _grad(g, dummies, vs, create_graph, strict, "jvp", what="gradient")
    return _post(outs, create_graph, outputs_tuple), _post(jv, create_graph, outputs_tuple)


def vhp(func: Callable, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple:
    """(func(inputs), v^T H) like torch.autograd.functional.vhp, for a scalar `func`."""
    inputs_tuple, inputs_t = _as_tuple(inputs, "inputs", "vhp")
    with torch.enable_grad():
        inp = _grad_inputs(inputs_t, create_graph)
        vs = _check_v(v, inp, "input", "vhp")
        out = _scalar_output(func, inp, "vhp")
        jac = _grad((out,), inp, (torch.ones_like(out),), True, strict, "vhp")
        res = _grad(jac, inp, vs, create_graph, strict, "vhp", what="jacobian")
    return _post((out,), create_graph, False), _post(res, create_graph, inputs_tuple)


def hvp(func: Callable, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple:
    """(func(inputs), H v) like torch.autograd.functional.hvp (double backward through a dummy)."""
    inputs_tuple, inputs_t = _as_tuple(inputs, "inputs", "hvp")
    with torch.enable_grad():
        inp = _grad_inputs(inputs_t, create_graph)
        vs = _check_v(v, inp, "input", "hvp")
        out = _scalar_output(func, inp, "hvp")
        jac = _grad((out,), inp, (torch.ones_like(out),), True, strict, "hvp")
        dummies = tuple(requires_grad(torch.zeros_like(x)) for x in inp)
        back = _grad(jac, inp, dummies, True, strict, "hvp", what="jacobian")
        res = _grad(back, dummies, vs, create_graph, strict, "hvp", what="jacobian")
    return _post((out,), create_graph, False), _post(res, create_graph, inputs_tuple)
