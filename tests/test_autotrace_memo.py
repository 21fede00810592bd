"""The replay path's argument check (engine.autotrace.AutoTraced._memo): a native check of the last
replayed signature's tensor arguments and of the guarded state, in one C call, instead of the
signature key built in Python. Every call whose arguments, ambient torch state or guarded state
differ from what the memo was built for must not replay through it: each test asserts the result
equals the eager call's, and that the memo path was (or was not) taken where that is the point."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import engine
from engine import autoswitch, autotrace, guardstate
from engine.autotrace import autotraced_state
from tests.threads import run_together

# The memo path is the standard state's (engine.autoswitch.departures empty): a process whose
# default verifies every replay (VMAPBENCH_AUTO_TRACE=verify, CI's second pass) or is off never
# takes it, and builds no memo.
pytestmark = pytest.mark.skipif(bool(autoswitch.departures), reason="automatic tracing is not in the standard state by default")


@pytest.fixture(autouse=True, params=["now", "never"], ids=["native", "python"])
def guard_side(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case against both memos: the native one (guards checking natively, as in a process
    that has imported Dynamo) and the Python one (engine.guardstate._PythonMemo) before that."""
    monkeypatch.setattr(guardstate, "NATIVE_GUARDS", request.param)

SCALE = 2.0


def _sin2(x):
    return x.sin() * 2


# (Each test transforms a lambda of its own: equal constructions share what was recorded, memos
# included, engine.autotrace.traced_transform.)


def _replaying(fn, *args, calls: int = 5):
    """Call `fn` until its memo is built and used; returns its AutoTraced."""
    for _ in range(calls):
        fn(*args)
    state = autotraced_state(fn) if not isinstance(fn, autotrace.AutoTraced) else fn
    assert state is not None and state.impure is None
    assert state._memo is not None and state._memo.entry is state.traced._mru, "no memo was built"
    return state


@pytest.fixture()
def keys(monkeypatch):
    """The calls that built the signature key in Python (the memo path builds none)."""
    built: list = []
    real = autotrace._fast_signature

    def counting(*args):
        built.append(args)
        return real(*args)

    monkeypatch.setattr(autotrace, "_fast_signature", counting)
    return built


def test_a_memo_hit_replays_without_building_the_key(keys):
    fn = engine.vmap(lambda x: _sin2(x))
    x = torch.randn(4, 3)
    state = _replaying(fn, x)
    keys.clear()
    hits = state.traced.cache_info().hits
    for _ in range(3):
        torch.testing.assert_close(fn(x), x.sin() * 2)
    assert keys == [] and state.traced.cache_info().hits == hits + 3


class _Sub(torch.Tensor):
    pass


_CHANGES = {
    "shape": lambda x: torch.randn(5, 4),
    "dtype": lambda x: x.double(),
    "strides": lambda x: x.t(),  # same key (shape, dtype, ...), other strides
    "zero strides": lambda x: x[:1].expand(4, 4),
    "Parameter": lambda x: torch.nn.Parameter(x.clone(), requires_grad=False),
    "requires_grad": lambda x: x.clone().requires_grad_(),
    "subclass": lambda x: x.clone().as_subclass(_Sub),
    "complex conj": lambda x: torch.complex(x, x.flip(0)).conj(),
}


@pytest.mark.parametrize("change", list(_CHANGES), ids=list(_CHANGES))
def test_other_arguments_than_the_memo_was_built_for_give_the_eager_result(keys, change):
    fn = engine.vmap(lambda x: _sin2(x))
    x = torch.randn(4, 4)
    state = _replaying(fn, x)
    y = _CHANGES[change](x)
    for _ in range(6):  # seen, verified, recorded, replayed (a memo of its own, maybe), ...
        keys.clear()
        out = fn(y)
        assert keys, "the memo answered for arguments it was not built for"
        ref = _sin2(y)
        assert type(out) is type(ref) and out.dtype == ref.dtype and out.requires_grad == ref.requires_grad
        torch.testing.assert_close(out.detach(), ref.detach())
        if state._memo is not None and state._memo.entry is state.traced._mru:
            break  # y's own memo now: x must go through the key again
    torch.testing.assert_close(fn(x), _sin2(x))
    torch.testing.assert_close(fn(x), _sin2(x))


def test_another_number_of_arguments_or_keywords_takes_the_key(keys):
    fn = engine.vmap(lambda x, y: x * y)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    _replaying(fn, x, y)
    keys.clear()
    out = fn(x, y=y)  # (vmap does not map keyword arguments)
    assert keys
    with engine.auto_tracing(False):
        torch.testing.assert_close(out, fn(x, y=y))
    with pytest.raises(TypeError):
        fn(x)  # as the eager call: a missing argument


