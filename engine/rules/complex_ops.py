"""complex(real, imag) and polar(abs, angle): elementwise constructors of complex tensors that the
`pointwise` tag does not cover, batched by the pointwise family's rule."""
from __future__ import annotations

from engine.rules._helpers import ops_of
from engine.rules._table import RULES
from engine.rules.pointwise import pointwise_rule

for _op in ops_of("complex.default", "polar.default"):
    RULES[_op] = pointwise_rule(_op)
