"""The regression gate: base vs head on a noisy shared machine, and its own calibration.

    python -m vmapbench.gate BASE HEAD          # compare two commits (what `make continuous` runs)
    vmapbench gate --calibrate                  # A/A runs and a planted 1.3x engine slowdown

How it measures (decided from A/A measurements on this 2-core box, see README "Benchmarks with
ASV"): wall-clock times of two runs of one commit differed by up to 40x under the load of other
processes, and even ratios of methods timed interleaved in one process moved 2x. CPU time of the
measuring process (time.process_time, one intra-op thread) is what the load does not inflate, so:

- each commit is extracted (`git archive`) into a temporary folder; every round runs one fresh
  process per commit (vmapbench/gate_probe.py, both at once), rounds repeated `--rounds` times;
- each process times every method of each gated workload interleaved in CPU seconds and reports
  the in-process ratios (method / torch.func, loop / method) and the engine's per-op overhead
  over native; these ratios are the gated signals (vmapbench.stats.GATED_METRICS);
- per signal, the head/base ratio of the per-process medians gets a bootstrap interval
  (vmapbench.stats.ratio) and is called "slower" only when the whole interval lies beyond the
  signal's noise floor (results/noise/<machine>.json from --calibrate, else 10%);
- raw times (CPU ms per call) are reported with their intervals, never gated.

Exit codes, as asv continuous: 0 nothing regressed (improvements are fine), 1 a gated signal is
slower (only those are named, with their intervals), 2 a case failed at head or a measuring
process died.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from vmapbench import stats

PROBE = Path(__file__).resolve().with_name("gate_probe.py")
# Workloads of the gate (their first quick size, cpu): the cheapest cases that cover every engine
# path (hessian, jacobian, jvp, hvp, per-example grads), so that one measuring process costs ~8
# CPU-seconds and one comparison (3 rounds x 2 commits) a few minutes on 2 busy cores. The other
# workloads cost 1-3 CPU-seconds each (their loops) and are left to `make bench`. Compiled
# methods are out: a cold compile costs ~30 s here and its result is cached.
GATED_WORKLOADS: tuple[str, ...] = (
    "logreg_per_example_grads", "robust_reg_hessian", "mlp_hvp", "rosenbrock_hessian", "mlp_jacobian", "mlp_jvp",
)
# Compiled methods cost a compile per process; the peers (JAX, Opacus, BackPACK) are pinned
# third-party code that a commit here cannot slow down except through the workload itself, which
# loop and torch_func show too (and jit/imports would cost every gate process seconds).
SKIPPED_METHODS: tuple[str, ...] = (
    "engine_compiled", "torch_func_compiled", "loop_compiled",
    "jax", "opacus_hooks", "opacus_ew", "opacus_functorch", "backpack",
)
DEFAULT_ROUNDS = 3
# Seconds of one workload's interleaved measurement in a probe process. Its 6-8 methods take ~20 ms
# each per round, so 0.4 s left the 3-round minimum; 1.0 s gives ~7 rounds: the noise floors
# calibrated with 0.4 (median 53% after engine_eager joined the gated methods) were too wide.
PROBE_BUDGET_S = 1.0
PROBE_ROUNDS = 7
PROBE_TIMEOUT_S = 900
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
    """The tree of `commit` written to `dest` (git archive: no worktree, nothing to clean in .git)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "engine", "workloads"],
                             cwd=root, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


# Where the engine spends a call, as users get it: the eager dispatch of every op on a batched
# tensor, and the replay of a recorded graph (automatic tracing's steady state, engine.trace and
# engine.compile). (module path, class, method) of each.
PLANT_SITES = (("engine/_dispatch.py", "VmapMode", "__torch_dispatch__"),
               ("engine/trace.py", "TracedFunction", "_replay"))


