"""engine.purity's watch: what one call of a helper costs the profiler (it runs at every event of
a watched run, the recording's included, where torch's tracer calls the standard library
hundreds of thousands of times)."""
from __future__ import annotations

import colorsys
import os

from engine import purity


def test_standard_library_code_is_classified_once_per_code_object(monkeypatch):
    # Whether a frame's code is a standard-library helper used to be decided at every call of the
    # frame, with os.path.realpath (a system call per path component): 80% of the watched
    # recording of a small vmap(grad). It is decided once per code object.
    real = os.path.realpath
    resolved = []

    def counting(path, *args, **kwargs):
        resolved.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", counting)

    def user(x: float) -> tuple:
        out = ()
        for _ in range(50):
            out = colorsys.rgb_to_hsv(x, 0.4, 0.4)  # pure Python of the standard library
        return out

    with purity.watch():
        user(0.2)
    assert resolved.count(colorsys.__file__) <= 1, f"colorsys resolved {resolved.count(colorsys.__file__)} times"


def _torch_machinery_subscripting_a_generic():
    """A function whose code counts as torch's (its file is under torch's folder), subscripting a
    generic with a new type each call (no typing cache hit): as torch 2.11 does inside ops on
    Python 3.12, where typing then runs typing_extensions' patched _collect_parameters."""
    import typing

    import torch

    namespace = {"typing": typing}
    source = "def alias(t):\n    return typing.List[t]\n"
    exec(compile(source, os.path.join(os.path.dirname(torch.__file__), "_vmapbench_test_probe.py"), "exec"), namespace)
    return namespace["alias"]


def test_typing_extensions_run_by_torch_is_trusted_like_the_standard_library():
    """typing_extensions' _collect_parameters reads its caller's frame (sys._getframe): run by
    torch through typing, that is torch's machinery, and the function replays."""
    import typing_extensions

    import engine
    import torch

    assert purity._is_helper(typing_extensions._collect_parameters.__code__)
    alias = _torch_machinery_subscripting_a_generic()

    def f(x):
        alias(type("T", (), {}))
        return (x * x).sum()

    auto = engine.auto_trace(engine.grad(f))
    x = torch.randn(3)
    for _ in range(4):
        torch.testing.assert_close(auto(x), 2 * x)
    assert auto.impure is None, auto.impure
    assert auto.traced._misses == 1  # recorded once, then replayed


def test_typing_extensions_called_by_user_code_is_still_checked():
    """Trusted only when torch's machinery runs it: a user function that calls it directly has its
    frame read (sys._getframe) checked, and refused, as any user code's."""
    import typing_extensions

    import engine
    import torch

    def f(x):
        typing_extensions._has_generic_or_protocol_as_origin()
        return (x * x).sum()

    auto = engine.auto_trace(engine.grad(f))
    for _ in range(3):
        auto(torch.randn(3))
    assert auto.impure is not None and "sys._getframe" in auto.impure


def _as_if_compiled_by(monkeypatch, sequence):
    """A fresh code object whose disassembly is `sequence` of (opname, argval[, argrepr]): the
    instructions another Python version compiles, which this interpreter cannot (tests run on 3.11)."""
    import dis

    _as_if_compiled_by.made += 1  # a code object of its own (code objects equal by value share verdicts)
    code = (lambda: None).__code__.replace(co_name=f"as_if_{_as_if_compiled_by.made}")
    made = [dis.Instruction(op, 0, None, argval, argrepr[0] if argrepr else "", 2 * i, None, False, None)
            for i, (op, argval, *argrepr) in enumerate(sequence)]
    real = dis.get_instructions
    monkeypatch.setattr(purity.dis, "get_instructions", lambda c, *a, **k: iter(made) if c is code else real(c, *a, **k))
    return code


_as_if_compiled_by.made = 0


def test_python_3_12_slice_store_into_a_captured_list_is_an_effect(monkeypatch):
    """`buf[0:1] = [x]` on Python 3.12 and 3.13 is STORE_SLICE (3.11: BUILD_SLICE, STORE_SUBSCR):
    a store into a captured container, which a replay would skip."""
    code = _as_if_compiled_by(monkeypatch, [("LOAD_FAST", "x"), ("BUILD_LIST", 1), ("LOAD_FAST", "buf"),
                                            ("LOAD_CONST", 0), ("LOAD_CONST", 1), ("STORE_SLICE", None),
                                            ("RETURN_CONST", None)])
    assert "does STORE_SLICE" in purity.code_effect(code)


def test_python_3_12_import_star_and_3_13_key_calls_are_effects(monkeypatch):
    star = _as_if_compiled_by(monkeypatch, [("LOAD_CONST", 0), ("LOAD_CONST", ("*",)), ("IMPORT_NAME", "m"),
                                            ("CALL_INTRINSIC_1", 2, "INTRINSIC_IMPORT_STAR"), ("POP_TOP", None)])
    assert "INTRINSIC_IMPORT_STAR" in purity.code_effect(star)
    keyed = _as_if_compiled_by(monkeypatch, [("LOAD_GLOBAL", "sorted"), ("LOAD_FAST_LOAD_FAST", ("xs", "g")),
                                             ("LOAD_CONST", ("key",)), ("CALL_KW", 2), ("RETURN_VALUE", None)])
    assert "key=" in purity.code_effect(keyed)
    other = _as_if_compiled_by(monkeypatch, [("LOAD_GLOBAL", "sorted"), ("LOAD_FAST_LOAD_FAST", ("xs", "r")),
                                             ("LOAD_CONST", ("reverse",)), ("CALL_KW", 2), ("RETURN_VALUE", None)])
    assert purity.code_effect(other) is None


