"""`vmapbench fused-backends`: the fused tier's compilers side by side on the graphs the default
path records (how each graph is measured: vmapbench/fused_backends.py)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from vmapbench.fused_backends import BACKENDS, ROUNDS, _run_child, table


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD", help="registry workloads (default: the quick ones)")
    parser.add_argument("--fn", metavar="MODULE:FUNCTION", help="FUNCTION('engine') returns the call to measure")
    parser.add_argument("--backends", default="xla", help=f"comma list of {', '.join(BACKENDS)} (default xla)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"timed rounds per graph (default {ROUNDS})")
    parser.add_argument("--threads", type=int, default=1, help="torch (and XLA) intra-op threads (default 1)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per workload's process (default 1800)")
    parser.add_argument("--write", action="store_true", help="store the rows under results/fused_backends/")


def _specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise SystemExit(f"fused-backends: unknown backends {sorted(unknown)}; choose from {', '.join(BACKENDS)}")
    base = {"backends": backends, "rounds": args.rounds, "threads": args.threads}
    if args.fn:
        if args.workloads or ":" not in args.fn:
            raise SystemExit("fused-backends: --fn MODULE:FUNCTION measures a user's model; name no workload with it")
        return [{**base, "fn": args.fn}]
    import workloads

    from measuring.sizes import default_size

    chosen = [workloads.get(n) for n in args.workloads] if args.workloads else [
        w for w in workloads.all_workloads() if "engine" in w.quick_methods and w.quick]
    missing = [w.name for w in chosen if "engine" not in w.methods]
    if missing:
        raise SystemExit(f"fused-backends: {', '.join(missing)} have no `engine` method")
    return [{**base, "workload": w.name, "size": default_size(w)} for w in chosen]


def main(args: argparse.Namespace) -> int:
    specs = _specs(args)
    rows: list[dict[str, Any]] = []
    for i, spec in enumerate(specs, 1):
        print(f"[{i}/{len(specs)}] {spec.get('workload') or spec.get('fn')}", file=sys.stderr, flush=True)
        rows += _run_child(spec, args.timeout)
    backends = specs[0]["backends"] if specs else []
    print(table(rows, backends))
    if args.write:
        from vmapbench.bench import git, machine_name, repo_root, results_dir

        root = repo_root()
        commit = git(root, "rev-parse", "HEAD")
        path = results_dir(root) / "fused_backends" / machine_name() / f"{commit[:8]}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        import torch

        from datetime import datetime, timezone

        from measuring.machine import cpu_model

        doc = {"machine": machine_name(), "cpu": cpu_model(), "cores": os.cpu_count(), "commit": commit,
               "torch": torch.__version__, "threads": args.threads,
               "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "backends": backends, "rows": rows}
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0 if all(r.get("graph") is not None for r in rows) else 2
