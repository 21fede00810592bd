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

from workloads import bayes_logreg, hessians, per_sample_grads, tutorials
from workloads.peers import jax_methods

Thunk = Callable[[], Any]
Params = tuple[Any, ...]


def cross_entropy(logits: Any, y: Any) -> Any:
    """F.cross_entropy of one example (logits [C], integer label y): logsumexp - the label's logit."""
    return jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]


# ---- workloads/per_sample_grads.py ----

def _conv(x: Any, weight: Any, bias: Any | None = None, stride: int = 1, padding: int = 0) -> Any:
    """F.conv2d of one [C, H, W] example with an OIHW weight (cross-correlation, like torch)."""
    out = jax.lax.conv_general_dilated(
        x[None], weight, window_strides=(stride, stride), padding=((padding, padding), (padding, padding)),
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
    )[0]
    return out if bias is None else out + bias[:, None, None]


def _pool(h: Any, size: int, stride: int, kind: str) -> Any:
    """F.max_pool2d / F.avg_pool2d (no padding) of one [C, H, W] example."""
    window, strides = (1, size, size), (1, stride, stride)
    if kind == "max":
        return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, window, strides, "VALID")
    return jax.lax.reduce_window(h, 0.0, jax.lax.add, window, strides, "VALID") / (size * size)


def mlp_logits(params: Params, x: Any) -> Any:
    W1, b1, W2, b2 = params
    return jax.nn.relu(x @ W1.T + b1) @ W2.T + b2


def mlp_loss(params: Params, x: Any, y: Any) -> Any:
    return cross_entropy(mlp_logits(params, x), y)


def cnn_logits(params: Params, x: Any) -> Any:
    c1, cb1, c2, cb2, W, b = params
    h = _pool(jax.nn.relu(_conv(x, c1, cb1, padding=1)), 2, 2, "max")
    h = _pool(jax.nn.relu(_conv(h, c2, cb2, padding=1)), 2, 2, "max")
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

def _mlp_regression_loss(shapes: list[tuple[int, ...]]) -> Callable[..., Any]:
    def loss(theta: Any, X: Any, y: Any) -> Any:
        W1, b1, W2, b2 = hessians.unflatten(theta, shapes)
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



# ---- workloads/nn_models.py (the modules written out; parameters by their state-dict names) ----

def _linear(p: dict[str, Any], name: str, x: Any) -> Any:
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def bce_with_logits(z: Any, y: Any) -> Any:
    """F.binary_cross_entropy_with_logits of one example: softplus(z) - y z."""
    return jax.nn.softplus(z) - y * z


def nn_logreg_loss(p: dict[str, Any], x: Any, y: Any) -> Any:
    return bce_with_logits(_linear(p, "fc1", x)[0], y)


def nn_ffnn_loss(p: dict[str, Any], x: Any, y: Any) -> Any:
    return cross_entropy(_linear(p, "fc2", jax.nn.relu(_linear(p, "fc1", x))), y)


def nn_mnist_cnn_loss(p: dict[str, Any], x: Any, y: Any) -> Any:
    h = _pool(jax.nn.relu(_conv(x, p["conv1.weight"], p["conv1.bias"], stride=2, padding=3)), 2, 1, "max")
    h = _pool(jax.nn.relu(_conv(h, p["conv2.weight"], p["conv2.bias"], stride=2)), 2, 1, "max")
    return cross_entropy(_linear(p, "fc2", jax.nn.relu(_linear(p, "fc1", h.reshape(-1)))), y)


def nn_embedding_loss(p: dict[str, Any], x: Any, y: Any) -> Any:
    return cross_entropy(_linear(p, "fc1", p["emb.weight"][x].mean(0)), y)


def lstm(x: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any) -> Any:
    """nn.LSTM (one layer, zero initial state) over x: [T, in] -> hidden states [T, hidden];
    gates in torch's order (input, forget, cell, output), scanned over time."""
    hidden = w_hh.shape[1]

    def step(carry: tuple[Any, Any], x_t: Any) -> tuple[tuple[Any, Any], Any]:
        h, c = carry
        i, f, g, o = jnp.split(x_t @ w_ih.T + b_ih + h @ w_hh.T + b_hh, 4)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    zeros = jnp.zeros(hidden, x.dtype)
    return jax.lax.scan(step, (zeros, zeros), x)[1]


