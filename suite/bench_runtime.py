"""What every result of a run was measured under: torch's thread counts and the profile's devices.

Threads are pinned from OMP_NUM_THREADS (default 2) in every benchmark process (probes.pin_threads);
recording them next to the timings makes a result from a machine or run with other settings
recognizable on the dashboard instead of silently incomparable.
"""
from __future__ import annotations

import torch

from . import probes
from .selection import SUITE_VERSION


def track_torch_num_threads() -> int:
    probes.pin_threads()
    return torch.get_num_threads()


track_torch_num_threads.version = SUITE_VERSION  # type: ignore[attr-defined]
track_torch_num_threads.unit = "threads"  # type: ignore[attr-defined]


def track_torch_interop_threads() -> int:
    probes.pin_threads()
    return torch.get_num_interop_threads()


track_torch_interop_threads.version = SUITE_VERSION  # type: ignore[attr-defined]
track_torch_interop_threads.unit = "threads"  # type: ignore[attr-defined]


def track_cuda_device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


track_cuda_device_count.version = SUITE_VERSION  # type: ignore[attr-defined]
track_cuda_device_count.unit = "devices"  # type: ignore[attr-defined]
