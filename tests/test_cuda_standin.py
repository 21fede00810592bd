"""CUDA measured right, checked on a CPU through the CUDA stand-in (workloads.cuda_standin).

The stand-in answers torch.cuda's measuring calls and NVML from the CPU and counts them, so the
order of clock reads, calls and synchronisations of every timing path can be checked here: each
timed call synchronised before its clock stops, the allocator's peak reset before each measured
call, NVML sampled around a synchronised call, and no CUDA use in the process asv's fork server
forks from (a child then cannot use CUDA; every CUDA point of the first GPU run failed so).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from workloads import cuda_standin

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stand-in installed for one test; returns the events log: 'sync' at every synchronize,
    'reset' at every peak reset (tests add 'clock' and 'call')."""
    for target, name, value in cuda_standin.patches():
        if isinstance(target, dict):
            monkeypatch.setitem(target, name, value)
        else:
            monkeypatch.setattr(target, name, value)
    events: list[str] = []

    def sync(device: Any = None) -> None:
        cuda_standin.synchronize(device)
        events.append("sync")

    def reset(device: Any = None) -> None:
        cuda_standin.reset_peak_memory_stats(device)
        events.append("reset")

    monkeypatch.setattr(torch.cuda, "synchronize", sync)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    return events


def _clock(events: list[str]) -> Any:
    t = [0.0]

    def clock() -> float:
        events.append("clock")
        t[0] += 1.0
        return t[0]
    return clock


def _call(events: list[str]) -> Any:
    return lambda: events.append("call")


def test_time_call_stops_each_clock_after_a_synchronisation(standin, monkeypatch) -> None:
    from measuring import timer

    monkeypatch.setattr(timer, "time", types.SimpleNamespace(perf_counter=_clock(standin)))
    times = timer.time_call(_call(standin), repeat=3, warmup=1, device="cuda")
    assert times == [1.0, 1.0, 1.0]
    assert standin == ["call", "sync"] + ["clock", "call", "sync", "clock"] * 3


def test_interleaved_rounds_synchronise_each_call(standin, monkeypatch) -> None:
    from measuring import timer

    monkeypatch.setattr(timer, "time", types.SimpleNamespace(perf_counter=_clock(standin)))
    timer.rounds({"a": _call(standin), "b": _call(standin)}, 2, device="cuda")
    assert standin == ["sync"] + ["clock", "call", "sync", "clock"] * 4


def test_interleaved_samples_synchronise_before_and_after_each_batch(standin) -> None:
    from suite import probes

    probes.interleaved_samples({"a": _call(standin)}, "cuda", rounds=3, min_batch_s=2.5, clock=_clock(standin))
    # the estimate (one call), then 3 rounds of batches of ceil(2.5 / 1) = 3 calls
    batch = lambda n: ["sync", "clock", *["call"] * n, "sync", "clock"]  # noqa: E731
    assert standin == batch(1) + batch(3) * 3


def test_the_suites_timed_call_and_the_peak_reset_per_call(standin) -> None:
    """suite.workload_pass.synchronized (what time_run and the passes time) ends every call with a
    synchronisation; measuring.memory.cuda_peak_bytes resets the peak before each call and reads it after a
    synchronisation."""
    from measuring import memory
    from suite.workload_pass import synchronized

    synchronized(_call(standin), "cuda")()
    synchronized(_call(standin), "cpu")()
    assert standin == ["call", "sync", "call"]
    standin.clear()
    for _ in range(2):
        memory.cuda_peak_bytes(_call(standin), "cuda")
    assert standin == ["sync", "reset", "call", "sync"] * 2


