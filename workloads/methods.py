"""The methods, written once per task kind and shared by every workload of that kind.

Each builder takes a method name and the task's ingredients and returns a zero-argument callable:
the measured call. The `engine*` and `torch_func*` versions are the same code with the transform
module swapped (`engine` mirrors `torch.func`: `vmap`, `grad`, `hessian`, `vjp` ...), so a gap
between them is the engine's, never the workload's. `*_traced` / `*_compiled` wrap that same
function in `engine.trace`, `engine.compile` or `torch.compile`; the trace or compile happens on
the first call (`Workload.prepare` times it apart from the runs).

Task kinds:
- `jacobian_method`: Jacobian of a vector function of one flat tensor (reverse mode).
- `jvp_method`: many Jacobian-vector products at one point (forward mode).
- `hessian_method`: Hessian of a scalar function of one flat tensor.
- `batched_hessian_method`: Hessians of a scalar function at many points (vmap over hessian).
- `hvp_method`: many Hessian-vector products at one point (vmap over the vjp of the gradient).
- `per_sample_grads_method`: gradients of a per-example loss w.r.t. shared parameters; also
  `engine_chunked` (the engine's vmap with `chunk_size=CHUNK_SIZE`: bounded peak memory).

The `jax` method of every kind is in `workloads.peers.jax_methods` (added with `with_jax`).
"""
from __future__ import annotations

import types
from typing import Any, Callable, Sequence

import torch

Fn = Callable[..., Any]
Thunk = Callable[[], Any]

# Methods served by a transform module (torch.func or engine), possibly wrapped.
TRANSFORM_METHODS = ("engine", "engine_traced", "engine_compiled", "torch_func", "torch_func_compiled")
# Examples per chunk of the `engine_chunked` per-sample-gradient method (engine.vmap's chunk_size).
CHUNK_SIZE = 32


def transforms(method: str) -> types.ModuleType:
    """The module whose vmap/grad/hessian/vjp a method uses: `engine` or `torch.func`."""
    if method.startswith("engine"):
        import engine

        return engine
    if method.startswith("torch_func"):
        import torch.func

        return torch.func
    raise ValueError(f"method {method!r} does not use a transform module; expected one of {TRANSFORM_METHODS}")


def wrap(method: str, fn: Fn) -> Fn:
    """Apply the method's trace/compile step to `fn` (identity for eager methods)."""
    if method == "engine_traced":
        import engine

        if not hasattr(engine, "trace"):
            raise NotImplementedError("engine.trace is not implemented yet; engine_traced cannot run")
        return engine.trace(fn)
    if method == "engine_compiled":
        import engine

        if not hasattr(engine, "compile"):
            raise NotImplementedError("engine.compile is not implemented yet; engine_compiled cannot run")
        return engine.compile(fn)
    if method.endswith("_compiled"):
        return torch.compile(fn)
    return fn


def _unsupported(kind: str, method: str, supported: Sequence[str]) -> ValueError:
    return ValueError(f"{kind}: method {method!r} is not implemented; it supports {', '.join(supported)}")


def _loop_hessian(f: Fn, x: torch.Tensor) -> torch.Tensor:
    """Row by row: one gradient with create_graph, then one backward pass per entry of x."""
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    g = g.reshape(-1)
    rows = [torch.autograd.grad(g[i], x, retain_graph=True)[0].reshape(-1) for i in range(g.numel())]
    return torch.stack(rows).reshape(*x.shape, *x.shape)


def _at_point(kind: str, transform: str, functional: Fn, method: str, f: Fn, x: torch.Tensor,
              loop: Callable[[], Thunk], closed_form: Fn | None, **transform_kwargs: Any) -> Thunk:
    """The methods of a derivative of `f` at one point `x`: `transform` names the torch.func/engine
    transform (jacrev, hessian), called with `transform_kwargs`; `functional` is its
    torch.autograd.functional twin."""
    if method == "loop":
        return loop()
    if method in TRANSFORM_METHODS:
        d = wrap(method, getattr(transforms(method), transform)(f, **transform_kwargs))
        return lambda: d(x)
    if method == "functional_vectorize":
        return lambda: functional(f, x, vectorize=True)
    if method == "closed_form" and closed_form is not None:
        return lambda: closed_form(x)
    raise _unsupported(kind, method, ("loop", *TRANSFORM_METHODS, "functional_vectorize", "closed_form"))


def jacobian_method(method: str, f: Fn, x: torch.Tensor, closed_form: Fn | None = None,
                    chunk_size: int | None = None) -> Thunk:
    """Jacobian of `f`: R^n -> R^m at a 1-d `x` (shape [m, n]) by reverse mode: the loop runs one
    backward pass per output; the transforms run all of them as one batched backward pass, or
    `chunk_size` rows at a time (less peak memory)."""

    def loop() -> Thunk:
        xg = x.detach().requires_grad_()

        def run() -> torch.Tensor:
            out = f(xg)
            return torch.stack([torch.autograd.grad(out[i], xg, retain_graph=True)[0] for i in range(out.numel())])
        return run
    kwargs = {} if chunk_size is None else {"chunk_size": chunk_size}
    if chunk_size is not None and method == "functional_vectorize":
        raise _unsupported("chunked jacobian", method, ("loop", *TRANSFORM_METHODS, "closed_form"))
    return _at_point("jacobian", "jacrev", torch.autograd.functional.jacobian, method, f, x, loop, closed_form, **kwargs)


