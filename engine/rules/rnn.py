"""Recurrent layers (nn.RNN, nn.GRU, nn.LSTM) under vmap.

Two things stand in the way, and both are handled here:

- PyTorch's RNN kernels run the recurrence in C++ and write in place into the hidden-state
  projection (`linear_hh(h).add_(...)`). With the initial hidden state unbatched (nn.RNNBase
  makes it with `torch.zeros` when none is given, or the user passes one shared by every batch
  element) the first step writes batched values into an unbatched tensor, which no rule can do
  (torch.func fails there too). `batched_initial_state` is active while a vmap runs: a hook on
  nn.RNNBase's call that hands an RNN module called on a batched input an initial state batched
  like that input (the same zeros, or the given state repeated per element). Every step then
  writes into batched tensors; the values are those of the loop exactly.
- On CPU in float32, nn.LSTM runs each layer as one oneDNN kernel, `mkldnn_rnn_layer`, with its
  own backward. The forward folds the batch into the kernel's minibatch (the weights are shared).
  Its backward is an exact decomposition: the layer's LSTM recurrence recomputed with ordinary
  ops and differentiated by autograd, batched per element, so each element gets its own weight
  gradient (folding would sum them).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine._batched import BatchedTensor, add_batch_dim
from engine.errors import VmapError
from engine.rules._helpers import materialize
from engine.rules._table import RULES

aten = torch.ops.aten
_LSTM_MODE = 2  # ideep::rnn_kind::LSTM, the only mode PyTorch runs through mkldnn_rnn_layer


# ---------------------------------------------------------------------------------------------
# the initial hidden state


def _levels(x: torch.Tensor) -> list[tuple[int, int]]:
    """(level, batch size) of each batch level of x, outermost first."""
    out = []
    while type(x) is BatchedTensor:
        out.append((x._level, x._elem.shape[0]))
        x = x._elem
    return out


def _batched_like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """t repeated over every batch level of `ref`, in fresh memory.

    Made by adding batched zeros, an op like any other: autograd then gives t a gradient per
    batch element (as for any unbatched input combined with batched data), which a raw re-wrap
    of t's memory would lose."""
    zeros = torch.zeros((), dtype=t.dtype, device=t.device)
    for level, size in reversed(_levels(ref)):  # innermost level first
        zeros = add_batch_dim(zeros.unsqueeze(0).expand(size), level)
    return t + zeros


def _initial_state(module: nn.RNNBase, x: torch.Tensor) -> Any:
    directions = 2 if module.bidirectional else 1
    batched_input = x.dim() == 3
    lead = (module.num_layers * directions,) + ((x.shape[0 if module.batch_first else 1],) if batched_input else ())
    h_size = module.proj_size if getattr(module, "proj_size", 0) > 0 else module.hidden_size
    h = torch.zeros(lead + (h_size,), dtype=x.dtype, device=x.device)
    if isinstance(module, nn.LSTM):
        return (h, torch.zeros(lead + (module.hidden_size,), dtype=x.dtype, device=x.device))
    return h


def _rnn_pre_hook(module: nn.Module, args: tuple) -> tuple | None:
    if not isinstance(module, nn.RNNBase) or not args or type(args[0]) is not BatchedTensor:
        return None
    x = args[0]
    hx = args[1] if len(args) > 1 else None
    if hx is None:
        hx = _initial_state(module, x)
    if isinstance(hx, tuple):
        hx = tuple(_batched_like(h, x) for h in hx)
    else:
        hx = _batched_like(hx, x)
    return (x, hx) + tuple(args[2:])


class _HookState:
    depth = 0
    installed = False


_MODULE_CALL = nn.Module.__call__


def _rnn_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """`RNNBase.__call__`: inside vmap, the pre-hook's batched initial state first (see
    `batched_initial_state`); elsewhere exactly Module.__call__."""
    if _HookState.depth and args and type(args[0]) is BatchedTensor:
        new = _rnn_pre_hook(self, args)
        if new is not None:
            args = new
        d = self.__dict__
        flat, refs = d.get("_flat_weights"), d.get("_flat_weight_refs")
        kept = list(flat) if isinstance(flat, list) else None
        try:
            return _MODULE_CALL(self, *args, **kwargs)
        finally:
            if kept is not None:
                _keep_weight_cache(d, flat, kept, refs)
    return _MODULE_CALL(self, *args, **kwargs)


