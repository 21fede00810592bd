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
