"""The torch.func tutorials' workloads, written as the tutorials write them: `torch.nn` modules
called through `torch.func.functional_call` with their parameters passed as a dict.

- `tutorial_ntk`: the empirical neural tangent kernel of a small CNN between two sets of images,
  by both of the tutorial's formulations (`formulation=jacobian`: contracting per-example
  Jacobians from vmap(jacrev); `formulation=jvp_vjp`: NTK-vector products by a vjp then a jvp).
- `tutorial_ensemble`: model ensembling: M copies of an MLP stacked with
  `torch.func.stack_module_state` and vmapped over (`task=predict`: the tutorial's forward pass;
  `task=train_grad`: each model's gradient on its own minibatch, one ensemble training step).
- `tutorial_maml`: MAML on sine-wave regression: the meta-gradient through one inner gradient
  step, vmapped over tasks (grad of vmap of a function that calls grad).

The `jax` method runs the same nets written out in jax.numpy under jax.jit, on the same weights
and data: each net's JAX twin `<net>_jax(params, x)` sits right below it (parameters by their
state-dict names), and `<workload>_jax` builds the method.

Modules are built on the meta device (no storage, no global RNG); their parameters are drawn from
the workload's seeded generator, so every method sees the same weights.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state

from workloads.define import define
from workloads.methods import NTK_FORMULATIONS, ensemble_method, meta_grad_method, ntk_method
from workloads.peers import jax_methods
from workloads.peers.jax_methods import jax, with_jax
from workloads.peers.jax_nn import conv2d, cross_entropy, linear

FAMILY = "torch_func_tutorials"
METHODS = ("loop", "engine", "engine_traced", "torch_func", "jax")
# jax's import and jit compile would be paid in each of a quick case's benchmark processes; the
# full profile measures it, `python -m vmapbench.peer_ratios` side by side.
NOT_IN_QUICK = ("jax",)

Params = dict[str, torch.Tensor]


def draw_parameters(module: nn.Module, gen: torch.Generator) -> Params:
    """Seeded parameters for `module` (built on the meta device): weights N(0, 1/fan_in), biases N(0, 0.01)."""
    out = {}
    for name, p in module.named_parameters():
        if p.dim() > 1:
            out[name] = torch.randn(p.shape, generator=gen) / math.sqrt(p[0].numel())
        else:
            out[name] = 0.1 * torch.randn(p.shape, generator=gen)
    return out


# --- empirical NTK ----------------------------------------------------------------------------

NTK_IMAGE, NTK_CHANNELS, NTK_CLASSES = 12, 8, 10


def ntk_net() -> nn.Module:
    """A small CNN (the tutorial's shape, scaled down for CPU): two 3x3 convolutions and a linear head."""
    with torch.device("meta"):
        flat = NTK_CHANNELS * (NTK_IMAGE - 4) ** 2
        return nn.Sequential(
            nn.Conv2d(3, NTK_CHANNELS, 3), nn.ReLU(), nn.Conv2d(NTK_CHANNELS, NTK_CHANNELS, 3), nn.ReLU(),
            nn.Flatten(), nn.Linear(flat, NTK_CLASSES),
        )


def ntk_net_jax(p: dict[str, Any], x: Any) -> Any:
    """ntk_net on one [3, H, W] image: conv-ReLU-conv-ReLU, flattened, linear -> [classes]."""
    h = jax.nn.relu(conv2d(x, p["0.weight"], p["0.bias"]))
    h = jax.nn.relu(conv2d(h, p["2.weight"], p["2.bias"]))
    return linear(p, "5", h.reshape(-1))


def ntk_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    n = params["examples"]
    return {
        "params": draw_parameters(ntk_net(), gen),
        "x1": torch.randn(n, 3, NTK_IMAGE, NTK_IMAGE, generator=gen),
        "x2": torch.randn(n, 3, NTK_IMAGE, NTK_IMAGE, generator=gen),
        "formulation": params["formulation"],
    }


def ntk_method_of(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    net = ntk_net()

    def fnet_single(params: Params, x: torch.Tensor) -> torch.Tensor:
        return functional_call(net, params, (x.unsqueeze(0),)).squeeze(0)
    return ntk_method(method, fnet_single, inputs["params"], inputs["x1"], inputs["x2"], inputs["formulation"])


def tutorial_ntk_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    return jax_methods.ntk(ntk_net_jax, inputs["params"], inputs["x1"], inputs["x2"], inputs["formulation"])


define(
    name="tutorial_ntk",
    family=FAMILY,
    description=f"Empirical NTK of a small CNN between two sets of {NTK_IMAGE}x{NTK_IMAGE} images "
                "(torch.func tutorial): vmap(jacrev) contraction or jvp-of-vjp products",
    grid={"formulation": list(NTK_FORMULATIONS), "examples": [2, 8, 16]},
    methods=METHODS,
    make_inputs=ntk_data,
    make_method=with_jax(ntk_method_of, tutorial_ntk_jax),
    quick=("formulation=jacobian,examples=8",),
    not_in_quick=NOT_IN_QUICK,
    # jvp_vjp pushes examples^2 x 10 parameter-sized vectors at once (~0.5 GB at 16 examples).
    heavy=("formulation=jvp_vjp,examples=16",),
)


# --- model ensembling -------------------------------------------------------------------------

ENSEMBLE_BATCH, ENSEMBLE_CLASSES = 64, 10


def ensemble_net() -> nn.Module:
    """The tutorial's MLP 784-128-128-10 on MNIST-shaped inputs."""
    with torch.device("meta"):
        return nn.Sequential(
            nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
            nn.Linear(128, ENSEMBLE_CLASSES),
        )


def ensemble_net_jax(p: dict[str, Any], x: Any) -> Any:
    """ensemble_net on a minibatch [B, 1, 28, 28]: flattened, 784-128-128-10 with ReLUs."""
    h = jax.nn.relu(linear(p, "1", x.reshape(x.shape[0], -1)))
    return linear(p, "5", jax.nn.relu(linear(p, "3", h)))


def ensemble_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    m = params["models"]
    models = []
    for _ in range(m):
        net = ensemble_net().to_empty(device="cpu")
        net.load_state_dict(draw_parameters(net, gen))
        models.append(net)
    stacked, _ = stack_module_state(models)
    return {
        "params": {k: v.detach() for k, v in stacked.items()},
        "x": torch.randn(m, ENSEMBLE_BATCH, 1, 28, 28, generator=gen),
        "y": torch.randint(ENSEMBLE_CLASSES, (m, ENSEMBLE_BATCH), generator=gen),
        "task": params["task"],
    }


def ensemble_method_of(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    net = ensemble_net()

    def fmodel(params: Params, x: torch.Tensor) -> torch.Tensor:
        return functional_call(net, params, (x,))

    def loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(fmodel(params, x), y)
    if inputs["task"] == "predict":
        return ensemble_method(method, fmodel, inputs["params"], inputs["x"])
    if inputs["task"] == "train_grad":
        return ensemble_method(method, loss, inputs["params"], inputs["x"], inputs["y"])
    raise ValueError(f"unknown ensemble task {inputs['task']!r}; expected predict or train_grad")


def tutorial_ensemble_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    def loss(p: dict[str, Any], x: Any, y: Any) -> Any:
        """F.cross_entropy (mean over the minibatch) of ensemble_net."""
        return cross_entropy(ensemble_net_jax(p, x), y).mean()
    if inputs["task"] == "predict":
        return jax_methods.ensemble(ensemble_net_jax, inputs["params"], inputs["x"])
    if inputs["task"] == "train_grad":
        return jax_methods.ensemble(loss, inputs["params"], inputs["x"], inputs["y"])
    raise ValueError(f"unknown ensemble task {inputs['task']!r}; expected predict or train_grad")


define(
    name="tutorial_ensemble",
    family=FAMILY,
    description=f"Model ensembling (torch.func tutorial): M MLPs 784-128-128-10 stacked by stack_module_state, "
                f"vmapped over the models, each on its own minibatch of {ENSEMBLE_BATCH}: predictions or "
                "per-model gradients",
    grid={"task": ["predict", "train_grad"], "models": [4, 16, 64]},
    methods=METHODS,
    make_inputs=ensemble_data,
    make_method=with_jax(ensemble_method_of, tutorial_ensemble_jax),
    quick=("task=train_grad,models=16",),
    not_in_quick=NOT_IN_QUICK,
)


# --- MAML -------------------------------------------------------------------------------------

MAML_SHOTS, MAML_HIDDEN, MAML_INNER_LR = 10, 40, 0.1


def maml_net() -> nn.Module:
    """The MAML sine-regression example's net: 1-40-40-1 with ReLUs."""
    with torch.device("meta"):
        return nn.Sequential(
            nn.Linear(1, MAML_HIDDEN), nn.ReLU(), nn.Linear(MAML_HIDDEN, MAML_HIDDEN), nn.ReLU(),
            nn.Linear(MAML_HIDDEN, 1),
        )


def maml_net_jax(p: dict[str, Any], x: Any) -> Any:
    """maml_net on [K, 1] inputs: 1-40-40-1 with ReLUs."""
    h = jax.nn.relu(linear(p, "0", x))
    return linear(p, "4", jax.nn.relu(linear(p, "2", h)))


def maml_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    """Sine tasks y = A sin(x + phase), A in [0.1, 5], phase in [0, pi], x in [-5, 5]; K shots each."""
    t = params["tasks"]
    amplitude = 0.1 + 4.9 * torch.rand(t, 1, 1, generator=gen)
    phase = math.pi * torch.rand(t, 1, 1, generator=gen)
    xs = 10 * torch.rand(t, MAML_SHOTS, 1, generator=gen) - 5
    xq = 10 * torch.rand(t, MAML_SHOTS, 1, generator=gen) - 5
    return {
        "params": draw_parameters(maml_net(), gen),
        "support": (xs, amplitude * torch.sin(xs + phase)),
        "query": (xq, amplitude * torch.sin(xq + phase)),
    }


def maml_method_of(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    net = maml_net()

    def loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(functional_call(net, params, (x,)), y)
    return meta_grad_method(method, loss, inputs["params"], inputs["support"], inputs["query"], MAML_INNER_LR)


def tutorial_maml_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    def loss(p: dict[str, Any], x: Any, y: Any) -> Any:
        """F.mse_loss (mean) of maml_net."""
        return ((maml_net_jax(p, x) - y) ** 2).mean()
    return jax_methods.meta_grad(loss, inputs["params"], inputs["support"], inputs["query"], MAML_INNER_LR)


define(
    name="tutorial_maml",
    family=FAMILY,
    description=f"MAML meta-gradient (torch.func tutorial): sine regression with a 1-{MAML_HIDDEN}-{MAML_HIDDEN}-1 "
                f"MLP, one inner gradient step on {MAML_SHOTS} shots, vmapped over tasks",
    grid={"tasks": [8, 32, 512]},
    methods=METHODS,
    make_inputs=maml_data,
    make_method=with_jax(maml_method_of, tutorial_maml_jax),
    quick=("tasks=32",),
    not_in_quick=NOT_IN_QUICK,
)
