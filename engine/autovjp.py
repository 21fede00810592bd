"""`engine.vjp` on the default path: `vmap(vjp_fn)` written inline replays and fuses.

A Hessian-vector product as users write it, `_, vjp_fn = engine.vjp(engine.grad(f), x)` then
`engine.vmap(vjp_fn)(vectors)`, makes a new `vjp_fn` at every call: a closure over that call's
autograd graph. Automatic tracing keys what it records by what a callable is (engine.autotrace),
and a closure over an autograd graph is a new thing each time, so the whole product ran eagerly.
What a vjp_fn *is* does not change from call to call: the
vector-Jacobian product of `func` at `primals`. So, at the outermost level with automatic tracing
on, `vmap(vjp_fn)` is traced as the function `(primals, cotangents) -> vmap(lambda c:
vjp(func, *primals)[1](c))(cotangents)` (`_Pullback`, one AutoTraced per (func, vmap options),
shared like the inline transforms'), which recomputes the forward inside the graph, and
`vjp(func, *primals)[0]` (the forward alone) is traced as its own function (`_forward`). Once both
replay, `engine.vjp` returns the forward's replay and a vjp_fn that holds no graph (lazy), and
`vmap(vjp_fn)` replays (or runs as one fused program) forward and batched backward together.

Why that is exact, and when it is not done:
- The recomputation runs at the vjp_fn's call (T1); the real vjp_fn would use the state of the
  `engine.vjp` call (T0). The pullback's guard (engine.guardstate: the Python state `func`
  reads) is checked at both times, and must be the same guard object: held at T0 and T1, the state
  was the recorded one at both. The primals' and the guarded tensors' version counters are taken
  at T0 and compared at T1 (an in-place write between the two: the real vjp_fn would raise or use
  saved values; the recomputation would read new ones).
- A forward whose recorded graph draws random numbers is never deferred: a recomputation would
  draw others than the forward the caller saw.
- Only plain-tensor primals that need no grad, no `has_aux`, no outer transform or autograd graph
  (the vjp's result is a constant): anything else is the eager `engine.transforms.vjp`, as before.
- Until the pullback replays, `vmap(vjp_fn)` runs the real vjp_fn eagerly and, a bounded number of
  times, the pullback beside it so that it can verify and record (`_WARMUPS`): the caller gets the
  real vjp_fn's result.
- A lazy vjp_fn whose checks fail at T1 cannot recompute what T0's graph would give; it raises a
  TransformError saying what changed (never a result from the wrong state). Writes that bypass the
  version counter (`t.data.add_()`, a numpy view of a tensor's memory) are as invisible here as
  they are to autograd's own saved-tensor check: eager PyTorch mixes old and new values there.
- Shadow verification (`engine.auto_tracing(verify=True)`) keeps the real vjp_fn too and compares
  every deferred result with it (ReplayMismatchError on a difference).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Hashable

import torch
from torch.utils._pytree import tree_flatten

from engine import _vmap, autotrace, fused, transforms
from engine.autotrace import function_key, option_key, output_difference, shared_traced, traces_here
from engine._guards import _Depth
from engine.autoswitch import _local as _switch
from engine.autoswitch import departures
from engine.errors import ReplayMismatchError
from engine.trace import _PLAIN
from engine.transforms import TransformError

__all__ = ["vjp"]

_WARMUPS = 6  # pullback runs fed beside real vjp_fns before it is given up on (per pullback)
_PULLBACK_KEYS = 256  # functions with pullbacks, past which the dead ones' keys are dropped
_autocast = torch._C._is_any_autocast_enabled


class _Stash(threading.local):
    """The real vjp_fn of the last eager run of a `_forward`, and the output it came with."""

    out: Any = None
    fn: Any = None


_stash = _Stash()


def _forward(func: Callable) -> Callable:
    """vjp(func, *primals)[0], traced as a function of the primals; an eager run leaves its real
    vjp_fn in `_stash` (the caller takes it when the output it returned is that run's)."""

    def forward(*primals: torch.Tensor) -> Any:
        out, fn = transforms.vjp(func, *primals)
        _stash.out, _stash.fn = out, fn
        return out

    return forward


def _pullback(func: Callable, count: int, args: tuple, kwargs: dict) -> Callable:
    """vmap(vjp(func, *primals)[1], *args, **kwargs)(*cotangents), as a function of
    (*primals, *cotangents): what vmap of a vjp_fn of `func` computes, with the forward inside."""

    def pullback(*both: torch.Tensor) -> Any:
        primals, cotangents = both[:count], both[count:]
        return _vmap.vmap(lambda *c: transforms.vjp(func, *primals)[1](*c), *args, **kwargs)(*cotangents)

    return pullback


class _Feed:
    """A pullback's warm-up beside real vjp_fns: how often it was fed (-1: met once, never fed),
    and whether its last call replayed."""

    __slots__ = ("warmups", "replayed")

    def __init__(self) -> None:
        self.warmups = -1
        self.replayed = True


# Pullbacks made so far, per func key, with their feeds: the pullbacks whose guard a vjp call
# checks (T0), held weakly (the shared registry of engine.autotrace owns them).
_pullbacks: dict[Hashable, weakref.WeakKeyDictionary] = {}
_lock = threading.Lock()


_draws: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # recorded entry -> whether its graph draws


def _random(entry: Any) -> bool | None:
    """Whether a recorded entry's graph draws random numbers (None: no graph to tell), once per entry."""
    gm = getattr(entry, "gm", None)
    if gm is None:
        return None
    draws = _draws.get(entry)
    if draws is None:
        draws = _draws[entry] = bool(fused.draws(gm))
    return draws


class _Record:
    """What a vjp_fn is (func, its key, the primals) and what was true at its vjp call (T0)."""

    __slots__ = ("func", "key", "primals", "stamps", "real", "freed")

    def __init__(self, func: Callable, key: Hashable, primals: tuple, real: Callable | None) -> None:
        self.func, self.key, self.primals, self.real = func, key, primals, real
        self.freed = False  # a direct call with retain_graph=False ran: the real graph would be gone
        # pullback -> (its guard object, the version counters of the primals and the guarded tensors)
        self.stamps: dict[Any, tuple[Any, list[int]]] = {}
        for auto in list(_pullbacks.get(key, ())):
            guard = auto._guard
            if guard is not None and auto.impure is None and guard.holds():
                self.stamps[auto] = (guard, _versions(primals, guard))

    def proven(self, auto: Any) -> bool:
        """The pullback's state and the tensors' values are as at T0 (see the module docstring)."""
        stamp = self.stamps.get(auto)
        if stamp is None:
            return False
        guard, versions = stamp
        # (Autocast and inference mode, off at T0, would change the recomputed forward; the
        # guard checks the default dtype, the float32 precision and validate_args.)
        return (auto._guard is guard and _versions(self.primals, guard) == versions and guard.holds()
                and not _autocast() and not torch.is_inference_mode_enabled())


def _rng_state() -> tuple:
    """The default generators' states: the CPU one, and each CUDA device's where CUDA is running."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def _versions(primals: tuple, guard: Any) -> list[int]:
    return [t._version for t in primals] + [t._version for t in guard.tensors]


def vjp(func: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """(func(*primals), vjp_fn[, aux]), as torch.func.vjp; see engine.transforms.vjp. At the
    outermost level with automatic tracing on, `engine.vmap(vjp_fn)` replays (module docstring)."""
    if has_aux or not primals or not traces_here() or _Depth.value:
        return transforms.vjp(func, *primals, has_aux=has_aux)
    for p in primals:
        if type(p) not in _PLAIN or p.requires_grad or p.layout != torch.strided:
            return transforms.vjp(func, *primals, has_aux=has_aux)
    key = function_key(func)
    if key is None:
        return transforms.vjp(func, *primals)
    record = _Record(func, key, primals, None)
    if record.stamps or _warming(key):  # a pullback may replay: the forward goes through its own automatic tracing
        forward = shared_traced(_forward(func), ("vjp-forward", key))
        hits = forward.traced._hits
        _stash.out = _stash.fn = None
        rng = _rng_state()
        out = forward._call(primals, {})
        stashed, real = _stash.out, _stash.fn
        _stash.out = _stash.fn = None
        if stashed is out:  # an eager run: the real vjp_fn came with it
            record.real = real
        elif forward.traced._hits == hits or _random(forward.traced._mru) is not False or not record.stamps:
            # A recording run, a forward that draws, or no pullback proven for a deferral yet: the
            # real vjp, from the same random state (the caller's generators advance as by one
            # eager vjp).
            _set_rng_state(rng)
            out, record.real = transforms.vjp(func, *primals)
        elif departures and _switch.verify:
            record.real = transforms.vjp(func, *primals)[1]  # shadow verification compares with it
    else:
        out, record.real = transforms.vjp(func, *primals)
    return out, _vjp_fn(record)


def _warming(key: Hashable) -> bool:
    """Whether a pullback of this function is still being fed towards its first guard: the forward
    then takes its own first calls alongside (both reach replay together, two calls sooner)."""
    return any(auto.impure is None and auto._guard is None and feed.warmups < _WARMUPS
               for auto, feed in list(_pullbacks.get(key, {}).items()))


def _vjp_fn(record: _Record) -> Callable:
    def vjp_fn(cotangents: Any, *more: Any, **kwargs: Any) -> tuple:
        """The gradients for `cotangents`, as engine.transforms.vjp's vjp_fn (same arguments)."""
        if record.real is not None:
            return record.real(cotangents, *more, **kwargs)
        if record.freed:
            raise RuntimeError(
                "Trying to backward through the graph a second time: this vjp_fn was called with "
                "retain_graph=False before (as torch.func's vjp_fn, it cannot be called again then).")
        if not any(record.proven(auto) for auto in list(record.stamps)):
            _refuse(record)
        out = transforms.vjp(record.func, *record.primals)[1](cotangents, *more, **kwargs)
        if kwargs.get("retain_graph", True) is False or (more and more[0] is False):
            record.freed = True
        return out

    vjp_fn._vjp_record = record
    return vjp_fn


_VJP_FN_CODE = _vjp_fn(None).__code__  # (every vjp_fn `vjp` returns runs this code)


def _refuse(record: _Record) -> None:
    raise TransformError(
        f"vjp_fn of engine.vjp({getattr(record.func, '__qualname__', record.func)!r}, ...): between the vjp "
        "call and this call, the state the function reads changed (a rebound global or closure "
        "variable, a Module attribute, an in-place write into a primal or a tensor it reads), or this "
        "call runs under autocast or inference mode, which the vjp call did not. Automatic "
        "tracing deferred the vjp's backward graph, so it cannot give the gradients of the earlier "
        "state. Call vjp_fn before changing that state, or run the vjp under engine.auto_tracing(False)."
    )


def vmap_of_vjp_fn(func: Callable, args: tuple, kwargs: dict) -> Callable | None:
    """engine.vmap(func, *args, **kwargs) where `func` is a vjp_fn made by `vjp`, else None: how
    engine.vmap composes with `vjp` (registered where engine/__init__.py wraps vmap)."""
    if getattr(func, "__code__", None) is not _VJP_FN_CODE:
        return None
    return _pullback_entry(func, args, kwargs)


def _pullback_entry(vjp_fn: Callable, args: tuple, kwargs: dict) -> Callable:
    """engine.vmap(vjp_fn, *args, **kwargs) for a vjp_fn made by `vjp` (see the module docstring)."""
    record: _Record = vjp_fn._vjp_record
    try:
        options = option_key(args), option_key(kwargs)
    except TypeError:
        return _vmap.vmap(vjp_fn, *args, **kwargs)

    def eager(*cotangents: Any, **kw: Any) -> Any:  # (made at need: most calls replay)
        return _vmap.vmap(vjp_fn, *args, **kwargs)(*cotangents, **kw)

    count = len(record.primals)
    key = ("vjp-pullback", record.key, count, options)
    pullback = shared_traced(_pullback(record.func, count, args, kwargs), key)
    feeds = _pullbacks.get(record.key)
    feed = None if feeds is None else feeds.get(pullback)
    if feed is None:
        with _lock:
            feed = _pullbacks.setdefault(record.key, weakref.WeakKeyDictionary()).setdefault(pullback, _Feed())
            if len(_pullbacks) > _PULLBACK_KEYS:  # keys of functions whose pullbacks are gone
                for k in [k for k, autos in _pullbacks.items() if not autos]:
                    del _pullbacks[k]

    def entry(*cotangents: Any, **kw: Any) -> Any:
        if kw or not traces_here():
            return eager(*cotangents, **kw)
        both = (*record.primals, *cotangents)
        verify = departures and _switch.verify
        # With the real vjp_fn at hand, the pullback is worth a call only where it replayed last
        # time (else it runs eagerly: a second forward): e.g. a vjp whose result needs grad.
        if record.proven(pullback) and (record.real is None or verify or feed.replayed):
            feed.warmups = 0
            hits = pullback.traced._hits
            out = pullback._call(both, {})
            feed.replayed = pullback.traced._hits != hits
            if record.real is not None and verify:
                # The pullback recomputes the forward the real vjp_fn saved: the same ops, but not
                # one dataflow (engine.replay_contract), so the two agree within the dtype's tolerance.
                _compare(record, out, _vmap.vmap(record.real, *args, **kwargs)(*cotangents), exact=False)
            return out
        if record.real is None and not any(record.proven(auto) for auto in list(record.stamps)):
            _refuse(record)
        out = eager(*cotangents)  # the real vjp_fn, or the deferred one recomputing in the proven state
        if feed.warmups < 0:  # met once: a vjp of a function made anew at each call (a lambda) pays nothing
            feed.warmups = 0
        elif pullback.impure is None and feed.warmups < _WARMUPS:
            # A run for the pullback's verdicts and recording, not for its result (the real one's
            # is returned): it leaves the random state as it found it, and a failure (a random op
            # under randomness='error', which the real vjp_fn ran outside vmap) only ends the tries.
            feed.warmups += 1
            rng = _rng_state()
            try:
                hits = pullback.traced._hits
                pullback._call(both, {})
                feed.replayed = pullback.traced._hits != hits
            except Exception:  # noqa: BLE001 - see above
                feed.warmups = _WARMUPS
            finally:
                _set_rng_state(rng)
        return out

    return entry


def _compare(record: _Record, out: Any, ref: Any, exact: bool) -> None:
    """Shadow verification of a deferred vjp_fn: within the dtype's tolerance (`exact`: bit for bit)."""
    problem = output_difference(out, ref, exact=exact)
    autotrace.shadow_checks += 1
    if problem is not None:
        raise ReplayMismatchError(
            f"engine.auto_tracing(verify=True): vmap of a deferred vjp_fn of "
            f"{getattr(record.func, '__qualname__', record.func)!r} differs from the real vjp_fn's: {problem}. "
            "This is an engine bug; run with engine.auto_tracing(False) to get eager results meanwhile."
        )
