"""Time to N: the cumulative wall time from a fresh process to the N-th call, per method.

The curves, their measurement and their results files; `vmapbench time-to-n`
(vmapbench/commands/time_to_n.py) runs and writes them, the asv suite (suite/bench_time_to_n.py)
tracks a few N, the dashboard and `python -m vmapbench.docs_tables` read the files.

A user's process starts, calls a function N times and ends; what it pays is the sum, not the
steady state. Each curve runs in its own fresh process (workloads/time_to_n_child.py), which records:
- `imported_s`: from the launch of the process to the end of its imports (Python, torch, the
  registry or the user's module), `built_s`: to the data and the method built (jax is imported
  here, by the jax method's builder), and `first_call_at_s`: to the start of the first call;
- `seconds[i]`: from the start of the first call to the return of call `ns[i]` (the table's
  figure), and `points` the same on a denser grid of N (the dashboard's curves). Time from process
  start to the N-th call is `first_call_at_s + seconds[i]`.
Curves: the default path (`engine`; `engine_compiled` where a workload has no `engine`) with a cold
inductor cache (a new empty TORCHINDUCTOR_CACHE_DIR) and warm (the same folder, a second process),
torch.func, jax.jit and torch.compile (cold and warm) where the workload has them; on request the
default path with its fused tier on another compiler or off (`engine+xla`, `engine+auto`,
`engine+inductor`, `engine+off`: TIER_VARIANTS). Every process gets its own empty cache folder unless it is a warm curve. A curve stops at the first N whose
calls took longer than `max_seconds` in all (its `note` says so), but never before `min_calls`
calls; the process is killed if it overruns the budget by the `grace_s` allowance for start-up
and one long call.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

DEFAULT_NS: tuple[int, ...] = (1, 2, 5, 30, 300, 3000)
DEFAULT_MAX_SECONDS = 20.0
DEFAULT_GRACE_S = 300.0
RESULTS_DIR = "time_to_n"
# The curve's process, run by its file: a package's __init__ (this one's imports the registry)
# would run before its first clock reading.
CHILD = Path(__file__).resolve().with_name("time_to_n_child.py")
# The default path: the first of these the workload has.
OURS: tuple[str, ...] = ("engine", "engine_compiled")
# The engine as a user gets it with no explicit compile: what the default-path headline compares.
DEFAULT_PATH = "engine"
# Curves that are not an explicit compile; every other method of a results file is one
# (engine.compile, torch.compile, and whatever compiler a later file records).
NOT_EXPLICIT: frozenset[str] = frozenset({DEFAULT_PATH, "torch_func", "jax"})
# torch.compile: the first of these the workload has.
TORCH_COMPILE: tuple[str, ...] = ("torch_func_compiled", "loop_compiled")
# Methods that write inductor's cache, so a warm curve (a second process on the same folder) says something.
INDUCTOR_METHODS = frozenset(OURS + TORCH_COMPILE + ("engine+auto", "engine+inductor"))
# The default path with its fused tier set otherwise: curve id -> (the method run, variables of its
# process). The engine reads them at import (engine/fused.py), so each curve shows what one
# compiler of the tier pays at which N; `engine` itself runs the tier as this process's variables set it.
TIER_VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "engine+xla": ("engine", {"VMAPBENCH_FUSED_BACKEND": "xla"}),
    "engine+auto": ("engine", {"VMAPBENCH_FUSED_BACKEND": "auto"}),
    "engine+inductor": ("engine", {"VMAPBENCH_FUSED_BACKEND": "inductor"}),
    "engine+off": ("engine", {"VMAPBENCH_FUSED": "0"}),
}
LABELS = {"engine": "ours", "engine_compiled": "ours (engine.compile)", "torch_func": "torch.func",
          "jax": "jax.jit", "torch_func_compiled": "torch.compile", "loop_compiled": "torch.compile (loop)",
          "engine+xla": "ours, tier by XLA", "engine+auto": "ours, tier by XLA then inductor",
          "engine+inductor": "ours, tier by inductor", "engine+off": "ours, tier off"}


def record_grid(ns: Sequence[int]) -> list[int]:
    """The N at which a curve records its cumulative time: the asked N and a 1-1.5-2-3-5-7 series
    per decade up to the largest, so the dashboard's lines and crossovers have points between."""
    top = max(ns)
    dense = {m * 10 ** e for e in range(int(math.log10(top)) + 1) for m in (1, 1.5, 2, 3, 5, 7)}
    return sorted({int(n) for n in dense if n <= top and n == int(n)} | set(ns))


