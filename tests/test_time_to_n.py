"""workloads.time_to_n and `vmapbench time-to-n`: a fresh process per curve, cumulative times at the asked N, cold and warm
inductor cache folders, the budget, failures named; the suite's cases, the docs table and the view.

The measuring tests run real child processes on a user's `module:function` (written to tmp_path);
they assert what was measured and how, never how fast.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import textwrap
from pathlib import Path

import pytest

from workloads import time_to_n as ttn

REPO = Path(__file__).resolve().parents[1]

FACTORY = '''
import time
import torch


def build(method):
    """The measured call of each method: per-row gradients of a small function."""
    x = torch.linspace(-1.0, 1.0, 24).reshape(8, 3)

    def loss(row):
        return (row.sin() * row).sum()

    if method == "engine":
        import os
        import engine
        want = os.environ.get("TTN_WANT_FUSED_MODE")  # what the curve's process must run the tier as
        if want is not None and engine.fused.fused_mode() != want:
            raise RuntimeError(f"the fused tier is {engine.fused.fused_mode()!r}, not {want!r}")
        fn = engine.vmap(engine.grad(loss))
    elif method == "torch_func":
        fn = torch.func.vmap(torch.func.grad(loss))
    elif method == "sleepy":
        return lambda: time.sleep(0.05)
    elif method == "hangs":
        return lambda: time.sleep(600)
    elif method == "broken":
        def fn(t):
            raise ValueError("the model's forward is broken")
    elif method == "lazy_import":
        calls = []

        def fn(t):
            calls.append(t)
            if len(calls) == 2:
                import wave  # noqa: F401 - a module nothing here imports before: the second call's import
            return t
    elif method == "not_callable":
        return 42
    elif method == "absent":
        raise NotImplementedError("this model has no absent method")
    else:
        raise KeyError(method)
    return lambda: fn(x)
'''


@pytest.fixture(scope="module")
def factory_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("ttn_factory")
    (folder / "ttn_user_model.py").write_text(textwrap.dedent(FACTORY))
    path = os.pathsep.join(p for p in (str(folder), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def _measure(env: dict[str, str], methods: list[tuple[str, str]], ns=(1, 2, 5, 30), max_seconds=60.0,
             min_calls: int = 1):
    return ttn.measure(None, None, methods, factory="ttn_user_model:build", ns=ns, max_seconds=max_seconds,
                       grace_s=240.0, env=env, min_calls=min_calls)


def test_first_calls_name_what_each_call_imported(factory_env: dict[str, str]) -> None:
    """--first-calls K: each of the first K calls' own seconds and the modules it imported, by
    package; none recorded without it."""
    curve, = ttn.measure(None, None, [("lazy_import", "cold")], factory="ttn_user_model:build", ns=(1, 5),
                         max_seconds=60.0, grace_s=240.0, env=factory_env, first_calls=3, min_calls=5)
    assert curve.status == "done", curve.note
    assert [c["n"] for c in curve.first_calls] == [1, 2, 3]
    assert [c["imported"] for c in curve.first_calls] == [[], ["wave"], []]
    assert curve.first_calls[1]["modules"] >= 1 and all(c["s"] >= 0 for c in curve.first_calls)
    assert sum(c["s"] for c in curve.first_calls) <= curve.points[-1][1]
    plain, = ttn.measure(None, None, [("lazy_import", "cold")], factory="ttn_user_model:build", ns=(1, 2),
                         max_seconds=60.0, grace_s=240.0, env=factory_env, min_calls=2)
    assert plain.first_calls == [] and plain.status == "done"
    assert ttn.Curve(**{k: v for k, v in dataclasses.asdict(curve).items() if k != "first_calls"}).first_calls == []


@pytest.mark.slow
def test_curves_run_in_fresh_processes_with_cold_and_warm_caches(factory_env: dict[str, str]) -> None:
    curves = _measure(factory_env, [("torch_func", "cold"), ("engine", "cold"), ("engine", "warm")], min_calls=30)
    assert [(c.method, c.cache, c.status) for c in curves] == [
        ("torch_func", "cold", "done"), ("engine", "cold", "done"), ("engine", "warm", "done")], \
        [c.note for c in curves]
    pids = [c.pid for c in curves]
    assert None not in pids and len(set(pids)) == 3 and os.getpid() not in pids
    for c in curves:
        assert c.ns == [1, 2, 5, 30] and c.calls == 30
        assert all(a <= b for a, b in zip(c.seconds, c.seconds[1:])), c.seconds
        grid = [int(n) for n, _ in c.points]
        assert grid == [n for n in ttn.record_grid([1, 2, 5, 30])]
        assert all(a[1] <= b[1] for a, b in zip(c.points, c.points[1:]))
        assert dict((int(n), s) for n, s in c.points)[30] == c.at(30)
        assert 0 < c.entered_s <= c.imported_s <= c.built_s <= c.first_call_at_s
    func, cold, warm = curves
    # Cold folders are new and empty, one per method; the warm curve reuses its cold curve's.
    assert func.cache_dir != cold.cache_dir
    assert func.cache_entries == 0 and cold.cache_entries == 0
    assert warm.cache_dir == cold.cache_dir
    assert warm.cache_entries == cold.cache_entries_after
    assert not Path(cold.cache_dir).exists(), "the cache folders are removed after the curves"


@pytest.mark.slow
def test_a_tier_variant_runs_the_default_path_with_its_variables(factory_env: dict[str, str]) -> None:
    env = {**factory_env, "TTN_WANT_FUSED_MODE": "off"}
    off, plain = ttn.measure(None, None, [("engine+off", "cold"), ("engine", "cold")], factory="ttn_user_model:build",
                             ns=(1, 2), max_seconds=60.0, grace_s=240.0, env={**env, "VMAPBENCH_FUSED": None})
    assert (off.method, off.status, off.label, off.ns) == ("engine+off", "done", "ours, tier off", [1, 2]), off
    assert plain.status == "failed" and "not 'off'" in plain.note, plain  # the check can fail
    assert ttn.run_method("engine+xla") == ("engine", {"VMAPBENCH_FUSED_BACKEND": "xla"})
    assert ttn.run_method("jax") == ("jax", {})


def test_a_curve_asking_for_xla_where_it_cannot_run_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from engine import fused_xla

    spec = importlib.util.spec_from_file_location("_ttn_child", ttn.CHILD)
    child = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the child's import sets its sys.path[0]
    spec.loader.exec_module(child)
    monkeypatch.setenv("VMAPBENCH_FUSED_BACKEND", "xla")
    monkeypatch.setattr(fused_xla, "available", lambda: "jax is not installed (pip install 'jax[cpu]')")
    with pytest.raises(NotImplementedError, match="XLA backend cannot run here: jax is not installed"):
        child._require_backend("engine")
    child._require_backend("torch_func")  # not the engine's: nothing asked of the tier
    monkeypatch.setattr(fused_xla, "available", lambda: None)
    child._require_backend("engine")


def test_budget_stops_a_curve_and_failures_are_named(factory_env: dict[str, str]) -> None:
    sleepy, broken, not_callable, absent = _measure(
        factory_env, [("sleepy", "cold"), ("broken", "cold"), ("not_callable", "cold"), ("absent", "cold")],
        ns=(1, 2, 5, 30), max_seconds=0.12)
    assert sleepy.status == "budget" and "--max-seconds" in sleepy.note
    assert sleepy.calls < 30 and sleepy.ns == [n for n in (1, 2, 5, 30) if n <= sleepy.calls]
    assert int(sleepy.points[-1][0]) == sleepy.calls
    assert broken.status == "failed" and "ValueError" in broken.note and "broken" in broken.note
    assert broken.ns == [] and broken.calls == 0
    assert not_callable.status == "failed" and "not a zero-argument callable" in not_callable.note
    assert absent.status == "skipped" and "no absent method" in absent.note
    # --min-calls K: the budget stops no curve before K calls, on a machine of any speed.
    (asked,) = _measure(factory_env, [("sleepy", "cold")], ns=(1, 2, 5, 30), max_seconds=0.01, min_calls=5)
    assert asked.status == "budget" and asked.calls == 5 and asked.ns == [1, 2, 5], asked.note
    with pytest.raises(ValueError, match="min_calls"):
        _measure(factory_env, [("sleepy", "cold")], min_calls=0)


@pytest.mark.slow
def test_a_process_past_its_grace_is_killed(factory_env: dict[str, str]) -> None:
    (hangs,) = ttn.measure(None, None, [("hangs", "cold")], factory="ttn_user_model:build", ns=(1, 2),
                           max_seconds=0.1, grace_s=2.0, env=factory_env)
    assert hangs.status == "killed" and "--grace-s" in hangs.note
    assert hangs.pid is not None and hangs.ns == [] and hangs.points == []


def test_warm_needs_its_cold_curve_first() -> None:
    with pytest.raises(ValueError, match="needs its cold curve first"):
        ttn.measure(None, None, [("engine", "warm")], factory="x:y")
    with pytest.raises(ValueError, match="positive"):
        ttn.measure(None, None, [("engine", "cold")], factory="x:y", ns=(0, 5))


def test_record_grid_holds_the_asked_n() -> None:
    grid = ttn.record_grid([1, 2, 5, 30, 300, 3000])
    assert grid == sorted(set(grid)) and grid[0] == 1 and grid[-1] == 3000
    assert {1, 2, 5, 30, 300, 3000} <= set(grid) and len(grid) > 6
    assert ttn.record_grid([7, 40])[-1] == 40 and 7 in ttn.record_grid([7, 40])


def test_curves_of_each_registry_workload() -> None:
    import workloads

    for w in workloads.all_workloads():
        curves = ttn.curves_of(w.methods)
        methods = [m for m, _ in curves]
        assert any(m in ttn.OURS for m in methods), w.name
        for method, cache in curves:
            assert w.supports(method)
            if cache == "warm":
                assert methods.index(method) < curves.index((method, "warm")), "cold before warm"
        if "jax" in w.methods:
            assert ("jax", "cold") in curves
        compiled = [m for m in ttn.TORCH_COMPILE if m in w.methods]
        if compiled:
            assert (compiled[0], "cold") in curves and (compiled[0], "warm") in curves


def test_crossovers_on_log_log_axes() -> None:
    a = [[1, 1.0], [10, 2.0], [100, 3.0]]
    b = [[1, 0.5], [10, 2.5], [100, 10.0]]
    (cross,) = ttn.crossovers(a, b)
    assert 1 < cross[0] < 10 and 1.0 < cross[1] < 2.0
    assert ttn.crossovers(a, a[:1]) == []  # one common point: nothing to cross
    assert ttn.crossovers(b, [[1, 0.1], [10, 0.2], [100, 0.3]]) == []


def test_ours_over_jax_reads_the_cold_default_path() -> None:
    jax = ttn.Curve("w", "s", "jax", "cold", ns=[1, 30], seconds=[0.5, 1.0])
    cold = ttn.Curve("w", "s", "engine", "cold", ns=[1, 30], seconds=[1.0, 3.0])
    warm = ttn.Curve("w", "s", "engine", "warm", ns=[1, 30], seconds=[0.1, 0.1])
    assert ttn.ours_over_jax([jax, warm, cold], 1) == pytest.approx(2.0)
    assert ttn.ours_over_jax([jax, warm, cold], 30) == pytest.approx(3.0)
    assert ttn.ours_over_jax([jax, cold], 300) is None


def test_markdown_divides_by_the_jax_curve_or_says_it_has_none() -> None:
    jax = ttn.Curve("w", "s", "jax", "cold", ns=[1, 30], seconds=[0.5, 1.0], first_call_at_s=1.0)
    ours = ttn.Curve("w", "s", "engine", "cold", ns=[1, 30], seconds=[1.0, 3.0], first_call_at_s=1.0)
    doc = {"ns": [1, 30]}
    table = ttn.markdown(doc, [jax, ours])
    assert "| w | s | 2 | 3 |" in table and "No jax.jit curve" not in table
    alone = ttn.markdown(doc, [dataclasses.replace(jax, method="jax_jit"), ours])
    assert "No jax.jit curve to divide by" in alone and "| w | s | 2 | 3 |" not in alone
    assert "| w | ours, cold cache | 1 | 1 | 3 |" in alone  # the seconds are still shown


def test_suite_selects_the_profile_points_by_family() -> None:
    import re

    from suite import bench_time_to_n as b
    from suite import selection

    quick = b.selected("quick", ("cpu",))
    assert {w.family for w, _, _ in quick} == set(b.QUICK_FAMILIES)
    assert {c for _, c, _ in quick} == set(b.QUICK_CURVES) and len(quick) == 2 * len(b.QUICK_CURVES)
    full = b.selected("full", ("cpu",))
    assert {w.name for w, _, _ in full} == set(b.TimeToN.params[0])
    assert all(b.method_of(w, c) for w, c, _ in full)
    names = [f"bench_time_to_n.TimeToN.{m}({w!r}, {c!r}, {d!r})" for m in b.METRIC_NS
             for w in b.TimeToN.params[0] for c in b.TimeToN.params[1] for d in b.TimeToN.params[2]]
    for profile, points in (("quick", quick), ("full", b.selected("full", selection.PROFILE_DEVICES["full"]))):
        regexes = [re.compile(r) for r in selection.bench_regexes(profile)]
        chosen = {n for n in names if any(r.search(n) for r in regexes)}
        expected = {f"bench_time_to_n.TimeToN.{m}({w.name!r}, {c!r}, {d!r})" for w, c, d in points
                    for m, n in b.METRIC_NS.items() if n <= max(b.PROFILE_NS[profile])}
        assert chosen == expected, profile
    family = b.QUICK_FAMILIES[0]
    shard = [re.compile(r) for r in selection.bench_regexes("quick", [family])]
    assert {n.split("(")[1].split(",")[0].strip("'") for n in names if any(r.search(n) for r in shard)} == {
        w.name for w, _, _ in quick if w.family == family}


@pytest.mark.slow
def test_suite_point_measures_once_per_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from suite import bench_time_to_n as b

    monkeypatch.setenv("VMAPBENCH_PROFILE", "quick")
    monkeypatch.setenv("VMAPBENCH_PASS_DIR", str(tmp_path))
    w, curve, device = next(p for p in b.selected("quick", ("cpu",)) if p[1] == "torch_func")
    case = b.TimeToN()
    with pytest.raises(NotImplementedError, match="not in the quick profile"):
        case.setup(w.name, "ours_warm", "cpu")
    case.setup(w.name, curve, device)
    first = case.track_seconds_to_1(w.name, curve, device)
    (kept,) = tmp_path.glob("time-to-n-*.json")
    stamp = kept.stat().st_mtime_ns
    assert 0 < first <= case.track_seconds_to_30(w.name, curve, device) <= case.track_seconds_to_300(
        w.name, curve, device)
    assert kept.stat().st_mtime_ns == stamp, "the later metrics read the point's curve back"
    with pytest.raises(NotImplementedError, match="N=3000 not reached"):
        case.track_seconds_to_3000(w.name, curve, device)
    assert b.TimeToN.track_seconds_to_1.unit == "seconds"


def test_cli_refuses_what_it_cannot_measure() -> None:
    from vmapbench.cli import build_parser
    from vmapbench.commands.time_to_n import main

    parser = build_parser(load=["time-to-n"])
    for argv, message in ((["time-to-n"], "name a workload"),
                          (["time-to-n", "--fn", "nocolon"], "MODULE:FUNCTION"),
                          (["time-to-n", "psg_mlp", "--fn", "m:f"], "name no registry workload"),
                          (["time-to-n", "psg_mlp", "-m", "opacus_nope"], "has no method")):
        with pytest.raises(SystemExit, match=message):
            main(parser.parse_args(argv))


def test_view_skips_a_file_that_is_no_results_file(tmp_path: Path) -> None:
    from dashboards.builder import build_dashboard

    bad = tmp_path / "results" / ttn.RESULTS_DIR / "some-box" / "deadbeef.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"machine": "some-box", "curves": [{"workload": "w"}]}')
    with pytest.warns(Warning, match="not a time-to-N results file"):
        built = build_dashboard(tmp_path / "results", tmp_path / "out")
    assert built.pages["time_to_n.html"] == 0
    assert "No time-to-N results" in (tmp_path / "out" / "time_to_n.html").read_text(encoding="utf-8")


def test_view_draws_every_workload_with_crossovers(tmp_path: Path) -> None:
    import shutil

    from dashboards.builder import build_dashboard

    results = tmp_path / "results"
    shutil.copytree(REPO / "results" / ttn.RESULTS_DIR, results / ttn.RESULTS_DIR)
    built = build_dashboard(results, tmp_path / "out")
    files = ttn.newest(results)
    _, curves = ttn.load(files[0])
    assert built.pages["time_to_n.html"] == len({c.workload for c in curves})
    page = (tmp_path / "out" / "time_to_n.html").read_text(encoding="utf-8")
    assert "crosses" in page and "jax.jit, time to N from the first call" in page
    assert "jax.jit, time to N from process start" in page
