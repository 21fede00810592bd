"""`vmapbench time-to-n`: cumulative time from a fresh process to the N-th call, per method.

    vmapbench time-to-n bayes_chain_grads                    # one workload, every curve it has
    vmapbench time-to-n --all --write                        # every workload; results/time_to_n/
    vmapbench time-to-n --fn mymodels:build -m engine,torch_func   # a model the registry lacks

How a curve is measured: workloads/time_to_n.py. The tables of README.md and docs/ are rendered
from a written file by `python -m vmapbench.docs_tables` (kinds `time-to-n`, `time-to-n-headline`,
`time-to-n-compiled`); `python -m vmapbench.headlines` measures every workload at HEAD and renders them.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from vmapbench.commands.options import add_device
from workloads.time_to_n import (DEFAULT_GRACE_S, DEFAULT_MAX_SECONDS, DEFAULT_NS, INDUCTOR_METHODS, RESULTS_DIR,
                                 Curve, curves_of, describe_call, header, markdown, measure,
                                 run_method)


def document(curves: Sequence[Curve], *, ns: Sequence[int], max_seconds: float, threads: int, device: str,
             load: tuple[list[float], list[float]] | None = None, note: str | None = None) -> dict[str, Any]:
    """The results file: where and how it was measured, and every curve."""
    import torch

    from vmapbench.bench import cpu_model, git, machine_name, repo_root

    root = repo_root()
    return {"machine": machine_name(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "commit": git(root, "rev-parse", "HEAD"), "torch": torch.__version__, "python": sys.version.split()[0],
            "threads": threads, "device": device, "ns": list(ns), "max_seconds": max_seconds,
            "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "load_before": load[0] if load else None, "load_after": load[1] if load else None, "note": note,
            "curves": [asdict(c) for c in curves]}


def write(doc: dict[str, Any], root: Path | None = None) -> Path:
    """results/time_to_n/<machine>/<commit8>.json under the repository root `root`, by default the
    results folder `make bench` writes (VMAPBENCH_RESULTS_DIR where set: a GPU dry run's)."""
    from vmapbench.bench import results_dir

    base = results_dir() if root is None else root / "results"
    path = base / RESULTS_DIR / doc["machine"] / f"{doc['commit'][:8]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD", help="registry workloads (or --all, or --fn)")
    parser.add_argument("--all", action="store_true", help="every registry workload")
    parser.add_argument("--family", help="with --all: only this family")
    parser.add_argument("--size", help="size label (one workload); default: its first quick size, else smallest")
    parser.add_argument("--fn", metavar="MODULE:FUNCTION",
                        help="measure a model the registry lacks: FUNCTION(method) returns the measured "
                             "zero-argument call for each method of --methods")
    parser.add_argument("-m", "--methods", default=None,
                        help="comma list of methods (default: the workload's curves; with --fn: engine,torch_func); "
                             "engine+xla, engine+auto, engine+inductor, engine+off: the default path with its fused "
                             "tier on that compiler, or off")
    parser.add_argument("--n", default=",".join(map(str, DEFAULT_NS)),
                        help=f"comma list of N (default {','.join(map(str, DEFAULT_NS))})")
    parser.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS,
                        help=f"a curve stops once its calls took this long in all (default {DEFAULT_MAX_SECONDS:g})")
    parser.add_argument("--min-calls", type=int, default=1, metavar="K",
                        help="every curve makes at least K calls (up to the largest N), whatever --max-seconds "
                             "says (default 1)")
    parser.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S,
                        help=f"a process is killed after --max-seconds plus this (default {DEFAULT_GRACE_S:g})")
    parser.add_argument("--threads", type=int, default=1, help="torch (and XLA) intra-op threads (default 1)")
    add_device(parser)
    parser.add_argument("--first-calls", type=int, default=0, metavar="K",
                        help="print each of the first K calls' own seconds and the packages it imported "
                             "(the lazy imports a call pays; default 0: the snapshots would be timed too)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the float64-loop check that follows each registry curve")
    parser.add_argument("--write", action="store_true",
                        help="store the curves as results/time_to_n/<machine>/<commit8>.json")
    parser.add_argument("--note", help="with --write: a sentence stored with the results (e.g. how loaded the box was)")


def _methods_of(spec: str | None, default: Sequence[str]) -> list[tuple[str, str]]:
    names = [m.strip() for m in spec.split(",") if m.strip()] if spec else list(default)
    out: list[tuple[str, str]] = []
    for m in names:
        out += [(m, "cold"), (m, "warm")] if m in INDUCTOR_METHODS else [(m, "cold")]
    return out


def main(args: argparse.Namespace) -> int:
    ns = [int(n) for n in args.n.split(",") if n.strip()]
    progress = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    jobs: list[tuple[str | None, str | None, list[tuple[str, str]]]] = []
    if args.fn:
        if args.workloads or args.all:
            raise SystemExit("time-to-n: --fn measures a user's function; name no registry workload with it")
        if ":" not in args.fn:
            raise SystemExit(f"time-to-n: --fn {args.fn!r} must be MODULE:FUNCTION")
        jobs.append((None, None, _methods_of(args.methods, ("engine", "torch_func"))))
    else:
        import workloads

        from measuring.sizes import default_size

        if args.all:
            chosen = workloads.all_workloads(args.family)
        elif args.workloads:
            chosen = [workloads.get(n) for n in args.workloads]
        else:
            raise SystemExit("time-to-n: name a workload, or pass --all or --fn MODULE:FUNCTION")
        if args.size and len(chosen) != 1:
            raise SystemExit("time-to-n: --size needs exactly one workload")
        for w in chosen:
            size = args.size or default_size(w)
            w.params(size)  # KeyError naming the valid sizes
            methods = curves_of(w.methods) if not args.methods else _methods_of(args.methods, ())
            unknown = [m for m, _ in methods if not w.supports(run_method(m)[0])]
            if unknown:
                raise SystemExit(f"time-to-n: {w.name} has no method {unknown}; it has {', '.join(w.methods)}")
            jobs.append((w.name, size, methods))
    load_before = list(os.getloadavg())
    curves: list[Curve] = []
    for workload, size, methods in jobs:
        got = measure(workload, size, methods, factory=args.fn, ns=ns, max_seconds=args.max_seconds,
                      threads=args.threads, device=args.device, grace_s=args.grace_s, check=not args.no_check,
                      progress=progress, first_calls=args.first_calls, min_calls=args.min_calls)
        curves += got
        for c in got:
            progress(f"  {c.label}: {c.status} " + " ".join(f"N={n}:{s:.3g}s" for n, s in zip(c.ns, c.seconds))
                     + (f" ({c.note})" if c.note else ""))
            for call in c.first_calls:
                progress(f"    {describe_call(call)}")
    doc = document(curves, ns=ns, max_seconds=args.max_seconds, threads=args.threads, device=args.device,
                   load=(load_before, list(os.getloadavg())), note=args.note)
    print(header(doc))
    print(markdown(doc, curves))
    if args.write:
        print(f"wrote {write(doc)}")
    return 1 if any(c.status in ("failed", "wrong", "killed") for c in curves) else 0
