"""Automatic tracing by default: transformed functions called again and again replay a recorded
graph only where that is proven to give the eager result; every function with an effect the replay
would skip, or whose state changes between calls, keeps eager semantics exactly."""
import io
import os
import random
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import engine
import engine.autotrace
from engine.autotrace import autotraced_state

CALLS = 5


def _eager_twin(f, *args, **kwargs):
    with engine.auto_tracing(False):
        return f(*args, **kwargs)


def _replayed(f) -> bool:
    state = autotraced_state(f)
    return state is not None and state.impure is None and state.traced.cache_info().hits > 0


def _check_replays(g, ref, make_inputs):
    """`g` (an engine transform) equals `ref` (torch.func's) call after call, and replays."""
    for _ in range(CALLS):
        args = make_inputs()
        torch.testing.assert_close(g(*args), ref(*args))
    assert _replayed(g)


# ------------------------------------------------------------------------------------------------
# effects the replay would skip: the function runs eagerly, every call


def test_append_to_a_captured_list_happens_every_call():
    log = []

    def f(x):
        log.append(1)
        return x.sin()

    g = engine.vmap(f)
    x = torch.randn(3, 4)
    for n in range(1, CALLS + 1):
        torch.testing.assert_close(g(x), x.sin())
        assert len(log) == n
    assert "append" in autotraced_state(g).impure


def test_slice_store_into_a_captured_list_happens_every_call():
    """`slots[0:1] = [...]` compiles to STORE_SLICE on Python 3.12 and 3.13 (to BUILD_SLICE and
    STORE_SUBSCR on 3.11): a store into a captured list either way, which a replay would skip."""
    slots = [None]

    def f(x):
        slots[0:1] = [x.sum()]
        return x.sin()

    g = engine.vmap(f)
    for n in range(CALLS):
        x = torch.full((3, 4), float(n))
        torch.testing.assert_close(g(x), x.sin())
        assert slots[0] is not None and slots[0].item() == 4.0 * n
    assert "SLICE" in autotraced_state(g).impure or "STORE_SUBSCR" in autotraced_state(g).impure


COUNTER = 0


def _count(x):
    global COUNTER
    COUNTER += 1
    return x * COUNTER


@pytest.mark.parametrize("wrap", [lambda f: f, engine.auto_trace], ids=["default", "auto_trace"])
def test_global_counter_increments_every_call(wrap):
    global COUNTER
    COUNTER = 0
    g = wrap(engine.vmap(_count))
    x = torch.randn(3, 2)
    for n in range(1, CALLS + 1):
        torch.testing.assert_close(g(x), x * n)
    assert COUNTER == CALLS
    state = g if isinstance(g, engine.autotrace.AutoTraced) else autotraced_state(g)
    assert "COUNTER" in state.impure and state.eager_calls == CALLS


def test_print_prints_every_call(capsys):
    def f(x):
        print("called")
        return x.cos()

    g = engine.grad(lambda x: f(x).sum())
    x = torch.randn(5)
    for _ in range(CALLS):
        torch.testing.assert_close(g(x), -x.sin())
    assert capsys.readouterr().out.count("called") == CALLS
    assert "print" in autotraced_state(g).impure


def test_write_to_a_captured_stream_happens_every_call():
    out = io.StringIO()

    def f(x):
        out.write("called\n")
        return x.cos()

    g = engine.vmap(f)
    x = torch.randn(3, 5)
    for _ in range(CALLS):
        torch.testing.assert_close(g(x), x.cos())
    assert out.getvalue().count("called") == CALLS and not _replayed(g)


def test_attribute_set_on_self_happens_every_call():
    class Counter:
        def __init__(self):
            self.calls = 0

        def f(self, x):
            self.calls += 1
            return x * 2

    c = Counter()
    g = engine.vmap(c.f)
    x = torch.randn(3, 2)
    for n in range(1, CALLS + 1):
        torch.testing.assert_close(g(x), x * 2)
        assert c.calls == n


