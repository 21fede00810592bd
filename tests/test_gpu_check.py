"""The GPU command end to end on a CPU: `.ci/gpu-check --dry-run all` with CUDA stood in.

A GPU is lent for minutes now and then; this run keeps its script from rotting in between: every
step (the CUDA tests, the engine smoke, the ASV bench on cuda, peer_ratios on cuda, time to N with
the first calls' imports, a profile with its NVML timeline, the dashboard) must run and write what it writes, and nothing it writes may
pass for a CUDA result (a temporary folder, a machine name and a field saying dry run). A dry run's
step limits guard against a hang only (SLACK times a GPU run's), and where a step needs N calls it
asks for them (`time-to-n --min-calls`), so a slow or busy machine passes too.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("facts", "engine-smoke", "pytest-cuda", "bench rosenbrock_hessian", "peers rosenbrock_hessian", "first-calls",
         "profile", "dashboard", "report")


@pytest.mark.long  # minutes: CI runs it apart (.ci/run, -m long)
def test_the_gpu_command_runs_every_step_on_a_cpu(tmp_path: Path) -> None:
    results = tmp_path / "results"
    env = {**os.environ, "PY": sys.executable, "RESULTS": str(results), "PYTHONPATH": str(ROOT)}
    env.pop("VMAPBENCH_RESULTS_DIR", None)
    env.pop("VMAPBENCH_MACHINE", None)
    before = sorted(p.name for p in (ROOT / "results").iterdir())
    proc = subprocess.run([str(ROOT / ".ci" / "gpu-check"), "--dry-run", "all"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=3000)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    for step in STEPS:
        assert f"=== {step}: exit 0" in log, f"step {step!r} did not run or failed:\n{log[-6000:]}"

    (machine_dir,) = [p for p in results.iterdir() if (p / "machine.json").is_file()]
    assert machine_dir.name.endswith("-cuda-standin-dry-run")
    machine = json.loads((machine_dir / "machine.json").read_text())
    assert "not a CUDA result" in machine["dry_run"] and machine["python"] and machine["torch"]
    (result_file,) = machine_dir.glob("*-existing-py*-torch*.json")
    result = json.loads(result_file.read_text())
    cuda_points = [name for name, row in result["results"].items() if "'cuda'" in json.dumps(row[1])]
    assert any(".time_run" in n for n in cuda_points) and any(".track_cuda_peak_bytes" in n for n in cuda_points)
    assert "0 failed" in log

    (peers_file,) = (results / "peer_ratios" / machine_dir.name).glob("*.json")
    peers = json.loads(peers_file.read_text())
    assert peers["device"] == "cuda" and "dry_run" in peers["software"]
    (row,) = peers["rows"]
    assert row["tier"] in ("replay", "fused") and "engine" in row["seconds"], row

    (ttn_file,) = (results / "time_to_n" / machine_dir.name).glob("*.json")
    ttn = json.loads(ttn_file.read_text())
    assert ttn["device"] == "cuda" and ttn["machine"] == machine_dir.name
    ours = next(c for c in ttn["curves"] if c["method"] == "engine" and c["cache"] == "cold")
    assert [k["n"] for k in ours["first_calls"]] == [1, 2, 3, 4, 5], ours  # --first-calls 5 --min-calls 5

    (profile,) = (results / "profiles").iterdir()
    assert (profile / "summary.json").is_file() and (profile / "nvml_timeline.html").is_file()
    junit = ET.parse(results / "out" / "pytest-cuda.xml").getroot()
    suite = junit if junit.tag == "testsuite" else junit[0]
    assert int(suite.get("tests")) > 5 and suite.get("failures") == "0" and suite.get("errors") == "0"
    devices = (results / "out" / "dashboard" / "devices.html").read_text()
    assert f"rosenbrock_hessian [d=128] · cpu: {machine_dir.name} · cuda: {machine_dir.name}" in devices
    page = (machine_dir / "gpu-run.md").read_text()
    assert "**DRY RUN" in page and "| rosenbrock_hessian |" in page
    assert "## Time to N from the first call" in page and "Each of the first calls" in page
    assert re.search(r"\| existing-py[\d.]+-torch[^|]+ \| [1-9]\d* \| 0 \|", page), page  # values, 0 failed
    assert sorted(p.name for p in (ROOT / "results").iterdir()) == before  # nothing went to results/
