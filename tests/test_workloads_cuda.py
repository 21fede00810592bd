"""The workloads on a CUDA device: the same code as on CPU with device="cuda".

Skipped, with the reason, on machines without CUDA. Compiled methods stay out (their CPU tests
cover the code path; a CUDA compile costs minutes). Under the CUDA stand-in (the dry run of
`.ci/gpu-check`, workloads.cuda_standin) they run on the CPU, the CUDA graph's test excepted.
"""
from __future__ import annotations

import pytest
import torch

from torch.utils._pytree import tree_leaves

import workloads
from measuring import memory, timer
from peer_skips import skip_unless_installed
from vmapbench import cli
from workloads import COMPILED_METHODS, ENGINE_METHODS, cuda_standin

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; torch.cuda.is_available() is False"),
]

DEVICE = cuda_standin.tensor_device("cuda")  # where 'cuda' tensors live (the CPU under the stand-in)
ALL = [w for w in workloads.all_workloads() if "cuda" in w.devices]
CASES = [(w.name, m) for w in ALL for m in w.methods if m not in COMPILED_METHODS]
ENGINE_CASES = [(n, m) for n, m in CASES if m in ENGINE_METHODS]


# Where no vmap can run on CUDA: nn.LSTM there is cuDNN's fused kernel (aten::_cudnn_rnn), which
# neither torch.func nor the engine batches (torch.func fails inside it; the engine refuses it by
# name). Expected to fail, strictly: the day one of them passes, the mark must go.
CUDNN_RNN = "cuDNN's fused RNN kernel has no batching rule (torch.func fails inside it; the engine refuses it)"
EXPECTED_FAILURES = {("nn_lstm", m): CUDNN_RNN for m in ("torch_func", *ENGINE_METHODS)}


def _cases(cases: list[tuple[str, str]]) -> list:
    return [pytest.param(n, m, id=f"{n}-{m}", marks=[pytest.mark.xfail(reason=EXPECTED_FAILURES[n, m], strict=True)]
                         if (n, m) in EXPECTED_FAILURES else []) for n, m in cases]


def _setup(name: str, method: str):
    w = workloads.get(name)
    skip_unless_installed(method)
    return w, w.setup(w.params(w.sizes[0]), "cuda")


@pytest.mark.parametrize("name,method", _cases(CASES))
def test_method_matches_float64_loop_on_cuda(name: str, method: str) -> None:
    w, state = _setup(name, method)
    out = w.run(method, state)
    leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    assert leaves and all(t.device.type == DEVICE.type for t in leaves)
    w.check(state, [method])


@pytest.mark.parametrize("name,method", _cases(ENGINE_CASES))
def test_engine_method_has_no_fallback_on_cuda(name: str, method: str) -> None:
    import engine

    w, state = _setup(name, method)
    with engine.fallback_policy("error"):
        w.run(method, state)


def test_cuda_peak_bytes_sees_a_temporary_allocation() -> None:
    def allocate() -> None:
        t = torch.ones(64 * 2**20 // 4, device=DEVICE)
        del t

    # (the stand-in's figure is the resident set's, whose freed pages a new allocation may reuse)
    assert memory.cuda_peak_bytes(allocate, "cuda") >= (48 if cuda_standin.active() else 64) * 2**20


def test_time_call_synchronizes_on_cuda() -> None:
    a = torch.randn(2048, 2048, device=DEVICE)
    times = timer.time_call(lambda: a @ a, repeat=3, warmup=1, device="cuda")
    assert len(times) == 3 and all(t > 0 for t in times)


def test_cli_run_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "logreg_hessian", "--device", "cuda", "--size", "n=100,d=16", "-m", "loop,torch_func,closed_form",
            "--repeat", "2", "--check"]
    assert cli.main(argv) == 0
    assert "on cuda" in capsys.readouterr().out


@pytest.mark.skipif(cuda_standin.active(), reason="a CUDA graph needs a real GPU (the CUDA stand-in runs on the CPU)")
def test_a_fused_cuda_program_replays_as_a_cuda_graph_with_the_replays_results():
    """engine.fused.CudaGraphed on a real GPU (its logic is tested on CPU in
    tests/test_cuda_paths_on_cpu.py): the program is captured at its first call, and every later
    call's result equals the replay's within the fused tier's tolerance, for new inputs each time."""
    import engine
    from engine import fused

    X = torch.randn(64, 8, device="cuda")

    def logp(w: torch.Tensor) -> torch.Tensor:
        return -torch.nn.functional.softplus(X @ w).sum() - 0.5 * (w * w).sum()

    traced = engine.trace(engine.vmap(engine.hessian(logp)))
    w = torch.randn(4, 8, device="cuda")
    with engine.fused_tier("force"):
        traced(w)
        traced(w)
        (entry,) = traced._cache.values()
        assert isinstance(entry.fused, fused.CudaGraphed), traced.tiers()
        for seed in range(3):
            w2 = torch.randn(4, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
            got = traced(w2)
            with engine.fused_tier(False):
                want = traced(w2)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert entry.fused.graph is not None and not entry.fused.plain
