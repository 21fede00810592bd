"""engine.guardstate's native check (one tree of torch's C++ guards) must catch every change the
Python comparison catches: each case below changes one kind of guarded state and asserts that the
native check alone fails, that the full guard fails, and that restoring the state holds again."""
from __future__ import annotations

import types

import pytest
import torch

from engine.guardstate import StateGuard, _standard_dict

# These tests inspect the native check and what is built on it: guards build it at once here.
pytestmark = pytest.mark.usefixtures("native_guards_now")


class Config:
    scale = 2.0


class Slotted:
    __slots__ = ("factor",)

    def __init__(self) -> None:
        self.factor = 3.0


class Holder:
    def __init__(self) -> None:
        self.offset = 0.5


class Other:
    pass


def _make_state():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    items = [1.0, 2.0]
    seen = set()
    cfg = Config()
    slotted = Slotted()
    empty_later = None
    ns = Holder()
    options: dict = {}

    def fn(x):
        del empty_later  # noqa: F821 - makes `empty_later` a cell the function reads
        return net(x) * items[0] * cfg.scale * slotted.factor + ns.offset + len(seen) + len(options)

    return fn, net, items, seen, cfg, slotted, ns, options


def _guard(fn) -> StateGuard:
    guard = StateGuard([fn])
    assert guard.unprovable is None
    if guard._native is None:
        pytest.skip("this torch has no C++ guard manager: the Python comparison runs alone")
    assert guard._native.holds() and guard.holds()
    return guard


def _changes(fn, net, items, seen, cfg, slotted, ns, options):
    """(what changes, change, undo) for each kind of guarded state."""
    linear = net[0]
    weight = linear.weight
    data = weight.data
    cell = next(c for name, c in zip(fn.__code__.co_freevars, fn.__closure__) if name == "items")
    saved = weight.__dict__
    hook = []

    def add_hook():
        hook.append(linear.register_forward_hook(lambda *a: None))

    return [
        ("a module attribute", lambda: setattr(linear, "extra", 1), lambda: delattr(linear, "extra")),
        ("a parameter replaced", lambda: setattr(linear, "weight", torch.nn.Parameter(weight.detach().clone())),
         lambda: setattr(linear, "weight", weight)),
        ("a hook added", add_hook, lambda: hook.pop().remove()),
        ("a training flag", lambda: net.eval(), lambda: net.train()),
        ("a tensor's shape", lambda: setattr(weight, "data", torch.zeros(2, 8)), lambda: setattr(weight, "data", data)),
        ("a tensor's requires_grad", lambda: weight.requires_grad_(False), lambda: weight.requires_grad_(True)),
        ("a list item", lambda: items.__setitem__(0, 5.0), lambda: items.__setitem__(0, 1.0)),
        ("a set grown", lambda: seen.add(1), lambda: seen.discard(1)),
        ("a closure rebound", lambda: setattr(cell, "cell_contents", [1.0, 2.0]), lambda: setattr(cell, "cell_contents", items)),
        ("a class attribute", lambda: setattr(Config, "scale", 4.0), lambda: setattr(Config, "scale", 2.0)),
        ("an instance attribute", lambda: setattr(cfg, "scale", 4.0), lambda: delattr(cfg, "scale")),
        ("a __slots__ value", lambda: setattr(slotted, "factor", 9.0), lambda: setattr(slotted, "factor", 3.0)),
        ("an object's class", lambda: setattr(ns, "__class__", Other), lambda: setattr(ns, "__class__", Holder)),
        ("a namespace attribute", lambda: setattr(ns, "offset", 1.5), lambda: setattr(ns, "offset", 0.5)),
        ("a function's code", lambda: setattr(fn, "__code__", fn.__code__.replace()), None),
        ("a torch setting", lambda: torch.set_default_dtype(torch.float64), lambda: torch.set_default_dtype(torch.float32)),
        # Empty dicts are checked together (all still empty), instance dicts through their slot:
        ("an empty captured dict filled", lambda: options.__setitem__("k", 1), lambda: options.pop("k")),
        ("an empty hook table written directly", lambda: linear._backward_hooks.__setitem__(99, print),
         lambda: linear._backward_hooks.pop(99)),
        ("an empty submodule table written directly", lambda: net[1]._modules.__setitem__("inner", torch.nn.Tanh()),
         lambda: net[1]._modules.pop("inner")),
        ("a parameter's attribute", lambda: setattr(weight, "tag", 1), lambda: delattr(weight, "tag")),
        ("a parameter's __dict__ replaced", lambda: setattr(weight, "__dict__", {}), lambda: setattr(weight, "__dict__", saved)),
    ]


@pytest.mark.parametrize("index", range(21))
def test_the_native_check_fails_on_every_kind_of_change(index):
    state = _make_state()
    fn = state[0]
    guard = _guard(fn)
    what, change, undo = _changes(*state)[index]
    change()
    try:
        assert not guard._native.holds(), f"the native check missed {what}"
        assert not guard.holds(), f"the guard missed {what}"
    finally:
        if undo is not None:
            undo()
    if undo is not None:  # restored: the same objects again, so the Python comparison holds
        assert guard.holds(), f"restoring {what} did not hold"


def test_every_kind_of_change_is_listed():
    assert len(_changes(*_make_state())) == 21


def test_instance_dicts_read_through_their_slot_only_where_getattr_reads_the_same():
    class OwnDict:
        @property
        def __dict__(self):  # noqa: PLE0237 - a class that answers `__dict__` itself
            return {"made": "up"}

    class Intercepting:
        def __getattribute__(self, name):
            return object.__getattribute__(self, name)

    assert _standard_dict(torch.nn.Linear) and _standard_dict(torch.nn.Parameter) and _standard_dict(Holder)
    assert not _standard_dict(OwnDict) and not _standard_dict(Intercepting) and not _standard_dict(Slotted)


def test_a_write_that_restores_the_contents_holds_and_retakes_the_tags():
    fn, net, *_ = _make_state()
    guard = _guard(fn)
    linear = net[0]
    weight = linear.weight
    linear._parameters["weight"] = torch.nn.Parameter(weight.detach().clone())  # two writes (the dict's
    linear._parameters["weight"] = weight  # version tag moves) that leave the same object there
    assert not guard._native.holds()
    assert guard.holds()  # the Python comparison forgives it ...
    assert guard._native is not None and guard._native.holds()  # ... and the tags are taken anew


def test_an_emptied_cell_is_a_change():
    def make():
        value = torch.ones(2)

        def fn(x):
            return x + value

        return fn

    fn = make()
    guard = _guard(fn)
    (cell,) = fn.__closure__
    saved = cell.cell_contents
    del cell.cell_contents
    assert not guard._native.holds() and not guard.holds()
    cell.cell_contents = saved
    assert guard.holds()
