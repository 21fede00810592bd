"""`vmapbench dashboard`: build the offline HTML dashboard and print the path of its index.html."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vmapbench.commands.options import add_results, results_found


def configure(parser: argparse.ArgumentParser) -> None:
    from dashboards.builder import DEFAULT_OUT

    add_results(parser)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output folder, created or refreshed (default: {DEFAULT_OUT})")
    parser.add_argument("--continuous", action="store_true",
                        help="also show asv results kept apart in RESULTS/continuous/<machine>/ (e.g. "
                             "of a manual `asv continuous`), each machine/env as its own run; left "
                             "out by default (`make continuous` writes to .asv/continuous/, not here)")


def main(args: argparse.Namespace) -> int:
    from dashboards.builder import build_dashboard

    if not results_found("dashboard", args.results):
        return 2
    result = build_dashboard(args.results, args.out, continuous=args.continuous)
    figures = sum(result.pages.values())
    print(f"dashboard: {result.files} result files, {result.rows} values, {figures} figures on "
          f"{len(result.pages)} pages in {result.seconds:.1f} s"
          + (f"; {len(result.skipped)} files skipped (warnings above)" if result.skipped else ""),
          file=sys.stderr)
    print(result.index.resolve())
    return 0
