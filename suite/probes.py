"""Measurements the ASV suite needs beyond measuring.memory: threads, ratios, NVML, fallbacks.

- `pin_threads`: torch's intra-op thread count from OMP_NUM_THREADS (default 2), set in every
  benchmark process so timings from machines and runs are comparable; bench_runtime records it.
- `interleaved_seconds`: per-call medians of several callables timed in one process, alternating
  between them round by round. Ratios of these medians are the stable figures on a noisy machine:
  a slow phase of the machine slows every method alike instead of whichever ran at that moment.
  `interleaved_samples` gives every round's figures, for ratios taken round by round.
- `nvml_peak_bytes`: device memory in use (as nvidia-smi reports it: all allocations, the CUDA
  context and PyTorch's cached blocks) sampled by a thread while a call runs; its maximum.
- `fallback_count`: how many times the engine fell back to a per-example loop during a call.
- `torch_fallback_count`: the same for torch.func (torch's vmap fallback warnings).
- `fresh_inductor_cache`: an empty TorchInductor cache for the duration of a block, so a compile
  time is the cold one a user pays, not a cache lookup.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from measuring import cuda_fork, stats, timer

THREADS_ENV = "OMP_NUM_THREADS"
DEFAULT_THREADS = 2

try:  # asv_runner is installed wherever asv runs benchmarks; the fallback keeps this importable.
    from asv_runner.benchmarks.mark import SkipNotImplemented
except ImportError:  # pragma: no cover - only outside an asv environment
    class SkipNotImplemented(NotImplementedError):  # type: ignore[no-redef]
        """Raised inside a benchmark body to mark it skipped (asv's class when asv is present)."""


def requested_threads() -> int:
    raw = os.environ.get(THREADS_ENV, str(DEFAULT_THREADS)).strip()
    try:
        threads = int(raw)
    except ValueError:
        raise ValueError(f"{THREADS_ENV}={raw!r} is not an integer; set it to a thread count such as 2") from None
    if threads < 1:
        raise ValueError(f"{THREADS_ENV}={threads} must be at least 1")
    return threads


def pin_threads() -> int:
    """Set torch's intra-op threads from OMP_NUM_THREADS (default 2) and return the count."""
    threads = requested_threads()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


# What an engine method needs from the engine package. At a commit without it the method is skipped
# (asv: n/a), which keeps a backfill over old commits meaningful.
ENGINE_API: dict[str, str] = {"engine": "vmap", "engine_eager": "auto_tracing", "engine_traced": "trace", "engine_compiled": "compile"}


def require_method(method: str) -> None:
    """NotImplementedError (asv: skipped) when `method` needs an engine API this commit lacks, or a
    peer package (Opacus, BackPACK, jax) this environment lacks."""
    try:
        from workloads.peers import check_available
    except ImportError:  # a commit from before the peers: it has no peer methods either
        pass
    else:
        check_available(method)
    attr = ENGINE_API.get(method)
    if attr is None:
        return
    try:
        import engine
    except ImportError as exc:
        raise NotImplementedError(f"{method}: the engine does not import at this commit: {exc}") from None
    if not hasattr(engine, attr):
        raise NotImplementedError(f"{method} needs engine.{attr}, which this commit does not have")


def check_case(workload: Any, size: str, method: str, device: str) -> None:
    """Pin threads; skip cases outside the active profile or methods the installed engine or peers
    lack (NotImplementedError: asv reports a skip)."""
    from . import selection

    pin_threads()
    reason = selection.outside_profile(workload, size, device, method)
    if reason is not None:
        raise NotImplementedError(reason)
    require_method(method)


def setup_case(workload: Any, size: str, method: str, device: str) -> Any:
    """Common setup of a generated benchmark: `check_case`, then build the state."""
    check_case(workload, size, method, device)
    check_fork(device)
    return workload.setup(workload.params(size), device)


def peer_unavailable() -> type[BaseException]:
    """workloads.peers' skip class (a NotImplementedError); a class nothing raises at a commit
    from before it."""
    try:
        from workloads.peers import PeerUnavailable
    except ImportError:
        class Never(Exception):
            pass
        return Never
    return PeerUnavailable


def first_call(workload: Any, method: str, state: Any) -> float:
    """Workload.prepare (seconds), where NotImplementedError means the method broke, not a skip,
    unless it is a peer's PeerUnavailable (its package missing, or jax unable to run here): a skip.

    asv treats NotImplementedError from setup as "skipped"; torch raises it for ops a backend
    lacks, which is a failure of the method and must show up as one.
    """
    try:
        return workload.prepare(method, state)
    except peer_unavailable():
        raise
    except NotImplementedError as exc:
        raise RuntimeError(f"{workload.name} {method}: the first call raised NotImplementedError: {exc}") from exc


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_samples(
    calls: Mapping[str, Callable[[], Any]],
    device: str = "cpu",
    rounds: int = 9,
    min_batch_s: float = 0.02,
    budget_s: float = 3.0,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per call of each callable in every round, measured alternately (lists aligned by
    round, so a ratio of two callables can be taken round by round: the calls of one round ran
    moments apart). The timing is measuring.timer's.

    Each callable is first called once (warm-up, and a first estimate of its cost); then every
    round times a batch of calls of each one (batches last at least `min_batch_s`), in forward
    order on even rounds and reverse order on odd ones, the device synchronised before and after
    each batch. The number of rounds shrinks to fit `budget_s`, but never below 3. `clock` is wall
    time by default; the regression gate passes time.process_time (CPU seconds of this process),
    which a machine busy with other processes does not inflate.
    """
    if not calls:
        raise ValueError("interleaved_samples needs at least one callable")
    estimate = timer.single_calls(calls, clock=clock, device=device, drain_each=True)
    batches = {name: timer.batch_for(t, min_batch_s, 100_000) for name, t in estimate.items()}
    round_cost = sum(batches[name].calls * estimate[name] for name in calls)
    rounds = max(3, min(rounds, int(budget_s / round_cost)))
    return timer.rounds(calls, rounds, batches=batches, clock=clock, device=device, alternate=True, drain_each=True)


def interleaved_seconds(calls: Mapping[str, Callable[[], Any]], device: str = "cpu",
                        **options: Any) -> dict[str, float]:
    """Median seconds per call of each callable, measured alternately in rounds: `interleaved_samples`
    with the same options (rounds, min_batch_s, budget_s, clock)."""
    samples = interleaved_samples(calls, device, **options)
    return {name: stats.median(values) for name, values in samples.items()}


def nvml_peak_bytes(fn: Callable[[], Any], device: str, interval_s: float = 0.0005) -> int:
    """Peak device memory in use while `fn` runs, sampled through NVML (nvidia-ml-py).

    Raises SkipNotImplemented (asv: skipped) when nvidia-ml-py or an NVIDIA driver is missing.
    """
    try:
        import pynvml
    except ImportError:
        raise SkipNotImplemented("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise SkipNotImplemented(f"NVML is not available on this machine: {exc}") from None
    try:
        handle = _nvml_handle(pynvml, torch.device(device))
        peak = pynvml.nvmlDeviceGetMemoryInfo(handle).used
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, pynvml.nvmlDeviceGetMemoryInfo(handle).used)
                time.sleep(interval_s)

        sampler = threading.Thread(target=sample, name="nvml-sampler", daemon=True)
        synchronize(device)
        sampler.start()
        try:
            fn()
            synchronize(device)
        finally:
            stop.set()
            sampler.join()
        return int(max(peak, pynvml.nvmlDeviceGetMemoryInfo(handle).used))
    finally:
        pynvml.nvmlShutdown()


def _nvml_handle(pynvml: Any, device: torch.device) -> Any:
    """The NVML handle of a torch CUDA device (by UUID: CUDA and NVML may number GPUs differently)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
        except pynvml.NVMLError:
            pass  # MIG slices and old drivers: fall back to the index
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def fallback_count(fn: Callable[[], Any]) -> int:
    """Engine fallback calls (all ops together) while `fn` runs, via engine.record_fallbacks()."""
    try:
        import engine
    except ImportError as exc:
        raise SkipNotImplemented(f"the engine does not import at this commit: {exc}") from None
    record = getattr(engine, "record_fallbacks", None)
    if record is None:
        raise SkipNotImplemented("engine.record_fallbacks() does not exist at this commit")
    with record() as recorded:
        fn()
    return int(sum(recorded.counts.values()))


# The start of the warning torch's vmap gives where an op has no batching rule and it loops over
# the batch instead (aten/src/ATen/functorch/BatchedFallback.cpp).
TORCH_FALLBACK_TEXT = "There is a performance drop because we have not yet implemented the batching rule"


def torch_fallback_count(fn: Callable[[], Any]) -> int:
    """torch.func's fallback calls while `fn` runs: torch's vmap fallback warnings, which torch only
    gives while `_debug_only_display_vmap_fallback_warnings` is on (one per op call)."""
    import warnings

    display = torch._C._debug_only_display_vmap_fallback_warnings
    was_on = torch._C._debug_only_are_vmap_fallback_warnings_enabled()
    display(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        display(was_on)
    return sum(TORCH_FALLBACK_TEXT in str(w.message) for w in caught)


@contextmanager
def fresh_inductor_cache() -> Iterator[str]:
    """Point TORCHINDUCTOR_CACHE_DIR at an empty folder for the block, then merge what the block
    compiled into the previous cache folder (if one was set) and remove the temporary one.

    The block measures a cold compile; merging its artifacts afterwards means the run's other
    processes (the case's pass, which calls the same compiled method) find them on disk instead
    of compiling cold a second time.
    """
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    folder = tempfile.mkdtemp(prefix="vmapbench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
            with suppress(OSError):  # a cache that cannot be written only costs time
                shutil.copytree(folder, previous, dirs_exist_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def preload(methods: Iterable[str] | None = None, device: str = "cpu") -> list[str]:
    """Pay, once, the process's one-time costs that a method's first call would otherwise pay.

    Those are lazy imports (torch._dynamo, TorchInductor, sympy, torch.func's internals, the peers'
    packages, jax) and the first use of a transform. Whichever method runs first in a process
    would be charged for them: `vmapbench run W -m a,b` showed a's first call seconds slower than
    with `-m b,a`. Returns what it warmed, in order, for the caller to say so.

    `methods=None` is the ASV suite's warm-up: asv's fork server imports the suite once and forks
    a process per benchmark, so everything paid here is paid once, not in each process. It warms
    torch, every installed peer and the engine, but not jax: XLA's thread pools would not survive
    the fork. The warm-up calls use 3-element tensors, so no intra-op worker threads exist yet
    when asv forks. On a CUDA build of torch they run no backward pass either: its first one
    initializes the CUDA driver (measuring.cuda_fork), and no forked child could use CUDA, nor run
    a backward pass. Should CUDA be unusable after the fork anyway, it says why on stderr and every
    CUDA point's setup raises that (`check_fork`). Given the methods (the CLI, which does not
    fork), it warms what those need, jax included. An engine or peer that fails here is left
    alone: the methods that use it report the error. Where asv only lists the benchmarks
    (`asv_lists_only`), nothing is warmed.
    """
    wanted = None if methods is None else set(methods)
    _inject_cuda_standin()
    if wanted is None and asv_lists_only():
        return []
    forward_only = wanted is None and cuda_fork.cuda_built()

    def done(step: str) -> None:  # in the fork server: did this step leave CUDA unusable to children?
        if wanted is None:
            _note_fork_hazard(step)

    warmed = ["torch._dynamo", "torch._inductor", "torch.func"]
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch.func

    done("importing torch._dynamo, torch._inductor.compile_fx and torch.func")
    x = torch.linspace(0.1, 0.3, 3)

    def f(t: torch.Tensor) -> torch.Tensor:
        return (t.sin() * t).sum()

    if forward_only:
        torch.func.jacfwd(f)(x)  # forward mode (vmap of jvp): no backward pass
    else:
        torch.func.hessian(f)(x)
    done("torch.func's warm-up call")
    warmed += _preload_peers(wanted)
    done("importing the peers")
    if wanted is None or any(m.startswith("engine") for m in wanted):
        try:
            import engine

            if forward_only:
                engine.vmap(f)(x[:, None])
            else:
                engine.hessian(f)(x)
            warmed.append("engine")
        except Exception:  # noqa: BLE001 - reported by the benchmarks that use the engine
            pass
        done("the engine's warm-up call")
    if wanted is not None and "jax" in wanted:
        warmed += _preload_jax(device)
    return warmed


def asv_lists_only() -> bool:
    """Whether this process is asv listing or checking the benchmarks (`asv.benchmark discover` or
    `check`, run as a script): it imports the suite and runs none, so a warm-up pays for nothing."""
    return os.path.basename(sys.argv[0]) == "benchmark.py" and sys.argv[1:2] in (["discover"], ["check"])


def _inject_cuda_standin() -> None:
    """Install the CUDA stand-in where VMAPBENCH_CUDA_STANDIN asks (importing workloads does), and
    hand it to this checkout's measuring/, which imports nothing above it: at a commit whose stand-in
    does not do so itself too."""
    try:
        from workloads import cuda_standin
    except ImportError:  # a commit from before the stand-in
        return
    if cuda_standin.active():
        cuda_fork.STANDIN = cuda_standin


_FORK_HAZARD: tuple[int, str] | None = None  # (the fork server's pid, why CUDA will not survive its forks)


def _note_fork_hazard(step: str) -> None:
    """Remember (and say on stderr, once) whether a child forked from this process now could use
    CUDA, naming the warm-up step after which it was first found unusable."""
    global _FORK_HAZARD
    if _FORK_HAZARD is not None and _FORK_HAZARD[0] == os.getpid():
        return
    why = cuda_fork.hazard()
    if why:
        _FORK_HAZARD = (os.getpid(), f"{why} (found after the suite's warm-up step: {step})")
        print(f"suite: {_FORK_HAZARD[1]}; no process forked from here can use CUDA ({FORK_ADVICE})", file=sys.stderr)


FORK_ADVICE = "run asv with --launch-method spawn; vmapbench.bench: VMAPBENCH_LAUNCH=spawn"


def check_fork(device: str) -> None:
    """Raise, in a process forked after the suite's warm-up made CUDA unusable (`preload`), before
    a CUDA point fails deep in its setup with the driver's "initialization error"."""
    if _FORK_HAZARD and device == "cuda" and os.getpid() != _FORK_HAZARD[0]:
        raise RuntimeError(f"CUDA cannot be used in this benchmark's process: asv forked it from a process where "
                           f"{_FORK_HAZARD[1]}; {FORK_ADVICE}")


def _preload_peers(methods: set[str] | None) -> list[str]:
    """Import the peer packages of `methods` (None: every installed one); their names.

    Names from workloads.peers, not workloads.base, so that the suite imports against commits
    from before the peers."""
    try:  # a commit from before the peers has none
        from workloads.peers import PACKAGES, PeerUnavailable, check_available
    except ImportError:
        return []
    done: list[str] = []
    for method, package in PACKAGES.items():
        if (methods is None or method in methods) and package not in done:
            try:
                check_available(method)
                done.append(package)
            except PeerUnavailable:  # the method reports it as skipped
                pass
    return done


def _preload_jax(device: str) -> list[str]:
    """Import jax (threads configured as the jax method does) and make one jitted call."""
    try:
        from workloads.peers.jax_methods import load_jax

        jax = load_jax(device)
        import jax.numpy as jnp

        jax.jit(jax.grad(lambda v: (jnp.sin(v) * v).sum()))(jnp.linspace(0.1, 0.3, 3)).block_until_ready()
    except (ImportError, NotImplementedError):  # the jax method reports it as skipped
        return []
    return ["jax"]
