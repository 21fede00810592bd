"""jax.numpy versions of the workloads' models, and the `jax` method of each workload.

Each function mirrors the torch function of the same name in its workload module, op for op, so
the two compute the same thing on the same weights and data; each builder (named after the
workload) takes the workload's inputs dict and returns the measured call from
`workloads.peers.jax_methods`. Imported only when a `jax` method is built (jax is imported here).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from workloads import bayes_logreg, per_sample_grads
from workloads.peers import jax_methods

Thunk = Callable[[], Any]
Params = tuple[Any, ...]


def cross_entropy(logits: Any, y: Any) -> Any:
    """F.cross_entropy of one example (logits [C], integer label y): logsumexp - the label's logit."""
    return jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]


# ---- workloads/per_sample_grads.py ----

def mlp_logits(params: Params, x: Any) -> Any:
    W1, b1, W2, b2 = params
    return jax.nn.relu(x @ W1.T + b1) @ W2.T + b2


def mlp_loss(params: Params, x: Any, y: Any) -> Any:
    return cross_entropy(mlp_logits(params, x), y)


def _max_pool2(h: Any) -> Any:
    """F.max_pool2d(h, 2) of one [C, H, W] example."""
    return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2), (1, 2, 2), "VALID")


def _conv2d(x: Any, weight: Any, bias: Any, padding: int) -> Any:
    """F.conv2d of one [C, H, W] example with an OIHW weight (cross-correlation, like torch)."""
    out = jax.lax.conv_general_dilated(
        x[None], weight, window_strides=(1, 1), padding=((padding, padding), (padding, padding)),
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
    )[0]
    return out + bias[:, None, None]


def cnn_logits(params: Params, x: Any) -> Any:
    c1, cb1, c2, cb2, W, b = params
    h = _max_pool2(jax.nn.relu(_conv2d(x, c1, cb1, padding=1)))
    h = _max_pool2(jax.nn.relu(_conv2d(h, c2, cb2, padding=1)))
    return h.reshape(-1) @ W.T + b


def cnn_loss(params: Params, x: Any, y: Any) -> Any:
    return cross_entropy(cnn_logits(params, x), y)


