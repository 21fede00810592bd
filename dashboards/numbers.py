"""One source per number: every figure a page shows is an Estimate made here from the stored values.

The Overview table and its bars, Compare, History and the "did the last commit make anything
slower?" box all read their figures through this module, so the same cell shows the same value
and interval everywhere:

- a stored value becomes `measuring.stats.row_estimate(value, samples, asv's 99% ci)`: the
  median with a bootstrap interval of the recorded samples, else asv's own interval, else the
  value alone (n=1: no error bar);
- the speedup over the loop and the ratio to torch.func are the suite's in-process ratio tracks
  (`track_speedup_vs_loop`, `track_ratio_vs_torch_func`: both methods timed interleaved in one
  process, so a busy machine slows both alike). Only where a suite did not record them is the
  ratio of asv's medians used, and the page says so (`source`);
- a change between two commits is `change(base, head)`: head/base with the interval that
  covers both values' intervals, judged by `measuring.stats.verdict` against the benchmark's
  `measuring.stats.noise_floor` (the gate's calibration, else its policy floor; infinite for
  metrics never called, like RSS deltas). Compare's pairs of commits are judged here too, all at
  once (`changes`, `judgements`): assets/dashboard.js shows the verdicts, it does not make them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from measuring import stats

TIME_METRIC = "time"
SPEEDUP_METRIC = "speedup_vs_loop"
REFERENCE_RATIO_METRIC = "ratio_vs_torch_func"
RATIO_METRICS = (SPEEDUP_METRIC, REFERENCE_RATIO_METRIC)
IN_PROCESS = "in-process ratio"
OF_MEDIANS = "ratio of asv medians"
NOT_JUDGED = "not judged"


def estimate_columns(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with lo, hi, n: each value's interval by `stats.row_estimate` (the gate's reader).

    Rows without samples are done in one vectorized step that is row_estimate's own rule (asv's
    ci where finite, else the value); rows with two or more samples get stats.estimate's median
    and bootstrap interval, computed many at a time by `sampled_estimates`."""
    value = rows["value"].to_numpy(dtype=float)
    a = rows["ci_99_a"].to_numpy(dtype=float) if "ci_99_a" in rows else np.full(len(rows), np.nan)
    b = rows["ci_99_b"].to_numpy(dtype=float) if "ci_99_b" in rows else np.full(len(rows), np.nan)
    has_ci = np.isfinite(a) & np.isfinite(b)
    # asv's interval can reach below zero for a noisy time; no time, size or ratio is negative,
    # so such a bound reads as "down to 0".
    a = np.where(has_ci & (a < 0) & (value >= 0), 0.0, a)
    lo = np.where(has_ci, np.minimum(a, value), value)
    hi = np.where(has_ci, np.maximum(b, value), value)
    n = np.where(has_ci, 2, 1)
    out = rows.assign(lo=lo, hi=hi, n=n)
    if "samples" in rows:
        candidates = np.flatnonzero(rows["samples"].notna().to_numpy())
        found = sampled_estimates([rows["samples"].iat[i] for i in candidates])
        hits = [(int(i), e) for i, e in zip(candidates, found) if e is not None]
        if hits:
            cols = {c: out[c].to_numpy(copy=True) for c in ("value", "lo", "hi", "n")}
            for i, (v, lo_, hi_, n_) in hits:
                # A time's interval reaching below zero reads as "down to 0" (as for asv's ci).
                cols["value"][i], cols["lo"][i], cols["hi"][i], cols["n"][i] = v, max(lo_, 0.0) if v >= 0 else lo_, hi_, n_
            out = out.assign(**cols)
    return out


def sampled_estimates(samples: Sequence[Any], confidence: float = stats.CONFIDENCE) -> list[tuple[float, float, float, int] | None]:
    """(value, lo, hi, n) of `stats.estimate` for each entry of `samples` with two or more
    samples (None for the others), many at a time (`stats.estimates`)."""
    lists = [entry if isinstance(entry, list) and len(entry) >= 2 else None for entry in samples]
    return [None if e is None or e.n < 2 else (e.value, e.lo, e.hi, e.n) for e in stats.estimates(lists, confidence)]


