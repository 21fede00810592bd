"""The regression gate: base vs head on a noisy shared machine it may never have seen, and its own calibration.

    vmapbench gate BASE HEAD                    # compare two commits (what `make continuous` runs)
    vmapbench gate --calibrate                  # A/A runs and planted slowdowns (PLANTS)

How it measures (docs/design/gate.md, which shows the measured noise): on a shared box,
wall-clock times of two processes of one commit differ most; CPU time of the measuring process
(one intra-op thread) and ratios of methods timed interleaved in one process move less, but more
than a change the gate must see; instructions executed in a region under callgrind barely move.
So:

- each commit is extracted (`git archive`) into a temporary folder, head twice (`twin`: the same
  commit in a second folder: a time signal is called only where both copies agree, and their
  spread is the run's own A/A evidence); the measuring processes
  (vmapbench/gate_probe.py) load every side into one interpreter side by side and run
  `os.cpu_count()` at a time: a time process and a count process under valgrind, then, on the
  core the count leaves, a second time process that takes the workloads the first has not
  reached, from the registry's last back (`jobs`);
- the time process times every workload of the registry (engine, engine_eager, engine_traced,
  torch_func, loop at the first quick size) of base, twin and head interleaved round by round in
  CPU seconds, rounds chosen by each signal's own variance, plus the per-op overhead chain against
  native; the gated time signals are the ratios (method / torch.func, loop / method) and the per-op
  overhead, and head/base of each is taken round by round (`paired_change`): what the machine's
  load does to a round falls on both sides of it;
- the count process counts the instructions of each engine method's steady-state call of the per-op
  chain and of COUNTED_WORKLOADS (measuring/counted.py), base and head; gated with a 3% floor
  (stats.COUNT_FLOOR). No valgrind: skipped with the reason, never a failure;
- a time signal's floor is the machine's calibrated one (results/noise/<machine>.json, from
  --calibrate) or, on a machine without one, this run's own evidence: twin/head of the same
  signals (`evidence_floors`); never a blanket default;
- per signal, head/base gets an interval (the bootstrap of the median of the round-by-round ratios
  for times, the extremes of the counts), and stats.gate_verdict calls it "slower" only when the
  whole interval lies beyond the floor; "unchanged" where a time signal's 90% interval lies
  within it (an equivalence test, TOST at 5% a side); an interval reaching across the floor is
  "inconclusive", never "slower".

Exit codes, as asv continuous: 0 nothing regressed (improvements are fine), 1 a gated signal is
slower (only those are named, with their intervals), 2 a case failed at head or a measuring
process died; and 3, too noisy to decide: the run's own noise (head against its twin) is so
large that its floors could not see the smallest slowdown the gate is calibrated to catch, and
no exact signal (instruction count, allocator peak) is slower. It prints the noise measured.
"""
from __future__ import annotations

import compileall
import contextlib
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from measuring import malloc, stats
from measuring.counted import COUNTED_WORKLOADS
# Imported with the gate, not when the runs are read: by then the checkout may have changed.
from suite.names import class_name_of  # the suite's class of a workload (at base or head only)
from vmapbench.gate_probe import whole_cycles

PROBE = Path(__file__).resolve().with_name("gate_probe.py")
# The gate's own measuring code, relative to its checkout: what every probe process loads (the
# probe, the suite it imports under an alias, and the measuring/ that suite brings with it).
MEASURING_CODE = ("vmapbench/gate_probe.py", "suite", "measuring")
# Time signals: every workload of the registry (the measured commit's), methods
# gate_probe.GATE_METHODS at the first quick size. Count signals (~2 min of one core): the per-op
# chain and measuring.counted.COUNTED_WORKLOADS.
# CPU seconds of one workload's timed rounds in a time process at most. Its set-up and first calls
# (mostly the traces of engine and engine_traced) come on top and cost more than the rounds, so
# the budget is small: the whole gate must fit a CI job.
PROBE_BUDGET_S = 0.4
# The sides of a comparison, in the order the time process loads them: base, head, and head again
# from a second folder. In one process a side can run one method slower than the others for a
# whole workload (a few signals a run, any side), so head alone slowed would be a false alarm on
# a machine without a calibration (docs/lab/2026-11-27-gate-calibration.md). A time
# signal is "slower" only where both copies of head are (`compare`): one copy's slowness is no
# regression, and the copies' spread is the evidence that sets the floors of a machine without a
# calibration file. (base slowed so makes head look faster: no failure.)
SIDES = ("base", "head", "twin")
# The sides counted: counts repeat to a fraction of a percent, they need no twin.
COUNT_SIDES = ("base", "head")
# The sides whose allocator peaks are taken: exact bytes, the same in every process (a twin would
# read head's again).
MEMORY_SIDES = ("base", "head")
PROBE_TIMEOUT_S = 900
# The floor of a time signal from the run's own evidence: EVIDENCE_MARGIN x the larger of its own
# twin-vs-head |log ratio| and the EVIDENCE_QUANTILE of that of its pool (its metric and method).
# (The pool's largest instead did not stop the false alarms above: one slowed copy of head is
# handled by asking both copies, not by the floor.)
EVIDENCE_MARGIN = 1.5
EVIDENCE_QUANTILE = 0.9
EVIDENCE_POOL_MIN = 8
# Too noisy to decide (exit 3): this run's twin noise (Outcome.twin_noise) above the one at which
# an evidence floor (EVIDENCE_MARGIN x the noise) reaches the smallest planted slowdown the gate
# must catch (PLANTS' smallest factor). Time signals then cannot tell "unchanged" from "slower".
TOO_NOISY_EXIT = 3
OUT_DIR = Path(".asv") / "continuous"
PLANT_MARK = "# --- planted by `vmapbench gate --calibrate`"


# --- trees ---------------------------------------------------------------------------------------


class GateError(SystemExit):
    """The gate could not compare (a bad revision or argument): exit 2 with the message, never
    1, which means "a regression" to `make continuous` and CI."""

    def __init__(self, message: str) -> None:
        print(message, file=sys.stderr)
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message

