"""Exceptions and warnings the engine raises; every message names the culprit and the fix.

torch.func raises plain RuntimeError (and ValueError for some argument checks), so user code written
against it says `except RuntimeError`. The engine's classes subclass what torch.func raises in the
same situation, so such handlers keep working when the engine is swapped in.
"""
from __future__ import annotations


class VmapError(ValueError, RuntimeError):
    """A vmap call that cannot be honoured as written (bad in_dims, mismatched sizes, ...)."""


class OutDimError(VmapError, IndexError):
    """An out_dim outside an output's dims (torch.func raises IndexError there)."""


class DimOutOfRangeError(IndexError, RuntimeError):
    """A dim outside a tensor's dims where torch.func raises RuntimeError and eager PyTorch
    IndexError (squeeze of a 0-dim element): an instance of both, so either handler catches it."""


class TransformError(RuntimeError, ValueError):
    """A transform called in a way it cannot honour (non-scalar grad, bad argnums, bad has_aux output)."""


class UnsupportedInTransformError(RuntimeError):
    """Code torch.func refuses inside a transform (requires_grad_, retain_grad, an autograd.Function
    without functorch support, an in-place write into a captured tensor under grad)."""


class DataDependentError(RuntimeError):
    """An op whose result is a Python value that depends on tensor data (`.item()`, `if x:`)."""


class ReplayMismatchError(AssertionError):
    """Shadow verification (`engine.auto_tracing(verify=True)`, VMAPBENCH_AUTO_TRACE=verify): a
    replayed call breaks the replay contract (engine.replay_contract): it ran a rounding op its eager
    call did not run on that data that way, or its result differs beyond the dtype's tolerance."""


class RandomnessError(RuntimeError):
    """A random op under `randomness="error"`."""


class FallbackWarning(UserWarning):
    """An op had no batching rule and the engine ran it in a (slow) for-loop over the batch."""


class FallbackError(RuntimeError):
    """Raised instead of looping when `engine.fallback_policy("error")` is active."""

    def __init__(self, op_name: str):
        self.op_name = op_name
        super().__init__(
            f"Batching rule not implemented for {op_name}; the for-loop fallback is disabled by "
            f"engine.fallback_policy('error'). Add a rule with engine.register_rule({op_name.replace('::', '.')}) "
            f"or run under fallback_policy('warn')."
        )
