"""One measuring process of the regression gate: every workload of several commits, in one process.

The gate (vmapbench/gate.py) runs this file in a fresh interpreter with every side of a comparison
(`--tree base=... --tree head=... --tree twin=...`: the commits' extracted trees, twin a second
copy of head) loaded side by
side (`Sides`: each side's `engine` and `workloads` are its own modules; one side is active at a
time). Why one process: CPU times of one commit in two processes differ on a shared box (load,
memory layout) by more than a change the gate must see, and that spread, not the change, would
set the floors if base and head were timed in processes of their own; timed round by round in one process, a head/base ratio
cancels what the machine does to both. The measuring code is the gate's own (this file, the gate
checkout's suite/, loaded under the alias package `_gate_suite`, and its measuring/), as asv
measures every commit with the current suite: a change to the measuring code in a pull request cannot show up as
a change of the code measured.

Two kinds of process:

- time (default): every workload of the sides' registries at its first quick size (else its first
  size), cpu, methods GATE_METHODS (the engine as users get it, eager, traced; torch.func and the
  loop as references). Per workload each side makes each method's first call, then every side's
  methods are timed interleaved in rounds (`paired_samples`), in CPU seconds of this process (one
  intra-op thread), until every side's ratio to torch.func over the first side's is known to
  +-TARGET_HALFWIDTH or the workload's budget is spent (rounds chosen by each signal's own
  variance). The per-op overhead chain (suite/bench_overhead.py) is timed the same way against
  native. A round's figure is the fastest unit of calls of its batch, per call; the order of the
  calls changes round by round in cycles (`round_orders`), whole cycles read; references that
  run the same code on every side are timed on the first side only, apart from the rounds
  (`shared_references`). Output:
  {"sides": {side: {"times": {workload: {size: {method: [seconds per call, one per round]}}},
  "overhead": {method: [...]}, "overhead_ops": ops per chain call, "errors": {case: message},
  "shared": {workload: [methods whose
  list is the first side's]}, "apart": {workload: [methods timed apart from the rounds, in
  REFERENCE_ROUNDS of their own]}, "cycle": rounds in one cycle of the orders}}}, lists aligned
  by round across sides. With --memory each side also
  has "memory": {workload: {size: {method: [allocator peak bytes of MEMORY_REPEATS calls]}}},
  every method of every side but the shared references taken after the timing (exact figures:
  no rounds, no interleaving).
- count (--count LIB, under valgrind, see measuring/counts.py): the per-op chain and the workloads
  named by --workloads, each engine method's steady-state call counted twice in instructions, for
  every side (the two counts of one region show that it is deterministic). Output: {"sides":
  {side: {"regions": [label, ...], "errors": {...}}}}; the counts are in callgrind's dump files, one
  per region, labelled "SIDE|label", read by the gate.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

GATE_ROOT = Path(__file__).resolve().parents[1]
ALIAS = "_gate_suite"
# The methods timed: the engine as a user gets it (automatic tracing), eager (automatic tracing off:
# every first call and every function the trace cannot prove runs this path), traced and replayed;
# torch.func and the loop, the references the gated ratios divide by.
GATE_METHODS = ("engine", "engine_eager", "engine_traced", "torch_func", "loop")
# Counted per workload: measuring.counted.COUNT_METHODS (the gate checkout's).
CHAIN_COUNT_METHODS = ("engine", "engine_traced", "engine_auto")
# Methods whose calls keep state that another side's activation disturbs: automatic tracing's
# guards watch module dicts, which every switch of side writes; their first call after a switch
# re-proves the guards (the cost of the switch, not of the code) and is made untimed.
REWARM_METHODS = ("engine", "engine_auto")
# Untimed calls of such a method after each switch: the first re-proves the guard and rebuilds its
# native check, the second its argument check (engine.autotrace's memo), both built anew after a
# switch; with one, the second build fell inside the timed batch (a batch of ~12 calls 3-4x slower).
REWARM_CALLS = 2
# Uncounted calls of such a method before its counted ones: the first calls after a switch rebuild
# the guard's checks and the argument check, and a repeat that counted a rebuild reads several
# times the other (the signal's interval then spans any floor). The time process needs fewer: a
# round's figure is its batch's fastest unit.
COUNT_REWARM_CALLS = 3
# Their batches make at least this many calls: a guard whose tags move (here: once per switch)
# more often than every engine.guardstate._REBUILD_CALLS (8) calls gives up its native check for
# good, which would switch the measured path in the middle of a run.
REWARM_MIN_CALLS = 8
# Steady calls whose allocator peak is taken per side and method (--memory): exact figures, two to
# show that the call allocates the same each time.
MEMORY_REPEATS = 2
MIN_ROUNDS = 6  # at least, rounded up to whole cycles of the orders (`round_orders`)
# Rounds of the shared references (`shared_references`), timed apart from the others' rounds: their
# figure only sets a ratio's level, which its change head/base does not depend on.
REFERENCE_ROUNDS = 3
MAX_ROUNDS = 24
TARGET_HALFWIDTH = 0.02
MIN_BATCH_S = 0.004
# Units a gated method's batch is timed in at least: the fastest is the round's figure. A batch of
# one or two long calls was often hit whole by one of the vCPU's slow phases, which its fastest
# unit could not leave out (docs/lab/2026-12-05-gate-aa-asymmetry.md). The references, the slowest
# calls, keep their batches: four units of them would make every round several times longer.
MIN_UNITS = 4
UNIT_S = 0.0002  # a timed unit's least length: long enough that its two clock reads are under 1% of it
# A batch of units that last this long together needs no more units, down to MIN_LONG_UNITS: the
# slow phases last a few milliseconds, and of two calls of tens of milliseconds one escapes a
# phase that hits the other.
LONG_BATCH_S = 0.08
MIN_LONG_UNITS = 2
# The per-op chain's input: overhead-bound small tensors, where a dispatch-path regression shows most.
OVERHEAD_SIZE = "small"


def gate_suite(module: str) -> ModuleType:
    """`module` of the gate checkout's suite/ package, imported as `_gate_suite.<module>`. Importing
    that package puts the gate checkout's measuring/ in place as `measuring` (suite/__init__.py)."""
    if ALIAS not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            ALIAS, GATE_ROOT / "suite" / "__init__.py", submodule_search_locations=[str(GATE_ROOT / "suite")])
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules[ALIAS] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{ALIAS}.{module}") if module else sys.modules[ALIAS]


