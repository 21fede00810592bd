"""Whether a process forked from this one can still use CUDA.

asv's fork server imports the suite once and forks a process per benchmark. The CUDA driver does
not survive a fork: once it is initialized in the parent, a child's first CUDA call fails with
"CUDA error: initialization error". torch initializes it in more places than its own
`torch.cuda` calls, and then without marking the child ("Cannot re-initialize CUDA in forked
subprocess" needs torch's own initialization): on a CUDA build, the autograd engine's first
backward pass counts the devices through the driver to start a worker thread per device. So a
fork-server parent must run no backward pass, and `hazard` says, after the fact, whether one did.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any

CUDA_ERROR_NOT_INITIALIZED = 3
DRIVER_LIBRARY = "libcuda.so.1"


STANDIN_ENV = "VMAPBENCH_CUDA_STANDIN"  # workloads.cuda_standin.ENV: asks every process for the stand-in
STANDIN_MACHINE_SUFFIX = "cuda-standin-dry-run"  # what a machine's name ends in under it
STANDIN: Any = None
"""The CUDA stand-in (workloads.cuda_standin), which sets itself here when it is installed:
measuring/ imports no package above it (docs/design/architecture.md)."""


def standin() -> Any:
    """The CUDA stand-in where it is installed in this process, else None."""
    return STANDIN if STANDIN is not None and STANDIN.active() else None


def standin_requested() -> bool:
    """Whether the stand-in is installed here or the environment asks for it (importing workloads
    installs it then)."""
    return standin() is not None or os.environ.get(STANDIN_ENV, "").strip().lower() in ("1", "true", "yes")


def cuda_built() -> bool:
    """Whether this torch has CUDA (or ROCm), or the CUDA stand-in plays one: then a backward pass
    initializes the driver."""
    import torch

    return standin() is not None or torch.backends.cuda.is_built()


def driver_initialized() -> bool | None:
    """Whether the CUDA driver is initialized in this process, without initializing it: a driver
    call made before `cuInit` answers CUDA_ERROR_NOT_INITIALIZED. False where the driver library
    is not loaded into this process (or not installed); None where it cannot be asked (no
    RTLD_NOLOAD: not a POSIX system)."""
    if not hasattr(os, "RTLD_NOLOAD"):
        return None
    try:
        driver = ctypes.CDLL(DRIVER_LIBRARY, mode=os.RTLD_NOLOAD)
    except OSError:  # not loaded into this process: nothing initialized it
        return False
    count = ctypes.c_int(0)
    return driver.cuDeviceGetCount(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED


def hazard() -> str | None:
    """Why a child forked from this process now could not use CUDA, or None."""
    installed = standin()
    if installed is not None:
        used = getattr(installed, "_first_use", "")
        return f"the CUDA stand-in was used here first through {used}" if used else None
    import torch

    if torch.cuda.is_initialized():
        return "torch initialized CUDA in this process"
    if driver_initialized():
        return ("the CUDA driver is initialized in this process (on a CUDA build of torch, a backward "
                "pass does that: the autograd engine counts the devices to start its device threads)")
    return None
