"""`asv continuous` as asv's users type it, in asv's own virtualenv: an A/A and a planted slowdown.

A throwaway clone of this checkout gets two commits on top of its HEAD (vmapbench.asv_runs, which
also runs the whole quick selection for the docs): an empty one (A/A) and one whose engine takes
1.3x its CPU time (vmapbench.gate.plant_slowdown, as `make continuous --plant` does). asv builds
each commit into asv.conf.json's virtualenv (under .asv/env, reused between runs; the first run
builds it) and runs a tiny selection: the instruction counts and the ratio to
torch.func of the engine methods of one quick workload (gated by vmapbench.asv_verdict) and their
raw times (stored, never called). The verdicts are asv's own lines. Without valgrind the counts
are n/a and the planted half is skipped (the ratios alone do not decide a 1.3x on a loaded box).
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from suite import selection
from vmapbench import asv_runs, bench
from workloads import get as get_workload

WORKLOAD = "rosenbrock_hessian"
METHODS = ("engine", "engine_eager", "engine_traced")


def selection_regexes(workload: str = WORKLOAD, methods: tuple[str, ...] = METHODS) -> list[str]:
    """asv --bench regexes: the ratio to torch.func and the raw time of `methods` at the workload's
    first quick size, on cpu, and the instruction counts of the workload (suite/bench_counts.py)."""
    w = get_workload(workload)
    cls, size = selection.class_name(w), w.quick[0]
    alternation = "|".join(re.escape(repr(m)) for m in methods)
    return [rf"^bench_workloads\.{cls}\.(track_ratio_vs_torch_func|time_run)\({re.escape(repr(size))}, "
            rf"({alternation}), 'cpu'\)$",
            rf"^bench_counts\.Instructions\.track_instructions\({re.escape(repr(workload))}, ({alternation})\)$"]


def continuous(tmp: Path, base: str, head: str, machine: str) -> subprocess.CompletedProcess:
    return asv_runs.continuous(tmp, base, head, machine, selection_regexes(), timeout=1500)


@pytest.mark.long  # minutes (two asv builds and runs): CI runs it apart (.ci/run, -m long)
def test_asv_continuous_passes_an_empty_commit_and_fails_a_planted_slowdown(tmp_path: Path) -> None:
    shas = asv_runs.throwaway_repo(tmp_path)
    asv_runs.asv_config(tmp_path)
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


ASV_TABLE = """| Change   | Before [dfafd8ff] <i42~1>   | After [7f45b734] <planted>   |   Ratio | Benchmark (Parameter)                                                              |
|----------|-----------------------------|------------------------------|---------|------------------------------------------------------------------------------------|
| +        | 5134629.5±5.5e+02           | 7350341.5±1.7e+03            |    1.43 | bench_counts.Instructions.track_instructions('rosenbrock_hessian', 'engine_eager') |
| -        | 0.5                         | 0.4                          |    0.80 | bench_workloads.mlp_hvp.track_ratio_vs_torch_func('d=64', 'engine', 'cpu') |

SOME BENCHMARKS HAVE CHANGED SIGNIFICANTLY.
PERFORMANCE DECREASED.
"""


def test_asvs_table_is_read_back_and_matched_with_the_gates_signals() -> None:
    rows = asv_runs.changed_rows(ASV_TABLE)
    assert rows == {"worse": ["bench_counts.Instructions.track_instructions('rosenbrock_hessian', 'engine_eager')"],
                    "better": ["bench_workloads.mlp_hvp.track_ratio_vs_torch_func('d=64', 'engine', 'cpu')"],
                    "failed": []}
    assert asv_runs.verdict_line(ASV_TABLE) == "PERFORMANCE DECREASED."
    assert asv_runs.verdict_line("nothing") == "(no verdict printed)"
    gate_slower = ["rosenbrock_hessian.instructions('d=128', 'engine_eager')", "PerOpOverhead.instructions('engine')"]
    assert asv_runs.agreement(rows["worse"], gate_slower) == {"asv_worse_also_gate_slower": 1, "asv_worse": 1}
    assert asv_runs.agreement(rows["worse"], gate_slower[1:]) == {"asv_worse_also_gate_slower": 0, "asv_worse": 1}
    assert asv_runs.workload_method("bench_overhead.PerOpOverhead.track_overhead_us_per_op('engine')") == \
        asv_runs.workload_method("PerOpOverhead.instructions('engine')")
