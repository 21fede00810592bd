"""Whether a peer's package can be imported, and the skip (`PeerUnavailable`) when it cannot.

The bottom of `workloads.peers`: the peer modules (opacus, backpack) import it, and so do the CLI
and the ASV probes, through the package, which re-exports it.
"""
from __future__ import annotations

import importlib
import importlib.util
import warnings
from types import ModuleType

INSTALL_HINT = "install the peers with `pip install -e '.[peers]'` (make bench does it unless PEERS=0)"


# The package each peer method imports (its submodule, so a half-installed package counts as missing).
PACKAGES = {
    "opacus_hooks": "opacus.grad_sample",
    "opacus_ew": "opacus.grad_sample",
    "opacus_functorch": "opacus.grad_sample",
    "backpack": "backpack.extensions",
}


class PeerUnavailable(NotImplementedError):
    """A peer method cannot run here (its package is not installed, or, for jax, not on this device
    or thread count): a skip (ASV, CLI), never a failure of the method.

    Apart from plain NotImplementedError, which torch raises for an op a backend lacks: that is a
    failure of the method and must show up as one."""


# Peers checked by finding their package without importing it: jax's import configures XLA's
# threads (jax_methods.load_jax), which must wait for the method's own process.
FOUND_ONLY = {"jax": "jax"}


def check_available(method: str) -> None:
    """PeerUnavailable when `method` is a peer method whose package cannot be imported (for jax:
    cannot be found; load_jax says why it cannot run when it can be found)."""
    if method in PACKAGES:
        require(PACKAGES[method], method)
    elif method in FOUND_ONLY:
        package = FOUND_ONLY[method]
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise PeerUnavailable(f"method {method!r} needs the {package!r} package, which is not installed here; "
                                  f"{INSTALL_HINT}")


def preload() -> None:
    """Import every installed peer package now (opacus' import is long even with torch loaded), so a
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