def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def resolve(root: Path, rev: str) -> str:
    try:
        return git(root, "rev-parse", "--verify", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise GateError(f"gate: {rev!r} is not a commit of {root} (try HEAD, HEAD~1, origin/main)") from None


def extract(root: Path, commit: str, dest: Path) -> Path:
    """The tree of `commit` written to `dest` (git archive: no worktree, nothing to clean in .git),
    its modules compiled to bytecode once: every measuring process imports each tree, and one
    under valgrind compiles many times slower (a process that may not write bytecode,
    PYTHONDONTWRITEBYTECODE, would compile the sources anew in each). A file changed later (a
    plant) no longer matches its bytecode's recorded size and time and is compiled as it loads."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "engine", "workloads"],
                             cwd=root, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    compileall.compile_dir(dest, quiet=2)
    return dest


# Where the engine spends a call, as users get it: the eager dispatch of every op on a batched
# tensor, the replay of a recorded graph (engine.trace and engine.compile), and every call of an
# automatically traced function (the default path, whose steady state replays inline). (module
# path, class, method) of each: the sites of the "engine" plant.
PLANT_SITES = (("engine/_dispatch.py", "VmapMode", "__torch_dispatch__"),
               ("engine/trace.py", "TracedFunction", "_replay"),
               ("engine/autotrace.py", "AutoTraced", "_call"))
# What `--plant-at` can slow: "engine" (PLANT_SITES, every engine call), "transform:NAME" (every
# call of the functions engine.NAME returns, e.g. transform:hessian), "workloads:PATTERNS" (the
# engine methods' calls of the workloads whose names match the comma-separated fnmatch PATTERNS),
# "memory:PATTERNS" (not a slowdown: every call of those workloads holds FACTOR x its allocator peak).
PLANT_TARGETS = ("engine", "transform:NAME", "workloads:PATTERNS", "memory:PATTERNS")
# The slowdowns `gate --calibrate` plants: kind -> (factor, target). The sensitivity
# targets: a uniform 1.1x, one transform at 1.2x, the engine calls of one family of workloads at 1.5x.
PLANTS: dict[str, tuple[float, str]] = {
    "uniform": (1.1, "engine"),
    "uniform-1.3": (1.3, "engine"),
    "hessian": (1.2, "transform:hessian"),
    "families": (1.5, "workloads:nn_*,bayes_*,tutorial_*"),
}


def _plant_prelude(factor: float, what: str) -> str:
    """The helper every plant appends: `_plant_slowed(fn)` runs fn and then burns (factor - 1) x the
    CPU time it took, in Python bytecode (so an instruction count grows with it too), counted once
    for the outermost of nested slowed calls."""
    return f"""

{PLANT_MARK}: {what} takes {factor}x its CPU time.
import threading as _plant_threading
import time as _plant_time

_plant_state = _plant_threading.local()


def _plant_slowed(fn):
    def slowed(*args, **kwargs):  # a plain function: bound as a method where it replaces one
        if getattr(_plant_state, "depth", 0):
            return fn(*args, **kwargs)
        _plant_state.depth = 1
        start = _plant_time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _plant_state.depth = 0
            until = _plant_time.process_time() + (_plant_time.process_time() - start) * ({factor} - 1)
            while _plant_time.process_time() < until:
                for _ in range(100):
                    pass
    slowed.__name__ = "_plant_slow"
    return slowed
"""


def plant_slowdown(tree: Path, factor: float, target: str = "engine") -> None:
    """Make `target` (see PLANT_TARGETS) of the extracted tree take `factor` x its CPU time: a
    busy-wait proportional to the time the call itself took, appended to the tree's modules: a
    known slowdown for the calibration and self-tests (never committed; results stay exact)."""
    if factor <= 1:
        raise GateError(f"gate: --plant {factor}: a planted slowdown factor is above 1 (e.g. 1.1)")
    kind, _, arg = target.partition(":")
    if kind == "engine" and not arg:
        for relpath, cls, method in PLANT_SITES:
            path = tree / relpath
            source = path.read_text()
            if (f"class {cls}(" not in source and f"class {cls}:" not in source) or f"def {method}(" not in source:
                raise GateError(f"gate: cannot plant a slowdown: {path} has no {cls}.{method} any more; "
                                f"update vmapbench.gate.PLANT_SITES to the engine's per-call entry points")
            path.write_text(source + _plant_prelude(factor, f"each outermost {cls}.{method}")
                            + f"\n\n{cls}.{method} = _plant_slowed({cls}.{method})\n")
    elif kind == "transform" and arg.isidentifier():
        path = tree / "engine" / "__init__.py"
        source = path.read_text()
        if arg not in source:
            raise GateError(f"gate: cannot plant a slowdown of engine.{arg}: {path} does not export it")
        path.write_text(source + _plant_prelude(factor, f"every call of a function engine.{arg} returns") + f"""

_plant_transform = {arg}


def {arg}(*args, **kwargs):
    return _plant_slowed(_plant_transform(*args, **kwargs))
""")
    elif kind == "workloads" and arg:
        path = tree / "workloads" / "__init__.py"
        patterns = [p for p in arg.split(",") if p]
        path.write_text(path.read_text() + _plant_prelude(factor, f"the engine calls of workloads {arg}") + f"""

import fnmatch as _plant_fnmatch

from workloads.base import all_workloads as _plant_all


def _plant_run(run):
    slowed = _plant_slowed(run)
    return lambda method, state: (slowed if method.startswith("engine") else run)(method, state)


for _plant_w in _plant_all():
    if any(_plant_fnmatch.fnmatch(_plant_w.name, _p) for _p in {patterns!r}):
        _plant_w.run = _plant_run(_plant_w.run)
""")
    elif kind == "memory" and arg:
        plant_memory(tree, factor, arg)
    else:
        raise GateError(f"gate: --plant-at {target!r}: expected one of {', '.join(PLANT_TARGETS)}")


def plant_memory(tree: Path, factor: float, patterns: str) -> None:
    """Make every steady call of the workloads matching `patterns` (fnmatch, comma-separated) hold
    (factor - 1) x its own allocator peak more while it runs: a batched buffer of that size kept
    alive through the call, as a change that keeps one more intermediate alive would. The peak is
    the unplanted call's (measuring.memory.alloc_peak_bytes, the gate checkout's: a measured tree
    holds engine/ and workloads/ alone), taken at each call `Workload.prepare` makes (the first
    call and automatic tracing's warm-up: never a call the gate times or counts), the last one kept."""
    path = tree / "workloads" / "__init__.py"
    wanted = [p for p in patterns.split(",") if p]
    path.write_text(path.read_text() + f"""

{PLANT_MARK}: workloads {patterns} hold {factor}x their allocator peak.
import fnmatch as _plant_fnmatch

import torch as _plant_torch

from workloads.base import all_workloads as _plant_all
from measuring.memory import alloc_peak_bytes as _plant_peak


def _plant_held(workload):
    run, prepare = workload.run, workload.prepare
    extra = {{}}  # (method, id(state)) -> bytes held through each steady call
    preparing = []

    def held(method, state):
        if preparing:
            out = []
            extra[method, id(state)] = int(({factor} - 1) * _plant_peak(lambda: out.append(run(method, state))))
            return out[0]
        buffer = _plant_torch.empty(extra.get((method, id(state)), 0), dtype=_plant_torch.uint8)
        try:
            return run(method, state)
        finally:
            del buffer

    def measured_prepare(method, state):
        preparing.append(method)
        try:
            return prepare(method, state)
        finally:
            preparing.pop()

    workload.run, workload.prepare = held, measured_prepare


for _plant_w in _plant_all():
    if any(_plant_fnmatch.fnmatch(_plant_w.name, _p) for _p in {wanted!r}):
        _plant_held(_plant_w)
""")


# --- measuring -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    """One measuring process: `kind` (time or count), `index` among its kind. Every process loads
    the sides it measures (SIDES, or COUNT_SIDES for a count) side by side. `share`: a time
    process that takes its workloads from a list shared with the other time process ("front":
    the next unclaimed from the registry's first on, "back": from its last back), each workload
    timed by the one that claimed it; "": every workload."""

    kind: str
    index: int = 0
    share: str = ""

    @property
    def label(self) -> str:
        return f"{self.kind}-{self.index}"

    @property
    def sides(self) -> tuple[str, ...]:
        return COUNT_SIDES if self.kind == "count" else SIDES


def jobs(counting: bool) -> list[Job]:
    """The processes of one comparison, run side by side on two cores: the time process and the
    count process, then on the core the count leaves free a second time process that takes the
    workloads the first has not reached (the count takes less time than the timing: the core
    would idle); without counts a second time process from the start (more rounds of the same
    pairs). Both time processes take the next unclaimed workload in the registry's order, so they
    end together but for the registry's last few workloads (the compiled family's, timed on
    their references only, are short): taken from the two ends, the last workload left was
    wherever they met, one of the registry's longest as often as not, and one process timed it
    alone while the other's core idled."""
    if counting:
        return [Job("time", 0, "front"), Job("count"), Job("time", 1, "front")]
    return [Job("time", 0), Job("time", 1)]


def snapshot_measuring(dest: Path) -> Path:
    """The gate's measuring code (MEASURING_CODE) copied into `dest`, compiled to bytecode as the
    trees are, and the path of the probe there. Every process of one run loads that copy, so a
    checkout edited or switched to another branch while the run lasts cannot hand its later
    processes other code than its first ones (a probe that loads a half-written file dies)."""
    root = PROBE.parents[1]
    for rel in MEASURING_CODE:
        source, copy = root / rel, dest / rel
        if source.is_dir():
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
    compileall.compile_dir(dest, quiet=2)
    return dest / PROBE.relative_to(root)


def probe_command(out: Path, job: Job, trees: Mapping[str, Path], library: Path | None = None,
                  probe: Path = PROBE) -> list[str]:
    """The command of one measuring process: `probe` (the gate's own, or its snapshot) run on the trees."""
    runner = ("import runpy, sys; sys.argv = ['gate_probe'] + sys.argv[1:]; "
              f"sys.exit(runpy.run_path({str(probe)!r}, run_name='__main__'))")
    sides = [arg for side in job.sides for arg in ("--tree", f"{side}={trees[side]}")]
    if job.kind == "count":
        from measuring import counts

        assert library is not None
        return [*counts.command(out.parent / job.label), sys.executable, "-c", runner, *sides, "--count", str(library),
                "--workloads", ",".join(COUNTED_WORKLOADS), "--out", str(out)]
    # Memory is exact: one process measures each workload's (the one that times it, where they share).
    memory = ["--memory", ",".join(MEMORY_SIDES)] if job.index == 0 or job.share else []
    shared = ["--claims", str(out.parent / "claims"), *(["--from-end"] if job.share == "back" else [])] \
        if job.share else []
    overhead = ["--overhead"] if job.index == 0 else []
    return [sys.executable, "-c", runner, *sides, "--workloads", "all", *shared, *overhead, *memory,
            "--budget", str(PROBE_BUDGET_S), "--clock", "cpu", "--out", str(out)]


def probe_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the probe puts each side's tree first on sys.path itself
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"  # CPU time of one thread: no spin-waits
    env["PYTHONHASHSEED"] = "0"  # the same dict and set orders in every process: counts repeat
    malloc.in_env(env)  # malloc keeps its pages (measuring/malloc.py): page faults moved pairs by 2-4x
    # The replay tier, never a fused program loaded mid-timing from what an earlier run left on
    # disk (see suite/__init__.py): a fresh runner and this machine measure the same paths.
    env["VMAPBENCH_FUSED"] = "0"
    # Guards' native check built at once (engine.guardstate.NATIVE_GUARDS), not after a time: the
    # counts repeat and both sides measure the settled check.
    env["VMAPBENCH_NATIVE_GUARDS"] = "now"
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.cwd() / ".inductor-cache"))
    return env


