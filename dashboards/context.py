"""What the views share: the loaded results and the slices of them that several views use.

The bottom of the dashboard's own layers: it imports the loaders, numbers.py and page.py below it
and no module that reads a Context (dashboards.regressions, the views, the builder). A table that
such a module derives and several views read (the step detector's regressions) is computed by its
module and kept here with `Context.shared`, once per build.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np
import pandas as pd

from dashboards.artifacts import CoverageReport, ProfileEntry
from dashboards.loader import STAT_COLUMNS, ResultSet
from dashboards.numbers import cell_table
from dashboards.page import esc, project_path

FILE_COLUMNS = ["machine", "host", "run", "commit", "date", "env", "kind", "python"]
TIME_METRIC = "time"
# Memory metric per device, best first: the allocator's peak of one call (CUDA's caching allocator,
# torch's CPU allocator), then NVML's device use or the process's RSS growth (results from before
# the allocator figures), asv's whole-process peakmem as the last resort.
MEMORY_METRICS = {
    "cuda": ("cuda_peak_bytes", "nvml_peak_bytes", "peakmem"),
    "cpu": ("alloc_peak_bytes", "rss_delta_bytes", "peakmem"),
}
# The jax method's memory: XLA's compiled memory analysis of its program (torch's allocator never
# sees XLA's buffers); shown for jax wherever the workload's metric has no figure for it.
XLA_MEMORY_METRIC = "xla_memory_bytes"
# A process-level figure shown beside the allocator's, never instead of it.
SECONDARY_MEMORY_METRIC = "rss_delta_bytes"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_NUM_THREADS")
T = TypeVar("T")


@dataclass
class Context:
    results: ResultSet
    coverage: CoverageReport | None = None
    profiles: list[ProfileEntry] = field(default_factory=list)
    out_dir: Path = Path(".")

    @property
    def frame(self) -> pd.DataFrame:
        return self.results.frame

    @cached_property
    def param_columns(self) -> list[str]:
        """Columns that describe one measured case (benchmark + every parameter)."""
        skip = set(FILE_COLUMNS) | set(STAT_COLUMNS) | {"suite", "metric", "unit", "type", "case"}
        return [c for c in self.frame.columns if c not in skip]

    @cached_property
    def lean(self) -> pd.DataFrame:
        """The frame with only the columns the views use (cheaper to filter and copy), and with
        `machine` holding the run (machine + env where a machine has several; see
        loader.run_labels) and `host` the machine itself: every view groups by `machine`, so
        results of different asv envs or of continuous runs are never one series."""
        unused = {"env", "python", "suite", "type", "started_at", "q_25", "q_75", "number", "repeat",
                  "duration", "run"}
        lean = self.frame[[c for c in self.frame.columns if c not in unused]]
        return lean.rename(columns={"machine": "host"}).assign(machine=self.frame["run"])

    @cached_property
    def _has_case(self) -> "pd.Series[bool]":
        f = self.frame
        return f["workload"].notna() & f["method"].notna()

    def metric_rows(self, metrics: tuple[str, ...] | list[str]) -> pd.DataFrame:
        """Rows of `metrics` that have a workload and a method (cached per metric set); one
        filter of the full frame, so only the rows kept are copied."""
        key = tuple(metrics)
        if key not in self._metric_cache:
            f = self.lean
            self._metric_cache[key] = f[self._has_case & f["metric"].isin(list(key))]
        return self._metric_cache[key]

    @cached_property
    def _metric_cache(self) -> dict[tuple[str, ...], pd.DataFrame]:
        return {}

    @cached_property
    def commits(self) -> dict[str, list[str]]:
        """machine -> its commits, oldest first (by commit date), from the loaded files."""
        seen: dict[str, dict[str, Any]] = {}
        for info in self.results.files.values():
            date = info.get("date")
            date = date if isinstance(date, (int, float)) else float("-inf")
            mine = seen.setdefault(info.get("run", info["machine"]), {})
            mine[info["commit"]] = max(mine.get(info["commit"], date), date)
        return {m: [c for c, _ in sorted(cs.items(), key=lambda kv: kv[1])] for m, cs in sorted(seen.items())}

    @property
    def latest_commits(self) -> dict[str, str]:
        """machine -> its most recent commit (by commit date)."""
        return {m: cs[-1] for m, cs in self.commits.items() if cs}

    @cached_property
    def latest_commit_rows(self) -> pd.DataFrame:
        """Times and in-process ratios of each run's latest commit."""
        return self.of_commits(self.metric_rows(("time", "speedup_vs_loop", "ratio_vs_torch_func")), 1)

    @cached_property
    def latest_cells(self) -> pd.DataFrame:
        """The figures of each run's latest commit (dashboards.numbers.cell_table): what the
        Overview and Peers pages print."""
        return cell_table(self.latest_commit_rows)

    def of_commits(self, rows: pd.DataFrame, newest: int) -> pd.DataFrame:
        """`rows` of each machine's `newest` commits."""
        if rows.empty:
            return rows
        keep = {(m, c) for m, cs in self.commits.items() for c in cs[-newest:]}
        pairs = _pair_codes(rows)
        uniq, first = np.unique(pairs, return_index=True)
        machines, commits = rows["machine"].to_numpy(), rows["commit"].to_numpy()
        allowed = [p for p, i in zip(uniq, first) if (machines[i], commits[i]) in keep]
        if len(allowed) == len(uniq):
            return rows
        return rows[np.isin(pairs, allowed)]

    def latest_per_case(self, metrics: list[str] | tuple[str, ...]) -> pd.DataFrame:
        """For `metrics`, the most recent value of every case on every machine."""
        m = self.metric_rows(tuple(metrics))
        if m.empty:
            return m
        # Sort (machine, case, date) keys with numpy and keep each group's last row: the same
        # as sort_values + drop_duplicates, without moving every column twice.
        machine = pd.factorize(m["machine"])[0].astype(np.int64)
        key = machine * (int(m["case"].max()) + 1) + m["case"].to_numpy()
        dates = m["date"].astype("int64").to_numpy()  # NaT sorts first
        order = np.lexsort((dates, key))
        ordered = key[order]
        last = np.append(ordered[1:] != ordered[:-1], True)
        return m.iloc[np.sort(order[last])]

    def size_columns_of(self, rows: pd.DataFrame) -> list[str]:
        return [c for c in self.results.size_columns if c in rows.columns and rows[c].notna().any()]

    def x_param(self, rows: pd.DataFrame) -> str | None:
        """The size parameter to put on a scaling axis: the one with the most distinct values."""
        best, best_n = None, 1
        for column in self.size_columns_of(rows):
            if "chunk" in column:
                continue
            n = rows[column].nunique()
            if n > best_n:
                best, best_n = column, n
        return best

    def scale(self, rows: pd.DataFrame) -> pd.Series:
        """Product of the numeric size parameters (chunking excluded): 'how big' a case is."""
        out = pd.Series(1.0, index=rows.index)
        for column in self.size_columns_of(rows):
            if "chunk" not in column:
                out = out * rows[column].fillna(1.0).astype(float)
        return out

    def shared(self, compute: Callable[[Context], T]) -> T:
        """`compute(self)`, computed on the first call and kept for this context (one build): how a
        module above this one (e.g. dashboards.regressions.found_regressions) shares a costly table
        between views without this module knowing it."""
        if compute not in self._shared:
            self._shared[compute] = compute(self)
        return self._shared[compute]

    @cached_property
    def _shared(self) -> dict[Callable[[Context], Any], Any]:
        return {}

    @cached_property
    def filters(self) -> dict[str, list[str]]:
        m = self.lean
        out = {}
        for key in ("machine", "device", "workload"):
            out[key] = sorted(str(v) for v in m[key].dropna().unique()) if key in m else []
        return out

    @cached_property
    def torch_threads(self) -> dict[str, float]:
        """machine -> torch.get_num_threads() at its newest run, when the suite records it."""
        f = self.lean
        rows = f[f["metric"] == "torch_num_threads"]
        if rows.empty:
            return {}
        return rows.sort_values("date").groupby("machine", observed=True)["value"].last().to_dict()

    def machine_facts(self) -> dict[str, dict[str, Any]]:
        """machine -> what it is and how it ran (from machine.json and its newest result file)."""
        newest: dict[str, dict[str, Any]] = {}
        for info in self.results.files.values():
            name = info["machine"]
            if name not in newest or (info.get("date") or 0) >= (newest[name].get("date") or 0):
                newest[name] = info
        facts = {}
        for name in sorted(set(self.results.machines) | set(newest)):
            machine = dict(self.results.machines.get(name, {}))
            run = newest.get(name, {})
            params = run.get("params", {})
            env_vars = run.get("env_vars", {})
            threads = ", ".join(f"{k}={env_vars[k]}" for k in THREAD_VARS if k in env_vars)
            run_name = run.get("run", name)
            if run_name in self.torch_threads:
                threads = f"torch threads {self.torch_threads[run_name]:g}" + (f" ({threads})" if threads else "")
            torch = params.get("torch") or (run.get("requirements") or {}).get("torch")
            facts[name] = {
                "cpu": machine.get("cpu") or params.get("cpu"),
                "cores": machine.get("num_cpu") or params.get("num_cpu"),
                "ram": machine.get("ram") or params.get("ram"),
                "os": machine.get("os") or params.get("os"),
                "python": run.get("python") or params.get("python"),
                "torch": torch,
                "threads": threads or "not recorded in the results",
                # a GPU run's driver, Python or torch unlike the pins, a dry run (vmapbench.bench.software_facts)
                **{k: machine.get(k) or params.get(k) for k in ("driver", "pins", "dry_run")
                   if machine.get(k) or params.get(k)},
            }
        return facts

    def footer(self) -> str:
        facts = self.machine_facts()
        rows = []
        for name, f in facts.items():
            parts = [f"{k}: {esc(v)}" for k, v in f.items() if v]
            rows.append(f"<li><b>{esc(name)}</b> — {'; '.join(parts)}</li>")
        loaded = len(self.results.files)
        skipped = len(self.results.skipped)
        source = esc(project_path(self.results.results_dir)) if self.results.results_dir else "?"
        machines = f"<ul>{''.join(rows)}</ul>" if rows else ""
        return (f"<p>Results: <code>{source}</code> — {loaded} result files loaded"
                f"{f', {skipped} skipped (see the warning above)' if skipped else ''}.</p>{machines}")

    def measured_note(self) -> str:
        """One sentence on how the times were taken, for each view's explanation."""
        facts = self.machine_facts()
        if not facts:
            return ""
        bits = []
        for name, f in facts.items():
            facts = [f"{esc(f['cores'])} cores" if f["cores"] else "", esc(f["threads"]),
                     f"torch {esc(f['torch'])}" if f["torch"] else ""]
            bits.append(f"<b>{esc(name)}</b> ({', '.join(x for x in facts if x)})")
        return "Measured on " + ", ".join(bits) + "."


def _pair_codes(rows: pd.DataFrame) -> np.ndarray:
    """One integer per (machine, commit) of each row."""
    machine = pd.factorize(rows["machine"])[0].astype(np.int64)
    commit, uniques = pd.factorize(rows["commit"])
    return machine * (len(uniques) + 1) + commit
