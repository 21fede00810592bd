"""Per-sample gradients (differential privacy, gradient-noise and influence statistics).

Three models written as plain functions of a parameter tuple, each working on one example and on
a batch alike, with a cross-entropy loss per example:
- `psg_mlp`: MLP 784-128-10 on MNIST-shaped inputs; closed form for its linear layers
  (the per-example outer products of output gradients and layer inputs).
- `psg_cnn`: two conv + max-pool blocks and a linear head on CIFAR-shaped inputs.
- `psg_attention`: one transformer block (2-head self-attention, layer norm, ReLU MLP) over 16
  tokens of width 32, mean-pooled into a linear classifier.

Each torch function `f` has its JAX twin `f_jax` right below it (the same ops on one example,
in jax.numpy); `<workload>_jax` builds the workload's `jax` method from them.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from workloads import peers
from workloads.base import PEER_METHODS
from workloads.define import define
from workloads.methods import per_sample_grads_method
from workloads.peers import jax_methods
from workloads.peers.jax_methods import jax, with_jax
from workloads.peers.jax_nn import conv2d, cross_entropy, layer_norm, pool2d

FAMILY = "per_sample_grads"
CLASSES = 10
BATCHES = [8, 64, 256]

Params = tuple[torch.Tensor, ...]


def _init(gen: torch.Generator, *shape: int, fan_in: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) / math.sqrt(fan_in)


def mlp_logits(params: Params, x: torch.Tensor) -> torch.Tensor:
    W1, b1, W2, b2 = params
    return torch.relu(x @ W1.T + b1) @ W2.T + b2


def mlp_logits_jax(params: tuple[Any, ...], x: Any) -> Any:
    W1, b1, W2, b2 = params
    return jax.nn.relu(x @ W1.T + b1) @ W2.T + b2


def mlp_loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(mlp_logits(params, x), y, reduction="none")


def mlp_loss_jax(params: tuple[Any, ...], x: Any, y: Any) -> Any:
    return cross_entropy(mlp_logits_jax(params, x), y)


def mlp_grads_closed_form(params: Params, X: torch.Tensor, Y: torch.Tensor) -> Params:
    """Backpropagation written out per example: dW = outer(dz, layer input), db = dz."""
    W1, b1, W2, b2 = params
    z1 = X @ W1.T + b1
    a1 = torch.relu(z1)
    dz2 = torch.softmax(a1 @ W2.T + b2, dim=-1) - F.one_hot(Y, W2.shape[0]).to(X.dtype)
    dz1 = (dz2 @ W2) * (z1 > 0)
    return torch.einsum("bh,bi->bhi", dz1, X), dz1, torch.einsum("bo,bh->boh", dz2, a1), dz2


def mlp_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    b = params["batch"]
    model = (
        _init(gen, 128, 784, fan_in=784), _init(gen, 128, fan_in=784),
        _init(gen, CLASSES, 128, fan_in=128), _init(gen, CLASSES, fan_in=128),
    )
    return {"params": model, "x": torch.rand(b, 784, generator=gen), "y": torch.randint(CLASSES, (b,), generator=gen)}


def mlp_module() -> nn.Module:
    """psg_mlp's model as an nn.Module (what the peers need): the same parameters in the same order."""
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, CLASSES))