def gate_measuring(module: str) -> ModuleType:
    """`module` of the gate checkout's measuring/ package (the measured commits' trees hold only
    engine/ and workloads/)."""
    gate_suite("")
    return importlib.import_module(f"measuring.{module}")


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


def halfwidth(samples: list[float]) -> float:
    """Relative half-width of a ~95% interval of the median of `samples` (order statistics'
    normal approximation: 1.57 x IQR / sqrt(n)); inf with fewer than 3 samples."""
    if len(samples) < 3:
        return math.inf
    q1, median, q3 = gate_measuring("stats").quartiles(samples)
    return math.inf if median <= 0 else 1.57 * (q3 - q1) / math.sqrt(len(samples)) / median


def adaptive_samples(calls: Mapping[str, Callable[[], Any]], reference: str | None, budget_s: float,
                     clock: Callable[[], float], min_rounds: int | None = None, max_rounds: int = MAX_ROUNDS,
                     target: float = TARGET_HALFWIDTH) -> dict[str, list[float]]:
    """Seconds per call of each callable, one figure per round, the callables interleaved (forward
    order on even rounds, reverse on odd ones). Rounds go on past `min_rounds` until every
    callable's ratio to `reference` (round by round) has a relative half-width under `target`,
    `max_rounds` are done, or `budget_s` (on `clock`) is spent."""
    return paired_samples({"": calls}, reference, budget_s, clock, min_rounds=min_rounds,
                          max_rounds=max_rounds, target=target)[""]


