"""The reference the per-op conformance tests compare engine.vmap with: a Python loop over the
batch, results stacked (imported by tests/test_conformance_ops.py and tests/test_dynamic_shape_ops.py;
not a test module itself)."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

import engine


def loop(fn: Callable, in_dims: tuple, *args: Any, clone: bool = False) -> list[torch.Tensor]:
    """fn on each element, its outputs' leaves stacked. `clone`: each element as a tensor of its
    own (for ops whose output depends on the element's memory, such as nonzero's order)."""
    B = next(a.shape[d] for a, d in zip(args, in_dims) if d is not None)

    def element(a: Any, d: int | None, i: int) -> Any:
        if d is None:
            return a
        return a.select(d, i).clone() if clone else a.select(d, i)

    outs = [fn(*[element(a, d, i) for a, d in zip(args, in_dims)]) for i in range(B)]
    leaves = [tree_flatten(o)[0] for o in outs]
    return [torch.stack([lv[j] for lv in leaves]) for j in range(len(leaves[0]))]


def check(fn: Callable, in_dims: tuple, *args: Any, exact: bool = True, clone: bool = False) -> None:
    """engine.vmap(fn) equals `loop` (bit for bit when `exact`, NaNs where the loop has them) and
    records no fallback."""
    with engine.fallback_policy("silent"), engine.record_fallbacks() as rec:
        got = tree_flatten(engine.vmap(fn, in_dims=in_dims)(*args))[0]
    assert not rec.counts, f"fell back: {dict(rec.counts)}"
    want = loop(fn, in_dims, *args, clone=clone)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        torch.testing.assert_close(g, w, equal_nan=True, **({"atol": 0, "rtol": 0} if exact else {}))
