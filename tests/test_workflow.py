"""The benchmarks workflow parses, is label-gated, and calls only targets, modules and options that exist."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
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


def test_workflow_parses_and_runs_on_labelled_pull_requests():
    doc = load_workflow()
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads the key `on` as True
    assert "pull_request" in triggers
    gate = doc["jobs"]["families"]["if"]
    assert "run-benchmarks" in gate and "labels" in gate
    continuous = doc["jobs"]["continuous"]
    checkout = next(s for s in continuous["steps"] if s.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0, "asv continuous needs the base commit: full history"
    pythons = {s["with"]["python-version"] for job in doc["jobs"].values() for s in job["steps"]
               if s.get("uses", "").startswith("actions/setup-python")}
    assert pythons == {"3.11"}
    assert doc["env"]["OMP_NUM_THREADS"] == "2"
    uploads = [s for s in continuous["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["with"]["path"].startswith("results")


def test_every_make_target_the_workflow_calls_exists():
    targets = make_targets()
    called = {m.group(1) for _, script in run_scripts(load_workflow())
              for m in re.finditer(r"\bmake\s+([A-Za-z][\w-]*)", script)}
    assert called, "the workflow should go through make"
    missing = called - set(targets)
    assert not missing, f"the workflow calls make targets the Makefile lacks: {sorted(missing)}"
    assert "continuous" in called


def test_make_targets_reach_the_bench_modules():
    targets = make_targets()
    assert any("-m vmapbench.bench" in line for line in targets["bench"])
    assert any("-m vmapbench.continuous" in line for line in targets["continuous"])


def test_every_python_module_the_workflow_runs_exists():
    modules = {m.group(1) for _, script in run_scripts(load_workflow())
               for m in re.finditer(r"python -m ([\w.]+)", script)}
    assert "vmapbench.bench" in modules
    for module in modules:
        assert importlib.util.find_spec(module) is not None, f"the workflow runs `python -m {module}`, which does not exist"


def test_bench_invocations_parse_with_the_bench_command_line():
    from vmapbench.bench import build_parser

    calls = [m.group(1).split() for _, script in run_scripts(load_workflow())
             for m in re.finditer(r"-m vmapbench\.bench((?:[ \t]+[^\s)\"'|>;&]+)*)", script)]
    assert calls
    for words in calls:
        words = [w for w in words if "$" not in w]
        build_parser().parse_args([w.replace("*", "x") for w in words])  # SystemExit on an unknown option


def test_matrix_families_come_from_the_registry():
    from vmapbench import bench
    from workloads import families

    doc = load_workflow()
    assert "fromJSON(needs.families.outputs.families)" in str(doc["jobs"]["continuous"]["strategy"]["matrix"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench.main(["--list-families"]) == 0
    listed = json.loads(out.getvalue())
    assert set(families()) <= set(listed)


@pytest.mark.parametrize("pattern", ["PERFORMANCE DECREASED", "benchmarks failed at"])
def test_workflow_fails_on_what_the_drivers_print(pattern):
    """The gate greps for strings asv and vmapbench.continuous really print."""
    script = "\n".join(s for _, s in run_scripts(load_workflow()))
    assert pattern in script
    source = (ROOT / "vmapbench" / "continuous.py").read_text()
    if pattern == "benchmarks failed at":
        assert "benchmarks failed at" in source
    else:
        import asv.commands.continuous as asv_continuous

        assert pattern in Path(asv_continuous.__file__).read_text()
