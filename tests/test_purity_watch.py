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
