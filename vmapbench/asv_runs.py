"""`asv continuous` as asv's users type it, on an empty commit and a planted slowdown, beside the gate.

    python -m vmapbench.asv_runs --record results/asv_continuous/amd-epyc-2cpu.json   # the quick selection
    python -m vmapbench.asv_runs --workload rosenbrock_hessian                          # one workload's points

A throwaway clone of this checkout gets two commits on top of its HEAD: an empty one (the A/A) and
one whose engine takes PLANTED x its CPU time (`gate.plant_slowdown`, as `make continuous --plant`
does). asv builds each commit into asv.conf.json's virtualenv (`.asv/env`, shared with every asv
run of this checkout: one asv at a time) and runs the selection; the gate (`vmapbench.continuous`)
compares the same commits in the clone. `--record` appends both commands' exit codes, times and
what each called slower to a results file that `docs_tables` renders (kind `asv-continuous`).
tests/test_asv_continuous.py runs the same functions on one workload.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
PLANTED = 1.3
# One asv continuous over the quick selection builds two commits and runs every point of each.
TIMEOUT_S = 4 * 3600
# asv's comparison table: `| + | before | after | ratio | benchmark |` for a point called worse.
ASV_ROW = re.compile(r"^\|\s*(?P<change>[+-x!])\s*\|[^|]*\|[^|]*\|\s*(?P<ratio>[^|]*?)\s*\|\s*(?P<name>[^|]+?)\s*\|$")


# The throwaway commits' author (a fresh machine may have no git identity).
IDENTITY = ("-c", "user.name=vmapbench", "-c", "user.email=vmapbench@localhost")


def throwaway_repo(tmp: Path, factor: float = PLANTED, root: Path = ROOT) -> dict[str, str]:
    """A clone of `root`'s HEAD at tmp/repo with an empty commit and a planted one on top: name -> sha."""
    from vmapbench import gate
    from vmapbench.bench import git

    repo = tmp / "repo"
    subprocess.run(["git", "clone", "-q", str(root), str(repo)], check=True)
    shas = {"base": git(repo, "rev-parse", "HEAD")}
    git(repo, *IDENTITY, "commit", "-q", "--allow-empty", "-m", "empty: an A/A")
    shas["empty"] = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "planted", shas["base"])
    gate.plant_slowdown(repo, factor, "engine")
    git(repo, *IDENTITY, "commit", "-q", "-am", f"planted: the engine {factor}x slower")
    shas["planted"] = git(repo, "rev-parse", "HEAD")
    return shas


def asv_config(tmp: Path, root: Path = ROOT, env_dir: Path | None = None) -> Path:
    """asv.conf.json for the clone: `root`'s suite, virtualenvs in `env_dir` (default root's
    .asv/env), results kept in `tmp`."""
    conf = json.loads((root / "asv.conf.json").read_text())
    conf.update(repo=str(tmp / "repo"), benchmark_dir=str(root / "suite"), results_dir=str(tmp / "results"),
                html_dir=str(tmp / "html"), env_dir=str(env_dir or root / ".asv" / "env"))
    path = tmp / "asv.conf.json"
    path.write_text(json.dumps(conf))
    return path


def asv_env(home: Path) -> dict[str, str]:
    """The quick profile and one intra-op thread, as the gate times (docs/guide/asv-continuous.md:
    with two, a descheduled worker stalls a parallel op and a ratio moves between processes)."""
    env = dict(os.environ, VMAPBENCH_PROFILE="quick", OMP_NUM_THREADS="1", HOME=str(home))
    env.pop("VMAPBENCH_DEVICES", None)
    env.pop("PYTHONPATH", None)
    return env


