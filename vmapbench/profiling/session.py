"""`vmapbench profile`: where the time goes for one workload and one method, without a script.

One run leaves one folder (results/profiles/<timestamp>-<workload>-<method>/, or --out):
  profile.speedscope.json  py-spy samples of the measured loop (open in https://www.speedscope.app)
  flamegraph.svg           the same samples as a flame graph
  trace.json               torch.profiler chrome trace (chrome://tracing or https://ui.perfetto.dev)
  nvml_timeline.html       GPU utilization and memory over time (CUDA only, offline Plotly)
  child.log, pyspy.log     output of the profiled process and of py-spy
  summary.json             what ran, median call time, top aten ops, engine fallbacks, peak memory

The measured call runs in a child process (vmapbench.profiling.child): setup and the first call
(where tracing and torch.compile happen) finish before py-spy attaches, the loop runs for
--seconds while py-spy samples it, then a few calls run under torch.profiler. NVML is sampled from
this parent process so the sampler never shows up in the profiles.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from vmapbench.profiling import flamegraph, nvml as nvml_mod, pyspy

TOOLS = ("all", "py-spy", "torch")
REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILES_DIR = REPO_ROOT / "results" / "profiles"
SPEEDSCOPE = "profile.speedscope.json"
FLAMEGRAPH = "flamegraph.svg"
TIMELINE = "nvml_timeline.html"


class ProfileError(Exception):
    """A problem the user can fix (bad name, missing tool); printed without a traceback."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Plan:
    """A validated request: everything the run needs, decided before any process starts."""

    workload: str
    method: str
    size: str
    params: dict[str, Any]
    device: str
    seconds: float
    tools: tuple[str, ...]
    native: bool
    rate: int
    torch_calls: int
    top: int
    imports: list[str]
    import_paths: list[str]
    py_spy: str | None = None
    py_spy_version: str | None = None
    engine_method: bool = False

    def command(self) -> str:
        words = ["vmapbench", "profile", self.workload, "--method", self.method, "--size", self.size,
                 "--device", self.device, "--seconds", f"{self.seconds:g}",
                 "--tool", "all" if len(self.tools) == 2 else self.tools[0]]
        words += ["--native"] if self.native else []
        for module in self.imports:
            words += ["--import", module]
        return shlex.join(words)