def test_cuda_peak_bytes_sees_a_temporary_allocation_under_the_standin(standin) -> None:
    from measuring import memory

    def allocate() -> None:
        t = torch.ones(64 * 2**20 // 4)
        del t

    assert memory.cuda_peak_bytes(allocate, "cuda") >= 48 * 2**20
    assert memory.cuda_peak_bytes(lambda: None, "cuda") < 16 * 2**20  # reset: the earlier peak is gone


def test_cuda_peak_bytes_sees_an_allocation_malloc_serves_from_its_free_lists() -> None:
    """A block malloc reuses from its free lists grows no resident set unless the stand-in hands
    those lists back before the reset: with mmap off and trimming off (as after some long runs),
    a freed 80 MiB block would serve the measured 64 MiB allocation unseen."""
    out = _python("""
        import ctypes, torch
        libc = ctypes.CDLL(None)
        assert libc.mallopt(-4, 0) == 1 and libc.mallopt(-1, 1 << 40) == 1  # M_MMAP_MAX, M_TRIM_THRESHOLD
        from measuring import memory
        from workloads import cuda_standin
        cuda_standin.install()
        t = torch.ones(80 * 2**20 // 4)
        del t
        def allocate():
            t = torch.ones(64 * 2**20 // 4)
            del t
        print(memory.cuda_peak_bytes(allocate, "cuda"))
    """)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) >= 48 * 2**20


def test_nvml_peak_is_sampled_around_a_synchronised_call(standin) -> None:
    from suite import probes

    before = cuda_standin.CALLS["nvml_memory_info"]
    peak = probes.nvml_peak_bytes(_call(standin), "cuda")
    assert standin == ["sync", "call", "sync"]
    assert peak > 0 and cuda_standin.CALLS["nvml_memory_info"] >= before + 2


def test_a_standin_case_is_labelled_cuda_and_measured_as_cuda(standin) -> None:
    import workloads
    from measuring.measurement import measure

    w = workloads.get("rosenbrock_hessian")
    state = w.setup(w.params(w.quick[0]), "cuda")
    assert state.device == "cuda"
    standin.clear()
    m = measure(w, "torch_func", w.quick[0], state, repeat=2, warmup=0)
    assert m.device == "cuda" and standin.count("sync") >= 3 and "reset" in standin


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != cuda_standin.NVML_CHECK_ENV}
    environ.update({"PYTHONPATH": str(ROOT), cuda_standin.ENV: "1", **env})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=600)


