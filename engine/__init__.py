"""vmapbench's bundled vmap engine: pure Python on top of PyTorch, API-compatible with torch.func.

Per-operator batching rules (engine.rules) run on a `__torch_dispatch__` batched tensor, so the ops
autograd runs in backward are batched too: that is what makes vmap over the backward pass
(Jacobians, Hessians, per-sample gradients) work. Ops without a rule are decomposed when PyTorch
has a decomposition, else run in a for-loop fallback that warns and names the op.
"""
from engine import rules as _rules  # noqa: F401  (fills the rule table)
from engine._batched import BatchedTensor
from engine._dispatch import FallbackRecord, fallback_policy, record_fallbacks
from engine import _vmap, functional, transforms
from engine.transforms import TransformError, jvp, linearize
from engine.trace import TraceFallbackWarning, UntraceableError, compile, trace  # noqa: A004  (engine.compile mirrors torch.compile)
from engine.autotrace import auto_trace, traced_transform
from engine.autovjp import vjp
from engine import autovjp
from engine.autoswitch import auto_tracing
from engine.fused import fused_tier, settle
from engine.errors import (
    DataDependentError,
    FallbackError,
    FallbackWarning,
    RandomnessError,
    ReplayMismatchError,
    VmapError,
)
from engine.compliance import check_compliance
from engine.rules._table import register_rule

# The public transforms: the eager ones of engine._vmap / engine.transforms, automatically traced,
# each with how it composes with callables another transform traces itself (vmap of a vjp_fn).
vmap = traced_transform(_vmap.vmap, compose=autovjp.vmap_of_vjp_fn)
grad = traced_transform(transforms.grad)
grad_and_value = traced_transform(transforms.grad_and_value)
jacrev = traced_transform(transforms.jacrev)
jacfwd = traced_transform(transforms.jacfwd)
hessian = traced_transform(transforms.hessian)

__all__ = [
    "auto_trace",
    "auto_tracing",
    "BatchedTensor",
    "check_compliance",
    "compile",
    "trace",
    "TraceFallbackWarning",
    "UntraceableError",
    "DataDependentError",
    "FallbackError",
    "FallbackRecord",
    "FallbackWarning",
    "TransformError",
    "functional",
    "fused_tier",
    "grad",
    "grad_and_value",
    "hessian",
    "jacfwd",
    "jacrev",
    "jvp",
    "linearize",
    "vjp",
    "RandomnessError",
    "ReplayMismatchError",
    "VmapError",
    "fallback_policy",
    "record_fallbacks",
    "register_rule",
    "settle",
    "vmap",
]
