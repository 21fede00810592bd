"""Shadow verification of automatic tracing: every replay also runs the eager call and compares.

The mode is the net under every change of the replay path (CI runs the transform tests with
VMAPBENCH_AUTO_TRACE=verify), so these tests check that it is quiet when the replay is right, loud
when it is not (a planted wrong replay), exact (signed zeros, NaN), and switched as documented.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import engine
from engine import autoswitch
from engine.autotrace import autotraced_state, output_difference
from engine.errors import ReplayMismatchError

CALLS = 5  # first call, watched call, recording call, then replays


def _loss(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w).pow(2).sum()


def test_verify_is_quiet_on_correct_replays_and_returns_the_replay():
    f = engine.vmap(engine.grad(_loss), in_dims=(None, 0))
    w, x = torch.randn(3), torch.randn(6, 4, 3)
    with engine.auto_tracing(verify=True):
        outs = [f(w, x) for _ in range(CALLS)]
    state = autotraced_state(f)
    assert state.traced.cache_info().hits >= 2  # the later calls were replays, each verified
    assert state.eager_calls == 2  # the shadow eager calls are not counted as eager calls
    ref = torch.func.vmap(torch.func.grad(_loss), in_dims=(None, 0))(w, x)
    for out in outs:
        torch.testing.assert_close(out, ref)


def test_verify_raises_on_a_wrong_replay_naming_function_and_output(monkeypatch):
    def scaled(t: torch.Tensor) -> torch.Tensor:
        return t.sin() * 2

    f = engine.vmap(scaled)
    x = torch.randn(4, 3)
    for _ in range(CALLS):
        f(x)
    traced = autotraced_state(f).traced
    real_call = traced._call

    def wrong(*args, **kwargs):  # a replay that drifts by one ulp-scale amount at one element
        out = real_call(*args, **kwargs).clone()
        out[2, 1] += 1e-6
        return out

    monkeypatch.setattr(traced, "_call", wrong)
    with engine.auto_tracing(verify=False):
        f(x)  # verification off: the (planted) replay's result is returned unchecked
    with engine.auto_tracing(verify=True), pytest.raises(ReplayMismatchError, match=r"scaled.*index \(2, 1\)"):
        f(x)


def test_verify_compares_signed_zeros_and_nans_exactly():
    zero, negzero = torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0])
    assert output_difference(zero, negzero, exact=True) is not None
    assert output_difference(zero, zero.clone(), exact=True) is None
    nan = torch.tensor([float("nan"), 2.0])
    assert output_difference(nan, nan.clone(), exact=True) is None
    assert output_difference(nan, torch.tensor([1.0, 2.0]), exact=True) is not None
    assert output_difference((zero, 1.5), (zero, 1.5), exact=True) is None
    assert output_difference((zero, 0.0), (zero, -0.0), exact=True) is not None
    assert output_difference([zero], (zero,), exact=True) is not None  # structure
    assert output_difference(zero, zero.double(), exact=True) is not None  # dtype
    # a fused program's result is judged within the dtype's default tolerance
    assert output_difference(torch.tensor([1.0]), torch.tensor([1.0 + 1e-7]), exact=False) is None
    assert output_difference(torch.tensor([1.0]), torch.tensor([1.1]), exact=False) is not None


def test_verify_replays_random_ops_from_the_eager_random_state():
    f = engine.vmap(lambda t: torch.nn.functional.dropout(t, 0.5) + torch.rand(3), randomness="different")
    x = torch.randn(8, 3)
    with engine.auto_tracing(verify=True):
        for _ in range(CALLS):
            f(x)  # would raise if the replay drew other values than the eager call from one state
    assert autotraced_state(f).traced.cache_info().hits >= 2


def test_auto_tracing_verify_switch_nests_and_restores():
    before = autoswitch.verifying()
    with engine.auto_tracing(verify=True):
        assert autoswitch.verifying()
        with engine.auto_tracing(False):
            assert autoswitch.verifying() and not autoswitch.auto_tracing_enabled()
        with engine.auto_tracing(verify=False):
            assert not autoswitch.verifying()
        assert autoswitch.verifying()
    assert autoswitch.verifying() == before
    with pytest.raises(TypeError, match="verify must be a bool"):
        with engine.auto_tracing(verify="yes"):
            pass


@pytest.mark.parametrize("value,expected", [("verify", (True, True)), ("1", (True, False)), ("0", (False, False)),
                                            (" Off ", (False, False))])
def test_environment_variable_turns_verification_on(monkeypatch, value, expected):
    """engine.autoswitch reads the variable once, at its import (its own module, stdlib only): a
    fresh copy of it loaded under each value, as a new process would load it."""
    import importlib.util

    from engine import autoswitch

    monkeypatch.setenv("VMAPBENCH_AUTO_TRACE", value)
    spec = importlib.util.spec_from_file_location("fresh_autoswitch", autoswitch.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert (fresh.auto_tracing_enabled(), fresh.verifying()) == expected
    assert (fresh.departures == []) is (expected == (True, False))  # the standard state, or one entry for good


def test_environment_variable_with_a_typo_is_an_error():
    env = {**os.environ, "VMAPBENCH_AUTO_TRACE": "verfiy"}
    out = subprocess.run([sys.executable, "-c", "import engine"], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "VMAPBENCH_AUTO_TRACE='verfiy'" in out.stderr
