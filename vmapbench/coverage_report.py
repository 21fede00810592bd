"""`vmapbench coverage`'s report of engine/coverage/harness.py's results: the JSON written to
results/coverage/ (with the commit measured) and the rich console table.

JSON shape (the dashboard reads it): {"torch_version", "engine_commit", "created", "ops": [{"op",
"family", "engine", "torch_func", "vjp_engine"?, ...}], "summary": {...}}.
"""
from __future__ import annotations

import datetime as _dt
import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import torch

from engine.coverage.harness import STATUSES, OpResult

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO / "results" / "coverage"


def engine_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def summarize(results: Sequence[OpResult], seconds: float | None = None) -> dict[str, Any]:
    """Counts per status per column, and the headline: native+correct ops, engine vs torch.func."""
    summary: dict[str, Any] = {"ops": len(results)}
    for col in ("engine", "torch_func", "vjp_engine"):
        counts = Counter(getattr(r, col) for r in results if getattr(r, col) is not None)
        if counts:
            summary[col] = {s: counts.get(s, 0) for s in STATUSES}
    summary["headline"] = {
        "engine_native_correct": summary.get("engine", {}).get("native", 0),
        "torch_func_native_correct": summary.get("torch_func", {}).get("native", 0),
        "engine_native_only": sum(1 for r in results if r.engine == "native" and r.torch_func != "native"),
        "torch_func_native_only": sum(1 for r in results if r.torch_func == "native" and r.engine != "native"),
    }
    if seconds is not None:
        summary["seconds"] = round(seconds, 1)
    return summary


def build_report(results: Sequence[OpResult], seconds: float | None = None) -> dict[str, Any]:
    return {
        "torch_version": torch.__version__,
        "engine_commit": engine_commit(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "ops": [r.as_dict() for r in results],
        "summary": summarize(results, seconds),
    }


def write_report(report: dict[str, Any], out_dir: Path = DEFAULT_DIR) -> Path:
    """Write coverage-<date>.json and latest.json; returns the dated path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = out_dir / f"coverage-{stamp}.json"
    text = json.dumps(report, indent=1, sort_keys=False)
    path.write_text(text)
    (out_dir / "latest.json").write_text(text)
    return path


_STYLE = {"native": "green", "fallback": "yellow", "mismatch": "bold red", "error": "red", "skip": "dim"}


def _cell(status: str | None) -> str:
    """A status in its colour; '-' (plain) for a column that was not run. An empty rich style
    tag would print literally as '[]'."""
    if not status:
        return "-"
    style = _STYLE.get(status)
    return f"[{style}]{status}[/]" if style else status


def print_report(report: dict[str, Any], *, show_ops: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if show_ops:
        t = Table(title="per-op status")
        for c in ("op", "family", "engine", "torch.func", "vjp"):
            t.add_column(c)
        for o in report["ops"]:
            t.add_row(o["op"], o["family"], *(_cell(o.get(k)) for k in ("engine", "torch_func", "vjp_engine")))
        console.print(t)
    s = report["summary"]
    t = Table(title=f"OpInfo coverage ({s['ops']} ops, torch {report['torch_version']}, engine {report['engine_commit']})")
    t.add_column("column")
    for st in STATUSES:
        t.add_column(st, justify="right", style=_STYLE[st])
    for col, label in (("engine", "engine.vmap"), ("torch_func", "torch.func.vmap"), ("vjp_engine", "engine vmap(vjp)")):
        if col in s:
            t.add_row(label, *(str(s[col][st]) for st in STATUSES))
    console.print(t)
    h = s["headline"]
    console.print(
        f"headline: engine native+correct [bold]{h['engine_native_correct']}[/] vs torch.func "
        f"[bold]{h['torch_func_native_correct']}[/]  (engine-only {h['engine_native_only']}, torch.func-only {h['torch_func_native_only']})"
    )