def nn_lstm_loss(p: dict[str, Any], x: Any, y: Any) -> Any:
    h = lstm(p["emb.weight"][x], p["lstm.weight_ih_l0"], p["lstm.weight_hh_l0"], p["lstm.bias_ih_l0"],
             p["lstm.bias_hh_l0"])
    return cross_entropy(_linear(p, "fc1", h.mean(0)), y)


# CIFAR10Net.layers: indices of the conv layers (each "layers.i.0" inside a conv+ReLU block, the
# last one bare), and after which of them an average pool follows.
_CIFAR_CONVS = ("layers.0.0", "layers.1.0", "layers.3.0", "layers.4.0", "layers.6.0", "layers.7.0",
                "layers.9.0", "layers.10")
_CIFAR_POOL_AFTER = frozenset(("layers.1.0", "layers.4.0", "layers.7.0"))


def nn_cifar_cnn_loss(p: dict[str, Any], x: Any, y: Any) -> Any:
    h = x
    for name in _CIFAR_CONVS:
        h = _conv(h, p[f"{name}.weight"], p[f"{name}.bias"], padding=1)
        if name != _CIFAR_CONVS[-1]:
            h = jax.nn.relu(h)
        if name in _CIFAR_POOL_AFTER:
            h = _pool(h, 2, 2, "avg")
    return cross_entropy(h.mean((1, 2)), y)


