"""complex(real, imag) and polar(abs, angle): elementwise constructors of complex tensors that the
`pointwise` tag does not cover, batched by the pointwise family's rule; and the conjugate/negative
views, made physical (see below)."""
from __future__ import annotations

import torch

from engine._view_copies import note_copy
from engine.rules._helpers import ops_of
from engine.rules._table import RULES
from engine.rules.pointwise import pointwise_rule

aten = torch.ops.aten

for _op in ops_of("complex.default", "polar.default"):
    RULES[_op] = pointwise_rule(_op)


# Conjugate and negative *views* (the conj/neg bits): rules run inside __torch_dispatch__, below
# PyTorch's Conjugate and Negative keys, so a physical kernel there reads a bit-carrying tensor's
# raw memory as if the bit were not set (a silently wrong result: `t.conj() + 1` added to t, and
# `fft.hfftn`, which takes a conj view, came out wrong). A batched tensor's physical tensor
# therefore never carries the bits: the view is made physical here (a copy; torch.func returns a
# view) and engine._batched.enter resolves the bits of a vmap input. Read out of place the copy is
# the view; an in-place write into it, or into its base while it lives, would tell them apart
# silently, so the copy is recorded and such writes refused (engine._view_copies).


def _conj_rule(info, in_dims, x):
    out = torch.conj_physical(x)
    note_copy(out, x, "conj()")
    return out, 0


def _neg_view_rule(info, in_dims, x):
    out = torch.neg(x)
    note_copy(out, x, "_neg_view()")
    return out, 0


RULES[aten._conj.default] = _conj_rule
RULES[aten._neg_view.default] = _neg_view_rule
