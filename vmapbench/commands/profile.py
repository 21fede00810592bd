"""`vmapbench profile`: where the time goes for one workload and one method, without a script
(what one run leaves and how it is taken: vmapbench/profiling/session.py)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from vmapbench.commands.options import add_device
from vmapbench.profiling.session import PROFILES_DIR, TOOLS, ProfileError, Profiler, make_plan, output_dir, print_report


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="workload name (see `vmapbench list`)")
    parser.add_argument("--method", "-m", required=True, help="method to profile, e.g. engine or torch_func")
    add_device(parser)
    parser.add_argument("--size", help="size label as `vmapbench list` prints it, e.g. 'n=100,d=8' "
                        "(default: the workload's first quick size, else its first size)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long the measured call runs in a loop under py-spy (default 10)")
    parser.add_argument("--tool", choices=TOOLS, default="all", help="profilers to run (default all)")
    parser.add_argument("--out", type=Path, help=f"output folder (default {PROFILES_DIR}/<timestamp>-<workload>-<method>)")
    parser.add_argument("--native", action="store_true", help="py-spy --native: include C/C++ frames (torch internals)")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second (default 100)")
    parser.add_argument("--torch-calls", type=int, default=5,
                        help="calls recorded by torch.profiler (default 5; fewer if --seconds runs out)")
    parser.add_argument("--top", type=int, default=15, help="rows of the top-ops tables (default 15)")
    parser.add_argument("--py-spy", dest="py_spy", metavar="PATH", help="py-spy executable to use")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (in this process and the profiled one), e.g. to register "
                             "an out-of-tree workload; repeatable")


def main(args: argparse.Namespace) -> int:
    console = Console()
    try:
        plan = make_plan(args)
        out = output_dir(plan, args.out)
    except ProfileError as exc:
        Console(stderr=True).print(f"[bold red]vmapbench profile: error:[/] {exc}", highlight=False)
        return exc.exit_code
    profiler = Profiler(plan, out, console)
    try:
        summary = profiler.run()
    except KeyboardInterrupt:
        summary = profiler.summary
        summary["errors"].append("interrupted (Ctrl-C); what was collected so far is in this folder")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_report(summary, console)
    if summary["errors"]:
        return 130 if summary["errors"][-1].startswith("interrupted") else 1
    return 0
