"""One statistics module and one threshold policy for the gate, the CLI and the dashboard.

Why this exists: on a shared 2-core machine two runs of the same commit differ by 20-200% in raw
time, so "head/base > 1.2" cries wolf. Every figure shown or gated is therefore an `Estimate`
(a median with a confidence interval), every comparison a `ratio` of two sample sets with its
interval, and a change is called only when its *whole* interval lies beyond the benchmark's
noise floor (`verdict`): criterion.rs's "change within noise threshold" made first class.

- `estimate`: median and a percentile-bootstrap interval of the median (seeded: the same samples
  always give the same interval, so the dashboard and the gate print the same figures).
- `ratio`: median(head) / median(base), the interval from resampling both sides independently.
- `verdict`: "slower" / "faster" / "unchanged" against a noise floor; metrics where higher is
  better (speedups) are turned around by `higher_is_better`.
- `noise_floor`: a benchmark's floor from the calibration file `vmapbench gate --calibrate`
  writes (results/noise/<machine>.json), else the metric's policy floor, else the default.
- Plain summaries, for figures printed without an interval: `median`, `quartiles`, `quantile`,
  `rank_percentile` (a percentile that is one of the samples), `spread`, `geomean` (of ratios).
- `row_estimate` / `asv_estimates`: an asv result entry (value, samples recorded by
  `asv run --record-samples`, asv's own 99% interval) read into Estimates.
- The policy: which metrics gate (`GATED_METRICS`: the in-process, load-invariant ratios, and
  the exact instruction counts and allocator peaks) and which are reported only (raw times and
  process-level memory, whose A/A noise here is larger than any change worth catching).
"""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

# --- policy: the one threshold definition ------------------------------------------------------

CONFIDENCE = 0.99
"""Two-sided confidence of every interval (asv also reports 99% intervals)."""

DEFAULT_NOISE_FLOOR = 0.10
"""A change smaller than 10% is never called, whatever its interval (fractional, on the ratio)."""

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261123

COUNT_METRICS: frozenset[str] = frozenset({"instructions", "track_instructions"})
"""Metrics counted, not timed: instructions executed in a measured region under callgrind
(measuring/counts.py; the gate's signals, and the asv suite's suite/bench_counts.py). Noise does
not move them, so they are compared with COUNT_FLOOR."""

MEMORY_METRICS: frozenset[str] = frozenset({"track_alloc_peak_bytes"})
"""Memory metrics that are exact: the peak of tensor bytes one call allocated, counted at torch's
allocator (measuring.memory.alloc_peak_bytes). The same call gives the same bytes in every
process, so the gate compares them with MEMORY_FLOOR, no noise floor."""

EXACT_METRICS: frozenset[str] = COUNT_METRICS | MEMORY_METRICS
"""Metrics that repeat exactly: compared as counts (ratio of medians, no bootstrap, no twin)."""

GATED_METRICS: frozenset[str] = frozenset({
    "track_ratio_vs_torch_func",
    "track_speedup_vs_loop",
    "track_overhead_us_per_op",
}) | EXACT_METRICS
"""Metrics a regression gate may fail on: ratios of times measured interleaved in one process,
which a busy machine slows alike on both sides (see suite/probes.interleaved_seconds),
instruction counts and allocator peaks."""

COUNT_FLOOR = 0.03
"""A count signal's floor: a change of instructions under 3% is never called."""

MEMORY_FLOOR = 0.02
"""A memory signal's floor: a change of an allocator peak under 2% is never called (a tolerance
for a few small tensors, not noise: A/A gives the same bytes)."""

HIGHER_IS_BETTER: frozenset[str] = frozenset({"track_speedup_vs_loop"})

UNGATED_FLOORS: Mapping[str, float] = {
    # Reported, never gated: their A/A spread on a loaded 2-core box exceeds the changes that matter.
    "time_run": 0.25,
    "time_chain": 0.25,
    "peakmem_run": 0.25,
    "track_compile_seconds": 0.5,
}
"""Floors the dashboard uses to colour ungated metrics when no calibration exists for them."""

