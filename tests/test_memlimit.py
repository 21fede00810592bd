"""The memory-limit experiment: the batch search (with a fake probe), budget parsing, the CLI
entry, and one real run of probes forked under RLIMIT_DATA."""
from __future__ import annotations

import json
import math
from typing import Callable

import pytest

from vmapbench import cli, memlimit
from vmapbench.memlimit import Probe, search


def fake_probe(limit: int, outcome: str = "over", calls: list[int] | None = None):
    """Fits up to `limit`, fails with `outcome` above it; records the batches asked for."""
    def probe(batch: int) -> Probe:
        if calls is not None:
            calls.append(batch)
        return Probe(batch, "fits", time_s=batch * 1e-3) if batch <= limit else Probe(batch, outcome, message="x")
    return probe


@pytest.mark.parametrize("limit", [1, 5, 17, 1000, 3000, 16383])
@pytest.mark.parametrize("precision", [0.05, 0.25, 1.0])
def test_search_brackets_the_limit_within_the_precision(limit: int, precision: float) -> None:
    calls: list[int] = []
    result = search(fake_probe(limit, calls=calls), start=16, cap=16384, growth=4, precision=precision)
    assert result.status == "ok" and result.limited_by == "memory"
    assert result.max_batch is not None and result.max_batch <= limit
    assert limit <= max(result.max_batch * (1 + precision), result.max_batch + 1)
    assert result.time_at_max_s == pytest.approx(result.max_batch * 1e-3)
    assert len(calls) == len(set(calls)), "a batch was probed twice"
    # growth steps up to the limit, then a bisection of a factor-4 bracket
    assert len(calls) <= math.ceil(math.log(16384 / 16, 4)) + 1 + math.ceil(math.log2(math.log(4) / math.log1p(precision))) + 3


def test_search_reports_the_cap_when_everything_fits() -> None:
    result = search(fake_probe(10**9), start=16, cap=1000)
    assert (result.max_batch, result.limited_by, result.status) == (1000, "cap", "ok")
    assert [p.batch for p in result.probes] == [16, 64, 256, 1000]


def test_search_says_when_time_not_memory_stopped_it() -> None:
    result = search(fake_probe(100, outcome="timeout"), start=16, cap=16384)
    assert result.limited_by == "time" and "time limit" in result.reason


def test_search_when_nothing_fits() -> None:
    result = search(fake_probe(0), start=16, cap=16384)
    assert result.max_batch is None and result.status == "ok" and "not even batch 1" in result.reason


@pytest.mark.parametrize("outcome,status", [("error", "error"), ("skip", "skip")])
def test_search_stops_on_an_error_or_skip(outcome: str, status: str) -> None:
    result = search(fake_probe(100, outcome=outcome), start=16, cap=16384)
    assert result.status == status and result.max_batch is None and result.reason == "x"


def test_search_rejects_bad_arguments_and_outcomes() -> None:
    with pytest.raises(ValueError, match="start <= cap"):
        search(fake_probe(10), start=0)
    with pytest.raises(ValueError, match="outcome"):
        search(lambda b: Probe(b, "maybe"))


def test_parse_bytes() -> None:
    assert memlimit.parse_bytes("1GiB") == 2**30
    assert memlimit.parse_bytes("512MiB") == 512 * 2**20
    assert memlimit.parse_bytes("2G") == 2 * 2**30
    assert memlimit.parse_bytes("1000") == 1000
    with pytest.raises(ValueError, match="memory budget"):
        memlimit.parse_bytes("lots")


def test_per_sample_workloads_have_a_batch_parameter() -> None:
    chosen = memlimit.per_sample_workloads()
    assert {"psg_mlp", "psg_cnn", "logreg_per_example_grads"} <= {w.name for w in chosen}
    for w in chosen:
        assert memlimit.batch_key(w) not in memlimit.fixed_size(w)


def test_cli_registers_memlimit() -> None:
    args = cli.build_parser(load=["memlimit"]).parse_args(["memlimit", "--budget", "256MiB", "-w", "psg_mlp"])
    assert args.command == "memlimit" and args.budget == "256MiB" and args.workloads == ["psg_mlp"]


