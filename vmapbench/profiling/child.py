"""The profiled process: set up one workload, then run its measured call on the parent's command.

`vmapbench profile` starts this module as a child so that py-spy sees only the measured loop
(import, setup and the first call - tracing or compiling - happen before py-spy attaches) and
so that a crash or a hang in a workload cannot take the parent's report with it.

Protocol. The child writes one JSON object per line to the file descriptor `--status-fd`:
  setup   {setup_s, pid, device_name}        workload built on its device
  first   {first_call_s, fallbacks_first}    first call done (trace/compile happen here)
  ready   {fallbacks_per_call, fallback_note} one steady call done; waiting for "go"
  progress {iterations, elapsed_s}           about 4 times a second during the loop
  loop    {iterations, loop_s, call_s}       the loop stopped ("stop" or stdin closed)
  torch   {profiled_calls, trace, top_cpu, top_cuda}
  done    {memory}
  error   {phase, message, traceback}        then exit status 1
It reads commands from stdin, one per line: "go" starts the loop, "stop" ends it; end of input
counts as "stop" too, so an orphaned child never spins forever.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import select
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

from vmapbench.commands.options import add_device

MIB = 1024 * 1024
PROGRESS_EVERY_S = 0.25


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m vmapbench.profiling.child",
                                description="profiled child of `vmapbench profile` (not meant to be run by hand)")
    p.add_argument("--workload", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--size", required=True)
    add_device(p)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--status-fd", type=int, required=True)
    p.add_argument("--torch", action="store_true", help="run the torch.profiler phase after the loop")
    p.add_argument("--torch-calls", type=int, default=5)
    p.add_argument("--torch-seconds", type=float, default=5.0)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--max-loop-seconds", type=float, default=3600.0)
    p.add_argument("--import", dest="imports", action="append", default=[])
    return p.parse_args(argv)


class Commands:
    """"go"/"stop" lines from the command pipe (stdin), polled between calls.

    No reader thread: py-spy counts a thread blocked in read() as busy, and a quarter of the
    samples would land in it. A zero-timeout select() every POLL_EVERY_S costs microseconds.
    Reads go straight to the file descriptor so no line hides in a Python-level buffer.
    """

    POLL_EVERY_S = 0.02

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = b""
        self.stopped = False

    def _next_word(self, block: bool) -> str | None:
        """The next command, None when none is waiting (only if not `block`); "stop" at end of input."""
        while b"\n" not in self.pending:
            if not block and not select.select([self.fd], [], [], 0)[0]:
                return None
            data = os.read(self.fd, 4096)
            if not data:
                return "stop"
            self.pending += data
        line, _, self.pending = self.pending.partition(b"\n")
        return line.decode(errors="replace").strip()

    def wait_for_go(self) -> None:
        """Block until "go"; "stop" or end of input first means: one loop call, then finish."""
        while True:
            word = self._next_word(block=True)
            if word == "go":
                return
            if word == "stop":
                self.stopped = True
                return

    def poll_stop(self) -> bool:
        while not self.stopped:
            word = self._next_word(block=False)
            if word is None:
                break
            self.stopped = word == "stop"
        return self.stopped


def call_stats(times: list[float]) -> dict[str, float]:
    """Median, mean, min and 90th percentile of per-call wall times, in seconds."""
    from measuring import stats  # numpy with it: after the loop, not in the child's start-up

    return {"median": stats.median(times), "mean": statistics.fmean(times),
            "min": min(times), "p90": stats.rank_percentile(times, 0.9)}


def _fallback_recorder(method: str) -> tuple[Callable[[], Any] | None, str | None]:
    """engine.record_fallbacks for engine methods; (None, why) when it cannot be had."""
    if not method.startswith("engine"):
        return None, None
    try:
        import engine
        return engine.record_fallbacks, None
    except Exception as exc:  # the engine is optional for a profile; say why the table is missing
        return None, f"fallbacks not recorded: engine.record_fallbacks is unavailable ({type(exc).__name__}: {exc})"


def _timed(call: Callable[[], Any], recorder: Callable[[], Any] | None) -> tuple[float, dict[str, int]]:
    start = time.perf_counter()
    if recorder is None:
        call()
        return time.perf_counter() - start, {}
    with recorder() as rec:
        call()
    return time.perf_counter() - start, dict(sorted(rec.counts.items(), key=lambda kv: -kv[1]))


def _memory(cuda: bool) -> dict[str, float | None]:
    mem: dict[str, float | None] = {
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cuda_max_allocated_mib": None,
        "cuda_max_reserved_mib": None,
    }
    if cuda:
        import torch
        mem["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / MIB
        mem["cuda_max_reserved_mib"] = torch.cuda.max_memory_reserved() / MIB
    return mem


def _cpu_name() -> str:
    """CPU model and torch's intra-op thread count: the context a CPU timing needs."""
    import torch
    model = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {torch.get_num_threads()} threads"