def jvp_method(method: str, f: Fn, x: torch.Tensor, tangents: torch.Tensor, closed_form: Fn | None = None) -> Thunk:
    """J(x) @ t for each row t of `tangents` (shape [K, m]). The loop is PyTorch's forward-mode AD,
    one dual-number pass per tangent; the transforms vmap `jvp` over the tangents (torch.func by
    forward AD, the engine by the double-vjp construction), so this also compares the two designs."""
    if method == "loop":
        import torch.autograd.forward_ad as fwad

        def run() -> torch.Tensor:
            with fwad.dual_level():
                return torch.stack([fwad.unpack_dual(f(fwad.make_dual(x, t))).tangent for t in tangents])
        return run
    if method in TRANSFORM_METHODS:
        ft = transforms(method)
        jvps = wrap(method, ft.vmap(lambda t: ft.jvp(f, (x,), (t,))[1]))
        return lambda: jvps(tangents)
    if method == "closed_form" and closed_form is not None:
        return lambda: closed_form(x, tangents)
    raise _unsupported("jvp", method, ("loop", *TRANSFORM_METHODS, "closed_form"))


def hessian_method(method: str, f: Fn, x: torch.Tensor, closed_form: Fn | None = None) -> Thunk:
    """Hessian of scalar `f` at `x` (shape x.shape + x.shape)."""

    def loop() -> Thunk:
        xg = x.detach().requires_grad_()
        return lambda: _loop_hessian(f, xg)
    return _at_point("hessian", "hessian", torch.autograd.functional.hessian, method, f, x, loop, closed_form)


def batched_hessian_method(method: str, f: Fn, points: torch.Tensor, closed_form: Fn | None = None) -> Thunk:
    """Hessians of scalar `f` at each row of `points` (shape [B, k, k])."""
    if method == "loop":
        def run() -> torch.Tensor:
            return torch.stack([_loop_hessian(f, p.detach().requires_grad_()) for p in points])
        return run
    if method in TRANSFORM_METHODS:
        ft = transforms(method)
        h = wrap(method, ft.vmap(ft.hessian(f)))
        return lambda: h(points)
    if method == "closed_form" and closed_form is not None:
        return lambda: closed_form(points)
    raise _unsupported("batched hessian", method, ("loop", *TRANSFORM_METHODS, "closed_form"))


def hvp_method(method: str, f: Fn, x: torch.Tensor, vectors: torch.Tensor) -> Thunk:
    """Hessian of scalar `f` at `x` times each row of `vectors` (shape [K, *x.shape]).

    Reverse-over-reverse in every method (the loop's strategy), so the methods differ only in
    how the K backward passes through the gradient's graph are batched.
    """
    if method == "loop":
        xg = x.detach().requires_grad_()

        def run() -> torch.Tensor:
            (g,) = torch.autograd.grad(f(xg), xg, create_graph=True)
            return torch.stack([torch.autograd.grad(g, xg, v, retain_graph=True)[0] for v in vectors])
        return run
    if method in TRANSFORM_METHODS:
        ft = transforms(method)

        def hvps(x: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
            _, vjp_fn = ft.vjp(ft.grad(f), x)
            return ft.vmap(vjp_fn)(vectors)[0]
        h = wrap(method, hvps)
        return lambda: h(x, vectors)
    raise _unsupported("hvp", method, ("loop", *TRANSFORM_METHODS))


def per_sample_grads_method(
    method: str,
    loss: Fn,
    params: tuple[torch.Tensor, ...],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    closed_form: Fn | None = None,
) -> Thunk:
    """Per-example gradients of `loss(params, x, y)` w.r.t. each of `params`.

    `loss` must work on one example (x = inputs[i], a 0-d loss) and on a batch (per-example losses
    of shape [B]); functional_vectorize uses the batched form. Returns a tuple of [B, *p.shape].
    """
    if method in ("loop", "loop_compiled"):
        leaves = tuple(p.detach().requires_grad_() for p in params)
        example_loss = torch.compile(loss) if method == "loop_compiled" else loss

        def run() -> tuple[torch.Tensor, ...]:
            grads = [torch.autograd.grad(example_loss(leaves, x, y), leaves) for x, y in zip(inputs, targets)]
            return tuple(torch.stack(g) for g in zip(*grads))
        return run
    if method in TRANSFORM_METHODS:
        ft = transforms(method)
        psg = wrap(method, ft.vmap(ft.grad(loss), in_dims=(None, 0, 0)))
        return lambda: psg(params, inputs, targets)
    if method == "engine_chunked":
        import engine

        chunked = engine.vmap(engine.grad(loss), in_dims=(None, 0, 0), chunk_size=CHUNK_SIZE)
        return lambda: chunked(params, inputs, targets)
    if method == "functional_vectorize":
        def losses(*ps: torch.Tensor) -> torch.Tensor:
            return loss(ps, inputs, targets)
        return lambda: torch.autograd.functional.jacobian(losses, params, vectorize=True)
    if method == "closed_form" and closed_form is not None:
        return lambda: closed_form(params, inputs, targets)
    raise _unsupported(
        "per-sample grads", method,
        ("loop", "loop_compiled", *TRANSFORM_METHODS, "engine_chunked", "functional_vectorize", "closed_form"),
    )
