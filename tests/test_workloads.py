"""The workload registry: every method of every workload is correct on CPU at its smallest size,
engine methods hit no fallback, and the registry lists exactly what the suite runs.

Compiled methods (about 30 s of torch.compile each) are only in the `slow` tests at the end.
"""
from __future__ import annotations

import itertools

import pytest
import torch

import workloads
from measuring import memory, timer
from peer_skips import skip_unless_installed
from vmapbench import cli
from workloads import COMPILED_METHODS, ENGINE_METHODS
from workloads.define import CaseState

# Engine bugs reported and not fixed yet: (workload, method) -> the bug. Their cases are strict
# xfails: once the engine is fixed they pass, fail as XPASS, and the entry must go.
KNOWN_ENGINE_BUGS: dict[tuple[str, str], str] = {}  # (workload, method) -> reason: strict xfails, none today

ALL = workloads.all_workloads()


def _cases(methods: set[str]) -> list:
    return [
        pytest.param(w.name, m, id=f"{w.name}-{m}", marks=[pytest.mark.xfail(reason=KNOWN_ENGINE_BUGS[w.name, m], strict=True)]
                     if (w.name, m) in KNOWN_ENGINE_BUGS else [])
        for w in ALL for m in w.methods if m in methods
    ]


EAGER_CASES = _cases(set(workloads.METHODS) - COMPILED_METHODS)
ENGINE_CASES = _cases(ENGINE_METHODS - COMPILED_METHODS)
COMPILED_CASES = [(w.name, m) for w in ALL for m in w.methods if m in COMPILED_METHODS]

_states: dict[str, CaseState] = {}


def smallest_state(name: str) -> CaseState:
    """One CPU state per workload at its smallest size, shared so the float64 reference is computed once."""
    if name not in _states:
        w = workloads.get(name)
        _states[name] = w.setup(w.params(w.sizes[0]), "cpu")
    return _states[name]


def test_registry_lists_what_the_suite_runs() -> None:
    expected = {
        (w.name, m, s, d) for w in ALL for s in w.sizes for d in ("cpu", "cuda") if d in w.devices for m in w.methods
    }
    listed = {(w.name, m, s, d) for w, m, s, d in workloads.iter_cases(devices=("cpu", "cuda"))}
    assert listed == expected
    quick = {(w.name, m, s) for w, m, s, _ in workloads.iter_cases(quick=True)}
    assert quick == {(w.name, m, s) for w in ALL for s in w.quick for m in w.quick_methods}
    assert len({w.name for w in ALL}) == len(ALL)
    assert set(workloads.families()) == {
        "bayes_logreg", "hessians", "per_sample_grads", "bayes_models", "torch_func_tutorials", "compiled"
    }


def test_every_workload_is_well_formed() -> None:
    for w in ALL:
        assert workloads.BASELINE in w.methods, f"{w.name}: the float64 reference needs a loop method"
        assert not set(w.quick) & set(w.heavy), f"{w.name}: a heavy size is in the quick profile"
        assert set(w.heavy) <= set(w.sizes), f"{w.name}: heavy sizes not in its grid"
        assert w.description and w.family


def test_quick_profile_has_at_most_two_compiled_methods() -> None:
    compiled = {(w.name, m) for w, m, _, _ in workloads.iter_cases(quick=True) if m in COMPILED_METHODS}
    assert 1 <= len(compiled) <= 2, compiled


def test_anchor_sizes_are_in_the_quick_profile() -> None:
    """The sizes of shared/ANCHORS.md's figures (Hessian N=1000 D=64, MLP per-sample grads B=64)."""
    assert "n=1000,d=64" in workloads.get("logreg_hessian").quick
    assert "batch=64" in workloads.get("psg_mlp").quick


@pytest.mark.parametrize("name,method", EAGER_CASES)
def test_method_matches_float64_loop(name: str, method: str) -> None:
    skip_unless_installed(method)
    workloads.get(name).check(smallest_state(name), [method])


