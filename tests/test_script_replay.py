"""engine.script_replay: a replayed graph run by torch.jit's interpreter returns what its forward
returns, bit for bit, and the forward runs wherever the interpreter would not behave alike."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

import engine
from engine import script_replay, timed_choices
from engine.graph_passes import _same_bits

pytestmark = pytest.mark.skipif(not script_replay.ENABLED, reason="VMAPBENCH_SCRIPTED_REPLAY=0")


@pytest.fixture(autouse=True)
def _build_at_once(monkeypatch):
    # Nothing here counts as heavy (its fastest replay's time an op: on a busy machine a small
    # graph's can pass MAX_OP_S); the test of the heavy rule sets its own threshold.
    monkeypatch.setattr(script_replay, "MAX_OP_S", 1.0)
    with script_replay.build_at_once():  # decide at MIN_CALLS, whatever the graph costs
        yield


def _rosenbrock(x: torch.Tensor) -> torch.Tensor:
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def _entry(traced: engine.trace) -> object:
    (entry,) = traced._cache.values()
    return entry


def _warm(traced, *args, calls: int = 200) -> object:
    for _ in range(calls):
        traced(*args)
        if not isinstance(_entry(traced).run, script_replay.Warmup):
            break
    return _entry(traced)


def _is_scripted(run) -> bool:
    return getattr(run, "forward", None) is not None and not isinstance(run, script_replay.Warmup)


def test_a_hessian_moves_to_the_interpreter_and_agrees_bit_for_bit():
    traced = engine.trace(engine.hessian(_rosenbrock))
    entry = _warm(traced, torch.randn(32, dtype=torch.float64))
    assert _is_scripted(entry.run), entry.run
    for seed in range(5):
        x = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        got = traced(x)
        want = entry.run.forward(x, *entry.feed())[0]
        assert got.dtype == want.dtype and got.stride() == want.stride()
        assert _same_bits(got, want)
        torch.testing.assert_close(got, torch.func.hessian(_rosenbrock)(x), rtol=1e-10, atol=1e-10)


def test_an_automatically_traced_per_sample_gradient_agrees_with_torch_func():
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    params = {k: v.detach() for k, v in net.named_parameters()}

    def loss(p, x):
        return torch.func.functional_call(net, p, (x,)).sum()

    psg = engine.vmap(engine.grad(loss), in_dims=(None, 0))
    x = torch.randn(16, 6)
    for _ in range(200):
        psg(params, x)
    x2 = torch.randn(16, 6)
    got = psg(params, x2)
    want = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x2)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_random_ops_stay_on_the_forward():
    traced = engine.trace(lambda x: ((x * torch.rand_like(x)).sin() + 1).cos() * 2)
    entry = _warm(traced, torch.ones(64))
    assert getattr(entry.run, "__self__", None) is entry.gm  # never counted: the graph is not eligible


def test_a_torch_function_mode_sees_the_ops_of_a_scripted_replay():
    traced = engine.trace(engine.hessian(_rosenbrock))
    x = torch.randn(16, dtype=torch.float64)
    entry = _warm(traced, x)
    assert _is_scripted(entry.run)
    seen: list = []

    class Log(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Log():
        out = entry.run(x, *entry.feed())
    assert any(isinstance(f, torch._ops.OpOverload) for f in seen), seen  # the forward ran: the mode saw aten ops
    assert _same_bits(out[0], entry.run.forward(x, *entry.feed())[0])


def test_inputs_that_require_grad_keep_autograd_through_the_forward():
    w = torch.randn(8, 8, requires_grad=True)
    def f(x, w=w):
        return ((x @ w).tanh() * 2 + 1).sum(0)

    traced = engine.trace(f)
    x = torch.randn(4, 8)
    with torch.no_grad():
        entry = _warm(traced, x)  # (no autograd to record: the build may happen)
    assert _is_scripted(entry.run)
    out = traced(x)
    assert out.requires_grad and out.grad_fn is not None  # grad enabled: the forward ran, autograd recorded
    (g,) = torch.autograd.grad(out.sum(), w)
    w2 = w.detach().requires_grad_(True)
    (want,) = torch.autograd.grad(f(x, w2).sum(), w2)
    torch.testing.assert_close(g, want)
    with torch.no_grad():
        assert _same_bits(traced(x), f(x))


def test_graphs_of_a_few_ops_stay_on_the_forward():
    traced = engine.trace(lambda x: x.sin() * 2)
    entry = _warm(traced, torch.randn(8))
    assert getattr(entry.run, "__self__", None) is entry.gm  # never counted: too small to pay


def test_graphs_of_heavy_ops_stay_on_the_forward(monkeypatch):
    monkeypatch.setattr(script_replay, "MAX_OP_S", 1e-9)  # every op counts as heavy
    traced = engine.trace(engine.hessian(_rosenbrock))
    entry = _warm(traced, torch.randn(16, dtype=torch.float64))
    assert getattr(entry.run, "__self__", None) is entry.gm  # counted, then left on the forward unbuilt
    assert entry not in script_replay.scripted_entries()


def test_a_graph_near_the_threshold_gets_one_answer_per_process(monkeypatch):
    # the first entry's timing decides; a second entry of the same graph and inputs' layout
    # reuses it even where its own fastest replay would say otherwise (engine.timed_choices)
    monkeypatch.setattr(timed_choices, "TABLE", {})
    monkeypatch.setattr(script_replay, "MAX_OP_S", 1.0)  # nothing is heavy: the first entry runs scripted
    x = torch.randn(16, dtype=torch.float64)
    first = _warm(engine.trace(engine.hessian(_rosenbrock)), x)
    assert first in script_replay.scripted_entries()
    (key,) = [k for k in timed_choices.TABLE if k[0] == "replay-heavy"]
    assert timed_choices.TABLE[key] is False
    timed_choices.TABLE[key] = True  # as if a noisier moment had timed it heavy first
    second = _warm(engine.trace(engine.hessian(_rosenbrock)), x)
    assert second not in script_replay.scripted_entries()
    assert getattr(second.run, "__self__", None) is second.gm  # left on the forward, as the kept answer says


def test_outputs_that_differ_in_layout_or_aliasing_are_refused():
    x = torch.randn(4, 4)
    same = [x * 2]
    assert script_replay._same_outputs(same, [x * 2], (x,))
    assert not script_replay._same_outputs(same, [(x * 2).t().contiguous().t()], (x,))  # another stride
    assert not script_replay._same_outputs([x.clone()], [x[:]], (x,))  # a view of an input where there was none
    assert not script_replay._same_outputs(same, [x * 2 + 1e-7], (x,))


def test_the_switch_turns_it_off():
    code = ("import torch, engine; from engine import script_replay as s\n"
            "t = engine.trace(engine.hessian(lambda x: (x ** 3).sum()))\n"
            "[t(torch.randn(8)) for _ in range(300)]\n"
            "(e,) = t._cache.values(); print(s.ENABLED, type(e.run).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "VMAPBENCH_SCRIPTED_REPLAY": "0"})
    assert out.stdout.split() == ["False", "method"], out.stdout


def test_bench_replay_measures_both_sides_of_a_workload():
    from vmapbench import bench_replay

    with engine.fused_tier(False):
        row = bench_replay.measure("rosenbrock_hessian", rounds=3, budget=0.002)
    assert row["scripted"] >= 1 and row["forward_us"] > 0 and row["script_us"] > 0 and row["ratio"] > 0
    assert (script_replay.BUILD_S, script_replay.BUILD_REPLAYS) == (0.0, 0)  # (this module's fixture, restored by measure)


def test_built_functions_live_and_die_with_their_entries():
    import gc
    import weakref

    global_unit = torch.jit._state._python_cu
    before = len(global_unit.get_functions())
    traced = engine.trace(engine.hessian(_rosenbrock))
    entry = _warm(traced, torch.randn(16, dtype=torch.float64))
    assert _is_scripted(entry.run)
    assert len(global_unit.get_functions()) == before  # nothing kept in torch's global unit
    gone = weakref.ref(entry)
    del traced, entry
    gc.collect()
    assert gone() is None
