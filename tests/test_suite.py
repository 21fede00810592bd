"""The ASV suite: generated from the registry, profiles selected by regex, metrics measured, asv runs it.

Fast tests drive the generated classes in-process on a tiny throwaway workload (never registered),
the way asv calls them (setup, then one metric). The slow ones run asv itself: `asv check`, and one
tiny benchmark through `asv run` against this environment into a temporary results folder.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
from suite import generate, probes, selection
from vmapbench import bench
from workloads.base import Workload, all_workloads


def _tiny_workload(name: str = "tiny-cubic") -> Workload:
    """Hessian of sum(x^3) for x of size n: loop, torch.func and the closed form 6*diag(x)."""

    def setup(params: dict[str, Any], device: str) -> dict[str, Any]:
        if device == "cuda" and not torch.cuda.is_available():
            raise NotImplementedError("cuda is not available here")
        return {"x": torch.linspace(-1.0, 1.0, params["n"], device=device)}

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x**3).sum()

    def run(method: str, state: dict[str, Any]) -> torch.Tensor:
        x = state["x"]
        if method == "loop":
            xg = x.detach().requires_grad_()
            (g,) = torch.autograd.grad(f(xg), xg, create_graph=True)
            return torch.stack([torch.autograd.grad(g[i], xg, retain_graph=True)[0] for i in range(len(x))])
        if method == "torch_func":
            return torch.func.hessian(f)(x)
        if method == "closed_form":
            return torch.diag(6 * x)
        if method == "functional_vectorize":  # stands for a method torch cannot run on this backend
            raise NotImplementedError("Could not run 'aten::cubic' with arguments from the 'CPU' backend")
        raise ValueError(method)

    def check(state: dict[str, Any]) -> None:
        ref = run("closed_form", state)
        for m in ("loop", "torch_func"):
            torch.testing.assert_close(run(m, state), ref)

    return Workload(name=name, family="tiny", description="Hessian of sum(x^3)", grid={"n": [4, 8]},
                    methods=("loop", "torch_func", "closed_form", "functional_vectorize"), setup=setup, run=run, check=check,
                    quick=("n=4",))


@pytest.fixture
def quick_profile(monkeypatch):
    monkeypatch.setenv(selection.PROFILE_ENV, "quick")
    monkeypatch.delenv(selection.DEVICES_ENV, raising=False)


# --- naming and selection ----------------------------------------------------------------------

def test_class_names_are_identifiers_and_collisions_are_refused():
    a, b = _tiny_workload("a-b"), _tiny_workload("a_b")
    assert selection.class_name(a) == "a_b" and selection.class_name(_tiny_workload("3d")) == "w_3d"
    with pytest.raises(ValueError, match="both map to the ASV class 'a_b'"):
        selection.class_names([a, b])


def _all_points() -> list[tuple[str, Workload, str, str, str, str]]:
    """(asv point name, workload, metric, size, method, device) over the full grids."""
    out = []
    for cls, w in selection.class_names().items():
        for metric in selection.METRICS:
            for size, method, device in itertools.product(w.sizes, w.methods, selection.ALL_DEVICES):
                point = f"{metric.module}.{cls}.{metric.name}({size!r}, {method!r}, {device!r})"
                out.append((point, w, metric.name, size, method, device))
    return out


@pytest.mark.parametrize("profile", ["quick", "full"])
def test_bench_regexes_select_exactly_the_profile(profile):
    regexes = [re.compile(r) for r in selection.bench_regexes(profile)]
    metrics = {m.name: m for m in selection.METRICS}
    devices = selection.PROFILE_DEVICES[profile]
    for point, w, metric, size, method, device in _all_points():
        expected = (size in selection.profile_sizes(w, profile) and device in devices and device in w.devices
                    and method in selection.profile_methods(w, profile) and metrics[metric].applies(w, method, device)
                    and metric not in selection.PROFILE_EXCLUDED_METRICS[profile]
                    and not selection.excluded_point(profile, metric, method))
        assert any(r.search(point) for r in regexes) == expected, point


def test_the_quick_profile_times_cold_compiles_only_when_asked():
    point = "bench_first_call.compiled_logreg_hessian.track_compile_seconds('n=1000,d=64', 'engine_compiled', 'cpu')"
    assert not any(re.search(r, point) for r in selection.bench_regexes("quick"))
    assert any(re.search(r, point) for r in selection.bench_regexes("quick", cold_compiles=True))
    assert any(re.search(r, point) for r in selection.bench_regexes("full"))


def test_bench_regexes_shard_by_family():
    family = all_workloads()[0].family
    regexes = [re.compile(r) for r in selection.bench_regexes("quick", [family])]
    for point, w, *_ in _all_points():
        if w.family != family:
            assert not any(r.search(point) for r in regexes), point
    suite_only = [re.compile(r) for r in selection.bench_regexes("quick", [selection.SUITE_FAMILY])]
    assert any(r.search("bench_overhead.PerOpOverhead.time_chain('engine', 'small', 'vmap', 'cpu')") for r in suite_only)
    assert not any(r.search(p) for r in suite_only for p, *_ in _all_points()[:50])
    with pytest.raises(ValueError, match="unknown families"):
        selection.bench_regexes("quick", ["no-such-family"])


def test_quick_profile_keeps_the_per_call_memory_and_leaves_out_asvs_process_peak():
    quick, full = selection.bench_regexes("quick"), selection.bench_regexes("full")
    assert not any("peakmem_run" in r for r in quick) and any("peakmem_run" in r for r in full)
    assert any("track_rss_delta_bytes" in r for r in quick) and any("track_alloc_peak_bytes" in r for r in quick)


def test_continuous_leaves_out_higher_is_better_metrics():
    regexes = selection.bench_regexes("quick", exclude_metrics=selection.HIGHER_IS_BETTER)
    assert not any("track_speedup_vs_loop" in r for r in regexes)


# --- the generated classes, driven in-process --------------------------------------------------

def test_generated_classes_cover_the_registry():
    from suite import bench_first_call, bench_workloads

    for module in (bench_workloads, bench_first_call):
        for cls_name, w in selection.class_names().items():
            cls = getattr(module, cls_name)
            assert cls.workload is w
            assert cls.params == [w.sizes, list(w.methods), list(selection.ALL_DEVICES)]
            for metric in selection.metrics_of(module.__name__.split(".")[-1]):
                assert getattr(cls, metric.name).skip_params == selection.skipped_params(w, metric)


def asv_setup(case: Any, metric: str, *params: str) -> None:
    """The setups asv runs before `metric`: the class's, then the metric function's own, if any."""
    case.setup(*params)
    own = getattr(getattr(type(case), metric), "setup", None)
    if own is not None:
        own(*params)


def test_steady_state_metrics_on_a_throwaway_workload(quick_profile):
    from suite import bench_workloads, workload_pass

    (cls,) = generate.workload_classes(bench_workloads._SteadyState, "bench_workloads", [_tiny_workload()]).values()
    case = cls()
    for metric in ("time_run", "peakmem_run"):
        asv_setup(case, metric, "n=4", "torch_func", "cpu")
        getattr(case, metric)("n=4", "torch_func", "cpu")
    asv_setup(case, "track_rss_delta_bytes", "n=4", "torch_func", "cpu")
    assert case.track_rss_delta_bytes("n=4", "torch_func", "cpu") >= 0
    asv_setup(case, "track_alloc_peak_bytes", "n=4", "torch_func", "cpu")
    assert case.track_alloc_peak_bytes("n=4", "torch_func", "cpu") > 4 * 4 * 4  # the 4x4 float32 Hessian at least
    speedup = case.track_speedup_vs_loop("n=4", "torch_func", "cpu")
    # Round by round, in the form asv stores a timing's samples: their median is the value.
    assert speedup["number"] == 1 and len(speedup["samples"]) >= 3
    assert all(math.isfinite(s) and s > 0 for s in speedup["samples"])
    asv_setup(case, "track_ratio_vs_torch_func", "n=4", "closed_form", "cpu")
    ratio = case.track_ratio_vs_torch_func("n=4", "closed_form", "cpu")["samples"]
    assert all(math.isfinite(r) and r > 0 for r in ratio)
    # The figures of the pass (one per round) are the track's samples.
    passed = workload_pass._PASSES[("tiny-cubic", "n=4", "cpu", ("closed_form", "torch_func"))]
    assert ratio == [c / t for c, t in zip(passed.seconds["closed_form"], passed.seconds["torch_func"])]
    # skip_params: where a metric does not apply, asv never calls it.
    assert ("n=4", "loop", "cpu") in cls.track_speedup_vs_loop.skip_params
    assert ("n=4", "torch_func", "cpu") in cls.track_ratio_vs_torch_func.skip_params
    assert ("n=4", "torch_func", "cpu") in cls.track_cuda_peak_bytes.skip_params
    assert ("n=4", "torch_func", "cuda") in cls.track_alloc_peak_bytes.skip_params
    assert ("n=4", "torch_func", "cpu") in cls.track_xla_memory_bytes.skip_params


def test_only_the_metrics_that_time_the_case_build_it_in_their_process(quick_profile):
    """The track metrics' processes read the case's pass; only time_run and peakmem_run (and the
    cuda ones) build the case and make the first call, in their own asv setup."""
    from suite import bench_first_call, bench_workloads

    (cls,) = generate.workload_classes(bench_workloads._SteadyState, "bench_workloads", [_tiny_workload()]).values()
    def own_setups(klass: type) -> set[str]:
        return {n for n in dir(klass) if n.startswith(("time_", "track_", "peakmem_"))
                and callable(getattr(getattr(klass, n), "setup", None))}

    own = own_setups(cls)
    assert own == {"time_run", "peakmem_run", "track_cuda_peak_bytes", "track_nvml_peak_bytes"}
    (first,) = generate.workload_classes(bench_first_call._FirstCall, "bench_first_call", [_tiny_workload()]).values()
    assert own_setups(first) == {"track_compile_seconds"}


def test_a_pass_is_kept_in_the_runs_folder_and_measures_every_method_once(quick_profile, tmp_path, monkeypatch):
    from suite import workload_pass

    monkeypatch.setattr(workload_pass, "_PASSES", {})
    w = _tiny_workload("tiny-kept")
    alone = workload_pass.case_pass(w, "n=4", "cpu", ("closed_form", "torch_func"))
    assert set(alone.seconds) == {"closed_form", "torch_func"}  # no run folder: only what is needed
    monkeypatch.setenv(workload_pass.PASS_DIR_ENV, str(tmp_path))
    first = workload_pass.case_pass(w, "n=4", "cpu", ("loop",))
    (kept,) = tmp_path.glob("pass-*.json")
    monkeypatch.setattr(workload_pass, "_PASSES", {})  # another process of the same run
    monkeypatch.setattr(workload_pass, "measure_case", lambda *a: pytest.fail("measured again"))
    assert workload_pass.case_pass(w, "n=4", "cpu", ("closed_form",)) == first
    assert set(first.seconds) == {"loop", "torch_func", "closed_form"} and "functional_vectorize" in first.errors


def test_an_asv_run_keeps_its_passes_per_commit_and_parent(tmp_path, monkeypatch):
    """Under asv without VMAPBENCH_PASS_DIR (`asv continuous` as typed), the processes of one
    commit's run (one parent: asv's fork server) share one folder; another commit, or the same
    commit under another parent, gets its own; a folder whose parent has exited is removed."""
    import tempfile

    from suite import workload_pass

    monkeypatch.delenv(workload_pass.PASS_DIR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.delenv("ASV_COMMIT", raising=False)
    assert workload_pass._asv_run_folder() == ""  # off asv: each process measures what it needs
    monkeypatch.setenv("ASV_COMMIT", "a" * 40)
    monkeypatch.setenv("ASV_ENV_DIR", str(tmp_path / "env"))
    dead = tmp_path / "vmapbench-asv-passes" / "0123456789ab-999999999-1"  # no such process
    dead.mkdir(parents=True)
    first = workload_pass._asv_run_folder()
    assert first == workload_pass._asv_run_folder() and Path(first).is_dir() and not dead.exists()
    assert str(workload_pass._file(_tiny_workload("tiny-asv"), "n=4", "cpu")).startswith(first)
    monkeypatch.setenv("ASV_COMMIT", "b" * 40)
    other = workload_pass._asv_run_folder()
    assert other != first and Path(first).is_dir()  # the other commit's run, its parent alive, is kept
    monkeypatch.setattr(workload_pass.os, "getppid", lambda: os.getpid())
    assert workload_pass._asv_run_folder() not in (first, other)


def test_a_pass_measures_the_loop_and_torch_func_the_profile_leaves_out(quick_profile, tmp_path, monkeypatch):
    """The compiled family's quick methods leave out loop and torch_func; its ratios still need them."""
    import dataclasses

    from suite import workload_pass

    monkeypatch.setattr(workload_pass, "_PASSES", {})
    monkeypatch.setenv(workload_pass.PASS_DIR_ENV, str(tmp_path))
    w = dataclasses.replace(_tiny_workload("tiny-quick-few"), not_in_quick=("loop", "torch_func"))
    assert selection.profile_methods(w, "quick") == ("closed_form", "functional_vectorize")
    case = workload_pass.case_pass(w, "n=4", "cpu", ("closed_form",))
    assert set(case.seconds) == {"loop", "torch_func", "closed_form"}
    assert len(case.round_ratios("closed_form", "torch_func")) >= 3