@dataclass
class Curve:
    """One method's time to N in one fresh process."""

    workload: str
    size: str
    method: str
    cache: str  # 'cold': a new empty inductor cache folder; 'warm': the folder a cold curve filled
    status: str = "done"  # done | budget (stopped at --max-seconds) | skipped | failed | wrong | killed
    note: str | None = None
    ns: list[int] = field(default_factory=list)  # asked N reached
    seconds: list[float] = field(default_factory=list)  # from the first call's start to call ns[i]'s return
    points: list[list[float]] = field(default_factory=list)  # [N, seconds] on the record grid, and the last call
    calls: int = 0
    pid: int | None = None
    entered_s: float | None = None  # launch -> the child's first line (the interpreter's start)
    imported_s: float | None = None  # launch -> imports done
    built_s: float | None = None  # launch -> data and method built
    first_call_at_s: float | None = None  # launch -> first call starts
    cache_dir: str | None = None
    cache_entries: int | None = None  # files in the cache folder when the process started
    cache_entries_after: int | None = None
    # With --first-calls K: per call of the first K, {n, s (that call's seconds), modules (how many it
    # imported), imported (their packages)}
    first_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return curve_label(self.method, self.cache)

    def at(self, n: int) -> float | None:
        """Seconds from the first call to the return of the n-th (None: not reached)."""
        return dict(zip(self.ns, self.seconds)).get(n)


def describe_call(call: dict[str, Any], packages: int | None = None) -> str:
    """One of a curve's first calls in words: 'call N: S s', and what it imported (the first
    `packages` of its packages, all when None)."""
    text = f"call {call['n']}: {call['s']:.3g} s"
    if call["modules"]:
        shown = call["imported"] if packages is None else call["imported"][:packages]
        more = ", ..." if len(shown) < len(call["imported"]) else ""
        text += f", imported {call['modules']} modules: {', '.join(shown)}{more}"
    return text


def run_method(method: str) -> tuple[str, dict[str, str]]:
    """The workload method a curve runs and the variables its process gets (TIER_VARIANTS)."""
    return TIER_VARIANTS.get(method, (method, {}))


def curve_label(method: str, cache: str) -> str:
    name = LABELS.get(method, method)
    return f"{name}, {cache} cache" if method in INDUCTOR_METHODS else name


def curves_of(methods: Sequence[str]) -> list[tuple[str, str]]:
    """(method, cache) of every curve a workload with `methods` gets, in table order."""
    out: list[tuple[str, str]] = []
    if "jax" in methods:
        out.append(("jax", "cold"))
    if "torch_func" in methods:
        out.append(("torch_func", "cold"))
    for group in (OURS, TORCH_COMPILE):
        method = next((m for m in group if m in methods), None)
        if method is not None:
            out += [(method, "cold"), (method, "warm")]
    return out


