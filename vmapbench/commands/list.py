"""`vmapbench list`: every registered workload with its family, methods and parameter grid.

The grid column gives each parameter's values (the sizes are their product); the quick column
names the sizes the quick profile (`make bench`) runs (and the methods it leaves out there, if
any), the heavy column the memory-heavy sizes it must skip. `--describe` adds each workload's one-line description.
"""
from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

import workloads


def make_console() -> Console:
    """A rich console; when stdout is not a terminal, wide enough that tables are not folded."""
    return Console() if sys.stdout.isatty() else Console(width=160)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", help="only this family (e.g. hessians, per_sample_grads)")
    parser.add_argument("--quick", action="store_true", help="only workloads in the quick profile")
    parser.add_argument("--describe", action="store_true", help="add each workload's description")


def grid_cell(workload: workloads.Workload) -> str:
    return "\n".join(f"{key}: {', '.join(map(str, values))}" for key, values in workload.grid.items())


def quick_cell(workload: workloads.Workload) -> str:
    if not workload.quick:
        return "-"
    left_out = f"\n(without {', '.join(workload.not_in_quick)})" if workload.not_in_quick else ""
    return "\n".join(workload.quick) + left_out


def main(args: argparse.Namespace) -> int:
    console = make_console()
    if args.family is not None and args.family not in workloads.families():
        console.print(f"[red]unknown family {args.family!r}[/]; valid families: {', '.join(workloads.families())}")
        return 2
    table = Table(title="vmapbench workloads", show_lines=True)
    columns = ["workload", "family", "methods", "grid", "quick", "heavy"] + (["description"] if args.describe else [])
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=column == "workload")
    shown = 0
    for w in workloads.all_workloads(args.family):
        if args.quick and not w.quick:
            continue
        row = [w.name, w.family, ", ".join(w.methods), grid_cell(w), quick_cell(w), "\n".join(w.heavy) or "-"]
        table.add_row(*row, *([w.description] if args.describe else []))
        shown += 1
    console.print(table)
    sizes = sum(len(w.sizes) for w in workloads.all_workloads(args.family))
    console.print(f"{shown} workloads, {sizes} sizes; devices: cpu, cuda (cuda cases are skipped without a GPU).")
    return 0
