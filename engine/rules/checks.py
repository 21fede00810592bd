"""Whole-tensor checks (`torch._is_all_true`, `torch._is_any_true`): reduced over the batch too.

torch.distributions validates its arguments with `if not torch._is_all_true(valid): raise ...`.
The answer is one Python bool for the whole call, so under vmap it is reduced over every batch
element as well, as torch.func does: the check then fires when any one element is invalid, and
the raise names that distribution and argument. The result is unbatched, so the `.item()` that
follows is not data-dependent for the engine (and becomes a guard under engine.trace).
"""
from __future__ import annotations

import torch

from engine.errors import DataDependentError
from engine.rules._table import RULES

aten = torch.ops.aten


def _whole_batch(op):
    def rule(info, in_dims, x):
        return op(x), None

    return rule


for _op in (aten._is_all_true.default, aten._is_any_true.default):
    RULES[_op] = _whole_batch(_op)


def _branch_rule(op):
    """`if t:` / `bool(t)` on a batched 0-dim tensor: a Python branch per batch element.

    When every element gives the same answer (an argument check that holds everywhere, such as
    `if not sym_check.all():` in torch.distributions' positive-definite constraint) each element
    would take the same branch in a loop, so that answer is returned; when they disagree no single
    Python value is right and the call raises. Numbers read off a batched tensor (`.item()` of
    a float or int) follow the same reasoning: when every element holds the same number (an index
    tensor passed to `narrow` or `tensor_split` that only looks batched), each loop iteration
    reads that number, so it is returned; when they differ the call raises.
    """

    def rule(info, in_dims, x):
        if op is aten._local_scalar_dense.default and x.dtype != torch.bool:
            if bool(aten._is_all_true.default(aten.eq.Tensor(x, x[:1]))):
                return op(x[0]), None
            raise DataDependentError(_MESSAGE.format(name=op.name(), what="a number"))
        truth = x if x.dtype == torch.bool else x != 0
        if bool(aten._is_all_true.default(truth)):
            return True, None
        if not bool(aten._is_any_true.default(truth)):
            return False, None
        raise DataDependentError(
            f"vmap: {op.name()} reads a Python bool off a batched tensor (`if tensor:`, `bool(tensor)`) that is True "
            f"for some batch elements and False for others, so they would take different branches. Data-dependent "
            f"Python control flow cannot be vmapped: use tensor ops such as torch.where instead."
        )

    return rule


_MESSAGE = (
    "vmap: {name} needs {what} from a batched tensor in Python (e.g. `.item()`, `float(tensor)`), which differs per "
    "batch element. Data-dependent Python control flow cannot be vmapped: use tensor ops such as torch.where instead."
)

for _op in (aten._local_scalar_dense.default, aten.is_nonzero.default):
    RULES[_op] = _branch_rule(_op)
