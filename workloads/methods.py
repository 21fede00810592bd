"""The methods, written once per task kind and shared by every workload of that kind.

Each builder takes a method name and the task's ingredients and returns a zero-argument callable:
the measured call. The `engine*` and `torch_func*` versions are the same code with the transform
module swapped (`engine` mirrors `torch.func`: `vmap`, `grad`, `hessian`, `vjp` ...), so a gap
between them is the engine's, never the workload's. `*_traced` / `*_compiled` wrap that same
function in `engine.trace`, `engine.compile` or `torch.compile`; the trace or compile happens on
the first call (`Workload.prepare` times it apart from the runs). `engine` is the engine as a user
gets it (automatic tracing on: repeated calls replay where proven identical); `engine_eager` runs
the same function inside `engine.auto_tracing(False)`: the eager path on every call.

Task kinds:
- `jacobian_method`: Jacobian of a vector function of one flat tensor (reverse mode).
- `jvp_method`: many Jacobian-vector products at one point (forward mode).
- `hessian_method`: Hessian of a scalar function of one flat tensor.
- `batched_hessian_method`: Hessians of a scalar function at many points (vmap over hessian).
- `hvp_method`: many Hessian-vector products at one point (vmap over the vjp of the gradient).
- `per_sample_grads_method`: gradients of a per-example loss w.r.t. shared parameters; also
  `engine_chunked` (the engine's vmap with `chunk_size=CHUNK_SIZE`: bounded peak memory).
- `batched_grad_method`: gradients of a scalar function at many points (vmap over grad), e.g. a
  log density at K MCMC chains' states.
- `leapfrog_method`: a Hamiltonian (HMC) leapfrog trajectory of many chains at once, each step
  one vmap(grad) of the log density.
- `particle_grad_method`: gradient of a Monte Carlo average over particles (grad over vmap), e.g.
  an ELBO over reparameterized samples.
- `ntk_method`: the empirical neural tangent kernel of a model between two sets of inputs, by
  Jacobian contraction (vmap(jacrev)) or by jvp-of-vjp products (the torch.func tutorial's two).
- `ensemble_method`: an ensemble of models with stacked parameters, vmapped over the models.
- `meta_grad_method`: MAML's meta-gradient: grad through an inner gradient step, vmapped over tasks.

The last three take `params` as a dict of tensors (what `torch.func.functional_call` takes).
The `jax` method of every kind is in `workloads.peers.jax_methods` (added with `with_jax`).
"""
from __future__ import annotations

import types
from typing import Any, Callable, Sequence

import torch

Fn = Callable[..., Any]
Thunk = Callable[[], Any]

# Methods served by a transform module (torch.func or engine), possibly wrapped.
TRANSFORM_METHODS = ("engine", "engine_eager", "engine_traced", "engine_compiled", "torch_func", "torch_func_compiled")
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
    """Apply the method's trace/compile step to `fn` (identity for `engine`, the engine as a user
    gets it, automatic tracing included; `engine_eager` runs `fn` with automatic tracing off)."""
    if method == "engine_eager":
        import engine

        if not hasattr(engine, "auto_tracing"):
            raise NotImplementedError("engine.auto_tracing does not exist at this commit; engine_eager cannot run")

        def eager(*args: Any, **kwargs: Any) -> Any:
            with engine.auto_tracing(False):
                return fn(*args, **kwargs)

        return eager
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
        return _compiled_keeping_validation(fn)
    return fn


def _compiled_keeping_validation(fn: Fn) -> Fn:
    """torch.compile(fn), without dynamo's process-wide switch of torch.distributions' argument
    validation to off (made when torch.compile sets up and when it first compiles; see
    engine.trace.distribution_validation_kept): later workloads in the same process keep raising
    on invalid parameters."""
    from engine.trace import distribution_validation_kept

    with distribution_validation_kept():
        compiled = torch.compile(fn)
    first = True

    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal first
        if first:
            with distribution_validation_kept():
                out = compiled(*args, **kwargs)
            first = False
            return out
        return compiled(*args, **kwargs)

    return run


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


