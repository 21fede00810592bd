"""The `jax` method: its jax.numpy models agree with the torch loop in float64 on every workload
that lists it, float32 stays float32, JAX's 64-bit mode is never left on, and an unusable jax
(missing, wrong thread count, no CUDA jaxlib) makes the method skip with a reason."""
from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest
import torch

import workloads
from workloads.define import assert_matches

pytest.importorskip("jax")

JAX_WORKLOADS = [w.name for w in workloads.all_workloads() if "jax" in w.methods]
# Their float64 loop reference alone takes > ~15 s on a loaded 2-core machine.
SLOW = {"nn_cifar_cnn", "nn_lstm", "nn_mnist_cnn", "nn_transformer"}
FLOAT64_TOLERANCE = 1e-9


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in JAX_WORKLOADS]
)
def test_jax_matches_the_float64_loop_in_float64(name: str) -> None:
    import jax

    w = workloads.get(name)
    state = w.setup(w.params(w.sizes[0]), "cpu", dtype=torch.float64)
    out = state.fn("jax")()
    assert all(t.dtype == torch.float64 for t in jax.tree_util.tree_leaves(out))
    assert_matches(out, state.fn("loop")(), FLOAT64_TOLERANCE, f"{name} jax (float64)")
    assert not jax.config.jax_enable_x64, "the float64 call left JAX's 64-bit mode on"


def test_float32_inputs_run_in_float32_after_a_float64_call() -> None:
    w = workloads.get("psg_mlp")
    w.setup({"batch": 8}, "cpu", dtype=torch.float64).fn("jax")()
    out = w.setup({"batch": 8}, "cpu").fn("jax")()
    assert isinstance(out, tuple) and len(out) == 4
    assert [tuple(t.shape) for t in out] == [(8, 128, 784), (8, 128), (8, 10, 128), (8, 10)]
    assert all(t.dtype == torch.float32 for t in out)


def test_jax_method_holds_its_own_copy_of_the_data() -> None:
    w = workloads.get("logreg_hessian")
    state = w.setup(w.params("n=100,d=16"), "cpu")
    first = state.fn("jax")()
    state.inputs["theta"].add_(1.0)  # the jax copy was taken when the method was built: unaffected
    assert torch.equal(state.fn("jax")(), first)


def test_missing_jax_skips_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from workloads.peers import jax_methods

    monkeypatch.setitem(sys.modules, "jax", None)
    with pytest.raises(NotImplementedError, match="needs the jax package"):
        jax_methods.load_jax("cpu")
    w = workloads.get("rosenbrock_hessian")
    with pytest.raises(NotImplementedError, match="jax"):
        w.setup(w.params("d=8"), "cpu").fn("jax")


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for the test, its count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_unequal_thread_counts_refuse(one_torch_thread) -> None:
    import jax  # noqa: F401  (imported without the single-thread XLA flags)

    from workloads.peers import jax_methods

    if jax_methods._single_thread_flags_set():
        pytest.skip("XLA_FLAGS already makes XLA single-threaded in this process")
    with pytest.raises(NotImplementedError, match="1 thread"):
        jax_methods.load_jax("cpu")


def test_an_xla_pool_sized_unlike_torch_refuses(monkeypatch, one_torch_thread) -> None:
    """XLA's pool size is read from PJRT_NPROC: one the user set to another count than torch's
    threads makes the method refuse, naming it."""
    import jax  # noqa: F401

    from workloads.peers import jax_methods

    monkeypatch.setenv("XLA_FLAGS", " ".join(jax_methods.SINGLE_THREAD_FLAGS))
    monkeypatch.setenv("PJRT_NPROC", "2")
    with pytest.raises(NotImplementedError, match="PJRT_NPROC=1"):
        jax_methods.load_jax("cpu")


def test_at_one_torch_thread_xla_runs_one_pool_thread(monkeypatch, xla_pool_in_child) -> None:
    """XLA's intra-op pool is one thread per core by default (loop fusions split over it even with
    Eigen's threads off): the method sizes it to torch's one thread before jax starts."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("XLA's default pool is one thread on one core: nothing to tell apart")
    for name in ("PJRT_NPROC", "NPROC", "XLA_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    assert xla_pool_in_child('from workloads.peers import jax_methods\njax = jax_methods.load_jax("cpu")') == 1


def test_cuda_without_a_cuda_jaxlib_skips() -> None:
    import jax

    from workloads.peers import jax_methods

    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this jaxlib has CUDA")
    with pytest.raises(NotImplementedError, match="CUDA-enabled jaxlib"):
        jax_methods.load_jax("cuda")
