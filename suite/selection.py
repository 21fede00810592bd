"""Which benchmark cases a profile runs, how they are named, and how asv `--bench` selects them.

The ASV classes of this suite are generated from the workload registry, and their parameter grids
are always the full grids (every size, every method of the workload, cpu and cuda). Benchmark
names, parameters and versions are therefore the same on every machine and in every profile, and
results of a quick CPU run and a full GPU run live side by side in results/. A profile only picks
which (size, device) points are measured:

- ``quick`` (what ``make bench`` and ``make continuous`` run): the registry's quick sizes, on cpu,
  with each workload's `quick_methods` (its methods less those it marks `not_in_quick`), and every
  metric but `PROFILE_EXCLUDED_METRICS` (asv's whole-process peakmem_run) and the points of
  `PROFILE_EXCLUDED_POINTS` (the explicit compiles' cold compile);
- ``full`` (nightly and GPU machines): every size, including the heavy ones, on cpu and cuda.

The profile comes from ``VMAPBENCH_PROFILE`` (default ``full``, like a plain ``asv run``) and the
devices from ``VMAPBENCH_DEVICES`` (a comma list; default ``cpu`` for quick, ``cpu,cuda`` for full).
`bench_regexes` turns the same choice into ``asv --bench`` regular expressions, so asv does not even
start a process for a case outside the profile; setup also raises NotImplementedError for such a
case (asv: skipped, not failed), which keeps a plain ``VMAPBENCH_PROFILE=quick asv run`` right.

Not every metric applies to every method: `METRICS` says which do. The generated classes turn the
rest into asv ``skip_params`` and `bench_regexes` leaves them out.
"""
from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from workloads.base import BASELINE, COMPILED_METHODS, ENGINE_METHODS, REFERENCE, Workload, all_workloads
from .names import class_name_of

# asv versions a benchmark by a hash of its source unless told otherwise, and results of different
# versions are not compared. The measurement code here is shared and edited often, so the suite
# declares its version instead: bump it when what a metric measures changes, not for refactors.
SUITE_VERSION = "1"

PROFILE_ENV = "VMAPBENCH_PROFILE"
DEVICES_ENV = "VMAPBENCH_DEVICES"
PROFILES: tuple[str, ...] = ("quick", "full")
DEFAULT_PROFILE = "full"
ALL_DEVICES: tuple[str, ...] = ("cpu", "cuda")
PROFILE_DEVICES: dict[str, tuple[str, ...]] = {"quick": ("cpu",), "full": ALL_DEVICES}

# Suite modules generated from the registry; everything else in suite/ (the engine overhead
# microbenchmark, the runtime record, other helpers' modules) belongs to the pseudo-family below.
WORKLOAD_MODULES: tuple[str, ...] = ("bench_workloads", "bench_first_call")
SUITE_FAMILY = "suite"
# Suite modules whose points belong to the registry's families but are not generated classes: each
# has `profile_regexes(profile, families, devices, exclude_metrics)` selecting its own points.
FAMILY_MODULES: tuple[str, ...] = ("bench_time_to_n",)
# Suite modules a profile leaves out unless asked (bench_regexes' opt_in): the instruction counts
# under valgrind (bench_counts), which `asv continuous` compares and `make bench` does not need.
OPT_IN_MODULES: tuple[str, ...] = ("bench_counts",)

# Methods whose first call traces or compiles (Workload.prepare): their first-call time is a metric.
FIRST_CALL_METHODS = frozenset(COMPILED_METHODS | {"engine_traced"})
# jax.jit compiles on the first call too. Its compile time is a metric in the compiled family,
# beside torch.compile's and engine.compile's; elsewhere `vmapbench run` shows it as the first call
# (a metric there would cost each jax case another process for it). A literal, not
# workloads.compiled.FAMILY: the suite must import against older commits' workloads.
JAX_FIRST_CALL_FAMILY = "compiled"


def _always(workload: Workload, method: str, device: str) -> bool:
    return True


def _cuda_only(workload: Workload, method: str, device: str) -> bool:
    return device == "cuda"


def _cpu_torch(workload: Workload, method: str, device: str) -> bool:
    """A torch method on cpu: what torch's CPU allocator counts (jax allocates past it)."""
    return device == "cpu" and method != "jax"


def _jax_only(workload: Workload, method: str, device: str) -> bool:
    return method == "jax"


def _engine_only(workload: Workload, method: str, device: str) -> bool:
    return method in ENGINE_METHODS


def _reference_only(workload: Workload, method: str, device: str) -> bool:
    return method == REFERENCE


def _first_call_only(workload: Workload, method: str, device: str) -> bool:
    return method in FIRST_CALL_METHODS or (method == "jax" and workload.family == JAX_FIRST_CALL_FAMILY)


