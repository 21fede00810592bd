"""One measuring pass per workload case for the figures that need no process of their own.

asv runs every point of every benchmark in a process of its own, and each of those processes
built the case and made the method's first call again (traces, compiles), which was most of
what the in-process figures (ratios to torch.func, speedups over the loop, RSS growth, engine
fallbacks) cost. Here one process builds a case (workload, size,
device) once, makes each method's first call (counting the engine's fallbacks during it and one
steady call, and torch.func's own for torch.func), measures each method's memory over one call (torch's allocator peak, XLA's analysis
for jax, RSS growth), and then times all the methods interleaved, round by round (probes.interleaved_samples). A ratio then comes with one figure per
round, whose spread is the interval the dashboard shows (measuring.stats).

Where a pass is kept: `make bench` (vmapbench/bench.py) gives the run a folder in
VMAPBENCH_PASS_DIR; the first track process of a case measures every method of it there, the
others of the run read it. A plain `asv run` or `asv continuous` (and a backfill of past commits)
gets one folder per commit's run (`_asv_run_folder`). Off asv (a test) a process measures only
the methods its figure needs: the point and the method it is compared with.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from measuring import memory
from workloads.base import BASELINE, REFERENCE

from . import probes, selection

PASS_DIR_ENV = "VMAPBENCH_PASS_DIR"
"""The folder where the passes of one run are kept (set by vmapbench/bench.py for its run)."""

# Interleaved timing of all of a case's methods: the quick profile (`make bench`) gives each case a
# short budget; the full one and `python -m vmapbench.peer_ratios` measure for longer.
QUICK_TIMING = {"rounds": 7, "budget_s": 2.0}
FULL_TIMING = {"rounds": 15, "budget_s": 20.0}

_PASSES: dict[tuple[str, str, str, tuple[str, ...] | None], "CasePass"] = {}


@dataclass
class CasePass:
    """What one pass measured of one case; per method, `errors` says why a method failed and
    `method_skips` why it cannot run here (asv: n/a)."""

    seconds: dict[str, list[float]] = field(default_factory=dict)  # seconds per call, one per round
    rss_bytes: dict[str, int] = field(default_factory=dict)
    alloc_bytes: dict[str, int] = field(default_factory=dict)  # torch CPU allocator's peak of one call
    xla_bytes: dict[str, int] = field(default_factory=dict)  # jax: XLA's compiled memory analysis, total
    memory_skipped: str = ""  # why this commit's jax method gives no XLA memory analysis
    fallbacks: dict[str, int] = field(default_factory=dict)
    torch_fallbacks: dict[str, int] = field(default_factory=dict)  # torch.func's own, during the same calls
    errors: dict[str, str] = field(default_factory=dict)
    method_skips: dict[str, str] = field(default_factory=dict)  # a peer that cannot run here (PeerUnavailable)
    fallbacks_skipped: dict[str, str] = field(default_factory=dict)  # no engine.record_fallbacks
    skipped: str = ""  # why the case cannot be built here (its setup raised NotImplementedError)

    def figure(self, method: str, table: dict[str, Any]) -> Any:
        """`table[method]`, or the method's error raised (asv: a failed point), or the case's skip."""
        if self.skipped:
            raise probes.SkipNotImplemented(self.skipped)
        if method in self.method_skips:
            raise probes.SkipNotImplemented(self.method_skips[method])
        if method in self.errors:
            raise RuntimeError(self.errors[method])
        if method not in table:
            raise RuntimeError(f"the pass of this case has no figure for {method!r}")
        return table[method]

    def memory_table(self, name: str) -> dict[str, int]:
        """`alloc_bytes` or `xla_bytes`; SkipNotImplemented where the measured commit cannot give them."""
        if self.memory_skipped and not self.skipped:
            raise probes.SkipNotImplemented(self.memory_skipped)
        return getattr(self, name)

    def round_ratios(self, numerator: str, denominator: str) -> list[float]:
        """numerator's time / denominator's, round by round (the calls of a round ran moments apart)."""
        top, bottom = self.figure(numerator, self.seconds), self.figure(denominator, self.seconds)
        return [a / b for a, b in zip(top, bottom)]


def _asv_run_folder() -> str:
    """The pass folder of the asv run this process belongs to, where VMAPBENCH_PASS_DIR is unset
    (`asv run` or `asv continuous` as asv's users type them), else "".

    asv starts every benchmark of one commit in one environment from one parent (its fork server,
    or asv itself when it spawns): the commit (ASV_COMMIT), the environment (ASV_ENV_DIR) and that
    parent, by pid and start time (a later run may get the same pid, never the same start), name
    one run, so the processes of a run share its passes as `make bench`'s do, another commit or
    a later run of the same commit measures its own, and folders of runs whose parent is gone are
    removed. "" off asv, or without /proc (each process measures what it needs)."""
    commit, env_dir = os.environ.get("ASV_COMMIT", ""), os.environ.get("ASV_ENV_DIR", "")
    ppid = os.getppid()
    parent = _started(ppid)
    if not commit or not env_dir or parent is None:
        return ""
    root = Path(tempfile.gettempdir()) / "vmapbench-asv-passes"
    run = hashlib.sha1(f"{env_dir}\0{commit}".encode()).hexdigest()[:12]
    folder = root / f"{run}-{ppid}-{parent}"
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        for old in root.iterdir():  # runs whose parent has exited
            _, pid, start = (old.name.split("-") + ["", ""])[:3]
            if pid.isdigit() and start.isdigit() and _started(int(pid)) != int(start):
                shutil.rmtree(old, ignore_errors=True)
    return str(folder)


def _started(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (/proc/PID/stat), None if none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def _file(workload: Any, size: str, device: str) -> Path | None:
    folder = os.environ.get(PASS_DIR_ENV, "").strip() or _asv_run_folder()
    if not folder:
        return None
    name = re.sub(r"[^\w.=,-]+", "_", f"{workload.name}-{size}-{device}")
    return Path(folder) / f"pass-{name}.json"


def case_pass(workload: Any, size: str, device: str, needed: Sequence[str]) -> CasePass:
    """The pass of (workload, size, device): read back if this run has one, else measured now (all
    the profile's methods when the run keeps passes, else only the `needed` ones)."""
    path = _file(workload, size, device)
    methods = None if path is not None else tuple(dict.fromkeys(needed))
    key = (workload.name, size, device, methods)
    if key in _PASSES:
        return _PASSES[key]
    if path is not None and path.is_file():
        result = CasePass(**json.loads(path.read_text()))
    else:
        result = measure_case(workload, size, device, None if methods is None else list(methods))
        if path is not None:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(asdict(result)))
            tmp.replace(path)
    _PASSES[key] = result
    return result


def _methods(workload: Any, device: str) -> list[str]:
    """The case's methods the active profile measures and this environment can run, and the loop
    and torch.func the ratios compare them with (measured even where the profile leaves them out,
    as in the compiled family's quick methods)."""
    out = []
    wanted = selection.profile_methods(workload, selection.active_profile())
    for method in dict.fromkeys([*wanted, *(m for m in (BASELINE, REFERENCE) if m in workload.methods)]):
        try:
            probes.require_method(method)
        except NotImplementedError:
            continue  # a skip: the class setup of each of its points says why
        out.append(method)
    return out


def measure_case(workload: Any, size: str, device: str, methods: list[str] | None = None) -> CasePass:
    """Build the case once; per method its first call (with the engine's fallbacks during it and one
    steady call), its memory over one call (allocator peak or XLA's analysis, and RSS growth); then
    every method timed interleaved."""
    probes.pin_threads()
    methods = _methods(workload, device) if methods is None else methods
    result = CasePass()
    probes.check_fork(device)
    try:
        state = workload.setup(workload.params(size), device)
    except NotImplementedError as exc:  # e.g. no cuda here: a skip of every point, as in setup_case
        result.skipped = f"{workload.name} [{size}] on {device}: {exc}"
        return result
    calls: dict[str, Callable[[], Any]] = {}
    for method in methods:
        call = synchronized(functools.partial(workload.run, method, state), device)
        try:
            _first_call(workload, method, state, result)
            result.rss_bytes[method] = memory.rss_delta_bytes(call)
            _allocated(method, state, call, device, result)
        except probes.peer_unavailable() as exc:  # a skip of this method's points, with the reason
            result.method_skips[method] = f"{workload.name} {method}: {exc}"
            continue
        except Exception as exc:  # noqa: BLE001 - one method's failure must not lose the others'
            result.errors[method] = f"{workload.name} {method}: {type(exc).__name__}: {exc}"
            continue
        calls[method] = call
    timing = QUICK_TIMING if selection.active_profile() == "quick" else FULL_TIMING
    if calls:
        result.seconds = probes.interleaved_samples(calls, device, **timing)
    return result




def _allocated(method: str, state: Any, call: Callable[[], Any], device: str, result: CasePass) -> None:
    """The call's memory (the checkout's measuring.memory, for every commit alike): the jax method's
    from XLA's analysis, a torch method's on cpu from torch's allocator. A commit whose jax call
    has no `xla_memory` (workloads.peers.jax_methods.compiled) gets `memory_skipped`."""
    if method == "jax":
        jitted = state.fn(method)
        if not hasattr(jitted, "xla_memory"):
            result.memory_skipped = "this commit's jax method has no xla_memory (XLA's memory analysis)"
            return
        result.xla_bytes[method] = memory.method_peak_bytes(jitted, method, device)
    elif device == "cpu":
        result.alloc_bytes[method] = memory.method_peak_bytes(call, method, device)


def synchronized(call: Callable[[], Any], device: str) -> Callable[[], Any]:
    """`call`, followed by a synchronization on a CUDA device (so kernels are timed, not launches)."""
    if device == "cpu":
        return call

    def run() -> Any:
        out = call()
        probes.synchronize(device)
        return out
    return run


def _first_call(workload: Any, method: str, state: Any, result: CasePass) -> None:
    """The method's first call and one steady call, the engine's fallbacks during them counted
    (asv asks for the engine methods' counts; any other method's must be 0), and torch.func's
    own fallbacks where the method is torch.func (what a torch release changed for it)."""
    def calls() -> None:
        probes.first_call(workload, method, state)
        workload.run(method, state)

    def first_and_steady_call() -> None:
        if method == REFERENCE:
            result.torch_fallbacks[method] = probes.torch_fallback_count(calls)
        else:
            calls()
    try:
        result.fallbacks[method] = probes.fallback_count(first_and_steady_call)
    except probes.SkipNotImplemented as exc:  # an engine without record_fallbacks
        result.fallbacks_skipped[method] = str(exc)
        first_and_steady_call()
