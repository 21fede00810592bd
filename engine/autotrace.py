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
   raising per its policy), makes the function eager for good; a run during which the state
   below changed is verified again once (a library may settle during a first call), and makes
   it eager for good the second time. A run whose result requires grad (it is part of an outer autograd graph a replay
   would not rebuild), or holds non-tensor values other than atoms, keeps that signature eager;
2. the state the run depended on is recorded by engine.guardstate (closure cells and globals the
   code names, attributes and hooks of the Modules that ran or are reachable, captured containers,
   tensor metadata) and checked by identity before every later call: any change (a closure or
   global rebound, `model.eval()`, a hook added, `model.scale = 2.0`, a captured list changed)
   drops the recorded graphs and starts over at 1.;
3. the third call records the graph (engine.trace: the recording is a real run, its results are
   this call's) and later calls replay it. Where the guards below could only be proven by walking
   just the code that ran (2.), the recording is watched like 1. (a tensor-valued branch may run
   other code: an effect there makes the function eager, code 2. did not guard voids the recording
   and the signature is verified again). Replays run under no_grad (1. showed the result needs none). A
   graph that writes into its inputs or captured tensors is not replayed: that signature stays
   eager. Value-dependent Python (`.item()`, data-dependent shapes) makes the trace refuse and
   the signature runs eagerly; a bool read (`if t.sum() > 0`) becomes a replay guard and a
   replay whose branch differs runs eagerly.
Random ops stay ops in the graph, so replays draw fresh values like eager calls.

What is guarded, by class of state (scalars by their exact bits, buffers by content, attribute
reads through anything reached, modules however reached), is written down in engine.guardstate.

What is recorded belongs to what a callable is, not to the callable object: the public transforms
are `traced_transform`s, and equal constructions (the same transform chain, options and root
function) share one AutoTraced, so `engine.grad(f)(x)` written inline in a loop replays too.

What is not proven stays eager, silently: the results are always the eager ones. Switch it off
with `engine.auto_tracing(False)` (a context manager) or VMAPBENCH_AUTO_TRACE=0. Shadow
verification (`engine.auto_tracing(verify=True)`, VMAPBENCH_AUTO_TRACE=verify) runs the eager call
beside every replay and raises ReplayMismatchError where they differ: the net under every change.
"""
from __future__ import annotations

import functools
import threading
from contextlib import nullcontext
import types
from collections import OrderedDict
from typing import Any, Callable, Hashable

import torch
from torch.utils._pytree import tree_flatten

from engine import autoswitch, purity
from engine._batched import _active
from engine._dispatch import record_fallbacks
from engine._guards import _Depth, _State
from engine.autoswitch import departures, running
from engine.fused import OFF as fused_off
from engine.fused import _local as fused_mode
from engine.errors import ReplayMismatchError
from engine import replay_contract
from engine.guardstate import MAX_MODULES, StateGuard, _Distribution, _FlatArgsMemo, _NativeGuard, _PythonMemo, torch_globals
from engine.trace import _PLAIN, TracedFunction, _GuardFailed, _fast_signature, _signature, exact_value

__all__ = [
    "AutoTraced",
    "auto_trace",
    "autotraced_state",
    "function_key",
    "option_key",
    "output_difference",
    "shared_traced",
    "traced_transform",
    "traces_here",
    "transform_entry",
]

_SEEN, _RECORD, _REPLAY, _EAGER = "seen", "record", "replay", "eager"
shadow_checks = 0  # replays compared with their eager call by shadow verification, in this process
rounding_only = 0  # of those, replays that ran the eager call's ops and differed from it in rounding alone
_MAX_SIGNATURES = 256
_MEMO_BUILDS = 4  # argument checks (AutoTraced._memo) built at once under a guard; then with backoff
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
        self._state_changes = 0  # watched runs during which the state they read changed
        self._guard: StateGuard | None = None  # the state the verified signatures ran under
        self._signatures: dict[Any, str] = {}  # signature key -> _REPLAY / _EAGER (valid under _guard)
        self._modules: dict[int, torch.nn.Module] = {}  # Modules seen running, guarded from then on
        self._slots: dict[tuple[int, str], tuple[dict, str]] = {}  # global names user code read
        self._ran: set[types.CodeType] = set()  # user code the watched runs executed
        self._state_dicts = False  # a watched run ran torch's state-dict code (guardstate._STATE_DICT_TABLES)
        self._narrow = False  # the guards walk only `_ran` (the full walk was unprovable); recordings are watched
        self._memo: _NativeGuard | None = None  # the native check of the last replayed signature's arguments (see _call)
        self._memo_builds = 0  # memos built under the current guard
        self._memo_wait = 0  # replays that missed the memo to let pass before building another

    def _guard_roots(self) -> tuple:
        return (self.fn,)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if departures and _switch.depth:  # part of a traced run (transform_entry checks this before _call itself)
            return self._eager(args, kwargs)
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        # The hot path of every replay: what it adds to engine.trace's own call is measured by
        # vmapbench.bench_guards (--count: instructions) and the overhead benchmarks, so it is kept
        # to the checks alone, inline (a Python frame costs about what one of them does). Where
        # every thread is in the standard state (no transform or traced run in progress, automatic
        # tracing on, not verifying: engine.autoswitch.departures is empty) and the trace holds an
        # entry for this signature (a replay verdict, see below), the entry is replayed after
        # - the guard's native check for this grad mode (`_NativeGuard.holds`, inlined): its tree
        #   of C++ guards proves the state unchanged and checks torch's global state, the torch-
        #   function mode stack and inference mode; then the float32 precision, torch.distributions'
        #   validate_args default and what the tree cannot express (`rest`);
        # - `_outermost()`'s remaining checks: the engine's levels, the dispatch-mode and functorch
        #   stacks, the compile flag (what torch.compiler.is_compiling() returns outside TorchScript).
        # The signature comes first: `_memo`, a native check built for the arguments of the last
        # replayed signature (plain tensors, positional), proves them in the same C call as the
        # state (engine.trace's key of such arguments is their tensor metadata, which it checks,
        # and the grad mode, which its global-state guard checks), so the key is not built in
        # Python; its entry must still be the trace's most recently used one (`_mru`: in the cache,
        # so not cleared or evicted since). Otherwise the key is built (`_fast_signature`).
        # Anything else, a failing check included, takes the full path, which decides.
        # (An entry in the trace implies a guard and a function not found impure: _reset, which
        # both call, clears the trace.)
        memo = self._memo
        if memo is not None and not kwargs and not departures:
            entry = memo.entry
            traced = self.traced
            if entry is traced._mru:
                flatten = memo.flatten
                try:
                    flat = args if flatten is None else flatten(args)  # (a memo of a parameter dict, a list)
                    holds = (flat is not None and memo.check((flat, memo.values))
                             and memo.read_precision() == memo.precision
                             and _Distribution._validate_args is memo.validate and (not memo.rest or memo._rest())
                             and not _active and not _dispatch_modes() and _interpreters() is None
                             and not _compiler._is_compiling_flag)
                except Exception:  # an accessor that raises (a property of a user class): the full path decides
                    holds = False
                if holds:
                    traced._hits += 1  # TracedFunction._replay_hit, inlined (the entry is the most recent)
                    try:
                        # TracedFunction._replay, inlined: under no_grad unless the entry is inert
                        # (flat: the call's tensors in leaf order, the arguments tuple where they are all)
                        if entry.inert or not _grad_enabled():
                            return entry.call(flat)
                        _set_grad_enabled(False)
                        try:
                            return entry.call(flat)
                        finally:
                            _set_grad_enabled(True)
                    except _GuardFailed:
                        return traced._guard_failed(entry, args, kwargs)
        fast = _fast_signature(args, kwargs, True)
        if fast is not None and not departures:
            traced = self.traced
            entry = traced._fast.get(fast[0])
            natives = None if entry is None else self._guard._natives
            native = None if natives is None else natives[fast[0][0]]  # (the key leads with the grad mode)
            if native is not None:
                try:
                    holds = (native.check(native.values) and native.read_precision() == native.precision
                             and _Distribution._validate_args is native.validate and (not native.rest or native._rest())
                             and not _active and not _dispatch_modes() and _interpreters() is None
                             and not _compiler._is_compiling_flag)
                except Exception:  # an accessor that raises, or the precision getter: the full path decides
                    holds = False
                if holds:
                    traced._hits += 1  # TracedFunction._replay_hit, inlined
                    if entry is not traced._mru:
                        traced._cache.move_to_end(entry.key)
                        traced._mru = entry
                    if (memo is None or memo.entry is not entry or memo.base is not native) and not kwargs:
                        if memo is not None and memo.entry is entry:
                            # Same signature, its guard's native check rebuilt (a tag moved and the
                            # contents held): the memo follows at once, uncounted. The backoff is for
                            # signatures that alternate; the guard's own credit bounds these rebuilds
                            # (a backoff here would put each build, as costly as the native one's,
                            # inside whichever call its count ran out in; tests/test_autotrace_quick.py).
                            self._remember(entry, native, args, counted=False)
                        elif self._memo_wait:
                            self._memo_wait -= 1
                        else:
                            self._remember(entry, native, args)
                    try:
                        return traced._replay(entry, fast[1])
                    except _GuardFailed:
                        return traced._guard_failed(entry, args, kwargs)
        return self._checked_call(args, kwargs, fast)

    def _remember(self, entry: Any, native: Any, args: tuple, counted: bool = True) -> None:
        """Build `_memo` for these arguments' signature (see `_call`), where `_memo_wait` (counted
        down by the caller) is 0: the first `_MEMO_BUILDS` times under a guard at once, then after
        twice as many replays that missed it as before the last build, so that calls alternating
        between signatures (or with arguments other than plain tensors, which get no memo) build
        O(log calls) of them (each costs what the guard's native check took to build). A rebuild
        for the memo's own signature after its guard's native check was rebuilt is not counted
        (`counted=False`): a backoff there would leave every call on the slower path for 2^k calls
        and land the rebuild wherever the count ran out."""
        if counted:
            self._memo_builds += 1
            if self._memo_builds >= _MEMO_BUILDS:
                self._memo_wait = 1 << min(self._memo_builds, 20)
        if native is None:  # the guard has no native check (yet): the Python one
            memo = _PythonMemo.build(self._guard, args, entry)
            if memo is not None:
                self._memo = memo
            return
        memo = _NativeGuard.build(native.guard, args)
        if memo is None:  # arguments the tree does not take: a parameter dict, a list of tensors
            flat = _FlatArgsMemo.build(native, args, entry)
            if flat is not None:
                self._memo = flat
            return
        if memo.grad != native.grad:
            return
        memo.entry, memo.base = entry, native
        self._memo = memo

    def _checked_call(self, args: tuple, kwargs: dict, fast: Any) -> Any:
        if self.impure is not None or not _outermost():
            return self._eager(args, kwargs)
        if fast is not None:
            key: Any = fast[0]  # a tuple led by a bool (grad mode): never equal to a ("full", ...) key
        else:
            key = _full_key(args, kwargs)
            if key is None:
                return self._eager(args, kwargs)
        guard = self._guard
        if guard is not None and not guard.holds():
            self._reset()
        verify = bool(departures) and _switch.verify
        if fast is not None and not verify:
            # The trace holds entries only for signatures verified for replay (_REPLAY): _reset and
            # the bound on signatures clear both together. So a recorded entry is a replay verdict,
            # found with one lookup.
            # The replay runs no Python of the function (a graph of aten ops; a failed branch check
            # reruns it eagerly through running()), so it needs no traced-run depth of its own.
            traced = self.traced
            entry = traced._fast.get(key)
            if entry is not None:
                if guard is not None and guard._natives is None and not kwargs \
                        and (self._memo is None or self._memo.entry is not entry):
                    # no native check yet: a Python memo of these arguments (see _call)
                    if self._memo_wait:
                        self._memo_wait -= 1
                    else:
                        self._remember(entry, None, args)
                return traced._replay_hit(entry, args, kwargs, fast[1])
        mode = self._signatures.get(key)
        if mode is _REPLAY:
            if verify:
                return self._shadow(args, kwargs, fast, key)
            return self._traced_call(args, kwargs, fast, key)  # it may record: a run of the function
        if mode is _EAGER:
            return self._eager(args, kwargs)
        if mode is _RECORD:
            return self._record(args, kwargs, fast, key)
        if mode is None:  # a first call: a function called once pays nothing for being watched
            if len(self._signatures) >= _MAX_SIGNATURES:
                self._signatures.clear()
                self.traced.cache_clear()  # its entries stand for _REPLAY verdicts (see _call)
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
        self._memo = None
        self._memo_builds = self._memo_wait = 0

    def _mark_impure(self, why: str) -> None:
        self.impure = why
        self._reset()

    def _verify(self, args: tuple, kwargs: dict, key: Any) -> Any:
        """Run eagerly, watched; on a clean run, let this signature be traced from the next call."""
        if not purity.can_watch():  # another profiler (cProfile) is installed: nothing is proven
            return self._eager(args, kwargs)
        # The guards walk all that is reachable; where that is unprovable (state the function
        # holds but never reads: a JAX twin beside the torch function; or more than MAX_MODULES
        # Python modules, where the first walk stops), they walk only the code the watched runs
        # executed (`_narrow`), and the recording is watched as well. Then the
        # guard taken after the run decides, and a change made by the run fails it at the next call.
        before = StateGuard([self.fn, *self._modules.values()], self._slots.values(),
                            self._ran if self._narrow else None, self._state_dicts,
                            max_modules=None if self._narrow else MAX_MODULES)
        if before.unprovable is not None and not self._narrow:
            self._narrow = True
        self.eager_calls += 1
        settings = _settings()
        with record_fallbacks() as fallbacks, purity.watch() as seen:
            out = running(self.fn, *args, **kwargs)
        if not seen.pure:
            self._mark_impure(f"it has an effect besides its result: {seen.effects[0]}")
        elif fallbacks.total:
            self._mark_impure(f"its eager run used the for-loop fallback ({', '.join(fallbacks.counts)})")
        elif (before.unprovable is None and not before.holds()) or _settings() != settings:
            # Once may be a library settling (a lazy import rebinding torch.manual_seed): verify
            # again from scratch; twice is the function's own doing: eager for good.
            self._state_changes += 1
            if self._state_changes >= 2:
                self._mark_impure("the state it reads (or a torch setting) changed while it ran")
            else:
                self._reset()
                return out
        if self.impure is not None:
            return out
        self._modules.update(seen.modules)
        self._slots.update(seen.global_slots)
        self._ran |= {code for code in seen.user_codes if not purity.generated(code)}
        self._state_dicts |= seen.state_dicts
        guard = StateGuard([self.fn, *self._modules.values()], self._slots.values(),
                           self._ran if self._narrow else None, self._state_dicts)
        if guard.unprovable is not None:
            self._mark_impure(guard.unprovable)
            return out
        self._guard = guard
        guard.progress = functools.partial(getattr, self.traced, "_hits")
        # A memo proves the state of the guard it was built from; the new one may guard more (what
        # this run read): replays check it from now on.
        self._memo = None
        self._memo_builds = self._memo_wait = 0
        if not _replayable_output(out, tree_flatten((args, kwargs))[0] + guard.tensors):
            self._signatures[key] = _EAGER
            return out
        self._signatures[key] = _RECORD if self._narrow else _REPLAY
        return out

    def _record(self, args: tuple, kwargs: dict, fast: Any, key: Any) -> Any:
        """The call that records the graph where the guards walk only the code that ran, watched
        too (it costs: the trace runs under sys.setprofile): a tensor-valued branch may take it
        down code the verified run never ran. Of the code that ran, what the function's state reaches
        (the guard's walk) is the function's; the rest is the tracer's own machinery (torch's
        dependencies, strings torch evaluates, lazy imports). An effect in the function's code
        makes it eager for good; its code or Modules the verified runs had not seen void the
        recording (the guard did not cover what they read): the signature is verified again."""
        if not purity.can_watch():
            return self._eager(args, kwargs)
        with purity.watch() as seen:
            out = running(self.traced._call, args, kwargs, fast)
        modules = {k: m for k, m in seen.modules.items() if k not in self._modules}
        candidates = seen.user_codes - self._ran
        reached: set = set()
        if candidates or modules:
            trial = StateGuard([self.fn, *self._modules.values(), *modules.values()], self._slots.values(),
                               self._ran | candidates)
            if trial.unprovable is not None:
                self._mark_impure(trial.unprovable)
                return out
            reached = trial.walked & candidates
        effects = [why for code, why in seen.effect_codes.items() if code in self._ran or code in reached]
        if effects:
            self._mark_impure(f"it has an effect besides its result: {effects[0]}")
        elif modules or any(not purity.generated(code) for code in reached) or (seen.state_dicts and not self._state_dicts):
            self._ran |= {code for code in reached if not purity.generated(code)}
            self._modules.update(modules)
            self._state_dicts |= seen.state_dicts
            self._reset()
        else:
            self._signatures[key] = _REPLAY
        return out

    def _traced_call(self, args: tuple, kwargs: dict, fast: Any, key: Any) -> Any:
        """The traced call of a signature verified for replay: a replay, or the call that records.

        A recording that branched on tensor values (`if x.sum() > 0`, a distribution's argument
        check) may have run code the watched run did not: these arguments can take another branch
        than the watched call's did, and an effect there (Python `random`, a global store) would be
        frozen into the graph unseen. Such a recording is not kept: this call's result is its real
        run's, and the signature records again, watched (`_record`), at its next call. A recording
        that read no tensor value ran exactly the code the watched run ran."""
        traced = self.traced
        recorded = self._narrow or self._cached_entry(args, kwargs, fast) is not None
        out = running(traced._call, args, kwargs, fast)
        if not recorded:
            entry = self._cached_entry(args, kwargs, fast)
            if entry is not None and entry.guards and self._signatures.get(key) is _REPLAY:
                traced.cache_clear()  # (other signatures' entries are recorded again at their next call)
                self._signatures[key] = _RECORD
        return out

    def _cached_entry(self, args: tuple, kwargs: dict, fast: Any) -> Any:
        """The trace's entry for these arguments' signature, whatever its state, or None."""
        traced = self.traced
        if fast is not None and fast[0] in traced._fast:
            return traced._fast[fast[0]]
        return traced._cache.get(_signature(args, kwargs, traced._strides)[0])

    def _shadow(self, args: tuple, kwargs: dict, fast: Any, key: Any) -> Any:
        """Shadow verification: the replay, then the eager call from the same random state, compared
        by the replay contract (engine.replay_contract: their op logs, then their values within the
        dtype's tolerance). The replay's result is returned; the eager call is not counted in `eager_calls`."""
        entry = self._replay_entry(args, kwargs, fast)
        if entry is None:  # the recording run or an eager run: nothing to compare
            return self._traced_call(args, kwargs, fast, key)
        generators = [g for g in tree_flatten((args, kwargs))[0] if isinstance(g, torch.Generator)]
        generators += self._guard.generators if self._guard is not None else []
        states = [g.get_state() for g in generators]
        rng = torch.get_rng_state()
        fused = entry.fused is not None and fused_mode.mode is not fused_off  # the program may run
        # engine.replay_contract: a replay the passes left alone runs the eager call's rounding ops on
        # the same data the same way, so it may differ from it only by what a kernel does
        # differently from call to call (some BLAS builds on some CPUs): then within the dtype's
        # tolerance. A rewritten graph or the fused program: within the tolerance alone.
        contract = not fused and not entry.rewrites
        replay_ops, eager_ops = replay_contract.logs() if contract else (nullcontext(), nullcontext())
        stale = _stale_fold(entry) if contract else None
        failures = self.traced.guard_failures
        with replay_ops:
            out = running(self.traced._call, args, kwargs, fast)
        # A replay whose branch checks failed ran the function eagerly after the graph: no replay to compare.
        contract = contract and self.traced.guard_failures == failures
        torch.set_rng_state(rng)
        for g, state in zip(generators, states):
            g.set_state(state)
        with eager_ops:
            ref = running(self.fn, *args, **kwargs)
        problem = stale or output_difference(out, ref, exact=False)
        if contract and problem is None and entry.run != getattr(entry.gm, "forward", None):  # (== : a bound method)
            # The op logs are modes, under which a replay runs the graph's Python forward; where its
            # replays run through torch.jit's interpreter (engine.script_replay, built here, outside
            # them), that run is compared with the forward's, from the same random state.
            torch.set_rng_state(rng)
            for g, state in zip(generators, states):
                g.set_state(state)
            hits = self.traced._hits
            scripted = running(self.traced._call, args, kwargs, fast)
            self.traced._hits = hits  # (one call of the caller's: one hit)
            differs = output_difference(scripted, out, exact=False)
            if differs is not None:
                problem = f"its run through torch.jit's interpreter differs from the graph's forward: {differs}"
        if contract and problem is None:
            extra = replay_contract.departures(replay_ops, eager_ops)
            rounding = output_difference(out, ref, exact=True)
            if extra:
                problem = (f"{rounding + '; ' if rounding else ''}it runs {replay_ops.describe(extra[0])}, which the "
                           f"eager call does not run on that data that way ({len(extra)} such op(s)): it may round "
                           f"differently on another CPU")
            elif rounding is not None:
                global rounding_only
                rounding_only += 1
        global shadow_checks
        shadow_checks += 1
        if problem is not None:
            what = "fused program" if fused else "replay" + (f" (rewritten by {', '.join(entry.rewrites)})" if entry.rewrites else "")
            raise ReplayMismatchError(
                f"engine.auto_tracing(verify=True): the {what} of "
                f"{getattr(self.fn, '__qualname__', repr(self.fn))} differs from its eager call for the signature "
                f"{_describe(key)}: {problem}. This is an engine bug (a replay must equal the eager call); "
                f"run with engine.auto_tracing(False) (VMAPBENCH_AUTO_TRACE=0) to get eager results meanwhile."
            )
        return out


    def _replay_entry(self, args: tuple, kwargs: dict, fast: Any) -> Any:
        """The recorded entry the traced call will replay (or run as a fused program), or None when
        it will record one or run eagerly because its graph writes into its inputs: running such a
        function twice would not be a shadow, it would write twice."""
        traced = self.traced
        if fast is not None:
            entry = traced._fast.get(fast[0])
        else:
            entry = traced._cache.get(_signature(args, kwargs, traced._strides)[0])
        return entry if entry is not None and not entry.eager and entry.first is None else None


def _stale_fold(entry: Any) -> str | None:
    """Whether the values the entry's fold holds are those its captured tensors give now; then drop
    them, so that the replay recomputes them where its op log sees it (engine.replay_contract)."""
    fold = entry.fold
    if fold is None:
        return None
    held = fold.values()
    with torch.no_grad():
        problem = output_difference(list(held), list(fold.gm(*fold.sources)), exact=False)
    fold._layout = None
    return None if problem is None else f"the values folded from its captured tensors are stale: {problem}"


def _describe(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 300 else text[:297] + "..."


def output_difference(out: Any, ref: Any, exact: bool) -> str | None:
    """Where `out` differs from `ref`, or None: same structure, same leaf types, tensors of the same
    metadata and values (bit for bit where `exact`: NaN equals NaN, -0.0 differs from 0.0)."""
    flat_out, spec_out = tree_flatten(out)
    flat_ref, spec_ref = tree_flatten(ref)
    if spec_out != spec_ref:
        return f"the output structure differs ({spec_out} vs {spec_ref})"
    for i, (o, r) in enumerate(zip(flat_out, flat_ref)):
        where = f"output leaf {i}"
        if type(o) is not type(r):
            return f"{where} is a {type(o).__name__}, eager gives a {type(r).__name__}"
        if isinstance(o, torch.Tensor):
            meta_o = (tuple(o.shape), o.dtype, o.device, o.requires_grad, o.layout)
            meta_r = (tuple(r.shape), r.dtype, r.device, r.requires_grad, r.layout)
            if meta_o != meta_r:
                return f"{where} has (shape, dtype, device, requires_grad, layout) {meta_o}, eager {meta_r}"
            problem = _tensor_difference(o.detach(), r.detach(), exact)
            if problem is not None:
                return f"{where}: {problem}"
        elif exact_value(o) != exact_value(r):
            return f"{where} is {o!r}, eager gives {r!r}"
    return None


def _tensor_difference(o: torch.Tensor, r: torch.Tensor, exact: bool) -> str | None:
    if o.layout != torch.strided:
        o, r = o.to_dense(), r.to_dense()
    if o.is_complex():
        o, r = torch.view_as_real(o.resolve_conj()), torch.view_as_real(r.resolve_conj())
    if exact:
        same = (o == r) | (o != o) & (r != r) if o.is_floating_point() else o == r
        if o.is_floating_point():
            same &= torch.signbit(o) == torch.signbit(r)
    else:
        try:
            torch.testing.assert_close(o, r, equal_nan=True)
            return None
        except AssertionError:
            same = torch.isclose(o, r, equal_nan=True)
    if bool(same.all()):
        return None
    bad = (~same).nonzero()[0].tolist()
    idx = tuple(bad)
    return f"first difference at index {idx}: {o[idx].item()!r} vs eager {r[idx].item()!r}"


def _settings() -> tuple:
    """Torch's process settings a function could leave changed (`torch.set_grad_enabled(False)`)."""
    return torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch_globals()


def _full_key(args: tuple, kwargs: dict) -> Any:
    """The full signature key, or None when an argument makes the call ineligible: a tensor
    subclass or functorch-wrapped tensor, or a non-tensor leaf other than an immutable atom (an
    object keys by identity, so a change of its attributes between calls would go unseen)."""
    try:
        key, flat, _ = _signature(args, kwargs, True)
    except TypeError:
        return None
    for x in flat:
        if isinstance(x, torch.Tensor):
            if type(x) not in _PLAIN or torch._C._functorch.is_functorch_wrapped_tensor(x):
                return None
        elif not isinstance(x, _ATOM_OUTPUTS) or hasattr(x, "__dict__"):  # an atom subclass may carry attributes
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
    if t.layout != torch.strided or type(t) not in _PLAIN or t._is_zerotensor():
        return None
    # a torch.func wrapper (one left in a module's state by an earlier torch.func call) has no
    # storage of its own: the tensor it wraps has
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t.untyped_storage().data_ptr() or None


_switch = autoswitch._local


_dispatch_modes = torch._C._len_torch_dispatch_stack
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
_function_modes = torch._C._len_torch_function_stack
_interpreters = torch._C._functorch.peek_interpreter_stack
_inference_mode = torch.is_inference_mode_enabled
_autocast = torch._C._is_any_autocast_enabled
_compiling = torch.compiler.is_compiling
_compiler = torch.compiler  # its `_is_compiling_flag`: what is_compiling() returns outside TorchScript, read without a call


def _outermost() -> bool:
    """No transform, trace, mode or foreign transform is running: this call stands on its own.
    (The checks are bound once: a module attribute lookup per check per call is most of their cost.
    Being part of a traced run, `_switch.depth`, is checked by the callers, before they get here.
    Where no thread departs from the standard state, no thread-local counter is read.)

    The replay path (`AutoTraced._call`) makes these checks another way: the guard's native
    tree of C++ guards checks the torch-function mode stack, inference mode and autocast (torch's
    global-state guard, with the grad mode and the default dtype, and a tensor-match guard on a
    private tensor, whose dispatch-key check includes the thread's excluded keys), and the rest
    are read there, inline."""
    return (
        not _active
        and (not departures or (_State.depth == 0 and _Depth.value == 0))
        and not _dispatch_modes()
        and not _function_modes()
        and _interpreters() is None
        and not _inference_mode()
        and not _autocast()
        and not _compiling()
    )


def traces_here() -> bool:
    """Whether automatic tracing would trace a transform called here: on, not part of a traced
    run, and at the outermost level (nothing running)."""
    if departures and (not _switch.enabled or _switch.depth):
        return False
    return _outermost()


def transform_entry(impl: Callable, key: Hashable | None = None) -> Callable:
    """The callable a transform returns: `impl` (the eager transform), automatically traced when
    called at the outermost level with automatic tracing on (see the module docstring). Entries
    made with the same `key` (the same transform of the same function with the same options)
    share one AutoTraced: its recorded graphs and guards."""
    auto: AutoTraced | None = None

    @functools.wraps(impl)
    def entry(*args: Any, **kwargs: Any) -> Any:
        nonlocal auto
        if departures:  # some thread is not in the standard state: is this one?
            switch = _switch
            if not switch.enabled or switch.depth:  # off, or part of a traced run: the eager transform
                return impl(*args, **kwargs)
        if auto is None:
            auto = shared_traced(impl, key)
        return auto._call(args, kwargs)

    return entry


# Inline transforms (`engine.hessian(f)(x)` in a loop) build a new callable every call; what was
# recorded belongs to what the callable is: the transform chain, its options and the function at
# its root. The registry maps that construction key to one AutoTraced. A key holds `id`s of the
# functions it names; the AutoTraced it maps to holds those functions (through its impl), so an id
# in a live key always names the same object. Least recently used keys are dropped past the bound.
_SHARED_MAX = 128
_shared_autos: OrderedDict[Hashable, AutoTraced] = OrderedDict()
_shared_lock = threading.Lock()


def shared_traced(impl: Callable, key: Hashable | None) -> AutoTraced:
    """The one AutoTraced of construction `key` (see above), made from `impl` at its first use;
    a new, unshared one where `key` is None."""
    if key is None:
        return AutoTraced(impl)
    with _shared_lock:
        auto = _shared_autos.get(key)
        if auto is not None:
            _shared_autos.move_to_end(key)
            return auto
        auto = _shared_autos[key] = AutoTraced(impl)
        if len(_shared_autos) > _SHARED_MAX:
            _shared_autos.popitem(last=False)
        return auto


def option_key(x: Any) -> Hashable:
    """A hashable, exact key of a transform option (in_dims, argnums, randomness, ...); TypeError
    where the option has none."""
    if isinstance(x, (list, tuple)):
        return type(x), tuple(option_key(v) for v in x)
    if isinstance(x, dict):
        return dict, tuple((option_key(k), option_key(v)) for k, v in x.items())
    if x is None or isinstance(x, (bool, int, float, complex, str)):
        return exact_value(x)
    raise TypeError(type(x).__name__)


def function_key(func: Any) -> Hashable | None:
    """What `func` is, as the inline transforms key it: the construction key of a callable a
    transform returned, a bound method's function and instance, else the function itself; None
    where `func` is a transform's callable with no exact key."""
    if getattr(func, "__code__", None) is _ENTRY_CODE:
        return _closure_value(func, "key")
    if isinstance(func, types.MethodType):  # `model.loss` is a new bound method at every access
        return ("method", id(func.__func__), id(func.__self__))
    return ("fn", id(func))


def _construction_key(name: str, func: Any, args: tuple, kwargs: dict) -> Hashable | None:
    """(transform, what it transforms, its options), or None where an option has no exact key."""
    base = function_key(func)
    if base is None:
        return None
    try:
        return name, base, option_key(args), option_key(kwargs)
    except TypeError:
        return None


def traced_transform(
    maker: Callable[..., Callable], compose: Callable[[Callable, tuple, dict], Callable | None] | None = None
) -> Callable[..., Callable]:
    """The public form of an eager transform (engine._vmap.vmap, engine.transforms.grad, ...): the
    callable it returns traces automatically (transform_entry), and equal constructions share what
    was recorded, so `engine.grad(f)(x)` written inline in a loop replays like a stored
    `g = engine.grad(f)`; a rebound `f` is another function, and a changed closure fails its guard.

    `compose(func, args, kwargs)` is how this transform composes with callables that another
    transform made and traces itself (engine.vmap of engine.vjp's vjp_fn: engine.autovjp): the
    callable to return for `func`, or None where `func` is not one it handles."""
    name = maker.__name__

    @functools.wraps(maker)
    def public(func: Callable, *args: Any, **kwargs: Any) -> Callable:
        if compose is not None:
            composed = compose(func, args, kwargs)
            if composed is not None:
                return composed
        impl = maker(func, *args, **kwargs)
        return transform_entry(impl, _construction_key(name, func, args, kwargs))

    return public


def _closure_value(fn: Callable, name: str) -> Any:
    code = fn.__code__
    return fn.__closure__[code.co_freevars.index(name)].cell_contents


_ENTRY_CODE = transform_entry(lambda: None).__code__


def autotraced_state(fn: Callable) -> AutoTraced | None:
    """The AutoTraced behind a callable a transform returned (None before its first outermost call
    with automatic tracing on); for inspection and tests."""
    code = getattr(fn, "__code__", None)
    if code is not _ENTRY_CODE:
        raise TypeError(f"autotraced_state: {fn!r} is not a callable returned by an engine transform")
    return _closure_value(fn, "auto")


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
