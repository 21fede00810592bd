"""Hessians (of a network loss, of classic test functions, at many points), Hessian-vector products
and network Jacobians: the second-order and Jacobian workloads.

- `mlp_loss_hessian`: full Hessian of a small tanh MLP's regression loss w.r.t. its flattened
  parameters (P = 10 * hidden + 1 of them), the object second-order optimisers and Laplace
  approximations of networks need.
- `rosenbrock_hessian`, `quadratic_hessian`: test functions at several dimensions, both with a
  closed form (Rosenbrock's is tridiagonal; a quadratic form's is (A + A^T) / 2).
- `pinn_batched_hessian`: vmap(hessian) of a network u: R^3 -> R over many collocation points,
  as physics-informed nets do for Laplacians; closed form for one tanh hidden layer.
- `mlp_hvp`: K Hessian-vector products of the MLP loss at one point (Lanczos, Hutchinson trace).
- `mlp_jacobian`: jacrev of a small tanh MLP R^16 -> R^8 w.r.t. its input (sensitivity analysis,
  Jacobian regularisers, normalising flows), with the closed form W2 diag(1 - tanh^2) W1.
- `chunked_jacobian`: the same kind of Jacobian, 256 x 256 through a 4096-wide layer, computed
  `chunk` rows at a time (chunk=256: all at once): peak memory against time as the chunk shrinks.
- `mlp_jvp`: K Jacobian-vector products of a tanh MLP 64-256-64 at one point (forward mode:
  PyTorch's forward AD per tangent vs vmap(jvp): forward AD in torch.func, double vjp in the engine).

Each torch model has its JAX twin `<name>_jax` right below it (the same ops in jax.numpy);
`<workload>_jax` builds the workload's `jax` method from it.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from workloads.define import define
from workloads.methods import batched_hessian_method, hessian_method, hvp_method, jacobian_method, jvp_method
from workloads.peers import jax_methods
from workloads.peers.jax_methods import jnp, with_jax

FAMILY = "hessians"
MLP_IN = 8
MLP_EXAMPLES = 64


def mlp_shapes(hidden: int) -> list[tuple[int, ...]]:
    return [(hidden, MLP_IN), (hidden,), (1, hidden), (1,)]


def unflatten(theta: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """Split a flat parameter vector into tensors of `shapes` (views, so vmap batches them; by
    `reshape`, so the jax method's jax.numpy arrays split the same way)."""
    out, start = [], 0
    for shape in shapes:
        numel = math.prod(shape)
        out.append(theta[start:start + numel].reshape(shape))
        start += numel
    return out


def mlp_loss(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor, shapes: list[tuple[int, ...]]) -> torch.Tensor:
    W1, b1, W2, b2 = unflatten(theta, shapes)
    pred = (torch.tanh(X @ W1.T + b1) @ W2.T + b2).squeeze(-1)
    return ((pred - y) ** 2).mean()


def mlp_loss_jax(theta: Any, X: Any, y: Any, shapes: list[tuple[int, ...]]) -> Any:
    W1, b1, W2, b2 = unflatten(theta, shapes)
    pred = (jnp.tanh(X @ W1.T + b1) @ W2.T + b2)[..., 0]
    return ((pred - y) ** 2).mean()


def mlp_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    hidden = params["hidden"]
    shapes = mlp_shapes(hidden)
    X = torch.randn(MLP_EXAMPLES, MLP_IN, generator=gen)
    y = torch.sin(X.sum(1))
    fan_in = [MLP_IN, MLP_IN, hidden, hidden]
    theta = torch.cat([torch.randn(math.prod(s), generator=gen) / math.sqrt(f) for s, f in zip(shapes, fan_in)])
    out = {"X": X, "y": y, "theta": theta, "shapes": shapes}
    if "k" in params:
        out["vectors"] = torch.randn(params["k"], theta.numel(), generator=gen)
    return out


def mlp_hessian_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    X, y, shapes = inputs["X"], inputs["y"], inputs["shapes"]
    return hessian_method(method, lambda theta: mlp_loss(theta, X, y, shapes), inputs["theta"])


def mlp_loss_hessian_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    shapes = inputs["shapes"]
    return jax_methods.hessian(lambda theta, X, y: mlp_loss_jax(theta, X, y, shapes), inputs["theta"],
                               inputs["X"], inputs["y"])


define(
    name="mlp_loss_hessian",
    family=FAMILY,
    description=f"Hessian of a tanh MLP's MSE loss ({MLP_EXAMPLES} examples) w.r.t. its flattened parameters",
    grid={"hidden": [8, 32, 128]},
    methods=("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", "jax"),
    make_inputs=mlp_data,
    make_method=with_jax(mlp_hessian_method, mlp_loss_hessian_jax),
    quick=(),  # out of the quick profile (10 min budget): mlp_jacobian and the other Hessians cover it there
)


def mlp_hvp_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    X, y, shapes = inputs["X"], inputs["y"], inputs["shapes"]
    return hvp_method(method, lambda theta: mlp_loss(theta, X, y, shapes), inputs["theta"], inputs["vectors"])


def mlp_hvp_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    shapes = inputs["shapes"]
    return jax_methods.hvp(lambda theta, X, y: mlp_loss_jax(theta, X, y, shapes), inputs["theta"],
                           inputs["vectors"], inputs["X"], inputs["y"])


define(
    name="mlp_hvp",
    family=FAMILY,
    description="K Hessian-vector products of the MLP loss at one point (reverse-over-reverse)",
    grid={"hidden": [32, 128], "k": [8, 128]},
    methods=("loop", "engine", "engine_traced", "torch_func", "jax"),
    make_inputs=mlp_data,
    make_method=with_jax(mlp_hvp_method, mlp_hvp_jax),
    quick=("hidden=128,k=8",),
)


def point_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    d = params["d"]
    return {
        "x": torch.randn(d, generator=gen),
        "A": torch.randn(d, d, generator=gen) / math.sqrt(d),
        "b": torch.randn(d, generator=gen),
    }


def rosenbrock(x: torch.Tensor) -> torch.Tensor:
    """Written with array operators only: the same function is its own JAX twin."""
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def rosenbrock_hessian_closed_form(x: torch.Tensor) -> torch.Tensor:
    diag = torch.zeros_like(x)
    diag[:-1] += 1200 * x[:-1] ** 2 - 400 * x[1:] + 2
    diag[1:] += 200
    off = -400 * x[:-1]
    return torch.diag(diag) + torch.diag(off, 1) + torch.diag(off, -1)


def rosenbrock_hessian_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    return jax_methods.hessian(rosenbrock, inputs["x"])


define(
    name="rosenbrock_hessian",
    family=FAMILY,
    description="Hessian of the d-dimensional Rosenbrock function (tridiagonal closed form)",
    grid={"d": [8, 128, 1024]},
    methods=("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", "closed_form", "jax"),
    make_inputs=point_data,
    make_method=with_jax(
        lambda method, inputs: hessian_method(method, rosenbrock, inputs["x"], rosenbrock_hessian_closed_form),
        rosenbrock_hessian_jax),
    quick=("d=128",),
)


def quadratic_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    A, b = inputs["A"], inputs["b"]

    def quadratic(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x @ (A @ x) + b @ x
    return hessian_method(method, quadratic, inputs["x"], lambda x: 0.5 * (A + A.T))


def quadratic_jax(x: Any, A: Any, b: Any) -> Any:
    return 0.5 * x @ (A @ x) + b @ x


def quadratic_hessian_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    return jax_methods.hessian(quadratic_jax, inputs["x"], inputs["A"], inputs["b"])


define(
    name="quadratic_hessian",
    family=FAMILY,
    description="Hessian of a quadratic form 0.5 x^T A x + b^T x with a dense non-symmetric A",
    grid={"d": [8, 128, 1024]},
    methods=("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", "closed_form", "jax"),
    make_inputs=point_data,
    make_method=with_jax(quadratic_method, quadratic_hessian_jax),
)

PINN_DIM = 3
PINN_HIDDEN = 64


def pinn_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    return {
        "points": torch.rand(params["points"], PINN_DIM, generator=gen) * 2 - 1,
        "W1": torch.randn(PINN_HIDDEN, PINN_DIM, generator=gen),
        "b1": torch.randn(PINN_HIDDEN, generator=gen),
        "w2": torch.randn(PINN_HIDDEN, generator=gen) / math.sqrt(PINN_HIDDEN),
    }


def pinn_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    W1, b1, w2 = inputs["W1"], inputs["b1"], inputs["w2"]

    def u(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(W1 @ x + b1) @ w2

    def closed_form(points: torch.Tensor) -> torch.Tensor:
        # d2/dx2 of w2 . tanh(W1 x + b1) = W1^T diag(w2 * tanh'') W1, tanh'' = -2 t (1 - t^2).
        t = torch.tanh(points @ W1.T + b1)
        c = w2 * (-2 * t * (1 - t * t))
        return torch.einsum("bm,mi,mj->bij", c, W1, W1)
    return batched_hessian_method(method, u, inputs["points"], closed_form)


def pinn_u_jax(x: Any, W1: Any, b1: Any, w2: Any) -> Any:
    return jnp.tanh(W1 @ x + b1) @ w2


def pinn_batched_hessian_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    return jax_methods.batched_hessian(pinn_u_jax, inputs["points"], inputs["W1"], inputs["b1"], inputs["w2"])


define(
    name="pinn_batched_hessian",
    family=FAMILY,
    description=f"vmap(hessian) of a 1-hidden-layer tanh net R^{PINN_DIM} -> R at many collocation points",
    grid={"points": [16, 256, 4096]},
    methods=("loop", "engine", "engine_traced", "torch_func", "closed_form", "jax"),
    make_inputs=pinn_data,
    make_method=with_jax(pinn_method, pinn_batched_hessian_jax),
    quick=("points=256",),
)

JAC_IN, JAC_OUT = 16, 8


def jacobian_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    hidden, n_in, n_out = params["hidden"], params.get("n_in", JAC_IN), params.get("n_out", JAC_OUT)
    out = {
        "x": torch.randn(n_in, generator=gen),
        "W1": torch.randn(hidden, n_in, generator=gen) / math.sqrt(n_in),
        "b1": torch.randn(hidden, generator=gen) * 0.1,
        "W2": torch.randn(n_out, hidden, generator=gen) / math.sqrt(hidden),
        "b2": torch.randn(n_out, generator=gen) * 0.1,
    }
    if "chunk" in params:
        out["chunk"] = params["chunk"]
    return out


def jacobian_mlp_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    W1, b1, W2, b2 = inputs["W1"], inputs["b1"], inputs["W2"], inputs["b2"]
    chunk = inputs.get("chunk")

    def mlp(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ W1.T + b1) @ W2.T + b2

    def closed_form(x: torch.Tensor) -> torch.Tensor:
        t = torch.tanh(W1 @ x + b1)
        return (W2 * (1 - t * t)) @ W1
    return jacobian_method(method, mlp, inputs["x"], closed_form, chunk_size=chunk)


def jacobian_mlp_jax(x: Any, W1: Any, b1: Any, W2: Any, b2: Any) -> Any:
    return jnp.tanh(x @ W1.T + b1) @ W2.T + b2


def mlp_jacobian_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    """The jax method of mlp_jacobian and chunked_jacobian (rows `chunk` at a time by lax.map)."""
    weights = (inputs["W1"], inputs["b1"], inputs["W2"], inputs["b2"])
    return jax_methods.jacobian(jacobian_mlp_jax, inputs["x"], *weights, chunk_size=inputs.get("chunk"))


define(
    name="mlp_jacobian",
    family=FAMILY,
    description=f"jacrev of a tanh MLP {JAC_IN}-hidden-{JAC_OUT} w.r.t. its input (one batched backward pass)",
    grid={"hidden": [32, 256]},
    methods=("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", "closed_form", "jax"),
    make_inputs=jacobian_data,
    make_method=with_jax(jacobian_mlp_method, mlp_jacobian_jax),
    quick=("hidden=32",),
)

CHUNKED_DIM, CHUNKED_HIDDEN = 256, 4096


def chunked_jacobian_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    sizes = {"hidden": CHUNKED_HIDDEN, "n_in": CHUNKED_DIM, "n_out": CHUNKED_DIM, "chunk": params["chunk"]}
    return jacobian_data(sizes, gen)


define(
    name="chunked_jacobian",
    family=FAMILY,
    description=f"jacrev of a tanh MLP {CHUNKED_DIM}-{CHUNKED_HIDDEN}-{CHUNKED_DIM}, `chunk` output rows per "
                f"batched backward pass (chunk={CHUNKED_DIM}: one pass)",
    grid={"chunk": [16, 64, CHUNKED_DIM]},
    methods=("loop", "engine", "engine_traced", "torch_func", "closed_form", "jax"),
    make_inputs=chunked_jacobian_data,
    make_method=with_jax(jacobian_mlp_method, mlp_jacobian_jax),
    quick=(),  # out of the quick profile (10 min budget): the chunk sweep is a full-profile and memory-limit subject
)

JVP_DIM, JVP_HIDDEN = 64, 256


def jvp_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    return {
        "x": torch.randn(JVP_DIM, generator=gen),
        "tangents": torch.randn(params["k"], JVP_DIM, generator=gen),
        "W1": torch.randn(JVP_HIDDEN, JVP_DIM, generator=gen) / math.sqrt(JVP_DIM),
        "b1": torch.randn(JVP_HIDDEN, generator=gen) * 0.1,
        "W2": torch.randn(JVP_DIM, JVP_HIDDEN, generator=gen) / math.sqrt(JVP_HIDDEN),
    }


def jvp_mlp_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    W1, b1, W2 = inputs["W1"], inputs["b1"], inputs["W2"]

    def mlp(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(W1 @ x + b1) @ W2.T

    def closed_form(x: torch.Tensor, tangents: torch.Tensor) -> torch.Tensor:
        t = torch.tanh(W1 @ x + b1)
        return (tangents @ W1.T) * (1 - t * t) @ W2.T
    return jvp_method(method, mlp, inputs["x"], inputs["tangents"], closed_form)


def jvp_mlp_jax(x: Any, W1: Any, b1: Any, W2: Any) -> Any:
    return jnp.tanh(W1 @ x + b1) @ W2.T


def mlp_jvp_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    return jax_methods.jvp(jvp_mlp_jax, inputs["x"], inputs["tangents"], inputs["W1"], inputs["b1"], inputs["W2"])


define(
    name="mlp_jvp",
    family=FAMILY,
    description=f"K Jacobian-vector products of a tanh MLP {JVP_DIM}-{JVP_HIDDEN}-{JVP_DIM} at one point (forward mode)",
    grid={"k": [16, 128]},
    methods=("loop", "engine", "engine_traced", "torch_func", "closed_form", "jax"),
    make_inputs=jvp_data,
    make_method=with_jax(jvp_mlp_method, mlp_jvp_jax),
    quick=("k=16",),
)