def _finish(job: Job, out: Path, proc: subprocess.Popen) -> dict[str, dict]:
    """side -> that side's output of the process (a process that died: a "fatal" entry for each)."""
    try:
        text, _ = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        text, _ = proc.communicate()
        text += f"\n(killed after {PROBE_TIMEOUT_S} s)"
    try:
        data = json.loads(out.read_text())
    except (OSError, ValueError):
        data = {"fatal": f"the {job.label} measuring process exited {proc.returncode} without output:\n{text[-2000:]}"}
    if "fatal" in data:
        return {side: {"fatal": data["fatal"], "process": job.label} for side in job.sides}
    per_side = {side: {**data["sides"].get(side, {}), "process": job.label,
                       "process_cpu_s": data.get("process_cpu_s")} for side in job.sides}
    if job.kind == "count":
        from measuring import counts

        dumped = counts.read_dumps(out.parent / job.label)
        for side, got in per_side.items():
            got["counts"] = {label: dumped[f"{side}|{label}"] for label in got.pop("regions", [])
                             if f"{side}|{label}" in dumped}
    return per_side


def run_jobs(trees: Mapping[str, Path], workdir: Path, log: Any = print, parallel: int | None = None,
             counting: str | None = None) -> dict[str, list[dict]]:
    """side -> its outputs of every process (time processes in start order, then the count one if
    any), `parallel` processes at a time (default: the machine's cores). `counting` is None or
    why counts are off."""
    library = None
    if counting is None:
        from measuring import counts

        library = counts.build_requests(workdir / "callgrind")
    todo = jobs(counting is None)
    probe = snapshot_measuring(workdir / "gate-code")
    parallel = parallel or max(1, os.cpu_count() or 1)
    finished: dict[str, dict[str, dict]] = {}
    running: list[tuple[Job, Path, subprocess.Popen, float]] = []
    started = time.time()
    while todo or running:
        while todo and len(running) < parallel:
            job = todo.pop(0)
            out = workdir / f"{job.label}.json"
            (workdir / job.label).mkdir(parents=True, exist_ok=True)
            proc = subprocess.Popen(probe_command(out, job, trees, library, probe), cwd=workdir, env=probe_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            running.append((job, out, proc, time.time()))
        time.sleep(0.2)
        for item in [r for r in running if r[2].poll() is not None]:
            running.remove(item)
            job, out, proc, began = item
            finished[job.label] = _finish(job, out, proc)
            cpu = next(iter(finished[job.label].values())).get("process_cpu_s")
            log(f"gate: {job.label} done in {time.time() - began:.0f} s"
                + (f" ({cpu:.0f} CPU s)" if isinstance(cpu, (int, float)) else "")
                + f", {time.time() - started:.0f} s since the first")
    order = [j.label for j in jobs(counting is None)]
    return {side: [finished[label][side] for label in order if side in finished.get(label, {})] for side in trees}


# --- signals -------------------------------------------------------------------------------------

def _per_round(values: Sequence[float], reference: Iterable[float], invert: bool = False) -> list[float]:
    return [(r / v if invert else v / r) for v, r in zip(values, reference)]


def signals(probe: Mapping[str, Any]) -> dict[str, list[float]]:
    """Signal name (asv point name) -> its samples in one probe output.

    Time probes, one sample per round, whole cycles of the rounds' orders (`whole_cycles`; the
    ratios taken round by round: the calls of one round ran moments apart): track_ratio_vs_torch_func (method / torch_func), track_speedup_vs_loop
    (loop / method), track_overhead_us_per_op ((method - native) / ops, us), gated; time_run and
    time_chain (CPU s per call), reported; track_alloc_peak_bytes (bytes per call, one sample per
    measured call), gated. Count probes, one sample per counted call: instructions (of the call's
    region), gated. A reference timed apart from the rounds (the probe's "apart": one that runs the
    same code on every side) divides every round by its median, on every side alike.
    """
    cycle = int(probe.get("cycle", 2))
    out: dict[str, list[float]] = {}
    for workload, sizes in probe.get("times", {}).items():
        cls = class_name_of(workload)
        copied = set(probe.get("shared", {}).get(workload, ()))
        apart = set(probe.get("apart", {}).get(workload, ()))
        for size, by_method in sizes.items():
            seconds = {method: (_listed(t) if method in apart else whole_cycles(_listed(t), cycle))
                       for method, t in by_method.items()}
            # A reference's figure per round; one timed apart from the rounds (the same for every
            # side) divides every round by its median.
            per_round = {name: itertools.repeat(float(stats.median(t))) if name in apart else t
                         for name, t in seconds.items()}
            for method, t in seconds.items():
                if method in copied:  # the first side's reference, read here as a denominator only
                    continue
                point = f"'{size}', '{method}', 'cpu'"
                out[f"bench_workloads.{cls}.time_run({point})"] = t
                if method != "torch_func" and "torch_func" in seconds:
                    out[f"bench_workloads.{cls}.track_ratio_vs_torch_func({point})"] = \
                        _per_round(t, per_round["torch_func"])
                if method != "loop" and "loop" in seconds:
                    out[f"bench_workloads.{cls}.track_speedup_vs_loop({point})"] = \
                        _per_round(t, per_round["loop"], invert=True)
    for workload, sizes in probe.get("memory", {}).items():
        for size, by_method in sizes.items():
            for method, values in by_method.items():
                out[f"bench_workloads.{class_name_of(workload)}.track_alloc_peak_bytes('{size}', '{method}', 'cpu')"] = \
                    [float(v) for v in _listed(values)]
    chain = {method: whole_cycles(_listed(t), cycle) for method, t in probe.get("overhead", {}).items()}
    if chain:
        n_ops = probe.get("overhead_ops") or _chain_ops()
    for method, t in chain.items():
        out[f"bench_overhead.PerOpOverhead.time_chain('{method}', 'cpu')"] = t
        if method != "native" and "native" in chain:
            out[f"bench_overhead.PerOpOverhead.track_overhead_us_per_op('{method}', 'cpu')"] = \
                [(v - n) / n_ops * 1e6 for v, n in zip(t, _listed(chain["native"]))]
    for label, n in probe.get("counts", {}).items():
        parts = label.split("|")
        if parts[0] == "chain" and len(parts) == 3:
            name = f"bench_overhead.PerOpOverhead.instructions('{parts[1]}', 'cpu')"
        elif parts[0] == "wl" and len(parts) == 5:
            name = f"bench_workloads.{class_name_of(parts[1])}.instructions('{parts[2]}', '{parts[3]}', 'cpu')"
        else:
            continue
        out.setdefault(name, []).append(float(n))
    return out


def _chain_ops() -> int:
    """Ops per call of the per-op chain, for a probe output that does not say (importing the suite's
    module imports torch, seconds the gate's own process otherwise does without)."""
    from suite.bench_overhead import N_OPS

    return N_OPS


def _listed(t: Any) -> list[float]:
    return list(t) if isinstance(t, (list, tuple)) else [t]


def failures(probes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """What failed in any of these probe outputs: case -> first error message."""
    failed: dict[str, str] = {}
    for probe in probes:
        if "fatal" in probe:
            failed.setdefault("measuring process", probe["fatal"].strip().splitlines()[-1][:300])
        for case, message in probe.get("errors", {}).items():
            failed.setdefault(case, message)
    return failed


@dataclass(frozen=True)
class Row:
    """One signal's comparison. `source` says where its floor came from: "calibrated" (the machine's
    file), "evidence" (this run's twin-vs-base spread: the same commit loaded twice), "count" (the count floor), "policy"
    (reported signals), "none" (no evidence: a time signal that cannot be decided)."""

    name: str
    gated: bool
    verdict: str
    floor: float
    change: stats.Estimate
    base: stats.Estimate
    head: stats.Estimate
    source: str = "policy"


def _median(values: Sequence[float]) -> float:
    return float(stats.median(values))


Runs = Mapping[str, Mapping[str, list[float]]]
"""One side's signals per measuring process: process label -> signal name -> samples (a time
signal's samples are per round, aligned with the other sides' samples of the same process)."""


def round_ratios(base: Runs, other: Runs, name: str) -> list[float]:
    """other/base of signal `name`, round by round, over every process both sides share."""
    out: list[float] = []
    for process, signals_b in base.items():
        b, o = signals_b.get(name), other.get(process, {}).get(name)
        if not b or not o or len(b) != len(o):
            continue
        for x, y in zip(b, o):
            if not (x > 0 and y > 0):
                raise ValueError(f"{name}: a round's value is not positive ({x}, {y}): no ratio")
            out.append(y / x)
    return out


def paired_change(base: Runs, head: Runs, name: str, confidence: float = stats.CONFIDENCE) -> stats.Estimate:
    """head/base of a time signal: the median of its pair-by-pair ratios (base and head timed
    moments apart in one process) with stats.paired_ratio's interval at `confidence`."""
    ratios = round_ratios(base, head, name)
    if not ratios:
        raise ValueError(f"{name}: no round measured on both sides")
    return stats.paired_ratio(ratios, confidence)


def _equivalence(base: Runs, head: Runs, name: str) -> stats.Estimate | None:
    """The change of a time signal at stats.EQUIVALENCE_CONFIDENCE (what "unchanged" tests)."""
    try:
        return paired_change(base, head, name, stats.EQUIVALENCE_CONFIDENCE)
    except (ValueError, ZeroDivisionError):
        return None


def twin_spread(base: Runs, twin: Runs) -> dict[str, float]:
    """Per time signal, |log| of the median twin/base ratio of two copies of the same commit
    loaded in one process (the gate passes head and its twin: the run's own A/A evidence);
    signals without a positive pairing are absent."""
    spread: dict[str, float] = {}
    names = set().union(*base.values()) if base else set()
    for name in names:
        if stats.is_exact(name):
            continue
        try:
            ratios = round_ratios(base, twin, name)
        except ValueError:
            continue
        if ratios:
            spread[name] = abs(math.log(_median(ratios)))
    return spread


def _method(name: str) -> str:
    """The method a signal measures ('engine', 'engine_traced', ...; '' when it has none)."""
    _, params = stats.split_point(name)
    return params[-2].strip("'") if len(params) >= 2 else ""


def evidence_floors(spread: Mapping[str, float]) -> dict[str, float]:
    """Per gated time signal with a twin-vs-base spread: EVIDENCE_MARGIN x max(its own spread, the
    EVIDENCE_QUANTILE of its pool's spreads), as a fraction. One signal's single A/A difference is
    a small sample of its noise; its pool's spreads say how far such differences reach. The pool
    is the signals of its metric and method (automatic tracing's replays, which walk scattered
    guard state, move several times more under load than the traced and eager calls: one pool
    for all would give the quiet methods the noisy one's floor), or of its metric alone when that
    holds fewer than EVIDENCE_POOL_MIN signals."""
    gated = {name: d for name, d in spread.items() if stats.is_gated(name) and not stats.is_exact(name)}
    pools: dict[tuple[str, str], list[float]] = {}
    for name, d in gated.items():
        pools.setdefault((stats.metric_of(name), _method(name)), []).append(d)
        pools.setdefault((stats.metric_of(name), "*"), []).append(d)

    def pool(name: str) -> list[float]:
        own = pools[stats.metric_of(name), _method(name)]
        return own if len(own) >= EVIDENCE_POOL_MIN else pools[stats.metric_of(name), "*"]

    return {name: _margined(max(d, stats.quantile(pool(name), EVIDENCE_QUANTILE))) for name, d in gated.items()}


def _margined(spread: float) -> float:
    """A floor from an A/A |log ratio|: EVIDENCE_MARGIN times it, as a fraction."""
    return math.expm1(EVIDENCE_MARGIN * spread)


def count_change(base: Sequence[float], head: Sequence[float]) -> stats.Estimate:
    """head/base of instruction counts: the ratio of medians, its interval the extremes of every
    pairing (counts repeat to a fraction of a percent; no bootstrap is needed or meaningful)."""
    value = _median(head) / _median(base)
    return stats.Estimate(value, min(min(head) / max(base), value), max(max(head) / min(base), value),
                          min(len(base), len(head)))


def _agreed(a: str, b: str) -> str:
    """The verdict of two copies of head: theirs where they agree, else "inconclusive"."""
    return a if a == b else "inconclusive"


def compare(base_runs: Runs, head_runs: Runs, machine: str | None, root: Path | None = None,
            twin_runs: Runs | None = None) -> list[Row]:
    """One Row per signal present on both sides (per-process signal dicts, see `signals` and `Runs`).
    `twin_runs`: head's second copy. A gated time signal measured on it too gets the verdict both
    copies agree on against base (else "inconclusive"), and shows the change nearer 1 of the two."""
    names = sorted(set().union(*base_runs.values()) & set().union(*head_runs.values())) if base_runs and head_runs else []
    spread = twin_spread(head_runs, twin_runs) if twin_runs else {}
    evidence = evidence_floors(spread)
    rows = []
    for name in names:
        b = [x for run in base_runs.values() for x in run.get(name, [])]
        h = [x for run in head_runs.values() for x in run.get(name, [])]
        gated = stats.is_gated(name)
        try:
            change = count_change(b, h) if stats.is_exact(name) else paired_change(base_runs, head_runs, name)
        except (ValueError, ZeroDivisionError):  # e.g. a per-op overhead at or below native: no ratio
            continue
        calibrated = stats.calibrated_floor(name, machine, root) if gated else None
        if not gated:
            floor, source = stats.noise_floor(name, machine, root), "policy"
        elif stats.is_memory(name):  # exact: the same bytes in every process, on every machine
            floor, source = stats.MEMORY_FLOOR, "memory"
        elif stats.is_count(name):
            floor, source = (calibrated, "calibrated") if calibrated is not None else (stats.COUNT_FLOOR, "count")
        elif calibrated is not None:  # the A/A runs' history, and this run's own twin of this signal
            floor, source = max(calibrated, _margined(spread.get(name, 0.0))), "calibrated"
        elif name in evidence:
            floor, source = evidence[name], "evidence"
        else:
            floor, source = math.inf, "none"
        hib = stats.higher_is_better(name)
        timed = gated and not stats.is_exact(name)
        equivalence = _equivalence(base_runs, head_runs, name) if timed else None
        decided = stats.gate_verdict(change, floor, hib, equivalence) if gated else stats.verdict(change, floor, hib)
        if timed and twin_runs:
            try:  # (ValueError: the twin has no round of this signal)
                other = paired_change(base_runs, twin_runs, name)
            except (ValueError, ZeroDivisionError):
                other = None
            if other is not None:
                decided = _agreed(decided, stats.gate_verdict(other, floor, hib,
                                                              _equivalence(base_runs, twin_runs, name)))
                change = min((change, other), key=lambda c: abs(math.log(c.value)))
        rows.append(Row(name, gated, decided, floor, change, stats.estimate(b), stats.estimate(h), source))
    return rows


def regressions(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.gated and r.verdict == "slower"]


def smallest_plant() -> float:
    """The smallest slowdown factor of PLANTS: what the gate is calibrated to catch."""
    return min(factor for factor, _ in PLANTS.values())


def decidable_noise() -> float:
    """The largest twin noise (a fraction) at which the gate still decides: an evidence floor
    of EVIDENCE_MARGIN x this noise equals smallest_plant()."""
    return math.expm1(math.log(smallest_plant()) / EVIDENCE_MARGIN)


# --- reporting -----------------------------------------------------------------------------------

def _short(name: str) -> str:
    return name.replace("bench_workloads.", "").replace("bench_overhead.", "").replace(", 'cpu')", ")")


def _floor(r: Row) -> str:
    return "-" if math.isinf(r.floor) else f"{r.floor:.1%}" if r.floor < 0.1 else f"{r.floor:.0%}"


def format_rows(rows: Sequence[Row]) -> str:
    width = max((len(_short(r.name)) for r in rows), default=10)
    lines = [f"{'signal':<{width}}  {'verdict':<12}  {'head/base [99% interval]':<30}  floor (source)"]
    for r in rows:
        lines.append(f"{_short(r.name):<{width}}  {r.verdict:<12}  {stats.relative_change(r.change):<30}  "
                     f"{_floor(r)} ({r.source})")
    return "\n".join(lines)


def tally(rows: Iterable[Row]) -> dict[str, int]:
    """Gated signals per verdict."""
    out = {v: 0 for v in stats.GATE_VERDICTS}
    for r in rows:
        if r.gated:
            out[r.verdict] = out.get(r.verdict, 0) + 1
    return out


def markdown(rows: Sequence[Row], failed: Mapping[str, str], title: str, skipped: Sequence[str] = (),
             too_noisy: float | None = None) -> str:
    """A GitHub job summary: the verdict, the called changes, then every signal in a <details>.
    `too_noisy`: the run's noise where the gate answered "too noisy to decide" (exit TOO_NOISY_EXIT)."""
    gated = [r for r in rows if r.gated]
    slower = regressions(rows)
    faster = [r for r in gated if r.verdict == "faster"]
    counts = tally(rows)
    head = ("**failed**" if failed else f"**too noisy to decide** (this run's noise {too_noisy:.1%})"
            if too_noisy is not None else "**regression**" if slower else "**no regression**")
    lines = [f"### {title}", "",
             f"{head}: {len(gated)} gated signals ({sum(stats.is_count(r.name) for r in gated)} instruction counts, "
             f"{sum(stats.is_memory(r.name) for r in gated)} allocator peaks), "
             f"{len(slower)} slower, {len(faster)} faster, {counts['inconclusive']} inconclusive "
             f"(called only when the whole 99% interval of head/base lies beyond the signal's noise floor; "
             f"inconclusive: the interval reaches across the floor, too wide to decide).", ""]
    lines += [f"- skipped: {reason}" for reason in skipped] + ([""] if skipped else [])
    if failed:
        lines += ["| failed case | error |", "|---|---|"]
        lines += [f"| `{case}` | {message.replace('|', '/')} |" for case, message in failed.items()]
        lines.append("")

    def table(selected: Sequence[Row]) -> list[str]:
        out = ["| signal | verdict | head/base [99% interval] | floor (source) | base | head |",
               "|---|---|---|---|---|---|"]
        out += [f"| `{_short(r.name)}` | {r.verdict} | {stats.relative_change(r.change)} | {_floor(r)} ({r.source}) | "
                f"{r.base.format()} | {r.head.format()} |" for r in selected]
        return out

    called = slower + faster
    if called:
        lines += table(called) + [""]
    lines += ["<details><summary>every gated signal</summary>", ""] + table(gated) + ["", "</details>", ""]
    reported = [r for r in rows if not r.gated]
    lines += ["<details><summary>raw CPU times per call (reported, not gated)</summary>", ""] + table(reported)
    lines += ["", "</details>", ""]
    return "\n".join(lines)


# --- one comparison ------------------------------------------------------------------------------

@dataclass
class Outcome:
    rows: list[Row]
    failed: dict[str, str]
    skipped: list[str] = field(default_factory=list)
    # This run's own noise: the median over gated time signals of |head's twin / head - 1|, the
    # same commit timed in the same rounds (None without a twin). Floors widen with it.
    twin_noise: float | None = None

    @property
    def too_noisy(self) -> bool:
        """This run's noise is beyond what its time signals can decide (decidable_noise)."""
        return self.twin_noise is not None and self.twin_noise > decidable_noise()

    @property
    def exit_code(self) -> int:
        if self.failed:
            return 2
        slower = regressions(self.rows)
        if any(stats.is_exact(r.name) for r in slower):
            return 1
        if self.too_noisy:
            return TOO_NOISY_EXIT
        return 1 if slower else 0


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="vmapbench-gate-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(trees: Mapping[str, Path], workdir: Path, log: Any = print, counting: str | None = None) -> dict[str, list[dict]]:
    """Probe outputs per side (the seam tests replace); `counting`: None, or why counts are skipped."""
    return run_jobs(trees, workdir, log=log, counting=counting)


def _runs(probes: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Process label -> signals of one side's probe outputs (those that did not die)."""
    return {str(p.get("process", i)): signals(p) for i, p in enumerate(probes) if "fatal" not in p}


def outcome(base_probes: Sequence[Mapping[str, Any]], head_probes: Sequence[Mapping[str, Any]],
            machine: str | None, root: Path | None = None, skipped: Sequence[str] = (),
            twin_probes: Sequence[Mapping[str, Any]] = ()) -> Outcome:
    failed_head = failures(head_probes)
    head_runs, twin_runs = _runs(head_probes), _runs(twin_probes)
    rows = compare(_runs(base_probes), head_runs, machine, root, twin_runs)
    spread = [d for name, d in twin_spread(head_runs, twin_runs).items() if stats.is_gated(name)] if twin_runs else []
    return Outcome(rows, failed_head, list(skipped), math.expm1(_median(spread)) if spread else None)


def compare_commits(root: Path, base: str, head: str, machine: str | None, plant: float | None = None,
                    plant_at: str = "engine", log: Any = print, counts_off: str | None = None) -> Outcome:
    """Extract both commits, measure them in side-by-side processes, compare."""
    from measuring import counts

    base_sha, head_sha = resolve(root, base), resolve(root, head)
    counting = counts_off or counts.available()
    if counting:
        log(f"gate: {counting}")
    with scratch() as tmp:
        # Three copies even for A/A (base == head): each side runs its own modules from its own files.
        shas = {"base": base_sha, "head": head_sha, "twin": head_sha}
        trees = {side: extract(root, shas[side], tmp / side) for side in SIDES}
        if plant:  # into both copies of head
            plant_slowdown(trees["head"], plant, plant_at)
            plant_slowdown(trees["twin"], plant, plant_at)
        probes = measure(trees, tmp, log, counting)
    failed_base = failures(probes["base"])
    if failed_base:
        log("gate: at base, these failed (not counted against head): "
            + "; ".join(f"{case}: {message}" for case, message in failed_base.items()))
    return outcome(probes["base"], probes["head"], machine, root, [counting] if counting else [], probes.get("twin", ()))


def default_json(root: Path, machine: str, base_sha: str, head_sha: str) -> Path:
    """Where a comparison's rows go: under .asv/, apart from results/ (make bench's reference runs)."""
    return root / OUT_DIR / machine / f"{base_sha[:8]}-{head_sha[:8]}.json"


def report(result: Outcome, base: str, head: str, summary_md: Path | None, json_out: Path | None) -> None:
    slower = regressions(result.rows)
    gated = [r for r in result.rows if r.gated]
    shown = [r for r in gated if r.verdict != "unchanged"]
    print(format_rows(shown) if shown else "gate: every gated signal unchanged")
    counts = tally(result.rows)
    print(f"\ngate: {len(gated)} gated signals ({sum(stats.is_count(r.name) for r in gated)} instruction counts, "
          f"{sum(stats.is_memory(r.name) for r in gated)} allocator peaks): "
          + ", ".join(f"{n} {v}" for v, n in counts.items()) + " (the table shows all but the unchanged)")
    if result.twin_noise is not None:
        print(f"gate: this run's noise, head against its twin (the same commit in the same rounds): "
              f"{result.twin_noise:.1%} median over the gated time signals; floors are at least 1.5x each one's own")
    for reason in result.skipped:
        print(f"gate: skipped: {reason}")
    if result.failed:
        print(f"\ngate: {len(result.failed)} benchmarks failed at {head}:")
        for case, message in result.failed.items():
            print(f"  {case}: {message}")
    if result.exit_code == TOO_NOISY_EXIT:
        print(f"\ngate: TOO NOISY TO DECIDE: this run's noise, {result.twin_noise:.1%} (head against its twin), "
              f"is above {decidable_noise():.1%}, where its floors could no longer see a "
              f"{smallest_plant()}x slowdown, and no instruction count or allocator peak is "
              f"slower. Run it again on a quieter machine (exit {TOO_NOISY_EXIT})."
              + (f" Time signals that read slower: {', '.join(_short(r.name) for r in slower)}." if slower else ""))
    elif slower:
        print(f"\ngate: PERFORMANCE DECREASED: {len(slower)} gated signals slower beyond their noise floor:")
        for r in slower:
            print(f"  {_short(r.name)}: {stats.relative_change(r.change)} (floor {_floor(r)}, {r.source})")
    elif not result.failed:
        print(f"\ngate: no regression ({len(gated)} gated signals)")
    if summary_md is not None:
        with summary_md.open("a") as fh:
            fh.write(markdown(result.rows, result.failed, f"Benchmarks gate: {base} -> {head}", result.skipped,
                              result.twin_noise if result.exit_code == TOO_NOISY_EXIT else None) + "\n")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"base": base, "head": head, "exit_code": result.exit_code,
                                        "failed": result.failed, "skipped": result.skipped,
                                        "twin_noise": result.twin_noise,
                                        "rows": [asdict(r) for r in result.rows]}, indent=1))


