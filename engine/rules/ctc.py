"""CTC loss: the vmap batch folds into ctc_loss's own batch dim (examples x sequences), forward and
backward. Each (example, sequence) pair is one independent item of the kernel, so the folded call
computes exactly what the loop computes per example.

Targets given in the concatenated 1-D form are first spread into the padded 2-D form (one row per
sequence, read from each example's own offsets), since the examples' concatenations need not have
the same used length. log_alpha, the forward's internal output for the backward, is padded to the
longest target of the whole batch.
"""
from __future__ import annotations

from typing import Any

import torch

from engine.rules._helpers import materialize
from engine.rules._table import RULES

aten = torch.ops.aten


def _lengths(v: Any, d: Any, B: int, N: int) -> torch.Tensor:
    """Per-example lengths as a [B, N] int64 tensor (from a list, an unbatched or a batched tensor)."""
    t = torch.as_tensor(v, dtype=torch.long) if not isinstance(v, torch.Tensor) else v.to(torch.long)
    if d is None:
        t = t.reshape(-1).unsqueeze(0).expand(B, -1)
    return t.reshape(B, N)


def _ints(t: torch.Tensor) -> list[int]:
    """Lengths as Python ints through .item(), which engine.trace sees as a data-dependent read
    (.tolist() would be baked into a traced graph as constants)."""
    return [int(v.item()) for v in t.reshape(-1)]


def _fold_targets(targets: torch.Tensor, dt: Any, B: int, tl: torch.Tensor) -> torch.Tensor:
    """Targets as [B * N, S] padded rows."""
    targets = materialize(targets, dt, B)
    N = tl.shape[1]
    if targets.dim() == 3:  # [B, N, S] padded form
        return targets.reshape(B * N, targets.shape[2])
    width = max(int(tl.max()) if tl.numel() else 0, 1)
    starts = tl.cumsum(1) - tl
    idx = (starts.unsqueeze(-1) + torch.arange(width)).clamp_max(max(targets.shape[1] - 1, 0))
    rows = torch.gather(targets, 1, idx.reshape(B, -1)) if targets.shape[1] else targets.new_zeros(B, N * width)
    return rows.reshape(B * N, width)


def _fold_log_probs(lp: torch.Tensor, d: Any, B: int) -> torch.Tensor:
    """[B, T, N, C] -> [T, B * N, C]."""
    lp = materialize(lp, d, B)
    if lp.dim() != 4:
        raise RuntimeError(f"ctc_loss: expected log_probs of 3 dims (T, N, C) per example, got {lp.dim() - 1}")
    T, N, C = lp.shape[1:]
    return lp.permute(1, 0, 2, 3).reshape(T, B * N, C)


def ctc_loss_rule(info, in_dims, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    B = info.batch_size
    N = log_probs.shape[-2]
    il = _lengths(input_lengths, in_dims[2], B, N)
    tl = _lengths(target_lengths, in_dims[3], B, N)
    nll, log_alpha = aten._ctc_loss.default(
        _fold_log_probs(log_probs, in_dims[0], B), _fold_targets(targets, in_dims[1], B, tl),
        _ints(il), _ints(tl), blank, zero_infinity)
    return (nll.reshape(B, N), log_alpha.reshape((B, N) + tuple(log_alpha.shape[1:]))), (0, 0)


def ctc_loss_backward_rule(info, in_dims, grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha,
                           blank, zero_infinity=False):
    B = info.batch_size
    T, N, C = log_probs.shape[-3:]
    il = _lengths(input_lengths, in_dims[3], B, N)
    tl = _lengths(target_lengths, in_dims[4], B, N)
    grad = materialize(grad, in_dims[0], B)
    if grad.dim() == 1:  # a 0-dim grad per example (reduced loss): the same for every sequence
        grad = grad.unsqueeze(1).expand(B, N)
    log_alpha = materialize(log_alpha, in_dims[6], B)
    out = aten._ctc_loss_backward.default(
        grad.reshape(B * N), _fold_log_probs(log_probs, in_dims[1], B), _fold_targets(targets, in_dims[2], B, tl),
        _ints(il), _ints(tl), materialize(nll, in_dims[5], B).reshape(B * N),
        log_alpha.reshape((B * N,) + tuple(log_alpha.shape[2:])), blank, zero_infinity)
    return out.reshape(T, B, N, C).permute(1, 0, 2, 3), 0


RULES[aten._ctc_loss.default] = ctc_loss_rule
RULES[aten._ctc_loss.Tensor] = ctc_loss_rule
RULES[aten._ctc_loss_backward.default] = ctc_loss_backward_rule
RULES[aten._ctc_loss_backward.Tensor] = ctc_loss_backward_rule
