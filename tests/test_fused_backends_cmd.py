"""`vmapbench fused-backends`: the graphs of a user's model (--fn), measured in a fresh process,
each backend's row and the table rendered from them; a refusal is a row, not a crash."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vmapbench import fused_backends

pytest.importorskip("jax")

MODEL = '''
import torch
import engine

def build(method):
    w = torch.randn(5, 3)
    xs = torch.randn(4, 5)
    f = engine.vmap(engine.grad(lambda w, x: torch.tanh(x @ w).pow(2).sum()), in_dims=(None, 0))
    special = engine.vmap(lambda x: torch.special.i0(x).sum())
    return lambda: (f(w, xs), special(xs))
'''


def test_a_users_model_gets_a_row_per_recorded_graph(tmp_path: Path):
    (tmp_path / "tiny_model.py").write_text(MODEL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "VMAPBENCH_RESULTS_DIR": str(tmp_path / "results")}
    out = subprocess.run([sys.executable, "-m", "vmapbench", "fused-backends", "--fn", "tiny_model:build",
                          "--backends", "xla,iree", "--rounds", "3", "--write"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    (written,) = (tmp_path / "results" / "fused_backends").rglob("*.json")
    doc = json.loads(written.read_text())
    rows = doc["rows"]
    assert len(rows) == 2 and all(r["workload"] == "tiny_model:build" for r in rows)
    lowered = [r for r in rows if r["xla"]["error"] is None]
    refused = [r for r in rows if r["xla"]["error"] is not None]
    assert len(lowered) == 1 and len(refused) == 1
    assert lowered[0]["xla"]["difference"] < 1e-5 and lowered[0]["xla"]["call_s"] > 0 and lowered[0]["replay_s"] > 0
    assert "i0" in refused[0]["xla"]["error"]
    assert "| tiny_model:build |" in out.stdout and "refused" in out.stdout
    assert fused_backends.table(rows, ["xla", "iree"]) in out.stdout
    iree = lowered[0]["iree"]
    if importlib.util.find_spec("iree") is None:  # the candidate's package missing: a named refusal per graph
        assert "pip install '.[compilers]'" in iree["error"], iree
    else:
        assert iree["error"] is not None or iree["agrees"] == (iree["difference"] <= 1e-4), iree


def test_a_program_that_disagrees_with_the_replay_is_marked_in_the_table():
    row = {"workload": "m", "graph": 0, "ops": 3, "inputs": 2, "replay_s": 1e-4,
           "iree": {"compile_s": 1.0, "error": None, "call_s": 5e-5, "difference": 0.9, "agrees": False},
           "xla": {"compile_s": 0.5, "error": None, "call_s": 2e-4, "difference": 1e-7, "agrees": True}}
    lines = fused_backends.table([row], ["xla", "iree"]).splitlines()
    cells = lines[2].split(" | ")
    assert cells[6] == "2.00" and cells[9] == "0.50 (disagrees)"
    # the summary: a program that disagrees is not counted as faster, however fast it ran
    assert lines[3].split(" | ")[5:] == ["median 0.50", "faster on 0", "refused 0",
                                         "median 1.00", "faster on 0", "refused 0 |"]


def test_unknown_backends_and_mixed_arguments_are_named():
    from vmapbench.commands import fused_backends as command

    parser = __import__("argparse").ArgumentParser()
    command.configure(parser)
    with pytest.raises(SystemExit, match="unknown backends"):
        command._specs(parser.parse_args(["--backends", "tvm"]))
    with pytest.raises(SystemExit, match="name no workload"):
        command._specs(parser.parse_args(["mlp_hvp", "--fn", "m:f"]))