def as_estimate(row: Any) -> stats.Estimate:
    """The Estimate of one row of `estimate_columns` (a namedtuple or a mapping)."""
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    return stats.Estimate(float(get("value")), float(get("lo")), float(get("hi")), int(get("n")))


def change(base: stats.Estimate, head: stats.Estimate) -> stats.Estimate | None:
    """head / base with the interval spanned by the two intervals (lo_h/hi_b .. hi_h/lo_b).

    None when the ratio is undefined (a base of 0 or below): such a change is shown, not judged."""
    value, lo, hi, defined = changes(base.value, base.lo, base.hi, head.value, head.lo, head.hi)
    if not defined:
        return None
    return stats.Estimate(float(value), float(lo), float(hi), min(base.n, head.n))


def changes(base_value: Any, base_lo: Any, base_hi: Any, head_value: Any, head_lo: Any,
            head_hi: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`change` of many pairs at once (arrays, broadcast together): (value, lo, hi, defined), NaN
    where `defined` is false (a base of 0 or below, or a value missing)."""
    bv, blo, bhi, hv, hlo, hhi = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (base_value, base_lo, base_hi, head_value, head_lo, head_hi)))
    defined = (bv > 0) & (blo > 0) & (hv >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(defined, hv / bv, np.nan)
        lo = np.where(defined, np.minimum(hlo / bhi, value), np.nan)
        hi = np.where(defined, np.maximum(hhi / blo, value), np.nan)
    return value, lo, hi, defined


def floor_of(benchmark: str, machine: str, results_dir: Path | None) -> float:
    """The noise floor `stats.verdict` uses for `benchmark` on `machine` (inf: never called)."""
    root = results_dir.parent if results_dir is not None else None
    return stats.noise_floor(benchmark, machine=machine, root=root)


def judge(base: stats.Estimate, head: stats.Estimate, benchmark: str, floor: float) -> tuple[str, stats.Estimate | None]:
    """(verdict, change) of one benchmark between two commits: 'slower' / 'faster' /
    'unchanged' by stats.verdict, or 'not judged' (a metric never called, or no defined ratio)."""
    delta = change(base, head)
    if delta is None:
        return NOT_JUDGED, None
    return str(judgements(delta.lo, delta.hi, delta.n, True, floor, stats.higher_is_better(benchmark))[()]), delta


def judgements(lo: Any, hi: Any, n: Any, defined: Any, floor: Any, higher_is_better: Any) -> np.ndarray:
    """`judge`'s verdicts of many changes at once (arrays from `changes`, broadcast together):
    stats.verdicts, or 'not judged' where the change is undefined or the floor infinite."""
    floor = np.asarray(floor, dtype=float)
    judged = np.asarray(defined, dtype=bool) & np.isfinite(floor)
    called = stats.verdicts(lo, hi, n, np.where(judged, floor, 0.0), higher_is_better)
    return np.where(judged, called, NOT_JUDGED)


@dataclass(frozen=True)
class Figure:
    """What a page prints for one number: the Estimate and how it was obtained."""

    est: stats.Estimate
    source: str

    def text(self, unit: str = "x") -> str:
        return format_estimate(self.est, unit)


def format_number(value: float, unit: str) -> str:
    from dashboards.theme import format_value

    return format_value(value, "x" if unit in ("x", "ratio") else unit)


def format_estimate(est: stats.Estimate, unit: str = "x") -> str:
    """'5.66× [5.1×, 6.2×]' / '3.4 ms [3.3 ms, 3.6 ms]': the value with its interval when it has
    one (assets/dashboard.js estimateText writes the same text)."""
    main = format_number(est.value, unit)
    if est.n <= 1 or est.lo == est.hi:
        return main
    return f"{main} [{format_number(est.lo, unit)}, {format_number(est.hi, unit)}]"


KEY = ["machine", "device", "workload", "size"]


def cell_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The figures of one commit per (machine, device, workload, size, method).

    Columns: time/time_lo/time_hi/time_n (asv's time_run), speedup*/speedup_source (over the
    loop), vs_ref*/vs_ref_source (over torch.func); `rows` are one commit's rows of the time and
    ratio metrics (any number of machines)."""
    from workloads.base import BASELINE, REFERENCE

    cols = KEY + ["method"]
    rows = rows[rows["metric"].isin([TIME_METRIC, *RATIO_METRICS])]
    if rows.empty:
        return pd.DataFrame(columns=cols + ["time", "time_lo", "time_hi", "time_n"])
    est = estimate_columns(rows).drop_duplicates(cols + ["metric"], keep="last")
    out = None
    for metric, prefix in ((TIME_METRIC, "time"), (SPEEDUP_METRIC, "speedup"), (REFERENCE_RATIO_METRIC, "vs_ref")):
        part = est[est["metric"] == metric][cols + ["value", "lo", "hi", "n"]]
        part = part.rename(columns={"value": prefix, "lo": f"{prefix}_lo", "hi": f"{prefix}_hi", "n": f"{prefix}_n"})
        part[f"{prefix}_source"] = IN_PROCESS if metric != TIME_METRIC else "asv time_run"
        out = part if out is None else out.merge(part, on=cols, how="outer")
    out = out.reset_index(drop=True)
    # Where the suite did not record an in-process ratio, the ratio of medians stands in.
    for prefix, other, invert in (("speedup", BASELINE, True), ("vs_ref", REFERENCE, False)):
        base = out[out["method"] == other][KEY + ["time", "time_lo", "time_hi", "time_n"]]
        base = base.rename(columns={c: f"{c}_other" for c in ("time", "time_lo", "time_hi", "time_n")})
        joined = out.merge(base, on=KEY, how="left")
        missing = out[prefix].isna() & joined["time_other"].notna() & out["time"].notna()
        if missing.any():
            j = joined[missing]
            if invert:  # loop / method
                v, lo, hi = j["time_other"] / j["time"], j["time_lo_other"] / j["time_hi"], j["time_hi_other"] / j["time_lo"]
            else:       # method / torch.func
                v, lo, hi = j["time"] / j["time_other"], j["time_lo"] / j["time_hi_other"], j["time_hi"] / j["time_lo_other"]
            out.loc[missing, prefix] = v
            out.loc[missing, f"{prefix}_lo"] = np.minimum(lo, v)
            out.loc[missing, f"{prefix}_hi"] = np.maximum(hi, v)
            out.loc[missing, f"{prefix}_n"] = np.minimum(j["time_n"], j["time_n_other"])
            out.loc[missing, f"{prefix}_source"] = OF_MEDIANS
    return out


def figure_of(row: Any, prefix: str) -> Figure | None:
    """The Figure of column group `prefix` ('time', 'speedup', 'vs_ref') of one cell_table row."""
    get = row.get if isinstance(row, dict) else lambda k, d=None: getattr(row, k, d)
    value = get(prefix)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    n = get(f"{prefix}_n")
    return Figure(stats.Estimate(float(value), float(get(f"{prefix}_lo")), float(get(f"{prefix}_hi")),
                                 int(n) if n == n else 1), str(get(f"{prefix}_source")))


def fastest(methods: Sequence[tuple[str, Figure | None]]) -> str | None:
    """The method with the highest speedup over the loop among `methods` (None if none has one)."""
    best = [(f.est.value, m) for m, f in methods if f is not None and math.isfinite(f.est.value)]
    return max(best)[1] if best else None


def rows_by(frame: pd.DataFrame, keys: Sequence[str]) -> list[tuple[tuple, list[dict[str, Any]]]]:
    """`frame`'s rows as dicts grouped by `keys`, groups sorted by key text: one pass in Python,
    which beats a pandas groupby over categorical columns by far for the few hundred rows of a
    page's table."""
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in frame.to_dict("records"):
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return sorted(out.items(), key=lambda kv: tuple(str(k) for k in kv[0]))