def plant_slowdown(tree: Path, factor: float) -> None:
    """Make the engine's per-call paths (PLANT_SITES: every outermost eager dispatch, every replay)
    take `factor` x their CPU time: a busy-wait proportional to the time the call itself took,
    counted once for the outermost of nested calls, appended to the extracted tree's modules: a
    known, engine-only slowdown for the calibration (never committed)."""
    for relpath, cls, method in PLANT_SITES:
        path = tree / relpath
        source = path.read_text()
        if (f"class {cls}(" not in source and f"class {cls}:" not in source) or f"def {method}(" not in source:
            raise GateError(f"gate: cannot plant a slowdown: {path} has no {cls}.{method} any more; "
                            f"update vmapbench.gate.PLANT_SITES to the engine's per-call entry points")
        path.write_text(source + f"""

{PLANT_MARK}: each outermost {cls}.{method} takes {factor}x its CPU time.
import threading as _plant_threading
import time as _plant_time

_plant_state = _plant_threading.local()
_plant_inner = {cls}.{method}


def _plant_slow(*args, **kwargs):  # a plain function: bound as a method where it replaces one
    if getattr(_plant_state, "depth", 0):
        return _plant_inner(*args, **kwargs)
    _plant_state.depth = 1
    start = _plant_time.process_time()
    try:
        return _plant_inner(*args, **kwargs)
    finally:
        _plant_state.depth = 0
        until = _plant_time.process_time() + (_plant_time.process_time() - start) * ({factor} - 1)
        while _plant_time.process_time() < until:
            pass


{cls}.{method} = _plant_slow
""")


# --- measuring -----------------------------------------------------------------------------------

def probe_command(tree: Path, out: Path, workloads: Sequence[str]) -> list[str]:
    runner = ("import runpy, sys; sys.argv = ['gate_probe'] + sys.argv[1:]; "
              f"sys.exit(runpy.run_path({str(PROBE)!r}, run_name='__main__'))")
    return [sys.executable, "-c", runner, "--workloads", ",".join(workloads), "--overhead",
            "--skip-methods", ",".join(SKIPPED_METHODS), "--budget", str(PROBE_BUDGET_S),
            "--rounds", str(PROBE_ROUNDS), "--clock", "cpu", "--out", str(out)]


def probe_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"  # CPU time of one thread: no spin-waits
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.cwd() / ".inductor-cache"))
    return env


