"""Per-sample gradients of torch.nn models, written the way users write them.

Each model is an `nn.Module`; the per-example loss calls it through `torch.func.functional_call`
on one example (`x.unsqueeze(0)`), and `vmap(grad(loss), in_dims=(None, 0, 0))` maps it over the
batch (the PyTorch per-sample-gradients tutorial's recipe). The set follows the fast-dpsgd paper
(Subramani et al., NeurIPS 2021) so the peers compare on the models that paper compared:

- `nn_logreg`: logistic regression, 104 features (the paper's Adult set), BCE-with-logits loss.
- `nn_ffnn`: FFNN 104-50-2 with ReLU.
- `nn_mnist_cnn`: conv 1->16 (8x8, stride 2, pad 3), max-pool(2, 1), conv 16->32 (4x4, stride 2),
  max-pool(2, 1), linear 512->32->10, on 28x28 inputs.
- `nn_embedding`: embedding text classifier: Embedding(10004, 16), mean over tokens, linear 16->2.
- `nn_lstm`: LSTM text classifier: Embedding(10004, 100), LSTM(100, 100), mean over time, linear 100->2.
- `nn_cifar_cnn`: the paper's CIFAR-10 CNN (conv 32,32, avg-pool, 64,64, avg-pool, 128,128,
  avg-pool, 256, conv to 10 channels, mean over space).
- `nn_transformer`: a 2-layer `nn.TransformerEncoder` (width 32, 2 heads, feed-forward 64,
  dropout 0) over 16 tokens, mean-pooled into a linear classifier.
- `nn_groupnorm_resnet`: stem conv 3->16, one ResNet basic block with GroupNorm(4, 16), average
  pool, linear 16->10, on 16x16 inputs.

Inputs are exportable to other frameworks (the JAX peer rebuilds the same models): `params` is
the module's state dict (named tensors, in `named_parameters()` order, drawn from the seeded
generator), `x` the data and `y` the labels. Every method returns the per-sample gradients as a
tuple in that same order, each of shape [B, *param.shape].

The peers (Opacus grad-sample modes, BackPACK BatchGrad) are listed only on the models they can
express (each workload's methods below; workloads/peers/ has the builders); `closed_form` exists for the two models whose
per-sample gradients are an outer product away (logistic regression, FFNN).

Each module has its JAX twin right below it: `<module>_loss_jax(params, x, y)`, the module written
out in jax.numpy on one example (parameters by their state-dict names, layers from
`workloads.peers.jax_nn`) followed by the workload's criterion.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from workloads import peers, per_sample_grads
from workloads.base import PEER_METHODS
from workloads.define import define
from workloads.methods import per_sample_grads_method
from workloads.peers import jax_methods
from workloads.peers.jax_methods import jax, with_jax
from workloads.peers.jax_nn import (bce_with_logits, conv2d, cross_entropy, group_norm, layer_norm, linear, lstm,
                                    pool2d, self_attention)

FAMILY = "per_sample_grads"
FEATURES = 104  # the paper's Adult features
VOCAB = 10_000 + 4  # max_features + <unk>, <pad>, <eos>, <sos>, as in the paper
Params = tuple[torch.Tensor, ...]
Criterion = Callable[..., torch.Tensor]


class LogisticRegression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(x).squeeze(-1)  # logits; the loss applies the sigmoid


def logistic_regression_loss_jax(p: dict[str, Any], x: Any, y: Any) -> Any:
    return bce_with_logits(linear(p, "fc1", x)[0], y)


class FFNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 50)
        self.fc2 = nn.Linear(50, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


def ffnn_loss_jax(p: dict[str, Any], x: Any, y: Any) -> Any:
    return cross_entropy(linear(p, "fc2", jax.nn.relu(linear(p, "fc1", x))), y)


class MNISTNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, 2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, 2)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, 1, 28, 28]
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 1)  # [B, 16, 13, 13]
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 1)  # [B, 32, 4, 4]
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def mnist_net_loss_jax(p: dict[str, Any], x: Any, y: Any) -> Any:
    h = pool2d(jax.nn.relu(conv2d(x, p["conv1.weight"], p["conv1.bias"], stride=2, padding=3)), 2, 1, "max")
    h = pool2d(jax.nn.relu(conv2d(h, p["conv2.weight"], p["conv2.bias"], stride=2)), 2, 1, "max")
    return cross_entropy(linear(p, "fc2", jax.nn.relu(linear(p, "fc1", h.reshape(-1)))), y)


class EmbeddingNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.fc1 = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T] token ids
        return self.fc1(self.emb(x).mean(1))


def embedding_net_loss_jax(p: dict[str, Any], x: Any, y: Any) -> Any:
    return cross_entropy(linear(p, "fc1", p["emb.weight"][x].mean(0)), y)


class LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 100)
        self.lstm = nn.LSTM(100, 100, batch_first=True)
        self.fc1 = nn.Linear(100, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T] token ids
        h, _ = self.lstm(self.emb(x))
        return self.fc1(h.mean(1))


def lstm_net_loss_jax(p: dict[str, Any], x: Any, y: Any) -> Any:
    h = lstm(p["emb.weight"][x], p["lstm.weight_ih_l0"], p["lstm.weight_hh_l0"], p["lstm.bias_ih_l0"],
             p["lstm.bias_hh_l0"])
    return cross_entropy(linear(p, "fc1", h.mean(0)), y)


def _conv_relu(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU())


class CIFAR10Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            _conv_relu(3, 32), _conv_relu(32, 32), nn.AvgPool2d(2, stride=2),
            _conv_relu(32, 64), _conv_relu(64, 64), nn.AvgPool2d(2, stride=2),
            _conv_relu(64, 128), _conv_relu(128, 128), nn.AvgPool2d(2, stride=2),
            _conv_relu(128, 256), nn.Conv2d(256, 10, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, 3, 32, 32]
        return self.layers(x).mean(dim=(2, 3))


# CIFAR10Net.layers written out: its conv layers by state-dict name (each "layers.i.0" inside a
# conv+ReLU block, the last one bare), and after which of them an average pool follows.
_CIFAR_CONVS = ("layers.0.0", "layers.1.0", "layers.3.0", "layers.4.0", "layers.6.0", "layers.7.0",
                "layers.9.0", "layers.10")
_CIFAR_POOL_AFTER = frozenset(("layers.1.0", "layers.4.0", "layers.7.0"))


def cifar10_net_loss_jax(p: dict[str, Any], x: Any, y: Any) -> Any:
    h = x
    for name in _CIFAR_CONVS:
        h = conv2d(h, p[f"{name}.weight"], p[f"{name}.bias"], padding=1)
        if name != _CIFAR_CONVS[-1]:
            h = jax.nn.relu(h)
        if name in _CIFAR_POOL_AFTER:
            h = pool2d(h, 2, 2, "avg")
    return cross_entropy(h.mean((1, 2)), y)


TOKENS, WIDTH, HEADS, FF, LAYERS = 16, 32, 2, 64, 2


class TransformerNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, FF, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, TOKENS, WIDTH]
        return self.head(self.encoder(x).mean(1))


def transformer_net_loss_jax(p: dict[str, Any], x: Any, y: Any) -> Any:
    """nn.TransformerEncoder of post-norm layers (norm_first=False, ReLU, eps 1e-5), mean-pooled, linear head."""
    h = x
    for i in range(LAYERS):
        layer = f"encoder.layers.{i}"
        h = layer_norm(h + self_attention(p, f"{layer}.self_attn", h, HEADS),
                       p[f"{layer}.norm1.weight"], p[f"{layer}.norm1.bias"])
        ff = linear(p, f"{layer}.linear2", jax.nn.relu(linear(p, f"{layer}.linear1", h)))
        h = layer_norm(h + ff, p[f"{layer}.norm2.weight"], p[f"{layer}.norm2.bias"])
    return cross_entropy(linear(p, "head", h.mean(0)), y)


class GroupNormResNet(nn.Module):
    """Stem conv, one basic block (conv-GN-ReLU-conv-GN + identity, ReLU), pool, linear."""

    def __init__(self, channels: int = 16, groups: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(groups, channels)
        self.head = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, 3, 16, 16]
        h = F.relu(self.stem(x))
        out = F.relu(self.gn1(self.conv1(h)))
        out = F.relu(self.gn2(self.conv2(out)) + h)
        return self.head(out.mean(dim=(2, 3)))


def group_norm_res_net_loss_jax(p: dict[str, Any], x: Any, y: Any, groups: int = 4) -> Any:
    h = jax.nn.relu(conv2d(x, p["stem.weight"], p["stem.bias"], padding=1))
    out = jax.nn.relu(group_norm(conv2d(h, p["conv1.weight"], padding=1), groups, p["gn1.weight"], p["gn1.bias"]))
    out = jax.nn.relu(group_norm(conv2d(out, p["conv2.weight"], padding=1), groups, p["gn2.weight"], p["gn2.bias"]) + h)
    return cross_entropy(linear(p, "head", out.mean((1, 2))), y)


def init_params(module: nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The module's parameters drawn from `gen` (so the data does not depend on torch's global RNG):
    matrices and kernels N(0, 1/fan_in), norm scales 1 + N(0, 0.01), other vectors N(0, 0.01)."""
    params = {}
    for name, p in module.named_parameters():
        if p.dim() >= 2:
            value = torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:]))
        elif name.endswith("weight"):
            value = 1 + 0.1 * torch.randn(p.shape, generator=gen)
        else:
            value = 0.1 * torch.randn(p.shape, generator=gen)
        params[name] = value
    return params


