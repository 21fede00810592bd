"""Result files carry no local path: `make bench` renames asv's existing-environment files."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vmapbench import bench

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["result", "params", "version", "started_at", "duration"]


def write(path: Path, rows: dict, env: str = "existing-py_home_me_proj_.venv_bin_python") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"commit_hash": "abcdef12" + "0" * 32, "env_name": env, "python": "/home/me/proj/.venv/bin/python",
                                "params": {"machine": "m", "python": "/home/me/proj/.venv/bin/python"},
                                "result_columns": COLUMNS, "results": rows, "version": 2}))


def test_existing_env_files_are_renamed_and_merged(tmp_path):
    ugly = tmp_path / "m" / "abcdef12-existing-py_home_me_proj_.venv_bin_python.json"
    write(ugly, {"x.time_a": [[1.0], [], "v", 100, 1.0]})
    renamed = bench.clean_result_names(tmp_path, "existing-py3.11-torch2.13.0")
    clean = tmp_path / "m" / "abcdef12-existing-py3.11-torch2.13.0.json"
    assert renamed == [(ugly, clean)] and not ugly.exists()
    data = json.loads(clean.read_text())
    assert data["env_name"] == "existing-py3.11-torch2.13.0"
    assert "/" not in data["python"] and "/" not in data["params"]["python"]
    # the same commit benchmarked again: asv writes the ugly name again; its rows join the clean file
    write(ugly, {"x.time_a": [[2.0], [], "v", 200, 1.0], "x.time_b": [[3.0], [], "v", 200, 1.0]})
    bench.clean_result_names(tmp_path, "existing-py3.11-torch2.13.0")
    rows = json.loads(clean.read_text())["results"]
    assert rows["x.time_a"][0] == [2.0] and rows["x.time_b"][0] == [3.0]
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [clean.name]


def test_virtualenv_files_are_left_alone(tmp_path):
    path = tmp_path / "m" / "abcdef12-virtualenv-py3.11-torch2.13.0.json"
    write(path, {}, env="virtualenv-py3.11-torch2.13.0")
    assert bench.clean_result_names(tmp_path, "existing-py3.11-torch2.13.0") == []
    assert path.exists()


def test_committed_results_have_no_local_paths_in_names_or_env():
    for path in (ROOT / "results").glob("*/*.json"):
        assert "_bin_python" not in path.name and "/" not in path.stem
        data = json.loads(path.read_text())
        if "env_name" in data:
            assert "/" not in str(data.get("python", "")) and "_bin_python" not in data["env_name"], path


def test_make_bench_records_samples():
    source = (ROOT / "vmapbench" / "bench.py").read_text()
    assert '"--record-samples"' in source
    assert "clean_result_names(results)" in source


def test_cuda_runs_ask_nvml_whether_cuda_is_there_and_keep_the_fork_server(tmp_path):
    """torch.cuda.is_available() initializes CUDA unless PYTORCH_NVML_BASED_CUDA_CHECK=1, and a
    child forked after that cannot use CUDA (every CUDA point of the first GPU run failed so): a
    CUDA run sets it for every benchmark process; VMAPBENCH_LAUNCH picks another launch method."""
    from vmapbench.bench import NVML_CHECK_ENV, bench_env, launch_args

    assert bench_env("quick", ["cuda"], tmp_path)[NVML_CHECK_ENV] == "1"
    assert NVML_CHECK_ENV not in bench_env("quick", ["cpu"], tmp_path) or os.environ.get(NVML_CHECK_ENV)
    assert launch_args({}) == []
    assert launch_args({"VMAPBENCH_LAUNCH": "spawn"}) == ["--launch-method", "spawn"]
    with pytest.raises(SystemExit, match="VMAPBENCH_LAUNCH"):
        launch_args({"VMAPBENCH_LAUNCH": "fork"})