def test_setup_skips_cases_outside_the_profile(quick_profile, monkeypatch):
    from suite import bench_workloads

    (cls,) = generate.workload_classes(bench_workloads._SteadyState, "bench_workloads", [_tiny_workload()]).values()
    with pytest.raises(NotImplementedError, match="not in the quick profile"):
        cls().setup("n=8", "loop", "cpu")
    with pytest.raises(NotImplementedError, match="devices"):
        cls().setup("n=4", "loop", "cuda")
    monkeypatch.setenv(selection.PROFILE_ENV, "full")
    cls().setup("n=8", "loop", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(NotImplementedError, match="cuda"):
            asv_setup(cls(), "time_run", "n=4", "loop", "cuda")
        case = cls()
        asv_setup(case, "track_rss_delta_bytes", "n=4", "loop", "cuda")  # reads the pass: no state built
        with pytest.raises(probes.SkipNotImplemented, match="cuda is not available"):
            case.track_rss_delta_bytes("n=4", "loop", "cuda")


def test_not_implemented_first_call_fails_but_a_missing_engine_api_skips(quick_profile, monkeypatch):
    from suite import bench_workloads

    (cls,) = generate.workload_classes(bench_workloads._SteadyState, "bench_workloads", [_tiny_workload()]).values()
    with pytest.raises(RuntimeError, match="first call raised NotImplementedError"):
        asv_setup(cls(), "time_run", "n=4", "functional_vectorize", "cpu")
    case = cls()
    asv_setup(case, "track_rss_delta_bytes", "n=4", "functional_vectorize", "cpu")
    with pytest.raises(RuntimeError, match="first call raised NotImplementedError"):
        case.track_rss_delta_bytes("n=4", "functional_vectorize", "cpu")
    import engine

    monkeypatch.delattr(engine, "trace", raising=False)
    with pytest.raises(NotImplementedError, match="needs engine.trace"):
        probes.require_method("engine_traced")
    probes.require_method("loop")  # not an engine method: nothing required


def test_first_call_metrics_on_a_throwaway_workload(quick_profile):
    from suite import bench_first_call

    (cls,) = generate.workload_classes(bench_first_call._FirstCall, "bench_first_call", [_tiny_workload()]).values()
    case = cls()
    asv_setup(case, "track_compile_seconds", "n=4", "torch_func", "cpu")
    assert case.track_compile_seconds("n=4", "torch_func", "cpu") > 0
    try:
        count = case.track_fallbacks("n=4", "torch_func", "cpu")
    except probes.SkipNotImplemented:
        pytest.skip("engine.record_fallbacks is not available")
    assert count == 0  # torch.func never goes through the engine
    asv_setup(case, "track_torch_fallbacks", "n=4", "torch_func", "cpu")
    assert case.track_torch_fallbacks("n=4", "torch_func", "cpu") == 0  # pow and sum have rules


def test_torch_fallbacks_count_torchs_own_loop_per_op_call():
    x = torch.randn(3, 5)
    # histc has no batching rule in torch.func (2.13-2.15): one fallback per vmapped call
    looped = probes.torch_fallback_count(lambda: [torch.func.vmap(lambda t: torch.histc(t, bins=4))(x) for _ in range(2)])
    assert looped == 2
    assert probes.torch_fallback_count(lambda: torch.func.vmap(torch.sin)(x)) == 0
    assert not torch._C._debug_only_are_vmap_fallback_warnings_enabled()  # left as it was


def test_bad_profile_and_thread_settings_say_what_to_do(monkeypatch):
    monkeypatch.setenv(selection.PROFILE_ENV, "fast")
    with pytest.raises(ValueError, match="use one of quick, full"):
        selection.active_profile()
    monkeypatch.setenv(probes.THREADS_ENV, "two")
    with pytest.raises(ValueError, match="not an integer"):
        probes.requested_threads()


def test_pin_threads_follows_omp_num_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setenv(probes.THREADS_ENV, "1")
    try:
        assert probes.pin_threads() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_interleaved_seconds_alternates_and_times_every_callable():
    calls: dict[str, int] = {"a": 0, "b": 0}

    def make(name: str):
        def fn() -> None:
            calls[name] += 1
            sum(range(2000))
        return fn

    medians = probes.interleaved_seconds({"a": make("a"), "b": make("b")}, rounds=3, min_batch_s=0.001, budget_s=0.1)
    assert set(medians) == {"a", "b"} and all(m > 0 for m in medians.values())
    assert calls["a"] >= 4 and calls["b"] >= 4  # one estimate call + at least 3 rounds


def test_fresh_inductor_cache_is_empty_restored_and_merged(monkeypatch, tmp_path):
    previous = tmp_path / "cache"
    (previous / "old").mkdir(parents=True)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(previous))
    with probes.fresh_inductor_cache() as folder:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == folder and not os.listdir(folder)
        os.makedirs(os.path.join(folder, "fxgraph", "ab"))
        with open(os.path.join(folder, "fxgraph", "ab", "entry"), "w") as f:
            f.write("compiled")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(previous) and not os.path.exists(folder)
    # what the cold compile wrote is kept for the run's later processes, beside what was there
    assert (previous / "fxgraph" / "ab" / "entry").read_text() == "compiled" and (previous / "old").is_dir()


