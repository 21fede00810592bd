"""ASV results (format version 2) into one tidy pandas DataFrame: one row per measured value.

asv writes `results/<machine>/machine.json`, one `results/<machine>/<commit8>-<env>.json` per commit
and environment, and `results/benchmarks.json` with each benchmark's parameter names and unit. A
result file stores, per benchmark, a row whose columns are named by its `result_columns`; values of
parametrized benchmarks are flattened in the cartesian order of the benchmark's parameter lists.

Everything the dashboard shows comes from the frame built here, so the loader is lenient: a file
that cannot be read or does not hang together is skipped with a warning that names it, unknown
parameter names become columns as they are, and a missing benchmarks.json only costs the names of
the parameters (they become `param0`, `param1`, ...).
"""
from __future__ import annotations

import ast
import functools
import itertools
import json
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workloads.base import parse_size_label

RESULTS_API_VERSION = 2
# Folders under results/ that hold other artifacts, never ASV machine folders.
ARTIFACT_DIRS = frozenset({"coverage", "profiles", "html", "memlimit", "noise"})
# asv results kept apart from the reference results of `make bench` (e.g. of a manual `asv
# continuous`) go to results/continuous/<machine>/...; they load only when asked
# (continuous=True). `make continuous` itself writes gate rows to .asv/continuous/, not here.
CONTINUOUS_DIR = "continuous"
REFERENCE, CONTINUOUS = "reference", "continuous"
# Columns of every tidy frame, in display order; size parameters and unknown parameters follow.
# `run` names one series of results: the machine, and the asv env and kind (reference or
# continuous) where a machine has results of more than one; values of different runs are never
# compared or drawn as one series.
BASE_COLUMNS = [
    "machine", "run", "commit", "date", "env", "kind", "python", "benchmark", "suite", "metric", "unit", "type",
    "workload", "method", "size", "device",
]
# After the stats: `case`, the id of the (benchmark, parameter combination) of the row, the same
# for every commit and machine within one load (group by it instead of every parameter column).
STAT_COLUMNS = [
    "value", "ci_99_a", "ci_99_b", "q_25", "q_75", "number", "repeat", "started_at", "duration",
    "samples",
]
# ASV stats_* result columns -> tidy column names.
_STAT_KEYS = {
    "stats_ci_99_a": "ci_99_a", "stats_ci_99_b": "ci_99_b", "stats_q_25": "q_25",
    "stats_q_75": "q_75", "stats_number": "number", "stats_repeat": "repeat",
}
# What an Estimate's interval is made of (measuring.stats.row_estimate): asv's 99% ci.
_INTERVAL_KEYS = ("stats_ci_99_a", "stats_ci_99_b")
# Parameter names that hold one of the dimensions every view filters on.
_ROLE_NAMES = {
    "workload": ("workload", "workloads", "task", "case"),
    "method": ("method", "methods", "impl", "implementation"),
    "device": ("device", "devices"),
    "size": ("size", "sizes", "shape", "grid"),
}
_ABSENT = sys.maxsize  # position of a column a file does not have
_DEFAULT_UNITS = {"time": "seconds", "peakmem": "bytes", "mem": "bytes"}


class CorruptResultWarning(UserWarning):
    """A results file was skipped because it cannot be read or does not hang together."""


@dataclass
class ResultSet:
    """The tidy frame plus what the dashboard shows around it.

    `frame` has one row per measured value (failed and skipped measurements, which asv stores as
    null/NaN, are dropped); `size_columns` names the numeric size parameters (from size labels
    like 'n=1000,d=64' or from parameters named like them); `machines` holds each machine's
    machine.json; `skipped` lists (path, reason) of every file that was not loaded.
    """

    frame: pd.DataFrame
    size_columns: list[str] = field(default_factory=list)
    machines: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    benchmarks: dict[str, dict[str, Any]] = field(default_factory=dict)
    results_dir: Path | None = None

    @property
    def empty(self) -> bool:
        return self.frame.empty


class _FileError(ValueError):
    """Why one results file cannot be used (becomes the warning's text)."""