def test_on_a_python_whose_bytecode_was_not_reviewed_no_code_is_proven_pure(monkeypatch):
    monkeypatch.setattr(purity, "_PYTHON", (3, 99))
    code = (lambda x: x + 1).__code__
    assert "Python 3.99's bytecode has not been reviewed" in purity.code_effect(code)


_PHASES: list[str] = []


def _timing_callback(phase: str, info: dict) -> None:  # a test framework's: state written per collection
    global _LAST_PHASE
    _LAST_PHASE = phase
    _PHASES.append(phase)


def _collecting_often(run):
    """Run `run()` with a gc.callbacks entry that writes state, and a collection at nearly every
    container allocation."""
    import gc

    threshold = gc.get_threshold()
    gc.callbacks.append(_timing_callback)
    gc.set_threshold(1)
    try:
        return run()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(_timing_callback)


def test_code_the_garbage_collector_runs_in_a_watched_run_is_not_the_runs():
    def user(x: float) -> list:
        return [[x, x] for _ in range(20)]  # allocations: collections start in the middle of it

    def watched():
        _PHASES.clear()
        with purity.watch() as obs:
            user(0.5)
        return obs

    obs = _collecting_often(watched)
    assert "start" in _PHASES and "stop" in _PHASES  # collections ran inside the watch
    # (the watch's own exit, contextlib's, is called from this test's frame: not the run's code)
    assert _timing_callback.__code__ not in obs.effect_codes and user.__code__ not in obs.effect_codes, obs.effects
    assert purity._collection_starts not in __import__("gc").callbacks  # removed after the watch


def test_a_collection_the_function_asks_for_is_still_an_effect():
    import gc

    def user() -> None:
        gc.collect()

    with purity.watch() as obs:
        user()
    assert not obs.pure and "collect" in obs.effects[0]


def test_a_collection_during_the_watched_call_leaves_the_function_replaying():
    import torch

    import engine
    from engine.autotrace import autotraced_state

    w = torch.randn(4, 3)
    f = engine.vmap(lambda row: torch.tanh(row @ w))
    x = torch.randn(5, 4)

    def calls():
        with engine.auto_tracing(True):
            for _ in range(5):
                f(x)

    _collecting_often(calls)
    state = autotraced_state(f)
    assert state.impure is None and len(state.traced._cache) == 1


def test_a_pause_hides_its_block_from_the_watch_and_only_its_block():
    import gc

    def before() -> None:
        pass

    def hidden() -> None:
        gc.collect()  # an effect: seen by a watch, were it watching

    def after() -> None:
        gc.collect()

    with purity.watch() as obs:
        before()
        with purity.paused():
            hidden()
        after()
    assert before.__code__ in obs.user_codes and after.__code__ in obs.user_codes
    assert hidden.__code__ not in obs.user_codes and hidden.__code__ not in obs.effect_codes
    assert after.__code__ in obs.effect_codes  # the watch is back after the block


def test_a_pause_outside_a_watch_leaves_another_profiler_alone():
    import sys

    seen = []

    def other(frame, event, arg):
        seen.append(event)

    sys.setprofile(other)
    try:
        with purity.paused():
            len([])
        assert sys.getprofile() is other
    finally:
        sys.setprofile(None)
    assert "c_call" in seen  # still profiling inside the block


SCANNED_CODES = 10_000


def test_global_names_read_from_raw_bytecode_match_dis():
    # global_names scans the bytecode itself instead of building a dis.Instruction per
    # instruction; it must name what dis names, on code of every shape (extended arguments,
    # inline caches, nested code, class bodies, imports): torch's, the engine's, the standard
    # library's.
    import dis
    import gc
    import types

    import torch.distributions  # noqa: F401  (more code to compare on)

    codes, stack = set(), [f.__code__ for f in gc.get_objects() if type(f) is types.FunctionType]
    while stack:
        code = stack.pop()
        if code not in codes:
            codes.add(code)
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    # Over 256 names: their indices (LOAD_NAME/STORE_NAME at module level, LOAD_GLOBAL shifted in a
    # function) need EXTENDED_ARG.
    many = "".join(f"v{i} = g{i}\n" for i in range(300)) + "def f():\n    return " + " + ".join(f"h{i}" for i in range(300))
    probe = compile(many, "<probe>", "exec")
    codes |= {probe, *(c for c in probe.co_consts if isinstance(c, types.CodeType))}
    assert any(ins.opname == "EXTENDED_ARG" for c in (probe, probe.co_consts[-2]) for ins in dis.get_instructions(c))
    assert len(codes) > 5000
    # A process that imported more (a test worker that ran other files first) holds several times
    # the code: an even spread of the codes with an EXTENDED_ARG, and of the rest, is compared.
    extended = dis.opmap["EXTENDED_ARG"]

    def spread(group: set, n: int) -> set:
        ordered = sorted(group, key=lambda c: (c.co_filename, c.co_firstlineno, c.co_name))
        return set(ordered[::max(1, len(ordered) // n)])

    hard = {c for c in codes if extended in c.co_code[::2]}
    assert len(hard) > 100
    codes = spread(hard, SCANNED_CODES // 10) | spread(codes - hard, SCANNED_CODES)
    assert len(codes) > 5000
    for code in codes:
        want = {ins.argval for ins in dis.get_instructions(code) if ins.opname in purity._GLOBAL_OPS}
        assert purity._scan_global_names(code) == want, code