def _at_points(kind: str, transform: str, method: str, f: Fn, points: torch.Tensor,
               loop_one: Callable[[Fn, torch.Tensor], torch.Tensor], closed_form: Fn | None) -> Thunk:
    """The methods of a derivative of `f` at each row of `points`: the transforms vmap `transform`
    (grad, hessian) over the rows; the loop calls `loop_one(f, point)` row by row."""
    if method == "loop":
        return lambda: torch.stack([loop_one(f, p) for p in points])
    if method in TRANSFORM_METHODS:
        ft = transforms(method)
        d = wrap(method, ft.vmap(getattr(ft, transform)(f)))
        return lambda: d(points)
    if method == "closed_form" and closed_form is not None:
        return lambda: closed_form(points)
    raise _unsupported(kind, method, ("loop", *TRANSFORM_METHODS, "closed_form"))


def batched_hessian_method(method: str, f: Fn, points: torch.Tensor, closed_form: Fn | None = None) -> Thunk:
    """Hessians of scalar `f` at each row of `points` (shape [B, k, k])."""
    return _at_points("batched hessian", "hessian", method, f, points,
                      lambda f, p: _loop_hessian(f, p.detach().requires_grad_()), closed_form)


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


def _loop_grad(f: Fn, x: torch.Tensor) -> torch.Tensor:
    xg = x.detach().requires_grad_()
    return torch.autograd.grad(f(xg), xg)[0]


def batched_grad_method(method: str, f: Fn, points: torch.Tensor, closed_form: Fn | None = None) -> Thunk:
    """Gradient of scalar `f` at each row of `points` (shape [K, *point]): one backward pass per
    point in the loop, one batched backward pass in the transforms."""
    return _at_points("batched grad", "grad", method, f, points, _loop_grad, closed_form)


