"""`vmapbench memlimit`: the largest batch each per-sample-gradient method fits in a memory budget.

The fast-dpsgd comparison's second question: not how fast, but how big a batch fits. For every
per-sample-gradient workload (those offering `engine_chunked`, the engine's vmap with chunk_size,
which exists for exactly this) and each of its methods, a search over the batch size runs one
probe per candidate batch, each in a fresh process under the budget:

- CPU: `RLIMIT_DATA` = the probe's data segment after a warm-up at a small batch + the budget.
  Since Linux 4.7 RLIMIT_DATA counts every private writable mapping (brk heap and anonymous mmap,
  i.e. everything malloc hands out, torch's CPU allocator and XLA's included), but not shared
  libraries' code or file mappings, so an allocation beyond the budget fails at once with a clean
  error (torch: "DefaultCPUAllocator: can't allocate memory"; JAX: RESOURCE_EXHAUSTED) instead of
  the machine swapping. RLIMIT_AS would also count the libraries and reserved-but-unused address
  space (hundreds of MiB that never become memory); RLIMIT_RSS is not enforced by Linux at all.
  The warm-up (one call at batch 2: imports, JAX's backend, thread pools and caches) is excluded,
  so the budget is memory that grows with the batch: data, activations, per-sample gradients.
- CUDA: `torch.cuda.set_per_process_memory_fraction` caps PyTorch's caching allocator at what the
  warm-up reserved + the budget; JAX gets `XLA_PYTHON_CLIENT_MEM_FRACTION` = budget / device memory
  and no preallocation. CUDA probes run in fresh interpreters (CUDA does not survive a fork).

A probe builds the workload at that batch, calls the method once (trace/compile happen here)
and once more, timed. Probes are forked from a server process that only imports (torch, the
registry, jax), so each starts without paying a fresh interpreter's imports, and a
probe's memory, threads and failures end with it. A fitting probe also reports its peak memory
(the measure of every table: torch's allocator peak of the probe's inputs and calls, the CUDA
caching allocator's on a GPU, XLA's compiled memory analysis for jax; see
measuring.memory) and the parent its wall time; after two fitting batches the search extrapolates both to
the budget and the probe time limit and aims its next probes just under and just over that point
(`search`), so a limit takes ~5 probes instead of growing by 4x to it and bisecting. Only real
probes decide a row. A probe slower than `--probe-timeout` is killed and counts as a failure whose
cause is time, not memory, and the row says so. A rerun at the same commit resumes.

Results: results/memlimit/<machine>/<commit8>.json (schema in docs/guide/memlimit.md).
"""
from __future__ import annotations

import json
import math
import os
import re
import resource
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

DEFAULT_BUDGET = "1GiB"
WARMUP_BATCH = 2
BATCH_KEYS = ("batch", "n")  # the grid parameter that is the number of examples
SERVE_FLAG = "--serve"
PROBE_FLAG = "--probe"

# What a probe can report. "fits": ran within the budget; "over": ran out of memory (or was killed,
# e.g. by an allocator abort); "timeout": slower than the probe time limit; "error": failed for
# another reason (a bug: no batch size is meaningful then); "skip": the method is unavailable here.
OUTCOMES = ("fits", "over", "timeout", "error", "skip")


@dataclass
class Probe:
    batch: int
    outcome: str
    time_s: float | None = None  # the timed (second) call
    message: str | None = None
    peak_bytes: int | None = None  # allocator peak of the probe at its batch (after the warm-up); jax: XLA's
    wall_s: float | None = None  # the whole probe, as the probe time limit counts it (set by the parent)


@dataclass
class Search:
    """The outcome of one workload/method search: the largest batch that fit and why it stopped."""

    max_batch: int | None
    time_at_max_s: float | None
    status: str  # "ok" | "error" | "skip"
    reason: str | None
    limited_by: str | None  # "memory" | "time" | "cap" (the search cap was reached) | None
    probes: list[Probe] = field(default_factory=list)
    guided: int = 0  # how many probes were placed by the prediction


