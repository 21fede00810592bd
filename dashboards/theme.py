"""What every view agrees on: method colors and labels, metric direction, value formatting.

One color per method across all views, so 'engine' is the same blue in the overview, the scaling
plots and the history.
"""
from __future__ import annotations

import math
import re
from typing import Any

from workloads.base import BASELINE, METHODS, REFERENCE

METHOD_COLORS: dict[str, str] = {
    "loop": "#7f7f7f",
    "engine": "#1f77b4",
    "engine_eager": "#aec7e8",
    "engine_traced": "#17becf",
    "engine_compiled": "#0b3d91",
    "torch_func": "#ff7f0e",
    "torch_func_compiled": "#d62728",
    "loop_compiled": "#bcbd22",
    "functional_vectorize": "#9467bd",
    "closed_form": "#2ca02c",
    # Peers (#17): one hue family each, so a tool's modes read as related.
    "engine_chunked": "#6baed6",
    "jax": "#e377c2",
    "opacus_hooks": "#8c564b",
    "opacus_ew": "#c49c94",
    "opacus_functorch": "#5a3a2e",
    "backpack": "#bcbd22",
}
METHOD_LABELS: dict[str, str] = {
    "loop": "for-loop",
    "engine": "engine",
    "engine_eager": "engine (eager)",
    "engine_traced": "engine (traced)",
    "engine_compiled": "engine (compiled)",
    "torch_func": "torch.func",
    "torch_func_compiled": "torch.func (compiled)",
    "loop_compiled": "loop (compiled)",
    "functional_vectorize": "autograd.functional (vectorize)",
    "closed_form": "closed form",
    "engine_chunked": "engine (chunked)",
    "jax": "JAX (jit)",
    "opacus_hooks": "Opacus (hooks)",
    "opacus_ew": "Opacus (ew)",
    "opacus_functorch": "Opacus (functorch)",
    "backpack": "BackPACK",
}
# Methods that are the limit a workload can reach: a closed form or hand-vectorized code. The
# "distance to the limit" table divides every method's time by the first of these present.
LIMIT_METHODS: tuple[str, ...] = ("closed_form",)
_EXTRA_COLORS = ["#393b79", "#637939", "#843c39", "#7b4173", "#3182bd", "#e6550d"]
STATUS_COLORS = {"native": "#2ca02c", "fallback": "#ff7f0e", "error": "#d62728",
                 "mismatch": "#9467bd", "skip": "#c7c7c7"}
BASELINE_METHOD = BASELINE
REFERENCE_METHOD = REFERENCE


def method_order(methods: Any) -> list[str]:
    """Methods in the registry's table order, then the known peers in METHOD_COLORS' order, then
    any other method found in the results, alphabetically (never dropped)."""
    present = {str(m) for m in methods if m is not None and m == m}
    known = list(dict.fromkeys([*METHODS, *METHOD_COLORS]))
    return [m for m in known if m in present] + sorted(present - set(known))


def natural_key(text: Any) -> tuple:
    """Sort key that orders 'n=250' before 'n=1000' (numbers compare as numbers)."""
    parts = re.split(r"(\d+(?:\.\d+)?)", str(text))
    return tuple((0, float(p)) if i % 2 else (1, p) for i, p in enumerate(parts) if p)


def method_color(method: str) -> str:
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    return _EXTRA_COLORS[sum(map(ord, method)) % len(_EXTRA_COLORS)]


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


_SCALES = {"seconds": ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")),
           "bytes": ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))}


def format_value(value: Any, unit: str | None) -> str:
    """A short human reading of one measurement in its unit (seconds, bytes, or a plain number)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    v = float(value)
    scales = _SCALES.get(unit or "")
    if scales:
        # The largest unit in which the rounded reading is >= 1: `0.9996e-3` seconds shows as
        # '1 ms', not '1e+03 µs', and 2**30 bytes '1 GiB', not '1.02e+03 MiB' (rounding v itself to 3 digits
        # would drop it below 2**30).
        for scale, suffix in scales:
            reading = float(f"{v / scale:.3g}")
            if abs(reading) >= 1 or scale == scales[-1][0]:
                return f"{reading:g} {suffix}"
    if unit in ("x", "ratio"):
        return f"{float(f'{v:.3g}'):g}×"  # as assets/dashboard.js writes it: 4840×, not 4.84e+03×
    text = f"{v:.3g}"
    return f"{text} {unit}" if unit and unit != "unit" else text
