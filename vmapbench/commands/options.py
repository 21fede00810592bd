"""Options several commands share, defined once so that they read and default alike."""
from __future__ import annotations

import argparse

DEVICES: tuple[str, ...] = ("cpu", "cuda")


def add_device(parser: argparse.ArgumentParser, help: str = "device (default cpu)") -> None:
    """`--device cpu|cuda`, default cpu: the one device a command measures on."""
    parser.add_argument("--device", default="cpu", choices=DEVICES, help=help)


def add_devices(parser: argparse.ArgumentParser, help: str) -> None:
    """`--device cpu|cuda`, repeatable (a list, empty when not given): the devices a run covers."""
    parser.add_argument("--device", action="append", choices=DEVICES, default=[], help=help)
