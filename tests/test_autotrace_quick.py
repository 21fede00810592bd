"""The replay path of automatic tracing (`AutoTraced._call`): one check, `StateGuard.quick`, plus a
few inline reads, stand for the outermost-call check and the guard. Each case below changes what
that path must notice (torch's ambient state, a process setting, another thread's state, a
closure the function reads) after the function reached replay, and asserts that the result
follows: the call runs eagerly (or is verified again) and equals the eager or torch.func result."""
from __future__ import annotations

import dis
import importlib
import pkgutil
import threading
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import engine
from engine import autoswitch, autotrace
from engine.autotrace import autotraced_state

# These tests inspect the native check and what is built on it: guards build it at once here.
pytestmark = pytest.mark.usefixtures("native_guards_now")


def _replaying(fn, x, calls: int = 4):
    """Call `fn` until it replays; returns its AutoTraced."""
    for _ in range(calls):
        fn(x)
    state = autotraced_state(fn)
    assert state is not None and state.impure is None
    hits = state.traced.cache_info().hits
    fn(x)
    assert state.traced.cache_info().hits == hits + 1, "the function did not reach replay"
    return state


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def test_engine_closure_cells_are_rebound_only_by_transform_entry():
    # engine.guardstate walks the engine's own closures without guarding their cells, on the
    # grounds that nothing rebinds them once the closure exists: no `nonlocal` store but
    # transform_entry's `auto`, no `cell_contents` write, and no generator (a frame that lives on
    # after it made a closure) that rebinds a variable its closures hold.
    rebinds = set()
    for info in pkgutil.walk_packages(engine.__path__, "engine."):
        module = importlib.import_module(info.name)
        with open(module.__file__) as f:
            top = compile(f.read(), module.__file__, "exec")
        for code in _codes(top):
            closure_made = False
            generator = code.co_flags & (0x20 | 0x80 | 0x200)  # generator, coroutine, async generator
            for ins in dis.get_instructions(code):
                if ins.opname == "MAKE_FUNCTION" and ins.arg & 0x08:
                    closure_made = True
                elif ins.opname in ("STORE_DEREF", "DELETE_DEREF"):
                    if ins.argval in code.co_freevars or (generator and closure_made):
                        rebinds.add((info.name, code.co_name, ins.argval))
                elif ins.opname in ("STORE_ATTR", "DELETE_ATTR") and ins.argval == "cell_contents":
                    rebinds.add((info.name, code.co_name, "cell_contents"))
    assert rebinds == {("engine.autotrace", "entry", "auto")}


def test_the_functions_own_cells_are_guarded_and_a_rebinding_is_followed():
    def make():
        scale = 2.0

        def loss(x):
            return (x.sin() * scale).sum()

        return loss

    loss = make()
    fn = engine.vmap(engine.grad(loss))
    x = torch.randn(4, 3)
    state = _replaying(fn, x)
    (cell,) = loss.__closure__
    assert any(c is cell for c in state._guard.cells)
    assert len(state._guard.cells) == 1  # the engine's closures (vmap's and grad's options) are walked, not guarded
    cell.cell_contents = 3.0
    torch.testing.assert_close(fn(x), torch.func.vmap(torch.func.grad(loss))(x))
    torch.testing.assert_close(fn(x), x.cos() * 3.0)


