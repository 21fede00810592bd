"""Scaled dot-product attention on CPU (`_scaled_dot_product_flash_attention_for_cpu` and its
backward), as nn.MultiheadAttention and nn.TransformerEncoderLayer run it.

The kernel takes [N, H, L, E] operands and treats N as independent sequences, so the batch
joins N: one kernel call for the whole batch. The op is tagged random because of `dropout_p`;
with dropout_p == 0 (eval, or `dropout=0.0`) it draws nothing, so it is not refused under
randomness='error' (`deterministic_when`, read by the dispatcher). With dropout_p > 0 the folded
call draws independently per batch element, which is randomness='different'; the dispatcher
refuses it under 'error', and this rule refuses 'same' (one mask for every element cannot be had
from a folded call).
"""
from __future__ import annotations

import torch

from engine.errors import RandomnessError
from engine.rules._helpers import materialize
from engine.rules._table import RULES

aten = torch.ops.aten


def _fold(t: torch.Tensor, d, B: int) -> torch.Tensor:
    return materialize(t, d, B).flatten(0, 1)


def _fold_mask(mask, B: int):
    """An (unbatched) attention mask for the folded [B*N, H, L, S] call: one that broadcasts over N
    broadcasts as it is; a per-sequence [N, H', L, S] one is repeated for each batch element."""
    if mask is None or mask.dim() < 4 or mask.shape[0] == 1:
        return mask
    return mask.expand(B, *mask.shape).flatten(0, 1)


def _check_randomness(info, dropout_p: float) -> None:
    if dropout_p != 0 and info.randomness == "same":
        raise RandomnessError(
            "vmap: scaled_dot_product_attention with dropout_p > 0 under randomness='same' cannot share one dropout "
            "mask across the batch; use randomness='different' or dropout_p=0."
        )


def flash_attention_rule(info, in_dims, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    _check_randomness(info, dropout_p)
    B = info.batch_size
    n = materialize(q, in_dims[0], B).shape[1]
    # A batched attn_mask would come as a keyword, which sends the call past the rule (the dispatcher
    # does not unwrap keywords): here it is never batched.
    qf, kf, vf = (_fold(t, d, B) for t, d in zip((q, k, v), in_dims))
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(
        qf, kf, vf, dropout_p, is_causal, attn_mask=_fold_mask(attn_mask, B), scale=scale)
    return (out.unflatten(0, (B, n)), lse.unflatten(0, (B, n))), (0, 0)


def flash_attention_backward_rule(info, in_dims, grad_out, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None,
                                  scale=None):
    _check_randomness(info, dropout_p)
    B = info.batch_size
    n = materialize(q, in_dims[1], B).shape[1]
    folded = [_fold(t, d, B) for t, d in zip((grad_out, q, k, v, out, lse), in_dims)]
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        *folded, dropout_p, is_causal, attn_mask=_fold_mask(attn_mask, B), scale=scale)
    return tuple(g.unflatten(0, (B, n)) for g in grads), (0, 0, 0)


def _dropout_p_is_zero(position: int):
    def deterministic_when(args: tuple, kwargs: dict) -> bool:
        p = args[position] if len(args) > position else kwargs.get("dropout_p", 0.0)
        return p == 0

    return deterministic_when


flash_attention_rule.deterministic_when = _dropout_p_is_zero(3)  # type: ignore[attr-defined]
flash_attention_backward_rule.deterministic_when = _dropout_p_is_zero(6)  # type: ignore[attr-defined]
RULES[aten._scaled_dot_product_flash_attention_for_cpu.default] = flash_attention_rule
RULES[aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = flash_attention_backward_rule
