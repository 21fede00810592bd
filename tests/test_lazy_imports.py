"""What the engine's first calls import. torch imports some of its own modules on first use:
sympy (torch.autograd.grad's size check) and Dynamo (a native guard's build) cost a process about
a quarter and over half a second. Neither the engine's eager calls nor its recording
(engine.recorder) import either; guards build their native check once Dynamo is there or their
Python checks have cost as much as its import (engine.guardstate.native_checks_pay)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from engine import guardstate
from engine.guardstate import StateGuard
from engine.transforms import autograd_vjp

ROOT = Path(__file__).resolve().parent.parent


def _fresh(code: str) -> str:
    env = {"PYTHONPATH": str(ROOT), "VMAPBENCH_FUSED": "0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_eager_calls_import_neither_sympy_nor_dynamo_and_the_replays_are_right():
    out = _fresh("""
        import sys, torch, engine
        from engine.autotrace import autotraced_state

        def rosen(x):
            return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

        f = engine.hessian(rosen)
        x = torch.randn(6, dtype=torch.float64)
        want = torch.autograd.functional.hessian(rosen, x)
        # (torch.autograd.functional imported nothing new: it ran before the checks below count)
        base = {m for m in ("sympy", "torch._dynamo") if m in sys.modules}
        first = sorted(base)
        seen = []
        for call in range(5):
            got = f(x)
            assert torch.allclose(got, want), call
            new = sorted(m for m in ("sympy", "torch._dynamo") if m in sys.modules and m not in base)
            seen.append(new)
            base.update(new)
            if call == 1:
                guard = autotraced_state(f)._guard
                assert guard is not None and guard._natives is None and guard._deferred
        print(first, seen, autotraced_state(f)._guard._natives is not None)
    """)
    # torch.autograd.functional.hessian imported neither; calls 1-2 (eager, then watched), 3
    # (the recording) and 4-5 (replays) import nothing, and the guard still checks in Python
    assert out.strip() == "[] [[], [], [], [], []] False", out


def test_the_graph_passes_import_neither_sympy_nor_dynamo():
    # the guard's conjunction regrouped (distribution checks on captured values and on the
    # argument) and the identity's matmul dropped against a transposed weight: nodes the passes
    # add get their meta values without meta kernels written in Python (which import sympy)
    out = _fresh("""
        import sys, torch, engine
        import torch.distributions as D
        X, y = torch.randn(30, 4), (torch.rand(30) > 0.5).float()
        W1 = torch.randn(8, 3)

        def log_joint(w):
            return D.Normal(torch.zeros(4), torch.ones(4)).log_prob(w).sum() + D.Bernoulli(logits=X @ w).log_prob(y).sum()

        def u(x):
            return torch.tanh(W1 @ x).sum()

        fs = [(engine.vmap(engine.grad(log_joint)), torch.randn(5, 4)), (engine.vmap(engine.hessian(u)), torch.randn(5, 3))]
        base = {m for m in ("sympy", "torch._dynamo") if m in sys.modules}
        for f, x in fs:
            for call in range(5):
                f(x)
        print(sorted(base), sorted(m for m in ("sympy", "torch._dynamo") if m in sys.modules))
    """)
    assert out.strip() == "[] []", out


def test_the_fused_tiers_disk_lookup_imports_neither_sympy_nor_dynamo(tmp_path):
    # the fused tier asks, at a signature's MIN_REPLAYS-th replay, whether its program is on disk
    # under inductor's cache directory; without TORCHINDUCTOR_CACHE_DIR that directory is
    # inductor's default, found without importing torch._inductor (whose __init__ imports both)
    code = textwrap.dedent("""
        import sys, torch, engine
        from engine import fused
        f = engine.hessian(lambda x: (x.sin() ** 2).sum())
        x = torch.randn(4)
        for call in range(3 + fused.MIN_REPLAYS + 2):
            f(x)
        imported = sorted(m for m in ("sympy", "torch._dynamo") if m in sys.modules)
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        print(imported, fused.INDEX.root == fused.Path(cache_dir()) / "vmapbench-fused")
    """)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[] True", out.stdout


def test_autograd_vjp_equals_torch_autograd_grad_and_defers_to_it_on_a_mismatch():
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    out = (x.sin() * w).sum(1)
    v = torch.randn(3)
    want = torch.autograd.grad(out, (x, w), v, retain_graph=True, allow_unused=True)
    got = autograd_vjp([out], [x, w], [v], create_graph=False, retain_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        autograd_vjp([out], [x, w], [torch.randn(4)], create_graph=False, retain_graph=True)
    with pytest.raises(RuntimeError, match="For complex Tensors"):
        autograd_vjp([out], [x, w], [torch.randn(3, dtype=torch.complex64)], create_graph=False, retain_graph=True)


def test_a_guard_checks_in_python_until_its_checks_cost_the_import_then_builds_the_native_check(monkeypatch):
    monkeypatch.setattr(guardstate, "NATIVE_GUARDS", "auto")
    monkeypatch.setattr(guardstate, "_NATIVE_NEEDS", "no.module.of.this.name")
    monkeypatch.setattr(guardstate, "_python_checks_s", [0.0])
    monkeypatch.setattr(guardstate, "NATIVE_IMPORT_S", float("inf"))
    net = torch.nn.Linear(3, 2)

    def fn(x):
        return net(x)

    guard = StateGuard([fn])
    assert guard._deferred and guard._natives is None
    assert guard.holds() and guard.holds() and guard._natives is None
    assert guardstate._python_checks_s[0] > 0  # what the Python checks cost, counted
    net.weight = torch.nn.Parameter(torch.randn(2, 3))  # a change the Python check sees
    assert not guard.holds()
    guard = StateGuard([fn])
    monkeypatch.setattr(guardstate, "NATIVE_IMPORT_S", guardstate._python_checks_s[0])  # spent as much as the import
    assert guard.holds() and not guard._deferred and guard._native is not None
    net.bias = torch.nn.Parameter(torch.randn(2))  # and the native check sees one too
    assert not guard._native.holds() and not guard.holds()


def test_a_decomposed_op_imports_neither_sympy_nor_dtensor_and_equals_torch_func():
    # matmul called by a batching rule on a tensor batched at an inner level reaches the engine as
    # a composite op, which it decomposes: by the op's C++ decomposition, its parts dispatched
    # through the level's VmapMode (torch's Python decomposition imports the symbolic-shape
    # module; parts dispatched by subclass make torch import torch.distributed.tensor)
    out = _fresh("""
        import sys, torch, engine
        a, b = torch.randn(2, 3, 4, 5, dtype=torch.float64), torch.randn(2, 3, 5, dtype=torch.float64)
        got = engine.vmap(engine.vmap(lambda x, y: x @ y))(a, b)
        want = torch.func.vmap(torch.func.vmap(lambda x, y: x @ y))(a, b)
        print(torch.allclose(got, want, rtol=1e-12, atol=1e-12), sorted(m for m in ("sympy", "torch.distributed.tensor") if m in sys.modules))
    """)
    assert out.strip() == "True []", out


def test_a_backward_pass_after_its_vmap_returned_imports_no_dtensor_and_equals_torch_func():
    # grad of a function that vmaps inside: the backward pass runs ops on batched tensors after the
    # vmap returned (engine._dispatch.BatchedRoute routes them; by subclass, torch would import
    # torch.distributed.tensor to ask whether they are DTensors)
    out = _fresh("""
        import sys, torch, engine
        w = torch.randn(4, dtype=torch.float64)
        xs = torch.randn(8, 4, dtype=torch.float64)
        f = lambda eng: (lambda w: eng.vmap(lambda x: torch.tanh(x @ w))(xs).sum())
        got = engine.grad(f(engine))(w)
        imported = sorted(m for m in ("sympy", "torch.distributed.tensor") if m in sys.modules)
        want = torch.func.grad(f(torch.func))(w)  # (torch.func imports sympy itself)
        print(torch.allclose(got, want, rtol=1e-12, atol=1e-12), imported)
    """)
    assert out.strip() == "True []", out