class _Counting(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_a_dispatch_mode_sees_the_eager_call_not_a_replay():
    fn = engine.vmap(lambda x: x.sin() * 2)
    x = torch.randn(4, 3)
    state = _replaying(fn, x)
    eager = state.eager_calls
    with _Counting() as mode:
        out = fn(x)
    assert state.eager_calls == eager + 1 and mode.ops > 0
    torch.testing.assert_close(out, x.sin() * 2)


def test_inference_mode_with_grad_enabled_runs_eagerly():
    # Grad mode on inside inference mode: torch's global state matches a replay's; the thread's
    # excluded dispatch keys (the probe tensor's check) do not.
    fn = engine.vmap(engine.grad(lambda x: (x.sin() * 2).sum()))
    x = torch.randn(4, 3)
    state = _replaying(fn, x)
    eager = state.eager_calls
    with torch.inference_mode(), torch.enable_grad():
        out = fn(x)
    assert state.eager_calls == eager + 1
    torch.testing.assert_close(out, x.cos() * 2)


def test_a_call_inside_a_functorch_transform_runs_eagerly():
    fn = engine.vmap(lambda x: x.sin() * 2)
    x = torch.randn(4, 3)
    state = _replaying(fn, x)
    # The arguments' native check (the memo: built where automatic tracing is in its standard
    # state, not under VMAPBENCH_AUTO_TRACE=verify) does not replay it either.
    assert state._memo is not None or bool(autoswitch.departures)
    eager = state.eager_calls
    ys = torch.randn(2, 4, 3)
    out = torch.func.vmap(lambda y: fn(x) + y)(ys)
    assert state.eager_calls == eager + 1
    torch.testing.assert_close(out, x.sin() * 2 + ys)


def test_a_changed_matmul_precision_is_followed():
    def scaled(x):
        return x * (2.0 if torch.get_float32_matmul_precision() == "high" else 3.0)

    # "high" and "medium" differ only where torch's global-state guard does not look (the CPU's
    # matmul precision): the Python comparison of the setting must catch it.
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        fn = engine.vmap(scaled)
        x = torch.randn(4, 3)
        _replaying(fn, x)
        torch.set_float32_matmul_precision("medium")
        torch.testing.assert_close(fn(x), x * 3.0)
        torch.testing.assert_close(fn(x), x * 3.0)
    finally:
        torch.set_float32_matmul_precision(before)


def test_a_per_backend_float32_precision_is_followed_and_never_raises():
    # Set through the per-backend API, a backend's precision makes torch's legacy getter
    # (torch.get_float32_matmul_precision) raise: the guard must read every setting instead, not
    # raise from every call, and follow a change of any of them.
    from engine.guardstate import _FP32_PRECISION_KEYS

    def scaled(x):
        bf16 = torch.backends.mkldnn.matmul.fp32_precision == "bf16"
        return x * (2.0 if bf16 and torch.backends.cudnn.conv.fp32_precision == "tf32" else 3.0)

    before = [torch._C._get_fp32_precision_getter(backend, op) for backend, op in _FP32_PRECISION_KEYS]
    try:
        fn = engine.vmap(scaled)
        x = torch.randn(4, 3)
        torch.backends.cudnn.conv.fp32_precision = "tf32"
        _replaying(fn, x)
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        for _ in range(6):  # verified again, recorded and replayed under the new setting
            torch.testing.assert_close(fn(x), x * 2.0)
        state = _replaying(fn, x)
        torch.backends.cudnn.conv.fp32_precision = "ieee"  # a change while the legacy getter still raises
        with pytest.raises(RuntimeError):
            torch.get_float32_matmul_precision()
        for _ in range(6):
            torch.testing.assert_close(fn(x), x * 3.0)
        assert state.impure is None
    finally:
        for (backend, op), value in zip(_FP32_PRECISION_KEYS, before):
            torch._C._set_fp32_precision_setter(backend, op, value)
    torch.get_float32_matmul_precision()  # restored: the legacy getter answers again


def test_disabled_torch_function_gives_the_eager_result():
    fn = engine.vmap(lambda x: x.sin() * 2)
    x = torch.randn(4, 3)
    _replaying(fn, x)
    with torch._C.DisableTorchFunction():
        out = fn(x)
    torch.testing.assert_close(out, x.sin() * 2)
    torch.testing.assert_close(fn(x), x.sin() * 2)


def test_both_grad_modes_replay_with_a_native_check_each():
    fn = engine.vmap(lambda x: x.sin() * 2)
    x = torch.randn(4, 3)
    state = _replaying(fn, x)
    with torch.no_grad():
        for _ in range(4):
            fn(x)
    guard = state._guard
    hits = state.traced.cache_info().hits
    for _ in range(3):
        fn(x)
        with torch.no_grad():
            out = fn(x)
    assert state.traced.cache_info().hits == hits + 6
    torch.testing.assert_close(out, x.sin() * 2)
    assert state._guard is guard and guard._fast_misses == 0
    assert guard._natives is not None and all(n is not None and n.grad is mode for mode, n in zip((False, True), guard._natives))


def test_another_threads_departure_sends_this_thread_to_the_full_path():
    fn = engine.vmap(lambda x: x.sin() * 2)
    x = torch.randn(4, 3)
    state = _replaying(fn, x)
    standing = len(autoswitch.departures)  # (one for good where the process default is off or verify)
    entered, release = threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def other() -> None:
        with engine.auto_tracing(False):
            entered.set()
            release.wait(10)
            before = state.eager_calls
            fn(x)  # off on that thread: its transform runs eagerly, without the AutoTraced
            seen["other"] = state.eager_calls - before

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert entered.wait(10)
        assert len(autoswitch.departures) == standing + 1  # the fast path is closed to every thread ...
        hits = state.traced.cache_info().hits
        torch.testing.assert_close(fn(x), x.sin() * 2)
        assert state.traced.cache_info().hits == hits + 1  # ... and the full path still replays here
    finally:
        release.set()
        thread.join()
    assert seen["other"] == 0
    assert len(autoswitch.departures) == standing


def test_departures_are_taken_back_when_the_function_raises():
    def boom(x):
        raise RuntimeError("boom")

    standing = len(autoswitch.departures)  # (one for good where the process default is off or verify)
    fn = engine.vmap(engine.grad(boom))
    for _ in range(3):
        with pytest.raises(RuntimeError, match="boom"):
            fn(torch.randn(2, 3))
    assert len(autoswitch.departures) == standing


def test_a_global_module_hook_is_followed_where_the_function_calls_a_module_it_makes():
    # nn.Module's global hook tables are guarded where the guard reaches a Module: one the
    # function makes and calls is reached too (the watched run saw it running).
    def f(x):
        return torch.nn.Identity()(x.sin())

    fn = engine.vmap(f)
    x = torch.randn(4, 3)
    state = _replaying(fn, x)
    assert any(d is torch.nn.modules.module._global_forward_hooks for d in state._guard.dicts)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out * 2)
    try:
        torch.testing.assert_close(fn(x), x.sin() * 2)
    finally:
        handle.remove()
    torch.testing.assert_close(fn(x), x.sin())


