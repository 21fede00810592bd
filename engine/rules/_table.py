"""The rule table: the one place where ops are batched.

A rule has the signature of `torch.library.register_vmap` functions:
    rule(info, in_dims, *args, **kwargs) -> (output, out_dims)
`info` has `.batch_size`, `.randomness` and `.level`; `in_dims` holds, per positional argument, 0
when that argument is batched (its batch dim is at 0), None when it is not, or a list of those for
a list-of-tensors argument. `output` is a tensor or a tuple/list of tensors; `out_dims` gives each
output's batch dim (any int) or None for outputs that are the same for every batch element.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

Rule = Callable[..., tuple[Any, Any]]

PLANS: dict[Any, Any] = {}  # per-op dispatch plans (engine._dispatch), derived from the tables below


class _RuleTable(dict):
    """A dict that drops the derived dispatch plans whenever a rule is added or removed."""

    def __setitem__(self, key, value):
        PLANS.clear()
        super().__setitem__(key, value)

    def __delitem__(self, key):
        PLANS.clear()
        super().__delitem__(key)

    def pop(self, *args):
        PLANS.clear()
        return super().pop(*args)

    def update(self, *args, **kwargs):
        PLANS.clear()
        super().update(*args, **kwargs)

    def clear(self):
        PLANS.clear()
        super().clear()


RULES: dict[Any, Rule] = _RuleTable()            # OpOverload -> rule
PACKET_RULES: dict[Any, Rule] = _RuleTable()     # OpOverloadPacket -> rule, for every overload without its own


def register_rule(op: Any) -> Callable[[Rule], Rule]:
    """Decorator registering a batching rule for an aten op (OpOverload or OpOverloadPacket).

    A rule registered here wins over the engine's own rule, over decomposition and over the
    for-loop fallback.
    """
    if not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        raise TypeError(
            f"register_rule expects an aten op such as torch.ops.aten.sin.default or torch.ops.aten.sin, got {op!r}"
        )

    def decorator(rule: Rule) -> Rule:
        if isinstance(op, torch._ops.OpOverloadPacket):
            PACKET_RULES[op] = rule
            for name in op.overloads():
                RULES.pop(getattr(op, name), None)  # a packet registration replaces per-overload rules
        else:
            RULES[op] = rule
        return rule

    return decorator


def lookup(func: Any) -> Rule | None:
    rule = RULES.get(func)
    if rule is None:
        rule = PACKET_RULES.get(func.overloadpacket)
    return rule


def set_rule(ops: Any, rule_factory: Callable[[Any], Rule]) -> None:
    """Register `rule_factory(op)` for each op (the one-line-per-family helper used by the rule modules)."""
    for op in ops:
        RULES[op] = rule_factory(op)
