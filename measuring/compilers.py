"""The rows of a `vmapbench fused-backends` run (results/fused_backends/<machine>/<commit8>.json)
read as a table: per recorded graph, each backend's compile seconds, its call over the replay's
and its difference from the replay; per backend, a summary. The docs table and the dashboard's
Compilers page are both drawn from these cells.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from measuring import stats

FOLDER = "fused_backends"


def head(backends: list[str]) -> list[str]:
    out = ["workload", "graph", "ops", "inputs", "replay µs"]
    for b in backends:
        out += [f"{b} compile s", f"{b} / replay", f"{b} difference"]
    return out


def outcome(row: dict[str, Any], backend: str) -> dict[str, Any] | None:
    """The backend's result on the row's graph, with `ratio` (its call over the replay's) and
    `faster` (it agreed and beat the replay) where it compiled; None where the row has none."""
    got = row.get(backend)
    if not got:
        return None
    if got.get("error") is not None or "call_s" not in got:
        return {**got, "ratio": None, "faster": False}
    ratio = got["call_s"] / row["replay_s"]
    return {**got, "ratio": ratio, "faster": got.get("agrees") is not False and ratio < 1.0}


def cells(row: dict[str, Any], backends: list[str]) -> list[str]:
    """One graph's row as text cells (a failed measuring process: its reason in the fifth cell)."""
    if row.get("graph") is None:
        return [str(row["workload"]), "-", "-", "-", str(row.get("error"))] + [""] * (3 * len(backends))
    out = [str(row["workload"]), str(row["graph"]), str(row["ops"]), str(row["inputs"]), f"{row['replay_s'] * 1e6:.1f}"]
    for b in backends:
        got = outcome(row, b)
        if got is None:
            out += ["-", "-", "-"]
        elif got["ratio"] is None:
            out += [f"{got['compile_s']:.2f}", "refused", str(got.get("error"))[:60]]
        else:
            wrong = " (disagrees)" if got.get("agrees") is False else ""
            out += [f"{got['compile_s']:.2f}", f"{got['ratio']:.2f}{wrong}", f"{got['difference']:.1e}"]
    return out


def summary(rows: list[dict[str, Any]], backend: str) -> dict[str, Any]:
    """Over the graphs measured: the median compile of those the backend compiled, how many of its
    programs agreed and beat the replay, how many it refused."""
    graphs = [r for r in rows if r.get("graph") is not None]
    got = [o for o in (outcome(r, backend) for r in graphs) if o is not None]
    built = [o for o in got if o["ratio"] is not None]
    return {"graphs": len(graphs), "median_compile_s": stats.estimate([o["compile_s"] for o in built]).value if built else None,
            "faster": sum(o["faster"] for o in built), "refused": len(got) - len(built)}


def summary_cells(rows: list[dict[str, Any]], backends: list[str]) -> list[str]:
    out = ["all graphs", str(sum(r.get("graph") is not None for r in rows)), "", "", ""]
    for b in backends:
        s = summary(rows, b)
        out += [f"median {s['median_compile_s']:.2f}" if s["median_compile_s"] is not None else "-",
                f"faster on {s['faster']}", f"refused {s['refused']}"]
    return out


def newest(results: Path) -> list[Path]:
    """Each machine's most recently written run under `results`/fused_backends/."""
    out = []
    for machine in sorted(p for p in (results / FOLDER).glob("*") if p.is_dir()):
        runs = sorted(machine.glob("*.json"), key=lambda p: json.loads(p.read_text()).get("written_at", ""))
        if runs:
            out.append(runs[-1])
    return out