def test_a_function_that_reaches_no_module_does_not_guard_the_global_hook_tables():
    fn = engine.vmap(lambda x: x.sin() * 2)
    x = torch.randn(4, 3)
    state = _replaying(fn, x)
    assert not any(d is torch.nn.modules.module._global_forward_hooks for d in state._guard.dicts)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out * 2)
    try:
        hits = state.traced.cache_info().hits
        torch.testing.assert_close(fn(x), x.sin() * 2)  # no Module runs: the hook cannot apply
        assert state.traced.cache_info().hits == hits + 1
    finally:
        handle.remove()


def _swap_and_restore(module: torch.nn.Module) -> None:
    """Move the version tag of `module`'s parameter table and leave its contents as they were
    (what torch.func.functional_call does on every call, or a model swapped in and back)."""
    weight = module._parameters["weight"]
    module._parameters["weight"] = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
    module._parameters["weight"] = weight


def _linear_replaying():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2).requires_grad_(False)
    fn = engine.vmap(lambda x: lin(x).tanh())
    x = torch.randn(4, 3)
    expected = lin(x).tanh()
    state = _replaying(fn, x)
    assert state._guard._natives is not None
    return lin, fn, x, expected, state


def test_tags_moved_now_and_then_keep_the_native_check():
    lin, fn, x, expected, state = _linear_replaying()
    guard = state._guard
    for _ in range(6):  # more moves than _FAST_MISSES, each followed by calls the tags serve
        _swap_and_restore(lin)
        for _ in range(12):
            out = fn(x)
        torch.testing.assert_close(out, expected)
    assert state._guard is guard and guard._fast_misses >= 6
    assert guard._natives is not None and guard._versions is not None


@pytest.mark.skipif(bool(autoswitch.departures), reason="the memo path is the standard state's (no verify mode)")
def test_after_a_moved_tag_the_memo_is_rebuilt_at_the_next_call_however_often_it_moved():
    # The memo (the argument check) is built on its guard's native check; when a tag moved and the
    # native check was rebuilt, the memo follows at the next call, not after a backoff meant for
    # alternating signatures (which, after a few moves, left 2^k calls on the slower path).
    lin, fn, x, expected, state = _linear_replaying()
    guard = state._guard
    for move in range(autotrace._MEMO_BUILDS + 4):
        _swap_and_restore(lin)
        fn(x)  # re-proves the guard, rebuilds its native check
        torch.testing.assert_close(fn(x), expected)
        native = guard._natives[torch.is_grad_enabled()]
        assert state._memo is not None and state._memo.base is native, f"move {move}: no memo on the new native check"
        assert state._memo_wait == 0
        for _ in range(10):  # calls the tags serve (a guard whose tags move every call or two gives them up)
            fn(x)
    assert state._guard is guard and guard._natives is not None


def test_tags_moved_on_every_call_are_given_up_and_the_results_stay_right():
    lin, fn, x, expected, state = _linear_replaying()
    guard = state._guard
    for _ in range(5):
        _swap_and_restore(lin)
        torch.testing.assert_close(fn(x), expected)
    assert state._guard is guard and guard._natives is None
    hits = state.traced.cache_info().hits
    torch.testing.assert_close(fn(x), expected)  # the Python check alone still proves the replay
    assert state.traced.cache_info().hits == hits + 1
    lin.weight.mul_(2)  # a real change after the tags were given up: seen, not replayed stale
    expected = lin(x).tanh()
    torch.testing.assert_close(fn(x), expected)
