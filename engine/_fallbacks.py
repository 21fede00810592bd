"""The for-loop fallback's policy ('warn', 'error', 'silent') and its accounting (per-op counts).

One owner for this state, below the dispatcher (engine._dispatch, which runs the fallback) and
the rules, so a rule that ever falls back to a counted loop itself can report it without
importing the dispatcher.
"""
from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from typing import Iterator

from engine._opmeta import op_name
from engine.errors import FallbackError, FallbackWarning


class _FallbackState:
    policy = "warn"
    warned: set[str] = set()
    recorders: list["FallbackRecord"] = []


class FallbackRecord:
    """Result object of `record_fallbacks()`: `.counts` maps op name to fallback calls."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __repr__(self) -> str:
        return f"FallbackRecord({dict(self.counts)})"


@contextlib.contextmanager
def fallback_policy(mode: str) -> Iterator[None]:
    """'warn' (default: a FallbackWarning once per op per process), 'error' (raise FallbackError), 'silent'."""
    if mode not in ("warn", "error", "silent"):
        raise ValueError(f"fallback_policy: mode must be 'warn', 'error' or 'silent', got {mode!r}")
    old, _FallbackState.policy = _FallbackState.policy, mode
    try:
        yield
    finally:
        _FallbackState.policy = old


@contextlib.contextmanager
def record_fallbacks() -> Iterator[FallbackRecord]:
    """Count for-loop fallback calls per op while active (nested recorders all count)."""
    rec = FallbackRecord()
    _FallbackState.recorders.append(rec)
    try:
        yield rec
    finally:
        _FallbackState.recorders.remove(rec)


def _note_fallback(func: Any) -> None:
    name = op_name(func)
    for rec in _FallbackState.recorders:
        rec.counts[name] += 1
    policy = _FallbackState.policy
    if policy == "error":
        raise FallbackError(name)
    if policy == "warn" and name not in _FallbackState.warned:
        _FallbackState.warned.add(name)
        warnings.warn(
            f"Batching rule not implemented for {name}; falling back to slow (for loop) implementation",
            FallbackWarning,
            stacklevel=4,
        )