def _against_loop(workload: Workload, method: str, device: str) -> bool:
    return method != BASELINE and BASELINE in workload.methods


def _against_reference(workload: Workload, method: str, device: str) -> bool:
    return method != REFERENCE and REFERENCE in workload.methods


@dataclass(frozen=True)
class Metric:
    """One benchmark function of the generated classes: its module, its name, where it applies."""

    module: str
    name: str
    applies: Callable[[Workload, str, str], bool]


METRICS: tuple[Metric, ...] = (
    Metric("bench_workloads", "time_run", _always),
    Metric("bench_workloads", "peakmem_run", _always),
    Metric("bench_workloads", "track_alloc_peak_bytes", _cpu_torch),
    Metric("bench_workloads", "track_xla_memory_bytes", _jax_only),
    Metric("bench_workloads", "track_rss_delta_bytes", _always),
    Metric("bench_workloads", "track_cuda_peak_bytes", _cuda_only),
    Metric("bench_workloads", "track_nvml_peak_bytes", _cuda_only),
    Metric("bench_workloads", "track_speedup_vs_loop", _against_loop),
    Metric("bench_workloads", "track_ratio_vs_torch_func", _against_reference),
    Metric("bench_first_call", "track_compile_seconds", _first_call_only),
    Metric("bench_first_call", "track_fallbacks", _engine_only),
    Metric("bench_first_call", "track_torch_fallbacks", _reference_only),
)

# Metrics a profile leaves out. The quick profile keeps the per-call memory (track_alloc_peak_bytes,
# the dashboard's CPU memory metric, and the process-level RSS growth) and leaves out asv's whole-process
# peakmem_run, which counts the torch import in every case (the dashboard falls back to it only
# where no per-call figure exists) and costs a benchmark process per point; `full` runs both.
PROFILE_EXCLUDED_METRICS: dict[str, frozenset[str]] = {"quick": frozenset({"peakmem_run"}), "full": frozenset()}


def profile_metrics(profile: str) -> tuple[Metric, ...]:
    """The METRICS `profile` measures."""
    return tuple(m for m in METRICS if m.name not in PROFILE_EXCLUDED_METRICS[profile])


# Points a profile leaves out where their metric applies, as (metric, methods): the quick profile
# does not time the cold inductor compile of an explicit-compile method, which would be the
# largest single case of `make bench`. The full profile (`make bench-full`) and a run naming its
# workloads (`python -m vmapbench.bench --workload W`, bench_regexes' `cold_compiles`) time it.
PROFILE_EXCLUDED_POINTS: dict[str, tuple[tuple[str, frozenset[str]], ...]] = {
    "quick": (("track_compile_seconds", COMPILED_METHODS),), "full": ()}


def excluded_point(profile: str, metric: str, method: str) -> bool:
    """Whether `profile` leaves out `metric` of `method` by PROFILE_EXCLUDED_POINTS."""
    return any(metric == name and method in methods for name, methods in PROFILE_EXCLUDED_POINTS[profile])


# asv ranks every benchmark "lower is better"; these are "higher is better". The gate's policy is
# measuring.stats.HIGHER_IS_BETTER; this copy exists because the suite must import in asv's
# environments of commits that predate measuring.stats (tests/test_stats.py checks they agree).
HIGHER_IS_BETTER: frozenset[str] = frozenset({"track_speedup_vs_loop"})


def metrics_of(module: str) -> tuple[Metric, ...]:
    return tuple(m for m in METRICS if m.module == module)


def class_name(workload: Workload) -> str:
    """The ASV class name of a workload: its name, made a Python identifier (asv names are dotted)."""
    return class_name_of(workload.name)


def class_names(workloads: Iterable[Workload] | None = None) -> dict[str, Workload]:
    """class name -> workload, refusing two workloads that would share a class."""
    out: dict[str, Workload] = {}
    for w in all_workloads() if workloads is None else workloads:
        name = class_name(w)
        if name in out:
            raise ValueError(
                f"workloads {out[name].name!r} and {w.name!r} both map to the ASV class {name!r}; "
                f"rename one of them (names may differ in more than punctuation)"
            )
        out[name] = w
    return out


def active_profile() -> str:
    profile = os.environ.get(PROFILE_ENV, DEFAULT_PROFILE).strip() or DEFAULT_PROFILE
    if profile not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={profile!r} is not a profile; use one of {', '.join(PROFILES)}")
    return profile


def active_devices(profile: str | None = None) -> tuple[str, ...]:
    profile = active_profile() if profile is None else profile
    raw = os.environ.get(DEVICES_ENV, "").strip()
    if not raw:
        return PROFILE_DEVICES[profile]
    devices = tuple(d.strip() for d in raw.split(",") if d.strip())
    unknown = sorted(set(devices) - set(ALL_DEVICES))
    if unknown:
        raise ValueError(f"{DEVICES_ENV}={raw!r} names unknown devices {unknown}; use {', '.join(ALL_DEVICES)}")
    return devices