def test_fresh_inductor_cache_without_a_previous_one(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with probes.fresh_inductor_cache() as folder:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == folder
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and not os.path.exists(folder)


def test_overhead_chain_is_the_same_computation_for_every_method():
    from suite import bench_overhead

    x = bench_overhead.make_input("small")
    for mode in bench_overhead.MODES:
        ref = bench_overhead.chain_call("native", x, mode)()
        for method in bench_overhead.METHODS[1:]:
            try:
                out = bench_overhead.chain_call(method, x, mode)()
            except NotImplementedError as exc:  # engine (or engine.trace) not at this commit
                pytest.skip(str(exc))
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_auto_trace_overhead_compares_the_default_call_with_engine_trace(quick_profile):
    from suite import bench_overhead

    case = bench_overhead.AutoTraceOverhead()
    asv_setup(case, "track_ratio_vs_trace", "tiny")
    # Both callables compute the same thing: the default call replays engine.trace's graph.
    torch.testing.assert_close(case.auto(), case.traced(), rtol=0, atol=0)
    ratio = case.track_ratio_vs_trace("tiny")
    assert math.isfinite(ratio) and ratio > 0
    assert bench_overhead.AutoTraceOverhead.params == [["tiny", "blocks=2", "blocks=16", "blocks=64"]]
    with pytest.raises(ValueError, match="unknown model"):
        bench_overhead.auto_model("blocks=3")


# --- the drivers -------------------------------------------------------------------------------

def test_na_row_filter_drops_only_rows_without_values():
    keep = bench.NaRowFilter(["n=4", "loop", "engine", "cpu", "cuda"]).keep
    assert not keep("               n=4            loop            n/a    n/a  \n")
    assert keep("               n=4           engine          1.2ms   n/a  \n")
    assert keep("               n=4           engine          failed   n/a  \n")
    assert keep("[ 50.00%] ··· bench_runtime.track_cuda_device_count      n/a\n")
    assert keep("             size   method   cpu   cuda\n")


def _result_file(path: Path, rows: dict[str, list[Any]]) -> None:
    columns = ["result", "params", "version", "started_at", "duration"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"commit_hash": "abc", "env_name": "existing-py", "result_columns": columns,
                                "results": rows, "durations": {}, "version": 2}))