def load_results(results_dir: str | Path, *, stats: bool | str = True, continuous: bool = False) -> ResultSet:
    """Read every ASV result file under `results_dir` into a ResultSet (see module docstring).

    A missing or empty directory gives an empty frame; files that cannot be used are skipped with
    a CorruptResultWarning naming the file. `stats=False` leaves the statistics columns (ci,
    quartiles, number, repeat, run times, samples) empty: the dashboard plots the values only and
    loads a third faster without them; `stats="intervals"` keeps only what an interval needs
    (asv's 99% ci and the samples; the dashboard's choice). `continuous=True` also reads results/continuous/<machine>/
    (kind 'continuous', their own runs); by default that folder is left out.
    """
    root = Path(results_dir)
    loader = _Loader(root, stats)
    if root.is_dir():
        loader.read_benchmarks(root / "benchmarks.json")
        for machine_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name != CONTINUOUS_DIR):
            loader.read_machine_dir(machine_dir)
        if continuous and (root / CONTINUOUS_DIR).is_dir():
            for machine_dir in sorted(p for p in (root / CONTINUOUS_DIR).iterdir() if p.is_dir()):
                loader.read_machine_dir(machine_dir, kind=CONTINUOUS)
    return loader.finish()


def load_result_files(paths: list[Path], *, stats: bool | str = "intervals") -> ResultSet:
    """Only the result files `paths` (each in its machine's folder of a results folder, whose
    benchmarks.json names the parameters), read as `load_results` reads them: a docs table of
    a few files does not load the whole history."""
    paths = [Path(p) for p in paths]
    loader = _Loader(paths[0].parent.parent if paths else Path("."), stats)
    if paths:
        loader.read_benchmarks(loader.root / "benchmarks.json")
    for machine_dir in dict.fromkeys(p.parent for p in paths):
        loader.read_machine_dir(machine_dir, names={p.name for p in paths if p.parent == machine_dir})
    return loader.finish()


def run_labels(records: list[dict[str, Any]]) -> list[str]:
    """The `run` of each file record (machine, env, kind): the machine name alone when it is that
    machine's only (env, kind), else 'machine [env]' / 'machine [continuous env]'."""
    seen: dict[str, set[tuple[Any, Any]]] = {}
    for r in records:
        seen.setdefault(r["machine"], set()).add((r.get("env"), r.get("kind")))
    out = []
    for r in records:
        if len(seen[r["machine"]]) == 1:
            out.append(r["machine"])
            continue
        tag = " ".join(str(x) for x in ((CONTINUOUS if r.get("kind") == CONTINUOUS else None), r.get("env"))
                       if x)
        out.append(f"{r['machine']} [{tag or 'no env'}]")
    return out


def load_frame(results_dir: str | Path) -> pd.DataFrame:
    """Just the tidy frame of `load_results` (for export and notebooks)."""
    return load_results(results_dir).frame


@functools.lru_cache(maxsize=4096)
def _literal(text: str) -> Any:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return value if isinstance(value, (str, int, float, bool)) or value is None else text


def parse_param_value(text: Any) -> Any:
    """ASV stores parameter values as their Python repr ("'engine'", "64"); give back the value."""
    return _literal(text) if isinstance(text, str) else text


def metric_of(benchmark: str) -> str:
    """'mod.Class.time_run' -> 'time'; 'mod.Class.track_cuda_peak_bytes' -> 'cuda_peak_bytes'."""
    attr = benchmark.rsplit(".", 1)[-1]
    if attr.startswith("track_"):
        return attr[len("track_"):]
    if attr.endswith("_run"):
        return attr[: -len("_run")]
    return attr