def profile_sizes(workload: Workload, profile: str) -> list[str]:
    """The sizes of `workload` that `profile` measures (quick: the registry's quick marks)."""
    if profile == "quick":
        return [s for s in workload.sizes if s in workload.quick]
    return list(workload.sizes)


def profile_methods(workload: Workload, profile: str) -> tuple[str, ...]:
    """The methods of `workload` that `profile` measures (quick: all but those marked not_in_quick).
    Workloads of commits from before not_in_quick have no quick_methods: all their methods count."""
    return getattr(workload, "quick_methods", workload.methods) if profile == "quick" else workload.methods


def outside_profile(workload: Workload, size: str, device: str, method: str | None = None) -> str | None:
    """Why (workload, size, device[, method]) is not measured by the active profile, or None if it is."""
    profile = active_profile()
    if size not in profile_sizes(workload, profile):
        return f"size {size} of {workload.name} is not in the {profile} profile ({PROFILE_ENV}={profile})"
    if method is not None and method not in profile_methods(workload, profile):
        return (f"method {method} of {workload.name} is not in the {profile} profile "
                "(the workload marks it not_in_quick)")
    devices = active_devices(profile)
    if device not in devices:
        return f"device {device} is not in this run's devices {','.join(devices)} ({DEVICES_ENV})"
    if device not in workload.devices:
        return f"workload {workload.name} does not run on {device} (its devices: {', '.join(workload.devices)})"
    return None


def skipped_params(workload: Workload, metric: Metric) -> list[tuple[str, str, str]]:
    """(size, method, device) points of the full grid where `metric` does not apply: asv skip_params."""
    return [
        (size, method, device)
        for size in workload.sizes
        for method in workload.methods
        for device in ALL_DEVICES
        if not metric.applies(workload, method, device)
    ]


def families() -> list[str]:
    """Families the CI can shard by: the registry's, plus the suite's own benchmarks."""
    return sorted({w.family for w in all_workloads()}) + [SUITE_FAMILY]


def _alternation(values: Sequence[str]) -> str:
    return "(" + "|".join(re.escape(repr(v)) for v in values) + ")"


def bench_regexes(
    profile: str,
    only_families: Sequence[str] | None = None,
    devices: Sequence[str] | None = None,
    exclude_metrics: Iterable[str] = (),
    opt_in: bool = False,
    cold_compiles: bool = False,
) -> list[str]:
    """asv ``--bench`` regexes selecting exactly the cases of `profile` (optionally only some families).

    asv matches a parameterized benchmark as ``name(param, ...)`` with each parameter's repr, so a
    regex can pick sizes, methods and devices. `devices` defaults to the profile's devices.
    OPT_IN_MODULES are selected only with `opt_in` (whatever the families); the points of
    PROFILE_EXCLUDED_POINTS only with `cold_compiles`.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; use one of {', '.join(PROFILES)}")
    devices = tuple(devices) if devices is not None else PROFILE_DEVICES[profile]
    valid = families()
    wanted = set(valid) if not only_families else set(only_families)
    unknown = sorted(wanted - set(valid))
    if unknown:
        raise ValueError(f"unknown families {unknown}; valid: {', '.join(valid)}")
    excluded = set(exclude_metrics)
    regexes: list[str] = []
    for cls, w in class_names().items():
        if w.family not in wanted:
            continue
        sizes = profile_sizes(w, profile)
        if not sizes:
            continue
        for metric in profile_metrics(profile):
            if metric.name in excluded:
                continue
            for device in devices:
                if device not in w.devices:
                    continue
                methods = [m for m in profile_methods(w, profile) if metric.applies(w, m, device)
                           and (cold_compiles or not excluded_point(profile, metric.name, m))]
                if methods:
                    regexes.append(
                        rf"^{metric.module}\.{cls}\.{metric.name}\({_alternation(sizes)}, "
                        rf"{_alternation(methods)}, {re.escape(repr(device))}\)$"
                    )
    for module in FAMILY_MODULES:
        regexes += importlib.import_module(f".{module}", __package__).profile_regexes(
            profile, sorted(wanted), devices, tuple(excluded))
    if SUITE_FAMILY in wanted:
        # Everything not generated from the registry (the engine overhead microbenchmark, the runtime
        # record, other modules); their setup skips devices outside the profile.
        not_generated = "|".join(re.escape(m) + r"\." for m in (*WORKLOAD_MODULES, *FAMILY_MODULES, *OPT_IN_MODULES))
        regexes.append(rf"^(?!{not_generated})")
    if opt_in:
        regexes += [rf"^{re.escape(m)}\." for m in OPT_IN_MODULES]
    return regexes
