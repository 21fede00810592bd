"""The memory-limit experiment: the batch search (with a fake probe), budget parsing, the CLI
entry, and one real run of probes forked under RLIMIT_DATA."""
from __future__ import annotations

import math

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
