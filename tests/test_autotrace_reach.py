"""Automatic tracing reaches replay where the state a function reads is provably unchanged, even
when the objects it reaches also hold state it never reads (registry workloads stayed eager for
these reasons: psg_*, bayes_*, tutorial_ensemble); and it still starts over when state it does
read changes."""
from __future__ import annotations

import dataclasses
import functools
import random
import threading
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import engine
from engine.autotrace import autotraced_state

CALLS = 6

# Globals named like attributes the functions below read (`F.softplus`, `t.tanh`): a function
# reading `F.softplus` does not read the global `softplus`, so what it holds (state whose
# attributes differ per thread, an iterator a replay would not advance) is not the function's.
softplus = threading.local()
tanh = iter(range(3))
scale = 2.0


def _attribute_reads(x: torch.Tensor) -> torch.Tensor:
    return (F.softplus(x) * x.tanh()).sum()


def _calls(f, *args):
    """CALLS calls of f (the engine's default path), each compared with the eager call."""
    outs = [f(*args) for _ in range(CALLS)]
    with engine.auto_tracing(False):
        ref = f(*args)
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    return outs


def _hits(f, *args) -> int:
    f(*args)
    state = autotraced_state(f)
    assert state is not None and state.impure is None, state and state.impure
    return state.traced.cache_info().hits


def test_an_attribute_named_like_an_unprovable_global_is_not_a_global_read():
    x = torch.randn(5)
    g = engine.grad(_attribute_reads)
    _calls(g, x)
    assert _hits(g, x) >= CALLS - 2


def _reads_scale(x: torch.Tensor) -> torch.Tensor:
    return (x * scale).sum() + sum(v * scale for v in x.unbind())


def test_a_global_read_in_the_function_and_in_its_comprehension_is_still_guarded():
    global scale
    x = torch.randn(4)
    g = engine.grad(_reads_scale)
    _calls(g, x)
    assert _hits(g, x) > 0
    try:
        scale = -1.0
        torch.testing.assert_close(g(x), torch.full((4,), -2.0))
        torch.testing.assert_close(engine.grad(_reads_scale)(x), torch.full((4,), -2.0))
    finally:
        scale = 2.0


# --- the code that ran: state reached but never read is not walked --------------------------


@dataclasses.dataclass(frozen=True)
class _Model:
    """Like workloads.bayes_models.Model: the log joint the run uses, beside a twin it never calls
    whose state the guard cannot prove (here: attributes that differ per thread)."""

    log_joint: Callable[[torch.Tensor], torch.Tensor]
    twin: Callable[[torch.Tensor], Any]


_per_thread = threading.local()


def _twin(x: torch.Tensor) -> Any:
    return _per_thread.value(x)


def _log_joint(theta: torch.Tensor) -> torch.Tensor:
    return torch.distributions.Normal(0.0, 1.0).log_prob(theta).sum() + (theta.sin() * scale).sum()


def test_a_function_held_beside_the_one_that_runs_is_not_walked():
    model = _Model(_log_joint, _twin)
    points = torch.randn(8, 3)
    g = engine.vmap(engine.grad(lambda theta: model.log_joint(theta)))
    _calls(g, points)
    assert _hits(g, points) >= CALLS - 2


def _sees_every_module() -> Any:
    import sys

    return sys.modules  # never called: its code reaches every module the process imported


def test_a_first_walk_reaching_much_of_the_interpreter_stops_early(monkeypatch):
    # The full walk that precedes the watched run gives up past MAX_MODULES Python modules (it used
    # to walk them all, then fail on some iterator); the walk of the code that ran guards instead,
    # and the function replays, its state still guarded.
    from engine import guardstate

    walks = []
    init = guardstate.StateGuard.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        walks.append((len(self._pymodules), self.unprovable))

    monkeypatch.setattr(guardstate.StateGuard, "__init__", spy)
    model = _Model(_log_joint, _sees_every_module)
    points = torch.randn(8, 3)
    g = engine.vmap(engine.grad(lambda theta: model.log_joint(theta)))
    _calls(g, points)
    assert _hits(g, points) >= CALLS - 2
    first, *rest = walks
    assert first == (guardstate.MAX_MODULES + 1, f"more than {guardstate.MAX_MODULES} Python modules are reachable from the function")
    assert rest and all(unprovable is None and n < 10 for n, unprovable in rest)


def test_state_read_by_the_function_that_runs_is_still_guarded():
    global scale
    model = _Model(_log_joint, _twin)
    points = torch.randn(8, 3)
    g = engine.vmap(engine.grad(lambda theta: model.log_joint(theta)))
    _calls(g, points)
    try:
        scale = -3.0
        with engine.auto_tracing(False):
            expected = g(points)
        torch.testing.assert_close(g(points), expected, rtol=0, atol=0)
    finally:
        scale = 2.0


def test_code_only_the_recording_ran_is_guarded_before_it_replays():
    """The watched run takes one branch of a tensor-valued `if`, the recording the other: what the
    other branch reads (a captured list) is guarded before any replay of it. (The function also
    reaches state only a walk of the code that ran can prove: the rule under test applies.)"""
    factor = [1.0]
    model = _Model(_log_joint, _twin)

    def first(x):
        return x.sin().sum()

    def second(x):
        return (x * factor[0]).sum()

    def f(x):
        if x.sum() > 0:
            return first(x) + 0 * model.log_joint(x)
        return second(x)

    g = engine.grad(f)
    pos, neg = torch.ones(3), -torch.ones(3)
    g(pos), g(pos)  # seen, then verified: only `first` ran
    for _ in range(CALLS + 2):  # recorded down `second`: verified again with it, then replayed
        torch.testing.assert_close(g(neg), torch.ones(3), rtol=0, atol=0)
    assert autotraced_state(g).traced.cache_info().hits > 0
    factor[0] = 5.0
    torch.testing.assert_close(g(neg), torch.full((3,), 5.0), rtol=0, atol=0)