def layer_norm(h: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    """F.layer_norm over the last dim (biased variance, eps inside the square root)."""
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    return (h - mean) / jnp.sqrt(var + eps) * weight + bias


def attention_logits(params: Params, x: Any) -> Any:
    """One example x: [TOKENS, WIDTH] -> [CLASSES]."""
    Wq, Wk, Wv, Wo, ln_w, ln_b, W1, b1, W2, b2, Wc, bc = params
    heads, width = per_sample_grads.HEADS, per_sample_grads.WIDTH

    def split(t: Any) -> Any:  # [T, W] -> [H, T, W/H]
        return t.reshape(t.shape[0], heads, width // heads).transpose(1, 0, 2)

    q, k, v = split(x @ Wq.T), split(x @ Wk.T), split(x @ Wv.T)
    att = jax.nn.softmax(q @ k.transpose(0, 2, 1) / math.sqrt(width // heads), axis=-1)
    h = x + (att @ v).transpose(1, 0, 2).reshape(x.shape[0], width) @ Wo.T
    h = layer_norm(h, ln_w, ln_b)
    h = h + jax.nn.relu(h @ W1.T + b1) @ W2.T + b2
    return h.mean(0) @ Wc.T + bc


def attention_loss(params: Params, x: Any, y: Any) -> Any:
    return cross_entropy(attention_logits(params, x), y)


def _psg(loss: Callable[..., Any]) -> Callable[[dict[str, Any]], Thunk]:
    def build(inputs: dict[str, Any]) -> Thunk:
        return jax_methods.per_sample_grads(loss, inputs["params"], inputs["x"], inputs["y"])
    return build


psg_mlp = _psg(mlp_loss)
psg_cnn = _psg(cnn_loss)
psg_attention = _psg(attention_loss)


# ---- workloads/bayes_logreg.py ----

def neg_log_posterior(theta: Any, X: Any, y: Any) -> Any:
    logits = X @ theta
    nll = (jax.nn.softplus(logits) - y * logits).sum()
    return nll + 0.5 * (theta * theta).sum() / bayes_logreg.PRIOR_SCALE**2


def log_likelihood(params: Params, x: Any, y: Any) -> Any:
    (theta,) = params
    logit = x @ theta
    return y * logit - jax.nn.softplus(logit)


def robust_neg_log_posterior(theta: Any, X: Any, y: Any) -> Any:
    nu = bayes_logreg.STUDENT_NU
    beta, log_sigma = theta[:-1], theta[-1]
    r = (y - X @ beta) * jnp.exp(-log_sigma)
    nll = (0.5 * (nu + 1) * jnp.log1p(r * r / nu)).sum() + y.shape[0] * log_sigma
    return nll + 0.5 * (beta * beta).sum() + 0.5 * log_sigma * log_sigma


def logreg_hessian(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.hessian(neg_log_posterior, inputs["theta"], inputs["X"], inputs["y"])


def logreg_per_example_grads(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.per_sample_grads(log_likelihood, (inputs["theta"],), inputs["X"], inputs["y"])


def robust_reg_hessian(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.hessian(robust_neg_log_posterior, inputs["theta"], inputs["X"], inputs["y"])


# ---- workloads/hessians.py ----

def _unflatten(theta: Any, shapes: list[tuple[int, ...]]) -> list[Any]:
    out, start = [], 0
    for shape in shapes:
        numel = math.prod(shape)
        out.append(theta[start:start + numel].reshape(shape))
        start += numel
    return out


def _mlp_regression_loss(shapes: list[tuple[int, ...]]) -> Callable[..., Any]:
    def loss(theta: Any, X: Any, y: Any) -> Any:
        W1, b1, W2, b2 = _unflatten(theta, shapes)
        pred = (jnp.tanh(X @ W1.T + b1) @ W2.T + b2)[..., 0]
        return ((pred - y) ** 2).mean()
    return loss


def mlp_loss_hessian(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.hessian(_mlp_regression_loss(inputs["shapes"]), inputs["theta"], inputs["X"], inputs["y"])


def mlp_hvp(inputs: dict[str, Any]) -> Thunk:
    loss = _mlp_regression_loss(inputs["shapes"])
    return jax_methods.hvp(loss, inputs["theta"], inputs["vectors"], inputs["X"], inputs["y"])


def rosenbrock(x: Any) -> Any:
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def rosenbrock_hessian(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.hessian(rosenbrock, inputs["x"])


def quadratic(x: Any, A: Any, b: Any) -> Any:
    return 0.5 * x @ (A @ x) + b @ x


def quadratic_hessian(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.hessian(quadratic, inputs["x"], inputs["A"], inputs["b"])


def pinn_u(x: Any, W1: Any, b1: Any, w2: Any) -> Any:
    return jnp.tanh(W1 @ x + b1) @ w2


def pinn_batched_hessian(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.batched_hessian(pinn_u, inputs["points"], inputs["W1"], inputs["b1"], inputs["w2"])


def jacobian_mlp(x: Any, W1: Any, b1: Any, W2: Any, b2: Any) -> Any:
    return jnp.tanh(x @ W1.T + b1) @ W2.T + b2


def mlp_jacobian(inputs: dict[str, Any]) -> Thunk:
    weights = (inputs["W1"], inputs["b1"], inputs["W2"], inputs["b2"])
    return jax_methods.jacobian(jacobian_mlp, inputs["x"], *weights, chunk_size=inputs.get("chunk"))


chunked_jacobian = mlp_jacobian


def jvp_mlp(x: Any, W1: Any, b1: Any, W2: Any) -> Any:
    return jnp.tanh(W1 @ x + b1) @ W2.T


def mlp_jvp(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.jvp(jvp_mlp, inputs["x"], inputs["tangents"], inputs["W1"], inputs["b1"], inputs["W2"])

