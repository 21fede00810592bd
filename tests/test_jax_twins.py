"""The jax twins of the torch.func tutorials and of the compiled family: each formulation/task
agrees with the torch loop in float64, a compiled workload's jax is the same program as its eager
twin's, jax.jit's compile time is a metric in the compiled family, and the quick profile leaves
these jax methods out (their import and jit would cost seconds per benchmark process there).
The twins live in the workload modules, and importing the registry still does not import jax.

Float32 checks are elsewhere: tests/test_workloads.py (every method at the first size) and
tests/test_user_workloads.py (the tutorials' other formulations and tasks). tests/test_jax_method.py
checks every jax workload at its first size in float64; this file adds the sizes that change the
program (the other NTK formulation, the other ensemble task)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import workloads
from workloads.define import assert_matches

pytest.importorskip("jax")

# Sizes whose program differs from the first size's (which test_jax_method.py checks in float64).
OTHER_PROGRAMS = [("tutorial_ntk", "formulation=jvp_vjp,examples=2"), ("tutorial_ensemble", "task=train_grad,models=4")]


@pytest.mark.parametrize("name,size", OTHER_PROGRAMS)
def test_other_programs_match_the_float64_loop_in_float64(name: str, size: str) -> None:
    w = workloads.get(name)
    state = w.setup(w.params(size), "cpu", dtype=torch.float64)
    assert_matches(state.fn("jax")(), state.fn("loop")(), 1e-9, f"{name} [{size}] jax (float64)")


@pytest.mark.parametrize("compiled,eager,size", [
    ("compiled_logreg_hessian", "logreg_hessian", "n=1000,d=16"),
    ("compiled_psg_mlp", "psg_mlp", "batch=64"),
    ("compiled_mlp_jacobian", "mlp_jacobian", "hidden=32"),
])
def test_compiled_workloads_time_their_eager_twins_jax_program(compiled: str, eager: str, size: str) -> None:
    ours, theirs = workloads.get(compiled), workloads.get(eager)
    a = ours.setup(ours.params(size), "cpu").fn("jax")()
    b = theirs.setup(theirs.params(size), "cpu").fn("jax")()
    for x, y in zip(torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b), strict=True):
        assert torch.equal(x, y)


def test_the_ntk_twin_refuses_an_unknown_formulation() -> None:
    from workloads import tutorials

    w = workloads.get("tutorial_ntk")
    inputs = w.setup(w.params("formulation=jacobian,examples=2"), "cpu").inputs
    with pytest.raises(ValueError, match="unknown NTK formulation 'hessian'"):
        tutorials.tutorial_ntk_jax({**inputs, "formulation": "hessian"})


def test_importing_the_registry_does_not_import_jax() -> None:
    """The twins sit in the workload modules, yet jax (~1 s) is imported only when a jax method is
    built: listing workloads or running the torch methods never pays for it."""
    code = ("import sys, workloads; w = workloads.get('psg_mlp'); w.setup({'batch': 8}, 'cpu').fn('loop')(); "
            "assert not [m for m in sys.modules if m == 'jax' or m.startswith('jax.')], 'jax was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def test_a_twin_run_before_jax_is_imported_says_how_to_build_it() -> None:
    from workloads.peers.jax_methods import Deferred

    with pytest.raises(RuntimeError, match="used before jax was imported.*with_jax"):
        Deferred("not_a_module_anyone_imported").tanh


def test_quick_profile_leaves_the_new_jax_twins_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from suite import probes, selection

    monkeypatch.setenv(selection.PROFILE_ENV, "quick")
    for name in ("tutorial_ntk", "tutorial_ensemble", "tutorial_maml", "compiled_logreg_hessian"):
        w = workloads.get(name)
        assert "jax" in w.not_in_quick and "jax" not in w.quick_methods
        with pytest.raises(NotImplementedError, match="not in the quick profile"):
            probes.setup_case(w, w.quick[0], "jax", "cpu")
    monkeypatch.setenv(selection.PROFILE_ENV, "full")
    w = workloads.get("tutorial_maml")
    assert probes.setup_case(w, w.quick[0], "jax", "cpu").size == w.quick[0]


def test_not_in_quick_must_name_methods_of_the_workload() -> None:
    from workloads.base import Workload

    with pytest.raises(ValueError, match=r"not_in_quick names \['backpack'\]"):
        Workload(name="w", family="f", description="d", grid={"n": [1]}, methods=("loop", "jax"),
                 setup=lambda *a: None, run=lambda *a: None, check=lambda *a: None, not_in_quick=("backpack",))


def test_jit_compile_time_is_a_metric_in_the_compiled_family(monkeypatch: pytest.MonkeyPatch) -> None:
    from suite import bench_first_call, generate, selection

    compile_metric = next(m for m in selection.METRICS if m.name == "track_compile_seconds")
    assert compile_metric.applies(workloads.get("compiled_mlp_jacobian"), "jax", "cpu")
    assert not compile_metric.applies(workloads.get("mlp_jacobian"), "jax", "cpu")
    monkeypatch.setenv(selection.PROFILE_ENV, "full")
    w = workloads.get("compiled_mlp_jacobian")
    (cls,) = generate.workload_classes(bench_first_call._FirstCall, "bench_first_call", [w]).values()
    case = cls()
    case.setup("hidden=32", "jax", "cpu")
    cls.track_compile_seconds.case_setup(w, "hidden=32", "jax", "cpu")  # the metric's own setup
    state = bench_first_call._BUILT[(w.name, "hidden=32", "jax", "cpu")]
    assert "jax" in state._fns  # built in setup (jax imported, data copied): the metric is the jit's first call
    assert case.track_compile_seconds("hidden=32", "jax", "cpu") > 0
