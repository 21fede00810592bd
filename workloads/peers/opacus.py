"""Opacus (1.6) per-sample gradients: one method per grad-sample mode that works on CPU.

- `opacus_hooks`: GradSampleModule with module hooks and Opacus' per-layer formulas (layers
  without one, e.g. nn.LSTM, go through functorch inside the hooks).
- `opacus_ew`: torch's ExpandedWeights (`call_for_per_sample_grads`) behind Opacus' wrapper.
- `opacus_functorch`: GradSampleModule with `force_functorch`: vmap(grad) per layer.

The ghost-clipping modes compute per-sample gradient norms, not the gradients, so they are no
method here. Every mode runs one forward and backward of the summed loss (`loss_reduction="sum"`),
so each `param.grad_sample` is the per-example gradient of the per-example loss, returned as a
tuple in `module.parameters()` order: the structure every other method returns.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from workloads.peers.availability import PACKAGES, require

MODES = {"opacus_hooks": "hooks", "opacus_ew": "ew", "opacus_functorch": "functorch"}
METHODS = tuple(MODES)


def per_sample_grads(method: str, module: nn.Module, criterion: Callable[..., torch.Tensor], x: torch.Tensor,
                     y: torch.Tensor) -> Callable[[], tuple[torch.Tensor, ...]]:
    """The measured call of `method` on `module` (batch-first input `x`, labels `y`).

    `criterion(out, y, reduction="sum")` must be the sum of the per-example losses.
    """
    if method not in MODES:
        raise ValueError(f"method {method!r} is not an Opacus method; valid: {', '.join(METHODS)}")
    grad_sample = require(PACKAGES[method], method)
    wrapped: Any = grad_sample.prepare_module(module, MODES[method], batch_first=True, loss_reduction="sum")
    params = [p for p in module.parameters() if p.requires_grad]

    def run() -> tuple[torch.Tensor, ...]:
        for p in params:
            p.grad = None
            p.grad_sample = None
        criterion(wrapped(x), y, reduction="sum").backward()
        missing = [name for name, p in module.named_parameters() if p.grad_sample is None]
        if missing:
            raise RuntimeError(f"{method}: Opacus computed no grad_sample for {', '.join(missing)}; "
                               f"its {MODES[method]!r} mode cannot express this model")
        return tuple(p.grad_sample for p in params)
    return run
