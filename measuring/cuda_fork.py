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


def _standin() -> Any:
    """workloads.cuda_standin where it is installed in this process, else None (also at a commit
    from before it: the suite measures older commits with this checkout's measuring/)."""
    try:
        from workloads import cuda_standin
    except ImportError:
        return None
    return cuda_standin if cuda_standin.active() else None


def cuda_built() -> bool:
    """Whether this torch has CUDA (or ROCm), or the CUDA stand-in plays one: then a backward pass
    initializes the driver."""
    import torch

    return _standin() is not None or torch.backends.cuda.is_built()


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
    standin = _standin()
    if standin is not None:
        used = getattr(standin, "_first_use", "")
        return f"the CUDA stand-in was used here first through {used}" if used else None
    import torch

    if torch.cuda.is_initialized():
        return "torch initialized CUDA in this process"
    if driver_initialized():
        return ("the CUDA driver is initialized in this process (on a CUDA build of torch, a backward "
                "pass does that: the autograd engine counts the devices to start its device threads)")
    return None