NEVER_CALLED: frozenset[str] = frozenset({"track_rss_delta_bytes"})
"""Metrics whose changes are never called (RSS deltas go 0 B -> 52 KiB from page reuse alone)."""

VERDICTS = ("slower", "faster", "unchanged")
GATE_VERDICTS = ("slower", "faster", "unchanged", "inconclusive")

MIN_SAMPLES = 2
"""A change measured from fewer samples a side has no interval and is never called."""

NOISE_DIR = Path("results") / "noise"


# --- estimates -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Estimate:
    """A point estimate with its confidence interval; `n` samples (1: no interval, lo == hi)."""

    value: float
    lo: float
    hi: float
    n: int

    @property
    def halfwidth(self) -> float:
        """Half the interval's width relative to the value (0.05: +-5%); inf when value is 0."""
        if self.value == 0:
            return math.inf if self.hi != self.lo else 0.0
        return (self.hi - self.lo) / 2 / abs(self.value)

    def format(self, digits: int = 3) -> str:
        if self.n <= 1 or self.lo == self.hi:
            return f"{self.value:.{digits}g}"
        return f"{self.value:.{digits}g} [{self.lo:.{digits}g}, {self.hi:.{digits}g}]"


def _clean(samples: Sequence[float], what: str) -> np.ndarray:
    values = np.asarray([s for s in samples if s is not None], dtype=float)
    values = values[~np.isnan(values)]
    if values.size == 0:
        raise ValueError(f"{what}: no samples (all missing or NaN); a benchmark that failed or was skipped "
                         f"has no estimate")
    return values


def _rng() -> np.random.Generator:
    return np.random.default_rng(BOOTSTRAP_SEED)


def _bootstrap_medians(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    idx = rng.integers(0, values.size, size=(BOOTSTRAP_RESAMPLES, values.size))
    return np.median(values[idx], axis=1)


def _tails(confidence: float) -> tuple[float, float]:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence} must lie strictly between 0 and 1 (e.g. 0.99)")
    alpha = (1 - confidence) / 2
    return 100 * alpha, 100 * (1 - alpha)