def parse_bytes(text: str) -> int:
    """'1GiB', '512MiB', '2G', '1500000000' -> bytes (binary units for K/M/G with or without 'iB')."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = units.get(t[-1:], 1)
    number = t[:-1] if t[-1:] in units else t
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError(f"memory budget {text!r} is not a size such as 1GiB, 512MiB or 1073741824") from None
    if value <= 0:
        raise ValueError(f"memory budget {text!r} must be positive")
    return int(value)


# The prediction jumps at most this factor past the largest fitting batch (two small batches say
# little about a batch 100x larger) and places at most this many probes per search (then plain
# growth and bisection).
MAX_JUMP = 16
GUIDED_PROBES = 4


def _trend_limit(points: list[tuple[int, float]], ceiling: float) -> float | None:
    """Batch at which the straight line through the two points reaches `ceiling`; None when the
    line does not grow (noise, or a cost that does not depend on the batch)."""
    (b0, y0), (b1, y1) = points
    slope = (y1 - y0) / (b1 - b0)
    return b1 + (ceiling - y1) / slope if slope > 0 else None


def predict_limit(fits: Sequence[Probe], budget: int | None, timeout: float | None) -> float | None:
    """The batch where the two largest fitting probes' linear trends of peak memory and probe time
    reach the budget and the time limit, whichever comes first; math.inf when
    neither grows; None with fewer than two fitting batches or no measurements. Only used to
    choose where to probe next: no row is ever recorded from it."""
    pair = sorted(fits, key=lambda p: p.batch)[-2:]
    if len(pair) < 2:
        return None
    limits: list[float] = []
    measured = False
    if budget is not None and all(p.peak_bytes is not None for p in pair):
        measured = True
        limits.append(_trend_limit([(p.batch, float(p.peak_bytes)) for p in pair], float(budget)) or math.inf)
    if timeout is not None and all(p.wall_s is not None for p in pair):
        measured = True
        limits.append(_trend_limit([(p.batch, p.wall_s) for p in pair], timeout) or math.inf)
    return min(limits) if measured else None


def search(probe: Callable[[int], Probe], start: int = 16, cap: int = 16384, growth: int = 4,
           precision: float = 0.25, on_probe: Callable[[Probe], None] | None = None,
           budget: int | None = None, timeout: float | None = None) -> Search:
    """Largest batch in [1, cap] for which `probe` fits, assuming fitting is monotone in the batch.

    The answer is always a bracket of real probes: the largest fitting batch and the smallest
    failing one within a factor 1 + `precision` (or adjacent), or a fit at `cap`. Where the next
    probe goes: after two fits, `predict_limit` extrapolates their peak memory (against `budget`)
    and probe time (against `timeout`) and the next probe lands just under the prediction, then
    one just above the largest fit closes the bracket; without a usable prediction (too few fits,
    a prediction contradicted by a probe, or GUIDED_PROBES used up) the batch grows by `growth`
    from `start` while probes fit and then bisects geometrically. An "error" or "skip" probe ends
    the search with that status.
    """
    if not (1 <= start <= cap) or growth < 2 or precision <= 0:
        raise ValueError(f"search needs 1 <= start <= cap, growth >= 2, precision > 0; got {start}, {cap}, {growth}, {precision}")
    probes: list[Probe] = []
    fits: list[Probe] = []
    failed: Probe | None = None
    guided = 0

    def closed(lo: int) -> bool:
        if failed is None:
            return lo == cap
        return failed.batch - lo <= 1 or failed.batch <= lo * (1 + precision)

    batch = start
    while True:
        p = probe(batch)
        if p.outcome not in OUTCOMES:
            raise ValueError(f"probe returned outcome {p.outcome!r}; expected one of {OUTCOMES}")
        if p.batch != batch:
            raise ValueError(f"probe for batch {batch} answered for batch {p.batch}")
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        if p.outcome in ("error", "skip"):
            return Search(None, None, p.outcome, p.message, None, probes, guided)
        if p.outcome == "fits":
            fits.append(p)
        elif failed is None or p.batch < failed.batch:
            failed = p
        lo = max((f.batch for f in fits), default=0)
        if closed(lo):
            break
        hi = failed.batch if failed is not None else None
        batch = _plain_next(lo, hi, cap, growth)
        if guided < GUIDED_PROBES:
            aimed = _aimed_next(lo, hi, cap, precision, predict_limit(fits, budget, timeout))
            if aimed is not None:
                batch, guided = aimed, guided + 1
    best = max(fits, key=lambda f: f.batch) if fits else None
    if failed is None:
        assert best is not None
        return Search(best.batch, best.time_s, "ok", f"fits at the search cap (batch {cap})", "cap", probes, guided)
    cause = "time" if failed.outcome == "timeout" else "memory"
    what = f"batch {failed.batch} " + ("exceeded the probe time limit" if cause == "time" else
                                         f"ran out of memory ({failed.message})")
    if best is None:
        return Search(None, None, "ok", f"not even batch {failed.batch - 1 or 1} fits: {what}", cause, probes, guided)
    return Search(best.batch, best.time_s, "ok", f"fits at batch {best.batch}; {what}", cause, probes, guided)


def _plain_next(lo: int, hi: int | None, cap: int, growth: int) -> int:
    """Grow by `growth` while nothing failed, else the geometric middle of the bracket."""
    if hi is None:
        return min(cap, lo * growth)
    mid = int(math.sqrt(lo * hi)) if lo else hi // 2
    return min(max(mid, lo + 1), hi - 1)


def _aimed_next(lo: int, hi: int | None, cap: int, precision: float, predicted: float | None) -> int | None:
    """The probe the prediction asks for, or None where it has nothing to say: just under the
    predicted limit, or just above the largest fit when the prediction is within the precision
    of it or below it (the probe that should fail and close the bracket). A prediction at or
    above a failing batch has been contradicted by a real probe: None."""
    if predicted is None or lo == 0 or (hi is not None and predicted >= hi):
        return None
    if predicted <= lo * (1 + precision):
        aim = lo * (1 + precision)
    else:
        aim = predicted / math.sqrt(1 + precision)
    top = hi - 1 if hi is not None else cap
    return int(min(max(aim, lo + 1), lo * MAX_JUMP, top))


# --- the probe (runs in a process forked from the server) -----------------------------------------

def _status_bytes(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field_name}; the CPU memory limit needs Linux")


def _is_out_of_memory(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, MemoryError) or any(
        key in text for key in ("out of memory", "can't allocate memory", "cannot allocate memory",
                                "resource_exhausted", "outofmemory", "not enough memory"))


def _release_memory() -> None:
    import gc

    from measuring.memory import release_free_heap

    gc.collect()
    release_free_heap()


def _cap_jax_on_cuda(budget: int) -> None:
    """XLA's GPU allocator takes a fraction of the device, fixed when jax starts: the budget's share
    (the warm-up included, unlike torch's cap, which is set after it)."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{min(1.0, budget / total):.4f}"


def _limit_memory(device: str, budget: int) -> None:
    """Cap what the rest of this process may allocate at its current use + `budget`."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved() + budget) / total))
        return
    limit = _status_bytes("VmData") + budget
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY and hard < limit:
        raise RuntimeError(f"the hard RLIMIT_DATA ({hard} bytes) is below the probe's limit ({limit} bytes)")
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def _lift_memory_limit() -> None:
    """Undo `_limit_memory` on CPU (the soft RLIMIT_DATA back up to the hard one)."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


def run_probe(workload: str, method: str, size: str, device: str, budget: int, threads: int) -> Probe:
    """Warm up at a small batch, cap memory at the current use + `budget`, then run `method` at the
    batch in `size` twice (the second call timed), measuring the allocator peak of the inputs and
    the two calls (measuring.memory.peak_bytes; jax: XLA's analysis of its program) for the
    search's prediction. On CPU that peak comes from torch's profiler, whose own buffers must not
    count against the cap: the capped run decides the fit (and gives the time), then the cap is
    lifted and the same run is made again to measure its peak. Meant to run in a process of its own."""
    if device == "cuda":  # before jax is imported: no preallocation, and the budget as JAX's share
        _cap_jax_on_cuda(budget)
    import torch

    import workloads
    from measuring.memory import peak_bytes, xla_memory

    torch.set_num_threads(threads)
    w = workloads.get(workload)
    params = w.params(size) if size in w.sizes else _parse(size)
    key = batch_key(w)
    batch = int(params[key])
    try:
        warm = w.setup({**params, key: WARMUP_BATCH}, device)
        w.run(method, warm)
        del warm
        _release_memory()
        _limit_memory(device, budget)
    except NotImplementedError as exc:
        return Probe(batch, "skip", message=str(exc))
    except Exception as exc:  # noqa: BLE001 - reported, the parent decides
        return Probe(batch, "error", message=f"warm-up failed: {type(exc).__name__}: {exc}")
    timed: list[float] = []
    states: list[Any] = []

    def at_batch() -> None:
        state = w.setup(params, device)
        states.append(state)
        w.run(method, state)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        w.run(method, state)
        if device == "cuda":
            torch.cuda.synchronize()
        timed.append(time.perf_counter() - start)

    try:
        if device == "cuda":
            peak = peak_bytes(at_batch, device)
        else:
            at_batch()
            _lift_memory_limit()
            peak = peak_bytes(at_batch, device)
        if method == "jax":  # XLA allocates past torch: its program's own figure
            peak = xla_memory(states[0].fn(method))["total"]
        return Probe(batch, "fits", time_s=timed[0], peak_bytes=peak)
    except NotImplementedError as exc:
        return Probe(batch, "skip", message=str(exc))
    except BaseException as exc:  # noqa: BLE001 - MemoryError included
        first_line = re.sub(r"^\[enforce fail at [^\]]*\] (err == 0\. )?", "", str(exc).splitlines()[0] if str(exc) else "")
        message = f"{type(exc).__name__}: {first_line[:160]}"
        if _is_out_of_memory(exc):
            return Probe(batch, "over", message=message)
        del exc  # its traceback holds the failed run's tensors
        if device == "cpu" and _passes_with_more_memory(at_batch, budget):
            return Probe(batch, "over", message=f"{message} (runs with {RETRY_BUDGET_FACTOR}x the budget: an "
                                                 "allocation failure the library did not report as one)")
        return Probe(batch, "error", message=message)


# Some libraries report a failed allocation as a generic error (XLA:CPU's YNNPACK: "INTERNAL:
# YNNPACK operation failed", with "allocate of <7> failed" only on stderr). Such a probe runs once
# more with this many times the budget: passing then means memory was the cause.
RETRY_BUDGET_FACTOR = 4


def _passes_with_more_memory(run: Callable[[], None], budget: int) -> bool:
    _release_memory()
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if soft != resource.RLIM_INFINITY:
        raised = soft + (RETRY_BUDGET_FACTOR - 1) * budget
        resource.setrlimit(resource.RLIMIT_DATA, (raised if hard == resource.RLIM_INFINITY else min(raised, hard), hard))
    try:
        run()
        return True
    except BaseException:  # noqa: BLE001 - any failure: not (only) memory
        return False


def _parse(size: str) -> dict[str, Any]:
    from workloads.base import parse_size_label

    return parse_size_label(size)


def _fork_probe(request: dict[str, Any]) -> Probe:
    """Run one probe in a forked child; kill it after request['timeout'] seconds."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe
        os.close(read_fd)
        code = 0
        try:
            p = run_probe(request["workload"], request["method"], request["size"], request["device"],
                          request["budget"], request["threads"])
            os.write(write_fd, json.dumps(asdict(p)).encode())
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    batch = int(_parse(request["size"])[request["batch_key"]])
    deadline = time.monotonic() + request["timeout"]
    chunks: list[bytes] = []
    try:
        while True:
            ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return Probe(batch, "timeout", message=f"killed after {request['timeout']:g} s")
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if chunks:
        return Probe(**json.loads(b"".join(chunks)))
    how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit code {os.WEXITSTATUS(status)}"
    # A child dying without a word under the memory cap is an allocator giving up (abort, OOM kill).
    return Probe(batch, "over", message=f"the probe process died ({how})")


def serve() -> int:
    """Probe server: import everything once, then fork one probe per request line on stdin and
    answer with one JSON line on stdout. It never computes itself, so forking it is safe (a
    process that ran OpenMP work can deadlock its forked children)."""
    import torch  # noqa: F401

    import workloads  # noqa: F401

    jax_imported = False
    for line in iter(sys.stdin.readline, ""):
        request = json.loads(line)
        if request["device"] == "cuda":
            probe = _spawn_probe(request)  # CUDA cannot be used in a forked child: a fresh interpreter
        else:
            if not jax_imported:
                _import_jax_for_forks(request["threads"])
                jax_imported = True
            probe = _fork_probe(request)
        sys.stdout.write(json.dumps(asdict(probe)) + "\n")
        sys.stdout.flush()
    return 0


def _spawn_probe(request: dict[str, Any]) -> Probe:
    """Run one probe in a fresh interpreter (CUDA probes); kill it after request['timeout'] seconds."""
    batch = int(_parse(request["size"])[request["batch_key"]])
    try:
        done = subprocess.run([sys.executable, "-m", "vmapbench.memlimit", PROBE_FLAG, json.dumps(request)],
                              capture_output=True, text=True, timeout=request["timeout"])
    except subprocess.TimeoutExpired:
        return Probe(batch, "timeout", message=f"killed after {request['timeout']:g} s")
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        return Probe(**json.loads(lines[-1]))
    return Probe(batch, "over", message=f"the probe process died (exit code {done.returncode}): {done.stderr[-200:]}")


def _import_jax_for_forks(threads: int) -> None:
    """Import jax (not its backend) here, with XLA's threads set like torch's, so probes of the
    jax method do not each pay the import; a missing jax only makes those probes skip."""
    import torch

    torch.set_num_threads(threads)
    try:
        from workloads.peers.jax_methods import load_jax

        load_jax("cpu")
    except NotImplementedError:
        pass


class ProbeServer:
    """The parent's handle on a probe server process (see `serve`)."""

    def __init__(self) -> None:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vmapbench.memlimit", SERVE_FLAG], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env,
        )

    def probe(self, **request: Any) -> Probe:
        assert self.process.stdin is not None and self.process.stdout is not None
        started = time.monotonic()
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the memlimit probe server exited (code {self.process.poll()}); see its stderr above")
        return Probe(**{**json.loads(line), "wall_s": round(time.monotonic() - started, 3)})

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)

    def __enter__(self) -> "ProbeServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --- the experiment -----------------------------------------------------------------------------