def test_merge_results_unites_shards_of_one_commit(tmp_path):
    dest, shard_a, shard_b = tmp_path / "results", tmp_path / "a", tmp_path / "b"
    _result_file(dest / "m" / "abc-existing-py.json", {"x.time_a": [[1.0], [], "v", 100, 1.0]})
    _result_file(shard_a / "m" / "abc-existing-py.json", {"x.time_b": [[2.0], [], "v", 200, 1.0],
                                                          "x.time_a": [[9.0], [], "v", 50, 1.0]})
    _result_file(shard_b / "m" / "abc-existing-py.json", {"x.time_c": [[3.0], [], "v", 300, 1.0]})
    (shard_b / "m" / "machine.json").write_text('{"machine": "m", "version": 1}')
    assert bench.merge_results([shard_a, shard_b], dest) == 3
    merged = json.loads((dest / "m" / "abc-existing-py.json").read_text())["results"]
    assert {k: v[0] for k, v in merged.items()} == {"x.time_a": [1.0], "x.time_b": [2.0], "x.time_c": [3.0]}
    assert (dest / "m" / "machine.json").exists()


def test_machine_name_is_stable_and_overridable(monkeypatch):
    monkeypatch.delenv(bench.MACHINE_ENV, raising=False)
    name = bench.machine_name()
    assert re.fullmatch(r"[a-z0-9-]+-\d+cpu(-[a-z0-9-]+)?", name) and name == bench.machine_name()
    monkeypatch.setenv(bench.MACHINE_ENV, "ci-box_1")
    assert bench.machine_name() == "ci-box_1"
    monkeypatch.setenv(bench.MACHINE_ENV, "no spaces")
    with pytest.raises(SystemExit, match="may only hold"):
        bench.machine_name()


