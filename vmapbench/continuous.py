"""`make continuous BASE=<rev> HEAD=<rev>`: `asv continuous` between two commits, with our defaults.

    python -m vmapbench.continuous BASE HEAD [--factor 1.2] [--family NAME] [--profile quick]

Defaults: the quick profile (the registry's quick sizes, on cpu), the virtualenv environment of
asv.conf.json (each commit installed into .asv/env; the environment is created once, ~40-90 s,
and reused), a factor of 1.2 and the machine name `make bench` uses. Families can also be chosen
with VMAPBENCH_FAMILY=a,b (what CI shards use through make).

asv continuous stops before its comparison when a benchmark failed; this wrapper then prints the
comparison with `asv compare` and the failed benchmarks, and exits with asv's code either way
(0: no significant change or only improvements; 1: PERFORMANCE DECREASED; 2: a benchmark failed).
`track_speedup_vs_loop` is left out: asv ranks every value "lower is better", and a speedup is not.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

from vmapbench.bench import (
    NaRowFilter,
    asv,
    bench_env,
    git,
    load_selection,
    machine_name,
    param_values,
    register_machine,
    repo_root,
    run_outcome,
    stream,
)

FAMILY_ENV = "VMAPBENCH_FAMILY"
DEFAULT_FACTOR = 1.2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vmapbench.continuous", description=__doc__.splitlines()[0])
    p.add_argument("base", help="the commit compared against (e.g. origin/main, HEAD~1)")
    p.add_argument("head", help="the commit tested (e.g. HEAD)")
    p.add_argument("--factor", type=float, default=DEFAULT_FACTOR,
                   help=f"ratio above which a change is reported (default {DEFAULT_FACTOR})")
    p.add_argument("--profile", choices=("quick", "full"), default="quick")
    p.add_argument("--family", action="append", default=[],
                   help=f"only this family (repeatable; default: ${FAMILY_ENV} or all)")
    p.add_argument("--device", action="append", choices=("cpu", "cuda"), default=[])
    p.add_argument("--machine", default=None, help="machine name (default: as make bench)")
    p.add_argument("asv_args", nargs="*", help="extra arguments for `asv continuous` (after --)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    root = repo_root()
    selection = load_selection(root)
    families = args.family or [f for f in os.environ.get(FAMILY_ENV, "").split(",") if f.strip()]
    devices = args.device or None
    env = bench_env(args.profile, devices, root)
    try:
        regexes = selection.bench_regexes(args.profile, families or None, devices,
                                          exclude_metrics=selection.HIGHER_IS_BETTER)
    except ValueError as exc:
        raise SystemExit(f"continuous: {exc}") from None
    machine = args.machine or machine_name()
    register_machine(machine, env)
    try:
        base, head = git(root, "rev-parse", args.base), git(root, "rev-parse", args.head)
    except Exception:  # noqa: BLE001 - git's own message is on stderr
        raise SystemExit(f"continuous: cannot resolve {args.base!r} and {args.head!r} to commits") from None

    print(f"continuous: {args.base} ({base[:8]}) -> {args.head} ({head[:8]}), factor {args.factor}, "
          f"profile {args.profile}, families {','.join(families) or 'all'}, machine {machine}", flush=True)
    started = time.time()
    row_filter = NaRowFilter(param_values(selection))
    cmd = asv("continuous", "--factor", str(args.factor), "--machine", machine, "--split",
              *[f"--bench={r}" for r in regexes], *args.asv_args, base, head)
    rc, output = stream(cmd, env, root, row_filter)

    if rc != 0 and "BENCHMARKS" not in output:
        # asv continuous returns before comparing when a benchmark failed: compare what was kept.
        print("\ncontinuous: a benchmark failed; the comparison of the results that were kept:", flush=True)
        stream(asv("compare", "--factor", str(args.factor), "--machine", machine, "--split",
                   "--environment", "virtualenv", base, head), env, root, row_filter)
    measured, failed = run_outcome(root / "results", machine, head, started * 1000 - 1000, regexes,
                                   env_prefix="virtualenv")
    if failed:
        print(f"\ncontinuous: {len(failed)} benchmarks failed at {head[:8]}:")
        for point in failed:
            print(f"  {point}")
    print(f"continuous: asv exited {rc} after {(time.time() - started) / 60:.1f} min")
    return rc


if __name__ == "__main__":
    sys.exit(main())