# --- calibration ---------------------------------------------------------------------------------

SPIN = """
import os
while os.getppid() == {parent}:
    for _ in range(200_000):
        pass
"""


@contextlib.contextmanager
def busy_core(enabled: bool) -> Iterator[None]:
    """Keep one core busy with another process (a Python spin loop) for the block. The loop ends by
    itself once this process is gone (killed, the finally below never ran: a spinner left from an
    interrupted calibration kept a core busy through the next one's "idle" runs)."""
    if not enabled:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", SPIN.format(parent=os.getpid())])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


COUNT_MIN_FLOOR = 0.01


def calibrated_floors(aa_runs: Sequence[Sequence[Row]], margin: float = 1.5) -> dict[str, float]:
    """Per gated signal: margin x the largest A/A point deviation (log scale), as a fraction; at
    least COUNT_MIN_FLOOR for a count. No blanket minimum for time signals: at gate time a time
    signal's floor is the larger of this and 1.5x the run's own twin-vs-head |log ratio| of that signal.

    The interval guards against the noise within a comparison; the floor guards against what
    moves between comparisons (load phases, process layout), which only A/A runs can show.
    """
    worst: dict[str, float] = {}
    for rows in aa_runs:
        for r in rows:
            if r.gated:
                worst[r.name] = max(worst.get(r.name, 0.0), abs(math.log(r.change.value)))
    return {name: round(max(COUNT_MIN_FLOOR if stats.is_count(name) else 0.0, math.expm1(margin * w)), 4)
            for name, w in sorted(worst.items()) if not stats.is_memory(name)}


