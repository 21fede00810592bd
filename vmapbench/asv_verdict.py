"""An asv plugin (asv.conf.json "plugins"): `asv continuous` and `asv compare` decide with the gate's policy.

asv 0.6.6 calls a point worse when its median grew beyond one global `--factor` and its samples
differ (Mann-Whitney, or disjoint 99% intervals), and ranks every metric lower-is-better. On a
shared 2-core machine that judges raw wall times of processes run minutes apart, which move more
than any change worth catching. Loaded by asv, this module makes asv's comparison what the
gate's is (measuring.stats, one policy):

- only the gated metrics (stats.GATED_METRICS: instruction counts, allocator peaks, ratios of
  methods timed interleaved in one process) are called better or worse; raw times, resident-set
  growth and compile times are measured and stored, never called;
- a gated point is worse when the whole 99% interval of head/base of its samples lies beyond its
  noise floor: for an instruction count (suite/bench_counts.py) stats.COUNT_FLOOR, for an
  allocator peak stats.MEMORY_FLOOR; for a time
  ratio the machine's calibrated one (results/noise/<machine>.json, `make gate-calibrate`), else
  stats.DEFAULT_NOISE_FLOOR, at least `--factor` - 1 and UNPAIRED_TIME_FLOOR (asv's ratios come
  from separate processes: only a gross change of one is called);
- a higher-is-better metric (a speed-up over the loop) is worse when it drops.

A point that fails at head and ran at base stays worse, as in asv. asv names the points, so the
floors of `make continuous` apply to asv's points of the same name.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from measuring import stats

# The least floor of a time ratio in asv: asv times base and head in processes of their own, and
# two such processes of one commit gave ratios 1.7x apart with intervals too tight to call it
# noise (docs/guide/asv-continuous.md); 1.5x that on the log scale, as the gate's calibration
# derives a floor from its largest A/A deviation. The gate's own floors are for base and head
# timed in one process, and the instruction counts are what catches a smaller change in asv.
UNPAIRED_TIME_FLOOR = round(math.expm1(1.5 * math.log(1.7)), 2)
_ORIGINAL: dict[str, Any] = {}  # asv's functions this module replaces
_STATE: dict[str, Any] = {"machine": None}  # the machine of the table being printed
# The checkout asv imported this plugin from: its results/noise holds the floors (asv changes the
# working folder while it runs).
CHECKOUT = Path(__file__).resolve().parents[1]


class Point(dict):
    """asv's stats entry of one point (a dict, empty where asv has none), tagged with the point's name."""

    point: str = ""


def change(point: str, base: Sequence[float], head: Sequence[float], floor: float) -> str:
    """The gate's verdict on head vs base of one point: "slower", "faster", "unchanged",
    "inconclusive", or "not gated" (a metric only reported, or values with no positive median)."""
    if not stats.is_gated(point):
        return "not gated"
    try:
        ratio = stats.ratio(base, head)
    except ValueError:  # no positive median: no ratio to judge
        return "not gated"
    return stats.gate_verdict(ratio, floor, stats.higher_is_better(point))


def floor_of(point: str, machine: str | None, factor: float | None) -> float:
    """The noise floor of `point`: an exact signal's is stats.exact_floor (COUNT_FLOOR for an
    instruction count, MEMORY_FLOOR for an allocator peak: neither moves between processes); a
    time ratio's is the largest of the machine's calibrated one (else the policy's default),
    `factor` - 1 (asv's --factor) and UNPAIRED_TIME_FLOOR."""
    if stats.is_exact(point):
        return stats.exact_floor(point)
    floor = stats.noise_floor(point, machine, CHECKOUT)
    return max(floor, (factor or 1.0) - 1.0, UNPAIRED_TIME_FLOOR)


def _values(value: float, samples: Sequence[float] | None) -> list[float]:
    clean = [s for s in samples or () if s is not None and not math.isnan(s)]
    return clean or [value]


def is_result_better(a: float, b: float, a_ss: Any, b_ss: Any, factor: float, use_stats: bool = True) -> bool:
    """asv's `_is_result_better` (is `a` better than `b`) for points tagged by `unroll_result`."""
    point = getattr(a_ss[0], "point", "") if a_ss else ""
    if not point:  # asv's own calls without stats (the "~" mark of the table)
        return _ORIGINAL["_is_result_better"](a, b, a_ss, b_ss, factor, use_stats)
    verdict = change(point, _values(b, b_ss[1]), _values(a, a_ss[1]), floor_of(point, _STATE["machine"], factor))
    return verdict == "faster"


def unroll_result(benchmark_name: str, params: Sequence[Sequence[str]], *values: Any) -> Iterator[tuple]:
    """asv's `unroll_result`, its stats entries (the second value list) tagged with each point's name."""
    for name, *rest in _ORIGINAL["unroll_result"](benchmark_name, params, *values):
        if len(rest) >= 2:
            tagged = Point(rest[1] or {})
            tagged.point = name
            rest[1] = tagged
        yield (name, *rest)


def _noting_machines(resultset: Iterable[tuple] | None, seen: set[str]) -> Iterable[tuple] | None:
    if resultset is None:
        return None

    def noted() -> Iterator[tuple]:
        for entry in resultset:
            seen.add(entry[6])  # (key, params, value, stats, samples, version, machine, env_name)
            yield entry
    return noted()


def _print_table(print_table: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(cls: type, conf: Any, hash_1: str, hash_2: str, factor: float, split: bool,
                resultset_1: Any = None, resultset_2: Any = None, machine: str | None = None,
                **kwargs: Any) -> Any:
        seen: set[str] = set()
        _STATE["machine"] = machine
        first, second = _noting_machines(resultset_1, seen), _noting_machines(resultset_2, seen)
        if machine is None and first is not None:
            first = list(first)  # read before the comparison: the floors' machine
            if len(seen) == 1:
                _STATE["machine"] = next(iter(seen))
        floors = stats.load_calibration(_STATE["machine"], CHECKOUT) if _STATE["machine"] else None
        print(f"vmapbench: asv's verdict counts only the gated signals ({', '.join(sorted(stats.GATED_METRICS))}); "
              f"raw times, resident-set growth and compile times are stored, not called. Floors: counts "
              f"{stats.COUNT_FLOOR:.0%}; allocator peaks {stats.MEMORY_FLOOR:.0%}; time ratios "
              + (f"results/noise/{_STATE['machine']}.json ({len(floors.get('floors', {}))} points), " if floors else
                 f"no calibration for machine {_STATE['machine']!r}: {stats.DEFAULT_NOISE_FLOOR:.0%} for every point, ")
              + f"at least --factor {factor} - 1 and {UNPAIRED_TIME_FLOOR:.0%} (base and head timed in separate "
              f"processes). `make continuous` is the gate (docs/guide/asv-continuous.md).")
        return print_table(cls, conf, hash_1, hash_2, factor, split, resultset_1=first, resultset_2=second,
                           machine=machine, **kwargs)
    return wrapped


def setup() -> None:
    """asv's plugin hook: patch asv's comparison (asv.commands.compare) once per process."""
    from asv.commands import compare

    if _ORIGINAL:
        return
    missing = [n for n in ("_is_result_better", "unroll_result") if not callable(getattr(compare, n, None))]
    if missing or not hasattr(compare.Compare, "print_table"):
        raise RuntimeError(f"vmapbench.asv_verdict: this asv ({getattr(compare, '__file__', '?')}) has no "
                           f"{missing or ['Compare.print_table']}; it was written for asv 0.6.6 (pyproject.toml pins it)")
    _ORIGINAL["_is_result_better"] = compare._is_result_better
    _ORIGINAL["unroll_result"] = compare.unroll_result
    compare._is_result_better = is_result_better
    compare.unroll_result = unroll_result
    compare.Compare.print_table = classmethod(_print_table(compare.Compare.print_table.__func__))


__all__ = ["change", "floor_of", "is_result_better", "setup", "unroll_result"]
