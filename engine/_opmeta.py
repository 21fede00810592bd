"""What an aten op's schema says about it, read once per op: its name as reports print it, which
arguments it writes, whether it draws random numbers, its out-of-place twin.

A bottom module (it imports only torch): the dispatcher (engine._dispatch), the rules
(engine.rules.*) and the graph passes all read op metadata from here, so none of them has to
import another for it.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

aten = torch.ops.aten


def op_name(func: Any) -> str:
    name = func.name() if hasattr(func, "name") else str(func)
    overload = getattr(func, "_overloadname", "default") or "default"
    base = name.split(".")[0]
    return f"{base}.{overload}"



class _OpMeta:
    __slots__ = ("mutated", "returns_tensors", "random", "returns_self", "has_lists", "n_returns", "n_positional", "out_names")

    def __init__(self, func: Any):
        schema = func._schema
        self.mutated = tuple(
            i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only
        )
        self.returns_tensors = all(
            isinstance(r.type, (torch.TensorType, torch.OptionalType, torch.ListType))
            and ("Tensor" in str(r.type))
            for r in schema.returns
        )
        self.random = torch.Tag.nondeterministic_seeded in func.tags
        # In-place/out ops return (an alias of) their first mutated argument.
        self.returns_self = bool(self.mutated) and len(schema.returns) == 1 and schema.returns[0].alias_info is not None
        # Whether a positional argument can be a list of tensors (the level scan then looks inside lists).
        self.has_lists = any(isinstance(a.type, torch.ListType) and "Tensor" in str(a.type) for a in schema.arguments)
        self.n_returns = len(schema.returns)
        self.n_positional = sum(not a.kwarg_only for a in schema.arguments)
        # keyword-only written arguments (out=): `mutated` holds positional ones only
        self.out_names = tuple(a.name for a in schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)


@lru_cache(maxsize=None)
def op_meta(func: Any) -> _OpMeta:
    return _OpMeta(func)


@lru_cache(maxsize=None)
def out_of_place_view(op: Any) -> Any:
    """The out-of-place twin of an in-place op, same arguments (call_signature): squeeze_.dim ->
    squeeze.dim, transpose_.default -> transpose.int, pow_.Scalar -> pow.Tensor_Scalar; None if
    there is none."""
    packet = getattr(aten, op._schema.name.split("::")[1].rstrip("_"), None)
    if packet is None:
        return None
    wanted = call_signature(op)  # (the same arguments in the same order)
    for name in (op._overloadname, "int", "default", *packet.overloads()):
        candidate = getattr(packet, name, None)
        if candidate is not None and not candidate._schema.is_mutable and call_signature(candidate) == wanted:
            return candidate
    return None


def call_signature(op: Any) -> list[tuple]:
    """What a call site of `op` relies on: each argument's type, whether it is keyword-only (and
    then its name), and its default (a recorded call leaves defaulted arguments out)."""
    return [(str(a.type), a.kwarg_only, a.name if a.kwarg_only else None,
             repr(a.default_value) if a.has_default_value() else None) for a in op._schema.arguments]
