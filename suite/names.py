"""The names the asv suite gives workloads, from a workload's name alone: no torch, no registry
(the regression gate's own process names the signals of its probes' outputs with them)."""
from __future__ import annotations

import re


def class_name_of(workload: str) -> str:
    """The ASV class name of workload `workload`: its name made a Python identifier (asv names are dotted)."""
    name = re.sub(r"\W", "_", workload)
    if not name or name[0].isdigit() or name.startswith("_"):
        name = "w_" + name.lstrip("_")
    return name
