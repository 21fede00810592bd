"""engine.timed_choices: a choice made by timing is taken once per key, and two copies of the same
engine code name their rules alike (so a host loading both can share one table)."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import engine
from engine import timed_choices

ENGINE = Path(engine.__file__).parent


def test_a_choice_is_made_once_per_key(monkeypatch):
    monkeypatch.setattr(timed_choices, "TABLE", {})
    made = []
    assert timed_choices.decided("k", lambda: made.append(1) or "first") == "first"
    assert timed_choices.decided("k", lambda: made.append(2) or "second") == "first"
    assert timed_choices.decided("other", lambda: "third") == "third"
    assert made == [1]


def _copy_of_timed_choices(where: Path, name: str):
    where.mkdir()
    shutil.copy(ENGINE / "timed_choices.py", where / "timed_choices.py")
    spec = importlib.util.spec_from_file_location(name, where / "timed_choices.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_copies_of_one_rule_name_it_alike_and_another_rule_otherwise(tmp_path):
    a = _copy_of_timed_choices(tmp_path / "a", "_copy_a")
    b = _copy_of_timed_choices(tmp_path / "b", "_copy_b")
    assert a.rule(a.decided, 0.5) == b.rule(b.decided, 0.5)  # same code from two files
    assert a.rule(a.decided, 0.5) != a.rule(a.decided, 0.6)  # a threshold is part of the rule

    def near(x):
        return lambda: x > 1

    def other(x):
        return lambda: x >= 1

    assert a.rule(near) != a.rule(other)  # the nested function's code counts, not its address


def test_fastest_times_each_callable_and_keeps_its_best_round():
    calls = []
    best = timed_choices.fastest({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, number=2)
    assert calls == ["a", "a", "b", "b"] * 3  # in turn within each round
    assert set(best) == {"a", "b"} and all(0 <= s < 1 for s in best.values())


def test_the_median_is_a_measured_value():
    assert timed_choices.median([3.0, 1.0, 2.0]) == 2.0
    assert timed_choices.median([4.0, 1.0, 3.0, 2.0]) == 3.0  # the upper middle one, never an average


def test_a_layout_names_what_a_graph_sees_of_a_tensor():
    import torch

    x = torch.zeros(2, 3)
    assert timed_choices.layout(x) == timed_choices.layout(torch.ones(2, 3))
    assert timed_choices.layout(x) != timed_choices.layout(x.t().contiguous().t())  # strides
    assert timed_choices.layout(x) != timed_choices.layout(x.requires_grad_(False).clone().requires_grad_())