def _import_root(module: str) -> str | None:
    """The sys.path entry a module was imported from, so the child can import it too."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not os.path.isabs(spec.origin):
        return None
    depth = len(module.split(".")) + (1 if spec.origin.endswith("__init__.py") else 0)
    return str(Path(spec.origin).parents[depth - 1])


def _cuda_problem() -> str | None:
    import torch
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return (f"this torch ({torch.__version__}) is a CPU-only build; install a CUDA build of torch "
                "on a machine with an NVIDIA GPU, or use --device cpu")
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: check nvidia-smi, "
            "the driver and CUDA_VISIBLE_DEVICES, or use --device cpu")


def make_plan(args: argparse.Namespace) -> Plan:
    """Validate the request against the registry and the machine; raise ProfileError on any problem."""
    import_paths = []
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ProfileError(f"--import {module}: cannot import it ({exc}); is it on PYTHONPATH?") from None
        root = _import_root(module)
        if root:
            import_paths.append(root)

    import workloads
    try:
        w = workloads.get(args.workload)
    except KeyError as exc:
        if not workloads.all_workloads():
            raise ProfileError(f"unknown workload {args.workload!r}: no workloads are registered "
                               "(workloads/__init__.py imports none; pass --import MODULE for your own)") from None
        raise ProfileError(f"{exc.args[0]}") from None
    if args.method not in w.methods:
        raise ProfileError(f"workload {w.name!r} has no method {args.method!r}; valid methods: {', '.join(w.methods)}")
    size = args.size or (w.quick[0] if w.quick else w.sizes[0])
    try:
        params = w.params(size)
    except KeyError as exc:
        raise ProfileError(str(exc.args[0])) from None
    if args.device not in w.devices:
        raise ProfileError(f"workload {w.name!r} does not run on {args.device}; its devices: {', '.join(w.devices)}")
    if args.device == "cuda":
        problem = _cuda_problem()
        if problem:
            raise ProfileError(f"--device cuda asked for, but CUDA is not available: {problem}")
    if args.seconds <= 0:
        raise ProfileError(f"--seconds must be > 0, got {args.seconds}")
    if args.rate <= 0 or args.torch_calls < 1 or args.top < 1:
        raise ProfileError("--rate, --torch-calls and --top must be positive")

    tools = ("py-spy", "torch") if args.tool == "all" else (args.tool,)
    plan = Plan(workload=w.name, method=args.method, size=size, params=params, device=args.device,
                seconds=args.seconds, tools=tools, native=args.native, rate=args.rate,
                torch_calls=args.torch_calls, top=args.top, imports=list(args.imports),
                import_paths=import_paths, engine_method=args.method.startswith("engine"))
    if "py-spy" in tools:
        try:
            plan.py_spy = pyspy.find(args.py_spy)
            plan.py_spy_version = pyspy.version(plan.py_spy)
        except pyspy.PySpyError as exc:
            raise ProfileError(str(exc)) from None
    return plan


def output_dir(plan: Plan, out: Path | None) -> Path:
    """--out as given, else a fresh timestamped folder under results/profiles/."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        return out
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{plan.workload}-{plan.method}")
    for n in range(1, 100):
        path = PROFILES_DIR / (f"{stamp}-{safe}" + (f"-{n}" if n > 1 else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise ProfileError(f"could not create a fresh folder under {PROFILES_DIR}", exit_code=1)


# ----------------------------------------------------------------------------------------------
# the child process


class ChildFailed(RuntimeError):
    pass


class Child:
    """The profiled process, its status pipe (JSON lines) and its command pipe (stdin)."""

    def __init__(self, plan: Plan, out: Path) -> None:
        read_fd, write_fd = os.pipe()
        cmd = [sys.executable, "-m", "vmapbench.profiling.child", "--workload", plan.workload,
               "--method", plan.method, "--size", plan.size, "--device", plan.device, "--out", str(out),
               "--status-fd", str(write_fd), "--torch-calls", str(plan.torch_calls),
               "--torch-seconds", str(plan.seconds), "--top", str(plan.top),
               "--max-loop-seconds", str(4 * plan.seconds + 300)]
        cmd += ["--torch"] if "torch" in plan.tools else []
        for module in plan.imports:
            cmd += ["--import", module]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if plan.import_paths:
            env["PYTHONPATH"] = os.pathsep.join(plan.import_paths + [p for p in [env.get("PYTHONPATH")] if p])
        self.log_path = out / "child.log"
        self._log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                         pass_fds=(write_fd,), env=env, text=True, cwd=os.getcwd())
        finally:
            os.close(write_fd)
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd) as stream:
            for line in stream:
                try:
                    self.events.put(json.loads(line))
                except json.JSONDecodeError:
                    continue
        self.events.put(None)

    def send(self, word: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(word + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the child is gone; the status pipe reports why

    def log_tail(self, lines: int = 15) -> str:
        self._log.flush()
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The next status event; raises queue.Empty after `timeout`, ChildFailed on error or exit."""
        event = self.events.get(timeout=timeout)
        if event is None:
            self.events.put(None)  # stay at end-of-stream for later calls
            code = self.proc.wait(timeout=30)
            raise ChildFailed(f"the profiled process exited (status {code}) before it finished; "
                              f"last lines of {self.log_path}:\n{self.log_tail()}")
        if event["event"] == "error":
            raise ChildFailed(f"the workload failed during {event['phase']}: {event['message']}\n"
                              f"(full traceback in {self.log_path})")
        return event

    def close(self) -> int | None:
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log.close()
        return code


# ----------------------------------------------------------------------------------------------
# NVML (parent side)


def start_nvml(nvml: Any = None, interval: float = 0.1) -> tuple[nvml_mod.NvmlSampler | None, dict[str, Any]]:
    """Open the device torch calls cuda:0 in NVML and start sampling it; (None, {skipped}) if NVML is unusable."""
    try:
        module, handle = nvml_mod.open_device(nvml_mod.cuda_visible_device(), nvml)
    except nvml_mod.NvmlUnavailable as exc:
        return None, {"skipped": f"no GPU timeline: {exc}"}
    info = nvml_mod.device_info(module, handle)
    return nvml_mod.NvmlSampler(module, handle, interval=interval).start(), {"device": info["name"], "driver": info["driver"]}


def finish_nvml(sampler: nvml_mod.NvmlSampler | None, info: dict[str, Any], out: Path,
                title: str) -> tuple[dict[str, Any], str | None]:
    """Stop sampling and write the timeline; returns (summary["nvml"], timeline file name or None)."""
    if sampler is None:
        return info, None
    sampler.stop()
    result = {**info, **sampler.summary()}
    if not sampler.samples:
        result["skipped"] = "no GPU timeline: NVML returned no samples" + (f" ({sampler.error})" if sampler.error else "")
        return result, None
    nvml_mod.write_timeline(sampler.samples, sampler.marks, out / TIMELINE, title)
    return result, TIMELINE


# ----------------------------------------------------------------------------------------------
# the run


def _versions(plan: Plan) -> dict[str, str | None]:
    import torch

    def dist(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "torch": torch.__version__, "vmapbench": dist("vmapbench"),
            "py-spy": plan.py_spy_version, "nvidia-ml-py": dist("nvidia-ml-py"), "plotly": dist("plotly"),
            "rich": dist("rich")}


class Profiler:
    """Runs one plan: child, py-spy, NVML; collects everything into `summary`."""

    def __init__(self, plan: Plan, out: Path, console: Console, nvml: Any = None) -> None:
        self.plan, self.out, self.console, self.nvml = plan, out, console, nvml
        self.errors: list[str] = []
        self.native = plan.native
        self.spy: subprocess.Popen | None = None
        self.summary: dict[str, Any] = {
            "workload": plan.workload, "method": plan.method, "size": plan.size, "params": plan.params,
            "device": plan.device, "device_name": None, "seconds": plan.seconds, "tools": list(plan.tools),
            "command": plan.command(), "created": _dt.datetime.now().isoformat(timespec="seconds"),
            "out": str(out), "files": {}, "iterations": None, "loop_s": None, "median_call_s": None,
            "call_s": None, "setup_s": None, "first_call_s": None, "top_ops": {"cpu": [], "cuda": []},
            "profiled_calls": None, "fallbacks": None, "fallbacks_first_call": None, "fallback_note": None,
            "pyspy": None, "memory": {}, "nvml": None, "versions": _versions(plan), "errors": self.errors,
        }

    def _mark(self, sampler: nvml_mod.NvmlSampler | None, label: str) -> None:
        if sampler is not None:
            sampler.mark(label)

    def run(self) -> dict[str, Any]:
        plan, s = self.plan, self.summary
        sampler, nvml_info = (None, {})
        if plan.device == "cuda":
            sampler, nvml_info = start_nvml(self.nvml)
            if sampler is None:
                self.console.print(f"[yellow]{nvml_info['skipped']}[/]")
        self._mark(sampler, "setup")
        child = Child(plan, self.out)
        s["files"]["child_log"] = child.log_path.name
        interrupted = False
        try:
            with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                          TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                          console=self.console, transient=False) as progress:
                self._drive(child, progress, sampler)
        except ChildFailed as exc:
            self.errors.append(str(exc))
        except KeyboardInterrupt:
            interrupted = True
            self._stop_pyspy_gracefully()
            child.proc.kill()
            raise
        finally:
            if self.spy is not None and self.spy.poll() is None:
                self.spy.kill()
                self.spy.wait()
            code = child.close()
            if code not in (0, None) and not self.errors and not interrupted:
                self.errors.append(f"the profiled process exited with status {code}; see {child.log_path}")
            s["nvml"], timeline = finish_nvml(
                sampler, nvml_info, self.out, f"{plan.workload} · {plan.method} · {plan.size} · GPU over time")
            if timeline:
                s["files"]["nvml_timeline"] = timeline
            if plan.device == "cuda" and s["nvml"] and s["nvml"].get("skipped") and sampler is not None:
                self.console.print(f"[yellow]{s['nvml']['skipped']}[/]")
        return s

    def _stop_pyspy_gracefully(self) -> None:
        """On Ctrl-C: py-spy writes what it sampled when it gets SIGINT; keep that flame graph."""
        spy = self.spy
        if spy is None:
            return
        if spy.poll() is None:
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                return
        path = self.out / SPEEDSCOPE
        if spy.returncode == 0 and path.exists() and path.stat().st_size > 0 and self.summary["pyspy"] is None:
            try:
                self._read_pyspy(self.native)
            except (ValueError, KeyError, OSError):
                pass  # a partial file is not worth a traceback on top of the interrupt

    def _wait(self, child: Child, kind: str, on_event: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        while True:
            try:
                event = child.next_event(timeout=0.2)
            except queue.Empty:
                continue
            if event["event"] == kind:
                return event
            if on_event:
                on_event(event)

    def _drive(self, child: Child, progress: Progress, sampler: nvml_mod.NvmlSampler | None) -> None:
        plan, s = self.plan, self.summary
        task = progress.add_task(f"setting up {plan.workload} ({plan.size}) on {plan.device}", total=None, info="")
        setup = self._wait(child, "setup")
        s.update(setup_s=setup["setup_s"], device_name=setup["device_name"])
        self._mark(sampler, "first call")
        progress.update(task, description=f"first call of {plan.method} (tracing/compiling happens here)")
        first = self._wait(child, "first")
        s.update(first_call_s=first["first_call_s"], fallbacks_first_call=first["fallbacks_first"] or None)
        ready = self._wait(child, "ready")
        s.update(fallbacks=ready["fallbacks_per_call"], fallback_note=ready["fallback_note"])
        progress.update(task, total=1, completed=1, description="setup and first call",
                        info=f"first call {first['first_call_s']:.3g} s")

        label = "py-spy sampling" if "py-spy" in plan.tools else "timing"
        loop = progress.add_task(f"{label} {plan.method} for {plan.seconds:g} s", total=plan.seconds, info="0 calls")
        self._mark(sampler, "loop" + (" (py-spy)" if "py-spy" in plan.tools else ""))
        child.send("go")
        start = time.monotonic()
        spy = self._start_pyspy(child, setup["pid"], plan.native) if "py-spy" in plan.tools else None
        native = self.native = plan.native
        while True:
            try:
                event = child.next_event(timeout=0.1)
                if event["event"] == "progress":
                    progress.update(loop, info=f"{event['iterations']} calls")
            except queue.Empty:
                pass
            elapsed = time.monotonic() - start
            progress.update(loop, completed=min(elapsed, plan.seconds))
            if spy is None:
                if elapsed >= plan.seconds:
                    break
                continue
            if spy.poll() is None:
                if elapsed > plan.seconds + 120:
                    spy.kill()
                    spy.wait()
                    self.errors.append(f"py-spy did not finish {plan.seconds:g} s of sampling within 120 s extra; killed it")
                    break
                continue
            failure = self._pyspy_failure(spy.returncode, native)
            if failure and native and not pyspy.is_permission_error(self._pyspy_log()):
                # Native unwinding is the fragile part; keep the profile and say so.
                self.console.print(f"[yellow]{failure}\nretrying without --native[/]")
                native = self.native = False
                s.setdefault("notes", []).append("--native failed; py-spy recorded Python frames only")
                start = time.monotonic()
                spy = self._start_pyspy(child, setup["pid"], native)
                continue
            if failure:
                self.errors.append(failure)
            break
        child.send("stop")
        done_loop = self._wait(child, "loop")
        progress.update(loop, completed=plan.seconds, info=f"{done_loop['iterations']} calls")
        s.update(iterations=done_loop["iterations"], loop_s=done_loop["loop_s"], call_s=done_loop["call_s"],
                 median_call_s=done_loop["call_s"]["median"])
        if spy is not None and spy.returncode == 0:
            self._read_pyspy(native)

        if "torch" in plan.tools:
            self._mark(sampler, "torch.profiler")
            t = progress.add_task(f"torch.profiler, up to {plan.torch_calls} calls", total=None, info="")
            torch_event = self._wait(child, "torch")
            progress.update(t, total=1, completed=1, info=f"{torch_event['profiled_calls']} calls")
            s["files"]["chrome_trace"] = torch_event["trace"]
            s["profiled_calls"] = torch_event["profiled_calls"]
            s["top_ops"] = {"cpu": torch_event["top_cpu"], "cuda": torch_event["top_cuda"]}
        done = self._wait(child, "done")
        self._mark(sampler, "done")
        s["memory"] = done["memory"]

    def _pyspy_log(self) -> str:
        try:
            return (self.out / "pyspy.log").read_text(errors="replace")
        except OSError:
            return ""

    def _start_pyspy(self, child: Child, pid: int, native: bool) -> subprocess.Popen:
        assert self.plan.py_spy is not None
        cmd = pyspy.record_command(self.plan.py_spy, pid, self.out / SPEEDSCOPE, seconds=self.plan.seconds,
                                   rate=self.plan.rate, native=native)
        with open(self.out / "pyspy.log", "w") as log:
            log.write("$ " + shlex.join(cmd) + "\n")
            log.flush()
            self.spy = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self.spy

    def _pyspy_failure(self, returncode: int, native: bool) -> str | None:
        path = self.out / SPEEDSCOPE
        if returncode == 0 and path.exists() and path.stat().st_size > 0:
            return None
        return pyspy.explain_failure(returncode, self._pyspy_log(), native) if returncode != 0 else (
            f"py-spy exited cleanly but wrote no {SPEEDSCOPE}; see {self.out / 'pyspy.log'}")

    def _read_pyspy(self, native: bool) -> None:
        plan, s = self.plan, self.summary
        stacks = pyspy.read_stacks(self.out / SPEEDSCOPE)
        samples = sum(stacks.values())
        s["files"]["speedscope"] = SPEEDSCOPE
        s["files"]["pyspy_log"] = "pyspy.log"
        s["pyspy"] = {"samples": samples, "rate": plan.rate, "native": native, "top_self": pyspy.top_self(stacks)}
        if samples == 0:
            self.errors.append("py-spy recorded no samples: the loop may have been idle (see pyspy.log)")
            return
        title = f"{plan.workload} · {plan.method} · {plan.size} · {plan.device} (py-spy, {samples} samples)"
        flamegraph.write_svg(stacks, self.out / FLAMEGRAPH, title)
        s["files"]["flamegraph"] = FLAMEGRAPH


# ----------------------------------------------------------------------------------------------
# report


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def print_report(summary: dict[str, Any], console: Console) -> None:
    s = summary
    table = Table(title=f"vmapbench profile · {s['workload']} · {s['method']}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    mem = s.get("memory") or {}
    rows = [
        ("size", s["size"]),
        ("device", f"{s['device']} ({s['device_name']})" if s.get("device_name") else s["device"]),
        ("setup", _fmt_s(s.get("setup_s"))),
        ("first call", _fmt_s(s.get("first_call_s"))),
        ("loop", f"{s['iterations']} calls in {_fmt_s(s['loop_s'])}" if s.get("iterations") else "-"),
        ("median call", _fmt_s(s.get("median_call_s"))),
        ("peak RSS", f"{mem['peak_rss_mib']:.0f} MiB" if mem.get("peak_rss_mib") else "-"),
    ]
    if s["device"] == "cuda":
        nv = s.get("nvml") or {}
        rows.append(("peak CUDA allocated", f"{mem['cuda_max_allocated_mib']:.1f} MiB"
                     if mem.get("cuda_max_allocated_mib") is not None else "-"))
        rows.append(("peak device memory (NVML)", f"{nv['peak_memory_used_mib']:.0f} MiB"
                     if nv.get("peak_memory_used_mib") is not None else nv.get("skipped", "-")))
    if s.get("pyspy"):
        rows.append(("py-spy samples", str(s["pyspy"]["samples"])))
    if s.get("fallback_note"):
        rows.append(("engine fallbacks", s["fallback_note"]))
    for key, name in sorted(s["files"].items()):
        rows.append((key, name))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    console.print(f"files are in {s['out']}", soft_wrap=True, highlight=False)

    for device in ("cpu", "cuda"):
        ops = s["top_ops"].get(device) or []
        if not ops:
            continue
        t = Table(title=f"top aten ops by self {device.upper()} time, per measured call "
                        f"({s['profiled_calls']} calls profiled)")
        for col in ("op", "calls", "self", "total", "% self"):
            t.add_column(col, justify="left" if col == "op" else "right")
        for row in ops:
            t.add_row(row["op"], f"{row['calls_per_call']:.3g}", _fmt_s(row["self_us_per_call"] * 1e-6),
                      _fmt_s(row["total_us_per_call"] * 1e-6), f"{row['percent']:.1f}")
        console.print(t)

    if s.get("pyspy") and s["pyspy"]["top_self"]:
        t = Table(title="py-spy: where the samples landed (self)")
        for col in ("function", "samples", "%"):
            t.add_column(col, justify="left" if col == "function" else "right")
        for row in s["pyspy"]["top_self"]:
            t.add_row(row["function"], str(row["samples"]), f"{row['percent']:.1f}")
        console.print(t)

    if s.get("fallbacks") is not None:
        if s["fallbacks"]:
            t = Table(title="engine fallbacks (for-loop over the batch), per steady-state call")
            t.add_column("op")
            t.add_column("calls", justify="right")
            for op, n in s["fallbacks"].items():
                t.add_row(op, str(n))
            console.print(t)
        else:
            console.print("engine fallbacks: none (every op had a batching rule or a decomposition)")
    viewers = [f"{s['files'][k]}: {how}" for k, how in (
        ("speedscope", "drop it on https://www.speedscope.app"),
        ("flamegraph", "open in a browser"),
        ("chrome_trace", "open in https://ui.perfetto.dev or chrome://tracing"),
        ("nvml_timeline", "open in a browser (offline)")) if k in s["files"]]
    if viewers:
        console.print("view: " + "; ".join(viewers), soft_wrap=True, highlight=False)
    for error in s["errors"]:
        console.print(f"[bold red]error:[/] {error}")
    console.print(f"summary: {Path(s['out']) / 'summary.json'}", soft_wrap=True, highlight=False)
