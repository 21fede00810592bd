"""Time to N calls from a fresh process (workloads.time_to_n), as asv track metrics at a few N.

TimeToN's grid is every registry workload x every curve id x device. A point runs its curve in a
fresh process (for a warm curve: its cold curve first, on the same cache folder), as `vmapbench
time-to-n` does, at the workload's first quick size (else its smallest), one thread.

- track_seconds_to_1 / _30 / _300 / _3000: seconds from the first call's start to the N-th call's
  return (imports and setup apart; the results files of `vmapbench time-to-n --write` keep them).

A point's curve is measured once per run where the run keeps passes (VMAPBENCH_PASS_DIR, set by
`make bench`): the first of its metrics measures it, the others read it back. Without that
folder (a plain `asv run`) each metric measures it again.

The quick profile keeps this cheap: the first workload with a quick size of the Bayesian and of the
Hessian family (where the default path is furthest behind jax.jit), the jax.jit, torch.func and
cold default-path curves, N up to 300 and `PROFILE_MAX_SECONDS["quick"]` seconds of calls per
curve. The full profile measures every workload and curve to N = 3000 with
`PROFILE_MAX_SECONDS["full"]`. `profile_regexes` (which
selection.bench_regexes calls) selects exactly those points, by family, so asv starts no process
for the others.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from workloads.base import Workload, all_workloads
from workloads.time_to_n import run_method

from . import probes, selection

# curve id -> (method group, cache). A group is the methods standing for it, first one present wins.
CURVES: dict[str, tuple[tuple[str, ...], str]] = {
    "jax": (("jax",), "cold"),
    "torch_func": (("torch_func",), "cold"),
    "ours_cold": (("engine", "engine_compiled"), "cold"),
    "ours_warm": (("engine", "engine_compiled"), "warm"),
    "torch_compile_cold": (("torch_func_compiled", "loop_compiled"), "cold"),
    "torch_compile_warm": (("torch_func_compiled", "loop_compiled"), "warm"),
    "ours_tier_xla": (("engine+xla",), "cold"),
    "ours_tier_off": (("engine+off",), "cold"),
}
QUICK_FAMILIES = ("bayes_models", "hessians")
QUICK_CURVES = ("jax", "torch_func", "ours_cold")
PROFILE_NS: dict[str, tuple[int, ...]] = {"quick": (1, 30, 300), "full": (1, 2, 5, 30, 300, 3000)}
PROFILE_MAX_SECONDS: dict[str, float] = {"quick": 5.0, "full": 20.0}
METRIC_NS: dict[str, int] = {"track_seconds_to_1": 1, "track_seconds_to_30": 30, "track_seconds_to_300": 300,
                             "track_seconds_to_3000": 3000}


def method_of(workload: Workload, curve: str) -> str | None:
    group, _ = CURVES[curve]
    return next((m for m in group if run_method(m)[0] in workload.methods), None)


def selected(profile: str, devices: Sequence[str]) -> list[tuple[Workload, str, str]]:
    """(workload, curve, device) the profile measures."""
    chosen: list[Workload | None] = list(all_workloads())
    if profile == "quick":
        chosen = [next((w for w in all_workloads(f) if w.quick), None) for f in QUICK_FAMILIES]
    out = []
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


def profile_regexes(profile: str, families: Sequence[str], devices: Sequence[str],
                    exclude_metrics: Sequence[str] = ()) -> list[str]:
    """asv --bench regexes of exactly the points `profile` measures, of the workloads of `families`."""
    metrics = [m for m, n in METRIC_NS.items() if n <= max(PROFILE_NS[profile]) and m not in exclude_metrics]
    by_workload: dict[str, list[tuple[str, str]]] = {}
    for w, curve, device in selected(profile, devices):
        if w.family in families:
            by_workload.setdefault(w.name, []).append((curve, device))
    out = []
    for name, points in by_workload.items():
        for device in dict.fromkeys(d for _, d in points):
            curves = "|".join(re.escape(repr(c)) for c, d in points if d == device)
            out.append(rf"^bench_time_to_n\.TimeToN\.({'|'.join(metrics)})\({re.escape(repr(name))}, "
                       rf"({curves}), {re.escape(repr(device))}\)$")
    return out


def _pass_file(workload: str, curve: str, device: str) -> Path | None:
    folder = os.environ.get("VMAPBENCH_PASS_DIR", "").strip()  # suite.workload_pass.PASS_DIR_ENV
    return Path(folder) / f"time-to-n-{workload}-{curve}-{device}.json" if folder else None


def measure_point(workload: Workload, curve: str, device: str, profile: str) -> dict[str, Any]:
    """{'seconds': {N: s}, 'status', 'note'} of one point's curve, from the run's pass folder when
    an earlier metric of the point measured it, else measured now (and kept there)."""
    path = _pass_file(workload.name, curve, device)
    if path is not None and path.is_file():
        got = json.loads(path.read_text())
        return {**got, "seconds": {int(n): s for n, s in got["seconds"].items()}}
    from workloads import time_to_n
    from measuring.sizes import default_size

    from . import GUARDS_SET

    method, cache = method_of(workload, curve), CURVES[curve][1]
    pairs = [(method, "cold")] + ([(method, "warm")] if cache == "warm" else [])
    measured = time_to_n.measure(workload.name, default_size(workload), pairs, ns=PROFILE_NS[profile],
                                 max_seconds=PROFILE_MAX_SECONDS[profile], threads=1, device=device,
                                 check=False, env={"VMAPBENCH_NATIVE_GUARDS": None} if GUARDS_SET else None)[-1]
    got = {"seconds": dict(zip(measured.ns, measured.seconds)), "status": measured.status, "note": measured.note}
    if path is not None:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(got))
        tmp.replace(path)
    return got


class TimeToN:
    params = [[w.name for w in all_workloads()], list(CURVES), list(selection.ALL_DEVICES)]
    param_names = ["workload", "curve", "device"]
    version = selection.SUITE_VERSION
    timeout = 900.0  # a cold torch.compile or engine.compile, then the calls, on a small machine
    number = 1
    repeat = 1
    rounds = 1

    def setup(self, workload: str, curve: str, device: str) -> None:
        import importlib.util

        profile = selection.active_profile()
        w = next(w for w in all_workloads() if w.name == workload)
        if (w, curve, device) not in selected(profile, selection.active_devices(profile)):
            raise NotImplementedError(f"{workload} {curve} on {device}: not in the {profile} profile's "
                                      "time-to-N points, or the workload has no such method")
        if importlib.util.find_spec("workloads.time_to_n") is None:
            raise NotImplementedError("workloads.time_to_n does not exist at this commit")
        probes.pin_threads()
        self.point = (w, curve, device, profile)

    def _at(self, n: int) -> float:
        got = measure_point(*self.point)
        seconds = got["seconds"].get(n)
        if seconds is None:
            if got["status"] in ("failed", "wrong", "killed"):
                raise RuntimeError(f"{self.point[0].name} {self.point[1]}: {got['status']}: {got['note']}")
            raise probes.SkipNotImplemented(f"{self.point[0].name} {self.point[1]}: N={n} not reached "
                                            f"({got['note'] or 'not among the profile N'})")
        return seconds

    def track_seconds_to_1(self, workload: str, curve: str, device: str) -> float:
        return self._at(1)

    def track_seconds_to_30(self, workload: str, curve: str, device: str) -> float:
        return self._at(30)

    def track_seconds_to_300(self, workload: str, curve: str, device: str) -> float:
        return self._at(300)

    def track_seconds_to_3000(self, workload: str, curve: str, device: str) -> float:
        return self._at(3000)

    for _metric in (track_seconds_to_1, track_seconds_to_30, track_seconds_to_300, track_seconds_to_3000):
        _metric.unit = "seconds"  # type: ignore[attr-defined]
    del _metric
