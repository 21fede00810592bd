"""suite/bench_counts.py: the gate's instruction counts as an asv metric (skips without valgrind, counts repeat)."""
from __future__ import annotations

from pathlib import Path

import pytest

from measuring import counted, counts
from suite import bench_counts, selection


def test_the_points_are_the_gates_counted_workloads_and_methods() -> None:
    assert bench_counts.Instructions.params == [list(counted.COUNTED_WORKLOADS), ["engine", "engine_eager"]]
    assert bench_counts.Instructions.version == selection.SUITE_VERSION


def test_without_valgrind_a_point_is_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counts.shutil, "which", lambda name: None)
    with pytest.raises(NotImplementedError, match="valgrind is not installed"):
        bench_counts.Instructions().setup("rosenbrock_hessian", "engine")


def test_make_bench_leaves_the_counts_out_and_the_asv_selection_has_them() -> None:
    import re

    name = "bench_counts.Instructions.track_instructions('rosenbrock_hessian', 'engine')"
    assert not any(re.search(r, name) for r in selection.bench_regexes("quick"))
    assert any(re.search(r, name) for r in selection.bench_regexes("quick", opt_in=True))
    assert any(re.search(r, "bench_runtime.track_torch_num_threads") for r in selection.bench_regexes("quick"))


# torch's import alone runs for tens of seconds under valgrind: CI's long pass runs it (.ci/run, -m
# long), beside asv continuous, whose counted points take the same path.
@pytest.mark.long
def test_a_count_is_two_samples_that_agree(tmp_path: Path) -> None:
    if counts.available() is not None:
        pytest.skip(counts.available())
    case = bench_counts.Instructions()
    case.setup("rosenbrock_hessian", "engine")
    got = case.track_instructions("rosenbrock_hessian", "engine")
    a, b = got["samples"]
    assert got["number"] == 1 and a > 100_000 and abs(a - b) / a < 0.01, got
