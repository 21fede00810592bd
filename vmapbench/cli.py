"""The `vmapbench` console script.

Each subcommand is a module of vmapbench/commands/, named for it (`time-to-n`:
vmapbench/commands/time_to_n.py), which defines `configure(parser)` (adds its arguments) and
`main(args) -> int`. Modules are imported lazily so that `vmapbench list` does not pay for plotly
or the OpInfo database.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# subcommand -> one-line help. One table: adding a subcommand is a line here and a module in commands/.
SUBCOMMANDS: dict[str, str] = {
    "list": "list workloads, their methods and parameter grids",
    "run": "run one workload's methods side by side and print a table",
    "profile": "profile one workload/method with py-spy, torch.profiler and NVML",
    "dashboard": "build the offline HTML dashboard from ASV results",
    "export": "export ASV results as one tidy CSV table",
    "coverage": "run the OpInfo conformance harness and write a coverage report",
    "compliance": "check a workload for vmap composite compliance",
    "gate": "regression gate between two commits; --calibrate measures its own error rates",
    "memlimit": "largest batch each per-sample-gradient method fits in a memory budget",
    "time-to-n": "cumulative time from a fresh process to the N-th call, per method",
    "fused-backends": "the fused tier's compilers side by side on the recorded graphs",
}


def command_module(name: str) -> str:
    """The module of subcommand `name`."""
    return f"vmapbench.commands.{name.replace('-', '_')}"


def build_parser(load: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vmapbench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if load is None or name in load:
            importlib.import_module(command_module(name)).configure(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    # Only the chosen subcommand's module is imported; --help on the top level imports none.
    parser = build_parser(load=[command] if command in SUBCOMMANDS else [])
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(command_module(args.command))
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
