"""The fused tier: a replayed graph that pays for its compile becomes one compiled program.

Per signature of a traced function, calls climb eager -> replay -> fused once `pays` says the
saving expected reaches the compile's cost. The compile runs in a worker process
(engine.fused_worker) so the replays it should not block keep running; `settle()` waits for it.
The engine's signature is the program's guard, plus the strides and alignment it was specialised
to. Switch: `fused_tier(False | "force")` or VMAPBENCH_FUSED=0|force. Design and reasons:
docs/design/fused.md.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib.util
import itertools
import operator
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.fx

from engine import timed_choices
from engine.fused_worker import LOWERING, encode, read_message, write_message
from engine.graph_passes import layout_guard

__all__ = ["FusedProgram", "Tier", "compile_now", "fused_backend", "fused_mode", "fused_tier", "pays", "settle"]

OFF, ON, FORCE = "off", "on", "force"

# The policy's constants. A compile nobody has timed on this machine is assumed to cost
# COLD_COMPILE_S (inductor's C++ builds on a small CPU); a fused program is assumed to save
# EXPECTED_SAVING of a replay's time; a signature needs
# MIN_REPLAYS replays before anything is spent on it (a function called a few times never compiles).
COLD_COMPILE_S = 20.0
EXPECTED_SAVING = 0.5
# The in-process XLA backend (engine.fused_xla) compiles in a fraction of a second on a thread of
# this process; the caller keeps replaying but shares the GIL and the cores with it, so a compile is
# taken to cost its own seconds: XLA_COMPILE_S until this process has timed one, then the median of
# those timed. A process that has not imported jax yet pays the import (mostly holding the GIL) too:
# JAX_IMPORT_S, with the ml_dtypes the peers extra pins (pyproject.toml says why).
XLA_COMPILE_S = 0.3
JAX_IMPORT_S = 0.5
MIN_REPLAYS = 8
# A CPU program's first calls are timed against the replay's, alternated (Trial): it is kept unless
# its median call is SLOWER times the replay's or more.
TRIAL_CALLS = 5
SLOWER = 1.1
TRIAL_LENGTH = 2 * (TRIAL_CALLS + 1)  # calls until a trial decides: one untimed call of each side first
# CUDA programs are replayed as CUDA graphs (CudaGraphed) where their inputs total this many bytes
# at most (each call copies them into the graph's buffers); VMAPBENCH_CUDA_GRAPHS=0 turns that off.
CUDA_GRAPHS = os.environ.get("VMAPBENCH_CUDA_GRAPHS", "1").strip().lower() not in ("0", "false", "off", "no")
CUDA_GRAPH_MAX_BYTES = 64 << 20


def _mode_from(value: str) -> str:
    value = value.strip().lower()
    if value in ("0", "false", "off", "no"):
        return OFF
    if value == FORCE:
        return FORCE
    return ON


_DEFAULT = _mode_from(os.environ.get("VMAPBENCH_FUSED", "1"))

# Which compiler makes CPU programs: "auto" (the default: XLA first where jax is usable and has a
# rule for every op of the graph, its compile a fraction of a second; then inductor, whose compile
# takes tens of seconds for programs that run faster, once the XLA program's calls pay for it: see
# Tier.climb and docs/design/fused.md), "inductor" (inductor only), "xla" (XLA or nothing). CUDA
# programs are inductor's.
BACKENDS = ("inductor", "xla", "auto")
BACKEND = os.environ.get("VMAPBENCH_FUSED_BACKEND", "auto").strip().lower() or "auto"
if BACKEND not in BACKENDS:
    raise ValueError(f"VMAPBENCH_FUSED_BACKEND={BACKEND!r}: expected one of {', '.join(BACKENDS)}")


class _Local(threading.local):
    mode: str = _DEFAULT


_local = _Local()


@contextlib.contextmanager
def fused_tier(enabled: bool | str) -> Iterator[None]:
    """Turn the fused tier on (True), off (False) or to "force" inside the block (this thread).

    Off, replays run the recorded graph op by op (exactly the replay path), and no compile starts;
    programs already compiled are kept for when it is on again. "force" compiles at the first
    replay of each signature and waits for it. The process default is on; VMAPBENCH_FUSED=0 turns
    it off, VMAPBENCH_FUSED=force forces it.
    """
    if enabled is True:
        mode = ON
    elif enabled is False:
        mode = OFF
    elif enabled == FORCE:
        mode = FORCE
    else:
        raise TypeError(f"engine.fused_tier: enabled must be True, False or 'force', got {enabled!r}")
    old, _local.mode = _local.mode, mode
    try:
        yield
    finally:
        _local.mode = old


def fused_mode() -> str:
    """'on', 'off' or 'force' for this thread."""
    return _local.mode


def pays(replays: int, replay_seconds: float, compile_seconds: float) -> bool:
    """Whether compiling a signature pays: after MIN_REPLAYS replays, once the time the program is
    expected to save over as many calls again as were seen reaches the compile's cost."""
    return replays >= MIN_REPLAYS and replay_seconds * EXPECTED_SAVING >= compile_seconds