def continuous(tmp: Path, base: str, head: str, machine: str, regexes: Sequence[str], *extra: str,
               root: Path = ROOT, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """`asv continuous BASE HEAD` on the points the regexes select, run from `root` (asv imports
    asv.conf.json's plugin from there). asv_config(tmp) must have been written."""
    conf, env = tmp / "asv.conf.json", asv_env(tmp)
    asv = [sys.executable, "-m", "asv"]
    subprocess.run([*asv, "machine", "--yes", "--machine", machine, "--config", str(conf)], cwd=root, env=env,
                   check=True, capture_output=True)
    bench_args = [a for r in regexes for a in ("--bench", r)]
    return subprocess.run([*asv, "continuous", "--config", str(conf), "--machine", machine, *bench_args, *extra,
                           base, head], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def changed_rows(output: str) -> dict[str, list[str]]:
    """asv's comparison table, read back: the benchmarks it called worse (+), better (-) and
    failed at head (!)."""
    rows: dict[str, list[str]] = {"worse": [], "better": [], "failed": []}
    kinds = {"+": "worse", "-": "better", "!": "failed"}
    for line in output.splitlines():
        m = ASV_ROW.match(line.strip())
        if m and m["change"] in kinds:
            rows[kinds[m["change"]]].append(m["name"])
    return rows


def verdict_line(output: str) -> str:
    """asv's last verdict line (`BENCHMARKS NOT SIGNIFICANTLY CHANGED.`, `PERFORMANCE DECREASED.` ...)."""
    found = [line.strip() for line in output.splitlines()
             if line.strip() in ("BENCHMARKS NOT SIGNIFICANTLY CHANGED.", "PERFORMANCE DECREASED.",
                                 "PERFORMANCE INCREASED.", "SOME BENCHMARKS HAVE CHANGED SIGNIFICANTLY.")]
    return found[-1] if found else "(no verdict printed)"


def points_run(tmp: Path, machine: str, sha: str) -> int:
    """How many benchmarks asv stored a result for at `sha` (a parameterized one counted once)."""
    files = list((tmp / "results" / machine).glob(f"{sha[:8]}-*.json"))
    return sum(len(json.loads(f.read_text()).get("results", {})) for f in files)


def gate(tmp: Path, base: str, head: str, machine: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """The gate on the same commits, run inside the clone (they exist there only)."""
    out = tmp / f"gate-{head[:8]}.json"
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "vmapbench.continuous", base, head, "--machine", machine,
                           "--json", str(out)], cwd=tmp / "repo", capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
    doc = json.loads(out.read_text()) if out.exists() else {}
    rows = doc.get("rows", [])
    return {"exit_code": proc.returncode, "seconds": round(time.time() - started, 1),
            "slower": sorted(r["name"] for r in rows if r.get("gated") and r.get("verdict") == "slower"),
            "gated": sum(1 for r in rows if r.get("gated")),
            "tail": (proc.stdout + proc.stderr).strip().splitlines()[-3:]}


def workload_method(name: str) -> tuple[str, str] | None:
    """(workload, method) named by an asv benchmark or a gate signal, for matching the two."""
    quoted = re.findall(r"'([^']*)'", name)
    methods = [q for q in quoted if q.startswith(("engine", "torch_func", "loop", "jax"))]
    if not methods:
        return None
    workload = next((q for q in quoted if q not in methods and "=" not in q and q != "cpu"), None)
    if workload is None:  # bench_workloads.<class>.metric(...) or <workload>.metric(...)
        parts = name.split("(")[0].split(".")
        workload = parts[-2] if len(parts) >= 2 else parts[0]
    return workload, methods[0]


def agreement(asv_worse: Sequence[str], gate_slower: Sequence[str]) -> dict[str, Any]:
    """Which of asv's worse points the gate also called slower (same workload and method)."""
    gate_pairs = {workload_method(n) for n in gate_slower}
    named = [n for n in asv_worse if workload_method(n) in gate_pairs]
    return {"asv_worse_also_gate_slower": len(named), "asv_worse": len(asv_worse)}


def one_run(tmp: Path, kind: str, base: str, head: str, machine: str, regexes: Sequence[str],
            log: Any = print) -> dict[str, Any]:
    """asv continuous and the gate on BASE..HEAD, asv run from the clone (its suite and plugin:
    edits to this checkout while it runs change nothing)."""
    log(f"asv-runs: {kind}: asv continuous {base[:8]} {head[:8]} ...", flush=True)
    started, load = time.time(), os.getloadavg()[0]
    proc = continuous(tmp, base, head, machine, regexes, root=tmp / "repo")
    out = proc.stdout + proc.stderr
    (tmp / f"asv-{kind}.log").write_text(out)
    rows = changed_rows(out)
    asv = {"exit_code": proc.returncode, "seconds": round(time.time() - started, 1), "verdict": verdict_line(out),
           "points": points_run(tmp, machine, head), **rows}
    log(f"asv-runs: {kind}: asv exit {asv['exit_code']} after {asv['seconds'] / 60:.1f} min, {asv['verdict']}, "
        f"{len(rows['worse'])} worse, {len(rows['better'])} better, {len(rows['failed'])} failed", flush=True)
    log(f"asv-runs: {kind}: the gate on the same commits ...", flush=True)
    gated = gate(tmp, base, head, machine)
    log(f"asv-runs: {kind}: gate exit {gated['exit_code']} after {gated['seconds'] / 60:.1f} min, "
        f"{len(gated['slower'])} slower", flush=True)
    return {"kind": kind, "base": base, "head": head, "load": round(load, 2), "asv": asv, "gate": gated,
            "agreement": agreement(rows["worse"], gated["slower"])}


def record(path: Path, machine: str, runs: list[dict[str, Any]], selection: str) -> None:
    doc = json.loads(path.read_text()) if path.exists() else {"machine": machine, "runs": []}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc["runs"] += [dict(run, selection=selection, written_at=stamp) for run in runs]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def regexes_for(workload: str | None) -> tuple[list[str], str]:
    """asv --bench regexes: the quick selection with its instruction counts, or one workload's."""
    from suite import selection
    from vmapbench.bench import one_regex

    if workload is None:  # what `python -m vmapbench.bench --print-bench-regex` prints
        return [one_regex(selection.bench_regexes("quick", opt_in=True))], "quick"
    from workloads import get

    w = get(workload)
    cls = selection.class_name(w)
    return [rf"^bench_workloads\.{cls}\.", rf"^bench_counts\.Instructions\.track_instructions\({re.escape(repr(workload))}, "], workload


def main(argv: Sequence[str] | None = None) -> int:
    from measuring.machine import machine_name

    p = argparse.ArgumentParser(prog="python -m vmapbench.asv_runs", description=__doc__.splitlines()[0])
    p.add_argument("--machine", default=None, help="asv's machine name and the gate's floors (default: as make bench)")
    p.add_argument("--workload", default=None, help="one workload's points instead of the quick selection")
    p.add_argument("--plant", type=float, default=PLANTED, help=f"the planted slowdown (default {PLANTED})")
    p.add_argument("--record", type=Path, default=None, metavar="FILE", help="append the runs to this results file")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR", help="work in DIR (kept) instead of a temporary one")
    args = p.parse_args(argv)
    machine = args.machine or machine_name()
    regexes, selection_name = regexes_for(args.workload)
    with tempfile.TemporaryDirectory(prefix="asv-runs-") as scratch:
        tmp = args.keep or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        shas = throwaway_repo(tmp, args.plant)
        asv_config(tmp, root=tmp / "repo", env_dir=ROOT / ".asv" / "env")
        runs = [one_run(tmp, "aa", shas["base"], shas["empty"], machine, regexes),
                one_run(tmp, f"planted-{args.plant}", shas["base"], shas["planted"], machine, regexes)]
    if args.record:
        record(args.record, machine, runs, selection_name)
        print(f"asv-runs: recorded in {args.record}")
    aa, planted = runs
    ok = (aa["asv"]["exit_code"] == 0 and aa["gate"]["exit_code"] == 0
          and planted["asv"]["exit_code"] == 1 and planted["gate"]["exit_code"] == 1)
    print(f"asv-runs: A/A asv {aa['asv']['exit_code']} gate {aa['gate']['exit_code']}; planted asv "
          f"{planted['asv']['exit_code']} gate {planted['gate']['exit_code']}: {'as expected' if ok else 'NOT as expected'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