def _method(loss: Callable[..., torch.Tensor], closed_form: Callable[..., Params] | None = None,
            module: Callable[[], nn.Module] | None = None):
    """Method builder of a functional model; `module` builds its nn.Module form for the peers."""
    def make(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
        if method in PEER_METHODS and module is not None:
            return peers.per_sample_grads(method, peers.module_holding(module, inputs["params"]), F.cross_entropy,
                                          inputs["x"], inputs["y"])
        return per_sample_grads_method(method, loss, inputs["params"], inputs["x"], inputs["y"], closed_form)
    return make


def _jax_method(loss: Callable[..., Any]) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    """The jax method of a functional model: jit(vmap(grad(loss))) of its JAX twin."""
    def build(inputs: dict[str, Any]) -> Callable[[], Any]:
        return jax_methods.per_sample_grads(loss, inputs["params"], inputs["x"], inputs["y"])
    return build


mlp_method = _method(mlp_loss, mlp_grads_closed_form, mlp_module)
psg_mlp_jax = _jax_method(mlp_loss_jax)
# Every Opacus mode and BackPACK express the MLP, the CNN and (but BackPACK: no LayerNorm) the attention block.
OPACUS = ("opacus_hooks", "opacus_ew", "opacus_functorch")
# Opacus' hooks and functorch modes are timed in the full profile; the quick one keeps its best mode
# (ew) for the conv and attention models, which would otherwise add six benchmark processes to make bench.
QUICK_LEAVES_OUT = ("opacus_hooks", "opacus_functorch")

define(
    name="psg_mlp",
    family=FAMILY,
    description="Per-sample gradients of an MLP 784-128-10 (MNIST-shaped inputs), cross-entropy loss",
    grid={"batch": BATCHES},
    methods=("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", "closed_form", *OPACUS,
             "backpack", "jax", "engine_chunked"),
    make_inputs=mlp_data,
    make_method=with_jax(mlp_method, psg_mlp_jax),
    quick=("batch=64",),
)


def cnn_logits(params: Params, x: torch.Tensor) -> torch.Tensor:
    c1, cb1, c2, cb2, W, b = params
    h = F.max_pool2d(torch.relu(F.conv2d(x, c1, cb1, padding=1)), 2)
    h = F.max_pool2d(torch.relu(F.conv2d(h, c2, cb2, padding=1)), 2)
    return h.flatten(-3) @ W.T + b


def cnn_logits_jax(params: tuple[Any, ...], x: Any) -> Any:
    c1, cb1, c2, cb2, W, b = params
    h = pool2d(jax.nn.relu(conv2d(x, c1, cb1, padding=1)), 2, 2, "max")
    h = pool2d(jax.nn.relu(conv2d(h, c2, cb2, padding=1)), 2, 2, "max")
    return h.reshape(-1) @ W.T + b


def cnn_loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(cnn_logits(params, x), y, reduction="none")


def cnn_loss_jax(params: tuple[Any, ...], x: Any, y: Any) -> Any:
    return cross_entropy(cnn_logits_jax(params, x), y)


def cnn_module() -> nn.Module:
    """psg_cnn's model as an nn.Module: the same parameters in the same order."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, CLASSES),
    )


def cnn_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    b = params["batch"]
    model = (
        _init(gen, 16, 3, 3, 3, fan_in=27), _init(gen, 16, fan_in=27),
        _init(gen, 32, 16, 3, 3, fan_in=144), _init(gen, 32, fan_in=144),
        _init(gen, CLASSES, 32 * 8 * 8, fan_in=2048), _init(gen, CLASSES, fan_in=2048),
    )
    return {"params": model, "x": torch.randn(b, 3, 32, 32, generator=gen),
            "y": torch.randint(CLASSES, (b,), generator=gen)}


define(
    name="psg_cnn",
    family=FAMILY,
    description="Per-sample gradients of a small CNN (2 conv + max-pool blocks, linear head) on CIFAR-shaped inputs",
    grid={"batch": BATCHES},
    # functional_vectorize is left out: it backpropagates B one-hot vectors through the whole
    # batch at once, B x B x 16 x 32 x 32 floats (4 GB at B=256).
    methods=("loop", "engine", "engine_traced", "torch_func", *OPACUS, "backpack", "jax", "engine_chunked"),
    make_inputs=cnn_data,
    make_method=with_jax(_method(cnn_loss, module=cnn_module), _jax_method(cnn_loss_jax)),
    quick=("batch=8",),
    not_in_quick=QUICK_LEAVES_OUT,
)

TOKENS, WIDTH, HEADS, FF = 16, 32, 2, 64


def attention_logits(params: Params, x: torch.Tensor) -> torch.Tensor:
    """x: [..., TOKENS, WIDTH] -> [..., CLASSES]; works with or without a leading batch dim."""
    Wq, Wk, Wv, Wo, ln_w, ln_b, W1, b1, W2, b2, Wc, bc = params

    def heads(t: torch.Tensor) -> torch.Tensor:  # [..., T, W] -> [..., H, T, W/H]
        return t.unflatten(-1, (HEADS, WIDTH // HEADS)).transpose(-3, -2)

    q, k, v = heads(x @ Wq.T), heads(x @ Wk.T), heads(x @ Wv.T)
    att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(WIDTH // HEADS), dim=-1)
    h = x + (att @ v).transpose(-3, -2).flatten(-2) @ Wo.T
    h = F.layer_norm(h, (WIDTH,), ln_w, ln_b)
    h = h + torch.relu(h @ W1.T + b1) @ W2.T + b2
    return h.mean(-2) @ Wc.T + bc


def attention_logits_jax(params: tuple[Any, ...], x: Any) -> Any:
    """One example x: [TOKENS, WIDTH] -> [CLASSES]."""
    Wq, Wk, Wv, Wo, ln_w, ln_b, W1, b1, W2, b2, Wc, bc = params

    def heads(t: Any) -> Any:  # [T, W] -> [H, T, W/H]
        return t.reshape(t.shape[0], HEADS, WIDTH // HEADS).transpose(1, 0, 2)

    q, k, v = heads(x @ Wq.T), heads(x @ Wk.T), heads(x @ Wv.T)
    att = jax.nn.softmax(q @ k.transpose(0, 2, 1) / math.sqrt(WIDTH // HEADS), axis=-1)
    h = x + (att @ v).transpose(1, 0, 2).reshape(x.shape[0], WIDTH) @ Wo.T
    h = layer_norm(h, ln_w, ln_b)
    h = h + jax.nn.relu(h @ W1.T + b1) @ W2.T + b2
    return h.mean(0) @ Wc.T + bc


def attention_loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(attention_logits(params, x), y, reduction="none")


def attention_loss_jax(params: tuple[Any, ...], x: Any, y: Any) -> Any:
    return cross_entropy(attention_logits_jax(params, x), y)


class AttentionBlock(nn.Module):
    """psg_attention's model as an nn.Module: the same parameters in the same order, the same math."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(4))
        self.norm = nn.LayerNorm(WIDTH)
        self.ff1, self.ff2, self.head = nn.Linear(WIDTH, FF), nn.Linear(FF, WIDTH), nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.unflatten(-1, (HEADS, WIDTH // HEADS)).transpose(-3, -2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(WIDTH // HEADS), dim=-1)
        h = self.norm(x + self.o((att @ v).transpose(-3, -2).flatten(-2)))
        h = h + self.ff2(torch.relu(self.ff1(h)))
        return self.head(h.mean(-2))


def attention_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    b = params["batch"]
    model = (
        *(_init(gen, WIDTH, WIDTH, fan_in=WIDTH) for _ in range(4)),
        1 + 0.1 * torch.randn(WIDTH, generator=gen), 0.1 * torch.randn(WIDTH, generator=gen),
        _init(gen, FF, WIDTH, fan_in=WIDTH), _init(gen, FF, fan_in=WIDTH),
        _init(gen, WIDTH, FF, fan_in=FF), _init(gen, WIDTH, fan_in=FF),
        _init(gen, CLASSES, WIDTH, fan_in=WIDTH), _init(gen, CLASSES, fan_in=WIDTH),
    )
    return {"params": model, "x": torch.randn(b, TOKENS, WIDTH, generator=gen),
            "y": torch.randint(CLASSES, (b,), generator=gen)}


define(
    name="psg_attention",
    family=FAMILY,
    description=f"Per-sample gradients of one self-attention block ({HEADS} heads, {TOKENS} tokens x {WIDTH})",
    grid={"batch": BATCHES},
    methods=("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", *OPACUS, "jax",
             "engine_chunked"),
    make_inputs=attention_data,
    make_method=with_jax(_method(attention_loss, module=AttentionBlock), _jax_method(attention_loss_jax)),
    quick=("batch=64",),
    not_in_quick=QUICK_LEAVES_OUT,
    # functional_vectorize backpropagates B one-hot vectors through the whole batch: ~0.8 GB at B=256.
    heavy=("batch=256",),
)
