"""Peer frameworks as methods: other tools a user would pick for the same task (Opacus, BackPACK, JAX).

Each module maps method names to a builder that returns the measured zero-argument call, like
workloads.methods does for the transforms. A peer's package is imported when its method is
built; when it is missing the builder raises NotImplementedError naming the package and the
install line (`pip install -e '.[peers]'`), so ASV skips the case and the CLI reports it.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable, Sequence

import torch
from torch import nn

INSTALL_HINT = "install the peers with `pip install -e '.[peers]'` (make bench does it unless PEERS=0)"


def require(package: str, method: str) -> ModuleType:
    """Import `package` for `method`, or raise NotImplementedError saying how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise NotImplementedError(f"method {method!r} needs the {package!r} package, which cannot be imported "
                                  f"here ({e}); {INSTALL_HINT}") from e


def per_sample_grads(method: str, module: nn.Module, criterion: Callable[..., torch.Tensor], x: torch.Tensor,
                     y: torch.Tensor) -> Callable[[], tuple[torch.Tensor, ...]]:
    """The measured call of peer `method` computing per-sample gradients of `module` on (x, y):
    a tuple in `module.parameters()` order. `criterion(out, y, reduction="sum")` must be the sum
    of the per-example losses (F.cross_entropy and F.binary_cross_entropy_with_logits are)."""
    from workloads.peers import backpack, opacus

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
