"""One module per dashboard page; each has `render(ctx) -> Page`. VIEWS is the build order."""
from __future__ import annotations

from dashboards.views import compare, coverage, history, memory, overview, peers, profiles, scaling
from dashboards.views import time_to_n

VIEWS = (overview, peers, scaling, memory, history, compare, coverage, profiles)
VIEWS += (time_to_n,)
