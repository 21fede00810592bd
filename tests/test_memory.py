"""A call's memory: torch's allocator peak (exact, the same in every process) and XLA's analysis."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from measuring import memory

ROOT = Path(__file__).resolve().parents[1]
FLOAT = 4  # bytes of a float32


def test_the_peak_counts_the_bytes_held_at_once():
    def call() -> torch.Tensor:
        a = torch.empty(1000)
        b = torch.empty(2000)
        del a
        c = torch.empty(500)
        return b + c[:1].sum()

    # a and b (12000 B) at once; then b, c, the sum and the result: 8000 + 2000 + 4 + 8000
    assert memory.alloc_peak_bytes(call) == 18004
    assert memory.peak_bytes(call, "cpu") == 18004


def test_a_call_that_allocates_nothing_is_zero_and_freeing_older_tensors_does_not_lower_it():
    held = [torch.empty(10_000)]
    assert memory.alloc_peak_bytes(lambda: None) == 0
    assert memory.alloc_peak_bytes(lambda: held.clear() or torch.empty(1000)) == 1000 * FLOAT


def test_backward_and_autograd_functional_allocations_are_counted_and_repeat():
    x = torch.randn(64, 32)
    w = torch.randn(32, 32, requires_grad=True)

    def call() -> torch.Tensor:
        return torch.autograd.grad((x @ w).tanh().sum(), w)[0]

    peaks = {memory.alloc_peak_bytes(call) for _ in range(3)}
    assert len(peaks) == 1 and peaks.pop() >= 64 * 32 * FLOAT  # the activations at least


def test_the_profilers_own_lines_are_dropped_and_the_calls_are_kept(capfd):
    memory.alloc_peak_bytes(lambda: print("the call's own line", file=sys.stderr) or torch.empty(3))
    err = capfd.readouterr().err
    assert "the call's own line" in err
    assert not any(noise in err for noise in memory._PROFILER_NOISE)


def test_jax_memory_needs_a_jitted_call():
    with pytest.raises(ValueError, match="jitted JAX call"):
        memory.xla_memory(lambda: None)


def test_xla_memory_analysis_names_its_parts():
    pytest.importorskip("jax")
    import workloads

    w = workloads.get("logreg_hessian")
    state = w.setup(w.params(w.quick[0]), "cpu")
    w.prepare("jax", state)
    got = memory.xla_memory(state.fn("jax"))
    assert set(got) == {"temp", "output", "argument", "alias", "total"}
    assert got["total"] == got["temp"] + got["output"] + got["argument"] - got["alias"] > 0
    assert memory.method_peak_bytes(state.fn("jax"), "jax") == got["total"]


# A sample of workloads, every quick method of each: eager engine and its replays, chunked,
# torch.func, the loop, closed forms, Opacus and BackPACK (torch allocations of a peer's own code),
# and jax (XLA's figure).
SAMPLE = ("psg_mlp", "mlp_hvp")


@pytest.mark.slow  # fresh interpreters importing torch, the peers and jax
def test_two_fresh_processes_give_the_same_bytes():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this process's threads, XLA's pool sized alike
    proc = subprocess.run([sys.executable, "-m", "vmapbench.memory_table", "--processes", "2",
                           "--workloads", ",".join(SAMPLE)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.split("|")[0] in SAMPLE]
    assert len(rows) >= 15 and all(line.endswith("yes") for line in rows)
    assert {"psg_mlp|batch=64|engine_chunked", "psg_mlp|batch=64|opacus_ew", "mlp_hvp|hidden=128,k=8|engine"} <= \
        {line.split()[0] for line in rows}
    assert not any(" 0.0 KiB " in line for line in rows)  # every sampled call allocates
