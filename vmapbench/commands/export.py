"""`vmapbench export`: ASV results as one tidy table (one row per measured value), CSV or JSON lines."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vmapbench.commands.options import add_results, results_found


def configure(parser: argparse.ArgumentParser) -> None:
    add_results(parser)
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="write CSV (the default)")
    fmt.add_argument("--jsonl", action="store_true", help="write JSON lines")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="file to write (default: standard output)")
    parser.add_argument("--continuous", action="store_true",
                        help="also export asv results kept apart in RESULTS/continuous/<machine>/ "
                             "(column kind = continuous)")
    parser.add_argument("--samples", action="store_true",
                        help="keep the raw samples column (a list per row; off by default)")


def main(args: argparse.Namespace) -> int:
    from dashboards.loader import load_results

    if not results_found("export", args.results):
        return 2
    result = load_results(args.results, continuous=args.continuous)
    if result.empty:
        print(f"vmapbench export: no ASV results under {args.results} (no <machine>/machine.json "
              "with result files beside it): nothing to export.", file=sys.stderr)
        return 1
    frame = result.frame
    if not args.samples:
        frame = frame.drop(columns=["samples"])
    target = args.output if args.output is not None else sys.stdout
    if args.jsonl:
        frame.to_json(target, orient="records", lines=True, date_format="iso")
        if args.output is None:
            sys.stdout.write("\n")
    else:
        frame.to_csv(target, index=False)
    if args.output is not None:
        print(f"wrote {len(frame)} rows from {len(result.files)} result files to {args.output}",
              file=sys.stderr)
    if result.skipped:
        print(f"{len(result.skipped)} files skipped (see the warnings above)", file=sys.stderr)
    return 0