@pytest.mark.parametrize("name,method", ENGINE_CASES)
def test_engine_method_has_no_fallback(name: str, method: str) -> None:
    import engine

    w = workloads.get(name)
    state = w.setup(w.params(w.sizes[0]), "cpu")  # fresh: a trace must happen under the policy
    with engine.fallback_policy("error"):
        w.run(method, state)


def test_check_rejects_a_wrong_method() -> None:
    w = workloads.get("quadratic_hessian")
    state = w.setup(w.params("d=8"), "cpu")
    right = state.fn("closed_form")()
    state._fns["closed_form"] = lambda: right * 1.01
    with pytest.raises(AssertionError, match="closed_form.*differs from the float64 loop"):
        w.check(state, ["closed_form"])
    state._fns["closed_form"] = lambda: right[:-1]
    with pytest.raises(AssertionError, match="shape"):
        w.check(state, ["closed_form"])


def test_setup_is_seeded_float32_and_casts_for_the_reference() -> None:
    w = workloads.get("psg_mlp")
    a, b = w.setup({"batch": 8}, "cpu"), w.setup({"batch": 8}, "cpu")
    assert all(torch.equal(x, y) for x, y in zip(a.inputs["params"], b.inputs["params"]))
    assert a.inputs["x"].dtype == torch.float32 and a.inputs["y"].dtype == torch.int64
    ref = w.setup({"batch": 8}, "cpu", dtype=torch.float64)
    assert ref.inputs["x"].dtype == torch.float64 and ref.inputs["y"].dtype == torch.int64
    assert torch.equal(ref.inputs["x"].float(), a.inputs["x"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA; tests/test_workloads_cuda.py covers it")
def test_cuda_setup_without_gpu_raises_not_implemented() -> None:
    w = workloads.get("logreg_hessian")
    with pytest.raises(NotImplementedError, match="CUDA"):
        w.setup(w.params(w.sizes[0]), "cuda")


def test_time_call_counts_calls_and_returns_repeat_times() -> None:
    calls = itertools.count()
    times = timer.time_call(lambda: next(calls), repeat=4, warmup=2)
    assert len(times) == 4 and all(t >= 0 for t in times)
    assert next(calls) == 6
    with pytest.raises(ValueError):
        timer.time_call(lambda: None, repeat=0)


def test_rss_delta_sees_a_temporary_allocation() -> None:
    def allocate() -> None:
        t = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched, freed on return
        del t

    assert memory.rss_delta_bytes(allocate) >= 32 * 2**20


def test_cli_list_names_every_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for w in ALL:
        assert w.name in out


def test_cli_run_prints_side_by_side_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "quadratic_hessian", "--size", "d=8", "-m", "loop,closed_form", "--repeat", "2", "--check"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "closed_form" in out and "speedup vs loop" in out and "matches the float64 loop" in out


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["run", "no_such_workload"], "valid workloads: "),
        (["run", "psg_mlp", "-m", "nope"], "valid methods: loop, engine"),
        (["run", "psg_mlp", "--size", "batch=3"], "valid sizes: batch=8, batch=64, batch=256"),
    ],
)
def test_cli_run_errors_list_valid_choices(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert expected in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow
@pytest.mark.parametrize("name,method", COMPILED_CASES, ids=[f"{n}-{m}" for n, m in COMPILED_CASES])
def test_compiled_method_matches_float64_loop(name: str, method: str) -> None:
    workloads.get(name).check(smallest_state(name), [method])


def test_torch_compile_methods_keep_distribution_validation():
    """dynamo's first torch.compile in a process switches torch.distributions' validation off for
    good; the `*_compiled` methods put the default back, so later workloads still raise on invalid
    parameters instead of computing NaN."""
    from torch.distributions import Distribution

    from workloads.methods import wrap

    torch._dynamo.eval_frame.TorchPatcher.patch.cache_clear()  # make the first-compile switch happen again
    assert Distribution._validate_args
    f = wrap("torch_func_compiled", lambda x: x.sin() * 2)
    f(torch.randn(3))
    assert Distribution._validate_args
    with pytest.raises(ValueError, match="Normal"):
        torch.distributions.Normal(0.0, -1.0)