# ------------------------------------------------------------------------------------------------
# graphs as data, and the on-disk index of compiled programs


def describe_graph(gm: torch.fx.GraphModule) -> list:
    """The graph as plain picklable data (what the worker rebuilds): one (kind, target, args,
    kwargs) per node, node arguments as positions. Raises ValueError for nodes it cannot carry."""
    index: dict = {}
    out = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        if node.op == "placeholder":
            out.append(("placeholder", node.name, None, None))
        elif node.op == "output":
            out.append(("output", None, encode(node.args[0], index), None))
        elif node.op == "call_function":
            target, args = node.target, node.args
            if getattr(target, "__name__", None) == "_in_grad_mode" and target.__module__ == "engine.trace":
                # A kernel whose rounding depends on the grad mode (engine.trace.GRAD_MODE_KERNELS),
                # pinned to its recorded mode for the replay's bit-for-bit equality: the program
                # calls the kernel itself (in its own grad mode), within the tolerance every fused
                # program is held to.
                target, args = args[0], args[2:]
            if isinstance(target, torch._ops.OpOverload):
                name = f"{target.namespace}::{target._schema.name.split('::')[1]}.{target._overloadname}"
            elif target.__name__ == "getitem" and target.__module__ == "_operator":
                name = "getitem"
            else:
                raise ValueError(f"the fused tier cannot carry a call of {target!r}")
            out.append(("call_function", name, encode(args, index), encode(node.kwargs, index)))
        else:
            raise ValueError(f"the fused tier cannot carry a {node.op} node")
    return out