def build_module(model: type[nn.Module], params: dict[str, torch.Tensor]) -> nn.Module:
    """An instance of `model` holding `params` (their dtype and device), in training mode."""
    with torch.random.fork_rng(devices=[]):  # the module's own init is overwritten; keep the global RNG
        module = model()
    first = next(iter(params.values()))
    module.to(device=first.device, dtype=first.dtype)
    module.load_state_dict(params, strict=True)
    return module.train()


def example_loss(module: nn.Module, names: list[str], criterion: Criterion) -> Callable[..., torch.Tensor]:
    """The per-example loss as users write it: the module called through functional_call on a
    batch of one, the criterion's mean over that one example (a 0-d loss for grad)."""

    def loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.func.functional_call(module, dict(zip(names, params)), (x.unsqueeze(0),))
        return criterion(out, y.unsqueeze(0))
    return loss


def logreg_closed_form(params: Params, X: torch.Tensor, Y: torch.Tensor) -> Params:
    """d/dw BCE(sigmoid(w.x + b), y) = (sigmoid(w.x + b) - y) x."""
    w, b = params
    residual = torch.sigmoid(X @ w.T + b).squeeze(-1) - Y
    return residual[:, None, None] * X[:, None, :], residual[:, None]


def _psg(model: type[nn.Module], criterion: Criterion, closed_form: Callable[..., Params] | None = None):
    def make(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
        module = build_module(model, inputs["params"])
        x, y = inputs["x"], inputs["y"]
        if method in PEER_METHODS:
            return peers.per_sample_grads(method, module, criterion, x, y)
        names = list(inputs["params"])
        params = tuple(inputs["params"][n] for n in names)
        return per_sample_grads_method(method, example_loss(module, names, criterion), params, x, y, closed_form)
    return make


def _jax_psg(loss: Callable[..., Any]) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    """The jax method of a workload here: per-sample gradients of its twin `loss` w.r.t. the
    state-dict tensors, returned as a tuple in the module's parameter order (like the torch methods)."""
    def build(inputs: dict[str, Any]) -> Callable[[], Any]:
        names = list(inputs["params"])

        def by_name(params: tuple[Any, ...], x: Any, y: Any) -> Any:
            return loss(dict(zip(names, params)), x, y)
        return jax_methods.per_sample_grads(by_name, tuple(inputs["params"].values()), inputs["x"], inputs["y"])
    return build


def _data(model: type[nn.Module], make_x: Callable[[dict[str, Any], torch.Generator], torch.Tensor],
          make_y: Callable[[int, torch.Generator], torch.Tensor]):
    def make_inputs(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
        with torch.random.fork_rng(devices=[]):
            skeleton = model()
        weights = init_params(skeleton, gen)
        x = make_x(params, gen)
        return {"params": weights, "x": x, "y": make_y(x.shape[0], gen)}
    return make_inputs


def _labels(classes: int) -> Callable[[int, torch.Generator], torch.Tensor]:
    return lambda b, gen: torch.randint(classes, (b,), generator=gen)


def _binary_labels(b: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(2, (b,), generator=gen).float()


def _images(*shape: int) -> Callable[[dict[str, Any], torch.Generator], torch.Tensor]:
    return lambda p, gen: torch.randn(p["batch"], *shape, generator=gen)


def _tokens(p: dict[str, Any], gen: torch.Generator) -> torch.Tensor:
    return torch.randint(VOCAB, (p["batch"], p["tokens"]), generator=gen)


BASE = ("loop", "engine", "engine_traced", "torch_func")
OPACUS_ALL = ("opacus_hooks", "opacus_ew", "opacus_functorch")


def _define(name: str, description: str, model: type[nn.Module], criterion: Criterion, twin: Callable[..., Any],
            grid: dict[str, list[Any]],
            make_x: Callable[[dict[str, Any], torch.Generator], torch.Tensor],
            make_y: Callable[[int, torch.Generator], torch.Tensor], peer_methods: tuple[str, ...],
            closed_form: Callable[..., Params] | None = None, quick: tuple[str, ...] = (),
            heavy: tuple[str, ...] = (), not_in_quick: tuple[str, ...] = ()) -> None:
    methods = BASE + (("closed_form",) if closed_form is not None else ()) + peer_methods + ("jax", "engine_chunked")
    define(name=name, family=FAMILY, description=description, grid=grid, methods=methods,
           make_inputs=_data(model, make_x, make_y),
           make_method=with_jax(_psg(model, criterion, closed_form), _jax_psg(twin)),
           quick=quick, heavy=heavy, not_in_quick=not_in_quick, extra={"model": model})


_define("nn_logreg", f"Per-sample gradients of nn.Linear({FEATURES}, 1) logistic regression (fast-dpsgd set)",
        LogisticRegression, F.binary_cross_entropy_with_logits, logistic_regression_loss_jax, {"batch": [32, 256]},
        _images(FEATURES), _binary_labels,
        OPACUS_ALL + ("backpack",), closed_form=logreg_closed_form)
_define("nn_ffnn", f"Per-sample gradients of an nn FFNN {FEATURES}-50-2 (fast-dpsgd set)",
        FFNN, F.cross_entropy, ffnn_loss_jax, {"batch": [32, 256]}, _images(FEATURES), _labels(2),
        OPACUS_ALL + ("backpack",), closed_form=per_sample_grads.mlp_grads_closed_form)
_define("nn_mnist_cnn", "Per-sample gradients of the fast-dpsgd MNIST CNN (2 conv + max-pool, 2 linear)",
        MNISTNet, F.cross_entropy, mnist_net_loss_jax, {"batch": [16, 64]}, _images(1, 28, 28), _labels(10),
        OPACUS_ALL + ("backpack",), quick=("batch=16",), not_in_quick=per_sample_grads.QUICK_LEAVES_OUT)
_define("nn_embedding", f"Per-sample gradients of an embedding text classifier (vocab {VOCAB}, dim 16, mean, linear)",
        EmbeddingNet, F.cross_entropy, embedding_net_loss_jax, {"batch": [16, 64], "tokens": [64]}, _tokens,
        _labels(2),
        OPACUS_ALL + ("backpack",))
_define("nn_lstm", f"Per-sample gradients of an LSTM text classifier (vocab {VOCAB}, embedding/LSTM width 100)",
        LSTMNet, F.cross_entropy, lstm_net_loss_jax, {"batch": [8, 32], "tokens": [8, 32]}, _tokens, _labels(2),
        # Opacus' hooks and functorch modes fail on nn.LSTM (they need opacus' own DPLSTM layer).
        ("opacus_ew", "backpack"))
_define("nn_cifar_cnn", "Per-sample gradients of the fast-dpsgd CIFAR-10 CNN (7 conv, 3 avg-pool)",
        CIFAR10Net, F.cross_entropy, cifar10_net_loss_jax, {"batch": [8, 32]}, _images(3, 32, 32), _labels(10),
        OPACUS_ALL + ("backpack",), heavy=("batch=32",))
_define("nn_transformer", f"Per-sample gradients of nn.TransformerEncoder ({LAYERS} layers, {HEADS} heads, "
        f"{TOKENS} tokens x {WIDTH}, dropout 0)", TransformerNet, F.cross_entropy, transformer_net_loss_jax,
        {"batch": [16, 64]}, _images(TOKENS, WIDTH), _labels(10),
        # No peer expresses nn.MultiheadAttention: Opacus needs its DPMultiheadAttention layer, torch's
        # ExpandedWeights and BackPACK have no rule for it.
        ())
_define("nn_groupnorm_resnet", "Per-sample gradients of a GroupNorm ResNet basic block (16 channels, 16x16 inputs)",
        GroupNormResNet, F.cross_entropy, group_norm_res_net_loss_jax, {"batch": [16, 64]}, _images(3, 16, 16),
        _labels(10),
        OPACUS_ALL)  # BackPACK's BatchGrad has no GroupNorm extension