def run_rounds(trees: Mapping[str, Path], rounds: int, workdir: Path,
               workloads: Sequence[str] = GATED_WORKLOADS, log: Any = print) -> dict[str, list[dict]]:
    """label -> per-round probe outputs; each round runs one process per tree, all at once."""
    outputs: dict[str, list[dict]] = {label: [] for label in trees}
    for r in range(rounds):
        started = time.time()
        procs = {}
        for label, tree in trees.items():
            out = workdir / f"{label}-{r}.json"
            procs[label] = (out, subprocess.Popen(probe_command(tree, out, workloads), cwd=tree, env=probe_env(tree),
                                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for label, (out, proc) in procs.items():
            try:
                text, _ = proc.communicate(timeout=PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                text, _ = proc.communicate()
                text += f"\n(killed after {PROBE_TIMEOUT_S} s)"
            try:
                data = json.loads(out.read_text())
            except (OSError, ValueError):
                data = {"fatal": f"the measuring process exited {proc.returncode} without output:\n{text[-2000:]}"}
            outputs[label].append(data)
        log(f"gate: round {r + 1}/{rounds} done in {time.time() - started:.0f} s")
    return outputs


# --- signals -------------------------------------------------------------------------------------

def _cls(workload: str) -> str:
    """The suite's class name of a workload, by name (it may exist at base or head only)."""
    from types import SimpleNamespace

    from suite.selection import class_name

    return class_name(SimpleNamespace(name=workload))  # type: ignore[arg-type]


def signals(probe: Mapping[str, Any]) -> dict[str, float]:
    """Signal name (asv point name) -> value, for one probe output.

    Gated: track_ratio_vs_torch_func (method / torch_func), track_speedup_vs_loop (loop / method),
    track_overhead_us_per_op ((method - native) / ops, us). Reported: time_run (CPU s per call).
    """
    from suite.bench_overhead import N_OPS

    out: dict[str, float] = {}
    for workload, sizes in probe.get("times", {}).items():
        cls = _cls(workload)
        for size, seconds in sizes.items():
            for method, t in seconds.items():
                point = f"'{size}', '{method}', 'cpu'"
                out[f"bench_workloads.{cls}.time_run({point})"] = t
                if method != "torch_func" and "torch_func" in seconds:
                    out[f"bench_workloads.{cls}.track_ratio_vs_torch_func({point})"] = t / seconds["torch_func"]
                if method != "loop" and "loop" in seconds:
                    out[f"bench_workloads.{cls}.track_speedup_vs_loop({point})"] = seconds["loop"] / t
    chain = probe.get("overhead", {})
    for method, t in chain.items():
        out[f"bench_overhead.PerOpOverhead.time_chain('{method}', 'cpu')"] = t
        if method != "native" and "native" in chain:
            out[f"bench_overhead.PerOpOverhead.track_overhead_us_per_op('{method}', 'cpu')"] = \
                (t - chain["native"]) / N_OPS * 1e6
    return out


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
    """One signal's comparison."""

    name: str
    gated: bool
    verdict: str
    floor: float
    change: stats.Estimate
    base: stats.Estimate
    head: stats.Estimate


def compare(base_runs: Sequence[Mapping[str, float]], head_runs: Sequence[Mapping[str, float]],
            machine: str | None, root: Path | None = None) -> list[Row]:
    """One Row per signal present on both sides (per-run signal dicts, see `signals`)."""
    names = sorted(set().union(*base_runs) & set().union(*head_runs)) if base_runs and head_runs else []
    rows = []
    for name in names:
        b = [run[name] for run in base_runs if name in run]
        h = [run[name] for run in head_runs if name in run]
        gated = stats.is_gated(name)
        try:
            change = stats.ratio(b, h)
        except ValueError:  # e.g. a per-op overhead at or below native: no ratio, nothing to gate
            continue
        floor = stats.noise_floor(name, machine, root)
        rows.append(Row(name, gated, stats.verdict(change, floor, stats.higher_is_better(name)), floor, change,
                        stats.estimate(b), stats.estimate(h)))
    return rows


def regressions(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.gated and r.verdict == "slower"]


# --- reporting -----------------------------------------------------------------------------------

def _short(name: str) -> str:
    return name.replace("bench_workloads.", "").replace("bench_overhead.", "").replace(", 'cpu')", ")")


def format_rows(rows: Sequence[Row]) -> str:
    width = max((len(_short(r.name)) for r in rows), default=10)
    lines = [f"{'signal':<{width}}  {'verdict':<9}  {'head/base [99% interval]':<30}  floor"]
    for r in rows:
        lines.append(f"{_short(r.name):<{width}}  {r.verdict:<9}  {stats.relative_change(r.change):<30}  "
                     f"{r.floor:.0%}")
    return "\n".join(lines)


def markdown(rows: Sequence[Row], failed: Mapping[str, str], title: str) -> str:
    """A GitHub job summary: the verdict, the called changes, then every signal in a <details>."""
    gated = [r for r in rows if r.gated]
    slower = regressions(rows)
    faster = [r for r in gated if r.verdict == "faster"]
    head = ("**failed**" if failed else "**regression**" if slower else "**no regression**")
    lines = [f"### {title}", "",
             f"{head}: {len(gated)} gated signals, {len(slower)} slower, {len(faster)} faster "
             f"(called only when the whole 99% interval of head/base lies beyond the signal's noise floor).", ""]
    if failed:
        lines += ["| failed case | error |", "|---|---|"]
        lines += [f"| `{case}` | {message.replace('|', '/')} |" for case, message in failed.items()]
        lines.append("")

    def table(selected: Sequence[Row]) -> list[str]:
        out = ["| signal | verdict | head/base [99% interval] | floor | base | head |", "|---|---|---|---|---|---|"]
        out += [f"| `{_short(r.name)}` | {r.verdict} | {stats.relative_change(r.change)} | {r.floor:.0%} | "
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

    @property
    def exit_code(self) -> int:
        return 2 if self.failed else 1 if regressions(self.rows) else 0


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="vmapbench-gate-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(trees: Mapping[str, Path], rounds: int, workdir: Path, log: Any = print) -> dict[str, list[dict]]:
    """Probe outputs per label, `rounds` rounds (the seam tests replace)."""
    return run_rounds(trees, rounds, workdir, log=log)


def outcome(base_probes: Sequence[Mapping[str, Any]], head_probes: Sequence[Mapping[str, Any]],
            machine: str | None, root: Path | None = None) -> Outcome:
    failed_head = failures(head_probes)
    rows = compare([signals(p) for p in base_probes if "fatal" not in p],
                   [signals(p) for p in head_probes if "fatal" not in p], machine, root)
    return Outcome(rows, failed_head)


def compare_commits(root: Path, base: str, head: str, rounds: int, machine: str | None,
                    plant: float | None = None, log: Any = print) -> Outcome:
    """Extract both commits, measure them in alternating processes, compare."""
    base_sha, head_sha = resolve(root, base), resolve(root, head)
    with scratch() as tmp:
        # Two copies even for A/A (base == head): each side runs its own processes from its own files.
        trees = {"base": extract(root, base_sha, tmp / "base"), "head": extract(root, head_sha, tmp / "head")}
        if plant:
            plant_slowdown(trees["head"], plant)
        probes = measure(trees, rounds, tmp, log)
    failed_base = failures(probes["base"])
    if failed_base:
        log("gate: at base, these failed (not counted against head): " + "; ".join(failed_base))
    return outcome(probes["base"], probes["head"], machine, root)


def default_json(root: Path, machine: str, base_sha: str, head_sha: str) -> Path:
    """Where a comparison's rows go: under .asv/, apart from results/ (make bench's reference runs)."""
    return root / OUT_DIR / machine / f"{base_sha[:8]}-{head_sha[:8]}.json"


def report(result: Outcome, base: str, head: str, summary_md: Path | None, json_out: Path | None) -> None:
    slower = regressions(result.rows)
    print(format_rows([r for r in result.rows if r.gated]))
    if result.failed:
        print(f"\ngate: {len(result.failed)} benchmarks failed at {head}:")
        for case, message in result.failed.items():
            print(f"  {case}: {message}")
    if slower:
        print(f"\ngate: PERFORMANCE DECREASED: {len(slower)} gated signals slower beyond their noise floor:")
        for r in slower:
            print(f"  {_short(r.name)}: {stats.relative_change(r.change)} (floor {r.floor:.0%})")
    elif not result.failed:
        print(f"\ngate: no regression ({sum(r.gated for r in result.rows)} gated signals)")
    if summary_md is not None:
        with summary_md.open("a") as fh:
            fh.write(markdown(result.rows, result.failed, f"Benchmarks gate: {base} -> {head}") + "\n")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"base": base, "head": head, "exit_code": result.exit_code,
                                        "failed": result.failed, "rows": [asdict(r) for r in result.rows]},
                                       indent=1))


# --- calibration ---------------------------------------------------------------------------------

@contextlib.contextmanager
def busy_core(enabled: bool) -> Iterator[None]:
    """Keep one core busy with another process (a Python spin loop) for the block."""
    if not enabled:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def calibrated_floors(aa_runs: Sequence[Sequence[Row]], margin: float = 1.5) -> dict[str, float]:
    """Per gated signal: max(default floor, margin x the largest A/A point deviation, in log scale).

    The interval guards against the noise within a comparison; the floor guards against what
    moves between comparisons (load phases, process layout), which only A/A runs can show.
    """
    worst: dict[str, float] = {}
    for rows in aa_runs:
        for r in rows:
            if r.gated:
                worst[r.name] = max(worst.get(r.name, 0.0), abs(math.log(r.change.value)))
    return {name: round(max(stats.DEFAULT_NOISE_FLOOR, math.expm1(margin * w)), 3) for name, w in sorted(worst.items())}


def is_engine_signal(name: str) -> bool:
    """Whether a signal measures an engine method (or the engine's per-op overhead)."""
    _, params = stats.split_point(name)
    return any(p.strip("'").startswith("engine") for p in params)


@dataclass
class CalibrationRun:
    kind: str  # "aa", "aa-busy", "planted"
    flagged: list[str]
    exit_code: int
    seconds: float


def summarize_calibration(runs: Sequence[CalibrationRun]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("aa", "aa-busy", "planted"):
        selected = [r for r in runs if r.kind == kind]
        if not selected:
            continue
        flagged_runs = sum(1 for r in selected if r.flagged)
        names = sorted({n for r in selected for n in r.flagged})
        out[kind] = {"runs": len(selected), "flagged_runs": flagged_runs,
                     "rate": flagged_runs / len(selected), "named": names,
                     "only_engine_named": all(is_engine_signal(n) for n in names),
                     "failed_runs": sum(1 for r in selected if r.exit_code == 2)}
    return out


def calibrate(root: Path, machine: str, n_aa: int, n_busy: int, n_planted: int, factor: float, rounds: int,
              rev: str = "HEAD", write: bool = True, log: Any = print, progress: Path | None = None) -> dict[str, Any]:
    """A/A comparisons (idle machine, then one core busy) and planted-slowdown comparisons.

    False alarms are counted with the floors in effect before this calibration (the file if any,
    else the default); the floors written are then derived from these A/A runs and used for the
    planted runs, so detection is measured with what future gates will use. With write=False
    (--keep-floors) the file is left as it is: a check of existing floors on fresh runs.
    """
    runs: list[CalibrationRun] = []
    aa_rows: list[list[Row]] = []

    def save() -> None:  # after every run: a calibration cut short still leaves its figures
        if progress is not None:
            progress.parent.mkdir(parents=True, exist_ok=True)
            progress.write_text(json.dumps({"summary": summarize_calibration(runs),
                                            "runs": [asdict(r) for r in runs]}, indent=1))

    plan = [("aa", n_aa, False), ("aa-busy", n_busy, True)]
    for kind, n, busy in plan:
        for i in range(n):
            started = time.time()
            with busy_core(busy):
                result = compare_commits(root, rev, rev, rounds, machine, log=log)
            aa_rows.append(result.rows)
            flagged = [r.name for r in regressions(result.rows)]
            runs.append(CalibrationRun(kind, flagged, result.exit_code, time.time() - started))
            log(f"calibrate: {kind} {i + 1}/{n}: {len(flagged)} flagged {flagged} ({runs[-1].seconds:.0f} s)")
            save()
    floors = calibrated_floors(aa_rows) if aa_rows and write else {}
    path = stats.noise_file(machine, root)
    if floors:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "machine": machine, "default": stats.DEFAULT_NOISE_FLOOR, "floors": floors,
            "method": "max(default, expm1(1.5 x largest |log(head/base)| over the A/A runs))",
            "aa_runs": len(aa_rows), "rounds": rounds, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }, indent=1, sort_keys=True) + "\n")
        log(f"calibrate: wrote {len(floors)} noise floors to {path}")
    for i in range(n_planted):
        started = time.time()
        result = compare_commits(root, rev, rev, rounds, machine, plant=factor, log=log)
        flagged = [r.name for r in regressions(result.rows)]
        runs.append(CalibrationRun("planted", flagged, result.exit_code, time.time() - started))
        log(f"calibrate: planted {factor}x {i + 1}/{n_planted}: {len(flagged)} flagged {flagged} "
            f"({runs[-1].seconds:.0f} s)")
        save()
    summary = summarize_calibration(runs)
    summary["factor"] = factor
    summary["rounds"] = rounds
    return {"summary": summary, "runs": [asdict(r) for r in runs], "floors": floors}


