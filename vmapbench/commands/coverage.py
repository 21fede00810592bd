"""`vmapbench coverage`: run the OpInfo harness, write results/coverage/*.json, print the table."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", default=None, help="comma-separated op keys to run (default: every float32 CPU op)")
    parser.add_argument("--samples", type=int, default=None, help="at most this many sample inputs per op (default: all)")
    parser.add_argument("--time-box", type=float, default=2.0,
                        help="seconds per op after which no further sample starts (default 2; 0: no limit)")
    parser.add_argument("--no-torch-func", action="store_true", help="skip the torch.func reference column")
    parser.add_argument("--vjp", action="store_true", help="also run the vmap-over-vjp column (slower)")
    parser.add_argument("--out-dir", type=Path, default=None, help="where to write the JSON (default results/coverage)")
    parser.add_argument("--no-write", action="store_true", help="print only; write no report")
    parser.add_argument("--show-ops", action="store_true", help="print the per-op table too")
    parser.add_argument("--update-expectations", action="store_true", help="rewrite tests/opinfo_expectations.json from this run")


def unknown_ops(names: list[str]) -> list[str]:
    """The names that are not the key of an OpInfo entry run on float32 CPU, each with close matches."""
    import difflib

    from engine.coverage.harness import iter_opinfos, op_key

    keys = {op_key(o) for o in iter_opinfos()}
    out = []
    for name in names:
        if name not in keys:
            close = difflib.get_close_matches(name, sorted(keys), n=3)
            out.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    return out


def main(args: argparse.Namespace) -> int:
    from vmapbench import coverage_report as rep
    from engine.coverage.expectations import PINNED, update
    from engine.coverage.harness import run_harness

    names = [n.strip() for n in args.ops.split(",") if n.strip()] if args.ops else None
    if names is not None:
        unknown = unknown_ops(names)
        if unknown:
            print(f"vmapbench coverage: --ops names {', '.join(unknown)}, which no float32 CPU OpInfo entry has; "
                  f"op keys look like 'sin', 'nn.functional.linear', 'linalg.svd' (the 'op' column of --show-ops)",
                  file=sys.stderr)
            return 2
    done = [0]

    def progress(r) -> None:
        done[0] += 1
        if sys.stderr.isatty() or done[0] % 50 == 0:
            print(f"\r{done[0]} ops ({r.op})".ljust(60), end="" if sys.stderr.isatty() else "\n", file=sys.stderr, flush=True)

    samples, time_box = args.samples, args.time_box or None
    if args.update_expectations:
        samples, time_box = PINNED["samples"], PINNED["time_box"]
        print(f"--update-expectations: running under the pinned settings ({samples} samples per op, no time box)",
              file=sys.stderr)
    t0 = time.perf_counter()
    results = run_harness(names, samples=samples, time_box=time_box, torch_func=not args.no_torch_func, vjp=args.vjp, progress=progress)
    seconds = time.perf_counter() - t0
    print(file=sys.stderr)
    if not results:
        print(f"vmapbench coverage: no OpInfo entry matched --ops {args.ops!r}; see op names in the report", file=sys.stderr)
        return 2
    report = rep.build_report(results, seconds)
    if not args.no_write:
        path = rep.write_report(report, args.out_dir or rep.DEFAULT_DIR)
        print(f"wrote {path}")
    if args.update_expectations:
        update(results)
        print("updated tests/opinfo_expectations.json")
    rep.print_report(report, show_ops=args.show_ops)
    print(f"harness time: {seconds:.1f} s")
    return 0