def _keep_weight_cache(d: dict, flat: list, items: list, refs: Any) -> None:
    """Give an RNN module back its weight cache as it was before a call inside vmap.

    nn.RNNBase caches its weights in a list (`_flat_weights`) beside weak references to them
    (`_flat_weight_refs`); its forward rebuilds both, as new lists, whenever the references
    disagree with its attributes. torch.func.functional_call, the way per-sample gradients call a
    module, swaps the parameters in through the parameter dict, so they disagree at every call:
    every call rebuilt the cache, left it holding the swapped-in tensors once functional_call had
    put the module's own back, and automatic tracing's guard saw the state the function reads
    change while it ran (nn.LSTM workloads stayed eager for good).

    The cache is a function of the attributes that the forward checks before every use, so the
    pair as it was (the same list objects, the same items) is always a correct cache to hand back:
    where it no longer matches the attributes (a forward that set a weight for good), the next
    forward sees the references disagree and rebuilds, as it always did."""
    flat[:] = items
    d["_flat_weights"] = flat
    if refs is not None:
        d["_flat_weight_refs"] = refs


class batched_initial_state:  # noqa: N801 - used as `with batched_initial_state():`, like a function
    """While active (engine.vmap enters it), RNN modules called on batched inputs get a batched
    initial state. Its hook sits on nn.RNNBase alone (installed on first use, inert outside vmap):
    a global module pre-hook, registered and removed around every vmap call as before, cost that
    registration per call and sent every module call inside vmap down nn.Module's slow hook path
    (issue #18); a class-level `__call__` costs RNN modules one Python call outside vmap."""

    __slots__ = ()

    def __enter__(self) -> None:
        if not _HookState.installed:
            nn.RNNBase.__call__ = _rnn_call  # type: ignore[method-assign]
            _HookState.installed = True
        _HookState.depth += 1

    def __exit__(self, *exc: object) -> None:
        _HookState.depth -= 1


# ---------------------------------------------------------------------------------------------
# mkldnn_rnn_layer


