"""A stand-in for CUDA on a machine without a GPU: the dry run of `.ci/gpu-check --dry-run`.

With VMAPBENCH_CUDA_STANDIN=1 the device 'cuda' runs on the CPU, and the torch.cuda calls the
measuring code makes (synchronize, the caching allocator's peak statistics, the device's name and
properties) and NVML (`pynvml`) answer from this CPU process. Every CUDA path of the suite, the CLI
and the GPU command then runs end to end, and each call is counted (`CALLS`) so tests can check
that every timed call is synchronised and every peak reset per call. Like torch, the stand-in
refuses CUDA in a process forked after its parent used CUDA, `torch.cuda.is_available()` included
unless PYTORCH_NVML_BASED_CUDA_CHECK=1 (torch's check then asks NVML and leaves CUDA alone): asv's
fork server failing every CUDA point on a GPU fails the dry run too. It stands in for a CUDA build
of torch in one more way: a backward pass (the autograd engine's first run starts a thread per
device, counting devices through the CUDA driver) uses CUDA too, and a child forked after it can
run no backward pass ("autograd's threading in combination with fork").

Nothing it measures is a CUDA figure: the machine name it gives says 'dry-run'
(measuring.machine.machine_name) and the GPU command writes its results to a temporary folder.
"""
from __future__ import annotations

import os
import sys
import threading
import types
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from measuring import cuda_fork

ENV = cuda_fork.STANDIN_ENV
DEVICE_NAME = "CUDA stand-in (CPU dry run)"
MACHINE_SUFFIX = cuda_fork.STANDIN_MACHINE_SUFFIX
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
AUTOGRAD_FORK_ERROR = ("Unable to handle autograd's threading in combination with fork-based multiprocessing "
                       "(the CUDA stand-in: the parent ran a backward pass, which started autograd's device threads; "
                       "CUDA was first used there through {where})")
FORK_ERROR = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use "
              "the 'spawn' start method (the CUDA stand-in: this process was forked after its parent used CUDA, "
              "first through {where})")

CALLS: Counter[str] = Counter()
"""How many times each stand-in call ran in this process (synchronize, reset_peak_memory_stats, ...)."""

_lock = threading.Lock()
_installed = False
_used_in: int | None = None  # the pid of the process that used the stand-in first
_first_use = ""  # the call and the line that used it first (what a forked child's error names)
_bad_fork = False
_autograd_threads_in: int | None = None  # the pid whose backward pass started autograd's device threads
_peak_base = 0  # the allocator's 'allocated' figure when its peak was last reset


def requested() -> bool:
    """Whether the environment asks for the stand-in (VMAPBENCH_CUDA_STANDIN=1)."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes")


def active() -> bool:
    """Whether the stand-in is installed in this process."""
    return _installed


def _rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field} line; the CUDA stand-in needs Linux procfs")


def _use(what: str, poisons: bool = True) -> None:
    """Count a call; refuse it in a process forked after its parent used the stand-in (`poisons`:
    the call initializes CUDA, so a child forked after it cannot use CUDA)."""
    if _bad_fork:
        raise RuntimeError(FORK_ERROR.format(where=_first_use))
    with _lock:
        CALLS[what] += 1
        if poisons:
            _poison(what)


def _poison(what: str, what_for: str = "") -> None:
    global _used_in, _first_use
    if _used_in is None:
        import traceback

        _used_in = os.getpid()
        caller = next((f for f in reversed(traceback.extract_stack()[:-3])
                       if "cuda_standin" not in f.filename and "/torch/" not in f.filename), None)
        _first_use = (f"torch.cuda.{what}()" + (f" for {what_for}" if what_for else "")
                      + (f" at {caller.filename}:{caller.lineno}" if caller else ""))


def is_available() -> bool:
    """True; it poisons forks as torch's does (cudaGetDeviceCount) unless NVML answers instead."""
    with _lock:
        CALLS["is_available"] += 1
        if os.environ.get(NVML_CHECK_ENV) != "1":
            _poison("is_available")
    return True


def _after_fork_in_child() -> None:
    global _bad_fork
    if _used_in is not None:
        _bad_fork = True
    if _autograd_threads_in is not None:
        _variable()._execution_engine = _AutogradEngine(_torch_engine(), refuse=True)


class _AutogradEngine:
    """torch's autograd engine (`Variable._execution_engine`), as on a CUDA build: its first backward
    pass starts a worker thread per device, counting the devices through the CUDA driver (which
    initializes it), and every process forked afterwards can run no backward pass (`refuse`).

    It stands in only until that first pass, then puts torch's engine back: left in place, it would
    be user code inside every recording the engine makes, whose counting engine.purity would
    rightly find an effect."""

    def __init__(self, engine: Any, refuse: bool = False) -> None:
        self._engine = engine
        self._refuse = refuse

    def run_backward(self, *args: Any, **kwargs: Any) -> Any:
        global _autograd_threads_in
        if self._refuse:
            raise RuntimeError(AUTOGRAD_FORK_ERROR.format(where=_first_use))
        with _lock:
            if _autograd_threads_in is None:
                CALLS["autograd_device_threads"] += 1
                _poison("device_count", what_for="autograd's device threads (a backward pass)")
                _autograd_threads_in = os.getpid()
        if _variable()._execution_engine is self:
            _variable()._execution_engine = self._engine
        return self._engine.run_backward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def _variable() -> Any:
    from torch.autograd.variable import Variable

    return Variable


