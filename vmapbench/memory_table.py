"""`python -m vmapbench.memory_table`: every quick workload x method's memory per call, in fresh processes.

Each of `--processes` fresh interpreters builds every quick case on cpu, makes each method's
warm-up calls and takes its memory per call (measuring.memory.method_peak_bytes: torch's
allocator peak, XLA's analysis for jax). The table shows the bytes and whether every process gave
the same; the exit code is 1 where one did not, 2 where a method failed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]


def measure_all(only: Sequence[str] = ()) -> dict[str, int | str]:
    """'workload|size|method' -> bytes per call (or 'error: ...'), for every quick cpu case."""
    import torch

    from measuring import memory
    from suite import probes
    from workloads.base import iter_cases

    torch.set_num_threads(probes.requested_threads())
    out: dict[str, int | str] = {}
    states: dict[tuple[str, str], object] = {}
    for w, method, size, device in iter_cases(quick=True):
        if only and w.name not in only:
            continue
        key = f"{w.name}|{size}|{method}"
        try:
            probes.require_method(method)
        except NotImplementedError:
            continue
        try:
            if (w.name, size) not in states:
                states[w.name, size] = w.setup(w.params(size), device)
            state = states[w.name, size]
            w.prepare(method, state)
            w.run(method, state)
            out[key] = memory.method_peak_bytes(state.fn(method), method, device)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out[key] = f"error: {type(exc).__name__}: {exc}".splitlines()[0][:200]
    return out


def _format(value: int | str) -> str:
    if isinstance(value, str):
        return value
    return f"{value / 2**20:.2f} MiB" if value >= 2**20 else f"{value / 1024:.1f} KiB"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vmapbench.memory_table", description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=3, help="fresh interpreters to compare (default 3)")
    p.add_argument("--workloads", default="", help="comma list of workloads (default: every quick one)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    only = [n for n in args.workloads.split(",") if n]
    if args.child:
        print(json.dumps(measure_all(only)))
        return 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    runs = []
    for i in range(args.processes):
        print(f"memory_table: process {i + 1}/{args.processes}", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, "-m", "vmapbench.memory_table", "--child", "--workloads", args.workloads],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 2
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    keys = list(dict.fromkeys(k for run in runs for k in run))
    width = max((len(k) for k in keys), default=10)
    print(f"{'workload|size|method':<{width}}  {'memory/call':>12}  same in {args.processes} processes")
    differ = failed = 0
    for key in keys:
        values = [run.get(key, "missing") for run in runs]
        same = all(v == values[0] for v in values)
        differ += not same
        failed += any(isinstance(v, str) for v in values)
        print(f"{key:<{width}}  {_format(values[0]):>12}  {'yes' if same else 'NO: ' + ', '.join(map(_format, values))}")
    print(f"\n{len(keys)} cases, {len(keys) - differ} identical in every process, {differ} not, {failed} failed "
          "(memory/call: torch's allocator peak; jax: XLA's compiled memory analysis, total)")
    return 2 if failed else 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