def signal_family(name: str) -> str:
    """The families of gated signals (docs/results/index.md#noise-floors): counts of the per-op chain, of the eager and of the
    replayed (automatic or traced) engine calls; time ratios vs torch.func, vs the loop; per-op time."""
    metric = stats.metric_of(name)
    method = _method(name)
    if stats.is_memory(name):
        return "memory: allocator peak"
    if metric == "instructions":
        if "PerOpOverhead" in name:
            return "count: per-op chain"
        return "count: eager calls" if method == "engine_eager" else "count: replayed calls"
    return {"track_ratio_vs_torch_func": "time: ratio vs torch.func", "track_speedup_vs_loop": "time: speed-up vs loop",
            "track_overhead_us_per_op": "time: per-op overhead"}.get(metric, metric)


def floors_by_family(floors: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """Per signal family: how many signals, the median and the largest floor (the smallest
    regression the gate catches for a typical and for the noisiest signal of the family)."""
    groups: dict[str, list[float]] = {}
    for name, f in floors.items():
        groups.setdefault(signal_family(name), []).append(f)
    return {fam: {"signals": len(v), "median": round(stats.median(v), 4), "max": round(max(v), 4)}
            for fam, v in sorted(groups.items())}


def is_engine_signal(name: str) -> bool:
    """Whether a signal measures an engine method (or the engine's per-op overhead)."""
    _, params = stats.split_point(name)
    return any(p.strip("'").startswith("engine") for p in params)


@dataclass
class CalibrationRun:
    kind: str  # "aa", "aa-busy", or "planted-<plant>" (see PLANTS)
    flagged: list[str]
    exit_code: int
    seconds: float
    verdicts: dict[str, int] = field(default_factory=dict)  # gated signals per verdict (`tally`)
    # Gated signals whose head/base point estimate lies beyond its floor, either way (an A/A's
    # should be none: every ratio within its noise), as (name, ratio, floor).
    beyond: list[tuple[str, float, float]] = field(default_factory=list)
    twin_noise: float | None = None  # Outcome.twin_noise
    commit: str = ""  # HEAD, compared with itself
    load: float | None = None  # the machine's 1-minute load average as the run started
    failed: dict[str, str] = field(default_factory=dict)  # what failed at head (an exit 2): case -> message


def beyond_floor(rows: Iterable[Row]) -> list[tuple[str, float, float]]:
    """(name, head/base, floor) of every gated signal whose point estimate lies beyond its finite
    floor in either direction."""
    return [(r.name, r.change.value, r.floor) for r in rows if r.gated and not math.isinf(r.floor)
            and abs(math.log(r.change.value)) > math.log1p(r.floor)]


def summarize_calibration(runs: Sequence[CalibrationRun]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in dict.fromkeys(r.kind for r in runs):
        selected = [r for r in runs if r.kind == kind]
        flagged_runs = sum(1 for r in selected if r.flagged)
        names = sorted({n for r in selected for n in r.flagged})
        out[kind] = {"runs": len(selected), "flagged_runs": flagged_runs,
                     "rate": flagged_runs / len(selected), "named": names,
                     "only_engine_named": all(is_engine_signal(n) for n in names),
                     "failed_runs": sum(1 for r in selected if r.exit_code == 2),
                     "seconds": [round(r.seconds) for r in selected],
                     "verdicts": [r.verdicts for r in selected],
                     "beyond_floor": [len(r.beyond) for r in selected],
                     "twin_noise": [r.twin_noise for r in selected]}
    return out


def record_run(path: Path, machine: str, run: CalibrationRun) -> None:
    """Append one calibration run to `path` ({"machine", "runs": [...]}, created if missing): the
    committed record of the gate's checks that docs/ renders (`vmapbench.docs_tables`)."""
    doc = json.loads(path.read_text()) if path.exists() else {"machine": machine, "runs": []}
    if doc["machine"] != machine:
        raise GateError(f"gate: --record {path} holds runs of {doc['machine']!r}, not {machine!r}: use another file")
    doc["runs"].append({**asdict(run), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def calibrate(root: Path, machine: str, n_aa: int, n_busy: int, n_planted: int, plants: Sequence[str],
              write: bool = True, log: Any = print, progress: Path | None = None,
              record: Path | None = None) -> dict[str, Any]:
    """A/A comparisons of HEAD (machine as it is, then one core busy) and planted-slowdown ones.

    False alarms are counted with the floors in effect before this calibration (the file if any,
    else the run's own evidence: what a fresh machine gets); the floors written are then derived
    from these A/A runs and used for the planted runs, so detection is measured with what future
    gates will use. With write=False (--keep-floors) the file is left as it is (and a machine
    without one keeps gating on evidence alone, the planted runs included).
    """
    runs: list[CalibrationRun] = []
    aa_rows: list[list[Row]] = []

    def save() -> None:  # after every run: a calibration cut short still leaves its figures
        if progress is not None:
            progress.parent.mkdir(parents=True, exist_ok=True)
            progress.write_text(json.dumps({"summary": summarize_calibration(runs),
                                            "runs": [asdict(r) for r in runs]}, indent=1))

    def one(kind: str, busy: bool, plant: tuple[float, str] | None) -> Outcome:
        started, load, commit = time.time(), os.getloadavg()[0], resolve(root, "HEAD")
        with busy_core(busy):
            result = compare_commits(root, "HEAD", "HEAD", machine, plant=plant[0] if plant else None,
                                     plant_at=plant[1] if plant else "engine", log=log)
        flagged = [r.name for r in regressions(result.rows)]
        runs.append(CalibrationRun(kind, flagged, result.exit_code, time.time() - started,
                                   tally(result.rows), beyond_floor(result.rows), result.twin_noise, commit, load,
                                   dict(result.failed)))
        if record is not None:
            record_run(record, machine, runs[-1])
        log(f"calibrate: {kind}: exit {result.exit_code}, {len(flagged)} flagged "
            f"{[_short(n) for n in flagged][:12]} ({runs[-1].seconds:.0f} s); verdicts {runs[-1].verdicts}, "
            f"{len(runs[-1].beyond)} beyond their floor")
        save()
        return result

    for kind, n, busy in (("aa", n_aa, False), ("aa-busy", n_busy, True)):
        for _ in range(n):
            aa_rows.append(one(kind, busy, None).rows)
    floors = calibrated_floors(aa_rows) if aa_rows and write else {}
    path = stats.noise_file(machine, root)
    if floors:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "machine": machine, "floors": floors, "families": floors_by_family(floors),
            "method": "expm1(1.5 x largest |log(head/base)| over the A/A runs); counts at least "
                      f"{COUNT_MIN_FLOOR:.0%}; a time signal's floor at gate time is the larger of this and the "
                      "run's own twin-vs-head |log ratio| of that signal x 1.5",
            "aa_runs": len(aa_rows), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }, indent=1, sort_keys=True) + "\n")
        log(f"calibrate: wrote {len(floors)} noise floors to {path}")
    for name in plants:
        if name not in PLANTS:
            raise GateError(f"gate: --plants {name!r}: expected some of {', '.join(PLANTS)}")
        for _ in range(n_planted):
            one(f"planted-{name}", False, PLANTS[name])
    summary = summarize_calibration(runs)
    summary["plants"] = {name: {"factor": PLANTS[name][0], "at": PLANTS[name][1]} for name in plants}
    if floors:
        summary["families"] = floors_by_family(floors)
    return {"summary": summary, "runs": [asdict(r) for r in runs], "floors": floors}


def print_calibration(summary: Mapping[str, Any]) -> None:
    for kind, s in summary.items():
        if not isinstance(s, dict) or "runs" not in s:
            continue
        if kind.startswith("planted-"):
            factor, at = PLANTS[kind[len("planted-"):]]
            label, what = f"planted {factor}x at {at}", "detected"
        else:
            label, what = {"aa": "A/A (machine as it is)", "aa-busy": "A/A (+1 core busy)"}.get(kind, kind), "false alarms"
        print(f"{label}: {what} in {s['flagged_runs']}/{s['runs']} runs ({s['rate']:.0%}), {s['failed_runs']} failed; "
              f"seconds {s['seconds']}; named: {', '.join(_short(n) for n in s['named'][:20]) or 'none'}"
              + (" ..." if len(s["named"]) > 20 else ""))
    for fam, f in summary.get("families", {}).items():
        print(f"floor of {fam}: median {f['median']:.1%}, max {f['max']:.1%} ({f['signals']} signals)")
