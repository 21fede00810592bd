"""Peer frameworks as methods: other tools a user would pick for the same task (Opacus, BackPACK, JAX).

Each module maps method names to a builder that returns the measured zero-argument call, like
workloads.methods does for the transforms. A peer's package is imported when its method is
built; when it is missing the builder raises the package and the
install line (`pip install -e '.[peers]'`): `PeerUnavailable`, a NotImplementedError, so ASV skips
the case (suite/probes.py checks before the first call) and the CLI shows the method as skipped.
"""
from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Callable, Sequence

import torch
from torch import nn

INSTALL_HINT = "install the peers with `pip install -e '.[peers]'` (make bench does it unless PEERS=0)"


# The package each peer method imports (its submodule, so a half-installed package counts as missing).
PACKAGES = {
    "opacus_hooks": "opacus.grad_sample",
    "opacus_ew": "opacus.grad_sample",
    "opacus_functorch": "opacus.grad_sample",
    "backpack": "backpack.extensions",
}


class PeerUnavailable(NotImplementedError):
    """A peer method's package is not installed: a skip (ASV, CLI), never a failure of the method.

    Apart from plain NotImplementedError, which torch raises for an op a backend lacks: that is a
    failure of the method and must show up as one."""


def check_available(method: str) -> None:
    """PeerUnavailable when `method` is a peer method whose package cannot be imported."""
    if method in PACKAGES:
        require(PACKAGES[method], method)


def preload() -> None:
    """Import every installed peer package now (opacus alone takes ~7 s on top of torch here), so a
    benchmark process forked afterwards does not pay it; missing ones are left to their methods."""
    for method, package in PACKAGES.items():
        try:
            require(package, method)
        except PeerUnavailable:
            pass


def require(package: str, method: str) -> ModuleType:
    """Import `package` for `method`, or raise PeerUnavailable saying how to install it."""
    # Opacus and BackPACK hook modules whose inputs need no gradient (the data); torch warns about
    # that on every backward, though both read only the outputs' gradients. Silence that one warning.
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with "
                            "respect to module outputs since no inputs require gradients", category=UserWarning)
    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise PeerUnavailable(f"method {method!r} needs the {package!r} package, which cannot be imported "
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