def snake_case(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


class _Loader:
    def __init__(self, root: Path, stats: bool | str = True) -> None:
        self.root = root
        self.stats = stats
        self.benchmarks: dict[str, dict[str, Any]] = {}
        self.machines: dict[str, dict[str, Any]] = {}
        self.skipped: list[tuple[str, str]] = []
        # One entry per loaded file (machine, commit, ...), referenced by row.
        self.file_records: list[dict[str, Any]] = []
        self.file_info: dict[str, dict[str, Any]] = {}
        # One entry per (benchmark, parameter combination), referenced by row.
        self.case_ids: dict[tuple[str, tuple], np.ndarray] = {}
        self.case_records: list[dict[str, Any]] = []
        self.last_params: dict[str, tuple[list[Any], np.ndarray]] = {}
        self.size_columns: dict[str, None] = {}
        # Row columns as one array (one list for samples) per loaded file, concatenated at the end.
        self.chunks: dict[str, list[Any]] = {c: [] for c in ["file", "case", *STAT_COLUMNS]}
        self._workload_names: dict[str, str] | None = None

    # -- reading -----------------------------------------------------------------------------
    def warn(self, path: Path, reason: str) -> None:
        self.skipped.append((str(path), reason))
        warnings.warn(f"skipping {path}: {reason}", CorruptResultWarning, stacklevel=4)

    def read_benchmarks(self, path: Path) -> None:
        if not path.is_file():
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise _FileError("expected a JSON object of benchmarks")
        except (OSError, ValueError) as exc:
            self.warn(path, f"{exc}; parameter names fall back to param0, param1, ... "
                            "(run `asv run --bench just-discover` to rewrite it)")
            return
        self.benchmarks = {k: v for k, v in data.items() if isinstance(v, dict)}

    def read_machine_dir(self, machine_dir: Path, kind: str = REFERENCE, names: set[str] | None = None) -> None:
        result_files = sorted(p for p in machine_dir.glob("*.json") if p.name != "machine.json"
                              and (names is None or p.name in names))
        machine_json = machine_dir / "machine.json"
        if not machine_json.is_file():
            if machine_dir.name not in ARTIFACT_DIRS and result_files:
                self.warn(machine_dir, "no machine.json, so these are not ASV results "
                                       "(asv writes it on the first `asv run` on a machine)")
            return
        try:
            info = json.loads(machine_json.read_text(encoding="utf-8"))
            if not isinstance(info, dict):
                raise _FileError("expected a JSON object")
        except (OSError, ValueError) as exc:
            self.warn(machine_json, f"{exc}; the machine's results load with only its folder name")
            info = {}
        info.pop("version", None)
        name = info.get("machine") if isinstance(info.get("machine"), str) else machine_dir.name
        self.machines.setdefault(name, info)
        for path in result_files:
            try:
                self.read_result_file(path, name, kind)
            except (_FileError, OSError, ValueError, KeyError, TypeError, IndexError) as exc:
                self.warn(path, str(exc) or type(exc).__name__)

    def read_result_file(self, path: Path, machine: str, kind: str = REFERENCE) -> None:
        try:
            data = json.loads(path.read_bytes())
        except ValueError as exc:  # UnicodeDecodeError included
            raise _FileError(f"not valid JSON ({exc}); the file is probably truncated") from None
        if not isinstance(data, dict):
            raise _FileError("expected a JSON object")
        version = data.get("version")
        if version != RESULTS_API_VERSION:
            raise _FileError(f"result format version {version!r}, this loader reads version "
                             f"{RESULTS_API_VERSION} (run `asv update` to convert old results)")
        missing = [k for k in ("commit_hash", "result_columns", "results") if k not in data]
        if missing:
            raise _FileError(f"missing keys {missing}")
        columns = data["result_columns"]
        results = data["results"]
        if not isinstance(columns, list) or not isinstance(results, dict):
            raise _FileError("'result_columns' must be a list and 'results' an object")
        if "result" not in columns or "params" not in columns:
            raise _FileError(f"'result_columns' lacks 'result' or 'params': {columns}")
        col = {name: i for i, name in enumerate(columns)}

        # Parse the whole file before adding anything, so a bad file leaves no partial rows.
        # Per benchmark only list.extend and offsets (no work per value in Python); values become
        # one float array per file, statistics are filled in only where a benchmark has them, and
        # asv's null/NaN values (failed/skipped) are dropped at the end.
        cases: list[np.ndarray] = []
        values: list[Any] = []
        counts: list[int] = []
        scalars: dict[str, list[Any]] = {"started_at": [], "duration": []}
        stats: dict[str, list[tuple[int, list[Any]]]] = {name: [] for name in _STAT_KEYS.values()}
        samples: list[tuple[int, list[Any]]] = []
        # Column positions; asv drops trailing null columns of a row, so rows differ in length.
        at = {name: col.get(name, _ABSENT) for name in ("result", "params", "started_at", "duration", "samples")}
        wanted = _INTERVAL_KEYS if self.stats == "intervals" else _STAT_KEYS
        stat_at = [(col[key], name, key) for key, name in _STAT_KEYS.items() if key in col and key in wanted]
        optional_from = min([i for i, _, _ in stat_at] + [at["samples"]]) if self.stats else _ABSENT
        if self.stats is not True:
            at["started_at"] = at["duration"] = _ABSENT
        started, durations = scalars["started_at"], scalars["duration"]
        for bench, row in results.items():
            if type(row) is not list:
                raise _FileError(f"benchmark {bench!r}: expected a list row")
            width = len(row)
            result = row[at["result"]] if at["result"] < width else None
            if result is None:
                continue  # the whole benchmark failed or was skipped
            params = (row[at["params"]] if at["params"] < width else None) or []
            if type(result) is not list or type(params) is not list:
                raise _FileError(f"benchmark {bench!r}: 'result' and 'params' must be lists")
            n = 1
            for p in params:
                if type(p) is not list:
                    raise _FileError(f"benchmark {bench!r}: 'params' must be a list of lists")
                n *= len(p)
            if len(result) != n:
                raise _FileError(f"benchmark {bench!r}: {len(result)} results for {n} parameter "
                                 "combinations")
            offset = len(values)
            cases.append(self.cases_for(bench, params))
            values.extend(result)
            counts.append(n)
            started.append(row[at["started_at"]] if at["started_at"] < width else None)
            durations.append(row[at["duration"]] if at["duration"] < width else None)
            if width > optional_from:
                for i, name, key in stat_at:
                    if i < width and row[i] is not None:
                        stats[name].append((offset, _per_param(row[i], n, bench, key)))
                if at["samples"] < width and row[at["samples"]] is not None:
                    samples.append((offset, _per_param(row[at["samples"]], n, bench, "samples")))

        try:
            arrays = {"value": np.array(values, dtype=float)}
            for name, segments in stats.items():
                arr = np.full(len(values), np.nan)
                if segments:  # one conversion per column, then scattered to the segments' rows
                    flat_stat = list(itertools.chain.from_iterable(seg for _, seg in segments))
                    where = np.concatenate([np.arange(o, o + len(seg)) for o, seg in segments])
                    arr[where] = np.array(flat_stat, dtype=float)
                arrays[name] = arr
            for name, per_bench in scalars.items():
                arrays[name] = np.repeat(np.array(per_bench, dtype=float), counts)
        except (ValueError, TypeError):
            raise _FileError("non-numeric entries where asv writes numbers") from None
        keep = np.flatnonzero(~np.isnan(arrays["value"]))
        params = data.get("params") if isinstance(data.get("params"), dict) else {}
        record = {
            "machine": machine,
            "commit": str(data["commit_hash"]),
            "date": data.get("date"),
            "env": data.get("env_name"),
            "kind": kind,
            "python": data.get("python"),
        }
        file_id = len(self.file_records)
        self.file_records.append(record)
        self.file_info[str(path)] = {
            **record, "params": params, "requirements": data.get("requirements") or {},
            "env_vars": data.get("env_vars") or {},
        }
        if cases:
            self.chunks["case"].append(np.concatenate(cases)[keep])
        self.chunks["file"].append(np.full(len(keep), file_id, dtype=np.int64))
        for name, arr in arrays.items():
            self.chunks[name].append(arr[keep])
        if samples:
            flat: list[Any] = [None] * len(values)
            for offset, segment in samples:
                flat[offset:offset + len(segment)] = segment
            self.chunks["samples"].append([flat[i] for i in keep])
        else:
            self.chunks["samples"].append(len(keep))  # as many rows without samples

    # -- cases: one per (benchmark, parameter combination) -------------------------------------
    def cases_for(self, bench: str, params: list[list[Any]]) -> np.ndarray:
        # Consecutive files nearly always repeat a benchmark's parameters: one list comparison.
        last = self.last_params.get(bench)
        if last is not None and last[0] == params:
            return last[1]
        try:
            key = (bench, tuple(map(tuple, params)))
            ids = self.case_ids.get(key)
        except TypeError:  # unhashable parameter values: fall back to their text
            key = (bench, tuple(tuple(str(v) for v in p) for p in params))
            ids = self.case_ids.get(key)
        if ids is not None:
            self.last_params[bench] = (params, ids)
            return ids
        meta = self.benchmarks.get(bench, {})
        names = meta.get("param_names") or []
        if len(names) != len(params):
            names = [f"param{i}" for i in range(len(params))]
        base = self.describe_benchmark(bench, meta)
        ids = []
        for combo in itertools.product(*params):
            record = dict(base)
            for name, raw in zip(names, combo):
                self.assign_param(record, str(name), parse_param_value(raw))
            if record.get("workload") is None:
                record["workload"] = self.workload_from_name(bench)
            if record.get("size") is None:
                # Sizes given as separate numeric parameters still get a label for tables.
                dims = [(k, record[k]) for k in record if k in self.size_columns]
                record["size"] = ",".join(f"{k}={v}" for k, v in dims) or None
            ids.append(len(self.case_records))
            self.case_records.append(record)
        self.case_ids[key] = np.asarray(ids, dtype=np.int64)
        self.last_params[bench] = (params, self.case_ids[key])
        return self.case_ids[key]

    def describe_benchmark(self, bench: str, meta: dict[str, Any]) -> dict[str, Any]:
        attr = bench.rsplit(".", 1)[-1]
        kind = meta.get("type") or attr.split("_", 1)[0]
        metric = metric_of(bench)
        unit = meta.get("unit") or _DEFAULT_UNITS.get(kind) or _DEFAULT_UNITS.get(metric, "")
        suite = bench.rsplit(".", 1)[0] if "." in bench else ""
        return {"benchmark": bench, "suite": suite, "metric": metric, "unit": unit, "type": kind,
                "workload": None, "method": None, "size": None, "device": None}

    def assign_param(self, record: dict[str, Any], name: str, value: Any) -> None:
        role = next((r for r, names in _ROLE_NAMES.items() if name.lower() in names), None)
        if role == "size" or (role is None and isinstance(value, str) and _looks_like_size(value)):
            record["size"] = value if role == "size" else (
                f"{record['size']},{value}" if record.get("size") else value)
            if isinstance(value, str) and "=" in value:
                for key, part in parse_size_label(value).items():
                    column = key if key not in BASE_COLUMNS and key not in STAT_COLUMNS else f"size_{key}"
                    record[column] = part
                    if isinstance(part, (int, float)):
                        self.size_columns[column] = None
            return
        if role is not None:
            record[role] = None if value is None else str(value)
            return
        column = name if name not in BASE_COLUMNS and name not in STAT_COLUMNS else f"param_{name}"
        record[column] = value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # A bare numeric parameter ('n', 'batch', 'chunk_size') is a size dimension too.
            self.size_columns[column] = None

    def workload_from_name(self, bench: str) -> str | None:
        """Benchmarks without a workload parameter: match the class/module name to the registry."""
        parts = bench.split(".")[:-1]
        if not parts:
            return None
        names = self.workload_names()
        for part in reversed(parts):
            hit = names.get(_normalize(part))
            if hit:
                return hit
        return snake_case(parts[-1]) if len(parts) > 1 else None

    def workload_names(self) -> dict[str, str]:
        if self._workload_names is None:
            try:
                from workloads import all_workloads
                self._workload_names = {_normalize(w.name): w.name for w in all_workloads()}
            except Exception:  # the registry is optional context for naming, never required
                self._workload_names = {}
        return self._workload_names

    # -- the frame ---------------------------------------------------------------------------
    def finish(self) -> ResultSet:
        size_columns = list(self.size_columns)
        n_rows = sum(len(c) for c in self.chunks["file"])
        if n_rows == 0:
            frame = pd.DataFrame({c: pd.Series(dtype=object) for c in BASE_COLUMNS + STAT_COLUMNS + ["case"]})
            for column in STAT_COLUMNS[:-1]:
                frame[column] = frame[column].astype(float)
            frame["case"] = frame["case"].astype(np.int64)
            frame["date"] = pd.to_datetime(frame["date"], utc=True)
            frame["started_at"] = pd.to_datetime(frame["started_at"], utc=True)
            return ResultSet(frame, [], self.machines, self.file_info, self.skipped,
                             self.benchmarks, self.root)
        files = pd.DataFrame(self.file_records)
        files["run"] = run_labels(self.file_records)
        for info, run in zip(self.file_info.values(), files["run"]):
            info["run"] = run
        files["date"] = _js_time(files["date"])
        cases = pd.DataFrame(self.case_records)
        for column in size_columns:
            cases[column] = pd.to_numeric(cases[column], errors="coerce")
        file_idx = np.concatenate(self.chunks["file"])
        case_idx = np.concatenate(self.chunks["case"])
        parts: dict[str, Any] = {"case": case_idx}
        # Row columns are the small file and case tables indexed by row: text columns become
        # categoricals (codes taken per row, no string copied), numbers and dates plain arrays.
        for table, idx in ((files, file_idx), (cases, case_idx)):
            for column in table.columns:
                parts[column] = _take(table[column], idx)
        for column in STAT_COLUMNS[:-1]:
            parts[column] = np.concatenate(self.chunks[column])
        parts["started_at"] = _js_time(parts["started_at"]).array
        samples = np.full(n_rows, None, dtype=object)
        offset = 0
        for chunk in self.chunks["samples"]:
            if isinstance(chunk, int):
                offset += chunk
            else:
                for i, sample in enumerate(chunk, start=offset):  # element-wise: numpy would
                    samples[i] = sample                            # read equal-length lists as 2-D
                offset += len(chunk)
        parts["samples"] = samples
        extra = [c for c in parts if c not in BASE_COLUMNS and c not in STAT_COLUMNS and c != "case"]
        ordered = BASE_COLUMNS + [c for c in extra if c in size_columns] + \
            [c for c in extra if c not in size_columns] + STAT_COLUMNS + ["case"]
        frame = pd.DataFrame({c: parts[c] for c in ordered}, copy=False)
        return ResultSet(frame, size_columns, self.machines, self.file_info, self.skipped,
                         self.benchmarks, self.root)


def _take(column: pd.Series, idx: np.ndarray) -> Any:
    """`column[idx]`, as a categorical with sorted categories when it holds text."""
    if pd.api.types.is_datetime64_any_dtype(column):
        return column.array.take(idx)  # keeps the time zone (to_numpy would box Timestamps)
    if pd.api.types.is_numeric_dtype(column):
        return column.to_numpy()[idx]
    try:
        codes, uniques = pd.factorize(column, sort=True)
    except TypeError:  # values of mixed types cannot be sorted: keep first-seen order
        codes, uniques = pd.factorize(column)
    # Narrow the (small) code table before gathering a million rows from it.
    small = codes.astype(np.int8 if len(uniques) < 127 else np.int16 if len(uniques) < 32767 else np.int32)
    return pd.Categorical.from_codes(small[idx], categories=uniques, validate=False)


def _js_time(values: Any) -> pd.Series:
    """asv's JavaScript timestamps (ms since the epoch) as UTC datetimes; bad entries become NaT."""
    return pd.to_datetime(pd.to_numeric(pd.Series(values), errors="coerce"), unit="ms", utc=True)


def _per_param(value: Any, n: int, bench: str, key: str) -> list[Any]:
    if value is None:
        return [None] * n
    if not isinstance(value, list) or len(value) != n:
        raise _FileError(f"benchmark {bench!r}: {key!r} does not have one entry per parameter "
                         f"combination ({n})")
    return value


def _looks_like_size(value: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_]\w*=[^,=]+(,[A-Za-z_]\w*=[^,=]+)*", value))


def _normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())