def _inputs_meta(inputs: list) -> list:
    return [(tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in inputs]


# Inductor settings of every fused program: random ops as aten calls (the replay's draws), and no
# per-call size/stride asserts (FusedProgram checks strides itself, and falls back instead of raising).
PATCHES: dict[str, Any] = {"fallback_random": True, "size_asserts": False}


def graph_key(description: list, inputs_meta: list, patches: dict) -> str:
    """What identifies a compiled program on disk: torch's version, the worker's lowering, the
    graph, the input layouts."""
    text = repr((torch.__version__, LOWERING, description, inputs_meta, sorted(patches.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _inductor_cache_dir() -> str:
    """Inductor's cache directory as inductor finds it: TORCHINDUCTOR_CACHE_DIR, else its
    `default_cache_dir()`. Its module (torch/_inductor/runtime/cache_dir_utils.py, written without
    torch dependencies) is loaded on its own: imported through its package it would run
    torch._inductor's __init__, which imports Dynamo and sympy, most of a second in the process
    that first asks (every process at a signature's MIN_REPLAYS-th replay, `Tier._known`)."""
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if base:
        return os.path.abspath(base)
    path = Path(torch.__file__).parent / "_inductor" / "runtime" / "cache_dir_utils.py"
    try:
        spec = importlib.util.spec_from_file_location("vmapbench_inductor_cache_dir_utils", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return os.path.abspath(module.default_cache_dir())
    except Exception:  # noqa: BLE001 - moved or changed upstream: ask inductor, at the import's cost
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return cache_dir()


class GraphIndex:
    """Generated program sources by graph key, under inductor's cache directory
    (TORCHINDUCTOR_CACHE_DIR; the kernels the sources load are in inductor's own caches there),
    so a later process loads the program of a graph it has seen instead of compiling it."""

    def __init__(self, root: Path | None = None) -> None:
        self._root = root

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = Path(_inductor_cache_dir()) / "vmapbench-fused"
        return self._root

    def get(self, key: str) -> str | None:
        try:
            return (self.root / f"{key}.py").read_text()
        except OSError:
            return None

    def put(self, key: str, source: str) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f"{key}.{os.getpid()}.tmp"
            tmp.write_text(source)
            os.replace(tmp, self.root / f"{key}.py")
        except OSError:
            pass  # a read-only cache only costs the next process a compile


INDEX = GraphIndex()


# ------------------------------------------------------------------------------------------------
# the program


class FusedProgram:
    """Inductor's generated `call` for one graph, with the checks the engine's signature leaves
    open: the strides the program was compiled for, that no input needs autograd, and the 16-byte
    data alignment it assumes. `__call__` returns None when they do not hold (the caller replays).

    An input that is not aligned (a view starting mid-row: `x[1:]`, or a folded constant such as a
    slice of `eye`, which Rosenbrock's Hessian feeds on every call) is copied into fresh memory of
    the same strides first, as torch.compile's runtime copies misaligned inputs. The program is
    functional (no input is written), so the copy changes nothing, unless an output is a view of
    that input: then the output would view the copy instead of the caller's memory. So the outputs
    are checked against the copies; one that shares a copy's memory is thrown away, the call
    replays, and the program stops copying (misaligned calls replay from then on).

    Most of a traced call's inputs are its folded constants (engine.graph_passes.Fold), which do
    not change from call to call: the caller passes the fold's values tuple as `proof`, and the
    positions of the inputs the fold does not vouch for as `live` (the call's arguments, captured
    tensors the fold does not read). The fold returns the same tuple object only while each of
    its sources keeps the data pointer, sizes and strides it had when the values were computed,
    and the values themselves are the fold's own tensors (nobody else holds them to change their
    layout). So once every input passed the stride and alignment checks beside one values tuple,
    a call with that same tuple checks only the `live` inputs (the call's arguments, typically a few of them)."""

    __slots__ = ("call", "strides", "layout", "key", "seconds", "source", "copies_ok", "proof", "live", "gather",
                 "live_check")

    def __init__(self, call: Callable, strides: tuple, key: str, seconds: float, source: str,
                 layout: tuple | None = None) -> None:
        self.call = call
        self.strides = strides
        # (sizes, dtype, device) of every input as compiled: a captured tensor or a folded value can
        # change them between calls (`t.data = t.view(torch.int32)`, a larger `t.data`) where the
        # signature does not look, and the program would read its memory as compiled, silently.
        self.layout = layout
        self.key = key
        self.seconds = seconds  # what this program cost to get: the compile, or the load from disk
        self.source = source
        self.copies_ok = True
        self.proof: Any = None  # the fold's values tuple all inputs were last checked beside (held: its id stays unique)
        self.live: tuple[int, ...] = ()  # the positions checked on every call while `proof` holds
        self.gather: Callable[[list], tuple] = _nothing  # the live inputs, as a tuple
        self.live_check: Callable[..., bool] = _refuse  # their layout as checked (torch's TensorGuards)

    def __call__(self, inputs: list, proof: Any = None, live: tuple[int, ...] = ()) -> Any:
        """The program's outputs for `inputs` (a list the program empties), or None where its checks
        do not hold (the caller replays; `inputs` is then left as it was). `proof` and `live`: see
        the class. The requires_grad check, needed only under grad mode, covers every input."""
        # map over C functions, no Python frame per input: these checks run on every fused call
        if proof is not None and proof is self.proof and live is self.live:
            head = self.gather(inputs)
            if (self.live_check(*head) and not any(map(operator.and_, map(_data_ptr, head), _ALIGN))
                    and not (torch.is_grad_enabled() and any(map(_requires_grad, inputs)))):
                return self.call(inputs)
            # (a live input changed, or the check is stricter than the one below: that one decides)
        if not self.laid_out(inputs):
            return None
        if torch.is_grad_enabled() and any(map(_requires_grad, inputs)):
            return None
        if any(map(operator.and_, map(_data_ptr, inputs), _ALIGN)):
            return self._call_aligned(inputs)
        if proof is not None and proof is not self.proof:  # every input checked (and aligned) beside it
            self._vouch(proof, live, inputs)
        return self.call(inputs)

    def laid_out(self, inputs: list) -> bool:
        """Whether `inputs` have the strides, sizes, dtype and device the program was compiled for."""
        return tuple(map(_stride, inputs)) == self.strides and (
            self.layout is None or tuple(map(_layout, inputs)) == self.layout)

    def _vouch(self, proof: Any, live: tuple[int, ...], inputs: list) -> None:
        """Check only the `live` inputs while the caller passes `proof` (see the class): their
        strides (with sizes, dtype, device, dispatch keys and requires_grad: torch's TensorGuards,
        one C call) and their alignment."""
        if not live:
            gather: Callable[[list], tuple] = _nothing
        elif len(live) == 1:
            gather = functools.partial(_one, live[0])
        else:
            gather = operator.itemgetter(*live)
        check = layout_guard(gather(inputs))
        if check is None:
            return  # this torch lacks them (or refuses these tensors): every call checks every input
        # the proof last: a thread that sees it sees the checks made beside it
        self.live, self.gather, self.live_check = live, gather, check
        self.proof = proof

    def _call_aligned(self, inputs: list) -> Any:
        if not self.copies_ok:
            return None
        args, copies = [], set()
        for t in inputs:
            if t.data_ptr() & 15:
                try:  # the same strides (gaps kept); copy_ refuses a destination whose elements overlap
                    t = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
                except RuntimeError:
                    return None
                copies.add(t.untyped_storage().data_ptr())
            args.append(t)
        outs = self.call(args)
        if any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in copies for o in outs):
            self.copies_ok = False
            return None
        return outs


def _nothing(inputs: list) -> tuple:
    return ()


def _one(i: int, inputs: list) -> tuple:
    return (inputs[i],)


def _refuse(*tensors: torch.Tensor) -> bool:
    return False


_stride = torch.Tensor.stride
_layout = operator.attrgetter("shape", "dtype", "device")
_data_ptr = torch.Tensor.data_ptr
_requires_grad = operator.attrgetter("requires_grad")
_ALIGN = itertools.repeat(15)  # data_ptr & 15: not 16-byte aligned


def load_program(source: str) -> Callable:
    """Import a generated module (its kernels come from inductor's caches) and return its `call`."""
    from torch._inductor.codecache import PyCodeCache

    return PyCodeCache.load(source).call


# ------------------------------------------------------------------------------------------------
# the compile worker


class Job:
    """One signature's compile: requested by the calling thread, done by the compiler thread."""

    def __init__(self, tier: "Tier | None", description: list, meta: list, key: str, known: str | None,
                 patches: dict[str, Any] | None = None, backend: str = "inductor", gm: Any = None,
                 inputs: list | None = None, arguments: int = 0) -> None:
        self.tier = tier
        self.backend = backend
        # the XLA backend compiles in this process, from the graph and the inputs of one replay
        self.gm, self.inputs, self.arguments = gm, inputs, arguments
        self.patches = PATCHES if patches is None else patches
        self.description = description
        self.meta = meta
        self.key = key
        self.known = known  # the source from the on-disk index, if this graph was compiled before
        self.done = threading.Event()
        self.program: FusedProgram | None = None
        self.error: str | None = None
        self.seconds: float | None = None


class _Compiler:
    """A thread of this process feeding the compile worker process, one job at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.Queue[Job] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen | None = None
        self._pending: set[Job] = set()
        self._jobs = 0
        self._closed = False

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._closed:  # the process is exiting: nothing would call the program
                job.error = CLOSED
                job.done.set()
                return
            self._pending.add(job)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="engine-fused-compiler", daemon=True)
                self._thread.start()
        self._queue.put(job)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def settle(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                jobs = list(self._pending)
            if not jobs:
                return True
            for job in jobs:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not job.done.wait(left):
                    return False

    def close(self, timeout: float) -> bool:
        """At this process's exit: start no more compiles and wait up to `timeout` seconds for the
        one in flight (True if none is left). An XLA compile runs C++ on the compiler thread with
        the GIL released; a daemon thread that comes back to Python once the interpreter is
        finalizing is unwound through those frames, and the process aborts (SIGABRT)."""
        with self._lock:
            self._closed = True
        return self.settle(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            start = time.perf_counter()
            try:
                if self._closed:
                    raise RuntimeError(CLOSED)
                if job.backend == "xla":
                    call, source = self._compile_xla(job), "xla"
                else:
                    source = job.known if job.known is not None else self._compile(job)
                    call = load_program(source)
                job.seconds = time.perf_counter() - start
                job.program = FusedProgram(call, tuple(m[1] for m in job.meta), job.key, job.seconds, source,
                                           tuple((torch.Size(m[0]), m[2], m[3]) for m in job.meta))
                if job.known is None and job.backend != "xla":
                    INDEX.put(job.key, source)
            except Exception as exc:  # noqa: BLE001 - the signature keeps replaying; the error is kept
                job.error = f"{type(exc).__name__}: {exc}"
                job.seconds = time.perf_counter() - start
            if job.tier is not None:
                job.tier.finished(job)
            job.gm = job.inputs = None
            HISTORY.append({"key": job.key, "seconds": job.seconds, "from_disk": job.known is not None,
                            "error": job.error, "backend": job.backend})
            with self._lock:
                self._pending.discard(job)
            job.done.set()

    @staticmethod
    def _compile_xla(job: Job) -> Callable:
        from engine import fused_xla

        return fused_xla.compile_graph(job.gm, job.inputs, job.arguments)

    def _worker(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            script = Path(__file__).with_name("fused_worker.py")
            # run_path, not the script itself: the script's folder (engine/) on sys.path would
            # shadow standard modules (trace, functional) in the worker
            code = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
            # its own process group (POSIX): ended whole, with the compilers it runs, when this
            # process exits (below) or dies (the worker watches for that: fused_worker.exit_with_parent)
            self._process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                             start_new_session=hasattr(os, "killpg"))
            atexit.register(_end_worker, self._process)
        return self._process

    def _compile(self, job: Job) -> str:
        process = self._worker()
        self._jobs += 1
        write_message(process.stdin, (self._jobs, job.description, job.meta, job.patches))
        reply = read_message(process.stdout)
        if reply is None:
            self._process = None
            raise RuntimeError("the compile worker process exited")
        _, status, payload, _seconds = reply
        if status != "ok":
            raise RuntimeError(f"inductor could not compile the graph: {payload}")
        return payload


def _end_worker(process: subprocess.Popen) -> None:
    """At this process's exit: the compile worker and its compilers, if still running (a compile
    it has not returned would reach no one)."""
    if process.poll() is not None:
        return
    try:
        if hasattr(os, "killpg"):
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    except OSError:  # gone meanwhile
        pass


CLOSED = "not compiled: the process is exiting"
# How long the process's exit waits for a compile in flight (an XLA compile takes seconds at most).
EXIT_WAIT_S = 60.0
_COMPILER = _Compiler()  # inductor's jobs, through the worker process
_XLA = _Compiler()  # XLA's jobs, compiled on its thread (XLA's compile releases the GIL)


def _close_compilers() -> None:
    """At exit, each compiler's thread left idle (see _Compiler.close)."""
    for compiler in (_XLA, _COMPILER):
        compiler.close(EXIT_WAIT_S)


# Registered before any worker's _end_worker: atexit runs last-in first, so an inductor compile
# in flight has lost its worker (and ends) by the time its thread is waited for.
atexit.register(_close_compilers)
# Every finished job of this process, in order: what benchmarks read to put compile cost on the record.
HISTORY: list[dict[str, Any]] = []
# Called at each fusable signature's first replay as watch(graph, inputs, number of call arguments):
# how tools see every graph the default path records (vmapbench fused-backends).
REPLAY_WATCHERS: list[Callable[[torch.fx.GraphModule, list, int], None]] = []
# Every program its trial found slower than the replay, in order (Tier.slower's message).
DROPPED: list[str] = []


def settle(timeout: float | None = None) -> bool:
    """Wait until every fused-tier compile started so far is done (ready or failed); True if all
    are, False if `timeout` seconds passed first. Benchmarks call it before timing, so no timing
    mixes the replay and fused tiers."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if not _XLA.settle(timeout):
        return False
    return _COMPILER.settle(None if deadline is None else max(0.0, deadline - time.monotonic()))


def fused_backend() -> str:
    """The CPU backend the tier would use for a graph XLA can lower: 'xla' or 'inductor', with
    VMAPBENCH_FUSED_BACKEND and whether jax is usable here."""
    if BACKEND == "inductor":
        return "inductor"
    from engine import fused_xla

    return "xla" if fused_xla.available() is None else "inductor"


def _xla_cost() -> float:
    """What an XLA compile is expected to cost the caller (see XLA_COMPILE_S)."""
    measured = [h["seconds"] for h in HISTORY if h.get("backend") == "xla" and h["error"] is None
                and h["seconds"] is not None]
    cost = timed_choices.median(measured) if measured else XLA_COMPILE_S
    return cost if "jax" in sys.modules else cost + JAX_IMPORT_S


_SAID: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def compile_now(gm: torch.fx.GraphModule, inputs: list, patches: dict[str, Any]) -> FusedProgram:
    """The program of `gm` for `inputs`' layouts, compiled (or loaded from disk) and waited for:
    engine.compile's direct inductor path. `patches` are inductor settings on top of PATCHES.
    Raises RuntimeError when inductor cannot compile the graph."""
    description = describe_graph(gm)
    patches = {**PATCHES, **patches}
    meta = _inputs_meta(inputs)
    key = graph_key(description, meta, patches)
    job = Job(None, description, meta, key, INDEX.get(key), patches)
    _COMPILER.submit(job)
    job.done.wait()
    if job.program is None:
        raise RuntimeError(job.error)
    return job.program


def pending() -> int:
    """Compiles started and not finished."""
    return _COMPILER.pending() + _XLA.pending()


# ------------------------------------------------------------------------------------------------
# one signature's way up


class Tier:
    """The fused tier's state for one recorded signature (an engine.trace entry).

    Counts the replays and their time until the signature moves up (or cannot), then holds the
    compile job. `entry` is held weakly: an evicted signature's compile finishes into nothing.
    """

    __slots__ = ("replays", "replay_seconds", "state", "job", "error", "backend", "cost", "below", "_entry",
                 "__weakref__")

    def __init__(self, entry: Any) -> None:
        self.replays = 0
        self.replay_seconds = 0.0
        self.state = "replay"  # -> pending -> fused | failed; or ineligible
        self.job: Job | None = None
        self.error: str | None = None
        self.backend: str | None = None  # chosen at the MIN_REPLAYS-th replay ("xla" or "inductor")
        self.cost = COLD_COMPILE_S  # what the compile is expected to cost the caller, in seconds
        # under auto, the XLA program the signature runs while inductor's is compiled and tried (see climb)
        self.below: FusedProgram | None = None
        self._entry = weakref.ref(entry)

    def seen(self, seconds: float, inputs: list, mode: str) -> None:
        """A replay of `seconds` ran on `inputs` (graph inputs, captured tensors last)."""
        self.replays += 1
        self.replay_seconds += seconds
        if self.replays == 1 and REPLAY_WATCHERS:
            entry = self._entry()
            if entry is not None:
                for watch in REPLAY_WATCHERS:
                    watch(entry.gm, inputs, len(entry.tensor_pos))
        if mode == FORCE:
            if BACKEND == "auto" and self.state == "replay":
                # waited for anyway: the program auto ends with (see climb), whatever was chosen
                # for this signature before (an XLA choice made in a call that did not force)
                self.backend, self.cost = "inductor", COLD_COMPILE_S
            self.promote(inputs, wait=True)
        # (on every replay: `pays` inline, the entry looked up only where it may hold)
        elif self.replays == MIN_REPLAYS or (self.replays > MIN_REPLAYS
                                             and self.replay_seconds * EXPECTED_SAVING >= self.cost):
            entry = self._entry()
            if entry is None:
                return
            if self.backend is None:
                self._choose(entry, inputs)
            if pays(self.replays, self.replay_seconds, self.cost):
                self.promote(inputs, wait=False)

    def _choose(self, entry: Any, inputs: list) -> None:
        """The backend for this signature and what its compile is expected to cost: XLA's measured
        compile time, or for inductor nothing when the program is on disk (checked once)."""
        self.backend = _backend_for(entry.gm, inputs)
        if self.backend == "xla" and BACKEND == "auto" and self._known(entry, inputs):
            self.backend, self.cost = "inductor", 0.0  # inductor's program is on disk: it loads, and runs fastest
        elif self.backend == "xla":
            self.cost = _xla_cost()
        elif self.backend == "inductor":
            self.cost = 0.0 if self._known(entry, inputs) else COLD_COMPILE_S
        else:  # VMAPBENCH_FUSED_BACKEND=xla and XLA cannot take it: no more counting
            self.state, self.error = "ineligible", _backend_refusal(entry.gm)
            self.cost = float("inf")
            entry.tier = None

    def _known(self, entry: Any, inputs: list) -> bool:
        """Whether the graph's inductor program is on disk already."""
        try:
            key = graph_key(describe_graph(entry.gm), _inputs_meta(inputs), PATCHES)
        except ValueError:
            return False
        return INDEX.get(key) is not None

    def promote(self, inputs: list, wait: bool) -> None:
        """Start the compile (in the background unless `wait`)."""
        entry = self._entry()
        if entry is None or self.state != "replay":
            return
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            self.state = "ineligible"  # the call builds an autograd graph, which the program does not
            entry.tier = None
            return
        if self.backend is None:
            self.backend = _backend_for(entry.gm, inputs)
        if self.backend is None:
            self.state, self.error = "ineligible", _backend_refusal(entry.gm)
            entry.tier = None
            return
        try:
            description = describe_graph(entry.gm)
        except ValueError as exc:
            self.state, self.error = "ineligible", str(exc)
            entry.tier = None
            return
        meta = _inputs_meta(inputs)
        key = graph_key(description, meta, PATCHES)
        self.state = "pending"
        if self.backend == "xla":
            self.job = Job(self, description, meta, key, None, backend="xla", gm=entry.gm, inputs=list(inputs),
                           arguments=len(entry.tensor_pos))
            compiler = _XLA
        else:
            self.job = Job(self, description, meta, key, INDEX.get(key))
            compiler = _COMPILER
        entry.tier = None  # no more counting: the entry replays until the program is ready
        compiler.submit(self.job)
        if wait:
            self.job.done.wait()

    def finished(self, job: Job) -> None:
        """Called by the compiler thread: switch the entry to the program (or record the failure)."""
        if job.program is None and self.below is not None:
            # inductor failed where the XLA program runs: it keeps running
            self.state, self.backend, self.error = "fused", "xla", f"inductor: {job.error}"
            self.below = None
            return
        if job.program is None:
            self.state, self.error = "failed", job.error
            if job.backend == "xla" and BACKEND == "auto":
                # XLA refused this graph: it counts on toward inductor, under inductor's cost
                entry = self._entry()
                if entry is not None:
                    self.state, self.backend, self.job = "replay", "inductor", None
                    self.error = f"XLA: {job.error}"
                    self.cost = COLD_COMPILE_S
                    entry.tier = self
            return
        self.state = "fused"
        entry = self._entry()
        if entry is not None:
            program = job.program
            if TRIAL_CALLS and all(m[3].type == "cpu" for m in job.meta):
                program = Trial(program, entry, self, self.below)
            elif graphable(job.meta, entry.gm):
                program = CudaGraphed(program)
            else:
                program = self.kept(program)
            entry.fused = program

    def kept(self, program: "FusedProgram") -> Any:
        """What runs once `program` is in place: under auto an XLA program is timed toward
        inductor's compile (`Climb`); anything else runs as it is."""
        self.below = None
        if self.backend == "xla" and BACKEND == "auto":
            self.replays, self.replay_seconds, self.cost = 0, 0.0, COLD_COMPILE_S
            return Climb(program, self)
        return program

    def climb(self, seconds: float, climb: "Climb") -> None:
        """An XLA program's call of `seconds` ran (under auto). XLA is the tier's first compiler:
        its compile costs a fraction of a second, inductor's tens of seconds for programs that run
        faster (docs/design/fused.md). So the XLA program's time counts toward inductor's compile
        as the replay's counted toward XLA's (`pays`); once it pays, inductor compiles in its
        worker while the XLA program runs, and its program is tried against the XLA one: the
        faster is kept."""
        self.replays += 1
        self.replay_seconds += seconds
        if not pays(self.replays, self.replay_seconds, self.cost):
            return
        entry = self._entry()
        if entry is None or self.job is None or self.state != "fused":
            return
        entry.fused = climb.program  # no more timing
        xla = self.job
        self.below, self.backend, self.state = climb.program, "inductor", "pending"
        self.job = Job(self, xla.description, xla.meta, xla.key, INDEX.get(xla.key))
        _COMPILER.submit(self.job)

    def slower(self, entry: Any, fused_s: float, replay_s: float) -> None:
        """The trial found the program slower than the replay: the signature stays on the replay
        (under `auto`, an XLA program's signature counts on toward inductor, as a refused one does);
        or, for inductor's program tried against the XLA one (`climb`), on the XLA program."""
        if self.below is not None:
            self.state, self.backend = "fused", "xla"
            self.error = (f"inductor's program took {fused_s * 1e3:.3g} ms a call against the XLA program's "
                          f"{replay_s * 1e3:.3g} ms (medians of {TRIAL_CALLS} calls each, alternated): XLA's is kept")
            entry.fused, self.below = self.below, None
            DROPPED.append(self.error)
            return
        self.state = "slower"
        self.error = (f"the program took {fused_s * 1e3:.3g} ms a call against the replay's {replay_s * 1e3:.3g} ms "
                      f"(medians of {TRIAL_CALLS} calls each, alternated): the replay is kept")
        entry.fused = None
        DROPPED.append(self.error)
        if self.backend == "xla" and BACKEND == "auto":
            self.state, self.backend, self.job = "replay", "inductor", None
            self.error = f"XLA: {self.error}"
            self.cost = COLD_COMPILE_S
            entry.tier = self


def _backend_for(gm: torch.fx.GraphModule, inputs: list) -> str | None:
    """The backend that compiles `gm` for `inputs` (see BACKEND); None where none may."""
    if BACKEND == "inductor" or any(t.device.type != "cpu" for t in inputs) or draws(gm):
        return None if BACKEND == "xla" else "inductor"
    from engine import fused_xla, jax_lowering

    why = fused_xla.available()
    if why is not None:
        _say_once(f"engine's fused tier: XLA is not usable here ({why}); fused programs are compiled by inductor")
        return None if BACKEND == "xla" else "inductor"
    if jax_lowering.lowerable(gm) is None:
        return "xla"
    return None if BACKEND == "xla" else "inductor"


def _backend_refusal(gm: torch.fx.GraphModule) -> str:
    from engine import jax_lowering

    missing = jax_lowering.lowerable(gm)
    why = f"no XLA rule for {missing}" if missing else "a CUDA graph, a random op, or jax is not usable"
    return f"VMAPBENCH_FUSED_BACKEND=xla and the graph cannot go to XLA ({why})"


def draws(gm: torch.fx.GraphModule | None) -> bool | None:
    """Whether a recorded graph calls a random op (None: no graph to tell)."""
    if gm is None:
        return None
    return any(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
               for n in gm.graph.nodes if n.op == "call_function")


def graphable(meta: list, gm: torch.fx.GraphModule | None) -> bool:
    """A program CUDA graphs may replay: every input on CUDA, inputs of CUDA_GRAPH_MAX_BYTES at
    most (each call copies them into the graph's own buffers), and no random op (a captured draw
    would need the generator's graph-safe offsets; such programs run as they are)."""
    if not CUDA_GRAPHS or not meta or draws(gm) is not False:
        return False
    size = 0
    for shape, strides, dtype, device in meta:
        if device.type != "cuda":
            return False
        size += (1 + sum((n - 1) * st for n, st in zip(shape, strides) if n)) * dtype.itemsize
    return size <= CUDA_GRAPH_MAX_BYTES


class _CudaCapture:
    """torch.cuda's graph API as the one call CudaGraphed needs (a seam: the logic around it is
    tested on CPU with a stand-in that replays by calling the function again)."""

    @staticmethod
    def capture(fn: Callable[[], Any]) -> tuple[Any, Any]:
        """(graph, outputs): `fn` warmed up twice on a side stream, then captured."""
        cuda = torch.cuda
        side = cuda.Stream()
        side.wait_stream(cuda.current_stream())
        with cuda.stream(side):
            for _ in range(2):
                fn()
        cuda.current_stream().wait_stream(side)
        graph = cuda.CUDAGraph()
        with cuda.graph(graph):
            outs = fn()
        return graph, outs


class CudaGraphed:
    """A CUDA program replayed as one CUDA graph: one launch instead of one per kernel, where these
    small programs spend their time launching (the GPU idles between host-bound launches). Captured at its first call on buffers of its own (`static`), each later call copies its
    inputs into them, replays, and returns copies of the outputs (the next replay overwrites the
    buffers), under a lock (the buffers are shared). A call whose inputs have other strides, or
    that needs autograd, goes to the program itself, whose checks decide. A capture that fails, or
    whose outputs share memory with its inputs (a copy would not be the view a replay returns),
    leaves the program as it is for good. It stands in for the program (its attributes)."""

    __slots__ = ("program", "graph", "static", "outs", "plain", "lock", "capturer")

    def __init__(self, program: "FusedProgram") -> None:
        self.program = program
        self.capturer: Any = _CudaCapture
        self.graph: Any = None
        self.static: list[torch.Tensor] = []
        self.outs: Any = None
        self.plain = False  # the capture failed or cannot serve: the program itself from now on
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.program, name)

    def __call__(self, inputs: list, *rest: Any) -> Any:
        if self.plain or (torch.is_grad_enabled() and any(map(_requires_grad, inputs))):
            return self.program(inputs, *rest)
        if self.program.layout is None or not self.program.laid_out(inputs):
            return self.program(inputs, *rest)  # (copy_ would convert or broadcast into the buffers)
        with self.lock:
            if self.graph is None and not self._capture(inputs):
                return self.program(inputs, *rest)
            for buffer, x in zip(self.static, inputs):
                buffer.copy_(x)
            self.graph.replay()
            return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.outs]

    def _capture(self, inputs: list) -> bool:
        """Capture the program on buffers of its own holding `inputs` (laid out as compiled, and
        aligned: fresh memory); False (and the program for good) where it cannot be replayed so."""
        self.plain = True
        static = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x) for x in inputs]
        call = self.program.call
        try:
            graph, outs = self.capturer.capture(lambda: call(list(static)))
        except Exception:  # noqa: BLE001 - a program that cannot be captured runs as it is
            return False
        storages = {t.untyped_storage().data_ptr() for t in static}
        if any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in storages for o in outs):
            return False
        self.graph, self.outs, self.static = graph, outs, static
        self.plain = False
        return True


