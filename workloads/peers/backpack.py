"""BackPACK per-sample gradients: the BatchGrad extension on the extended module.

One forward and one backward of the summed loss inside `with backpack(BatchGrad())`; each
`param.grad_batch` is then the per-example gradient of the per-example loss. Returned as a tuple
in `module.parameters()` order, the structure every other method returns. BatchGrad covers
Linear, Conv, Embedding and the RNN layers; a model with other parametrized layers (GroupNorm,
multi-head attention) is not listed for it.

BackPACK is installed without its torchvision dependency (see pyproject's `peers` extra): the
registry's torchvision wheels do not import against the CPU torch, and BatchGrad never uses it.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import nn

from workloads.peers.availability import PACKAGES, require

METHODS = ("backpack",)


def per_sample_grads(method: str, module: nn.Module, criterion: Callable[..., torch.Tensor], x: torch.Tensor,
                     y: torch.Tensor) -> Callable[[], tuple[torch.Tensor, ...]]:
    """The measured call of `method` on `module`: `criterion(out, y, reduction="sum")` must be the
    sum of the per-example losses."""
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not a BackPACK method; valid: {', '.join(METHODS)}")
    extensions = require(PACKAGES[method], method)
    bp = require("backpack", method)
    extended = bp.extend(module)
    params = [p for p in module.parameters() if p.requires_grad]

    def run() -> tuple[torch.Tensor, ...]:
        for p in params:
            p.grad = None
            if hasattr(p, "grad_batch"):
                del p.grad_batch
        loss = criterion(extended(x), y, reduction="sum")
        with bp.backpack(extensions.BatchGrad()), warnings.catch_warnings():
            # BackPACK warns for every module holding parameters through children it has no
            # extension for (the model's own container class); the check below is what matters:
            # every parameter got its grad_batch, or the method raises.
            warnings.filterwarnings("ignore", message="Extension saving to grad_batch does not have an extension",
                                    category=UserWarning)
            loss.backward()
        missing = [name for name, p in module.named_parameters() if not hasattr(p, "grad_batch")]
        if missing:
            raise RuntimeError(f"{method}: BackPACK's BatchGrad computed no grad_batch for {', '.join(missing)}; "
                               f"it has no extension for the layer holding it")
        return tuple(p.grad_batch for p in params)
    return run
