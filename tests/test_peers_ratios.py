"""`python -m vmapbench.peer_ratios`: which workloads it measures, that it times only methods that
passed their check, and how it reports ratios, skips and failures."""
from __future__ import annotations

import argparse
import json
import math
import sys

import pytest

import workloads
from vmapbench import peer_ratios
from vmapbench.peer_ratios import Row

pytest.importorskip("jax")


def test_default_selection_is_every_workload_with_jax_and_our_replayed_path() -> None:
    names = {w.name for w in peer_ratios.selected_workloads(None, None)}
    assert names == {w.name for w in workloads.all_workloads() if "jax" in w.methods}
    assert {"tutorial_ntk", "tutorial_maml", "compiled_psg_mlp", "nn_lstm"} <= names
    assert {w.name for w in peer_ratios.selected_workloads(None, "compiled")} == {
        "compiled_logreg_hessian", "compiled_psg_mlp", "compiled_mlp_jacobian"}


def test_a_named_workload_without_a_peer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    w = workloads.get("mlp_hvp")
    monkeypatch.setattr(w, "methods", tuple(m for m in w.methods if m != "jax"))
    with pytest.raises(SystemExit, match="needs one of .* and a peer method"):
        peer_ratios.selected_workloads(["mlp_hvp"], None)


def test_measures_checked_methods_side_by_side() -> None:
    w = workloads.get("rosenbrock_hessian")
    row = peer_ratios.measure_workload(w, "d=8", rounds=3, budget_s=0.2, fused=False)
    assert row.ours == "engine_traced"
    assert set(row.first_call) == {"engine_traced", "jax"} and all(v["cold"] > 0 for v in row.first_call.values())
    assert row.fused_state == "replay" == row.tier  # the fused tier was off: nothing compiled, the replay ran
    assert "| rosenbrock_hessian |" in peer_ratios.compile_markdown([row])
    assert set(row.samples) == {"engine_traced", "torch_func", "jax"} and not row.failed and not row.skipped
    assert len({len(s) for s in row.samples.values()}) == 1 and len(row.samples["jax"]) >= 3  # one per round
    assert all(s > 0 for s in row.seconds.values())
    assert row.best_peer == "jax"
    q1, q3 = row.quartiles("engine_traced", "jax")
    assert q1 <= row.ratio("engine_traced", "jax") <= q3


def test_the_default_path_is_measured_with_ours_default() -> None:
    w = workloads.get("rosenbrock_hessian")
    row = peer_ratios.measure_workload(w, "d=8", rounds=3, budget_s=0.2, fused=False, default_path=True)
    assert row.ours == "engine" and set(row.first_call) == {"engine", "jax"}
    assert set(row.samples) == {"engine", "torch_func", "jax"} and not row.failed and not row.skipped