class Trial:
    """A CPU program's first calls, alternated with the replay's and timed (`TRIAL_CALLS` each, after
    one untimed call each): a program inductor made slower than the replay it replaces (large
    convolutions, where its layout choices cost more than fusing saves) is dropped, and the signature keeps replaying (`Tier.slower`, shown by tiers()); else
    the entry gets the program itself. Either side's result is the call's (the replay's is exact, the
    program's within the tier's tolerance). On CUDA, host time says little of a program's cost, so
    CUDA programs start without a trial. It stands in for the program meanwhile (its attributes).
    `baseline`: a program to try it against instead of the replay (inductor's against XLA's, Tier.climb)."""

    __slots__ = ("program", "entry", "tier", "calls", "times", "baseline")

    def __init__(self, program: "FusedProgram", entry: Any, tier: Tier, baseline: Any = None) -> None:
        self.program, self.entry, self.tier = program, weakref.ref(entry), tier
        self.baseline = baseline
        self.calls = 0
        self.times: tuple[list[float], list[float]] = ([], [])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.program, name)

    def __call__(self, inputs: list, *rest: Any) -> Any:
        entry = self.entry()
        if entry is None:
            return self.program(inputs, *rest)
        side = self.calls & 1  # 0: the program, 1: the replay (or the baseline)
        self.calls += 1
        start = time.perf_counter()
        if not side:
            outs = self.program(inputs, *rest)
        elif self.baseline is None:
            outs = entry.run(*inputs)
        else:
            outs = self.baseline(inputs, *rest)
        seconds = time.perf_counter() - start
        if outs is None:  # the program's checks failed: the caller replays, and this is no timing
            return None
        if self.calls > 2:  # each side's first call untimed (cold caches, first page faults)
            self.times[side].append(seconds)
        if min(map(len, self.times)) >= TRIAL_CALLS:
            fused_s, replay_s = map(timed_choices.median, self.times)
            if fused_s > SLOWER * replay_s:
                self.tier.slower(entry, fused_s, replay_s)
            else:
                entry.fused = self.tier.kept(self.program)
        return outs


class Climb:
    """An XLA program under auto, each call timed toward inductor's compile (Tier.climb); it
    stands in for the program (its attributes)."""

    __slots__ = ("program", "tier")

    def __init__(self, program: "FusedProgram", tier: Tier) -> None:
        self.program, self.tier = program, tier

    def __getattr__(self, name: str) -> Any:
        return getattr(self.program, name)

    def __call__(self, inputs: list, *rest: Any) -> Any:
        start = time.perf_counter()
        outs = self.program(inputs, *rest)
        if outs is not None:
            self.tier.climb(time.perf_counter() - start, self)
        return outs


def candidate(gm: torch.fx.GraphModule) -> bool:
    """Whether a recorded graph can be fused at all: tensor outputs, and no in-place writes (the
    program is a functional compile; the replay keeps the writes' exact semantics)."""
    has_output = False
    for node in gm.graph.nodes:
        if node.op == "call_function":
            target = node.target
            if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
                return False
        elif node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
            has_output = any(isinstance(o, torch.fx.Node) for o in outs)
    return has_output