def estimate(samples: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """Median of `samples` and a seeded percentile-bootstrap interval of the median.

    One sample gives a degenerate interval (lo == hi == value): it says nothing about noise, and
    `verdict` then falls back on the noise floor alone.
    """
    return estimates([_clean(samples, "estimate")], confidence)[0]


def estimates(many: Sequence[Sequence[float] | None], confidence: float = CONFIDENCE) -> list[Estimate | None]:
    """`estimate` of each entry of `many` (None for an entry with no sample), computed many at a time.

    The bootstrap indices come from a freshly seeded generator, so they depend only on the sample
    count: entries with the same count share one index matrix and their medians are taken in one
    numpy call (a thousand-fold faster than one call per entry, which the dashboard needs for tens
    of thousands of values)."""
    lo_q, hi_q = _tails(confidence)
    out: list[Estimate | None] = [None] * len(many)
    by_count: dict[int, list[tuple[int, np.ndarray]]] = {}
    for i, entry in enumerate(many):
        if entry is None:
            continue
        values = np.asarray([x for x in entry if x is not None], dtype=float)
        values = values[~np.isnan(values)]
        if values.size == 1:
            out[i] = Estimate(float(values[0]), float(values[0]), float(values[0]), 1)
        elif values.size:
            by_count.setdefault(int(values.size), []).append((i, values))
    for n, items in by_count.items():
        idx = _rng().integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
        for start in range(0, len(items), 64):  # 64 x resamples x n floats at a time
            part = items[start:start + 64]
            matrix = np.stack([v for _, v in part])
            lo, hi = np.percentile(np.median(matrix[:, idx], axis=2), [lo_q, hi_q], axis=1)
            center = np.median(matrix, axis=1)
            for j, (i, _) in enumerate(part):
                m = float(center[j])
                out[i] = Estimate(m, float(min(lo[j], m)), float(max(hi[j], m)), n)
    return out


# Student's t two-sided quantiles (df -> t) for the confidences the project uses; beyond the last
# listed df the next smaller listed one is used (conservative).
_T_QUANTILES: Mapping[float, Mapping[int, float]] = {
    0.99: {1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250,
           10: 3.169, 12: 3.055, 15: 2.947, 20: 2.845, 25: 2.787, 30: 2.750, 40: 2.704, 60: 2.660},
    0.95: {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
           10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000},
    0.90: {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833,
           10: 1.812, 12: 1.782, 15: 1.753, 20: 1.725, 25: 1.708, 30: 1.697, 40: 1.684, 60: 1.671},
}
# "unchanged" is an equivalence test (two one-sided tests, TOST, each at EQUIVALENCE_ALPHA): the
# change's (1 - 2 x alpha) interval within the floor. "slower" keeps the CONFIDENCE interval.
EQUIVALENCE_ALPHA = 0.05
EQUIVALENCE_CONFIDENCE = 1 - 2 * EQUIVALENCE_ALPHA


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided Student's t quantile for `df` degrees of freedom (a table: 0.99, 0.95, 0.90)."""
    table = _T_QUANTILES.get(round(confidence, 4))
    if table is None:
        raise ValueError(f"t_quantile: confidence {confidence} is not tabulated (use one of {sorted(_T_QUANTILES)})")
    if df < 1:
        raise ValueError(f"t_quantile: df={df} must be at least 1")
    return table[max(k for k in table if k <= df)]


def paired_ratio(ratios: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """head/base from ratios taken pair by pair (base and head measured moments apart): the median
    ratio, its interval the union of the bootstrap interval of the median and the t interval of
    the mean log ratio. With few pairs a bootstrap interval is no wider than the pairs' range (3
    ratios within 12% of each other gave a 99% interval of that width and a false alarm); the t
    interval widens with few pairs as it should."""
    r = _clean(ratios, "paired_ratio")
    if (r <= 0).any():
        raise ValueError("paired_ratio: ratios must be positive")
    boot = estimate(r, confidence)
    if r.size < 2:
        return boot
    logs = np.log(r)
    half = t_quantile(int(r.size) - 1, confidence) * float(logs.std(ddof=1)) / math.sqrt(r.size)
    mean = float(logs.mean())
    return Estimate(boot.value, min(boot.lo, math.exp(mean - half)), max(boot.hi, math.exp(mean + half)), boot.n)


def ratio(base: Sequence[float], head: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """median(head) / median(base) with a bootstrap interval (both sides resampled independently).

    > 1 means head is larger (slower, for lower-is-better metrics). `n` is the smaller side's count.
    """
    b, h = _clean(base, "ratio: base"), _clean(head, "ratio: head")
    mb, mh = float(np.median(b)), float(np.median(h))
    if mb <= 0 or mh < 0:
        raise ValueError(f"ratio: medians must be positive (base {mb}, head {mh}); compare differences "
                         f"for metrics that can be zero or negative")
    value = mh / mb
    if b.size == 1 and h.size == 1:
        return Estimate(value, value, value, 1)
    rng = _rng()
    rb, rh = _bootstrap_medians(b, rng), _bootstrap_medians(h, rng)
    lo_q, hi_q = _tails(confidence)
    lo, hi = np.percentile(rh / rb, [lo_q, hi_q])
    return Estimate(value, float(min(lo, value)), float(max(hi, value)), int(min(b.size, h.size)))


def verdict(change: Estimate, noise_floor: float = DEFAULT_NOISE_FLOOR, higher_is_better: bool = False) -> str:
    """"slower", "faster" or "unchanged" for a head/base `change` (see `ratio`).

    Called only when the whole interval lies beyond the floor: slower when lo > 1 + floor, faster
    when hi < 1 / (1 + floor) (the floor is symmetric in log scale). For a higher-is-better metric
    (a speedup) a ratio above 1 is the improvement. A change from fewer than MIN_SAMPLES samples
    a side (n) has no interval and is "unchanged": one run says nothing about noise.
    """
    return str(verdicts(change.lo, change.hi, change.n, noise_floor, higher_is_better)[()])


def verdicts(lo: Any, hi: Any, n: Any, noise_floor: Any = DEFAULT_NOISE_FLOOR,
             higher_is_better: Any = False) -> np.ndarray:
    """`verdict` of many changes at once, given as arrays (broadcast together) of their interval
    bounds, sample counts, floors and directions: an array of "slower" / "faster" / "unchanged".
    The dashboard judges every pair of commits it offers with it."""
    lo, hi, n, floor, better = np.broadcast_arrays(np.asarray(lo, dtype=float), np.asarray(hi, dtype=float),
                                                   np.asarray(n), np.asarray(noise_floor, dtype=float),
                                                   np.asarray(higher_is_better, dtype=bool))
    if (floor < 0).any():
        raise ValueError(f"noise_floor={floor.min()} must be >= 0 (a fraction: 0.1 = 10%)")
    interval = n >= MIN_SAMPLES
    up = interval & (lo > 1 + floor)
    down = interval & (hi < 1 / (1 + floor))
    slower, faster = np.where(better, down, up), np.where(better, up, down)
    return np.where(slower, "slower", np.where(faster, "faster", "unchanged"))


def gate_verdict(change: Estimate, noise_floor: float, higher_is_better: bool = False,
                 equivalence: Estimate | None = None) -> str:
    """The gate's verdict on a head/base `change`: `verdict`'s three, plus "inconclusive".

    "slower"/"faster" when the whole interval lies beyond the floor (as `verdict`); "unchanged"
    only when the whole interval lies within it, or where `equivalence` is given (the same change
    at EQUIVALENCE_CONFIDENCE: a TOST equivalence test) when that interval does; "inconclusive"
    when the interval reaches across a floor boundary, or there is no interval (fewer than
    MIN_SAMPLES a side): too wide to decide, and never reported as a regression. An infinite floor
    (the noise is unknown) decides nothing."""
    if math.isinf(noise_floor):
        return "inconclusive"
    called = verdict(change, noise_floor, higher_is_better)
    if called != "unchanged":
        return called
    if change.n < MIN_SAMPLES:
        return "inconclusive"
    within = equivalence if equivalence is not None else change
    inside = within.lo >= 1 / (1 + noise_floor) and within.hi <= 1 + noise_floor
    return "unchanged" if inside else "inconclusive"


def is_count(benchmark: str) -> bool:
    return metric_of(benchmark) in COUNT_METRICS


def is_memory(benchmark: str) -> bool:
    return metric_of(benchmark) in MEMORY_METRICS


def is_exact(benchmark: str) -> bool:
    """A metric that repeats exactly (instruction counts, allocator peaks)."""
    return metric_of(benchmark) in EXACT_METRICS


def exact_floor(benchmark: str) -> float:
    """The floor of an exact signal: MEMORY_FLOOR for memory, COUNT_FLOOR for counts."""
    return MEMORY_FLOOR if is_memory(benchmark) else COUNT_FLOOR


def relative_change(change: Estimate) -> str:
    """'+12.3% [+5.1%, +20.0%]': a ratio as a percentage change with its interval."""
    def pct(x: float) -> str:
        return f"{(x - 1) * 100:+.1f}%"
    if change.n <= 1 or change.lo == change.hi:
        return pct(change.value)
    return f"{pct(change.value)} [{pct(change.lo)}, {pct(change.hi)}]"


# --- plain summaries -----------------------------------------------------------------------------

def median(values: Iterable[float]) -> float:
    """The median of `values` (the mean of the two middle ones for an even count)."""
    return statistics.median(values)


def quartiles(values: Sequence[float], method: str = "exclusive") -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of `values`, by `statistics.quantiles`' `method`
    ('exclusive' or 'inclusive'); one value is all three."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method=method)
    return q1, q2, q3


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, interpolated linearly between samples (numpy's default)."""
    return float(np.quantile(np.asarray(values, dtype=float), q))


def rank_percentile(values: Iterable[float], fraction: float) -> float:
    """The sample at `fraction` (0..1) of the sorted `values`, index floor(fraction * n) (the last
    at most): a percentile that is always one of the measured values, never interpolated."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("rank_percentile: no values")
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def spread(values: Sequence[float], tail: float) -> tuple[float, float]:
    """(low, high): the samples floor(tail * n) places in from each end of the sorted `values`
    (tail 0.1: the 10-90% spread), symmetric, so that the same number of samples lies beyond each."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("spread: no values")
    k = min(int(tail * len(ordered)), (len(ordered) - 1) // 2)
    return ordered[k], ordered[-1 - k]


def geomean(values: Iterable[float]) -> float:
    """The geometric mean of positive `values` (the mean of ratios: 2x and 0.5x average to 1x);
    NaN when there are none."""
    logs = [math.log(v) for v in values]
    return math.exp(statistics.fmean(logs)) if logs else math.nan


# --- policy lookups ------------------------------------------------------------------------------

def metric_of(benchmark: str) -> str:
    """The metric (function) name of an asv benchmark or point name.

    'bench_workloads.mlp_hvp.track_ratio_vs_torch_func(...)' -> 'track_ratio_vs_torch_func'.
    """
    return benchmark.split("(", 1)[0].rsplit(".", 1)[-1]


def is_gated(benchmark: str) -> bool:
    return metric_of(benchmark) in GATED_METRICS


def higher_is_better(benchmark: str) -> bool:
    return metric_of(benchmark) in HIGHER_IS_BETTER


def point_name(benchmark: str, params: Sequence[str] = ()) -> str:
    """The name of one point of a benchmark as asv prints it: 'bench(p1, p2)' (params as asv stores
    them, i.e. their reprs), or the bare name for an unparameterized benchmark."""
    return f"{benchmark}({', '.join(params)})" if params else benchmark


def noise_file(machine: str, root: Path | str | None = None) -> Path:
    base = Path(root) if root is not None else _repo_root()
    return base / NOISE_DIR / f"{machine}.json"


def _repo_root() -> Path:
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "asv.conf.json").is_file():
            return folder
    return Path(__file__).resolve().parents[1]


def _default_machine() -> str:
    explicit = os.environ.get("VMAPBENCH_MACHINE", "").strip()
    if explicit:
        return explicit
    from measuring.machine import machine_name  # imports torch; only when no machine is given

    return machine_name()


_floor_cache: dict[Path, tuple[float, dict[str, Any]]] = {}


def load_calibration(machine: str | None = None, root: Path | str | None = None) -> dict[str, Any] | None:
    """The calibration file of `machine` (None if there is none); cached by modification time."""
    path = noise_file(machine or _default_machine(), root)
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    cached = _floor_cache.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"noise floor: {path} is not a readable calibration file ({exc}); rerun "
                         f"`vmapbench gate --calibrate` or delete it") from None
    _floor_cache[path] = (mtime, data)
    return data


def calibrated_floor(benchmark: str, machine: str | None = None, root: Path | str | None = None) -> float | None:
    """The floor of `benchmark` in the machine's calibration file (point, benchmark, metric), or
    None when the machine has no file or the file has no floor for it: the gate then takes the
    floor from the run's own evidence, never from a blanket default."""
    data = load_calibration(machine, root)
    if not data:
        return None
    floors = data.get("floors", {})
    for key in (benchmark, benchmark.split("(", 1)[0], metric_of(benchmark)):
        if key in floors:
            return float(floors[key])
    return None


def noise_floor(benchmark: str, machine: str | None = None, root: Path | str | None = None) -> float:
    """The noise floor of `benchmark` (a point name, a benchmark name or a metric name).

    Looked up in the machine's calibration file (results/noise/<machine>.json, written by
    `vmapbench gate --calibrate`): the point, then the benchmark without parameters, then the
    metric; else the policy's floor for ungated metrics; else DEFAULT_NOISE_FLOOR. A metric in
    NEVER_CALLED gets an infinite floor.
    """
    metric = metric_of(benchmark)
    if metric in NEVER_CALLED:
        return math.inf
    if metric in MEMORY_METRICS:  # exact: a tolerance, not a noise floor, on every machine
        return MEMORY_FLOOR
    data = load_calibration(machine, root) or {}
    floors = data.get("floors", {})
    for key in (benchmark, benchmark.split("(", 1)[0], metric):
        if key in floors:
            return float(floors[key])
    if metric in UNGATED_FLOORS:
        return UNGATED_FLOORS[metric]
    return float(data.get("default", DEFAULT_NOISE_FLOOR))


# --- asv result entries --------------------------------------------------------------------------

def row_estimate(value: float | None, samples: Sequence[float] | None = None,
                 ci_99_a: float | None = None, ci_99_b: float | None = None,
                 confidence: float = CONFIDENCE) -> Estimate | None:
    """One point of an asv result as an Estimate; None when it failed (None) or was skipped (NaN).

    With recorded samples (asv --record-samples) the interval is ours, from the samples; else
    asv's own 99% interval when finite; else a degenerate interval around the value.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if samples:
        clean = [s for s in samples if s is not None and not math.isnan(s)]
        if len(clean) > 1:
            return estimate(clean, confidence)
    if ci_99_a is not None and ci_99_b is not None and all(map(math.isfinite, (ci_99_a, ci_99_b))):
        return Estimate(float(value), float(min(ci_99_a, value)), float(max(ci_99_b, value)),
                        len(samples) if samples else 2)
    return Estimate(float(value), float(value), float(value), 1)


def asv_estimates(data: Mapping[str, Any], confidence: float = CONFIDENCE) -> Iterator[tuple[str, Estimate | None]]:
    """(point name, Estimate or None) for every point of an asv result file's content (a dict).

    Point names are `point_name(benchmark, params)`, params as asv stores them (reprs).
    """
    columns = data.get("result_columns") or []
    at = {name: i for i, name in enumerate(columns)}
    for bench, row in (data.get("results") or {}).items():
        def col(name: str) -> Any:
            i = at.get(name)
            return row[i] if i is not None and i < len(row) else None

        values = col("result") or []
        params = col("params") or []
        points = list(itertools.product(*params)) if params else [()]
        samples, ci_a, ci_b = col("samples"), col("stats_ci_99_a"), col("stats_ci_99_b")
        for j, point in enumerate(points):
            if j >= len(values):
                break
            yield point_name(bench, point), row_estimate(
                values[j],
                samples[j] if samples and j < len(samples) else None,
                ci_a[j] if ci_a and j < len(ci_a) else None,
                ci_b[j] if ci_b and j < len(ci_b) else None,
                confidence,
            )


def read_asv_result(path: Path | str, confidence: float = CONFIDENCE) -> dict[str, Estimate]:
    """Point name -> Estimate of an asv result file (points that failed or were skipped left out)."""
    data = json.loads(Path(path).read_text())
    return {name: est for name, est in asv_estimates(data, confidence) if est is not None}


_POINT = re.compile(r"^(?P<bench>[^()]+)(?:\((?P<params>.*)\))?$")


def split_point(name: str) -> tuple[str, tuple[str, ...]]:
    """Inverse of `point_name` for params without ', ' inside them: ('bench', ("'a'", "'cpu'"))."""
    match = _POINT.match(name)
    if not match:
        raise ValueError(f"{name!r} is not a benchmark point name like 'module.Class.metric(p1, p2)'")
    params = match.group("params")
    return match.group("bench"), tuple(params.split(", ")) if params else ()