def print_calibration(summary: Mapping[str, Any]) -> None:
    labels = {"aa": "A/A (ambient load)", "aa-busy": "A/A (+1 core busy)", "planted": f"planted {summary['factor']}x engine"}
    for kind, label in labels.items():
        s = summary.get(kind)
        if s is None:
            continue
        what = "detected" if kind == "planted" else "false alarms"
        print(f"{label}: {what} in {s['flagged_runs']}/{s['runs']} runs ({s['rate']:.0%}); "
              f"named: {', '.join(_short(n) for n in s['named']) or 'none'}"
              + (f"; only engine methods named: {s['only_engine_named']}" if kind == "planted" else ""))


# --- command line --------------------------------------------------------------------------------

def configure(p: argparse.ArgumentParser, calibration: bool = True) -> None:
    p.add_argument("base", nargs="?", default="HEAD~1", help="the commit compared against (default HEAD~1)")
    p.add_argument("head", nargs="?", default="HEAD", help="the commit tested (default HEAD)")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                   help=f"measuring processes per commit (default {DEFAULT_ROUNDS})")
    p.add_argument("--machine", default=None, help="machine name for the noise floors (default: as make bench)")
    p.add_argument("--summary-md", type=Path, default=None,
                   help="append a markdown summary (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--json", type=Path, default=None,
                   help=f"write every row as JSON (default {OUT_DIR}/<machine>/<base8>-<head8>.json)")
    p.add_argument("--plant", type=float, default=None, metavar="FACTOR",
                   help="slow head's engine dispatch by FACTOR in its temporary copy (self-test, e.g. 1.3)")
    if not calibration:
        return
    p.add_argument("--calibrate", action="store_true",
                   help="run A/A and planted-slowdown comparisons of HEAD, print the rates, write the noise floors")
    p.add_argument("--aa", type=int, default=5, help="--calibrate: A/A runs on the machine as it is")
    p.add_argument("--aa-busy", type=int, default=5, help="--calibrate: A/A runs with one core kept busy")
    p.add_argument("--planted", type=int, default=5, help="--calibrate: planted-slowdown runs")
    p.add_argument("--factor", type=float, default=1.3, help="--calibrate: planted slowdown factor")
    p.add_argument("--keep-floors", action="store_true",
                   help="--calibrate: do not rewrite the noise floors (check the existing ones on fresh runs)")


