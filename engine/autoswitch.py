"""The automatic-tracing switch and the "a traced function is running" depth.

Kept apart from engine.autotrace so that engine.trace (which autotrace builds on) can mark the
runs it makes without importing it: transforms called while a traced or auto-traced function runs
(the inner transforms of a composition, a transform inside `engine.trace(fn)`) must run eagerly as
part of that run, never start an automatic trace of their own.

`auto_tracing(enabled)` turns automatic tracing on or off inside its block (this thread); the
process-wide default is on, off with the environment variable VMAPBENCH_AUTO_TRACE=0.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Iterator

__all__ = ["auto_tracing", "auto_tracing_enabled", "inside_traced_run", "running"]

_DEFAULT = os.environ.get("VMAPBENCH_AUTO_TRACE", "1").strip().lower() not in ("0", "false", "off", "no")


class _Local(threading.local):
    enabled: bool = _DEFAULT
    depth: int = 0  # traced / auto-traced runs in progress on this thread


_local = _Local()


@contextlib.contextmanager
def auto_tracing(enabled: bool) -> Iterator[None]:
    """Turn automatic tracing of repeated transformed calls on or off inside the block (this thread).

    Off, every engine transform runs eagerly on every call, as before automatic tracing existed;
    `engine.trace`/`engine.auto_trace` still trace what they wrap.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"engine.auto_tracing: enabled must be a bool, got {type(enabled).__name__}")
    old, _local.enabled = _local.enabled, enabled
    try:
        yield
    finally:
        _local.enabled = old


def auto_tracing_enabled() -> bool:
    return _local.enabled


def inside_traced_run() -> bool:
    return _local.depth > 0


def running(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `fn` as part of a traced run: the transforms it calls run eagerly."""
    _local.depth += 1
    try:
        return fn(*args, **kwargs)
    finally:
        _local.depth -= 1