def test_a_changed_grad_mode_takes_the_key(keys):
    fn = engine.vmap(lambda x: _sin2(x))
    x = torch.randn(4, 3)
    _replaying(fn, x)
    keys.clear()
    with torch.no_grad():
        torch.testing.assert_close(fn(x), x.sin() * 2)
    assert keys


class _Doubling(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 2 if func is torch.ops.aten.sin.default else out


_AMBIENT = {
    "inference mode": (torch.inference_mode, lambda x: x.sin() * 2),
    "autocast": (lambda: torch.autocast("cpu", dtype=torch.bfloat16), lambda x: x.sin() * 2),
    "dispatch mode": (_Doubling, None),
    "default dtype": (None, None),
}


@pytest.mark.parametrize("ambient", list(_AMBIENT), ids=list(_AMBIENT))
def test_ambient_torch_state_the_memo_was_not_built_under_gives_the_eager_result(ambient):
    fn = engine.vmap(lambda x: x.sin() * torch.ones(3) * 2)
    x = torch.randn(4, 3)
    state = _replaying(fn, x)
    eager = state.eager_calls
    if ambient == "default dtype":
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            out = fn(x)
        finally:
            torch.set_default_dtype(before)
        assert out.dtype == torch.float64  # eager: torch.ones is float64 there
        torch.testing.assert_close(out, (x.sin() * 2).double())
        return
    context, expected = _AMBIENT[ambient]
    with context():
        out = fn(x)
        if expected is None:
            with engine.auto_tracing(False):
                ref = fn(x)
        else:
            ref = expected(x)
    assert state.eager_calls == eager + 1
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref)


def _scaled(x):
    return x * SCALE


def test_a_state_change_after_the_memo_gives_the_eager_result():
    global SCALE
    fn = engine.vmap(_scaled)
    x = torch.randn(4, 3)
    _replaying(fn, x)
    try:
        SCALE = 3.0
        for _ in range(6):
            torch.testing.assert_close(fn(x), x * 3.0)
    finally:
        SCALE = 2.0
    torch.testing.assert_close(fn(x), x * 2.0)


def test_a_memo_whose_entry_was_evicted_is_not_used():
    auto = engine.auto_trace(engine.vmap(lambda x: _sin2(x)), cache_size=1)
    a, b = torch.randn(4, 3), torch.randn(5, 3)
    _replaying(auto, a)
    memo = auto._memo
    for _ in range(5):  # b's recording evicts a's entry
        torch.testing.assert_close(auto(b), b.sin() * 2)
    assert memo.entry not in auto.traced._cache.values()
    for _ in range(5):
        torch.testing.assert_close(auto(a), a.sin() * 2)


def test_alternating_signatures_build_a_bounded_number_of_memos():
    fn = engine.vmap(lambda x: _sin2(x))
    a, b = torch.randn(4, 3), torch.randn(5, 3)
    for _ in range(30):
        torch.testing.assert_close(fn(a), a.sin() * 2)
        torch.testing.assert_close(fn(b), b.sin() * 2)
    state = autotraced_state(fn)
    assert state.traced.cache_info().hits > 40
    assert state._memo_builds <= autotrace._MEMO_BUILDS + 4  # then one per doubling of the calls that missed it


def test_threads_with_different_signatures_get_their_own_results():
    fn = engine.vmap(lambda x: _sin2(x))
    inputs = [torch.randn(4, 3), torch.randn(6, 3, dtype=torch.float64), torch.randn(3, 4).t()]
    for x in inputs:
        _replaying(fn, x)
    expected = [_sin2(x) for x in inputs]
    failures: list = []

    def work(i: int) -> None:
        try:
            for _ in range(200):
                out = fn(inputs[i])
                if out.dtype != expected[i].dtype or not torch.equal(out, expected[i]):
                    failures.append(i)
                    return
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    run_together(work, range(len(inputs)))
    assert failures == []


def test_a_memo_proves_the_current_guard():
    # Verifying another signature replaces the guard (it may guard more: what that run read); a
    # memo built from the old one is dropped, and the next is built from the new one.
    fn = engine.vmap(lambda x: _sin2(x))
    a, b = torch.randn(4, 3), torch.randn(5, 3)
    state = _replaying(fn, a)
    assert state._memo.guard is state._guard
    fn(b)
    fn(b)  # seen, verified
    assert state._memo is None
    state = _replaying(fn, a)
    assert state._memo.guard is state._guard
    torch.testing.assert_close(fn(a), a.sin() * 2)


def test_arguments_other_than_tensors_get_no_memo_and_keep_their_exact_keys(keys):
    fn = engine.vmap(lambda x, s: 1 / ((x.abs() + 1) * s), in_dims=(0, None))
    x = torch.randn(4, 3)
    for _ in range(12):
        torch.testing.assert_close(fn(x, 2.0), 1 / ((x.abs() + 1) * 2.0))
    state = autotraced_state(fn)
    assert state._memo is None and state.traced.cache_info().hits >= 8
    assert bool((fn(x, -0.0) < 0).all())  # -0.0: another key than 0.0, as eager gives -inf
    assert bool((fn(x, 0.0) > 0).all())