def batch_key(workload: Any) -> str:
    for key in BATCH_KEYS:
        if key in workload.grid:
            return key
    raise ValueError(f"workload {workload.name!r} has no batch parameter ({' or '.join(BATCH_KEYS)}) in its grid")


def per_sample_workloads() -> list[Any]:
    """The per-sample-gradient workloads: those offering `engine_chunked` (a per-sample-grads method)."""
    import workloads

    return [w for w in workloads.all_workloads() if "engine_chunked" in w.methods]


def fixed_size(workload: Any) -> dict[str, Any]:
    """The workload's first grid point without its batch parameter (e.g. {'d': 16})."""
    key = batch_key(workload)
    return {k: v for k, v in workload.params(workload.sizes[0]).items() if k != key}


def run_experiment(
    budget: int,
    device: str = "cpu",
    names: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    start: int = 16,
    cap: int = 16384,
    precision: float = 0.25,
    probe_timeout: float = 60.0,
    threads: int | None = None,
    log: Callable[[str], None] = print,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    done: Sequence[dict[str, Any]] = (),
    growth: int = 4,
) -> dict[str, Any]:
    """Search every (workload, method) pair and return the result document (see the module docstring);
    `on_row` gets the document so far after each pair (so an interrupted run still leaves a file).
    Pairs with a row in `done` (an earlier, interrupted run of the same experiment) are not searched
    again; their rows are kept."""
    import torch

    import workloads
    from workloads.base import size_label

    chosen = per_sample_workloads() if not names else [workloads.get(n) for n in names]
    threads = threads or default_threads()
    pairs = [(w, m) for w in chosen for m in w.methods if not methods or m in methods]
    rows: list[dict[str, Any]] = [dict(r) for r in done]
    have = {(r["workload"], r["method"], r["size"]) for r in rows}
    todo = [(w, m) for w, m in pairs if (w.name, m, size_label(fixed_size(w))) not in have]
    if len(todo) < len(pairs):
        log(f"resuming: {len(pairs) - len(todo)} of {len(pairs)} searches are already in the results file")
    started = time.perf_counter()
    searched = 0

    def document() -> dict[str, Any]:
        return {"machine": None, "commit": None, "torch": torch.__version__, "device": device, "budget_bytes": budget,
                "threads": threads, "probe_timeout_s": probe_timeout,
                "search": {"start": start, "cap": cap, "growth": growth, "precision": precision,
                           "guided_probes": GUIDED_PROBES, "max_jump": MAX_JUMP},
                "elapsed_s": round(time.perf_counter() - started, 1), "complete": searched == len(todo), "rows": rows}
    if not todo:
        return document()
    with ProbeServer() as server:
        for i, (w, method) in enumerate(todo, 1):
            fixed, key = fixed_size(w), batch_key(w)
            t0 = time.perf_counter()
            log(f"[{i}/{len(todo)}] {w.name} {method} ({size_label(fixed) or 'no other parameter'})")

            def probe(batch: int) -> Probe:
                size = size_label({**fixed, key: batch})
                return server.probe(workload=w.name, method=method, size=size, device=device, budget=budget,
                                    threads=threads, timeout=probe_timeout, batch_key=key)

            def show(p: Probe) -> None:
                detail = f"{p.time_s:.3f} s per call" if p.time_s is not None else (p.message or "")
                peak = f", peak +{p.peak_bytes / 2**20:.0f} MiB" if p.peak_bytes is not None else ""
                log(f"    {key}={p.batch}: {p.outcome} {detail[:160]}{peak} ({p.wall_s or 0:.1f} s probe)")

            result = search(probe, start=start, cap=cap, growth=growth, precision=precision, on_probe=show,
                            budget=budget, timeout=probe_timeout)
            searched += 1
            spent = time.perf_counter() - started
            log(f"    -> max {key} {result.max_batch} ({result.status}; {result.reason}) "
                f"in {time.perf_counter() - t0:.1f} s, {len(result.probes)} probes ({result.guided} aimed); "
                f"{spent / 60:.1f} min so far, ETA {spent / searched * (len(todo) - searched) / 60:.0f} min")
            rows.append({"workload": w.name, "method": method, "size": size_label(fixed),
                         "max_batch": result.max_batch, "time_at_max_s": result.time_at_max_s,
                         "status": result.status, "reason": result.reason, "limited_by": result.limited_by,
                         "probes": len(result.probes), "aimed_probes": result.guided,
                         "search_s": round(time.perf_counter() - t0, 1)})
            if on_row is not None:
                on_row(document())
    return document()


