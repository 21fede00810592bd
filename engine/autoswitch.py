"""The automatic-tracing switch and the "a traced function is running" depth.

Kept apart from engine.autotrace so that engine.trace (which autotrace builds on) can mark the
runs it makes without importing it: transforms called while a traced or auto-traced function runs
(the inner transforms of a composition, a transform inside `engine.trace(fn)`) must run eagerly as
part of that run, never start an automatic trace of their own.

`auto_tracing(enabled)` turns automatic tracing on or off inside its block (this thread); the
process-wide default is on, off with the environment variable VMAPBENCH_AUTO_TRACE=0.
`auto_tracing(verify=True)` (or VMAPBENCH_AUTO_TRACE=verify) turns on shadow verification: every
replay also runs the eager call and raises engine.errors.ReplayMismatchError where the replay breaks
its contract (engine.replay_contract).
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Iterator

__all__ = ["auto_tracing", "auto_tracing_enabled", "inside_traced_run", "running", "verifying"]

_ENV = os.environ.get("VMAPBENCH_AUTO_TRACE", "1").strip().lower()
if _ENV not in ("0", "false", "off", "no", "1", "true", "on", "yes", "verify"):
    raise ValueError(
        f"VMAPBENCH_AUTO_TRACE={_ENV!r}: expected 1/on (automatic tracing, the default), 0/off, or verify "
        f"(automatic tracing with every replay checked against an eager call)"
    )
_DEFAULT = _ENV not in ("0", "false", "off", "no")
_VERIFY = _ENV == "verify"


class _Local(threading.local):
    enabled: bool = _DEFAULT
    verify: bool = _VERIFY  # shadow verification of every replay
    depth: int = 0  # traced / auto-traced runs in progress on this thread


_local = _Local()

# Process-wide, one entry per departure of a thread from the standard state (automatic tracing
# on, not verifying, no traced run in progress; engine._guards and engine.transforms add theirs:
# a transform running). Entries are added before the thread-local state leaves the standard state
# and removed after it is back (list.append and list.pop are atomic), so an empty list proves
# that every thread is in the standard state: the replay path of engine.autotrace then reads no
# thread-local state (each read costs about as much as a small op's dispatch). A process whose
# default is not the standard state (VMAPBENCH_AUTO_TRACE=0 or verify) keeps one entry for good.
departures: list = [] if _DEFAULT and not _VERIFY else [None]


@contextlib.contextmanager
def auto_tracing(enabled: bool = True, *, verify: bool | None = None) -> Iterator[None]:
    """Turn automatic tracing of repeated transformed calls on or off inside the block (this thread).

    Off, every engine transform runs eagerly on every call, as before automatic tracing existed;
    `engine.trace`/`engine.auto_trace` still trace what they wrap. `verify=True` turns on shadow
    verification (each replay of an automatically traced function also runs its eager call, and
    a difference raises ReplayMismatchError: about twice the cost of the eager call), `False` off,
    None leaves it as it is.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"engine.auto_tracing: enabled must be a bool, got {type(enabled).__name__}")
    if verify is not None and not isinstance(verify, bool):
        raise TypeError(f"engine.auto_tracing: verify must be a bool or None, got {type(verify).__name__}")
    old = _local.enabled, _local.verify
    standard = enabled and not (old[1] if verify is None else verify)
    if not standard:
        departures.append(None)
    _local.enabled = enabled
    if verify is not None:
        _local.verify = verify
    try:
        yield
    finally:
        _local.enabled, _local.verify = old
        if not standard:
            departures.pop()


def auto_tracing_enabled() -> bool:
    return _local.enabled


def verifying() -> bool:
    """Whether replays of automatically traced functions are shadow-verified on this thread."""
    return _local.verify


def inside_traced_run() -> bool:
    return _local.depth > 0


def running(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `fn` as part of a traced run: the transforms it calls run eagerly."""
    departures.append(None)
    _local.depth += 1
    try:
        return fn(*args, **kwargs)
    finally:
        _local.depth -= 1
        departures.pop()
