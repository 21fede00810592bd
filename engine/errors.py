"""Exceptions and warnings the engine raises; every message names the culprit and the fix."""
from __future__ import annotations


class VmapError(ValueError):
    """A vmap call that cannot be honoured as written (bad in_dims, mismatched sizes, ...)."""


class DataDependentError(RuntimeError):
    """An op whose result is a Python value that depends on tensor data (`.item()`, `if x:`)."""


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