def run(args: argparse.Namespace, send: Callable[..., None], commands: Commands) -> None:
    phase = ["import"]

    def at(name: str) -> None:
        phase[0] = name

    try:
        for module in args.imports:
            importlib.import_module(module)
        import workloads
        workload = workloads.get(args.workload)
        cuda = args.device.startswith("cuda")

        at("setup")
        start = time.perf_counter()
        state = workload.setup(workload.params(args.size), args.device)
        device_name = _cpu_name()
        if cuda:
            import torch
            torch.cuda.synchronize()
            device_name = torch.cuda.get_device_name()
        send("setup", setup_s=time.perf_counter() - start, pid=os.getpid(), device_name=device_name)

        def call() -> None:
            workload.run(args.method, state)
            if cuda:
                torch.cuda.synchronize()

        at("first call")
        recorder, note = _fallback_recorder(args.method)
        first_s, fallbacks_first = _timed(call, recorder)
        send("first", first_call_s=first_s, fallbacks_first=fallbacks_first)
        at("steady call")
        _, per_call = _timed(call, recorder)
        send("ready", fallbacks_per_call=per_call if recorder else None, fallback_note=note)

        commands.wait_for_go()
        at("loop")
        times: list[float] = []
        loop_start = last_progress = last_poll = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            times.append(t1 - t0)
            if t1 - last_progress >= PROGRESS_EVERY_S:
                send("progress", iterations=len(times), elapsed_s=t1 - loop_start)
                last_progress = t1
            if t1 - last_poll >= commands.POLL_EVERY_S:
                last_poll = t1
                if commands.poll_stop():
                    break
            if commands.stopped or t1 - loop_start > args.max_loop_seconds:
                break
        send("loop", iterations=len(times), loop_s=time.perf_counter() - loop_start, call_s=call_stats(times))

        if args.torch:
            at("torch.profiler")
            from vmapbench.profiling import torch_ops
            trace = args.out / "trace.json"
            averages, done = torch_ops.profile_calls(
                call, calls=args.torch_calls, max_seconds=args.torch_seconds, cuda=cuda,
                trace_path=trace, label=f"{args.workload}:{args.method}")
            send("torch", profiled_calls=done, trace=trace.name,
                 top_cpu=torch_ops.top_ops(averages, by="cpu", n=args.top, calls=done),
                 top_cuda=torch_ops.top_ops(averages, by="cuda", n=args.top, calls=done) if cuda else [])
        send("done", memory=_memory(cuda))
    except BaseException as exc:
        send("error", phase=phase[0], message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        raise


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with os.fdopen(args.status_fd, "w", buffering=1) as status:
        def send(event: str, **fields: Any) -> None:
            status.write(json.dumps({"event": event, **fields}) + "\n")
            status.flush()

        try:
            run(args, send, Commands(sys.stdin.fileno()))
        except Exception:
            traceback.print_exc()
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