def leapfrog(grad_log_density: Fn, q: torch.Tensor, p: torch.Tensor, step_size: float,
             steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`steps` leapfrog steps of Hamiltonian dynamics with unit mass (half momentum steps at both ends)."""
    p = p + 0.5 * step_size * grad_log_density(q)
    for i in range(steps):
        q = q + step_size * p
        p = p + (step_size if i < steps - 1 else 0.5 * step_size) * grad_log_density(q)
    return q, p


def leapfrog_method(method: str, log_density: Fn, positions: torch.Tensor, momenta: torch.Tensor,
                    step_size: float, steps: int, closed_form_grad: Fn | None = None) -> Thunk:
    """Final (positions, momenta) of a leapfrog trajectory from each row of `positions`/`momenta`
    (K chains). The loop runs the chains one after another (one backward pass per chain and step);
    the transforms run each step's K gradients as one vmap(grad), and a traced method records the
    whole trajectory once; `closed_form_grad(q [K, P]) -> [K, P]` is the hand-batched gradient."""
    if method == "loop":
        def run() -> tuple[torch.Tensor, torch.Tensor]:
            ends = [leapfrog(lambda x: _loop_grad(log_density, x), q, p, step_size, steps)
                    for q, p in zip(positions, momenta)]
            return torch.stack([q for q, _ in ends]), torch.stack([p for _, p in ends])
        return run
    if method in TRANSFORM_METHODS:
        ft = transforms(method)
        grads = ft.vmap(ft.grad(log_density))
        trajectory = wrap(method, lambda q, p: leapfrog(grads, q, p, step_size, steps))
        return lambda: trajectory(positions, momenta)
    if method == "closed_form" and closed_form_grad is not None:
        return lambda: leapfrog(closed_form_grad, positions, momenta, step_size, steps)
    raise _unsupported("leapfrog", method, ("loop", *TRANSFORM_METHODS, "closed_form"))


def particle_grad_method(method: str, f: Fn, phi: torch.Tensor, particles: torch.Tensor,
                         closed_form: Fn | None = None) -> Thunk:
    """Gradient w.r.t. `phi` of the mean of `f(phi, particle)` over the rows of `particles`.

    The loop evaluates `f` particle by particle and runs one backward pass through the sum (how
    it is written without vmap); the transforms take grad of a vmap over the particles.
    `closed_form(phi, particles)` returns the same gradient.
    """
    if method == "loop":
        def run() -> torch.Tensor:
            phig = phi.detach().requires_grad_()
            total = torch.stack([f(phig, particle) for particle in particles]).mean()
            return torch.autograd.grad(total, phig)[0]
        return run
    if method in TRANSFORM_METHODS:
        ft = transforms(method)

        def average(phi: torch.Tensor, particles: torch.Tensor) -> torch.Tensor:
            return ft.vmap(f, in_dims=(None, 0))(phi, particles).mean()
        g = wrap(method, ft.grad(average))
        return lambda: g(phi, particles)
    if method == "closed_form" and closed_form is not None:
        return lambda: closed_form(phi, particles)
    raise _unsupported("particle grad", method, ("loop", *TRANSFORM_METHODS, "closed_form"))


Params = dict[str, torch.Tensor]


def _leaf_params(params: Params) -> Params:
    return {k: v.detach().requires_grad_() for k, v in params.items()}


def _loop_jacobian(f: Fn, params: Params, x: torch.Tensor) -> torch.Tensor:
    """[outputs, parameters] Jacobian of f(params, x) w.r.t. all of params flattened, row by row."""
    out = f(params, x).reshape(-1)
    rows = [torch.autograd.grad(out[i], list(params.values()), retain_graph=True) for i in range(out.numel())]
    return torch.stack([torch.cat([g.reshape(-1) for g in row]) for row in rows])


NTK_FORMULATIONS = ("jacobian", "jvp_vjp")


def ntk_method(method: str, f: Fn, params: Params, x1: torch.Tensor, x2: torch.Tensor, formulation: str) -> Thunk:
    """Empirical NTK [N, M, O, O] of `f(params, x) -> [O]` (one example) between the rows of x1 and x2.

    `formulation` picks the transforms' way (the loop builds per-example Jacobians by backward
    passes and contracts them either way): "jacobian" contracts per-example Jacobians from
    vmap(jacrev); "jvp_vjp" computes J(x2) J(x1)^T e_a for each output basis vector e_a by a vjp
    followed by a jvp, never building a Jacobian.
    """
    if formulation not in NTK_FORMULATIONS:
        raise ValueError(f"unknown NTK formulation {formulation!r}; expected one of {NTK_FORMULATIONS}")
    if method == "loop":
        def run() -> torch.Tensor:
            leaves = _leaf_params(params)
            j1 = torch.stack([_loop_jacobian(f, leaves, x) for x in x1])
            j2 = torch.stack([_loop_jacobian(f, leaves, x) for x in x2])
            return torch.einsum("naf,mbf->nmab", j1, j2)
        return run
    if method not in TRANSFORM_METHODS:
        raise _unsupported("ntk", method, ("loop", *TRANSFORM_METHODS))
    ft = transforms(method)

    def by_jacobians(params: Params, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        jac1 = ft.vmap(ft.jacrev(f), (None, 0))(params, x1)
        jac2 = ft.vmap(ft.jacrev(f), (None, 0))(params, x2)
        blocks = [torch.einsum("Naf,Mbf->NMab", jac1[k].flatten(2), jac2[k].flatten(2)) for k in params]
        return torch.stack(blocks).sum(0)

    def by_products(params: Params, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        def ntk_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            out, vjp_fn = ft.vjp(lambda p: f(p, a), params)

            def column(vec: torch.Tensor) -> torch.Tensor:
                return ft.jvp(lambda p: f(p, b), (params,), vjp_fn(vec))[1]
            basis = torch.eye(out.numel(), dtype=out.dtype, device=out.device).view(out.numel(), -1)
            return ft.vmap(column)(basis)
        return ft.vmap(ft.vmap(ntk_pair, (None, 0)), (0, None))(x1, x2)
    ntk = wrap(method, by_jacobians if formulation == "jacobian" else by_products)
    return lambda: ntk(params, x1, x2)


def ensemble_method(method: str, f: Fn, params: Params, x: torch.Tensor, y: torch.Tensor | None = None) -> Thunk:
    """An ensemble with stacked parameters (`params[k][i]`: model i's) on its own inputs x[i].

    Without `y`: each model's predictions f(params_i, x_i) (stacked [M, ...]). With `y`: each
    model's gradients of its loss f(params_i, x_i, y_i) (a dict of [M, *shape]): one training step
    of the whole ensemble. The loop runs the models one after another.
    """
    models = x.shape[0]

    def model(i: int) -> Params:
        return {k: v[i] for k, v in params.items()}
    if method == "loop":
        if y is None:
            return lambda: torch.stack([f(model(i), x[i]) for i in range(models)])

        def run() -> Params:
            grads = []
            for i in range(models):
                leaves = _leaf_params(model(i))
                grads.append(dict(zip(leaves, torch.autograd.grad(f(leaves, x[i], y[i]), list(leaves.values())))))
            return {k: torch.stack([g[k] for g in grads]) for k in params}
        return run
    if method in TRANSFORM_METHODS:
        ft = transforms(method)
        if y is None:
            predict = wrap(method, ft.vmap(f))
            return lambda: predict(params, x)
        step = wrap(method, ft.vmap(ft.grad(f)))
        return lambda: step(params, x, y)
    raise _unsupported("ensemble", method, ("loop", *TRANSFORM_METHODS))


def meta_grad_method(method: str, loss: Fn, params: Params, support: tuple[torch.Tensor, torch.Tensor],
                     query: tuple[torch.Tensor, torch.Tensor], inner_lr: float) -> Thunk:
    """MAML's meta-gradient: d/dparams of the mean over tasks of loss(params - lr * grad loss(params,
    support_t), query_t), with `support`/`query` = (inputs, targets) stacked over tasks.

    The loop adapts task by task (a gradient with create_graph) and backpropagates once through
    the sum; the transforms take grad of a vmap over tasks of a function that itself calls grad.
    """
    (xs, ys), (xq, yq) = support, query

    def adapted(params: Params, grads: Params) -> Params:
        return {k: params[k] - inner_lr * grads[k] for k in params}
    if method == "loop":
        def run() -> Params:
            leaves = _leaf_params(params)
            names, values = list(leaves), list(leaves.values())
            total = 0
            for t in range(xs.shape[0]):
                grads = torch.autograd.grad(loss(leaves, xs[t], ys[t]), values, create_graph=True)
                total = total + loss(adapted(leaves, dict(zip(names, grads))), xq[t], yq[t])
            return dict(zip(names, torch.autograd.grad(total / xs.shape[0], values)))
        return run
    if method in TRANSFORM_METHODS:
        ft = transforms(method)

        def task_loss(params: Params, xs: torch.Tensor, ys: torch.Tensor, xq: torch.Tensor,
                      yq: torch.Tensor) -> torch.Tensor:
            return loss(adapted(params, ft.grad(loss)(params, xs, ys)), xq, yq)

        def meta_loss(params: Params, xs: torch.Tensor, ys: torch.Tensor, xq: torch.Tensor,
                      yq: torch.Tensor) -> torch.Tensor:
            return ft.vmap(task_loss, in_dims=(None, 0, 0, 0, 0))(params, xs, ys, xq, yq).mean()
        meta_grad = wrap(method, ft.grad(meta_loss))
        return lambda: meta_grad(params, xs, ys, xq, yq)
    raise _unsupported("meta grad", method, ("loop", *TRANSFORM_METHODS))
