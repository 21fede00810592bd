"""A call's memory: each function takes a zero-argument callable (the measured call).

- `alloc_peak_bytes(fn)`: the call's memory on CPU: the peak of bytes that torch's CPU allocator
  handed out during the call and that were live at once, read from the profiler's allocation
  events (every tensor storage: eager ops, compiled programs' buffers, peers built on torch).
  Exact and the same in every process for the same call.
- `cuda_peak_bytes(fn, device)`: the same on CUDA: the caching allocator's peak during the call
  (reset before it), above what was allocated before it.
- `peak_bytes(fn, device)`: whichever of the two fits the device: THE per-call memory figure.
- `rss_delta_bytes(fn)`: a secondary, process-level figure: how far the resident set rose during
  the call (pages, not tensors: allocator reuse makes it 0 or noise for small calls).
- `xla_memory(call)`: the `jax` method's memory, from XLA's compiled memory analysis;
  `method_peak_bytes(call, method, device)` picks it for jax and `peak_bytes` for the rest.

It imports nothing of the project, so the regression gate plants memory into a measured commit's
workloads with its own checkout's copy (vmapbench.gate.plant_memory), and measures every commit
with it (vmapbench/gate_probe.py).
"""
from __future__ import annotations

import ctypes
import gc
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{_STATUS} has no {field} line; RSS measurement needs Linux procfs")


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark to the current RSS (Linux >= 4.0). False if denied."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def release_free_heap() -> None:
    """Hand memory that glibc keeps in its free lists back to the OS (no-op off glibc).

    Without this, a call that reuses blocks freed by an earlier call shows no RSS growth at all.
    """
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None


def rss_delta_bytes(fn: Callable[[], Any]) -> int:
    """Peak resident-set growth (bytes) while `fn` runs, relative to the RSS just before it.

    Uses the kernel's high-water mark (VmHWM), reset first through /proc/self/clear_refs so the
    figure covers temporaries freed before `fn` returns; the C heap's free lists are trimmed first
    so reused blocks are counted too. Where the reset is not permitted, the figure only counts
    growth beyond the process's earlier peak (a lower bound, often 0).
    """
    if not _STATUS.exists():
        raise RuntimeError("rss_delta_bytes needs /proc/self/status (Linux); it is not available here")
    release_free_heap()
    if reset_peak_rss():
        before = _status_kib("VmRSS")
    else:
        before = _status_kib("VmHWM")
    fn()
    peak = _status_kib("VmHWM")
    return max(0, peak - before) * 1024


def cuda_peak_bytes(fn: Callable[[], Any], device: str | torch.device = "cuda") -> int:
    """Peak CUDA memory allocated by PyTorch while `fn` runs, above what was allocated before."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_peak_bytes needs a CUDA device; torch.cuda.is_available() is False")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - before)


# Lines the profiler writes to stderr on its own (kineto's start/stop trace lines, and the CPU
# allocator's note that a block from before the profiling was freed), dropped from what the
# measured call wrote there.
_PROFILER_NOISE = ("USDT:", "Memory block of unknown size was allocated before the profiling started")


@contextmanager
def _profiler_stderr() -> Iterator[None]:
    """File descriptor 2 captured for the block, then written back without the profiler's own lines."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                    if not any(noise in line for noise in _PROFILER_NOISE)]
            if kept:
                sys.stderr.write("".join(kept))


def _walk(nodes: Any) -> Iterator[Any]:
    stack = list(reversed(nodes))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def alloc_peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes of torch CPU allocations made during `fn` and live at once (0: it allocated none).

    The allocations come from torch's profiler (`profile_memory=True`): every block torch's CPU
    allocator hands out or takes back while the profiler runs, on the calling thread and the
    threads it propagates to (autograd's). Blocks allocated before the call and freed during it do
    not lower the figure (they are not the call's memory); memory a library allocates past torch's
    allocator (oneDNN's scratch space, BLAS workspaces, JAX) is not counted. The garbage collector
    does not run during the call, so tensors in reference cycles count the same each time: the
    call's own stay until it returns, and what earlier calls left is older than the call, whose
    figure it neither raises nor lowers (a full collection before each call would walk every
    object of the process, the imported libraries' included, for nothing).
    """
    # torch.autograd.profiler's kineto profiler, the one torch.profiler.profile wraps: the wrapper's
    # start asks hasattr(torch, "_inductor"), which imports inductor and dynamo into a process that
    # never compiles (seconds in a fresh one).
    from torch.autograd.profiler import profile

    with _profiler_stderr():
        with profile(use_kineto=True, profile_memory=True, record_shapes=False) as prof:
            gc.disable()  # no collection inside the call: when one falls would move the peak
            try:
                fn()
            finally:
                gc.enable()
        tree = prof.kineto_results.experimental_event_tree()
    events = sorted((node.start_time_ns, i, node.extra_fields) for i, node in enumerate(_walk(tree))
                    if type(node.extra_fields).__name__ == "_ExtraFields_Allocation"
                    and node.extra_fields.device.type == "cpu")
    live: dict[int, int] = {}
    total = peak = 0
    for _, _, alloc in events:
        if alloc.alloc_size > 0:
            live[alloc.ptr] = alloc.alloc_size
            total += alloc.alloc_size
            peak = max(peak, total)
        elif alloc.ptr in live:  # a block of this call freed (others were allocated before it)
            total -= live.pop(alloc.ptr)
    return peak


def peak_bytes(fn: Callable[[], Any], device: str | torch.device = "cpu") -> int:
    """The call's memory: `cuda_peak_bytes` on a CUDA device, `alloc_peak_bytes` on CPU (both count
    tensor bytes at the allocator; see the module docstring)."""
    cuda = device is not None and torch.device(device).type == "cuda"
    return cuda_peak_bytes(fn, device) if cuda else alloc_peak_bytes(fn)


def method_peak_bytes(call: Callable[[], Any], method: str, device: str | torch.device = "cpu") -> int:
    """A method's memory per call, as every table shows it: XLA's total (`xla_memory`) for the jax
    method, which allocates past torch, else `peak_bytes`. Measure a warmed-up call: a method's first
    calls (traces, compiles, caches) allocate what its steady calls do not."""
    return xla_memory(call)["total"] if method == "jax" else peak_bytes(call, device)


def xla_memory(call: Callable[[], Any]) -> dict[str, int]:
    """The `jax` method's memory as XLA's compiled memory analysis gives it, in bytes: temp (the
    program's temporaries), output, argument, alias (outputs sharing an argument's buffer) and
    total (temp + output + argument - alias). `call` is the method's measured call
    (workloads.peers.jax_methods.compiled); ValueError for a call that is no jitted JAX program."""
    analysis = getattr(call, "xla_memory", None)
    if analysis is None:
        raise ValueError(f"{call!r} is not a jitted JAX call (workloads.peers.jax_methods.compiled): "
                         f"XLA's memory analysis exists only for the jax method")
    return analysis()
