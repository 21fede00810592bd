"""Time to N calls from a fresh process (vmapbench.time_to_n), as asv track metrics at a few N.

TimeToN's grid is every registry workload x every curve id x device; a workload that lacks a
curve's method, or a case outside the profile, is skipped. `setup_cache` runs once per class: it
measures every selected (workload, curve) in its own fresh process, one process per curve as
`vmapbench time-to-n` does, at the workload's first quick size (else its smallest), one thread.

- track_seconds_to_1 / _30 / _300 / _3000: seconds from the first call's start to the N-th call's
  return (imports and setup apart; they are in the results files `vmapbench time-to-n --write` keeps).

The quick profile keeps this cheap: the first workload with a quick size of the Bayesian and of the
Hessian family (where the default path is furthest behind jax.jit), the jax.jit, torch.func and cold default-path curves, N up to 300 and 5 s of calls per curve. The
full profile measures every workload and curve to N = 3000 with 20 s of calls per curve.
"""
from __future__ import annotations

from typing import Any

from workloads.base import all_workloads

from . import probes, selection

# curve id -> (method group, cache). A group is the methods standing for it, first one present wins.
CURVES: dict[str, tuple[tuple[str, ...], str]] = {
    "jax": (("jax",), "cold"),
    "torch_func": (("torch_func",), "cold"),
    "ours_cold": (("engine", "engine_compiled"), "cold"),
    "ours_warm": (("engine", "engine_compiled"), "warm"),
    "torch_compile_cold": (("torch_func_compiled", "loop_compiled"), "cold"),
    "torch_compile_warm": (("torch_func_compiled", "loop_compiled"), "warm"),
}
QUICK_FAMILIES = ("bayes_models", "hessians")
QUICK_CURVES = ("jax", "torch_func", "ours_cold")
PROFILE_NS: dict[str, tuple[int, ...]] = {"quick": (1, 30, 300), "full": (1, 2, 5, 30, 300, 3000)}
PROFILE_MAX_SECONDS: dict[str, float] = {"quick": 5.0, "full": 20.0}


def method_of(workload: Any, curve: str) -> str | None:
    group, _ = CURVES[curve]
    return next((m for m in group if m in workload.methods), None)


def selected(profile: str, devices: tuple[str, ...]) -> list[tuple[Any, str, str]]:
    """(workload, curve, device) the profile measures."""
    out = []
    chosen = all_workloads()
    if profile == "quick":
        chosen = [next((w for w in all_workloads(f) if w.quick), None) for f in QUICK_FAMILIES]
    for w in chosen:
        if w is None:
            continue
        for device in devices:
            if device not in w.devices:
                continue
            for curve in CURVES:
                if (profile != "quick" or curve in QUICK_CURVES) and method_of(w, curve) is not None:
                    out.append((w, curve, device))
    return out


def measure_all(profile: str, devices: tuple[str, ...]) -> dict[tuple[str, str, str], dict[int, float]]:
    """(workload, curve, device) -> {N: seconds} for every selected case (N it did not reach: absent)."""
    from vmapbench import time_to_n
    from vmapbench.peer_ratios import default_size

    cases = selected(profile, devices)
    out: dict[tuple[str, str, str], dict[int, float]] = {}
    for w in {c[0].name: c[0] for c in cases}.values():
        for device in devices:
            curves = [c for ww, c, d in cases if ww is w and d == device]
            if not curves:
                continue
            # Warm curves run after their cold curve, on its cache folder: order by the CURVES table.
            pairs = [(method_of(w, c), CURVES[c][1]) for c in CURVES if c in curves]
            measured = time_to_n.measure(w.name, default_size(w), pairs, ns=PROFILE_NS[profile],
                                         max_seconds=PROFILE_MAX_SECONDS[profile], threads=1, device=device,
                                         check=False)
            for curve, got in zip([c for c in CURVES if c in curves], measured):
                out[(w.name, curve, device)] = dict(zip(got.ns, got.seconds))
    return out


class TimeToN:
    params = [[w.name for w in all_workloads()], list(CURVES), list(selection.ALL_DEVICES)]
    param_names = ["workload", "curve", "device"]
    version = selection.SUITE_VERSION
    timeout = 3600.0  # setup_cache measures every curve of the profile: minutes in the full profile
    number = 1
    repeat = 1
    rounds = 1

    def setup_cache(self) -> dict[tuple[str, str, str], dict[int, float]]:
        import torch

        probes.pin_threads()
        profile = selection.active_profile()
        devices = tuple(d for d in selection.active_devices(profile) if d != "cuda" or torch.cuda.is_available())
        try:
            return measure_all(profile, devices)
        except ImportError:  # a commit from before vmapbench.time_to_n: every case is skipped
            return {}

    def setup(self, cache: dict, workload: str, curve: str, device: str) -> None:
        if (workload, curve, device) not in cache:
            raise NotImplementedError(f"{workload} {curve} on {device}: not measured in the "
                                      f"{selection.active_profile()} profile, or the workload has no such method")

    def _at(self, cache: dict, workload: str, curve: str, device: str, n: int) -> float:
        seconds = cache[(workload, curve, device)].get(n)
        if seconds is None:
            raise probes.SkipNotImplemented(f"{workload} {curve}: N={n} not reached (the profile's N or "
                                            "its budget of calls)")
        return seconds

    def track_seconds_to_1(self, cache: dict, workload: str, curve: str, device: str) -> float:
        return self._at(cache, workload, curve, device, 1)

    def track_seconds_to_30(self, cache: dict, workload: str, curve: str, device: str) -> float:
        return self._at(cache, workload, curve, device, 30)

    def track_seconds_to_300(self, cache: dict, workload: str, curve: str, device: str) -> float:
        return self._at(cache, workload, curve, device, 300)

    def track_seconds_to_3000(self, cache: dict, workload: str, curve: str, device: str) -> float:
        return self._at(cache, workload, curve, device, 3000)

    for _metric in (track_seconds_to_1, track_seconds_to_30, track_seconds_to_300, track_seconds_to_3000):
        _metric.unit = "seconds"  # type: ignore[attr-defined]
    del _metric
