"""Automatic tracing: repeated calls of a transformed function replay its recorded graph, by
default, and only where the replay is proven to give what an eager call would.

The engine's eager path pays Python per op; `engine.trace` removes that but makes the user promise
that the function is a pure function of its arguments. Automatic tracing needs no promise: it
checks. Every callable the transforms return (engine.vmap, grad, grad_and_value, jacrev, jacfwd,
hessian) goes through `transform_entry`, which, at the outermost transform only (not inside
another transform, a trace, a TorchDispatchMode/TorchFunctionMode, torch.func, torch.compile or
inference mode), hands the call to an `AutoTraced`. `engine.auto_trace(fn)` wraps any function
the same way.

Per input signature (engine.trace's: shapes, dtypes, ..., non-tensor values, grad mode), the
first call runs eagerly and unwatched (a callable made and called once, `engine.vmap(f)(x)` in a
loop, pays nothing), then:
1. the second call runs eagerly, watched by engine.purity (sys.setprofile): every user frame's
   bytecode and every C call from user code is checked for effects other than the result
   (stores into globals, attributes, captured containers or nonlocals; print/I/O, Python `random`,
   `time`, list.append...; stateful torch calls such as manual_seed, backward, Module.train). A
   run with any effect, or that used the engine's for-loop fallback (which must keep warning or
   raising per its policy), or during which the state below changed, makes the function eager
   for good. A run whose result requires grad (it is part of an outer autograd graph a replay
   would not rebuild), or holds non-tensor values other than atoms, keeps that signature eager;
2. the state the run depended on is recorded by engine.guardstate (closure cells and globals the
   code names, attributes and hooks of the Modules that ran or are reachable, captured containers,
   tensor metadata) and checked by identity before every later call: any change (a closure or
   global rebound, `model.eval()`, a hook added, `model.scale = 2.0`, a captured list changed)
   drops the recorded graphs and starts over at 1.;
3. the third call records the graph (engine.trace: the recording is a real run, its results are
   this call's) and later calls replay it, under no_grad (1. showed the result needs none). A
   graph that writes into its inputs or captured tensors is not replayed: that signature stays
   eager. Value-dependent Python (`.item()`, data-dependent shapes) makes the trace refuse and
   the signature runs eagerly; a bool read (`if t.sum() > 0`) becomes a replay guard and a
   replay whose branch differs runs eagerly.
Random ops stay ops in the graph, so replays draw fresh values like eager calls.

What is not proven stays eager, silently: the results are always the eager ones. Switch it off
with `engine.auto_tracing(False)` (a context manager) or VMAPBENCH_AUTO_TRACE=0.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

from engine import autoswitch, purity
from engine.autoswitch import running
from engine.guardstate import StateGuard, torch_globals
from engine.trace import _PLAIN, TracedFunction, _fast_signature, _signature

__all__ = ["AutoTraced", "auto_trace", "autotraced_state", "transform_entry"]

_SEEN, _REPLAY, _EAGER = "seen", "replay", "eager"
_MAX_SIGNATURES = 256
_ATOM_OUTPUTS = (int, float, bool, complex, str, type(None), torch.dtype, torch.device)


class AutoTraced:
    """Replays `fn`'s recorded graphs once proven safe; see the module docstring.

    `impure` is None while replay is possible, else why the function runs eagerly for good;
    `eager_calls` counts the calls that ran `fn` eagerly outside the trace.
    """

    def __init__(self, fn: Callable, cache_size: int = 8):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.traced = TracedFunction(fn, fallback="eager", cache_size=cache_size, auto=True)
        self.impure: str | None = None
        self.eager_calls = 0
        self._guard: StateGuard | None = None  # the state the verified signatures ran under
        self._signatures: dict[Any, str] = {}  # signature key -> _REPLAY / _EAGER (valid under _guard)
        self._modules: dict[int, torch.nn.Module] = {}  # Modules seen running, guarded from then on
        self._slots: dict[tuple[int, str], tuple[dict, str]] = {}  # global names user code read

    def _guard_roots(self) -> tuple:
        return (self.fn,)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.impure is not None or not _outermost():
            return self._eager(args, kwargs)
        fast = _fast_signature(args, kwargs, False)
        if fast is not None:
            key: Any = ("fast", fast[0])
        else:
            key = _full_key(args, kwargs)
            if key is None:
                return self._eager(args, kwargs)
        guard = self._guard
        if guard is not None and not guard.holds():
            self._reset()
        mode = self._signatures.get(key)
        if mode is _REPLAY:
            return running(self.traced._call, args, kwargs, fast)
        if mode is _EAGER:
            return self._eager(args, kwargs)
        if mode is None:  # a first call: a function called once pays nothing for being watched
            if len(self._signatures) >= _MAX_SIGNATURES:
                self._signatures.clear()
            self._signatures[key] = _SEEN
            return self._eager(args, kwargs)
        return self._verify(args, kwargs, key)

    def _eager(self, args: tuple, kwargs: dict) -> Any:
        self.eager_calls += 1
        return running(self.fn, *args, **kwargs)

    def _reset(self) -> None:
        """The state changed: graphs and verdicts recorded under the old one are void."""
        self.traced.cache_clear()
        self._signatures.clear()
        self._guard = None

    def _mark_impure(self, why: str) -> None:
        self.impure = why
        self._reset()

    def _verify(self, args: tuple, kwargs: dict, key: Any) -> Any:
        """Run eagerly, watched; on a clean run, let this signature be traced from the next call."""
        if not purity.can_watch():  # another profiler (cProfile) is installed: nothing is proven
            return self._eager(args, kwargs)
        before = StateGuard([self.fn, *self._modules.values()], self._slots.values())
        if before.unprovable is not None:
            self._mark_impure(before.unprovable)
            return self._eager(args, kwargs)
        from engine._dispatch import record_fallbacks

        self.eager_calls += 1
        settings = _settings()
        with record_fallbacks() as fallbacks, purity.watch() as seen:
            out = running(self.fn, *args, **kwargs)
        if not seen.pure:
            self._mark_impure(f"it has an effect besides its result: {seen.effects[0]}")
        elif fallbacks.total:
            self._mark_impure(f"its eager run used the for-loop fallback ({', '.join(fallbacks.counts)})")
        elif not before.holds() or _settings() != settings:
            self._mark_impure("the state it reads (or a torch setting) changed while it ran")
        if self.impure is not None:
            return out
        self._modules.update(seen.modules)
        self._slots.update(seen.global_slots)
        guard = StateGuard([self.fn, *self._modules.values()], self._slots.values())
        if guard.unprovable is not None:
            self._mark_impure(guard.unprovable)
            return out
        self._guard = guard
        if not _replayable_output(out, tree_flatten((args, kwargs))[0] + guard.tensors):
            self._signatures[key] = _EAGER
            return out
        self._signatures[key] = _REPLAY
        return out


def _settings() -> tuple:
    """Torch's process settings a function could leave changed (`torch.set_grad_enabled(False)`)."""
    return torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch_globals()


