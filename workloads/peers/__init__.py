"""Peer frameworks as methods: other tools a user would pick for the same task (Opacus, BackPACK, JAX).

Each module maps method names to a builder that returns the measured zero-argument call, like
workloads.methods does for the transforms. A peer's package is imported when its method is
built; when it is missing the builder raises the package and the
install line (`pip install -e '.[peers]'`): `PeerUnavailable`, a NotImplementedError, so ASV skips
the case (suite/probes.py checks before the first call) and the CLI shows the method as skipped.

Modules, bottom up: `availability` (is a peer's package importable; the skip), `opacus` and
`backpack` (their per-sample-gradient methods, dispatched by `per_sample_grads` here),
`jax_methods` (the jax method's machinery: threads, dtype, jit, timing; task builders) and
`jax_nn` (torch.nn.functional in jax.numpy). None imports a workload module: each workload's
JAX twin sits beside its torch model in the workload's own module.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from workloads.peers import backpack, opacus
from workloads.peers.availability import (  # noqa: F401  (the package's interface)
    INSTALL_HINT,
    PACKAGES,
    PeerUnavailable,
    check_available,
    preload,
    require,
)


def per_sample_grads(method: str, module: nn.Module, criterion: Callable[..., torch.Tensor], x: torch.Tensor,
                     y: torch.Tensor) -> Callable[[], tuple[torch.Tensor, ...]]:
    """The measured call of peer `method` computing per-sample gradients of `module` on (x, y):
    a tuple in `module.parameters()` order. `criterion(out, y, reduction="sum")` must be the sum
    of the per-example losses (F.cross_entropy and F.binary_cross_entropy_with_logits are)."""
    for peer in (opacus, backpack):
        if method in peer.METHODS:
            return peer.per_sample_grads(method, module, criterion, x, y)
    raise ValueError(f"method {method!r} is no per-sample-gradient peer; valid: {', '.join(opacus.METHODS + backpack.METHODS)}")


def module_holding(factory: Callable[[], nn.Module], params: Sequence[torch.Tensor]) -> nn.Module:
    """A module from `factory` (training mode) with its parameters, in `parameters()` order, set to
    copies of `params` (their dtype and device): the nn.Module form of a functional model, for the
    peers that need one. Building it leaves torch's global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        module = factory()
    own = list(module.parameters())
    if [tuple(p.shape) for p in own] != [tuple(p.shape) for p in params]:
        raise ValueError(f"module {type(module).__name__} has parameters of shapes {[tuple(p.shape) for p in own]}, "
                         f"the functional model {[tuple(p.shape) for p in params]}")
    module.to(device=params[0].device, dtype=params[0].dtype)
    with torch.no_grad():
        for p, value in zip(own, params):
            p.copy_(value)
    return module.train()
