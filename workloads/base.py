"""The workload interface and registry: the one source of truth for what vmapbench measures.

A workload declares its sizes, its methods and its correctness check. The ASV suite, the CLI, the
tests and the dashboard all read the registry below; nothing else lists workloads. The list of
workload modules is the package's `__init__`, which Python runs before any `workloads.*` module is
imported: the registry is complete before anyone reads it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from measuring.timer import first_call_seconds

# Every method name a workload may implement, in the order tables show them.
METHODS: tuple[str, ...] = (
    "loop",                  # Python for-loop over rows/examples with torch.autograd.grad (baseline)
    "engine",                # our engine as a user gets it (automatic tracing: repeated calls replayed where proven)
    "engine_eager",          # our engine with automatic tracing off (engine.auto_tracing(False)): eager every call
    "engine_traced",         # our engine, traced once and replayed (engine.trace)
    "engine_compiled",       # our engine's traced graph compiled by inductor (engine.compile)
    "torch_func",            # torch.func (the reference engine)
    "torch_func_compiled",   # torch.compile(torch.func ...)
    "loop_compiled",         # torch.compile of the loop
    "functional_vectorize",  # torch.autograd.functional.jacobian/hessian(vectorize=True)
    "closed_form",           # hand-vectorized formula: the speed limit
    "opacus_hooks",          # Opacus GradSampleModule, hooks mode (per-layer formulas)
    "opacus_ew",             # Opacus with torch's ExpandedWeights
    "opacus_functorch",      # Opacus GradSampleModule, functorch mode (vmap(grad) per layer)
    "backpack",              # BackPACK BatchGrad extension
    "jax",                   # JAX: jax.jit of vmap/grad/hessian/jacrev on a jax.numpy twin of the model
    "engine_chunked",        # our engine, vmap with chunk_size (bounded memory; the memory-limit experiment)
)
# Methods run by another framework (workloads/peers/): skipped with a reason when it is not installed.
# ("jax" is a peer too, added to a workload by workloads.peers.jax_methods.with_jax.)
PEER_METHODS = frozenset(("opacus_hooks", "opacus_ew", "opacus_functorch", "backpack"))
# Calls after the first before an automatically traced function replays (engine.autotrace): a
# watched eager run, the recording, and for a function that branches on tensor values (a
# distribution's argument checks) the recording made again, watched.
AUTO_TRACE_WARMUP = 3
# The methods whose calls go through automatic tracing (engine.vmap/grad as users get them, with or
# without chunk_size): `Workload.prepare` makes their warm-up calls, so measured calls are steady.
AUTO_TRACED_METHODS = frozenset(("engine", "engine_chunked"))
ENGINE_METHODS = frozenset(m for m in METHODS if m.startswith("engine"))
COMPILED_METHODS = frozenset(m for m in METHODS if m.endswith("_compiled"))
BASELINE = "loop"
REFERENCE = "torch_func"


def size_label(params: Mapping[str, Any]) -> str:
    """Stable, human-readable label of one point of a grid, e.g. 'n=1000,d=64' (ASV parameter)."""
    return ",".join(f"{k}={v}" for k, v in params.items())


def parse_size_label(label: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in label.split(","):
        key, _, value = part.partition("=")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return out


@dataclass
class Workload:
    """One measured task.

    `grid` maps parameter names to value lists (their product is the full grid); `quick` is the
    subset of size labels the quick profile (`make bench`) runs; `heavy` names memory-heavy sizes
    the quick profile must skip; `not_in_quick` names methods the quick profile leaves out at its
    quick sizes (`quick_methods` are the rest), e.g. a peer whose start-up and compile would cost
    the quick profile seconds per benchmark process for a figure the full profile has.
    `setup(params, device)` builds seeded float32 data and returns a state object
    (NotImplementedError when the device is unavailable: ASV reports a skip); `run(method, state)`
    is the measured call; `check(state, methods=None)` raises AssertionError when any method (or
    each of `methods`) disagrees with a float64 loop reference. Workload modules build all of this
    with `workloads.define.define()`.
    """

    name: str
    family: str
    description: str
    grid: dict[str, list[Any]]
    methods: tuple[str, ...]
    setup: Callable[[dict[str, Any], str], Any]
    run: Callable[[str, Any], Any]
    check: Callable[[Any], None]
    devices: tuple[str, ...] = ("cpu", "cuda")
    quick: tuple[str, ...] = ()
    heavy: tuple[str, ...] = ()
    not_in_quick: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.methods) - set(METHODS)
        if unknown:
            raise ValueError(f"workload {self.name!r}: unknown methods {sorted(unknown)}; valid: {METHODS}")
        bad = set(self.quick) - set(self.sizes)
        if bad:
            raise ValueError(f"workload {self.name!r}: quick sizes {sorted(bad)} are not in its grid {self.sizes}")
        stray = set(self.not_in_quick) - set(self.methods)
        if stray:
            raise ValueError(f"workload {self.name!r}: not_in_quick names {sorted(stray)}, which are not among its "
                             f"methods {self.methods}")

    @property
    def quick_methods(self) -> tuple[str, ...]:
        """The methods the quick profile runs at the quick sizes: all but `not_in_quick`."""
        return tuple(m for m in self.methods if m not in self.not_in_quick)

    def supports(self, method: str) -> bool:
        """Whether `method` can run: one of `methods`, or `engine_eager` wherever `engine` is (the
        same function with automatic tracing off; listed by no workload, so that the profiles
        keep their size, but runnable by every tool that names it)."""
        return method in self.methods or (method == "engine_eager" and "engine" in self.methods)

    @property
    def sizes(self) -> list[str]:
        keys = list(self.grid)
        return [size_label(dict(zip(keys, values))) for values in itertools.product(*self.grid.values())]

    def params(self, size: str) -> dict[str, Any]:
        if size not in self.sizes:
            raise KeyError(f"workload {self.name!r} has no size {size!r}; valid sizes: {', '.join(self.sizes)}")
        return parse_size_label(size)

    def prepare(self, method: str, state: Any) -> float:
        """First call of a method (trace or compile happens here); returns its wall time in seconds.

        The `engine` and `engine_chunked` methods are automatically traced: the first call is eager,
        the second eager and watched, the third records the graph, and a recording that branched on
        tensor values is made again, watched, at the fourth (engine.autotrace). Those further calls
        are made here too, so that measured calls are the steady state (replays, or eager where not
        proven).
        """
        seconds = first_call_seconds(lambda: self.run(method, state))
        if method in AUTO_TRACED_METHODS:
            for _ in range(AUTO_TRACE_WARMUP):
                self.run(method, state)
        return seconds


_REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    if workload.name in _REGISTRY:
        raise ValueError(f"workload {workload.name!r} is registered twice")
    _REGISTRY[workload.name] = workload
    return workload


def all_workloads(family: str | None = None) -> list[Workload]:
    return [w for w in _REGISTRY.values() if family is None or w.family == family]


def get(name: str) -> Workload:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; valid workloads: {', '.join(sorted(_REGISTRY))}") from None


def families() -> list[str]:
    return sorted({w.family for w in all_workloads()})


def iter_cases(quick: bool = False, devices: Iterable[str] = ("cpu",)) -> Iterable[tuple[Workload, str, str, str]]:
    """(workload, method, size, device) for every case of the suite (or of the quick profile)."""
    for w in all_workloads():
        sizes = w.quick if quick else w.sizes
        for size in sizes:
            for device in devices:
                if device in w.devices:
                    for method in w.quick_methods if quick else w.methods:
                        yield w, method, size, device