def test_a_default_path_that_runs_eagerly_is_reported_eager_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tier column said "replay" for a default path whose every call ran eagerly (the lent
    H100: every function impure under torch 2.11 on Python 3.12). It says eager, and why."""
    from engine import purity

    w = workloads.get("logreg_hessian")  # its method's function is a new closure per set-up: verified anew
    replaying = peer_ratios.measure_workload(w, "n=100,d=16", rounds=3, budget_s=0.2, fused=False, default_path=True)
    assert replaying.fused_state == "replay" == replaying.tier
    monkeypatch.setattr(purity, "code_effect", lambda code: f"{code.co_name} does a planted store")
    eager = peer_ratios.measure_workload(w, "n=100,d=16", rounds=3, budget_s=0.2, fused=False, default_path=True)
    assert eager.fused_state.startswith("eager: it has an effect besides its result") and "planted" in eager.fused_state
    assert eager.tier == "eager"
    assert "| eager: it has an effect" in peer_ratios.compile_markdown([eager])


def test_the_compiled_family_is_measured_by_engine_compiled() -> None:
    assert peer_ratios.ours_of(workloads.get("compiled_psg_mlp")) == "engine_compiled"
    assert peer_ratios.ours_of(workloads.get("tutorial_ntk")) == "engine_traced"
    # --ours default: the default path where the workload has it, the replayed method where not
    assert peer_ratios.ours_of(workloads.get("tutorial_ntk"), default_path=True) == "engine"
    assert peer_ratios.ours_of(workloads.get("compiled_psg_mlp"), default_path=True) == "engine_compiled"
    with pytest.raises(ValueError, match="has none of"):
        peer_ratios.ours_of(workloads.Workload(name="w", family="f", description="d", grid={"n": [1]},
                                               methods=("loop", "jax"), setup=None, run=None, check=None))


def test_a_method_failing_its_check_is_reported_and_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    w = workloads.get("rosenbrock_hessian")
    real_check = w.check

    def check(state, methods=None):  # the jax twin disagreeing with the loop
        if methods == ["jax"]:
            raise AssertionError("rosenbrock_hessian jax: output 0 differs from the float64 loop")
        return real_check(state, methods)
    monkeypatch.setattr(w, "check", check)
    row = peer_ratios.measure_workload(w, "d=8", rounds=3, budget_s=0.2, jax_reason=None, fused=False)
    assert "jax" not in row.samples and "differs from the float64 loop" in row.failed["jax"]
    assert row.best_peer is None and math.isnan(row.ratio("engine_traced", row.best_peer))
    assert any("jax FAILED" in line for line in peer_ratios.notes([row]))
    skipped = peer_ratios.measure_workload(w, "d=8", rounds=3, budget_s=0.2, jax_reason="no jax here",
                                            fused=False)
    assert skipped.skipped == {"jax": "no jax here"}


def test_the_device_reaches_set_up_timing_and_first_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """--device cuda's path, exercised on CPU: every state is set up on the device asked for, and the
    first calls and the timed batches wait for that device (a GPU's queued work is in the time)."""
    from measuring import timer
    from suite import probes

    w = workloads.get("rosenbrock_hessian")
    set_up, synced, timed = [], [], []
    real_setup, real_samples = w.setup, probes.interleaved_samples
    monkeypatch.setattr(w, "setup", lambda params, device: set_up.append(device) or real_setup(params, "cpu"))
    monkeypatch.setattr(timer, "synchronize", synced.append)
    monkeypatch.setattr(probes, "interleaved_samples",
                        lambda calls, device, **kw: timed.append(device) or real_samples(calls, "cpu", **kw))
    row = peer_ratios.measure_workload(w, "d=8", rounds=3, budget_s=0.2, fused=False, device="cuda")
    assert row.device == "cuda" and not row.failed
    assert set_up == ["cuda"] * 3  # the timed state, and a fresh one for each of ours' and jax's warm first call
    # two first calls each for ours and jax, the queue drained before and after each
    assert synced.count("cuda") == 8 and timed == ["cuda"]


def test_device_cuda_without_a_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    parser = argparse.ArgumentParser()
    peer_ratios.configure(parser)
    with pytest.raises(SystemExit, match="--device cuda, but torch sees no CUDA device"):
        peer_ratios.main(parser.parse_args(["-w", "rosenbrock_hessian", "--device", "cuda"]))


def test_markdown_table_shows_the_ratios() -> None:
    # Three rounds; the second was slowed for everyone by a load burst, the third for ours alone.
    row = Row("psg_mlp", "batch=64", "engine_traced", samples={
        "engine_traced": [0.004, 0.008, 0.006], "torch_func": [0.012, 0.024, 0.012],
        "jax": [0.008, 0.016, 0.008], "opacus_ew": [0.005, 0.010, 0.005]})
    assert row.best_peer == "opacus_ew" and row.seconds["jax"] == 0.008
    assert row.round_ratios("engine_traced", "jax") == [0.5, 0.5, 0.75]
    assert row.quartiles("engine_traced", "jax") == (0.5, 0.625)
    line = peer_ratios.markdown([row]).splitlines()[2]
    assert line == ("| psg_mlp | batch=64 | engine_traced | 6 ms | 12 ms | 8 ms | 0.50 (0.50-0.62) | opacus_ew "
                    "| 0.80 (0.80-1.00) | 0.33 | 0.42 |")
    empty = peer_ratios.markdown([Row("w", "n=1", "engine_traced", samples={"engine_traced": [0.001]})]).splitlines()[2]
    assert empty == "| w | n=1 | engine_traced | 1 ms | - | - | - | (none ran) | - | - | - |"


def test_main_prints_the_table_and_writes_results(tmp_path, monkeypatch, capsys) -> None:
    import vmapbench.bench as bench

    monkeypatch.setattr(bench, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(bench, "git", lambda root, *args: "0123456789abcdef")
    monkeypatch.setenv(bench.MACHINE_ENV, "test-box")
    parser = argparse.ArgumentParser()
    peer_ratios.configure(parser)
    args = parser.parse_args(["-w", "rosenbrock_hessian", "--size", "d=8", "--rounds", "3", "--budget-s", "0.2",
                              "--write", "--threads", str(__import__("torch").get_num_threads())])
    assert peer_ratios.main(args) == 0
    out = capsys.readouterr().out
    assert "| rosenbrock_hessian | d=8 | engine_traced |" in out
    document = json.loads((tmp_path / "results" / "peer_ratios" / "test-box" / "01234567.json").read_text())
    assert document["device"] == "cpu" and document["rows"][0]["device"] == "cpu"
    assert document["rows"][0]["best_peer"] == "jax" and set(document["rows"][0]["seconds"]) >= {"jax"}
    assert len(document["rows"][0]["samples"]["jax"]) >= 3
    with pytest.raises(SystemExit, match="--size needs exactly one"):
        peer_ratios.main(parser.parse_args(["--size", "d=8"]))


def test_peer_ratios_runs_itself_again_with_malloc_keeping_its_pages(monkeypatch):
    # glibc reads GLIBC_TUNABLES at process start: without it set, the program runs again with it
    # (the same command line); with it set, even empty (the opt-out), it runs on as it is.
    from measuring import malloc

    ran: list = []
    monkeypatch.setattr(malloc.os, "execve", lambda path, argv, env: ran.append((path, list(argv), dict(env))))
    monkeypatch.delenv(malloc.VARIABLE, raising=False)
    malloc.reexec_with_tunables("peer_ratios")
    assert len(ran) == 1 and ran[0][1] == list(sys.orig_argv) and ran[0][2][malloc.VARIABLE] == malloc.TUNABLES
    for value in ("", "glibc.malloc.trim_threshold=0"):
        monkeypatch.setenv(malloc.VARIABLE, value)
        malloc.reexec_with_tunables("peer_ratios")
    assert len(ran) == 1
    assert malloc.in_env({malloc.VARIABLE: ""})[malloc.VARIABLE] == ""  # an explicit setting wins
