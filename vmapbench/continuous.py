"""`make continuous BASE=<rev> HEAD=<rev>`: the regression gate between two commits.

    python -m vmapbench.continuous HEAD~1 HEAD
    python -m vmapbench.continuous origin/main HEAD --summary-md "$GITHUB_STEP_SUMMARY"
    python -m vmapbench.continuous HEAD HEAD --plant 1.3    # self-test: must exit 1, naming engine rows

This is `vmapbench gate` without --calibrate (vmapbench/gate.py says how it measures and decides).
It replaced a wrapper of `asv continuous --factor 1.2`, which on this 2-core machine flagged 23
benchmarks a refactor could not touch: one round per commit, the commits one after the other, a
factor applied to raw wall times and memory. Exit codes are asv continuous's: 0 no regression,
1 a gated signal slower beyond its noise floor, 2 a case failed at head; and 3, too noisy to
decide (the run's own noise beyond what its floors can judge, gate.decidable_noise). Its rows are written to
.asv/continuous/<machine>/<base8>-<head8>.json, never to results/ (reference results of
`make bench`, which the dashboard's History draws).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from vmapbench.commands import gate


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vmapbench.continuous", description=__doc__.splitlines()[0])
    gate.configure(p, calibration=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.calibrate = False
    return gate.main(args)


if __name__ == "__main__":
    sys.exit(main())