def test_python_random_draws_fresh_values_every_call():
    def f(x):
        return x * random.random()

    g = engine.vmap(f)
    x = torch.ones(3, 2)
    random.seed(0)
    got = [g(x) for _ in range(CALLS)]
    random.seed(0)
    want = [x * random.random() for _ in range(CALLS)]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_tolist_read_is_not_frozen():
    threshold = torch.tensor(0.0)

    def f(x):
        return x * 2 if threshold.tolist() > 0 else x * 3

    g = engine.vmap(f)
    x = torch.randn(3, 2)
    for value in (1.0, 1.0, 1.0, -1.0, -1.0, 1.0):
        threshold.fill_(value)
        torch.testing.assert_close(g(x), x * (2 if value > 0 else 3))


def test_value_dependent_branch_follows_the_values():
    def loss(x):
        return (x * x).sum() if x.sum() > 0 else x.sin().sum()

    g = engine.grad(loss)
    ref = torch.func.grad(loss)
    for sign in (1, 1, 1, -1, -1, 1, -1):
        x = sign * (torch.rand(5) + 0.1)
        torch.testing.assert_close(g(x), ref(x))


def test_in_place_write_into_an_input_happens_once_per_call():
    def f(x):
        x.add_(1)
        return x * 2

    g = engine.vmap(f)
    x = torch.zeros(3, 2)
    for n in range(1, CALLS + 1):
        torch.testing.assert_close(g(x), torch.full((3, 2), 2.0 * n))
        torch.testing.assert_close(x, torch.full((3, 2), float(n)))


def test_in_place_write_into_a_captured_tensor_happens_once_per_call():
    acc = torch.zeros(2)

    def f(x):
        acc.add_(1)
        return x + acc

    g = engine.vmap(f)
    x = torch.zeros(3, 2)
    for n in range(1, CALLS + 1):
        torch.testing.assert_close(g(x), torch.full((3, 2), float(n)))
    torch.testing.assert_close(acc, torch.full((2,), float(CALLS)))


def test_nonlocal_counter_increments_every_call():
    calls = 0

    def f(x):
        nonlocal calls
        calls += 1
        return x * 2

    g = engine.vmap(f)
    x = torch.randn(3, 2)
    for n in range(1, CALLS + 1):
        torch.testing.assert_close(g(x), x * 2)
        assert calls == n


def test_reseeding_inside_the_function_happens_every_call():
    def f(x):
        torch.manual_seed(7)
        return x + torch.rand(2)

    g = engine.vmap(f, randomness="same")
    x = torch.zeros(3, 2)
    for _ in range(CALLS):
        torch.manual_seed(0)
        got = g(x)
        after = torch.rand(1)  # the generator's state after the call: reseeded by every eager call
        torch.manual_seed(7)
        torch.testing.assert_close(got, x + torch.rand(2))
        torch.testing.assert_close(after, torch.rand(1))


def test_grad_mode_switched_off_inside_stays_off_every_call():
    def f(x):
        torch.set_grad_enabled(False)
        return x * 2

    g = engine.vmap(f)
    x = torch.randn(3, 2)
    for _ in range(CALLS):
        torch.set_grad_enabled(True)
        torch.testing.assert_close(g(x), x * 2)
        assert not torch.is_grad_enabled()
    torch.set_grad_enabled(True)


def test_numpy_read_of_a_captured_tensor_is_not_frozen():
    gain = torch.tensor([2.0])

    def f(x):
        return x * float(gain.numpy()[0])

    g = engine.vmap(f)
    x = torch.randn(3, 2)
    for value in (2.0,) * CALLS + (3.0,):
        gain.fill_(value)
        torch.testing.assert_close(g(x), x * value)


def test_a_function_that_used_the_for_loop_fallback_stays_eager():
    from engine._dispatch import _note_fallback  # what the dispatcher calls when an op has no rule

    def f(x):
        _note_fallback(torch.ops.aten.sin.default)
        return x.sin()

    g = engine.vmap(f)
    x = torch.randn(3, 2)
    with engine.fallback_policy("silent"):
        for n in range(1, CALLS + 1):
            with engine.record_fallbacks() as seen:
                torch.testing.assert_close(g(x), x.sin())
            assert seen.total == 1  # every call reaches the fallback, as an eager call does
    assert "fallback" in autotraced_state(g).impure


# ------------------------------------------------------------------------------------------------
# state changed between calls: the change is seen