FORK = """
    import os, sys, torch, workloads
    torch.cuda.is_available()
    pid = os.fork()
    if pid == 0:
        try:
            torch.cuda.synchronize()
        except RuntimeError as exc:
            print("child:", exc, flush=True)
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_after_cuda_was_touched_cannot_use_it() -> None:
    """As torch does: torch.cuda.is_available() initializes CUDA (cudaGetDeviceCount) unless NVML
    answers it (PYTORCH_NVML_BASED_CUDA_CHECK=1, what vmapbench.bench sets for CUDA runs)."""
    poisoned = _python(FORK)
    assert "child exit 3" in poisoned.stdout, poisoned.stdout + poisoned.stderr
    assert "Cannot re-initialize CUDA in forked subprocess" in poisoned.stdout
    assert "torch.cuda.is_available()" in poisoned.stdout  # the error names the call that did it
    clean = _python(FORK, **{cuda_standin.NVML_CHECK_ENV: "1"})
    assert "child exit 0" in clean.stdout, clean.stdout + clean.stderr


def test_the_suite_leaves_cuda_alone_in_the_process_asv_forks_from() -> None:
    """asv's fork server imports the suite (its warm-up included) and forks every benchmark from
    that process: nothing there may touch CUDA, or no CUDA point can run."""
    out = _python("""
        import suite.bench_workloads, suite.bench_first_call, suite.bench_overhead, suite.bench_runtime
        from workloads import cuda_standin
        assert cuda_standin.active()
        print("used:", cuda_standin._first_use or None, dict(cuda_standin.CALLS))
    """, VMAPBENCH_PROFILE="quick", VMAPBENCH_DEVICES="cuda")
    assert out.returncode == 0, out.stderr
    assert "used: None" in out.stdout, out.stdout


BACKWARD_THEN_FORK = """
    import os, torch, workloads
    from measuring import cuda_fork
    from workloads.cuda_standin import tensor_device
    {before}
    print("hazard:", cuda_fork.hazard(), flush=True)
    leaf = torch.ones(2, requires_grad=True)
    pid = os.fork()
    if pid == 0:
        for name, use in (("cuda", lambda: torch.ones(2, device=tensor_device("cuda"))),
                          ("backward", lambda: torch.autograd.grad((leaf ** 2).sum(), leaf))):
            try:
                use()
                print("child", name, "ok", flush=True)
            except RuntimeError as exc:
                print("child", name, "refused:", exc, flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""


def test_a_backward_pass_on_a_cuda_build_leaves_no_cuda_to_forked_children() -> None:
    """As a CUDA build of torch does: the autograd engine's first backward pass initializes the
    CUDA driver (it counts the devices to start a thread per device), so a child forked after it
    can use neither CUDA nor autograd. A forward-mode warm-up (jacfwd) leaves both alone."""
    backward = _python(BACKWARD_THEN_FORK.format(before="torch.func.hessian(lambda t: (t.sin() * t).sum())(torch.ones(3))"),
                       **{cuda_standin.NVML_CHECK_ENV: "1"})
    assert backward.returncode == 0, backward.stderr
    assert "hazard: the CUDA stand-in was used here first through" in backward.stdout, backward.stdout
    assert "autograd's device threads" in backward.stdout
    assert "child cuda refused: Cannot re-initialize CUDA in forked subprocess" in backward.stdout, backward.stdout
    assert "child backward refused: Unable to handle autograd's threading" in backward.stdout, backward.stdout
    forward = _python(BACKWARD_THEN_FORK.format(before="torch.func.jacfwd(lambda t: (t.sin() * t).sum())(torch.ones(3))"),
                      **{cuda_standin.NVML_CHECK_ENV: "1"})
    assert "hazard: None" in forward.stdout, forward.stdout + forward.stderr
    assert "child cuda ok" in forward.stdout and "child backward ok" in forward.stdout, forward.stdout


def test_a_cuda_point_forked_from_an_unusable_parent_says_why_and_what_to_do() -> None:
    """Should the fork server's parent have made CUDA unusable all the same (a warm-up that ran a
    backward pass, as the CLI's does), it says so on stderr and each CUDA point's setup raises
    that, instead of failing deep inside with the driver's "initialization error"."""
    out = _python("""
        import os
        import torch
        import workloads  # installs the stand-in
        from suite import probes
        x = torch.ones(3, requires_grad=True)
        torch.autograd.grad((x * x).sum(), x)  # a backward pass, as the CLI's warm-up runs
        probes._note_fork_hazard("the CLI's warm-up")
        pid = os.fork()
        if pid == 0:
            probes.check_fork("cpu")
            try:
                probes.check_fork("cuda")
            except RuntimeError as exc:
                print("child:", exc, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        probes.check_fork("cuda")  # the parent itself is not refused
        print("parent ok")
    """, **{cuda_standin.NVML_CHECK_ENV: "1"})
    assert out.returncode == 0, out.stderr
    assert "no process forked from here can use CUDA" in out.stderr, out.stderr
    assert "found after the suite's warm-up step: the CLI's warm-up" in out.stderr
    assert "child: CUDA cannot be used in this benchmark's process" in out.stdout, out.stdout
    assert "--launch-method spawn" in out.stdout and "parent ok" in out.stdout
    # The suite's own warm-up, had it run backward passes (as it did before it knew): the step is named.
    old = _python("""
        from measuring import cuda_fork
        cuda_fork.cuda_built = lambda: False
        from suite import probes
        probes._preload_peers = lambda wanted: []  # the step named is before the peers' imports
        probes.preload()
    """, **{cuda_standin.NVML_CHECK_ENV: "1"})
    assert old.returncode == 0, old.stderr
    assert "found after the suite's warm-up step: torch.func's warm-up call" in old.stderr, old.stderr


def test_the_driver_check_initializes_nothing(monkeypatch) -> None:
    """cuda_fork.driver_initialized asks the driver only where something loaded it, and reads
    CUDA_ERROR_NOT_INITIALIZED (3) as 'not initialized'."""
    from measuring import cuda_fork

    asked: list[str] = []

    class Driver:
        def __init__(self, answer: int) -> None:
            self.answer = answer

        def cuDeviceGetCount(self, count: Any) -> int:  # noqa: N802 - the driver's name
            asked.append("count")
            return self.answer

    def cdll(name: str, mode: int = 0) -> Any:
        assert mode & os.RTLD_NOLOAD, "must not load the driver"
        if loaded is None:
            raise OSError(f"{name}: not loaded")
        return loaded

    monkeypatch.setattr(cuda_fork.ctypes, "CDLL", cdll)
    loaded = None
    assert cuda_fork.driver_initialized() is False and asked == []
    loaded = Driver(cuda_fork.CUDA_ERROR_NOT_INITIALIZED)
    assert cuda_fork.driver_initialized() is False
    loaded = Driver(0)
    assert cuda_fork.driver_initialized() is True and asked == ["count", "count"]


def test_standin_results_cannot_pass_for_cuda_results(standin, monkeypatch) -> None:
    from vmapbench import bench

    monkeypatch.delenv(bench.MACHINE_ENV, raising=False)
    assert bench.machine_name().endswith("-cuda-standin-dry-run")
    monkeypatch.setenv(bench.MACHINE_ENV, "h100-box")
    with pytest.raises(SystemExit, match="dry-run"):
        bench.machine_name()
    monkeypatch.setenv(bench.MACHINE_ENV, "ci-dry-run")
    assert bench.machine_name() == "ci-dry-run"
    facts = bench.software_facts()
    assert "not a CUDA result" in facts["dry_run"] and facts["python"] and facts["torch"].startswith(torch.__version__)


def test_software_facts_say_where_python_and_torch_differ_from_the_pins(tmp_path, monkeypatch) -> None:
    from vmapbench import bench

    (tmp_path / "asv.conf.json").write_text('{"pythons": ["3.9"], "matrix": {"req": {"torch": ["0.1.0"]}}}')
    facts = bench.software_facts(tmp_path)
    assert "Python" in facts["pins"] and "(pinned 3.9)" in facts["pins"] and "(pinned 0.1.0)" in facts["pins"]
    pinned = json.loads((ROOT / "asv.conf.json").read_text())["matrix"]["req"]["torch"][0]
    if torch.__version__.split("+")[0] == pinned:
        assert "pins" not in bench.software_facts(ROOT)
    else:  # another supported torch (.ci/torch-versions): a result says it was not the pinned one
        assert f"(pinned {pinned})" in bench.software_facts(ROOT)["pins"]


def test_steady_tier_names_the_tier_that_served_the_call() -> None:
    """peer_ratios' tier column: eager (no recorded graph ran), replay, fused, and cuda graph (a
    fused program replayed as a CUDA graph, captured here by the stand-in of
    tests/test_cuda_paths_on_cpu.py, which replays by calling the program again)."""
    import engine
    from engine import fused
    from test_cuda_paths_on_cpu import _ReplayByCalling

    from vmapbench.peer_ratios import steady_tier

    x = torch.randn(6, 3)
    f = engine.trace(lambda a: (a.sin() * 2).sum(0))
    assert steady_tier(lambda: x.sin()) == "eager"
    f(x)
    with engine.fused_tier(False):
        assert steady_tier(lambda: f(x)) == "replay"
    with engine.fused_tier("force"):
        f(x)
        f(x)
    engine.settle()
    (entry,) = f._cache.values()
    program = getattr(entry.fused, "program", entry.fused)
    assert isinstance(program, fused.FusedProgram), f.tiers()
    entry.fused = program
    with engine.fused_tier(True):  # (the tests' default is off: tests/conftest.py)
        assert steady_tier(lambda: f(x)) == "fused"
        graphed = fused.CudaGraphed(program)
        graphed.capturer = _ReplayByCalling
        entry.fused = graphed
        assert steady_tier(lambda: f(x)) == "cuda graph"
        torch.testing.assert_close(f(x), (x.sin() * 2).sum(0))
    with engine.fused_tier(False):
        assert steady_tier(lambda: f(x)) == "replay"
