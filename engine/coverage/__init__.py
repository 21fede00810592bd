"""OpInfo conformance harness: batch every op in PyTorch's operator database under engine.vmap and
torch.func.vmap, compare each to a for-loop, and classify (native, fallback, mismatch, error, skip).

PyTorch's `op_db` is the external oracle: it names ~700 ops with sample inputs, so coverage is
measured on ops we did not choose.
"""
from engine.coverage.harness import STATUSES, OpResult, check_op, iter_opinfos, op_key, run_harness

__all__ = ["STATUSES", "OpResult", "check_op", "iter_opinfos", "op_key", "run_harness"]
