"""`asv continuous` as asv's users type it, in asv's own virtualenv: an A/A and a planted slowdown.

A throwaway clone of this checkout gets two commits on top of its HEAD: an empty one (A/A) and one
whose engine takes 1.3x its CPU time (vmapbench.gate.plant_slowdown, as `make continuous --plant`
does). asv builds each commit into asv.conf.json's virtualenv (under .asv/env, reused between
runs; the first run builds it) and runs a tiny selection: the instruction counts and the ratio to
torch.func of the engine methods of one quick workload (gated by vmapbench.asv_verdict) and their
raw times (stored, never called). The verdicts are asv's own lines. Without valgrind the counts
are n/a and the planted half is skipped (the ratios alone do not decide a 1.3x on a loaded box).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from suite import selection
from vmapbench import bench, gate
from workloads import get as get_workload

WORKLOAD = "rosenbrock_hessian"
METHODS = ("engine", "engine_eager", "engine_traced")
PLANTED = 1.3


def selection_regexes(workload: str = WORKLOAD, methods: tuple[str, ...] = METHODS) -> list[str]:
    """asv --bench regexes: the ratio to torch.func and the raw time of `methods` at the workload's
    first quick size, on cpu, and the instruction counts of the workload (suite/bench_counts.py)."""
    w = get_workload(workload)
    cls, size = selection.class_name(w), w.quick[0]
    alternation = "|".join(re.escape(repr(m)) for m in methods)
    return [rf"^bench_workloads\.{cls}\.(track_ratio_vs_torch_func|time_run)\({re.escape(repr(size))}, "
            rf"({alternation}), 'cpu'\)$",
            rf"^bench_counts\.Instructions\.track_instructions\({re.escape(repr(workload))}, ({alternation})\)$"]


def throwaway_repo(tmp: Path) -> dict[str, str]:
    """A clone of this checkout's HEAD with an empty commit and a planted one on top: name -> sha."""
    repo = tmp / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                              capture_output=True, text=True).stdout.strip()

    shas = {"base": git("rev-parse", "HEAD")}
    git("commit", "-q", "--allow-empty", "-m", "empty: an A/A")
    shas["empty"] = git("rev-parse", "HEAD")
    git("checkout", "-q", "-b", "planted", shas["base"])
    gate.plant_slowdown(repo, PLANTED, "engine")
    git("commit", "-q", "-am", f"planted: the engine {PLANTED}x slower")
    shas["planted"] = git("rev-parse", "HEAD")
    return shas


def asv_config(tmp: Path) -> Path:
    """asv.conf.json for the clone: this checkout's suite and virtualenvs, results kept in `tmp`."""
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    conf.update(repo=str(tmp / "repo"), benchmark_dir=str(ROOT / "suite"), results_dir=str(tmp / "results"),
                html_dir=str(tmp / "html"), env_dir=str(ROOT / ".asv" / "env"))
    path = tmp / "asv.conf.json"
    path.write_text(json.dumps(conf))
    return path


def asv_env(home: Path) -> dict[str, str]:
    import os

    # One intra-op thread, as the gate times (docs/guide/asv-continuous.md: with two, a descheduled
    # worker stalls a parallel op and a ratio moves many-fold between processes on a busy machine).
    env = dict(os.environ, VMAPBENCH_PROFILE="quick", OMP_NUM_THREADS="1", HOME=str(home))
    env.pop("VMAPBENCH_DEVICES", None)
    env.pop("PYTHONPATH", None)
    return env


def continuous(tmp: Path, base: str, head: str, machine: str, *extra: str) -> subprocess.CompletedProcess:
    """`asv continuous BASE HEAD` on the selection, run from this checkout (asv imports the
    asv.conf.json plugin from there)."""
    conf, env = tmp / "asv.conf.json", asv_env(tmp)
    asv = [sys.executable, "-m", "asv"]
    subprocess.run([*asv, "machine", "--yes", "--machine", machine, "--config", str(conf)], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    bench_args = [a for r in selection_regexes() for a in ("--bench", r)]
    return subprocess.run([*asv, "continuous", "--config", str(conf), "--machine", machine, *bench_args, *extra,
                           base, head], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)


@pytest.mark.long  # minutes (two asv builds and runs): CI runs it apart (.ci/run, -m long)
def test_asv_continuous_passes_an_empty_commit_and_fails_a_planted_slowdown(tmp_path: Path) -> None:
    shas = throwaway_repo(tmp_path)
    asv_config(tmp_path)
    machine = bench.machine_name()

    aa = continuous(tmp_path, shas["base"], shas["empty"], machine)
    out = aa.stdout + aa.stderr
    assert aa.returncode == 0, out
    assert "BENCHMARKS NOT SIGNIFICANTLY CHANGED." in out and "failed" not in out.lower(), out
    assert "vmapbench: asv's verdict counts only the gated signals" in out, out

    from measuring import counts

    if counts.available() is not None:
        pytest.skip(f"the planted half needs the instruction counts: {counts.available()}")
    planted = continuous(tmp_path, shas["base"], shas["planted"], machine)
    out = planted.stdout + planted.stderr
    assert planted.returncode == 1, out
    assert "PERFORMANCE DECREASED." in out, out
    worse = [line for line in out.splitlines() if line.startswith("| +")]
    assert any("track_instructions" in line for line in worse), out  # the counts catch it, whatever the load
    assert all(("track_instructions" in line or "track_ratio_vs_torch_func" in line) and "'engine" in line
               for line in worse), out  # only gated signals of the engine's methods are named


def test_one_regex_selects_what_the_profiles_regexes_select() -> None:
    """`python -m vmapbench.bench --print-bench-regex`: one asv --bench word for the quick selection."""
    from workloads.base import all_workloads

    regexes = selection.bench_regexes("quick")
    joined = re.compile(bench.one_regex(regexes))
    names = [f"bench_workloads.{selection.class_name(w)}.{m.name}({s!r}, {meth!r}, {d!r})"
             for w in all_workloads() for m in selection.METRICS for s in w.sizes[:2] for meth in w.methods[:3]
             for d in selection.ALL_DEVICES] + ["bench_runtime.track_torch_num_threads",
                                                "bench_overhead.PerOpOverhead.time_chain"]
    chosen = [n for n in names if any(re.search(r, n) for r in regexes)]
    assert chosen and len(chosen) < len(names)
    assert [n for n in names if joined.search(n)] == chosen


def test_asvs_environments_install_what_make_installs() -> None:
    """asv.conf.json installs the peers extra and BackPACK as the Makefile does (the same pin, --no-deps)."""
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    makefile = (ROOT / "Makefile").read_text()
    (pin,) = re.findall(r"^BACKPACK\s*:=\s*(\S+)$", makefile, re.M)
    commands = conf["install_command"]
    assert any(".[peers]" in c for c in commands), commands
    assert any(c.endswith(f"pip install --no-deps {pin}") for c in commands), (commands, pin)
    assert ".vmapbench.asv_verdict" in conf["plugins"]
