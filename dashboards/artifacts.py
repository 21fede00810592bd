"""The non-ASV inputs of the dashboard: the engine's OpInfo coverage report, profile folders, the
memory-limit experiment and the peer comparison (`python -m vmapbench.peer_ratios --write`).

All are optional. `make coverage` writes results/coverage/<name>.json; `make profile` writes one
folder per profiled case under results/profiles/, each with a summary.json next to its artifacts.
"""
from __future__ import annotations

import datetime as _dt
import json
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from dashboards.loader import CorruptResultWarning

COVERAGE_STATUSES = ("native", "fallback", "error", "mismatch", "skip")
COVERAGE_SIDES = ("engine", "torch_func")


@dataclass
class CoverageReport:
    """One coverage report: per-op status of the engine and of torch.func, grouped by family."""

    path: Path
    ops: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    others: list[Path] = field(default_factory=list)

    def counts(self, side: str) -> dict[str, dict[str, int]]:
        """family -> status -> number of ops, for side 'engine' or 'torch_func'."""
        out: dict[str, dict[str, int]] = {}
        for op in self.ops:
            status = str(op.get(side) or "skip")
            family = str(op.get("family") or "other")
            out.setdefault(family, {}).setdefault(status, 0)
            out[family][status] += 1
        return out


@dataclass
class ProfileEntry:
    name: str
    path: Path
    summary: dict[str, Any]
    files: list[Path]
    error: str | None = None


def _newest_reports(folder: Path, what: str, key: str, item_key: str) -> Iterator[tuple[Path, dict, list, list[Path]]]:
    """The readable reports of `folder`/*.json, newest first (modification time, then name), as
    (path, data, data[key], every candidate path); a file whose `key` is not a list of objects
    with an `item_key` is skipped with a CorruptResultWarning naming it and saying it is no `what`."""
    candidates = sorted(folder.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name), reverse=True)
    for path in candidates:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            items = data[key]
            if not isinstance(items, list) or not all(isinstance(o, dict) and item_key in o for o in items):
                raise ValueError(f"'{key}' must be a list of objects with an '{item_key}' key")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            warnings.warn(f"skipping {path}: not a {what} ({exc})", CorruptResultWarning, stacklevel=3)
            continue
        yield path, data, items, candidates


def load_coverage(results_dir: str | Path) -> CoverageReport | None:
    """The newest readable results/coverage/*.json, or None when there is none."""
    for path, data, ops, candidates in _newest_reports(Path(results_dir) / "coverage", "coverage report", "ops", "op"):
        meta = {k: v for k, v in data.items() if k != "ops"}
        return CoverageReport(path, ops, meta, [p for p in candidates if p != path])
    return None


def load_torch_coverage(results_dir: str | Path) -> dict[str, CoverageReport]:
    """torch version -> the newest readable report of results/coverage/torch-<version>/ (what
    `.ci/torch-versions` runs write: the OpInfo coverage of one engine commit under each torch)."""
    out = {}
    for folder in sorted((Path(results_dir) / "coverage").glob("torch-*")):
        for path, data, ops, candidates in _newest_reports(folder, "coverage report", "ops", "op"):
            meta = {k: v for k, v in data.items() if k != "ops"}
            out[folder.name[len("torch-"):]] = CoverageReport(path, ops, meta, [p for p in candidates if p != path])
            break
    return out


def list_profiles(results_dir: str | Path) -> list[ProfileEntry]:
    """Every results/profiles/<name>/ folder with its summary.json (when readable) and files."""
    root = Path(results_dir) / "profiles"
    entries = []
    for folder in sorted(p for p in root.glob("*") if p.is_dir()):
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        summary: dict[str, Any] = {}
        error = None
        summary_path = folder / "summary.json"
        if summary_path.is_file():
            try:
                loaded = json.loads(summary_path.read_text(encoding="utf-8"))
                summary = loaded if isinstance(loaded, dict) else {"summary": loaded}
            except (OSError, ValueError) as exc:
                error = f"summary.json unreadable: {exc}"
        else:
            error = "no summary.json"
        entries.append(ProfileEntry(folder.name, folder, summary, files, error))
    return entries


@dataclass(frozen=True)
class Staleness:
    """How far a report lags the checkout it is shown in: commits and days behind HEAD."""

    commit: str
    head: str | None
    commits_behind: int | None  # None: the report's commit is not in this repository's history
    days: float | None

    def note(self) -> str:
        """One sentence for the page ('' when the report is of HEAD itself)."""
        if self.head is None:
            return ""
        if self.commits_behind == 0:
            return ""
        age = f" and {self.days:.1f} days" if self.days is not None else ""
        if self.commits_behind is None:
            return (f"The report is of engine commit {self.commit}, which is not in this checkout's "
                    f"history (HEAD {self.head[:8]}){age.replace(' and', ', made')} before HEAD: "
                    "regenerate it with <code>make coverage</code>.")
        return (f"The report is {self.commits_behind} commits{age} older than HEAD "
                f"({self.commit} → {self.head[:8]}): regenerate it with <code>make coverage</code>.")


