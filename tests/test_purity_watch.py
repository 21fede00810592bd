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
