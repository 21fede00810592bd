"""One module per dashboard page; each has `render(ctx) -> Page`. VIEWS is the build order."""
from __future__ import annotations

from dashboards.views import compare, compilers, coverage, devices, history, memory, overview, peers, profiles, scaling, time_to_n, torch_versions

VIEWS = (overview, peers, scaling, memory, time_to_n, devices, history, compare, coverage, compilers, torch_versions, profiles)