@pytest.mark.slow
def test_real_probes_fit_and_run_out_of_memory(tmp_path) -> None:
    """psg_mlp's per-sample gradients are ~0.4 MB per example: 16 MiB holds ~16-40 of them with
    torch.func, while the closed form's batch-16 run also fits; forked probes under RLIMIT_DATA."""
    result = memlimit.run_experiment(16 * 2**20, names=["psg_mlp"], methods=["torch_func", "closed_form"],
                                     start=8, cap=256, precision=1.0, probe_timeout=120, log=lambda s: None)
    rows = {r["method"]: r for r in result["rows"]}
    assert rows["torch_func"]["status"] == "ok" and rows["torch_func"]["limited_by"] == "memory"
    assert 8 <= rows["torch_func"]["max_batch"] < 64
    assert rows["closed_form"]["max_batch"] >= 8
    path = memlimit.write_result(result, tmp_path, "testbox", "0123456789abcdef")
    assert path == tmp_path / "results" / "memlimit" / "testbox" / "01234567.json"


# --- the aimed search: a prediction from measured memory and time chooses where to probe ---------

def measured_probe(fits: Callable[[int], bool], peak: Callable[[int], float], wall: Callable[[int], float],
                   failure: str = "over", calls: list[int] | None = None):
    """A probe whose truth is `fits(batch)` and which reports `peak(batch)` bytes and `wall(batch)`
    seconds for the batches that fit (what the real probe measures), whatever their accuracy."""
    def probe(batch: int) -> Probe:
        if calls is not None:
            calls.append(batch)
        if fits(batch):
            return Probe(batch, "fits", time_s=batch * 1e-3, peak_bytes=int(peak(batch)), wall_s=wall(batch))
        return Probe(batch, failure, message="x", wall_s=30.0)
    return probe


def assert_true_bracket(result, limit: int, precision: float, calls: list[int], fits: Callable[[int], bool]) -> None:
    """The row is read off real probes: the answer fit, a probed batch within the precision above it
    failed (or the answer is the largest that fits), and no batch was probed twice."""
    assert result.status == "ok" and result.max_batch == max(b for b in calls if fits(b))
    assert result.max_batch <= limit <= max(result.max_batch * (1 + precision), result.max_batch + 1)
    assert len(calls) == len(set(calls)), "a batch was probed twice"


@pytest.mark.parametrize("limit", [20, 700, 2900, 9000])
def test_aimed_search_finds_a_linear_memory_limit_in_few_probes(limit: int) -> None:
    budget, base = 2**30, 50e6
    per_example = (budget - base) / (limit + 0.5)
    calls: list[int] = []
    result = search(measured_probe(lambda b: b <= limit, lambda b: base + per_example * b, lambda b: 1.0, calls=calls),
                    start=16, cap=16384, precision=0.25, budget=budget, timeout=30.0)
    assert_true_bracket(result, limit, 0.25, calls, lambda b: b <= limit)
    assert result.limited_by == "memory" and (result.guided >= 1 or limit < 64)  # aimed once two batches fit
    # two small batches, at most two 16x jumps, then one probe under the prediction and one that closes it
    assert len(calls) <= 6, calls


def test_aimed_search_probes_the_time_limit_once_or_twice() -> None:
    """A slow method: the probe time grows 0.05 s per example, the limit is 30 s; memory is no limit."""
    def wall(b: int) -> float:
        return 1.0 + 0.05 * b
    calls: list[int] = []
    result = search(measured_probe(lambda b: wall(b) <= 30.0, lambda b: 1e6, wall, failure="timeout", calls=calls),
                    start=16, cap=16384, precision=0.25, budget=2**30, timeout=30.0)
    limit = int((30.0 - 1.0) / 0.05)
    assert_true_bracket(result, limit, 0.25, calls, lambda b: wall(b) <= 30.0)
    assert result.limited_by == "time" and "time limit" in result.reason
    assert sum(1 for b in calls if wall(b) > 30.0) <= 2, "each probe past the time limit costs the whole limit"


@pytest.mark.parametrize("seed", range(40))
def test_a_wrong_prediction_only_costs_probes_never_truth(seed: int) -> None:
    """Memory that grows faster than linearly, and measurements that are noise: the prediction is
    wrong, the answer is still a bracket of real probes within the precision."""
    import random

    rng = random.Random(seed)
    limit = rng.randint(1, 16000)
    precision = rng.choice([0.1, 0.25, 0.5])
    peak = rng.choice([lambda b: 1e3 * b * b, lambda b: rng.uniform(0, 2**31), lambda b: 5e8, lambda b: 2**30 - b])
    calls: list[int] = []
    result = search(measured_probe(lambda b: b <= limit, peak, lambda b: rng.uniform(0.1, 40.0), calls=calls),
                    start=16, cap=16384, precision=precision, budget=2**30, timeout=30.0)
    assert_true_bracket(result, limit, precision, calls, lambda b: b <= limit)
    # the aimed probes are bounded, the rest is the plain growth and bisection
    plain = math.ceil(math.log(16384 / 16, 4)) + 1 + math.ceil(math.log2(math.log(16) / math.log1p(precision))) + 3
    assert len(calls) <= plain + memlimit.GUIDED_PROBES


