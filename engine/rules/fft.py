"""FFT family: the three aten FFT primitives every torch.fft function lowers to take a dim list,
so batching is shifting those dims past the batch dim (one call instead of the loop)."""
from __future__ import annotations

import torch

from engine.rules._helpers import lrank, norm_dim
from engine.rules._table import RULES

aten = torch.ops.aten


def _shift(x, d, dims):
    rank = lrank(x, d)
    return [norm_dim(i, rank) + 1 for i in dims]


def fft_c2c_rule(info, in_dims, x, dim, normalization, forward):
    return aten._fft_c2c.default(x, _shift(x, in_dims[0], dim), normalization, forward), 0


def fft_r2c_rule(info, in_dims, x, dim, normalization, onesided):
    return aten._fft_r2c.default(x, _shift(x, in_dims[0], dim), normalization, onesided), 0


def fft_c2r_rule(info, in_dims, x, dim, normalization, last_dim_size):
    return aten._fft_c2r.default(x, _shift(x, in_dims[0], dim), normalization, last_dim_size), 0


RULES[aten._fft_c2c.default] = fft_c2c_rule
RULES[aten._fft_r2c.default] = fft_r2c_rule
RULES[aten._fft_c2r.default] = fft_c2r_rule
