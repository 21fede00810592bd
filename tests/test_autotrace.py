"""engine.auto_trace: replays only after a clean eager call with the same bindings; every function
it cannot show safe keeps eager results exactly (value-dependent branches, side effects, rebinding)."""
import warnings

import pytest
import torch

import engine


def _chain(x):
    return torch.tanh(torch.sin(x) * 1.5 + 0.25).sum(-1)


def test_repeated_calls_replay_one_graph_with_eager_results():
    x = torch.randn(6, 4, 5)
    f = engine.auto_trace(engine.vmap(_chain))
    expected = torch.func.vmap(_chain)(x)
    for _ in range(4):
        torch.testing.assert_close(f(x), expected)
    info = f.traced.cache_info()
    assert f.eager_calls == 2 and info.traces == 1 and info.hits == 1 and not f.impure


def _branchy(x):
    # Python control flow on a tensor value: a recorded graph would freeze one branch.
    if x.sum() > 0:
        return (x * x).sum()
    return x.sin().sum()


def test_value_dependent_branch_keeps_eager_semantics():
    f = engine.auto_trace(engine.grad(_branchy))
    ref = torch.func.grad(_branchy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", engine.TraceFallbackWarning)
        for sign in (1, -1, 1, -1, -1, 1):
            x = sign * (torch.rand(5) + 0.1)
            torch.testing.assert_close(f(x), ref(x))


def test_closure_rebinding_is_seen():
    scale = 2.0

    def scaled(x):
        return x * scale

    f = engine.auto_trace(engine.vmap(scaled))
    x = torch.randn(3, 2)
    torch.testing.assert_close(f(x), x * 2.0)
    torch.testing.assert_close(f(x), x * 2.0)  # recorded under scale=2.0
    torch.testing.assert_close(f(x), x * 2.0)  # replayed
    scale = 3.0
    torch.testing.assert_close(f(x), x * 3.0)
    torch.testing.assert_close(f(x), x * 3.0)
    scale = torch.tensor(4.0)  # a closed-over tensor rebound to another object
    torch.testing.assert_close(f(x), x * 4.0)
    torch.testing.assert_close(f(x), x * 4.0)
    assert not f.impure


def test_global_rebinding_between_calls_is_seen():
    f = engine.auto_trace(engine.vmap(_uses_offset))
    x = torch.randn(3, 2)
    try:
        for offset in (1.0, 1.0, 1.0, 5.0, 5.0, -2.0):
            globals()["OFFSET"] = offset
            torch.testing.assert_close(f(x), x + offset)
    finally:
        globals()["OFFSET"] = 1.0


OFFSET = 1.0


def _uses_offset(x):
    return _helper(x)


def _helper(x):  # reached through a global: its own globals are guarded too
    return x + OFFSET


def test_rejects_non_callables():
    with pytest.raises(TypeError, match="must be callable"):
        engine.auto_trace(3)