def _torch_engine() -> Any:
    engine = _variable()._execution_engine
    return engine._engine if isinstance(engine, _AutogradEngine) else engine


def synchronize(device: Any = None) -> None:
    _use("synchronize")


def reset_peak_memory_stats(device: Any = None) -> None:
    """The peak restarts from what is in use now (the process's resident set stands in for the
    allocator: the kernel's high-water mark is reset through /proc/self/clear_refs). Memory malloc
    keeps in its free lists is handed back first: a block reused from there would not grow the
    resident set, and the call's allocation would go unseen."""
    global _peak_base
    _use("reset_peak_memory_stats")
    from measuring.memory import reset_peak_rss, release_free_heap

    release_free_heap()
    reset_peak_rss()
    _peak_base = _rss_bytes("VmRSS")


def memory_allocated(device: Any = None) -> int:
    _use("memory_allocated")
    return _rss_bytes("VmRSS")


def max_memory_allocated(device: Any = None) -> int:
    _use("max_memory_allocated")
    return max(_rss_bytes("VmHWM"), _peak_base)


def get_device_name(device: Any = None) -> str:
    _use("get_device_name")
    return DEVICE_NAME


def get_device_properties(device: Any = None) -> Any:
    _use("get_device_properties")
    total = _rss_bytes("VmRSS")
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return types.SimpleNamespace(name=DEVICE_NAME, total_memory=total, uuid=None, major=0, minor=0,
                                 multi_processor_count=os.cpu_count() or 1)


_TORCH_CUDA = {
    "is_available": is_available,
    "device_count": lambda: 1,
    "current_device": lambda: 0,
    "synchronize": synchronize,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "memory_allocated": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "max_memory_reserved": max_memory_allocated,
    "memory_reserved": memory_allocated,
    "empty_cache": lambda: None,
    "get_device_name": get_device_name,
    "get_device_properties": get_device_properties,
}


class NVMLError(Exception):
    """pynvml's error class, for code that catches it."""


def _nvml_module() -> types.ModuleType:
    """NVML as `pynvml` exposes it, answering for one device: this process's resident set as the
    memory in use, utilization 0 (a CPU run keeps no GPU busy)."""
    nvml = types.ModuleType("pynvml")
    nvml.__doc__ = "The CUDA stand-in's NVML (workloads.cuda_standin): not a GPU's figures."
    nvml.NVMLError = NVMLError

    def memory_info(handle: Any) -> Any:
        _use("nvml_memory_info")
        used = _rss_bytes("VmRSS")
        total = get_device_properties().total_memory
        return types.SimpleNamespace(used=used, total=total, free=max(0, total - used))

    def init() -> None:
        _use("nvml_init")

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda index: ("standin", index)
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: ("standin", uuid)
    nvml.nvmlDeviceGetMemoryInfo = memory_info
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=0, memory=0)
    nvml.nvmlDeviceGetName = lambda handle: DEVICE_NAME
    nvml.nvmlSystemGetDriverVersion = lambda: "stand-in"
    return nvml


def install() -> None:
    """Replace torch.cuda's measuring calls and pynvml by the stand-in, in this process and (through
    VMAPBENCH_CUDA_STANDIN, which it sets) in every process it starts. Idempotent."""
    global _installed
    if _installed:
        return
    os.environ[ENV] = "1"
    for target, name, value in patches():
        if isinstance(target, dict):
            target[name] = value
        else:
            setattr(target, name, value)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _installed = True


def patches() -> list[tuple[Any, str, Any]]:
    """(object or dict, name, stand-in) for everything `install` replaces: a test applies them with
    pytest's monkeypatch, which undoes them after it."""
    engine = _variable()._execution_engine
    if not isinstance(engine, _AutogradEngine) and _autograd_threads_in is None:
        engine = _AutogradEngine(engine)
    return [*((torch.cuda, name, fn) for name, fn in _TORCH_CUDA.items()), (sys.modules, "pynvml", _nvml_module()),
            (_variable(), "_execution_engine", engine), (sys.modules[__name__], "_installed", True),
            (cuda_fork, "STANDIN", sys.modules[__name__])]  # measuring/ sees the stand-in through this


def install_if_requested() -> bool:
    """`install()` when VMAPBENCH_CUDA_STANDIN asks for it; whether the stand-in is active."""
    if requested():
        install()
    return _installed


def tensor_device(device: str | torch.device) -> torch.device:
    """Where tensors of `device` live: the CPU for 'cuda' under the stand-in, else `device`."""
    dev = torch.device(device)
    if _installed and dev.type == "cuda":
        if _bad_fork:  # the driver refuses a process forked after its parent initialized it
            raise RuntimeError(FORK_ERROR.format(where=_first_use))
        return torch.device("cpu")
    return dev