def measure_curve(spec: dict[str, Any], cache_dir: str, timeout_s: float,
                  env: dict[str, str | None] | None = None) -> Curve:
    """Run one curve in a fresh process (`spec` as workloads/time_to_n_child.py reads it, without the
    launch time and output file, which this adds) with TORCHINDUCTOR_CACHE_DIR=`cache_dir`; `env`
    is added to this process's environment (a None value removes the variable)."""
    curve = Curve(spec.get("workload") or spec.get("factory") or "?", spec.get("size") or "-", spec["method"],
                  spec["cache"], cache_dir=cache_dir)
    with tempfile.TemporaryDirectory(prefix="vmapbench-ttn-out-") as folder:
        out = Path(folder) / "events.jsonl"
        child_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
        child_env.update(TORCHINDUCTOR_CACHE_DIR=cache_dir, OMP_NUM_THREADS=str(spec["threads"]))
        launched = time.monotonic()
        full = {**spec, "launched": launched, "out": str(out)}
        # A session of its own, so that a kill on timeout also ends what the child started
        # (inductor's compile workers, the fused tier's worker).
        proc = subprocess.Popen([sys.executable, str(CHILD), json.dumps(full)],
                                env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
            crashed = proc.returncode != 0
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            _, stderr = proc.communicate()
            crashed = False
            curve.status = "killed"
            curve.note = (f"killed after {timeout_s:.0f} s (--max-seconds plus --grace-s): a call or the "
                          "start-up ran that long")
        events = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    grid_points = []
    for event in events:
        if event["event"] == "start":
            curve.pid, curve.entered_s = event["pid"], event["entered_s"]
            curve.cache_entries = event["cache_entries"]
        elif event["event"] == "point":
            grid_points.append([event["n"], event["s"]])
        elif event["event"] == "call":
            curve.first_calls.append({k: event[k] for k in ("n", "s", "modules", "imported")})
        elif event["event"] == "end":
            curve.status, curve.note = event["status"], event.get("note")
            for key in ("calls", "imported_s", "built_s", "first_call_at_s", "cache_entries_after"):
                setattr(curve, key, event.get(key))
    curve.points = grid_points
    asked = set(spec["ns"])
    curve.ns = [int(n) for n, _ in grid_points if n in asked]
    curve.seconds = [s for n, s in grid_points if n in asked]
    if crashed and not any(e["event"] == "end" for e in events):
        tail = (stderr or "").strip().splitlines()
        curve.status = "failed"
        curve.note = f"the process exited with status {proc.returncode}: {tail[-1][:300] if tail else 'no output'}"
    return curve


def _kill_group(pgid: int) -> None:
    """SIGKILL the process group of a child not yet reaped (so its id is still the group's)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def measure(workload: str | None, size: str | None, methods: Sequence[tuple[str, str]], *,
            factory: str | None = None, ns: Sequence[int] = DEFAULT_NS, max_seconds: float = DEFAULT_MAX_SECONDS,
            threads: int = 1, device: str = "cpu", grace_s: float = DEFAULT_GRACE_S, check: bool = True,
            progress: Any = None, env: dict[str, str | None] | None = None, first_calls: int = 0,
            min_calls: int = 1) -> list[Curve]:
    """Every (method, cache) curve of one workload at `size` (or of the `factory`'s methods), one
    fresh process each (`env` added to its environment; None removes a variable). A cold curve gets a new empty cache folder;
    the warm curve of the same method runs next, on the folder its cold curve left. The folders are
    removed afterwards. `first_calls` K: the first K calls' own seconds and imports (Curve.first_calls).
    `min_calls`: the budget stops no curve before this many calls (what a caller that needs them asks)."""
    ns = sorted(set(int(n) for n in ns))
    if not ns or ns[0] < 1:
        raise ValueError(f"N must be positive integers, got {list(ns)}")
    if min_calls < 1:
        raise ValueError(f"min_calls must be at least 1, got {min_calls}")
    base = {"workload": workload, "size": size, "factory": factory, "ns": ns, "record": record_grid(ns),
            "max_seconds": max_seconds, "threads": threads, "device": device, "check": check,
            "first_calls": first_calls, "min_calls": min_calls}
    folders: dict[str, str] = {}
    curves = []
    try:
        for method, cache in methods:
            if cache == "warm" and method not in folders:
                raise ValueError(f"the warm curve of {method} needs its cold curve first; got {list(methods)}")
            if cache == "cold":
                folders[method] = tempfile.mkdtemp(prefix="vmapbench-ttn-inductor-")
            if progress is not None:
                progress(f"{workload or factory} [{size or '-'}] {curve_label(method, cache)} ...")
            runs, variables = run_method(method)
            curve = measure_curve({**base, "method": runs, "cache": cache}, folders[method],
                                  timeout_s=max_seconds + grace_s, env={**(env or {}), **variables})
            curve.method = method
            curves.append(curve)
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)
    return curves


def crossovers(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    """(N, seconds) where curve `a` and curve `b` (lists of [N, seconds]) cross: at an N both have
    where one is ahead before and behind after, interpolated on log-log axes between the two N."""
    bs = {int(n): s for n, s in b}
    common = [(int(n), s, bs[int(n)]) for n, s in a if int(n) in bs and s > 0 and bs[int(n)] > 0]
    out = []
    for (n0, a0, b0), (n1, a1, b1) in zip(common, common[1:]):
        d0, d1 = math.log(a0 / b0), math.log(a1 / b1)
        if d0 == 0 and (not out or out[-1][0] != n0):
            out.append((float(n0), a0))
        elif d0 * d1 < 0:
            t = d0 / (d0 - d1)
            ln = math.log(n0) + t * (math.log(n1) - math.log(n0))
            ls = math.log(a0) + t * (math.log(a1) - math.log(a0))
            out.append((math.exp(ln), math.exp(ls)))
    return out


def load(path: str | Path) -> tuple[dict[str, Any], list[Curve]]:
    """A results file and its curves; ValueError naming the file when it is not one."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        curves = [Curve(**c) for c in doc["curves"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a time-to-N results file ({exc}); write one with "
                         "`vmapbench time-to-n --all --write`") from exc
    return doc, curves


def newest(results_dir: str | Path) -> list[Path]:
    """Per machine under results/time_to_n/, its newest file (by `written_at`, then name)."""
    root = Path(results_dir) / RESULTS_DIR
    out = []
    for machine_dir in sorted(p for p in root.glob("*") if p.is_dir()):
        files = []
        for path in machine_dir.glob("*.json"):
            try:
                written = str(json.loads(path.read_text(encoding="utf-8")).get("written_at") or "")
            except (OSError, ValueError, AttributeError):
                written = ""
            files.append((written, path.name, path))
        if files:
            out.append(max(files)[2])
    return out


def by_workload(curves: Iterable[Curve]) -> dict[tuple[str, str], list[Curve]]:
    out: dict[tuple[str, str], list[Curve]] = {}
    for c in curves:
        out.setdefault((c.workload, c.size), []).append(c)
    return out


def over_jax(curves: Sequence[Curve], n: int, method: str, cache: str = "cold",
             from_start: bool = False) -> float | None:
    """The (method, cache) curve's time to `n` over jax.jit's (None where either is missing or did
    not reach n); `from_start`: both counted from their process's launch (imports and setup included)."""
    mine = next((c for c in curves if c.method == method and c.cache == cache), None)
    jax = next((c for c in curves if c.method == "jax"), None)
    if mine is None or jax is None or mine.at(n) is None or not jax.at(n):
        return None
    if not from_start:
        return mine.at(n) / jax.at(n)
    return (mine.first_call_at_s + mine.at(n)) / (jax.first_call_at_s + jax.at(n))


def ours_over_jax(curves: Sequence[Curve], n: int, from_start: bool = False) -> float | None:
    """The default path's cold time to `n` over jax.jit's (engine.compile's where the workload has
    no default path); see over_jax."""
    ours = next((c.method for c in curves if c.method in OURS and c.cache == "cold"), None)
    return None if ours is None else over_jax(curves, n, ours, "cold", from_start)


def explicit_curves(curves: Iterable[Curve]) -> list[tuple[str, str]]:
    """(method, cache) of every explicit-compile curve among `curves`, engine's first, then in
    the order the file holds them."""
    seen: list[tuple[str, str]] = []
    for c in curves:
        if c.method not in NOT_EXPLICIT and (c.method, c.cache) not in seen:
            seen.append((c.method, c.cache))
    return sorted(seen, key=lambda mc: not mc[0].startswith("engine"))


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def markdown(doc: dict[str, Any], curves: Sequence[Curve]) -> str:
    """The default path (cold cache) over jax.jit per workload and N, from the first call and from
    process start; each explicit compile over jax.jit; then every curve's seconds per N, then what
    stopped or skipped a curve."""
    ns = [int(n) for n in doc["ns"]]
    groups = by_workload(curves)
    default = {k: g for k, g in groups.items() if any(c.method == DEFAULT_PATH for c in g)}
    lines = []
    ratios = any(c.method == "jax" for c in curves)
    if not ratios:  # (a --fn model's jax.jit curve under another name, say)
        lines += ["No jax.jit curve to divide by: the ratio tables need a method named `jax` (with --fn, "
                  "FUNCTION('jax') returns the jax.jit call).", ""]
    titles = (("from the first call", False), ("from process start (imports and setup included)", True))
    for title, from_start in titles if ratios else ():
        lines += [f"The default path (cold cache) / jax.jit, time to N {title}:", "",
                  "| workload | size | " + " | ".join(f"N={n}" for n in ns) + " |",
                  "| --- | --- | " + " | ".join("---" for _ in ns) + " |"]
        for (workload, size), group in default.items():
            cells = [_s(over_jax(group, n, DEFAULT_PATH, "cold", from_start)) for n in ns]
            lines.append(f"| {workload} | {size} | " + " | ".join(cells) + " |")
        lines.append("")
    explicit = [(k, g, explicit_curves(g)) for k, g in groups.items()]
    explicit = [(k, g, e) for k, g, e in explicit if e]
    if explicit and ratios:
        lines += ["Explicit compiles and the fused tier's other compilers / jax.jit, time to N from the first call:", "",
                  "| workload | size | compile | " + " | ".join(f"N={n}" for n in ns) + " |",
                  "| --- | --- | --- | " + " | ".join("---" for _ in ns) + " |"]
        for (workload, size), group, chosen in explicit:
            for method, cache in chosen:
                cells = [_s(over_jax(group, n, method, cache)) for n in ns]
                lines.append(f"| {workload} | {size} | {curve_label(method, cache)} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["Seconds from the first call's start to the N-th call's return (fresh process each; "
              "`start s`: from launch to the first call, imports and setup included):", ""]
    lines += ["| workload | curve | start s | " + " | ".join(f"N={n}" for n in ns) + " |",
              "| --- | --- | --- | " + " | ".join("---" for _ in ns) + " |"]
    notes = []
    for (workload, size), group in groups.items():
        for c in group:
            cells = [_s(c.at(n)) for n in ns]
            lines.append(f"| {workload} | {c.label} | {_s(c.first_call_at_s)} | " + " | ".join(cells) + " |")
            if c.note:
                notes.append(f"- {workload} [{size}] {c.label}: {c.status}: {c.note}")
    if notes:
        lines += ["", "Curves that stopped early, were skipped or failed:", ""] + notes
    return "\n".join(lines)


def header(doc: dict[str, Any]) -> str:
    load = doc.get("load_before"), doc.get("load_after")
    loads = " ".join(f"{v[0]:.2f}" if v else "?" for v in load)
    note = str(doc.get("note") or "").strip()
    return (f"Measured on `{doc['machine']}` ({doc.get('cpu')}, {doc.get('cores')} cores) at commit "
            f"{doc['commit'][:8]}, torch {doc['torch']}, Python {doc.get('python')}, {doc['threads']} thread(s), "
            f"{doc['device']}, budget {doc['max_seconds']:g} s of calls per curve, written {doc['written_at']}; "
            f"1-minute load average before / after: {loads}." + (f" {note.rstrip('.')}." if note else ""))