def _lstm_layer(x, w_ih, w_hh, b_ih, b_hh, h, c, reverse: bool, keep: list | None = None):
    """One LSTM layer, time-major: x [*P, T, N, I], h and c [*P, N, H]; the weights transposed
    ([I, 4H], [H, 4H]) and shaped to broadcast against them. `keep` collects, per step in the
    order run, what the backward needs: (t, h_prev, c_prev, i, f, g, o, tanh(c))."""
    pre = torch.matmul(x, w_ih) + b_ih
    steps = range(x.shape[-3])
    outs = [None] * len(steps)
    for t in (reversed(steps) if reverse else steps):
        gates = pre[..., t, :, :] + torch.matmul(h, w_hh) + b_hh
        i, f, g, o = gates.chunk(4, -1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c_next = f * c + i * g
        tc = torch.tanh(c_next)
        if keep is not None:
            keep.append((t, h, c, i, f, g, o, tc))
        h, c = o * tc, c_next
        outs[t] = h
    return torch.stack(outs, -3), h, c


def _lstm_layer_backward(x, w_ih, w_hh, keep: list, grad_y, grad_h, grad_c):
    """Backpropagation through time for `_lstm_layer` with batch prefix [B] on every operand
    (weights [B, 4H, I] and [B, 4H, H]): per-element gradients of x, weights, biases, h0, c0."""
    dh = torch.zeros_like(keep[0][1]) if grad_h is None else grad_h
    dc = torch.zeros_like(keep[0][2]) if grad_c is None else grad_c
    dpre = [None] * len(keep)
    h_prev = [None] * len(keep)
    for t, hp, cp, i, f, g, o, tc in reversed(keep):
        if grad_y is not None:
            dh = dh + grad_y[:, t]
        dc = dc + dh * o * (1 - tc * tc)
        da = torch.cat([dc * g * i * (1 - i), dc * cp * f * (1 - f), dc * i * (1 - g * g), dh * tc * o * (1 - o)], -1)
        dpre[t], h_prev[t] = da, hp
        dh = torch.matmul(da, w_hh)
        dc = dc * f
    dpre_all = torch.stack(dpre, 1)                                        # [B, T, N, 4H]
    gx = torch.matmul(dpre_all, w_ih.unsqueeze(1))
    gw_ih = torch.einsum("btng,btni->bgi", dpre_all, x)
    gw_hh = torch.einsum("btng,btnh->bgh", dpre_all, torch.stack(h_prev, 1))
    gb = dpre_all.sum((1, 2))
    return gx, gw_ih, gw_hh, gb, dh, dc


def _check_mode(mode: int) -> None:
    if mode != _LSTM_MODE:
        raise VmapError(f"vmap: aten::mkldnn_rnn_layer with mode {mode} (not LSTM) has no batching rule.")


def mkldnn_rnn_layer_rule(info, in_dims, x, w0, w1, w2, w3, hx, cx, reverse, batch_sizes, mode, hidden_size,
                          num_layers, has_biases, bidirectional, batch_first, train):
    """Shared weights: the batch joins the kernel's minibatch dim (one kernel call).

    The CPU kernel takes the input time-major ([T, N, I], whatever `batch_first` says) and the
    states as [..., N, H]."""
    _check_mode(mode)
    B = info.batch_size
    if any(d is not None for d in in_dims[1:5]):
        y, hy, cy = _lstm_batched(info, in_dims, x, w0, w1, w2, w3, hx, cx, reverse)
        return (y, hy, cy, torch.empty(0, dtype=torch.uint8, device=x.device)), (0, 0, 0, None)
    xm = materialize(x, in_dims[0], B)                       # [B, T, N, I]
    n = xm.shape[2]
    xf = xm.movedim(0, 1).flatten(1, 2).contiguous()          # [T, B*N, I]
    hf, cf = (materialize(t, d, B).movedim(0, -3).flatten(-3, -2).contiguous() for t, d in ((hx, in_dims[5]), (cx, in_dims[6])))
    y, hy, cy, ws = aten.mkldnn_rnn_layer.default(xf, w0, w1, w2, w3, hf, cf, reverse, batch_sizes, mode, hidden_size,
                                                  num_layers, has_biases, bidirectional, batch_first, train)
    y = y.unflatten(1, (B, n)).movedim(1, 0)
    hy, cy = (t.unflatten(-2, (B, n)).movedim(-3, 0) for t in (hy, cy))
    return (y, hy, cy, ws), (0, 0, 0, None)


def _lstm_batched(info, in_dims, x, w0, w1, w2, w3, hx, cx, reverse, keep: list | None = None):
    """The layer for per-element weights (and the backward's recomputation): every operand with
    the batch at dim 0, the recurrence in batched matmuls."""
    B = info.batch_size
    xm = materialize(x, in_dims[0], B)                       # [B, T, N, I]
    w_ih, w_hh, b_ih, b_hh = (materialize(w, d, B) for w, d in zip((w0, w1, w2, w3), in_dims[1:5]))
    hm, cm = materialize(hx, in_dims[5], B), materialize(cx, in_dims[6], B)   # [B, (1,) N, H]
    n = xm.shape[2]
    y, hy, cy = _lstm_layer(xm, w_ih.mT.unsqueeze(1), w_hh.mT, b_ih[:, None, None], b_hh[:, None],
                            hm.reshape(B, n, -1), cm.reshape(B, n, -1), reverse, keep)
    return y, hy.reshape(hm.shape), cy.reshape(cm.shape)


def mkldnn_rnn_layer_backward_rule(info, in_dims, x, w0, w1, w2, w3, hx, cx, output, hy, cy, grad_y, grad_hy, grad_cy,
                                   reverse, mode, hidden_size, num_layers, has_biases, train, bidirectional, batch_sizes,
                                   batch_first, workspace):
    """Exact decomposition: the layer recomputed per element, then backpropagation through time
    in batched ops (each element gets its own weight gradient)."""
    _check_mode(mode)
    B = info.batch_size
    keep: list = []
    _lstm_batched(info, in_dims, x, w0, w1, w2, w3, hx, cx, reverse, keep)
    xm = materialize(x, in_dims[0], B)
    hm, cm = materialize(hx, in_dims[5], B), materialize(cx, in_dims[6], B)
    n = xm.shape[2]
    grads = [None if g is None else materialize(g, d, B) for g, d in zip((grad_y, grad_hy, grad_cy), in_dims[10:13])]
    gy = grads[0]
    gh, gc = (None if g is None else g.reshape(B, n, -1) for g in grads[1:])
    w_ih, w_hh = materialize(w0, in_dims[1], B), materialize(w1, in_dims[2], B)
    gx, gw_ih, gw_hh, gb, ghx, gcx = _lstm_layer_backward(xm, w_ih, w_hh, keep, gy, gh, gc)
    gb_ih = gb if has_biases else torch.zeros_like(gb)
    return (gx, gw_ih, gw_hh, gb_ih, gb_ih, ghx.reshape(hm.shape), gcx.reshape(cm.shape)), (0, 0, 0, 0, 0, 0, 0)


def cudnn_rnn_rule(info, in_dims, *args, **kwargs):
    """nn.RNN/GRU/LSTM on CUDA: cuDNN's fused kernel, which takes the whole recurrence (and its
    weights flattened into one buffer) in one call. No rule batches it (torch.func has none
    either, and fails inside it), so it is refused by name rather than looped blind."""
    raise VmapError(
        "vmap: nn.RNN/nn.GRU/nn.LSTM on CUDA runs cuDNN's fused kernel (aten::_cudnn_rnn), which has no batching "
        "rule in this engine (torch.func has none either). Run the vmapped recurrent layer on CPU, where the "
        "engine batches it (mkldnn_rnn_layer), or loop over the batch on CUDA.")


# Tagged random for its dropout; refused whatever the dropout, with the reason above rather than
# as a random op.
cudnn_rnn_rule.deterministic_when = lambda args, kwargs: True  # type: ignore[attr-defined]
RULES[aten._cudnn_rnn.default] = cudnn_rnn_rule
RULES[aten.mkldnn_rnn_layer.default] = mkldnn_rnn_layer_rule
RULES[aten.mkldnn_rnn_layer_backward.default] = mkldnn_rnn_layer_backward_rule
