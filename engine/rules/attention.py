"""Scaled dot-product attention, as nn.MultiheadAttention and nn.TransformerEncoderLayer run it:
on CPU `_scaled_dot_product_flash_attention_for_cpu` and its backward; on CUDA in float32,
`_scaled_dot_product_efficient_attention` and its backward (the kernel SDPA picks there for float32;
the flash and cuDNN kernels take half precision only and have no rule: they run in the for-loop
fallback, which warns).

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

from engine.errors import RandomnessError, VmapError
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


def _fold_bias(bias, d, B: int, qf: torch.Tensor, kf: torch.Tensor):
    """An attention bias for the folded call on `qf` [B*N, H, L, E] and `kf` [B*N, H, S, E]:
    broadcast (from the right, as SDPA broadcasts it) to [B, N, H, L, S], then folded. The folded
    copy is padded so that its rows start 16-element aligned, which the CUDA kernel needs (what
    SDPA's own `pad_bias` does)."""
    if bias is None:
        return None
    n, (h, L), S = qf.shape[0] // B, qf.shape[1:3], kf.shape[2]
    if d is None:
        full = bias.expand(n, h, L, S).unsqueeze(0).expand(B, n, h, L, S)
    else:
        full = bias.reshape((B,) + (1,) * (5 - bias.dim()) + tuple(bias.shape[1:])).expand(B, n, h, L, S)
    pad = -S % 16
    if pad == 0:
        return full.reshape(B * n, h, L, S)
    return aten.constant_pad_nd.default(full.reshape(B * n, h, L, S), [0, pad])[..., :S]


def efficient_attention_rule(info, in_dims, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                             *, scale=None):
    _check_randomness(info, dropout_p)
    B = info.batch_size
    qf, kf, vf = (_fold(t, d, B) for t, d in zip((q, k, v), in_dims))
    bias = _fold_bias(attn_bias, in_dims[3], B, qf, kf)
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention.default(
        qf, kf, vf, bias, compute_log_sumexp, dropout_p, is_causal, scale=scale)
    n = qf.shape[0] // B
    return (out.unflatten(0, (B, n)), lse.unflatten(0, (B, n)), seed, offset), (0, 0, None, None)


def efficient_attention_backward_rule(info, in_dims, grad_out, q, k, v, attn_bias, out, lse, seed, offset, dropout_p,
                                      grad_input_mask, is_causal=False, *, scale=None):
    _check_randomness(info, dropout_p)
    if in_dims[7] is not None or in_dims[8] is not None:
        raise VmapError("vmap: the random state of a batched efficient-attention call came batched (philox seed or "
                        "offset); it must be the one state the folded forward drew with.")
    if attn_bias is not None and grad_input_mask[3]:
        raise VmapError(
            "vmap: the gradient of scaled_dot_product_attention with respect to its attn_mask has no batching rule "
            "on CUDA (efficient attention); detach the mask, or run on CPU, where the rule handles it.")
    B = info.batch_size
    folded = [_fold(t, d, B) for t, d in zip((grad_out, q, k, v, out, lse), in_dims[:4] + in_dims[5:7])]
    qf, kf = folded[1], folded[2]
    bias = _fold_bias(attn_bias, in_dims[4], B, qf, kf)
    gq, gk, gv, _ = aten._scaled_dot_product_efficient_attention_backward.default(
        *folded[:4], bias, *folded[4:], seed, offset, dropout_p, [*grad_input_mask[:3], False], is_causal, scale=scale)
    n = qf.shape[0] // B
    grads = tuple(g.unflatten(0, (B, n)) if g is not None and g.numel() else g for g in (gq, gk, gv))
    return grads + (None,), (0, 0, 0, None)


RULES[aten._scaled_dot_product_flash_attention_for_cpu.default] = flash_attention_rule
RULES[aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = flash_attention_backward_rule
efficient_attention_rule.deterministic_when = _dropout_p_is_zero(5)  # type: ignore[attr-defined]
efficient_attention_backward_rule.deterministic_when = _dropout_p_is_zero(9)  # type: ignore[attr-defined]
RULES[aten._scaled_dot_product_efficient_attention.default] = efficient_attention_rule
RULES[aten._scaled_dot_product_efficient_attention_backward.default] = efficient_attention_backward_rule
