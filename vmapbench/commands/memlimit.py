"""`vmapbench memlimit`: the largest batch each per-sample-gradient method fits in a memory budget
(how it searches and probes: vmapbench/memlimit.py)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterable

from vmapbench.commands.options import add_device
from vmapbench.memlimit import (DEFAULT_BUDGET, GUIDED_PROBES, MAX_JUMP, default_threads, parse_bytes, result_path,
                                 resumable_rows, run_experiment, write_result)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", default=DEFAULT_BUDGET, help=f"memory budget per probe (default {DEFAULT_BUDGET})")
    add_device(parser)
    parser.add_argument("--workload", "-w", action="append", dest="workloads", metavar="W",
                        help="workload (repeatable or comma-separated); default: every per-sample-gradient workload")
    parser.add_argument("--method", "-m", action="append", dest="methods", metavar="M",
                        help="method (repeatable or comma-separated); default: each workload's all")
    parser.add_argument("--start", type=int, default=16, help="first batch probed (default 16)")
    parser.add_argument("--cap", type=int, default=16384, help="largest batch probed (default 16384)")
    parser.add_argument("--growth", type=int, default=4,
                        help="factor the batch grows by while probes fit and no prediction applies (default 4)")
    parser.add_argument("--precision", type=float, default=0.25,
                        help="stop bisecting when the bracket is within this relative width (default 0.25)")
    parser.add_argument("--probe-timeout", type=float, default=60.0, help="seconds before a probe counts as too slow")
    parser.add_argument("--machine", default=None, help="machine name (default: as `make bench` names it)")
    parser.add_argument("--no-write", dest="write", action="store_false", help="print only; write no result file")
    parser.add_argument("--force", action="store_true",
                        help="search every pair again (default: resume, skipping pairs already in this commit's file)")


def _split(items: Iterable[str] | None) -> list[str]:
    return [x for item in items or () for x in item.split(",") if x]


def main(args: argparse.Namespace) -> int:
    from vmapbench.bench import git, machine_name, repo_root

    budget = parse_bytes(args.budget)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda needs CUDA; torch.cuda.is_available() is False here", file=sys.stderr)
            return 2
    root = repo_root()
    machine, commit = args.machine or machine_name(), git(root, "rev-parse", "HEAD")
    threads = default_threads()
    path = result_path(root, machine, commit)
    done: list[dict[str, Any]] = []
    earlier_s = 0.0
    if args.write and not args.force:
        settings = {"device": args.device, "budget_bytes": budget, "threads": threads,
                    "probe_timeout_s": args.probe_timeout,
                    "search": {"start": args.start, "cap": args.cap, "growth": args.growth, "precision": args.precision,
                               "guided_probes": GUIDED_PROBES, "max_jump": MAX_JUMP}}
        try:
            done = resumable_rows(path, settings)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        earlier_s = json.loads(path.read_text()).get("elapsed_s", 0.0) if done else 0.0

    def with_earlier(document: dict[str, Any]) -> dict[str, Any]:
        return {**document, "elapsed_s": round(document["elapsed_s"] + earlier_s, 1)}

    def save(document: dict[str, Any]) -> None:
        if args.write:
            write_result(with_earlier(document), root, machine, commit)
    result = run_experiment(budget, args.device, _split(args.workloads), _split(args.methods), args.start, args.cap,
                            args.precision, args.probe_timeout, threads=threads, log=lambda s: print(s, flush=True),
                            on_row=save, done=done, growth=args.growth)
    print(f"memlimit: {len(result['rows'])} rows, {result['elapsed_s']:.0f} s in this run (budget {budget / 2**30:.2f} GiB)")
    if args.write:
        print(f"wrote {write_result(with_earlier(result), root, machine, commit)}")
    return 0