def _git(repo: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def coverage_staleness(report: CoverageReport, repo: Path) -> Staleness | None:
    """Commits and days between the report's `engine_commit` and `repo`'s HEAD (None when the
    report names no commit or `repo` is not a git checkout)."""
    commit = report.meta.get("engine_commit") or report.meta.get("commit")
    if not isinstance(commit, str) or not commit:
        return None
    head = _git(repo, "rev-parse", "HEAD")
    if head is None:
        return None
    behind = _git(repo, "rev-list", "--count", f"{commit}..HEAD")
    head_date = _git(repo, "log", "-1", "--format=%cI", "HEAD")
    created = report.meta.get("created")
    if not isinstance(created, str):
        created = _git(repo, "log", "-1", "--format=%cI", commit)
    days = None
    if created and head_date:
        try:
            delta = _dt.datetime.fromisoformat(head_date) - _dt.datetime.fromisoformat(created)
            days = max(delta.total_seconds() / 86400, 0.0)
        except ValueError:
            days = None
    return Staleness(commit, head, int(behind) if behind and behind.isdigit() else None, days)


MEMLIMIT_DIR = "memlimit"
MEMLIMIT_COLUMNS = ["machine", "commit", "torch", "device", "budget_bytes", "probe_timeout_s", "precision", "workload",
                    "method", "size", "max_batch", "time_at_max_s", "status", "reason", "limited_by", "file"]


def load_memlimit(results_dir: str | Path) -> pd.DataFrame:
    """The memory-limit experiment (results/memlimit/<machine>/<commit8>.json, see
    vmapbench/memlimit.py): one row per (workload, method, size) of each machine's newest file.

    An absent folder gives an empty frame; a file that is not such a report is skipped with a
    CorruptResultWarning naming it. 'Newest' is the latest `written_at` the files record, then the
    latest modification time (a fresh clone gives every file about the same one, in name order)."""
    root = Path(results_dir) / MEMLIMIT_DIR
    frames = []
    for machine_dir in sorted(p for p in root.glob("*") if p.is_dir()):
        reports = []
        for path in sorted(machine_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                rows = data["rows"]
                if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                    raise ValueError("'rows' must be a list of objects")
                head = {k: data.get(k) for k in ("machine", "commit", "torch", "device", "budget_bytes",
                                                 "probe_timeout_s")}
                head["precision"] = (data.get("search") or {}).get("precision")
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                warnings.warn(f"skipping {path}: not a memory-limit report ({exc})", CorruptResultWarning,
                              stacklevel=2)
                continue
            reports.append(((str(data.get("written_at") or ""), path.stat().st_mtime, path.name), path, head, rows))
        if not reports:
            continue
        _, path, head, rows = max(reports, key=lambda r: r[0])
        head["machine"] = head["machine"] or machine_dir.name
        frame = pd.DataFrame(rows)
        for key, value in head.items():
            frame[key] = value
        frame["file"] = str(path)
        frames.append(frame.reindex(columns=MEMLIMIT_COLUMNS))
    if not frames:
        return pd.DataFrame(columns=MEMLIMIT_COLUMNS)
    return pd.concat(frames, ignore_index=True)


PEER_RATIOS_DIR = "peer_ratios"


@dataclass
class PeerReport:
    """One machine's newest peer comparison (results/peer_ratios/<machine>/<commit8>.json)."""

    machine: str
    commit: str
    threads: Any
    rows: list[dict[str, Any]]
    path: Path
    device: str = "cpu"  # reports written before `--device` existed ran on the CPU


def load_peer_ratios(results_dir: str | Path) -> list[PeerReport]:
    """Per machine, its newest readable peer_ratios report (by the file's modification time, then
    name); a file that is not such a report is skipped with a CorruptResultWarning naming it."""
    root = Path(results_dir) / PEER_RATIOS_DIR
    out = []
    for machine_dir in sorted(p for p in root.glob("*") if p.is_dir()):
        for path, data, rows, _ in _newest_reports(machine_dir, "peer_ratios report", "rows", "workload"):
            out.append(PeerReport(str(data.get("machine") or machine_dir.name), str(data.get("commit") or ""),
                                  data.get("threads"), rows, path, str(data.get("device") or "cpu")))
            break
    return out