def _self_attention(p: dict[str, Any], prefix: str, x: Any, heads: int) -> Any:
    """nn.MultiheadAttention(x, x, x) of one [T, W] example (packed in_proj, no mask, no dropout)."""
    tokens, width = x.shape
    qkv = x @ p[f"{prefix}.in_proj_weight"].T + p[f"{prefix}.in_proj_bias"]
    q, k, v = (t.reshape(tokens, heads, width // heads).transpose(1, 0, 2) for t in jnp.split(qkv, 3, axis=-1))
    att = jax.nn.softmax(q @ k.transpose(0, 2, 1) / math.sqrt(width // heads), axis=-1)
    return _linear(p, f"{prefix}.out_proj", (att @ v).transpose(1, 0, 2).reshape(tokens, width))


def nn_transformer_loss(p: dict[str, Any], x: Any, y: Any) -> Any:
    """nn.TransformerEncoder of post-norm layers (norm_first=False, ReLU, eps 1e-5), mean-pooled, linear head."""
    from workloads import nn_models

    h = x
    for i in range(nn_models.LAYERS):
        layer = f"encoder.layers.{i}"
        h = layer_norm(h + _self_attention(p, f"{layer}.self_attn", h, nn_models.HEADS),
                       p[f"{layer}.norm1.weight"], p[f"{layer}.norm1.bias"])
        ff = _linear(p, f"{layer}.linear2", jax.nn.relu(_linear(p, f"{layer}.linear1", h)))
        h = layer_norm(h + ff, p[f"{layer}.norm2.weight"], p[f"{layer}.norm2.bias"])
    return cross_entropy(_linear(p, "head", h.mean(0)), y)


def group_norm(h: Any, groups: int, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    """F.group_norm of one [C, H, W] example: normalise over each group's channels and space."""
    g = h.reshape(groups, -1)
    mean = g.mean(-1, keepdims=True)
    var = ((g - mean) ** 2).mean(-1, keepdims=True)
    normed = ((g - mean) / jnp.sqrt(var + eps)).reshape(h.shape)
    return normed * weight[:, None, None] + bias[:, None, None]


def nn_groupnorm_resnet_loss(p: dict[str, Any], x: Any, y: Any, groups: int = 4) -> Any:
    h = jax.nn.relu(_conv(x, p["stem.weight"], p["stem.bias"], padding=1))
    out = jax.nn.relu(group_norm(_conv(h, p["conv1.weight"], padding=1), groups, p["gn1.weight"], p["gn1.bias"]))
    out = jax.nn.relu(group_norm(_conv(out, p["conv2.weight"], padding=1), groups, p["gn2.weight"], p["gn2.bias"]) + h)
    return cross_entropy(_linear(p, "head", out.mean((1, 2))), y)


def _nn_psg(loss: Callable[..., Any]) -> Callable[[dict[str, Any]], Thunk]:
    """The jax method of an nn_models workload: per-sample gradients w.r.t. the state-dict
    tensors, returned as a tuple in the module's parameter order (like the torch methods)."""
    def build(inputs: dict[str, Any]) -> Thunk:
        names = list(inputs["params"])

        def by_name(params: Params, x: Any, y: Any) -> Any:
            return loss(dict(zip(names, params)), x, y)
        return jax_methods.per_sample_grads(by_name, tuple(inputs["params"].values()), inputs["x"], inputs["y"])
    return build


nn_logreg = _nn_psg(nn_logreg_loss)
nn_ffnn = _nn_psg(nn_ffnn_loss)
nn_mnist_cnn = _nn_psg(nn_mnist_cnn_loss)
nn_embedding = _nn_psg(nn_embedding_loss)
nn_lstm = _nn_psg(nn_lstm_loss)
nn_cifar_cnn = _nn_psg(nn_cifar_cnn_loss)
nn_transformer = _nn_psg(nn_transformer_loss)
nn_groupnorm_resnet = _nn_psg(nn_groupnorm_resnet_loss)


# ---- workloads/bayes_models.py (torch.distributions log densities written out) ----

_LOG_2PI = math.log(2 * math.pi)


def normal_log_prob(x: Any, loc: Any, scale: Any) -> Any:
    return -0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale) - 0.5 * _LOG_2PI


def half_normal_log_prob(x: Any, scale: Any) -> Any:
    return math.log(2) + normal_log_prob(x, 0.0, scale)


def half_cauchy_log_prob(x: Any, scale: Any) -> Any:
    return math.log(2 / math.pi) - jnp.log(scale) - jnp.log1p((x / scale) ** 2)


def student_t_log_prob(x: Any, df: float, loc: Any, scale: Any) -> Any:
    y = (x - loc) / scale
    z = jnp.log(scale) + 0.5 * math.log(df) + 0.5 * math.log(math.pi) + math.lgamma(0.5 * df) - math.lgamma(0.5 * (df + 1))
    return -0.5 * (df + 1) * jnp.log1p(y * y / df) - z


def bernoulli_logits_log_prob(y: Any, logits: Any) -> Any:
    return y * logits - jax.nn.softplus(logits)


def poisson_log_prob(k: Any, rate: Any) -> Any:
    return jax.scipy.special.xlogy(k, rate) - rate - jax.scipy.special.gammaln(k + 1)


def logreg_log_joint(theta: Any, data: dict[str, Any]) -> Any:
    prior = normal_log_prob(theta, 0.0, 1.0).sum()
    return prior + bernoulli_logits_log_prob(data["y"], data["X"] @ theta).sum()


def robust_log_joint(theta: Any, data: dict[str, Any]) -> Any:
    from workloads import bayes_models

    beta, log_sigma = theta[:-1], theta[-1]
    sigma = jnp.exp(log_sigma)
    prior = normal_log_prob(beta, 0.0, 1.0).sum() + half_normal_log_prob(sigma, 1.0) + log_sigma
    return prior + student_t_log_prob(data["y"], bayes_models.STUDENT_NU, data["X"] @ beta, sigma).sum()


def poisson_log_joint(theta: Any, data: dict[str, Any]) -> Any:
    prior = normal_log_prob(theta, 0.0, 1.0).sum()
    return prior + poisson_log_prob(data["y"], jnp.exp(data["X"] @ theta)).sum()


def eight_schools_log_joint(theta: Any, data: dict[str, Any]) -> Any:
    from workloads import bayes_models

    mu, log_tau, eta = theta[0], theta[1], theta[2:]
    tau = jnp.exp(log_tau)
    prior = (normal_log_prob(mu, 0.0, bayes_models.MU_SCALE) + half_cauchy_log_prob(tau, bayes_models.TAU_SCALE)
             + log_tau + normal_log_prob(eta, 0.0, 1.0).sum())
    return prior + normal_log_prob(data["y"], mu + tau * eta, data["sigma"]).sum()


BAYES_LOG_JOINTS = {"logreg": logreg_log_joint, "robust": robust_log_joint, "poisson": poisson_log_joint,
                    "eight_schools": eight_schools_log_joint}


def bayes_chain_grads(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.batched_grad(BAYES_LOG_JOINTS[inputs["model"]], inputs["points"], inputs["data"])


def bayes_hmc(inputs: dict[str, Any]) -> Thunk:
    from workloads import bayes_models

    step = bayes_models.MODELS[inputs["model"]].step_size
    return jax_methods.leapfrog(BAYES_LOG_JOINTS[inputs["model"]], inputs["points"], inputs["momenta"], step,
                                bayes_models.LEAPFROG_STEPS, inputs["data"])


def bayes_laplace_hessian(inputs: dict[str, Any]) -> Thunk:
    log_joint = BAYES_LOG_JOINTS[inputs["model"]]
    return jax_methods.hessian(lambda theta, data: -log_joint(theta, data), inputs["point"], inputs["data"])


def bayes_elbo_grad(inputs: dict[str, Any]) -> Thunk:
    """Mean-field Gaussian guide; each particle's term log p(z) - log q(z) at z = loc + scale * noise."""
    log_joint = BAYES_LOG_JOINTS[inputs["model"]]

    def elbo_term(variational: Any, noise: Any, data: dict[str, Any]) -> Any:
        dim = noise.shape[-1]
        loc, scale = variational[:dim], jnp.exp(variational[dim:])
        z = loc + scale * noise
        return log_joint(z, data) - normal_log_prob(z, loc, scale).sum()
    return jax_methods.particle_grad(elbo_term, inputs["variational"], inputs["noise"], inputs["data"])


# ---- workloads/tutorials.py (the nn.Sequential nets written out; parameters by their state-dict names) ----

def ntk_net(p: dict[str, Any], x: Any) -> Any:
    """tutorials.ntk_net on one [3, H, W] image: conv-ReLU-conv-ReLU, flattened, linear -> [classes]."""
    h = jax.nn.relu(_conv(x, p["0.weight"], p["0.bias"]))
    h = jax.nn.relu(_conv(h, p["2.weight"], p["2.bias"]))
    return _linear(p, "5", h.reshape(-1))


def tutorial_ntk(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.ntk(ntk_net, inputs["params"], inputs["x1"], inputs["x2"], inputs["formulation"])


def ensemble_net(p: dict[str, Any], x: Any) -> Any:
    """tutorials.ensemble_net on a minibatch [B, 1, 28, 28]: flattened, 784-128-128-10 with ReLUs."""
    h = jax.nn.relu(_linear(p, "1", x.reshape(x.shape[0], -1)))
    return _linear(p, "5", jax.nn.relu(_linear(p, "3", h)))


def ensemble_loss(p: dict[str, Any], x: Any, y: Any) -> Any:
    """F.cross_entropy (mean over the minibatch) of ensemble_net."""
    return cross_entropy(ensemble_net(p, x), y).mean()


def tutorial_ensemble(inputs: dict[str, Any]) -> Thunk:
    if inputs["task"] == "predict":
        return jax_methods.ensemble(ensemble_net, inputs["params"], inputs["x"])
    if inputs["task"] == "train_grad":
        return jax_methods.ensemble(ensemble_loss, inputs["params"], inputs["x"], inputs["y"])
    raise ValueError(f"unknown ensemble task {inputs['task']!r}; expected predict or train_grad")


def maml_net(p: dict[str, Any], x: Any) -> Any:
    """tutorials.maml_net on [K, 1] inputs: 1-40-40-1 with ReLUs."""
    h = jax.nn.relu(_linear(p, "0", x))
    return _linear(p, "4", jax.nn.relu(_linear(p, "2", h)))


def maml_loss(p: dict[str, Any], x: Any, y: Any) -> Any:
    """F.mse_loss (mean) of maml_net."""
    return ((maml_net(p, x) - y) ** 2).mean()


def tutorial_maml(inputs: dict[str, Any]) -> Thunk:
    return jax_methods.meta_grad(maml_loss, inputs["params"], inputs["support"], inputs["query"],
                                 tutorials.MAML_INNER_LR)
