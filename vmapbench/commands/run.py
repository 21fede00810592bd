"""`vmapbench run WORKLOAD`: run a workload's methods side by side at one size and print a table.

The fastest way to see one comparison: median time, speedup against the loop, time ratio
against torch.func and memory per call (torch's allocator peak; jax: XLA's compiled program), all
measured in this one process. The first call
(where tracing or compiling happens) is shown apart from the timed calls, which are taken
round-robin across methods so that load on a shared machine hits every method alike.

Before any method is measured, the process's one-time costs (torch._dynamo, sympy, the peers'
packages, jax: whatever the chosen methods import) are paid by a warm-up, the one the ASV suite
runs (suite.probes.preload), and the time it took is printed: otherwise the first method would be
charged for them, and its first call would depend on the order of `-m`.
"""
from __future__ import annotations

import argparse
import contextlib
import time
import traceback
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import engine
import workloads
from engine import autotrace
from measuring import timer
from measuring.measurement import Measurement
from measuring.memory import method_peak_bytes
from vmapbench.commands.list import make_console
from vmapbench.commands.options import add_device
from workloads.base import BASELINE, REFERENCE
from workloads.peers import PeerUnavailable

# Prefix of a method's entry in `failures` when its peer package is missing: shown as skipped.
SKIPPED = "skipped: "


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="workload name (see `vmapbench list`)")
    parser.add_argument("--method", "-m", action="append", dest="methods", metavar="M",
                        help="method to run (repeatable, or comma-separated; `opacus` means every Opacus mode the workload has); default: all of the workload's")
    add_device(parser)
    parser.add_argument("--size", help="size label, e.g. 'n=1000,d=64'; default: the first quick size")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per method (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls, the first included (default 2)")
    parser.add_argument("--check", action="store_true", help="also check each method against the float64 loop")
    parser.add_argument("--traceback", action="store_true", help="print the traceback of a failing method")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory call")
    parser.add_argument("--verify", action="store_true",
                        help="shadow-verify automatic tracing: every replay of the engine also runs its eager call and "
                             "must equal it (engine.auto_tracing(verify=True)); a mismatch fails the method")


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
    methods = [m for item in args.methods or w.methods for name in item.split(",") if name
               for m in expand_method(w, name)]
    unknown = [m for m in methods if not w.supports(m)]
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
    if args.repeat < 1 or args.warmup < 1:
        console.print("[red]error:[/] --repeat and --warmup must be >= 1 (the first call is a warm-up call)")
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

    warm_up(methods, args.device, console)
    checked, rounding = autotrace.shadow_checks, autotrace.rounding_only
    with engine.auto_tracing(verify=True) if args.verify else contextlib.nullcontext():
        results, failures = run_methods(w, methods, size, state, args, console)
    if args.verify:
        verdict = "a mismatch (see the failures below)" if any("ReplayMismatchError" in str(f) for f in failures.values()) else "no mismatch"
        rounded = autotrace.rounding_only - rounding
        note = f" ({rounded} differed in rounding alone, as the replay contract allows)" if rounded else ""
        console.print(f"verify: {autotrace.shadow_checks - checked} replays checked against their eager calls, {verdict}{note}")
    console.print(results_table(w, size, args.device, methods, args.repeat, results, failures, args.memory))
    if args.memory and results:
        console.print(MEMORY_NOTE)
    skipped = {m: reason for m, reason in failures.items() if reason.startswith(SKIPPED)}
    for method, reason in failures.items():
        if method in skipped:
            console.print(f"[yellow]{method} skipped:[/] {escape(reason[len(SKIPPED):])}")
        else:
            console.print(f"[red]{method} failed:[/] {escape(reason)}")
    failures = {m: r for m, r in failures.items() if m not in skipped}
    if args.check and not failures:
        console.print("check: every method matches the float64 loop within the workload's tolerance")
    return 1 if failures else 0


def warm_up(methods: list[str], device: str, console: Console) -> list[str]:
    """Pay the process's one-time imports and first transforms for `methods` before measuring any
    of them (suite.probes.preload, as the ASV suite does), and say so; returns what was warmed."""
    try:
        from suite import probes
    except ImportError as e:
        console.print(f"[yellow]warning:[/] no warm-up ({escape(str(e))}; the suite package is needed): the "
                      "first method's first call includes the process's one-time imports")
        return []
    start = time.perf_counter()
    with console.status("warm-up: one-time imports (torch._dynamo, sympy, peers, jax) before measuring"):
        warmed = probes.preload(methods, device)
    console.print(f"warm-up: {format_seconds(time.perf_counter() - start)} for the process's one-time imports and "
                  f"first transforms ({', '.join(warmed)}), paid before measuring: no first call includes them")
    return warmed


# A tool's name stands for all its methods the workload offers (`-m opacus`: every Opacus mode).
METHOD_GROUPS: dict[str, str] = {"opacus": "opacus_"}


def expand_method(w: workloads.Workload, name: str) -> list[str]:
    """`name` as the methods it means on `w`: itself, or a tool's methods (`opacus` -> opacus_*)."""
    prefix = METHOD_GROUPS.get(name)
    if prefix is None or w.supports(name):
        return [name]
    return [m for m in w.methods if m.startswith(prefix)] or [name]


def run_methods(w: workloads.Workload, methods: list[str], size: str, state: object, args: argparse.Namespace,
                console: Console) -> tuple[dict[str, Measurement], dict[str, str]]:
    """First call (trace/compile) and warm-up of each method, then timed calls round-robin, then memory.

    Timing round-robin keeps the ratios fair on a shared machine; a failing method is reported
    and left out instead of hiding the others' figures.
    """
    device = getattr(state, "device", args.device)
    failures: dict[str, str] = {}
    first: dict[str, float] = {}
    peaks: dict[str, int] = {}

    def attempt(method: str, step: Callable[[], None]) -> None:
        try:
            step()
        except PeerUnavailable as e:  # a peer whose package is not installed: a skip, not a failure
            failures[method] = f"{SKIPPED}{e}"
        except Exception as e:  # noqa: BLE001 - reported per method below the table
            failures[method] = f"{type(e).__name__}: {e}".splitlines()[0]
            if args.traceback:
                progress.console.print(escape(traceback.format_exc()))

    def prepare(method: str) -> None:
        first[method] = w.prepare(method, state)
        for _ in range(args.warmup - 1):
            state.fn(method)()
        if args.check:
            w.check(state, [method])

    label = escape(f"{w.name} [{size}]")
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task(label, total=len(methods) * (2 if args.memory else 1) + args.repeat)
        for method in methods:
            note = " (compiling, ~30 s)" if method in workloads.COMPILED_METHODS else ""
            progress.update(task, description=f"{label} first call: {method}{note}")
            attempt(method, lambda: prepare(method))
            progress.advance(task)
        ok = [m for m in methods if m not in failures]
        progress.update(task, description=f"{label} timing {len(ok)} methods round-robin")
        times = timer.rounds({m: state.fn(m) for m in ok}, args.repeat, device=device,
                             stop=lambda *_: progress.advance(task))
        for method in ok if args.memory else []:
            progress.update(task, description=f"{label} peak memory: {method}")
            attempt(method, lambda: peaks.__setitem__(method, method_peak_bytes(state.fn(method), method, device)))
            progress.advance(task)
    results = {
        m: Measurement(w.name, m, size, str(device), first[m], times[m], peaks.get(m, 0))
        for m in ok if m not in failures
    }
    return results, failures


MEMORY_NOTE = ("memory/call: peak bytes of tensors one call allocated and held at once, counted at torch's "
               "allocator (CUDA: the caching allocator's peak); jax: XLA's compiled memory analysis of the "
               "jitted program (temporaries + outputs + arguments). See docs/guide/memory.md.")


def results_table(w: workloads.Workload, size: str, device: str, methods: list[str], repeat: int,
                  results: dict[str, Measurement], failures: dict[str, str], memory: bool) -> Table:
    loop = results.get(BASELINE)
    ref = results.get(REFERENCE)
    table = Table(title=escape(f"{w.name} [{size}] on {device}: median of {repeat} calls"))
    table.add_column("method", no_wrap=True)
    table.add_column("first call", justify="right")
    table.add_column("median", justify="right")
    table.add_column(f"speedup vs {BASELINE}", justify="right")
    table.add_column(f"time / {REFERENCE}", justify="right")
    if memory:  # --no-memory: no column at all rather than an empty one
        table.add_column("memory/call", justify="right")
    for method in methods:
        if method in failures:
            status = "[yellow]skipped[/]" if failures[method].startswith(SKIPPED) else "[red]failed[/]"
            table.add_row(method, "", status, "", "", *([""] if memory else []))
            continue
        r = results[method]
        speedup = f"{loop.median_s / r.median_s:.2f}x" if loop else "-"
        ratio = f"{r.median_s / ref.median_s:.2f}" if ref else "-"
        table.add_row(method, format_seconds(r.first_call_s), format_seconds(r.median_s), speedup, ratio,
                      *([format_bytes(r.peak_bytes)] if memory else []))
    return table