def main(args: argparse.Namespace) -> int:
    from vmapbench.bench import machine_name, repo_root

    root = repo_root()
    machine = args.machine or machine_name()
    if args.rounds < stats.MIN_SAMPLES:
        raise GateError(f"gate: --rounds {args.rounds}: at least {stats.MIN_SAMPLES} rounds are needed for an "
                         f"interval (a change measured once is never called)")
    if getattr(args, "calibrate", False):
        started = time.time()
        out = root / OUT_DIR / machine / f"calibration-{time.strftime('%Y%m%d-%H%M%S')}.json"
        result = calibrate(root, machine, args.aa, args.aa_busy, args.planted, args.factor, args.rounds,
                           write=not args.keep_floors, progress=out)
        print_calibration(result["summary"])
        out.write_text(json.dumps(result, indent=1))
        print(f"calibrate: {(time.time() - started) / 60:.1f} min; details in {out}")
        return 0
    base_sha, head_sha = resolve(root, args.base), resolve(root, args.head)
    print(f"gate: {args.base} ({base_sha[:8]}) -> {args.head} ({head_sha[:8]})"
          + (f" with a planted {args.plant}x engine slowdown" if args.plant else "")
          + f", {args.rounds} rounds, machine {machine}", flush=True)
    started = time.time()
    result = compare_commits(root, base_sha, head_sha, args.rounds, machine, plant=args.plant)
    json_out = args.json or default_json(root, machine, base_sha, head_sha)
    report(result, args.base, args.head, args.summary_md, json_out)
    print(f"gate: exit {result.exit_code} after {(time.time() - started) / 60:.1f} min; rows in {json_out}")
    return result.exit_code


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m vmapbench.gate", description=__doc__.splitlines()[0])
    configure(parser)
    sys.exit(main(parser.parse_args()))
