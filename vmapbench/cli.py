"""The `vmapbench` console script.

Each subcommand lives in its own module, which defines `configure(parser)` (adds its arguments)
and `main(args) -> int`. Modules are imported lazily so that `vmapbench list` does not pay for
plotly or the OpInfo database.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# subcommand -> (module, one-line help). One table: adding a subcommand is one line here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "list": ("vmapbench.cmd_list", "list workloads, their methods and parameter grids"),
    "run": ("vmapbench.cmd_run", "run one workload's methods side by side and print a table"),
    "profile": ("vmapbench.profile", "profile one workload/method with py-spy, torch.profiler and NVML"),
    "dashboard": ("dashboards.cli", "build the offline HTML dashboard from ASV results"),
    "export": ("dashboards.export_cli", "export ASV results as one tidy CSV table"),
    "coverage": ("vmapbench.cmd_coverage", "run the OpInfo conformance harness and write a coverage report"),
    "compliance": ("vmapbench.compliance", "check a workload for vmap composite compliance"),
    "gate": ("vmapbench.gate", "regression gate between two commits; --calibrate measures its own error rates"),
    "memlimit": ("vmapbench.memlimit", "largest batch each per-sample-gradient method fits in a memory budget"),
    "time-to-n": ("vmapbench.time_to_n", "cumulative time from a fresh process to the N-th call, per method"),
    "fused-backends": ("vmapbench.fused_backends", "the fused tier's compilers side by side on the recorded graphs"),
}


def build_parser(load: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vmapbench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if load is None or name in load:
            importlib.import_module(module).configure(p)
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
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
