"""Views that vmap makes physical copies, and the in-place writes that would tell them apart.

Some ops that return a *view* in PyTorch return a *copy* under the engine's vmap: the conjugate and
negative views (`x.conj()`, `_neg_view`: rules run below PyTorch's Conjugate/Negative keys, so the
physical tensor never carries the bits, engine.rules.complex_ops), a conjugate or negative view
given to vmap as an input (engine._batched.enter resolves it), and a view op run by the for-loop
fallback (its result is a `torch.stack` of the per-element views). Read out of place, the copy
equals the view. Written in place, it does not: a write into the copy does not reach the base
(torch.func and the per-example loop write through), and a write into the base leaves the copy
holding old values. Both are silently wrong results, so both are refused while the copy's memory
is alive:

- `note_copy(copy, base, op)` records that `copy`'s memory stands for a view of `base`'s memory;
- `check_write(t, op)` raises when `t`'s memory is such a copy's, or the base of one still alive.

Memory is told by the physical storage (the innermost tensor under the batched wrappers). Records
are weak: a copy's record goes when its storage is freed (`del y`, and no view of it left), so the
base may be written again then. The dispatcher calls `check_write` only for ops that write in place
and only while some record exists (`LIVE` is non-empty): out-of-place ops never pay for it.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from engine.errors import VmapError

# id(copy storage) -> (weakref to the copy storage, op that made it, ids of its bases' storages)
LIVE: dict[int, tuple] = {}
# id(base storage) -> (weakref to the base storage, {id(copy storage): op})
_BASES: dict[int, tuple] = {}


def _storage(t: Any) -> Any:
    """The storage under `t` and the batched wrappers around it, or None (no plain tensor below,
    or a tensor without storage: a functional or sparse tensor)."""
    while type(t) is not torch.Tensor:
        e = getattr(t, "_elem", None)
        if e is None:
            break
        t = e
    if not isinstance(t, torch.Tensor) or t.layout is not torch.strided:
        return None
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return s if s.nbytes() else None


def _forget(cid: int) -> None:
    """The copy's storage was freed: writes into its bases are allowed again."""
    rec = LIVE.pop(cid, None)
    for bid in rec[2] if rec is not None else ():
        entry = _BASES.get(bid)
        if entry is not None:
            entry[1].pop(cid, None)
            if not entry[1]:
                del _BASES[bid]


def note_copy(copy: Any, base: Any, op: str) -> None:
    """Record that `copy` (a fresh tensor, batched or physical) stands where torch.func has a view
    named `op` of `base`: in-place writes into either are refused while `copy`'s memory lives."""
    cs, bs = _storage(copy), _storage(base)
    if cs is None or bs is None or cs is bs:
        return
    cid, bid = id(cs), id(bs)
    rec = LIVE.get(cid)
    if rec is None or rec[0]() is not cs:
        rec = LIVE[cid] = (weakref.ref(cs, lambda _, cid=cid: _forget(cid)), op, [])
    entry = _BASES.get(bid)
    if entry is None or entry[0]() is not bs:  # none, or left by a freed storage at the same id
        entry = _BASES[bid] = (weakref.ref(bs), {})
    entry[1][cid] = op
    if bid not in rec[2]:
        rec[2].append(bid)


def check_write(t: Any, op: str) -> None:
    """Raise if the in-place op `op` writing into `t` would show that a recorded view is a copy."""
    s = _storage(t)
    if s is None:
        return
    sid = id(s)
    rec = LIVE.get(sid)
    if rec is not None and rec[0]() is s:
        raise VmapError(
            f"vmap: {op} writes in place into the result of {rec[1]}, which is a view in PyTorch but a copy "
            f"under this vmap (engine rules cannot carry the conjugate/negative bit or return the op's "
            f"view), so the write would not reach the tensor it was taken from, unlike torch.func and a "
            f"per-example loop. Write into that tensor itself (and take {rec[1]} of it afterwards), or, if "
            f"a separate tensor is meant, make it one explicitly: `.conj_physical()` / `.neg()` / `.clone()`."
        )
    entry = _BASES.get(sid)
    if entry is not None and entry[0]() is s and entry[1]:
        made = ", ".join(sorted(set(entry[1].values())))
        raise VmapError(
            f"vmap: {op} writes in place into a tensor whose {made} is still alive; under this vmap that "
            f"{made} is a copy, not a view as in PyTorch (engine rules cannot carry the conjugate/negative "
            f"bit or return the op's view), so it would keep the old values where torch.func's view sees the "
            f"write. Take {made} after the write, or drop it first (`del`), or, if the old values are meant, "
            f"make the copy explicit: `.conj_physical()` / `.neg()` / `.clone()`."
        )


def check_writes(args: tuple, mutated: tuple, op: str) -> None:
    """`check_write` for each written argument of an in-place op."""
    n = len(args)
    for i in mutated:
        if i < n:
            check_write(args[i], op)
