"""Options several commands share, defined once so that they read and default alike."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEVICES: tuple[str, ...] = ("cpu", "cuda")


def add_device(parser: argparse.ArgumentParser, help: str = "device (default cpu)") -> None:
    """`--device cpu|cuda`, default cpu: the one device a command measures on."""
    parser.add_argument("--device", default="cpu", choices=DEVICES, help=help)


def add_devices(parser: argparse.ArgumentParser, help: str) -> None:
    """`--device cpu|cuda`, repeatable (a list, empty when not given): the devices a run covers."""
    parser.add_argument("--device", action="append", choices=DEVICES, default=[], help=help)


def add_results(parser: argparse.ArgumentParser) -> None:
    """`--results DIR`, default the repository's results/: the ASV results a command reads."""
    from dashboards.builder import DEFAULT_RESULTS

    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                        help=f"ASV results folder (default: {DEFAULT_RESULTS})")


def results_found(command: str, results: Path) -> bool:
    """Whether `results` is a folder; where it is not, says so on stderr and what to do."""
    if results.is_dir():
        return True
    print(f"vmapbench {command}: no results folder {results}: run `make bench` first, or "
          "pass --results DIR (the folder holding <machine>/machine.json and benchmarks.json).",
          file=sys.stderr)
    return False