# --- asv itself --------------------------------------------------------------------------------

def _asv_env(home: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, VMAPBENCH_PROFILE="quick", OMP_NUM_THREADS="2")
    for name in ("XLA_FLAGS", "PJRT_NPROC"):  # a test worker's single-thread XLA settings (conftest)
        env.pop(name, None)
    env.pop("VMAPBENCH_DEVICES", None)
    if home is not None:
        env["HOME"] = str(home)  # asv's machine file (~/.asv-machine.json) goes there, not to the user's
    return env


@pytest.mark.slow
def test_asv_check_passes():
    proc = subprocess.run([sys.executable, "-m", "asv", "check", "--python=same"], cwd=ROOT,
                          env=_asv_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No problems found" in proc.stdout


def _cheapest_quick_point() -> tuple[str, str]:
    """(asv benchmark name, --bench regex) of time_run for one quick cpu case, closed form if any."""
    for cls, w in selection.class_names().items():
        if w.quick and "cpu" in w.devices:
            method = "closed_form" if "closed_form" in w.methods else w.methods[0]
            name = f"bench_workloads.{cls}.time_run"
            return name, re.escape(f"{name}({w.quick[0]!r}, {method!r}, 'cpu')") + "$"
    pytest.skip("no workload has a quick cpu size")


@pytest.mark.slow
def test_asv_run_smoke_records_a_result_we_read_back(tmp_path):
    from asv import results as asv_results

    conf = json.loads((ROOT / "asv.conf.json").read_text())
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "suite"), results_dir=str(tmp_path / "results"),
                html_dir=str(tmp_path / "html"), env_dir=str(tmp_path / "env"))
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    env = _asv_env(home=tmp_path)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    asv = [sys.executable, "-m", "asv"]
    subprocess.run([*asv, "machine", "--yes", "--machine", "smoke", "--config", str(tmp_path / "asv.conf.json")],
                   cwd=tmp_path, env=env, check=True, capture_output=True)
    name, point = _cheapest_quick_point()
    ratio_name = name.replace(".time_run", ".track_ratio_vs_torch_func")
    proc = subprocess.run(
        [*asv, "run", "--config", str(tmp_path / "asv.conf.json"), "--environment", f"existing:{sys.executable}",
         "--set-commit-hash", commit, "--machine", "smoke", "--quick", "--show-stderr", "--record-samples",
         "--bench", r"^bench_runtime\.track_torch_num_threads$", "--bench", point,
         "--bench", point.replace("time_run", "track_ratio_vs_torch_func")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    (res,) = asv_results.iter_results_for_machine_and_hash(str(tmp_path / "results"), "smoke", commit)
    assert res.get_result_value("bench_runtime.track_torch_num_threads", []) == [2]
    times = res.get_result_value(name, res.get_result_params(name))
    measured = [t for t in times if t is not None and not math.isnan(t)]
    assert len(measured) == 1 and measured[0] > 0, times
    # The suite's declared version, not a source hash: history survives refactors of the suite.
    assert res.benchmark_version[name] == selection.SUITE_VERSION
    # The in-process ratio comes round by round: asv keeps the rounds as samples, their median as
    # the value, and the gate's reader makes its interval of them (what the dashboard prints).
    from measuring import stats

    data = json.loads(next((tmp_path / "results" / "smoke").glob(f"{commit[:8]}-*.json")).read_text())
    (ratio,) = [e for p, e in stats.asv_estimates(data) if p.startswith(ratio_name + "(") and e is not None]
    assert ratio.n >= 3 and ratio.lo <= ratio.value <= ratio.hi and ratio.value > 0