def _random_on_one_branch(model: _Model | None):
    def f(x):
        if x.sum() > 0:
            return x.sin().sum() + (0 * model.log_joint(x) if model is not None else 0)
        return x.cos().sum() * random.random()
    return f


def test_an_effect_only_on_the_recordings_branch_keeps_the_function_eager():
    """Python randomness on the branch only the recording took: a replay would repeat one draw.
    Where the guards walk only the code that ran, the recording is watched and sees it."""
    _check_random_on_one_branch(_random_on_one_branch(_Model(_log_joint, _twin)))


def test_an_effect_only_on_the_recordings_branch_of_a_plain_function():
    """Where the full walk proves the state, a recording that branched on tensor values is not
    kept: the signature records again, watched, and the effect makes the function eager."""
    _check_random_on_one_branch(_random_on_one_branch(None))


def _check_random_on_one_branch(f) -> None:
    g = engine.grad(f)
    pos, neg = torch.ones(3), -torch.ones(3)
    g(pos), g(pos)
    outs = [g(neg) for _ in range(CALLS)]
    assert len({tuple(o.tolist()) for o in outs}) == CALLS  # a fresh draw every call, as eagerly
    assert "Random.random" in (autotraced_state(g).impure or "")


def test_a_pure_function_that_branches_on_tensor_values_still_replays():
    """The recording that branched is recorded again, watched, once: then it replays."""
    def f(x):
        if x.sum() > 0:
            return x.sin().sum()
        return x.cos().sum()

    g = engine.grad(f)
    pos = torch.ones(3)
    for _ in range(6):
        torch.testing.assert_close(g(pos), torch.func.grad(f)(pos), rtol=0, atol=0)
    state = autotraced_state(g)
    assert state.impure is None and state.traced.cache_info().hits > 0


# --- a dataclass's metadata: walked only where code that reads it ran ------------------------


@dataclasses.dataclass
class _Prior:
    scale: float = 2.0


def _scaled_by_fields(theta: torch.Tensor) -> torch.Tensor:
    return (theta.sin() * dataclasses.fields(_Prior)[0].default).sum()


def _scaled_by_name(theta: torch.Tensor) -> torch.Tensor:
    return (theta.sin() * _Prior.__dataclass_fields__["scale"].default).sum()


def _guarded_fields(g) -> list:
    return [obj for obj, _ in autotraced_state(g)._guard.slotted if isinstance(obj, dataclasses.Field)]


def test_a_dataclass_fields_are_not_walked_where_no_code_reads_them():
    """bayes_*'s Model: the Field objects of its class were most of what the replay's check read
    (88 of 127 attributes on bayes_hmc), and no run reads them."""
    model = _Model(_log_joint, _twin)
    points = torch.randn(8, 3)
    g = engine.vmap(engine.grad(lambda theta: model.log_joint(theta)))
    _calls(g, points)
    assert _hits(g, points) >= CALLS - 2
    assert autotraced_state(g)._narrow and _guarded_fields(g) == []


@pytest.mark.parametrize("log_joint", [_scaled_by_fields, _scaled_by_name], ids=["dataclasses.fields", "by name"])
def test_a_field_default_that_the_function_reads_is_guarded(log_joint):
    model = _Model(log_joint, _twin)
    points = torch.randn(8, 3)
    g = engine.vmap(engine.grad(lambda theta: model.log_joint(theta)))
    _calls(g, points)
    assert autotraced_state(g)._narrow and _guarded_fields(g)
    field = _Prior.__dataclass_fields__["scale"]
    try:
        field.default = -1.0
        for _ in range(3):
            torch.testing.assert_close(g(points), -points.cos(), rtol=0, atol=0)
    finally:
        field.default = 2.0
    torch.testing.assert_close(g(points), 2.0 * points.cos(), rtol=0, atol=0)


def _fields_of(cls: type) -> dict:
    """A helper that reads a class's fields directly (as some libraries do), not through the
    dataclasses module."""
    return getattr(cls, "__dataclass_fields__")


def _scaled_by_a_helper(theta: torch.Tensor) -> torch.Tensor:
    # reached through a library module's attribute, whose value the guard does not walk: only
    # the code that ran shows what it reads
    return (theta.sin() * functools._vmapbench_fields_of(_Prior)["scale"].default).sum()


def test_a_field_default_read_by_any_code_that_ran_is_guarded(monkeypatch):
    monkeypatch.setattr(functools, "_vmapbench_fields_of", _fields_of, raising=False)
    model = _Model(_scaled_by_a_helper, _twin)
    points = torch.randn(8, 3)
    g = engine.vmap(engine.grad(lambda theta: model.log_joint(theta)))
    _calls(g, points)
    assert _guarded_fields(g)
    field = _Prior.__dataclass_fields__["scale"]
    try:
        field.default = -1.0
        torch.testing.assert_close(g(points), -points.cos(), rtol=0, atol=0)
    finally:
        field.default = 2.0
