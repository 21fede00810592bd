"""torch.nn.functional in jax.numpy: the layers the JAX twins of the workloads are built from.

Each function computes what the torch function or module it names computes, on one example
(no batch dim: the jax method's vmap maps over the batch), with torch's conventions (OIHW
kernels, cross-correlation, biased variance, eps inside the square root, gates in torch's order,
parameters by their state-dict names where a module is written out). The twins themselves sit
beside their torch models in the workload modules. `jax` and `jnp` are `jax_methods`' deferred
modules: importing this module does not import jax.
"""
from __future__ import annotations

import math
from typing import Any

from workloads.peers.jax_methods import jax, jnp


def cross_entropy(logits: Any, y: Any) -> Any:
    """F.cross_entropy of one example (logits [C], integer label y): logsumexp - the label's logit."""
    return jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]


def bce_with_logits(z: Any, y: Any) -> Any:
    """F.binary_cross_entropy_with_logits of one example: softplus(z) - y z."""
    return jax.nn.softplus(z) - y * z


def linear(p: dict[str, Any], name: str, x: Any) -> Any:
    """nn.Linear `name` of a state dict `p` (`name.weight`, `name.bias`) applied to x."""
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def conv2d(x: Any, weight: Any, bias: Any | None = None, stride: int = 1, padding: int = 0) -> Any:
    """F.conv2d of one [C, H, W] example with an OIHW weight (cross-correlation, like torch)."""
    out = jax.lax.conv_general_dilated(
        x[None], weight, window_strides=(stride, stride), padding=((padding, padding), (padding, padding)),
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
    )[0]
    return out if bias is None else out + bias[:, None, None]


def pool2d(h: Any, size: int, stride: int, kind: str) -> Any:
    """F.max_pool2d (kind "max") / F.avg_pool2d (kind "avg"), no padding, of one [C, H, W] example."""
    window, strides = (1, size, size), (1, stride, stride)
    if kind == "max":
        return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, window, strides, "VALID")
    return jax.lax.reduce_window(h, 0.0, jax.lax.add, window, strides, "VALID") / (size * size)


def layer_norm(h: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    """F.layer_norm over the last dim (biased variance, eps inside the square root)."""
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    return (h - mean) / jnp.sqrt(var + eps) * weight + bias


def group_norm(h: Any, groups: int, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    """F.group_norm of one [C, H, W] example: normalise over each group's channels and space."""
    g = h.reshape(groups, -1)
    mean = g.mean(-1, keepdims=True)
    var = ((g - mean) ** 2).mean(-1, keepdims=True)
    normed = ((g - mean) / jnp.sqrt(var + eps)).reshape(h.shape)
    return normed * weight[:, None, None] + bias[:, None, None]


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


def self_attention(p: dict[str, Any], prefix: str, x: Any, heads: int) -> Any:
    """nn.MultiheadAttention `prefix` of a state dict, as (x, x, x), of one [T, W] example
    (packed in_proj, no mask, no dropout)."""
    tokens, width = x.shape
    qkv = x @ p[f"{prefix}.in_proj_weight"].T + p[f"{prefix}.in_proj_bias"]
    q, k, v = (t.reshape(tokens, heads, width // heads).transpose(1, 0, 2) for t in jnp.split(qkv, 3, axis=-1))
    att = jax.nn.softmax(q @ k.transpose(0, 2, 1) / math.sqrt(width // heads), axis=-1)
    return linear(p, f"{prefix}.out_proj", (att @ v).transpose(1, 0, 2).reshape(tokens, width))
