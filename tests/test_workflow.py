"""The benchmarks workflow parses, is label-gated, and calls only targets, modules and options that exist."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any, Iterator

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "benchmarks.yml"


def load_workflow() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def make_targets() -> dict[str, list[str]]:
    """Makefile target -> its recipe lines."""
    targets: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.$()/-]+)\s*:(?!=)", line)
        if match:
            current = targets.setdefault(match.group(1), [])
        elif line.startswith("\t"):
            if current is not None:
                current.append(line.strip())
        elif line.strip():
            current = None  # a variable or comment line ends the recipe
    return targets


def run_scripts(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for job_name, job in doc["jobs"].items():
        for step in job["steps"]:
            if "run" in step:
                yield job_name, step["run"]


def steps_using(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if s.get("uses", "").startswith(action)]


def test_workflow_triggers_and_label_gate():
    doc = load_workflow()
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads the key `on` as True
    assert set(triggers["pull_request"]["types"]) >= {"opened", "synchronize", "labeled"}
    assert "workflow_dispatch" in triggers
    assert "if" not in doc["jobs"]["tests"], "the tests run on every pull request event"
    for job in ("gate", "reference"):
        condition = doc["jobs"][job]["if"]
        assert "run-benchmarks" in condition and "labels" in condition
    assert doc["env"]["OMP_NUM_THREADS"] == "2"
    pythons = {s["with"]["python-version"] for job in doc["jobs"].values() for s in steps_using(job, "actions/setup-python")}
    assert pythons == {"3.11"}


def test_tests_job_runs_the_ci_entry_point():
    doc = load_workflow()
    scripts = [step["run"] for step in doc["jobs"]["tests"]["steps"] if "run" in step]
    assert any(script.strip() == "bash .ci/run" for script in scripts)
    assert (ROOT / ".ci" / "run").is_file()


def test_caches_pip_the_asv_env_and_the_inductor_cache():
    doc = load_workflow()
    for job in doc["jobs"].values():
        for setup in steps_using(job, "actions/setup-python"):
            assert setup["with"].get("cache") == "pip"
    cached = "\n".join(str(s["with"]["path"]) for job in doc["jobs"].values() for s in steps_using(job, "actions/cache"))
    assert ".asv/env" in cached and ".inductor-cache" in cached
    assert doc["env"]["TORCHINDUCTOR_CACHE_DIR"].endswith("/.inductor-cache")


def test_gate_job_writes_the_job_summary_and_keeps_make_exit_codes():
    doc = load_workflow()
    gate = doc["jobs"]["gate"]
    checkout = steps_using(gate, "actions/checkout")[0]
    assert checkout["with"]["fetch-depth"] == 0, "the gate extracts the base commit: full history"
    script = next(s["run"] for s in gate["steps"] if "make continuous" in s.get("run", ""))
    assert "--summary-md $GITHUB_STEP_SUMMARY" in script
    assert "pipefail" in script, "tee must not hide make's exit code"
    from vmapbench.continuous import build_parser

    args = build_parser().parse_args(["A", "B", "--summary-md", "x.md"])
    assert str(args.summary_md) == "x.md"
    upload = steps_using(gate, "actions/upload-artifact")[0]
    assert ".asv/continuous/" in upload["with"]["path"]


def test_every_make_target_the_workflow_calls_exists():
    targets = make_targets()
    called = {m.group(1) for _, script in run_scripts(load_workflow())
              for m in re.finditer(r"\bmake\s+([A-Za-z][\w-]*)", script)}
    assert called, "the workflow should go through make"
    missing = called - set(targets)
    assert not missing, f"the workflow calls make targets the Makefile lacks: {sorted(missing)}"
    assert {"continuous", "bench", "gate-calibrate"} <= called


def test_make_targets_reach_the_bench_modules():
    targets = make_targets()
    assert any("-m vmapbench.bench" in line for line in targets["bench"])
    assert any("--calibrate" in line for line in targets["gate-calibrate"])
    makefile = (ROOT / "Makefile").read_text()
    assert "GATE_CMD = $(PY) -m vmapbench.continuous" in makefile


def test_every_python_module_the_workflow_runs_exists():
    modules = {m.group(1) for _, script in run_scripts(load_workflow())
               for m in re.finditer(r"python -m ([\w.]+)", script)}
    for module in modules:
        assert importlib.util.find_spec(module) is not None, f"the workflow runs `python -m {module}`, which does not exist"
