"""engine.recorder: the graph it records is make_fx's (real mode), op for op, and replays exactly."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import engine
from engine.errors import DataDependentError
from engine.recorder import record
from engine.trace import UntraceableError

ROOT = Path(__file__).resolve().parent.parent


def _ops(gm: torch.fx.GraphModule) -> list[str]:
    """The graph's ops, a detach named as an alias: make_fx writes `detach` as `aten.alias` from torch
    2.14 on (the two are one op on a tensor that needs no grad), the recorder as dispatched."""
    return [str(n.target).replace("aten.detach.default", "aten.alias.default")
            for n in gm.graph.nodes if n.op == "call_function"]


def _rosen(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


X = torch.randn(20, 5, generator=torch.Generator().manual_seed(0))


def _logsig(t):
    return torch.nn.functional.logsigmoid(X @ t).sum()


def _mlp_psg():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, t):
        out = torch.func.functional_call(model, p, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, t.unsqueeze(0))

    grads = engine.vmap(engine.grad(loss), in_dims=(None, 0, 0))
    t = torch.tensor([0, 2, 1, 1])
    return (lambda x: list(grads(params, x, t).values())), (4, 6)


CASES = {
    "hessian": (lambda x: [engine.hessian(_rosen)(x)], (7,)),
    # the batching rule of mv calls matmul below autograd: a composite op reaching the mode
    "hessian_composite": (lambda t: [engine.hessian(_logsig)(t)], (5,)),
    "jacfwd": (lambda x: [engine.jacfwd(torch.sin)(x)], (4,)),
    "per_sample_grads": _mlp_psg(),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_graph_is_make_fx_s_op_for_op_and_replays_the_function_bit_for_bit(name):
    fn, shape = CASES[name]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, dtype=torch.float64 if name == "hessian" else torch.float32, generator=g)
    gm = record(fn, [x])
    assert _ops(gm) == _ops(make_fx(fn, tracing_mode="real")(x))
    for _ in range(2):
        y = torch.randn(*shape, dtype=x.dtype, generator=g)
        for got, want in zip(gm(y), fn(y), strict=True):
            assert torch.equal(got, want)


def test_a_fresh_constant_written_in_place_is_copied_at_each_replay():
    def fn(x):
        t = torch.tensor([1.0, 2.0, 3.0])
        t.add_(x)
        return [t * 2]

    gm = record(fn, [torch.ones(3)])
    assert torch.ops.aten.lift_fresh_copy.default in [n.target for n in gm.graph.nodes]
    for _ in range(3):  # a replay writing into the recording's own constant would drift
        assert torch.equal(gm(torch.ones(3))[0], torch.tensor([4.0, 6.0, 8.0]))


def test_a_closed_over_tensor_and_a_generator_are_the_live_objects():
    w = torch.randn(3)
    gen = torch.Generator().manual_seed(0)
    gm = record(lambda x: [x * w + torch.randn(3, generator=gen)], [torch.ones(3)])
    held = {name: getattr(gm, name) for name in ("_tensor_constant0", "_opaque_obj0")}
    # (the generator arrives at the op as another Python object of the same generator)
    assert held["_tensor_constant0"] is w and torch.equal(held["_opaque_obj0"].get_state(), gen.get_state())
    w.mul_(2)  # an in-place update of the weight is seen; the generator advances
    state = gen.get_state()
    got = gm(torch.ones(3))[0]
    gen.set_state(state)
    assert torch.equal(got, w + torch.randn(3, generator=gen))


def test_meta_values_have_the_shapes_and_the_device_is_kept_beside_them():
    gm = record(lambda x: [x.t() @ x], [torch.randn(4, 3)])
    mm = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default)
    val = mm.meta["val"]
    assert (val.device.type, tuple(val.shape), val.dtype) == ("meta", (3, 3), torch.float32)
    assert mm.meta["device"] == torch.device("cpu")


def test_a_value_read_while_recording_raises_instead_of_being_frozen():
    # (engine.trace's guard mode turns such reads into guards or refuses them before they reach
    # the recorder; this is the recorder's own check, for reads from inside composite ops)
    with pytest.raises(DataDependentError, match="_local_scalar_dense"):
        record(lambda x: [x * x.sum().item()], [torch.ones(3)])


def test_a_traced_composite_that_reads_a_value_in_inference_mode_is_refused():
    # In inference mode allclose reaches the modes as one composite op, whose decomposition reads
    # a value: frozen into the graph, a replay would answer with the traced inputs' comparison.
    f = engine.trace(lambda a, b: a * 2 if torch.allclose(a, b) else a)
    with torch.inference_mode():
        a = torch.ones(3)
        with pytest.raises(UntraceableError, match="allclose"):
            f(a, a.clone())


def test_a_first_recording_imports_neither_sympy_nor_dynamo():
    code = textwrap.dedent("""
        import sys, torch, engine
        from engine.recorder import record
        before = {m for m in ("sympy", "torch._dynamo") if m in sys.modules}
        x = torch.randn(5, dtype=torch.float64)
        X = torch.randn(20, 5, dtype=torch.float64)
        gm = record(lambda t: [engine.hessian(lambda w: torch.nn.functional.logsigmoid(X @ w).sum())(t)], [x])
        print(sorted(before), sorted(m for m in ("sympy", "torch._dynamo") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "VMAPBENCH_FUSED": "0", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[] []"


def test_a_traced_graphs_code_is_generated_once_after_its_passes(monkeypatch):
    # The passes that follow a recording rewrite its graph; regenerating its code after each cost
    # most of a recording call. It is generated once, and the replay runs the generated forward,
    # not the lazy module's stand-in (which calls Module.__call__ at every replay).
    from torch.fx._lazy_graph_module import _LazyGraphModule

    generated = []
    real = _LazyGraphModule._real_recompile
    monkeypatch.setattr(_LazyGraphModule, "_real_recompile", lambda self: generated.append(self) or real(self))
    traced = engine.trace(engine.grad(_rosen))
    want = engine.grad(_rosen)(X[0])
    assert torch.equal(traced(X[0]), want)
    (gm,) = traced.graphs()
    assert generated == [gm]
    (entry,) = traced._cache.values()
    forward = getattr(entry.run, "forward", entry.run)  # (script_replay's Warmup holds it)
    assert getattr(forward, "__func__", None) is not _LazyGraphModule._lazy_forward
    assert torch.equal(traced(X[0]), want) and generated == [gm]  # the replay generates nothing
