"""3-D grid sampling and anti-aliased upsampling: both take [N, C, *spatial] inputs (and a grid with
the same N), so the batch folds into N, as for pooling (engine.rules.nn._fold_into_n)."""
from __future__ import annotations

from engine.rules._helpers import ops_of
from engine.rules._table import RULES
from engine.rules.nn import _fold_into_n

for _name, _spatial in (("grid_sampler_3d.default", 3), ("grid_sampler_3d_backward.default", 3),
                        ("_upsample_bilinear2d_aa.default", 2), ("_upsample_bicubic2d_aa.default", 2)):
    for _op in ops_of(_name):
        RULES[_op] = _fold_into_n(_op, _spatial)