class _Mode(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.scale = 2.0

    def forward(self, x):
        y = self.lin(x) * self.scale
        return y if self.training else y + 100.0


def _functional(model):
    params = {k: v.detach() for k, v in model.named_parameters()}
    return params, engine.vmap(lambda x: torch.func.functional_call(model, params, (x,)))


def test_train_eval_toggle_between_calls_is_seen():
    model = _Mode()
    params, g = _functional(model)
    x = torch.randn(5, 4)
    for training in (True, True, True, False, False, False, True, True):
        model.train(training)
        want = torch.func.functional_call(model, params, (x,))
        torch.testing.assert_close(g(x), want)


def test_module_attribute_and_hook_changes_between_calls_are_seen():
    model = _Mode()
    params, g = _functional(model)
    x = torch.randn(5, 4)
    for _ in range(CALLS):
        torch.testing.assert_close(g(x), torch.func.functional_call(model, params, (x,)))
    assert _replayed(g)
    model.scale = 5.0
    for _ in range(3):
        torch.testing.assert_close(g(x), torch.func.functional_call(model, params, (x,)))
    handle = model.lin.register_forward_hook(lambda mod, inp, out: out * 0 + 7.0)
    for _ in range(3):
        torch.testing.assert_close(g(x), torch.full((5, 3), 7.0 * 5.0))
    handle.remove()
    for _ in range(3):
        torch.testing.assert_close(g(x), torch.func.functional_call(model, params, (x,)))


def test_parameter_replaced_and_global_hook_added_between_calls_are_seen():
    model = nn.Linear(4, 3)
    for p in model.parameters():
        p.requires_grad_(False)
    g = engine.vmap(model)
    x = torch.randn(5, 4)
    for _ in range(CALLS):
        torch.testing.assert_close(g(x), model(x))
    assert _replayed(g)
    model.weight = nn.Parameter(torch.ones(3, 4), requires_grad=False)
    for _ in range(3):
        torch.testing.assert_close(g(x), model(x))
    handle = nn.modules.module.register_module_forward_hook(lambda mod, inp, out: out + 1.0)
    try:
        for _ in range(3):
            torch.testing.assert_close(g(x), x @ model.weight.T + model.bias + 1.0)
    finally:
        handle.remove()
    torch.testing.assert_close(g(x), model(x))


def test_closure_rebinding_and_captured_list_item_change_are_seen():
    scale = 2.0
    weights = [torch.ones(2)]

    def f(x):
        return x * scale + weights[0]

    g = engine.vmap(f)
    x = torch.randn(3, 2)
    for s, w in ((2.0, 1.0), (2.0, 1.0), (2.0, 1.0), (3.0, 1.0), (3.0, 1.0), (3.0, 4.0), (3.0, 4.0)):
        scale = s
        if weights[0][0] != w:
            weights[0] = torch.full((2,), w)
        torch.testing.assert_close(g(x), x * s + w)


def test_randomness_different_draws_fresh_values_equal_to_eager():
    g = engine.vmap(lambda x: x + torch.rand_like(x), randomness="different")
    x = torch.zeros(4, 3)
    draws = []
    for seed in range(CALLS + 1):
        torch.manual_seed(seed)
        got = g(x)
        torch.manual_seed(seed)
        torch.testing.assert_close(got, _eager_twin(g, x), rtol=0, atol=0)
        draws.append(got)
    assert _replayed(g)
    assert len({tuple(d.flatten().tolist()) for d in draws}) == len(draws)


def test_result_that_requires_grad_stays_eager_and_differentiable():
    g = engine.vmap(torch.sin)
    for _ in range(CALLS):
        x = torch.randn(3, 2, requires_grad=True)
        y = g(x)
        (gx,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(gx, x.cos())
    assert not _replayed(g)


def test_result_that_views_its_input_keeps_aliasing_it():
    g = engine.vmap(lambda x: x[:2])
    x, twin = torch.zeros(3, 4), torch.zeros(3, 4)
    for _ in range(CALLS):
        g(x).add_(1)
        _eager_twin(g, twin).add_(1)
        torch.testing.assert_close(x, twin)
    assert not _replayed(g)


def test_object_argument_changed_between_calls_is_seen():
    class Config:
        scale = 2.0

    cfg = Config()
    g = engine.vmap(lambda x, c: x * c.scale, in_dims=(0, None))
    x = torch.randn(3, 2)
    for scale in (2.0,) * CALLS + (5.0,) * 2:
        cfg.scale = scale
        torch.testing.assert_close(g(x, cfg), x * scale)


def test_class_attribute_changed_between_calls_is_seen():
    class Config:
        scale = 2.0

    g = engine.vmap(lambda x: x * Config.scale)
    x = torch.randn(3, 2)
    for scale in (2.0,) * CALLS + (5.0,) * 2:
        Config.scale = scale
        torch.testing.assert_close(g(x), x * scale)
    assert _replayed(g)


def test_default_dtype_change_between_calls_is_seen():
    g = engine.vmap(lambda x: x + torch.tensor([1.0, 2.0]))  # a constant a graph would bake in
    x = torch.zeros(3, 2, dtype=torch.float32)
    try:
        for dtype in (torch.float32,) * CALLS + (torch.float64,) * 2:
            torch.set_default_dtype(dtype)
            assert g(x).dtype == dtype  # the constant's dtype, promoted with the float32 input
    finally:
        torch.set_default_dtype(torch.float32)


# ------------------------------------------------------------------------------------------------
# pure functions get traced


def test_per_sample_grads_of_an_mlp_replay_with_torch_func_results():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, y):
        out = torch.func.functional_call(model, p, (x.unsqueeze(0),))
        return nn.functional.cross_entropy(out, y.unsqueeze(0))

    g = engine.vmap(engine.grad(loss), in_dims=(None, 0, 0))
    ref = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    for _ in range(CALLS):
        x, y = torch.randn(6, 8), torch.randint(0, 3, (6,))
        got, want = g(params, x, y), ref(params, x, y)
        for k in want:
            torch.testing.assert_close(got[k], want[k])
    state = autotraced_state(g)
    assert state.impure is None and state.eager_calls == 2
    assert state.traced.cache_info().traces == 1 and state.traced.cache_info().hits == CALLS - 3


def _split(theta):
    parts, named = [], {}
    for i in range(2):
        parts.append(theta[2 * i:2 * i + 2])
    named["w"] = parts[0]
    return named["w"], parts[1]


def test_lists_and_dicts_the_function_builds_itself_do_not_stop_tracing():
    def loss(theta):
        w, b = _split(theta)
        return (w * w).sum() + b.sin().sum()

    _check_replays(engine.grad(loss), torch.func.grad(loss), lambda: (torch.randn(4),))


def test_logreg_hessian_replays():
    torch.manual_seed(0)
    X, t = torch.randn(40, 5), torch.randint(0, 2, (40,)).float()

    def log_post(w):
        return -nn.functional.binary_cross_entropy_with_logits(X @ w, t, reduction="sum") - 0.5 * (w * w).sum()

    _check_replays(engine.hessian(log_post), torch.func.hessian(log_post), lambda: (torch.randn(5),))


def test_switch_off_runs_eagerly():
    g = engine.vmap(torch.cos)
    x = torch.randn(3, 2)
    with engine.auto_tracing(False):
        for _ in range(CALLS):
            torch.testing.assert_close(g(x), x.cos())
    assert autotraced_state(g) is None
    with pytest.raises(TypeError, match="must be a bool"):
        with engine.auto_tracing(1):
            pass


def test_environment_variable_turns_it_off():
    code = "import engine, engine.autoswitch as s; print(s.auto_tracing_enabled())"
    env = dict(os.environ, VMAPBENCH_AUTO_TRACE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_inner_transforms_of_a_replayed_call_do_not_trace_on_their_own():
    inner = engine.vmap(torch.sin)  # called at top level and inside another transform
    outer = engine.vmap(lambda x: inner(x) * 2)
    x = torch.randn(3, 4, 2)
    for _ in range(CALLS):
        torch.testing.assert_close(outer(x), x.sin() * 2)
        torch.testing.assert_close(inner(x[0]), x[0].sin())
    assert _replayed(outer) and _replayed(inner)
