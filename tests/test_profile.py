"""`vmapbench profile`: end-to-end CPU profiles, the error paths, and the NVML timeline with a fake NVML.

End-to-end tests profile a toy per-sample-gradient workload defined in a module written to a temp
folder and loaded with `--import` (the same way a user profiles an out-of-tree workload), so they
do not depend on which real workloads exist; one slow test profiles a real registered workload.
"""
from __future__ import annotations

import json
import os
import re
import stat
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmapbench import cli
from vmapbench.profiling import session as prof
from vmapbench.profiling import child, flamegraph, nvml, pyspy

TOY_MODULE = "vmapbench_toy_profile_workload"
TOY = "toy_profile_psg"
TOY_SOURCE = f'''
import torch
from workloads.base import Workload, register


def setup(params, device):
    g = torch.Generator().manual_seed(0)
    if params["n"] == 13:
        raise RuntimeError("toy setup refuses n=13")
    return {{"x": torch.randn(params["n"], params["d"], generator=g).to(device),
            "w": torch.randn(params["d"], generator=g).to(device)}}


def loss(w, row):
    return torch.nn.functional.softplus(-(row @ w))


def run(method, state):
    x, w = state["x"], state["w"]
    if method == "loop":
        wr = w.detach().requires_grad_(True)
        return torch.stack([torch.autograd.grad(loss(wr, r), wr)[0] for r in x])
    if method == "torch_func":
        return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(w, x)
    raise ValueError(f"toy workload: method {{method!r}} is broken on purpose")


register(Workload(name="{TOY}", family="toy", description="toy per-sample gradients of a logistic loss",
                  grid={{"n": [16, 13], "d": [4]}}, methods=("loop", "torch_func", "closed_form"),
                  setup=setup, run=run, check=lambda state: None, devices=("cpu",),
                  quick=("n=16,d=4",)))
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """Write the toy workload module, make it importable here and in the child, unregister after."""
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / f"{TOY_MODULE}.py").write_text(TOY_SOURCE)
    monkeypatch.syspath_prepend(str(moddir))
    yield ["--import", TOY_MODULE]
    from workloads import base
    base._REGISTRY.pop(TOY, None)
    sys.modules.pop(TOY_MODULE, None)


def run_cli(*argv: str) -> int:
    return cli.main(["profile", *argv])


def read_summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def fake_pyspy(tmp_path: Path, stderr_line: str) -> str:
    path = tmp_path / "fake-py-spy"
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then echo "py-spy 0.0-fake"; exit 0; fi
        echo '{stderr_line}' >&2
        exit 1
        """))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


# ------------------------------------------------------------------------------------------------
# end to end (child process, py-spy, torch.profiler)


def test_cpu_profile_writes_speedscope_flamegraph_trace_and_summary(toy, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli(TOY, "--method", "loop", "--seconds", "2", "--out", str(out), *toy) == 0
    summary = read_summary(out)
    assert summary["errors"] == []
    assert (summary["workload"], summary["method"], summary["size"], summary["device"]) == (TOY, "loop", "n=16,d=4", "cpu")
    assert summary["iterations"] > 0 and summary["median_call_s"] > 0

    speedscope = json.loads((out / summary["files"]["speedscope"]).read_text())
    assert sum(len(p["samples"]) for p in speedscope["profiles"]) > 0
    assert summary["pyspy"]["samples"] > 0
    # The child's command pipe is polled, not read by a blocked thread that py-spy would count.
    assert sum(r["percent"] for r in summary["pyspy"]["top_self"] if "Commands" in r["function"]) < 5
    assert "<svg" in (out / summary["files"]["flamegraph"]).read_text()

    trace = json.loads((out / summary["files"]["chrome_trace"]).read_text())
    assert any(str(e.get("name", "")).startswith("aten::") for e in trace["traceEvents"])
    ops = summary["top_ops"]["cpu"]
    assert ops and all(row["op"].startswith("aten::") for row in ops)
    assert ops == sorted(ops, key=lambda r: -r["self_us_per_call"])
    # 16 rows -> 16 softplus_backward per call in the loop method.
    calls = {row["op"]: row["calls_per_call"] for row in ops}
    assert calls.get("aten::softplus_backward") == 16
    assert summary["versions"]["py-spy"] and summary["versions"]["torch"]
    assert summary["fallbacks"] is None  # not an engine method

    printed = capsys.readouterr().out
    assert "median call" in printed and "aten::" in printed


def test_pyspy_permission_denied_says_how_to_fix(toy, tmp_path, capsys):
    spy = fake_pyspy(tmp_path, "Permission Denied: Try running again with elevated permissions by going "
                               "'sudo env \"PATH=$PATH\" !!'")
    out = tmp_path / "out"
    assert run_cli(TOY, "--method", "loop", "--tool", "py-spy", "--seconds", "1", "--py-spy", spy,
                   "--out", str(out), *toy) == 1
    summary = read_summary(out)
    assert len(summary["errors"]) == 1
    error = summary["errors"][0]
    assert "ptrace" in error and "SYS_PTRACE" in error and "ptrace_scope" in error and "--tool torch" in error
    assert summary["iterations"] >= 1  # the loop was stopped, not left spinning
    assert "speedscope" not in summary["files"]
    assert "SYS_PTRACE" in capsys.readouterr().out


def test_workload_failure_in_the_child_is_reported(toy, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli(TOY, "--method", "loop", "--size", "n=13,d=4", "--tool", "torch", "--seconds", "1",
                   "--out", str(out), *toy) == 1
    error = read_summary(out)["errors"][0]
    assert "during setup" in error and "toy setup refuses n=13" in error
    assert "Traceback" in (out / "child.log").read_text()


@pytest.mark.slow
def test_profile_of_a_registered_workload_with_an_engine_method(tmp_path):
    import workloads
    candidates = [w for w in workloads.all_workloads() if "engine" in w.methods and "cpu" in w.devices]
    if not candidates:
        pytest.skip("no registered workload has an engine method yet")
    w = candidates[0]
    out = tmp_path / "out"
    assert run_cli(w.name, "--method", "engine", "--size", w.sizes[0], "--seconds", "2", "--out", str(out)) == 0
    summary = read_summary(out)
    assert summary["errors"] == []
    assert (out / "profile.speedscope.json").stat().st_size > 0 and (out / "trace.json").stat().st_size > 0
    assert summary["top_ops"]["cpu"]
    # Engine methods record fallbacks: a dict (possibly empty), or a note saying why not.
    assert isinstance(summary["fallbacks"], dict) or summary["fallback_note"]


# ------------------------------------------------------------------------------------------------
# errors caught before anything runs


@pytest.mark.parametrize("argv, expected", [
    (("no_such_workload", "--method", "loop"), ["unknown workload 'no_such_workload'", TOY]),
    ((TOY, "--method", "jax"), ["no method 'jax'", "loop, torch_func, closed_form"]),
    ((TOY, "--method", "loop", "--size", "n=7"), ["no size 'n=7'", "n=16,d=4"]),
    ((TOY, "--method", "loop", "--device", "cuda"), ["does not run on cuda", "cpu"]),
    ((TOY, "--method", "loop", "--py-spy", "/nonexistent/py-spy"), ["py-spy not found", "pip install py-spy"]),
    ((TOY, "--method", "loop", "--seconds", "0"), ["--seconds must be > 0"]),
])
def test_usage_errors_name_the_problem_and_the_valid_choices(toy, argv, expected, capsys, tmp_path):
    assert run_cli(*argv, "--out", str(tmp_path / "out"), *toy) == 2
    err = " ".join(capsys.readouterr().err.split())
    for text in expected:
        assert text in err
    assert not (tmp_path / "out").exists()


def test_cuda_without_cuda_is_refused(toy, monkeypatch, capsys, tmp_path):
    import importlib

    import torch
    from workloads import base
    importlib.import_module(TOY_MODULE)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(base._REGISTRY[TOY], "devices", ("cpu", "cuda"))
    assert run_cli(TOY, "--method", "loop", "--device", "cuda", "--out", str(tmp_path / "o"), *toy) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "CUDA is not available" in err and "--device cpu" in err


def test_missing_pyspy_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pyspy.PySpyError, match="pip install py-spy"):
        pyspy.find()


# ------------------------------------------------------------------------------------------------
# NVML: a fake module stands in for pynvml, so the CUDA path runs on CPU


class FakeNvml:
    """Just enough of pynvml: one device whose utilization and memory follow a script."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    def __init__(self, fail_init: type[Exception] | None = None) -> None:
        self.fail_init = fail_init
        self.calls = 0
        self.shutdown = False

    def nvmlInit(self):
        if self.fail_init:
            raise self.fail_init("fake init failure")

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetHandleByIndex(self, index):
        if index != 0:
            raise self.NVMLError("Not Found")
        return "handle0"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU"

    def nvmlSystemGetDriverVersion(self):
        return "999.1"

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.calls += 1
        return SimpleNamespace(gpu=min(100, 10 * self.calls), memory=5)

    def nvmlDeviceGetMemoryInfo(self, handle):
        used = [100, 300, 200][(self.calls - 1) % 3] * nvml.MIB
        return SimpleNamespace(used=used, total=1000 * nvml.MIB)


def test_nvml_sampler_records_utilization_memory_and_phases():
    fake = FakeNvml()
    clock = iter(range(100))
    sampler = nvml.NvmlSampler(fake, "handle0", interval=0.5, clock=lambda: float(next(clock)))
    sampler._t0 = 0.0
    for _ in range(3):
        sampler.sample_once()
    sampler.mark("loop")
    assert [s.gpu_util for s in sampler.samples] == [10, 20, 30]
    assert sampler.peak_memory_mib == 300
    assert [s.t for s in sampler.samples] == [0.0, 1.0, 2.0] and sampler.marks == [(3.0, "loop")]
    summary = sampler.summary()
    assert summary["samples"] == 3 and summary["max_gpu_util"] == 30 and summary["memory_total_mib"] == 1000


def test_start_and_finish_nvml_write_an_offline_timeline(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = FakeNvml()
    sampler, info = prof.start_nvml(fake, interval=0.01)
    assert sampler is not None and info == {"device": "Fake GPU", "driver": "999.1"}
    sampler.mark("setup")
    deadline = time.monotonic() + 120  # a hang guard: the sampler ticks every 10 ms
    while len(sampler.samples) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.mark("loop")
    result, timeline = prof.finish_nvml(sampler, info, tmp_path, "fake timeline")
    assert fake.shutdown and timeline == prof.TIMELINE
    assert result["samples"] >= 4 and result["peak_memory_used_mib"] == 300 and result["device"] == "Fake GPU"
    html = (tmp_path / timeline).read_text()
    assert "fake timeline" in html and "memory used" in html
    # plotly.js is inlined (no <script src=...>), so the file opens offline.
    assert not re.search(r"<script[^>]*\bsrc=", html) and len(html) > 1_000_000


def test_nvml_without_the_library_skips_the_timeline_and_says_why(tmp_path):
    sampler, info = prof.start_nvml(FakeNvml(fail_init=FakeNvml.NVMLError_LibraryNotFound))
    assert sampler is None and "libnvidia-ml.so" in info["skipped"]
    result, timeline = prof.finish_nvml(sampler, info, tmp_path, "t")
    assert timeline is None and result["skipped"].startswith("no GPU timeline")
    assert not list(tmp_path.iterdir())


def test_nvml_without_pynvml_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(nvml.NvmlUnavailable, match="pip install nvidia-ml-py"):
        nvml.load_nvml()


def test_nvml_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert nvml.cuda_visible_device() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")
    assert nvml.cuda_visible_device() == "GPU-1234"
    with pytest.raises(nvml.NvmlUnavailable, match="CUDA_VISIBLE_DEVICES"):
        nvml.open_device("GPU-1234", FakeNvml())


# ------------------------------------------------------------------------------------------------
# pieces


def test_speedscope_stacks_top_self_and_flamegraph_widths(tmp_path):
    doc = {"shared": {"frames": [
        {"name": "<module>", "file": "/x/site-packages/run.py", "line": 1},
        {"name": "work", "file": "/x/site-packages/torch/a.py", "line": 10},
        {"name": "work", "file": "/x/site-packages/torch/a.py", "line": 12},
        {"name": "idle", "file": "b.py", "line": 3}]},
        "profiles": [{"type": "sampled", "samples": [[0, 1], [0, 1], [0, 2], [0, 3]],
                      "weights": [0.01, 0.01, 0.01, 0.01]}]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    stacks = pyspy.read_stacks(path)
    assert stacks[("<module> (run.py:1)", "work (torch/a.py:10)")] == 2
    top = pyspy.top_self(stacks)
    assert top[0] == {"function": "work (torch/a.py)", "samples": 3, "percent": 75.0}

    svg = flamegraph.render_svg(stacks, "title <&>")
    assert "title &lt;&amp;&gt;" in svg
    root = flamegraph.build_tree(stacks)
    assert root.count == 4 and root.children["<module> (run.py:1)"].children["idle (b.py:3)"].count == 1
    # Frame widths are proportional to samples: the 2-sample frame is twice the 1-sample one.
    widths = {title: float(w) for title, w in re.findall(r'<title>([^<]*)</title><rect [^>]*width="([0-9.]+)"', svg)}
    assert widths["work (torch/a.py:10): 2 samples (50.0%)"] == pytest.approx(
        2 * widths["work (torch/a.py:12): 1 samples (25.0%)"])
    assert widths["all: 4 samples (100.0%)"] == pytest.approx(4 * widths["idle (b.py:3): 1 samples (25.0%)"])


def test_permission_errors_are_told_apart_from_other_failures():
    assert pyspy.is_permission_error("Error: Operation not permitted (os error 1)")
    denied = pyspy.explain_failure(1, "Permission Denied: Try running again with elevated permissions", False)
    assert "SYS_PTRACE" in denied
    other = pyspy.explain_failure(1, "Error: Failed to find python version from target process", True)
    assert "SYS_PTRACE" not in other and "--native" in other and "Failed to find python" in other


def test_child_commands_stop_even_when_go_and_stop_arrive_together():
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"go\nstop\n")
    commands = child.Commands(read_fd)
    commands.wait_for_go()
    assert not commands.stopped
    assert commands.poll_stop()
    os.close(write_fd)
    os.close(read_fd)


def test_child_commands_treat_end_of_input_as_stop():
    read_fd, write_fd = os.pipe()
    commands = child.Commands(read_fd)
    os.write(write_fd, b"go\n")
    commands.wait_for_go()
    assert not commands.poll_stop()
    os.close(write_fd)
    assert commands.poll_stop()
    os.close(read_fd)


def test_fallback_counts_are_read_from_the_recorder():
    class Recorder:
        def __enter__(self):
            self.counts = Counter()
            Recorder.last = self
            return self

        def __exit__(self, *exc):
            return False

    def call():
        Recorder.last.counts.update({"aten::foo.default": 1, "aten::bar.default": 3})

    seconds, counts = child._timed(call, Recorder)
    assert seconds >= 0 and counts == {"aten::bar.default": 3, "aten::foo.default": 1}
    assert list(counts) == ["aten::bar.default", "aten::foo.default"]
    assert child._fallback_recorder("torch_func") == (None, None)


def test_call_stats():
    stats = child.call_stats([0.3, 0.1, 0.2, 0.4])
    assert stats["median"] == pytest.approx(0.25) and stats["min"] == 0.1 and stats["p90"] == 0.4


def test_report_of_a_cuda_profile_shows_device_memory_and_cuda_ops():
    from rich.console import Console
    op = {"op": "aten::mm", "calls_per_call": 2.0, "self_us_per_call": 1500.0, "total_us_per_call": 1600.0,
          "percent": 80.0}
    summary = {"workload": "w", "method": "engine", "size": "n=1", "device": "cuda", "device_name": "Fake GPU",
               "setup_s": 0.5, "first_call_s": 2.0, "iterations": 10, "loop_s": 1.0, "median_call_s": 0.1,
               "memory": {"peak_rss_mib": 500.0, "cuda_max_allocated_mib": 42.5, "cuda_max_reserved_mib": 64.0},
               "nvml": {"peak_memory_used_mib": 300.0}, "pyspy": None, "fallback_note": None,
               "fallbacks": {"aten::foo.default": 3}, "files": {"chrome_trace": "trace.json"}, "out": "/x",
               "top_ops": {"cpu": [], "cuda": [op]}, "profiled_calls": 5, "errors": []}
    console = Console(record=True, width=200)
    prof.print_report(summary, console)
    text = console.export_text()
    assert "peak CUDA allocated" in text and "42.5 MiB" in text and "300 MiB" in text
    assert "self CUDA time" in text and "1.5 ms" in text and "aten::foo.default" in text
    assert "ui.perfetto.dev" in text