def paired_samples(sides: Mapping[str, Mapping[str, Callable[[], Any]]], reference: str | None, budget_s: float,
                   clock: Callable[[], float], activate: Callable[[str], None] = lambda side: None,
                   min_rounds: int | None = None, max_rounds: int = MAX_ROUNDS,
                   target: float = TARGET_HALFWIDTH, rewarm: Collection[str] = (),
                   shared: Collection[str] = ()) -> dict[str, dict[str, list[float]]]:
    """`adaptive_samples` over several sides (commits) of the same calls in one process: side ->
    method -> seconds per call, one figure per round, every list aligned by round (the calls of one
    round, of every side, ran moments apart: a head/base ratio taken round by round cancels what
    the machine's load did to both). `activate(side)` runs before a side's calls (it puts that
    side's modules in place). The order of the calls changes every round (`round_orders`), in
    cycles. The first side with calls is the one the others are compared with: whole cycles go on
    (`min_rounds`, else MIN_ROUNDS, rounded up to whole cycles) until every method's ratio to
    `reference` of every other side over the first's, round by round, is known to `target` (or,
    with one side, its ratio to `reference`), `max_rounds` are done, or `budget_s` x sides is spent.

    A round's figure of a method is the fastest unit of its batch, per call: the batch (at least
    MIN_BATCH_S; for a gated method, one that is no reference, at least MIN_UNITS units, or
    MIN_LONG_UNITS of calls that last LONG_BATCH_S together) is timed in units of calls of at least
    UNIT_S each (one call, for calls that long).
    This machine's vCPU runs at two speeds that switch every few milliseconds, and its slow phases
    only ever add time: the mean of a batch moved by the share of it that fell in a slow phase
    (adjacent batches of one call: 4% median, 30% at the 95th percentile), the fastest unit is the
    code's own cost, as timeit's documentation recommends its minimum. A cost paid by only some of
    the calls (one in a unit's worth or rarer) does not show in it; what every call pays does.

    Methods in `shared` (references that run the same code on every side: see
    `shared_references`) are timed on the first side only and apart from the rounds, in
    REFERENCE_ROUNDS rounds of their own after them; every side's list is the first's. A ratio
    divides each round of every side by the same figure of theirs, so its change head/base is
    the method's own whichever figure that is: their rounds would cancel exactly, and the rounds'
    time goes to the methods compared.

    A call's position in the round moves its time (first or last, after which other calls): the
    orders of a cycle put every side's calls in every place once (`round_orders`), the rounds end
    with a whole cycle, and the gate reads every round (vmapbench.gate.signals). One unrecorded
    round, of one unit a batch, warms every call up first.

    The garbage collector runs between batches, never inside one (as timeit does it): what is
    alive when the timing starts is frozen out of its walks (`gc.freeze`), and each batch runs
    with it off and is followed by an untimed collection. A full collection of a process holding
    torch and three commits' modules can take longer than a batch, and fell into whichever
    batch allocated past its threshold: one side's median moved by a collection, not by its code.
    After a side is activated, its methods in `rewarm` are called REWARM_CALLS times untimed before
    their batch (automatic tracing re-proves its guard and rebuilds its checks once another side's
    modules were in place)."""
    timer = gate_measuring("timer")
    present = [side for side, calls in sides.items() if calls]
    first = present[0] if present else ""
    # What each side times: a shared method on the first side only (the others read its list).
    timed = [(side, n) for side, calls in sides.items() for n in calls if side == first or n not in shared]
    apart = [key for key in timed if key[1] in shared]  # timed after the rounds, not in them
    calls = {key: sides[key[0]][key[1]] for key in timed}
    orders = round_orders(sides, shared)
    cycle = len(orders)

    def before(key: tuple[str, str]) -> None:
        side, name = key
        activate(side)
        if name in rewarm:
            for _ in range(REWARM_CALLS):
                sides[side][name]()

    # A method's batch is sized from its fastest single call on any side, the same batch on every
    # side: a figure is the fastest of a batch's units, and the more units, the lower it reads, so
    # copies of one commit with batches of their own (sized from single calls of which the first
    # in the round ran cold) read apart by the count of their units. One round of single calls
    # only: each is a switch of side with a few calls between, and automatic tracing's guard
    # gives up its native check for good after a few such (REWARM_MIN_CALLS); a second round
    # spent that credit on some sides and not others.
    once = timer.single_calls(calls, clock=clock, collect=True, before=before)
    fastest = {name: min(once[key] for key in timed if key[1] == name) for _, name in timed}

    def least(name: str) -> int:
        """Calls a batch of `name` makes at least: one reference call; else MIN_UNITS units (of
        UNIT_S), or fewer units of long calls (LONG_BATCH_S together, MIN_LONG_UNITS at least)."""
        per_unit = math.ceil(UNIT_S / fastest[name])
        units = max(MIN_LONG_UNITS, min(MIN_UNITS, math.ceil(LONG_BATCH_S / (per_unit * fastest[name]))))
        calls = 1 if name in REFERENCES else units * per_unit
        return max(REWARM_MIN_CALLS if name in rewarm else 1, calls)

    batches = {key: timer.batch_for(fastest[key[1]], MIN_BATCH_S, 10_000, unit_s=UNIT_S, least=least(key[1]))
               for key in timed}
    # The warm-up round times one unit of each batch: a round's figure is its batch's fastest unit,
    # so a first unit that runs cold is left out anyway; a batch of one unit is warmed whole.
    warmup = {key: timer.Batch(batch.unit, batch.unit) for key, batch in batches.items()}

    def per_side(got: Mapping[tuple[str, str], list[float]]) -> dict[str, dict[str, list[float]]]:
        """side -> method -> its rounds; a shared method's list is the first side's own list."""
        return {side: {name: got.get((side, name), got.get((first, name), [])) for name in calls}
                for side, calls in sides.items()}

    # Whole cycles only: the places of the round are balanced over a cycle, not within a round.
    least_rounds = cycle * math.ceil((MIN_ROUNDS if min_rounds is None else min_rounds) / cycle)
    count = max(least_rounds, cycle * (max_rounds // cycle))

    # A shared reference divides every side alike: side over first, its figures cancel.
    widths_reference = None if reference in shared else reference

    def stop(r: int, got: Mapping[tuple[str, str], list[float]], elapsed: Callable[[], float]) -> bool:
        if r + 1 < least_rounds or (r + 1) % cycle:  # stop at the end of a cycle only
            return False
        if elapsed() > budget_s * max(1, len(present)):
            return True
        compared = {side: {n: t for n, t in methods.items() if n not in shared} for side, methods in per_side(got).items()}
        return all(w < target for w in _round_widths(compared, first, widths_reference))

    if not calls:
        return per_side({})
    in_rounds = {key: fn for key, fn in calls.items() if key not in apart}
    got: dict[tuple[str, str], list[float]] = {}
    if in_rounds:
        # A round of warm-up first (`warmup`): the first batches after the first calls run cold.
        got.update(timer.rounds(in_rounds, count, batches=batches, clock=clock, orders=orders, collect=True,
                                warmup_rounds=1, warmup_batches=warmup, before=before, stop=stop))
    if apart:
        got.update(timer.rounds({key: calls[key] for key in apart}, REFERENCE_ROUNDS, batches=batches,
                                clock=clock, collect=True, before=before))
    return per_side(got)


def round_orders(sides: Mapping[str, Mapping[str, Any]], shared: Collection[str] = ()) -> list[list[tuple[str, str]]]:
    """The cycle of round orders `paired_samples` times its calls in, (side, method) keys.

    One side: forward order, then reverse (a call's position in the round moves its time; a pair
    puts every call in mirrored positions). Several sides: one block per side (its methods in the
    order given), the blocks rotated by one every round: over a cycle of as many rounds as sides
    (`cycle_length`), every side's block runs once first and once in each place of the round
    (otherwise after the block before it, the same methods of another side). Any effect of a
    neighbour or a position (the first batch after the collector's run, after the previous
    workload's or round's last call) then falls on every side alike, and a ratio of two copies of
    one commit, over whole cycles (`whole_cycles`), is 1 but for noise. The shared references
    (`shared`) are in no round: `paired_samples` times them apart. A side with no calls (a
    workload it lacks) keeps its empty place, so every workload of a probe has the same cycle."""
    if len(sides) < 2:
        forward = [(side, name) for side, calls in sides.items() for name in calls]
        return [forward, forward[::-1]]
    blocks = [[(side, name) for name in calls if name not in shared] for side, calls in sides.items()]
    return [[key for block in blocks[r:] + blocks[:r] for key in block] for r in range(cycle_length(len(blocks)))]


def cycle_length(sides: int) -> int:
    """Rounds in one cycle of `round_orders` for a probe of `sides` sides."""
    return max(2, sides)


def whole_cycles(rounds: Sequence[float], cycle: int = 2) -> list[float]:
    """The rounds of whole cycles of the orders (`round_orders`): a last, incomplete cycle is left
    out (its rounds put the calls in some places and not others); fewer rounds than a cycle are
    returned as they are. Every round is one sample: a round's figure is already its batch's
    fastest unit, and over whole cycles every side was in every place alike. The gate reads every
    time signal this way (vmapbench.gate.signals)."""
    if len(rounds) < cycle:
        return list(rounds)
    return list(rounds[:len(rounds) - len(rounds) % cycle])


def _round_widths(samples: Mapping[str, Mapping[str, list[float]]], first: str, reference: str | None) -> list[float]:
    """Half-widths of what the rounds estimate (asked at the end of a cycle only, so every round is
    one the gate reads): each method's
    ratio to `reference` of every side over `first`'s (one side: the ratio to `reference` itself);
    without a reference, the methods' own times side over side."""
    def per_round(side: str, name: str) -> list[float]:
        own = samples[side][name]
        if reference is None or reference not in samples[side]:
            return own
        return [a / b for a, b in zip(own, samples[side][reference])]

    samples = {side: methods for side, methods in samples.items() if methods}
    widths = []
    for side, methods in samples.items():
        if side == first and len(samples) > 1:
            continue
        for name in methods:
            if name == reference and reference is not None and len(samples) == 1:
                continue
            mine = per_round(side, name)
            if len(samples) > 1:
                if name not in samples[first]:
                    continue
                mine = [a / b for a, b in zip(mine, per_round(first, name))]
            widths.append(halfwidth(mine))
    return widths


def gate_methods(workload: Any, methods: tuple[str, ...] = GATE_METHODS) -> list[str]:
    supports = getattr(workload, "supports", lambda m: m in workload.methods)
    return [m for m in methods if supports(m)]


# The packages of a measured commit (what the gate extracts): each side's own copy in this process.
OWNED = ("engine", "workloads")


_MISSING = object()


def _patchable() -> list[Any]:
    """The torch classes whose attributes an engine replaces for the rest of its process (its
    transform checks wrap Tensor.requires_grad_/retain_grad and autograd.Function.apply; its RNN
    rule wraps nn.RNNBase.__call__): each side gets its own replacements while it is active."""
    import torch

    return [torch.Tensor, torch.autograd.Function,
            *(c for c in vars(torch.nn).values() if isinstance(c, type) and issubclass(c, torch.nn.Module))]


class Sides:
    """Several commits' `engine` and `workloads` in one process, one side active at a time.

    A side's modules are imported from its own tree and kept apart: activating a side puts its
    modules in sys.modules and its tree first on sys.path (so an import made while it runs, lazy
    ones included, resolves to its own files), after putting the previous side's aside, and puts
    back the torch attributes that side replaced (`_patchable`; the others' replacements are
    undone: one engine's wrapper of Tensor.requires_grad_ is foreign code to another's automatic
    tracing, which would then refuse to replay). The code of each side keeps its own module
    globals, so objects made by one side (workload states, traced functions) keep running that
    side's code; activation is for the imports they make by name and the process-wide patches.
    """

    def __init__(self, trees: Mapping[str, Path]) -> None:
        self.trees = {label: Path(path).resolve() for label, path in trees.items()}
        self.modules: dict[str, dict[str, ModuleType]] = {label: {} for label in self.trees}
        self.patches: dict[str, list[tuple[Any, dict, str, Any]]] = {label: [] for label in self.trees}
        self.pristine = [(space, dict(vars(space))) for space in _patchable()]
        self.outside = {k: m for k, m in sys.modules.items() if self._owned(k)}  # put back by close()
        self.active: str | None = None
        # One table of timed choices for every side (engine.timed_choices): copies of the same
        # code reach the same state, so an A/A's sides run the same paths.
        self.choices: dict = {}

    @staticmethod
    def _owned(name: str) -> bool:
        return name.partition(".")[0] in OWNED

    def _replaced(self) -> list[tuple[Any, dict, str, Any]]:
        """(class, its attributes at start, attribute, value or _MISSING) of every patchable
        attribute changed since start."""
        out = []
        for space, before in self.pristine:
            now = vars(space)
            out += [(space, before, k, v) for k, v in now.items() if before.get(k, _MISSING) is not v]
            out += [(space, before, k, _MISSING) for k in before if k not in now]
        return out

    @staticmethod
    def _put(space: Any, key: str, value: Any) -> None:
        if value is _MISSING:
            with contextlib.suppress(AttributeError):
                delattr(space, key)
        else:
            setattr(space, key, value)

    def activate(self, label: str) -> None:
        self.share_choices()  # (the active side's engine may have been imported since it was activated)
        if label == self.active:
            return
        if self.active is not None:
            self.activate_none()
        for name in [k for k in sys.modules if self._owned(k)]:
            del sys.modules[name]
        sys.modules.update(self.modules[label])
        for space, _, key, value in self.patches[label]:
            self._put(space, key, value)
        sys.path.insert(0, str(self.trees[label]))
        importlib.invalidate_caches()
        self.active = label
        if "engine.timed_choices" not in sys.modules and (self.trees[label] / "engine" / "timed_choices.py").is_file():
            # Imported now, not at the side's first call: a choice made before its engine is
            # pointed at the shared table would be its own (a first workload's traced call of one
            # side down another path than its copies', for the whole run).
            with contextlib.suppress(Exception):  # a side whose engine fails to import fails at its calls
                importlib.import_module("engine.timed_choices")
        self.share_choices()

    def share_choices(self) -> None:
        """Point the active side's engine at the sides' one table of timed choices, with what it
        chose before it was pointed there (an engine without engine.timed_choices, an older
        commit, keeps its own choices)."""
        module = sys.modules.get("engine.timed_choices")
        if module is not None and module.TABLE is not self.choices:
            for key, value in module.TABLE.items():
                self.choices.setdefault(key, value)
            module.TABLE = self.choices

    def close(self) -> None:
        """Put the active side aside and leave sys.modules, sys.path and torch as they were."""
        if self.active is not None:
            self.activate_none()
        sys.modules.update(self.outside)

    def activate_none(self) -> None:
        """The active side's modules and torch patches put aside: no side is active."""
        assert self.active is not None
        self.modules[self.active] = {k: m for k, m in sys.modules.items() if self._owned(k)}
        self.patches[self.active] = self._replaced()
        for space, before, key, _ in self.patches[self.active]:
            self._put(space, key, before.get(key, _MISSING))
        with contextlib.suppress(ValueError):
            sys.path.remove(str(self.trees[self.active]))
        for name in [k for k in sys.modules if self._owned(k)]:
            del sys.modules[name]
        self.active = None

    def __iter__(self) -> Iterator[str]:
        return iter(self.trees)


def parse_trees(values: list[str]) -> dict[str, Path]:
    """`--tree LABEL=PATH` arguments, in order."""
    out: dict[str, Path] = {}
    for value in values:
        label, sep, path = value.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"--tree {value!r}: expected LABEL=PATH (e.g. base=/tmp/gate/base)")
        out[label] = Path(path)
    return out


def registry_names() -> list[str]:
    from workloads.base import all_workloads

    return [w.name for w in all_workloads()]


def prepared(name: str, methods: tuple[str, ...], errors: dict[str, str]) -> tuple[str, dict[str, Callable[[], Any]]]:
    """(size, method -> call) of workload `name`, each call made once (its first call, and the
    automatic trace's warm-up calls); a method that fails goes to `errors`, not to the calls."""
    import functools

    from workloads.base import get

    probes = gate_suite("probes")
    workload = get(name)
    size = gate_measuring("sizes").default_size(workload)
    try:
        state = workload.setup(workload.params(size), "cpu")
    except Exception as exc:  # noqa: BLE001 - reported as this case's failure
        errors[f"{name} {size}"] = f"setup: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        return size, {}
    calls: dict[str, Callable[[], Any]] = {}
    for method in gate_methods(workload, methods):
        try:
            probes.first_call(workload, method, state)
        except Exception as exc:  # noqa: BLE001
            errors[f"{name} {size} {method}"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            continue
        calls[method] = functools.partial(workload.run, method, state)
    return size, calls


REFERENCES = ("torch_func", "loop")
"""The methods every ratio signal divides by: torch.func's and the for-loop's calls. They run the
workload's code and torch, and of the engine only what it patched into torch for the process (its
wrapper of `Tensor.requires_grad_`, run by torch.func's calls)."""


def same_files(trees: Collection[Path], package: str) -> bool:
    """Whether `package` holds the same files with the same bytes in every tree."""
    def listing(tree: Path) -> dict[str, bytes]:
        root = tree / package
        return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*"))
                if f.is_file() and "__pycache__" not in f.parts}

    listings = [listing(Path(t)) for t in trees]
    return all(other == listings[0] for other in listings[1:])


def files_run(fn: Callable[[], Any], tree: Path) -> set[str]:
    """The files under `tree` (paths relative to it) whose Python code one call of `fn` runs (the
    code objects cProfile saw called: its C hooks cost a fraction of a Python profile function's
    on a loop of many small calls)."""
    import cProfile

    prefix = str(tree.resolve()) + "/"
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        fn()
    finally:
        profiler.disable()
    files = {entry.code.co_filename for entry in profiler.getstats() if not isinstance(entry.code, str)}
    return {f[len(prefix):] for f in files if f.startswith(prefix)}


def shared_references(sides: Sides, calls: Mapping[str, Mapping[str, Callable[[], Any]]],
                      same_workloads: bool) -> tuple[str, ...]:
    """The references (REFERENCES) that run the same code on every side of this workload, timed on
    the first side only (`paired_samples`' `shared`): every side's workloads/ is the same files,
    and one call of the reference on each side runs code from the same files of its tree, each
    with the same bytes on every side (`files_run`: torch.func's calls run the engine's wrapper of
    `Tensor.requires_grad_`, so a commit changing engine/_guards.py gets torch.func timed on every
    side). Their time differs between sides by noise alone, so they are timed apart from the
    rounds and a ratio signal divides every side's rounds by the same figure: its change head/base
    is the method's own, and the rounds they would have taken (their calls are the slow ones at
    the quick sizes) go to the engine's methods. A reference whose call raises while its files
    are read is timed on every side, in the rounds."""
    labels = list(calls)
    if len(labels) < 2 or not same_workloads or set(labels) != set(sides.trees):
        return ()
    shared = []
    for method in REFERENCES:
        if not all(method in c for c in calls.values()):
            continue
        runs = []
        try:
            for label in labels:
                sides.activate(label)
                runs.append(files_run(calls[label][method], sides.trees[label]))
        except Exception:  # noqa: BLE001 - not proven the same on every side: timed on every side
            continue
        if any(r != runs[0] for r in runs[1:]):
            continue
        if all((sides.trees[label] / f).read_bytes() == (sides.trees[labels[0]] / f).read_bytes()
               for f in runs[0] for label in labels[1:]):
            shared.append(method)
    return tuple(shared)


def _empty_side(sides: int) -> dict[str, Any]:
    return {"times": {}, "overhead": {}, "errors": {}, "cpu_seconds": {}, "memory": {}, "cycle": cycle_length(sides)}


def measure_memory(sides: Sides, calls: Mapping[str, Mapping[str, Callable[[], Any]]],
                   errors: Mapping[str, dict[str, str]], case: str,
                   shared: Collection[str] = ()) -> dict[str, dict[str, list[int]]]:
    """side -> method -> the allocator peak of MEMORY_REPEATS steady calls (bytes; the gate
    checkout's measuring.memory.alloc_peak_bytes), every side of `calls` and method but those in
    `shared` (references that run the same files on every side: `shared_references`): the same
    code allocates the same bytes, so their peaks could not differ between sides, and a gate
    signal is a change between sides. A method in REWARM_METHODS gets its untimed calls after its
    side is activated first."""
    memory = gate_measuring("memory")
    out: dict[str, dict[str, list[int]]] = {}
    for label, methods in calls.items():
        sides.activate(label)
        for method, fn in methods.items():
            if method in shared:
                continue
            try:
                for _ in range(REWARM_CALLS if method in REWARM_METHODS else 0):
                    fn()
                out.setdefault(label, {})[method] = [memory.alloc_peak_bytes(fn) for _ in range(MEMORY_REPEATS)]
            except Exception as exc:  # noqa: BLE001 - reported as this case's failure
                errors[label][f"{case} {method} memory"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return out


def claimer(folder: Path) -> Callable[[str], bool]:
    """`claim(name)`: True for the one process (of those given `folder`) that asks first for a
    workload, False for the others (a file created in `folder` only if it does not exist)."""
    folder.mkdir(parents=True, exist_ok=True)

    def claim(name: str) -> bool:
        try:
            os.close(os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    return claim


def measure_workloads(sides: Sides, budget_s: float, clock: Callable[[], float],
                      only: list[str] | None = None, memory: Collection[str] = (),
                      claim: Callable[[str], bool] | None = None, from_end: bool = False) -> dict[str, dict[str, Any]]:
    """Every workload of every side's registry (or `only`), its sides timed together (see
    `paired_samples`); a workload one side lacks is timed on the others. With `claim`, only the
    workloads it grants (the others are another process's: see `claimer`), taken from the last
    back where `from_end`. Per side:
    {"times": {workload: {size: {method: [s per call per round]}}}, "errors", "cpu_seconds"}, and
    for the sides in `memory` "memory": {workload: {size: {method: [bytes per call]}}}
    (`measure_memory`)."""
    out = {label: _empty_side(len(sides.trees)) for label in sides}
    registry: dict[str, set[str]] = {}
    names: list[str] = []
    for label in sides:
        sides.activate(label)
        try:
            listed = registry_names()
        except Exception:  # noqa: BLE001 - this side cannot be measured; the others still are
            registry[label] = set()
            out[label]["fatal"] = f"side {label}: the registry does not import:\n{traceback.format_exc()}"
            continue
        registry[label] = set(listed)
        for name in (only if only is not None else listed):
            if name not in names:
                names.append(name)
    same_workloads = same_files(sides.trees.values(), "workloads")
    for name in (names[::-1] if from_end else names):
        if claim is not None and not claim(name):
            continue
        started = time.process_time()
        sizes: dict[str, str] = {}
        calls: dict[str, dict[str, Callable[[], Any]]] = {}
        for label in sides:
            if name not in registry[label]:
                continue
            sides.activate(label)
            size, got = prepared(name, GATE_METHODS, out[label]["errors"])
            if got:
                sizes[label], calls[label] = size, got
        if calls:
            shared = shared_references(sides, calls, same_workloads)
            # Every side keeps its place in the rounds' orders, one lacking this workload too.
            timed = paired_samples({label: calls.get(label, {}) for label in sides}, "torch_func", budget_s,
                                   clock, activate=sides.activate,
                                   rewarm=REWARM_METHODS if len(calls) > 1 else (), shared=shared)
            for label, samples in timed.items():
                if label not in calls:
                    continue
                out[label]["times"].setdefault(name, {})[sizes[label]] = samples
                if shared:  # timed apart from the rounds (a ratio divides by their median)
                    out[label].setdefault("apart", {})[name] = list(shared)
                if shared and label != next(iter(calls)):
                    out[label].setdefault("shared", {})[name] = list(shared)
            measured = {label: got for label, got in calls.items() if label in memory}
            if measured:
                errors = {label: out[label]["errors"] for label in measured}
                for label, peaks in measure_memory(sides, measured, errors, f"{name} {sizes[label]}",
                                                   shared).items():
                    out[label]["memory"].setdefault(name, {})[sizes[label]] = peaks
        for label in calls:
            out[label]["cpu_seconds"][name] = time.process_time() - started
    return out


def chain_calls(methods: tuple[str, ...], errors: dict[str, str]) -> dict[str, Callable[[], Any]]:
    overhead = gate_suite("bench_overhead")
    x = overhead.make_input(OVERHEAD_SIZE)
    calls = {}
    for method in methods:
        try:
            call = overhead.chain_call(method, x)
            call()
            calls[method] = call
        except Exception as exc:  # noqa: BLE001
            errors[f"per-op overhead {method}"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return calls


def measure_overhead(budget_s: float, clock: Callable[[], float],
                     sides: Sides | None = None) -> dict[str, tuple[dict[str, list[float]], dict[str, str]]]:
    """The per-op overhead chain of every side, timed together: side -> (method -> seconds per
    chain call per round, errors). Without `sides`, the modules already importable ("" side)."""
    labels = list(sides) if sides is not None else [""]
    activate = sides.activate if sides is not None else (lambda side: None)
    calls, errors = {}, {}
    for label in labels:
        activate(label)
        errors[label] = {}
        try:
            got = chain_calls(tuple(gate_suite("bench_overhead").METHODS), errors[label])
        except Exception as exc:  # noqa: BLE001 - e.g. this side's engine does not import
            errors[label]["per-op overhead"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            continue
        if "native" in got:
            calls[label] = got
    timed = paired_samples({label: calls.get(label, {}) for label in labels}, "native", budget_s, clock,
                           activate=activate, rewarm=REWARM_METHODS if len(calls) > 1 else ()) if calls else {}
    return {label: (timed.get(label, {}), errors[label]) for label in labels}


def count_regions(library: str, names: list[str], sides: Sides) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Count each engine method's steady-state call (measuring.counted.COUNT_REPEATS times) of the
    per-op chain and of the workloads `names`, of every side, under callgrind. Region labels:
    'SIDE|chain|method|rep', 'SIDE|wl|name|size|method|rep'. Every case of every side is set up and
    called first (uninstrumented), then instrumentation is turned on once; a case's sides are
    counted one after the other."""
    counts, counted = gate_measuring("counts"), gate_measuring("counted")
    requests = counts.Requests(library)
    if not requests.on_valgrind:
        raise RuntimeError("--count: this process is not running under valgrind (see measuring.counts.command)")
    errors: dict[str, dict[str, str]] = {label: {} for label in sides}
    cases: dict[str, list[tuple[str, Callable[[], Any]]]] = {}
    for label in sides:
        sides.activate(label)
        try:
            registered = set(registry_names())
        except Exception:  # noqa: BLE001 - reported as this side's failure; the others are counted
            errors[label]["registry"] = traceback.format_exc().strip().splitlines()[-1][:300]
            continue
        for method, call in chain_calls(CHAIN_COUNT_METHODS, errors[label]).items():
            cases.setdefault(f"chain|{method}", []).append((label, call))
        for name in names:
            if name not in registered:
                continue
            size, calls = prepared(name, counted.COUNT_METHODS, errors[label])
            for method, call in calls.items():
                cases.setdefault(f"wl|{name}|{size}|{method}", []).append((label, call))
    labels: dict[str, list[str]] = {label: [] for label in sides}
    # Everything set up so far moves to the collector's permanent generation: the collection each
    # region makes first (counts.Requests.region) then walks only what the counted calls made, not
    # torch's whole heap, which under callgrind's instrumentation was most of the process's time.
    gc.collect()
    gc.freeze()
    for case, per_side in cases.items():
        method = case.rsplit("|", 1)[-1]
        for label, call in per_side:
            sides.activate(label)
            # A method in REWARM_METHODS is called COUNT_REWARM_CALLS times after the switch of
            # side; the others are counted at once (a count does not depend on what valgrind has
            # translated, and their first call after a switch counts as their second does).
            for _ in range(COUNT_REWARM_CALLS if method in REWARM_METHODS else 0):
                call()
            for rep in range(counted.COUNT_REPEATS):
                with requests.region(f"{label}|{case}|{rep}"):
                    call()
                labels[label].append(f"{case}|{rep}")
    requests.instrument(False)
    return {label: (labels[label], errors[label]) for label in sides}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                   help="a measured commit's extracted tree (engine/, workloads/), repeatable: every side is "
                        "loaded in this process and timed round by round with the others; the first is the "
                        "one the others are compared with")
    p.add_argument("--workloads", default="all", help="comma list of workloads, 'all' (the registry) or '' (none)")
    p.add_argument("--overhead", action="store_true", help="also measure the per-op overhead chain")
    p.add_argument("--memory", nargs="?", const="all", default="", metavar="SIDES",
                   help="also take every method's allocator peak per call (bytes: exact, see measure_memory), "
                        "on every side or on the sides of this comma list")
    p.add_argument("--budget", type=float, default=0.5, help="CPU seconds of one workload's timed rounds per side at most")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                   help="cpu: CPU seconds of this process (default; other processes' load does not count); wall")
    p.add_argument("--count", default=None, metavar="LIB",
                   help="count instructions under callgrind with this client-request library (measuring.counts)")
    p.add_argument("--claims", default=None, metavar="DIR",
                   help="time only the workloads no other process given this folder has claimed first")
    p.add_argument("--from-end", action="store_true", help="with --claims: take the workloads from the last back")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not args.tree:
        p.error("at least one --tree LABEL=PATH is needed")
    sides = Sides(parse_trees(args.tree))

    gate_suite("probes").pin_threads()
    try:
        only = None if args.workloads == "all" else [n for n in args.workloads.split(",") if n]
        if args.count:
            counted = count_regions(args.count, only or [], sides)
            Path(args.out).write_text(json.dumps({
                "sides": {label: {"regions": regions, "errors": errors} for label, (regions, errors) in counted.items()},
                "process_cpu_s": time.process_time()}))
            return 0
        clock = CLOCKS[args.clock]
        # Frozen for the whole process, as the count process is: measuring.timer.rounds then keeps
        # the freeze it adds (it thaws only one it made), so each batch's collection walks what the
        # timed calls made, not torch's and three commits' heaps, every workload over again.
        gc.collect()
        gc.freeze()
        memory = list(sides) if args.memory == "all" else [m for m in args.memory.split(",") if m]
        unknown = sorted(set(memory) - set(sides))
        if unknown:
            p.error(f"--memory {args.memory}: no side named {', '.join(unknown)} (the sides: {', '.join(sides)})")
        claim = claimer(Path(args.claims)) if args.claims else None
        out = measure_workloads(sides, args.budget, clock, only, memory=memory, claim=claim, from_end=args.from_end)
        if args.overhead:
            ops = gate_suite("bench_overhead").N_OPS
            for label, (times, errors) in measure_overhead(args.budget, clock, sides).items():
                out[label]["overhead"] = times
                out[label]["overhead_ops"] = ops  # ops per chain call (the gate then needs no torch)
                out[label]["errors"].update(errors)
    except Exception:  # noqa: BLE001 - the whole process failed: say why, exit 3
        Path(args.out).write_text(json.dumps({"fatal": traceback.format_exc()}))
        return 3
    Path(args.out).write_text(json.dumps({"sides": out, "clock": args.clock, "process_cpu_s": time.process_time()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
