"""The offline Plotly dashboard of vmapbench's ASV results.

`load_results(dir)` reads ASV results into one tidy pandas DataFrame; `build_dashboard(results,
out)` writes a self-contained HTML folder (one page per view, plotly.js shipped once) that opens
from file:// with no network. `vmapbench dashboard` and `vmapbench export` are the command lines.
Names are imported on first use, so `vmapbench export` does not load plotly.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BuildResult": "dashboards.builder", "build_dashboard": "dashboards.builder",
    "CorruptResultWarning": "dashboards.loader", "ResultSet": "dashboards.loader",
    "load_frame": "dashboards.loader", "load_results": "dashboards.loader",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dashboards' has no attribute {name!r}")