def _full_key(args: tuple, kwargs: dict) -> Any:
    """The full signature key, or None when an argument makes the call ineligible: a tensor
    subclass or functorch-wrapped tensor, or a non-tensor leaf other than an immutable atom (an
    object keys by identity, so a change of its attributes between calls would go unseen)."""
    try:
        key, flat, _ = _signature(args, kwargs)
    except TypeError:
        return None
    for x in flat:
        if isinstance(x, torch.Tensor):
            if type(x) not in _PLAIN or torch._C._functorch.is_functorch_wrapped_tensor(x):
                return None
        elif not isinstance(x, _ATOM_OUTPUTS):
            return None
    return ("full", key)


def _replayable_output(out: Any, reachable: list) -> bool:
    """Outputs a replay reproduces: plain tensors that need no grad and share no memory with an
    argument or a captured tensor (an eager view of an input aliases it; whether the graph's
    output does too is not proven), and immutable atoms."""
    storages = {_storage(t) for t in reachable if isinstance(t, torch.Tensor)} - {None}
    for o in tree_flatten(out)[0]:
        if isinstance(o, torch.Tensor):
            if type(o) not in _PLAIN or o.requires_grad or o.layout != torch.strided or _storage(o) in storages:
                return False
        elif not isinstance(o, _ATOM_OUTPUTS):
            return False
    return True


def _storage(t: torch.Tensor) -> int | None:
    if t.layout != torch.strided or type(t) not in _PLAIN:
        return None
    return t.untyped_storage().data_ptr() or None


_switch = autoswitch._local
_engine_state: tuple | None = None


def _outermost() -> bool:
    """No transform, trace, mode or foreign transform is running: this call stands on its own."""
    global _engine_state
    if _engine_state is None:
        from engine import _batched, _guards, transforms

        _engine_state = (_guards._State, _batched._active, transforms._Depth)
    guards, active, depth = _engine_state
    return (
        guards.depth == 0
        and not active
        and depth.value == 0
        and not autoswitch.inside_traced_run()
        and torch._C._len_torch_dispatch_stack() == 0
        and torch._C._len_torch_function_stack() == 0
        and torch._C._functorch.peek_interpreter_stack() is None
        and not torch.is_inference_mode_enabled()
        and not torch._C._is_any_autocast_enabled()
        and not torch.compiler.is_compiling()
    )


def transform_entry(impl: Callable) -> Callable:
    """The callable a transform returns: `impl` (the eager transform), automatically traced when
    called at the outermost level with automatic tracing on (see the module docstring)."""
    auto: AutoTraced | None = None

    @functools.wraps(impl)
    def entry(*args: Any, **kwargs: Any) -> Any:
        nonlocal auto
        if not _switch.enabled or _switch.depth:  # off, or part of a traced run: the eager transform
            return impl(*args, **kwargs)
        if auto is None:
            auto = AutoTraced(impl)
        return auto(*args, **kwargs)

    return entry


_ENTRY_CODE = transform_entry(lambda: None).__code__


def autotraced_state(fn: Callable) -> AutoTraced | None:
    """The AutoTraced behind a callable a transform returned (None before its first outermost call
    with automatic tracing on); for inspection and tests."""
    code = getattr(fn, "__code__", None)
    if code is not _ENTRY_CODE:
        raise TypeError(f"autotraced_state: {fn!r} is not a callable returned by an engine transform")
    return fn.__closure__[code.co_freevars.index("auto")].cell_contents


def auto_trace(fn: Callable, *, cache_size: int = 8) -> AutoTraced:
    """Run `fn` eagerly until its replay is proven to equal its eager calls, then replay its graphs.

    `fn` is any composition of engine transforms (`engine.vmap(f)`, `engine.vmap(engine.grad(f))`,
    ...). What the engine's transforms do by default for the callables they return, for any
    function (see the module docstring for the proof), regardless of `engine.auto_tracing`.
    """
    if not callable(fn):
        raise TypeError(f"engine.auto_trace: fn must be callable, got {type(fn).__name__}")
    if not isinstance(cache_size, int) or cache_size < 1:
        raise ValueError(f"engine.auto_trace: cache_size must be a positive int, got {cache_size!r}")
    return AutoTraced(fn, cache_size)
