"""`vmapbench gate BASE HEAD`, `vmapbench gate --calibrate`: the regression gate between two commits, and
its calibration (how it measures and decides: vmapbench/gate.py)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from measuring import stats
from vmapbench.gate import (OUT_DIR, PLANTS, calibrate, compare_commits, default_json, print_calibration, report,
                            resolve)


def configure(p: argparse.ArgumentParser, calibration: bool = True) -> None:
    p.add_argument("base", nargs="?", default="HEAD~1", help="the commit compared against (default HEAD~1)")
    p.add_argument("head", nargs="?", default="HEAD", help="the commit tested (default HEAD)")
    p.add_argument("--machine", default=None, help="machine name for the noise floors (default: as make bench)")
    p.add_argument("--summary-md", type=Path, default=None,
                   help="append a markdown summary (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--json", type=Path, default=None,
                   help=f"write every row as JSON (default {OUT_DIR}/<machine>/<base8>-<head8>.json)")
    p.add_argument("--plant", type=float, default=None, metavar="FACTOR",
                   help="slow head by FACTOR in its temporary copy (self-test, e.g. 1.1), where --plant-at says")
    p.add_argument("--plant-at", default="engine", metavar="TARGET",
                   help="what --plant slows: engine (every engine call, default), transform:NAME (e.g. "
                        "transform:hessian), workloads:PATTERNS (e.g. 'workloads:nn_*,bayes_*,tutorial_*'); "
                        "memory:PATTERNS makes those workloads' calls hold FACTOR x their allocator peak instead")
    p.add_argument("--no-counts", action="store_true", help="skip the instruction-count signals (no valgrind run)")
    if not calibration:
        return
    p.add_argument("--calibrate", action="store_true",
                   help="run A/A and planted-slowdown comparisons of HEAD, print the rates, write the noise floors")
    p.add_argument("--aa", type=int, default=5, help="--calibrate: A/A runs on the machine as it is")
    p.add_argument("--aa-busy", type=int, default=5, help="--calibrate: A/A runs with one core kept busy")
    p.add_argument("--planted", type=int, default=3, help="--calibrate: runs of each planted slowdown")
    p.add_argument("--plants", default=",".join(PLANTS),
                   help=f"--calibrate: which planted slowdowns (default {','.join(PLANTS)}: "
                        + "; ".join(f"{k} {f}x at {a}" for k, (f, a) in PLANTS.items()) + ")")
    p.add_argument("--keep-floors", action="store_true",
                   help="--calibrate: do not rewrite the noise floors (check the existing ones on fresh runs)")
    p.add_argument("--record", type=Path, default=None, metavar="FILE",
                   help="--calibrate: also append every run to FILE (e.g. results/gate/<machine>/checks.json, "
                        "which the docs render)")


def main(args: argparse.Namespace) -> int:
    from vmapbench.bench import machine_name, repo_root

    root = repo_root()
    machine = args.machine or machine_name()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress lines as they come
    counts_off = "--no-counts given: instruction-count signals skipped" if args.no_counts else None
    if getattr(args, "calibrate", False):
        started = time.time()
        out = root / OUT_DIR / machine / f"calibration-{time.strftime('%Y%m%d-%H%M%S')}.json"
        result = calibrate(root, machine, args.aa, args.aa_busy, args.planted,
                           [p for p in args.plants.split(",") if p], write=not args.keep_floors, progress=out,
                           record=args.record)
        print_calibration(result["summary"])
        out.write_text(json.dumps(result, indent=1))
        print(f"calibrate: {(time.time() - started) / 60:.1f} min; details in {out}")
        return 0
    base_sha, head_sha = resolve(root, args.base), resolve(root, args.head)
    print(f"gate: {args.base} ({base_sha[:8]}) -> {args.head} ({head_sha[:8]})"
          + (f" with a planted {args.plant}x {'memory' if args.plant_at.startswith('memory:') else 'slowdown'}"
             f" at {args.plant_at}" if args.plant else "")
          + f", machine {machine}" + ("" if stats.load_calibration(machine, root) else
                                      " (no calibration file: time floors from this run's twin-vs-base spread)"),
          flush=True)
    started = time.time()
    result = compare_commits(root, base_sha, head_sha, machine, plant=args.plant, plant_at=args.plant_at,
                             counts_off=counts_off)
    json_out = args.json or default_json(root, machine, base_sha, head_sha)
    report(result, args.base, args.head, args.summary_md, json_out)
    print(f"gate: exit {result.exit_code} after {(time.time() - started) / 60:.1f} min; rows in {json_out}")
    return result.exit_code