def test_predict_limit_extrapolates_the_two_largest_fits() -> None:
    fits = [Probe(16, "fits", peak_bytes=10, wall_s=1.0), Probe(64, "fits", peak_bytes=100, wall_s=1.2),
            Probe(128, "fits", peak_bytes=200, wall_s=1.4)]
    # memory: 200 + (b - 128) * 100/64 reaches 1000 at b = 640; time: 1.4 + (b - 128) * 0.2/64 reaches 10 at 2880
    assert memlimit.predict_limit(fits, budget=1000, timeout=10.0) == pytest.approx(640)
    assert memlimit.predict_limit(fits, budget=None, timeout=10.0) == pytest.approx(128 + (10 - 1.4) * 64 / 0.2)
    flat = [Probe(16, "fits", peak_bytes=100, wall_s=1.0), Probe(64, "fits", peak_bytes=100, wall_s=0.9)]
    assert memlimit.predict_limit(flat, budget=1000, timeout=10.0) == math.inf
    assert memlimit.predict_limit(fits[:1], budget=1000, timeout=10.0) is None
    assert memlimit.predict_limit([Probe(16, "fits"), Probe(64, "fits")], budget=1000, timeout=10.0) is None


# --- resuming a run -----------------------------------------------------------------------------------

def test_resumable_rows_refuse_another_experiments_file(tmp_path) -> None:
    path = tmp_path / "abc.json"
    assert memlimit.resumable_rows(path, {"budget_bytes": 1}) == []
    row = {"workload": "psg_mlp", "method": "engine", "size": "", "max_batch": 10}
    path.write_text(json.dumps({"budget_bytes": 2**30, "search": {"precision": 0.25}, "rows": [row]}))
    assert memlimit.resumable_rows(path, {"budget_bytes": 2**30, "search": {"precision": 0.25}}) == [row]
    with pytest.raises(ValueError, match=r"budget_bytes.*--force"):
        memlimit.resumable_rows(path, {"budget_bytes": 2**29, "search": {"precision": 0.25}})


def test_run_experiment_skips_the_pairs_already_done() -> None:
    done = [{"workload": "psg_mlp", "method": m, "size": "", "max_batch": 7, "status": "ok"}
            for m in ("torch_func", "closed_form")]
    lines: list[str] = []
    result = memlimit.run_experiment(2**20, names=["psg_mlp"], methods=["torch_func", "closed_form"], done=done,
                                     log=lines.append)
    assert result["rows"] == done and result["complete"]
    assert any("2 of 2 searches are already in the results file" in line for line in lines)


_RETRY_CHILD = """
import resource, sys
from vmapbench import memlimit

budget = 64 * 2**20
memlimit._limit_memory("cpu", budget)


def allocate():
    block = bytearray(128 * 2**20)
    block[::4096] = b"x" * len(block[::4096])


try:
    allocate()
    sys.exit(2)  # the cap did not hold
except MemoryError:
    pass
assert resource.getrlimit(resource.RLIMIT_DATA)[0] != resource.RLIM_INFINITY
bug = lambda: (_ for _ in ()).throw(ValueError("a bug"))
if not memlimit._passes_with_more_memory(allocate, budget):
    sys.exit(3)  # the retry with more memory did not pass
if memlimit._passes_with_more_memory(bug, budget):
    sys.exit(4)  # an error that is not memory passed
"""


def test_an_unrecognized_failure_that_passes_with_more_memory_counts_as_memory() -> None:
    """In a fresh interpreter capped at its use + 64 MiB: a 128 MiB allocation fails, and passes once
    the cap is raised to RETRY_BUDGET_FACTOR x the budget; an error that is not memory still fails.
    (A fresh process, not a fork of this one: a fork of the test session inherits its address space
    and threads' arenas, and whether 128 MiB more fits then depended on what ran before.)"""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _RETRY_CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child exit {proc.returncode}: {proc.stderr[-2000:]}"
