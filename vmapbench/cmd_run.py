"""`vmapbench run WORKLOAD`: run a workload's methods side by side at one size and print a table.

The fastest way to see one comparison: median time, speedup against the loop, time ratio
against torch.func and peak memory growth, all measured in this one process. The first call
(where tracing or compiling happens) is shown apart from the timed calls.
"""
from __future__ import annotations

import argparse
import traceback

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import workloads
from workloads import measure
from vmapbench.cmd_list import make_console
from workloads.base import BASELINE, REFERENCE


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="workload name (see `vmapbench list`)")
    parser.add_argument("--method", "-m", action="append", dest="methods", metavar="M",
                        help="method to run (repeatable, or comma-separated); default: all of the workload's")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device (default cpu)")
    parser.add_argument("--size", help="size label, e.g. 'n=1000,d=64'; default: the first quick size")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per method (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls after the first (default 1)")
    parser.add_argument("--check", action="store_true", help="also check each method against the float64 loop")
    parser.add_argument("--traceback", action="store_true", help="print the traceback of a failing method")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory call")


def format_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def format_bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _resolve(args: argparse.Namespace, console: Console) -> tuple[workloads.Workload, list[str], str] | None:
    try:
        w = workloads.get(args.workload)
    except KeyError as e:
        console.print(f"[red]error:[/] {e.args[0]}")
        return None
    methods = [m for item in args.methods or w.methods for m in item.split(",") if m]
    unknown = [m for m in methods if m not in w.methods]
    if unknown:
        console.print(f"[red]error:[/] workload {w.name!r} has no method {', '.join(map(repr, unknown))}; "
                      f"valid methods: {', '.join(w.methods)}")
        return None
    size = args.size or (w.quick[0] if w.quick else w.sizes[0])
    if size not in w.sizes:
        console.print(f"[red]error:[/] workload {w.name!r} has no size {size!r}; valid sizes: {', '.join(w.sizes)}")
        return None
    if args.device not in w.devices:
        console.print(f"[red]error:[/] workload {w.name!r} does not run on {args.device!r}; "
                      f"its devices: {', '.join(w.devices)}")
        return None
    if args.repeat < 1 or args.warmup < 0:
        console.print("[red]error:[/] --repeat must be >= 1 and --warmup >= 0")
        return None
    return w, list(dict.fromkeys(methods)), size


def main(args: argparse.Namespace) -> int:
    console = make_console()
    resolved = _resolve(args, console)
    if resolved is None:
        return 2
    w, methods, size = resolved
    try:
        state = w.setup(w.params(size), args.device)
    except NotImplementedError as e:
        console.print(f"[yellow]skipped:[/] {e}")
        return 2

    results: dict[str, measure.Measurement] = {}
    failures: dict[str, str] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        label = escape(f"{w.name} [{size}]")
        task = progress.add_task(label, total=len(methods))
        for method in methods:
            note = " (compiling, ~30 s)" if method in workloads.COMPILED_METHODS else ""
            progress.update(task, description=f"{label} {method}{note}")
            try:
                results[method] = measure.measure(w, method, size, state, repeat=args.repeat,
                                                  warmup=args.warmup, memory=args.memory)
                if args.check:
                    w.check(state, [method])
            except Exception as e:  # one broken method must not hide the others' figures
                failures[method] = f"{type(e).__name__}: {e}".splitlines()[0]
                if args.traceback:
                    progress.console.print(escape(traceback.format_exc()))
            progress.advance(task)

    console.print(results_table(w, size, args.device, methods, args.repeat, results, failures, args.memory))
    for method, reason in failures.items():
        console.print(f"[red]{method} failed:[/] {escape(reason)}")
    if args.check and not failures:
        console.print("check: every method matches the float64 loop within the workload's tolerance")
    return 1 if failures else 0


def results_table(w: workloads.Workload, size: str, device: str, methods: list[str], repeat: int,
                  results: dict[str, measure.Measurement], failures: dict[str, str], memory: bool) -> Table:
    loop = results.get(BASELINE)
    ref = results.get(REFERENCE)
    table = Table(title=escape(f"{w.name} [{size}] on {device}: median of {repeat} calls"))
    table.add_column("method", no_wrap=True)
    table.add_column("first call", justify="right")
    table.add_column("median", justify="right")
    table.add_column(f"speedup vs {BASELINE}", justify="right")
    table.add_column(f"time / {REFERENCE}", justify="right")
    table.add_column("peak mem Δ" if memory else "", justify="right")
    for method in methods:
        if method in failures:
            table.add_row(method, "", "[red]failed[/]", "", "", "")
            continue
        r = results[method]
        speedup = f"{loop.median_s / r.median_s:.2f}x" if loop else "-"
        ratio = f"{r.median_s / ref.median_s:.2f}" if ref else "-"
        table.add_row(method, format_seconds(r.first_call_s), format_seconds(r.median_s), speedup, ratio,
                      format_bytes(r.peak_bytes) if memory else "")
    return table
