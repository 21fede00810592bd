"""The size a workload is measured at where one size is measured: its first quick size, else the
first (smallest) of its grid. The gate, the peer ratios, time to N and the suite's instruction
counts all measure there, so their figures for one workload describe the same case."""
from __future__ import annotations

from typing import Any


def default_size(workload: Any) -> str:
    """`workload.quick[0]`, else `workload.sizes[0]` (any object with those two sequences)."""
    return (tuple(workload.quick) or tuple(workload.sizes))[0]