def result_path(root: Path, machine: str, commit: str) -> Path:
    return root / "results" / "memlimit" / machine / f"{commit[:8]}.json"


def resumable_rows(path: Path, expected: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of an earlier run's results file at `path` (none if it does not exist), provided it
    ran the same experiment: every key of `expected` (budget, device, probe time limit, search
    settings, threads) must match, else the rows would mix two experiments."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    differ = [f"{k}: {data.get(k)!r} there, {v!r} now" for k, v in expected.items() if data.get(k) != v]
    if differ:
        raise ValueError(f"{path} holds a run with other settings ({'; '.join(differ)}); rerun with the same "
                         "settings to resume it, or pass --force to search every pair again")
    return list(data["rows"])


def write_result(result: dict[str, Any], root: Path, machine: str, commit: str) -> Path:
    path = result_path(root, machine, commit)
    path.parent.mkdir(parents=True, exist_ok=True)
    written_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # the dashboard shows a machine's newest file
    path.write_text(json.dumps({**result, "machine": machine, "commit": commit, "written_at": written_at}, indent=1) + "\n")
    return path


def default_threads() -> int:
    """The probes' torch thread count: OMP_NUM_THREADS when set, else torch's default."""
    import torch

    return int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads()))


if __name__ == "__main__":  # a probe's process (PROBE_FLAG, SERVE_FLAG); the command is `vmapbench memlimit`
    if sys.argv[1:] == [SERVE_FLAG]:
        sys.exit(serve())
    if sys.argv[1:2] == [PROBE_FLAG]:
        req = json.loads(sys.argv[2])
        print(json.dumps(asdict(run_probe(req["workload"], req["method"], req["size"], req["device"], req["budget"],
                                          req["threads"]))))
        sys.exit(0)
    sys.exit(f"usage: python -m vmapbench.memlimit {PROBE_FLAG} REQUEST | {SERVE_FLAG} (a probe of `vmapbench memlimit`)")