# A parameter dict (the functional_call pattern) and flat lists/tuples of tensors: their structure
# checked in Python, their tensors by TensorGuards, the state by the Python memo's check or the
# guard's native one (guardstate._FlatArgsMemo: the native tree takes positional tensors only).

def _weighted(p, x):
    return (p["w"] * x).sin().sum() + p["b"].sum()


def _params():
    return {"w": torch.randn(3), "b": torch.randn(2)}


def _warm(fn, *args):
    """Call `fn` until it replays through a memo; its AutoTraced."""
    for _ in range(6):
        fn(*args)
    state = autotraced_state(fn)
    assert state is not None and state.impure is None and state.traced.cache_info().hits
    assert state._memo is not None and state._memo.entry is state.traced._mru, "no memo was built"
    return state


def test_a_parameter_dict_replays_through_a_memo(keys):
    fn = engine.vmap(engine.grad(lambda p, x: _weighted(p, x)), in_dims=(None, 0))
    p, x = _params(), torch.randn(4, 3)
    state = _warm(fn, p, x)
    assert type(state._memo).__name__ == ("_PythonMemo" if guardstate.NATIVE_GUARDS == "never" else "_FlatArgsMemo")
    keys.clear()
    for _ in range(3):
        got = fn(p, x)
        torch.testing.assert_close(got, torch.func.vmap(torch.func.grad(_weighted), in_dims=(None, 0))(p, x))
    assert keys == []


_DICT_CHANGES = {
    "a key renamed": lambda p: {"w": p["w"], "c": p["b"]},
    "the keys reordered": lambda p: {"b": p["b"], "w": p["w"]},
    "a key more": lambda p: {**p, "z": torch.ones(1)},
    "a value of another shape": lambda p: {"w": torch.randn(3), "b": torch.randn(3)},
    "a value of another dtype": lambda p: {"w": p["w"].double(), "b": p["b"]},
    "a value a Parameter": lambda p: {"w": torch.nn.Parameter(p["w"].clone()), "b": p["b"]},
    "an OrderedDict": lambda p: __import__("collections").OrderedDict(p),
    "new tensors, the same layout": lambda p: {"w": torch.randn(3), "b": torch.randn(2)},
}


@pytest.mark.parametrize("change", list(_DICT_CHANGES), ids=list(_DICT_CHANGES))
def test_another_parameter_dict_gives_the_eager_result(change):
    def loss(p, x):
        return sum(((v.sum() if k != "w" else (v * x).sin().sum()) for k, v in p.items()), torch.zeros(()))

    fn = engine.vmap(engine.grad(lambda p, x: loss(p, x)), in_dims=(None, 0))
    ref = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))
    p, x = _params(), torch.randn(4, 3)
    _warm(fn, p, x)
    q = _DICT_CHANGES[change](p)
    for _ in range(5):
        got, want = fn(q, x), ref(q, x)
        assert list(got) == list(want)
        for k in want:
            torch.testing.assert_close(got[k], want[k])
    for k, v in fn(p, x).items():  # and the memo's own dict again
        torch.testing.assert_close(v, ref(p, x)[k])


@pytest.mark.parametrize("container", [list, tuple])
def test_a_list_or_tuple_of_tensors_of_another_length_or_type_gives_the_eager_result(container):
    def loss(ws, x):
        return sum(((w * x).sin().sum() for w in ws), torch.zeros(()))

    fn = engine.vmap(engine.grad(lambda ws, x: loss(ws, x)), in_dims=(None, 0))
    ref = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))
    ws, x = container([torch.randn(3), torch.randn(3)]), torch.randn(4, 3)
    _warm(fn, ws, x)
    other = tuple if container is list else list
    for changed in (container([*ws, torch.randn(3)]), other(ws), container([ws[1], ws[0]]), ws):
        for _ in range(5):
            got, want = fn(changed, x), ref(changed, x)
            assert type(got) is type(want) and len(got) == len(want)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)


def test_a_state_change_after_a_parameter_dicts_memo_gives_the_eager_result():
    scale = [2.0]

    def loss(p, x):
        return (p["w"] * x * scale[0]).sin().sum() + p["b"].sum()

    fn = engine.vmap(engine.grad(lambda p, x: loss(p, x)), in_dims=(None, 0))
    p, x = _params(), torch.randn(4, 3)
    _warm(fn, p, x)
    scale[0] = -3.0  # a list item the function reads: guarded by identity
    for _ in range(4):
        got, want = fn(p, x), torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(p, x)
        for k in want:
            torch.testing.assert_close(got[k], want[k])
