"""Rough edges of the command line (issue 15 part 8): each one fails loudly or prints what it says."""
from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from vmapbench.cli import main


def render(table) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    return out.getvalue()


def test_run_table_drops_the_memory_column_with_no_memory():
    from vmapbench.commands.run import results_table
    from workloads import get
    from measuring.measurement import Measurement

    w = get("mlp_hvp")
    size = w.quick[0]
    results = {m: Measurement(w.name, m, size, "cpu", 0.01, [0.001, 0.002], 1 << 20) for m in ("loop", "torch_func")}
    with_memory = results_table(w, size, "cpu", ["loop", "torch_func", "engine"], 2, results, {"engine": "boom"}, True)
    without = results_table(w, size, "cpu", ["loop", "torch_func", "engine"], 2, results, {"engine": "boom"}, False)
    assert len(with_memory.columns) == 6 and "memory/call" in render(with_memory)
    assert len(without.columns) == 5 and "memory/call" not in render(without)
    assert all(col.header for col in without.columns)


@pytest.mark.slow  # imports the OpInfo database
def test_coverage_rejects_unknown_ops_naming_them(capsys):
    assert main(["coverage", "--ops", "sin,nosuchop", "--no-write"]) == 2
    err = capsys.readouterr().err
    assert "--ops names 'nosuchop', which" in err  # only the unknown one is named


def test_coverage_per_op_cells_have_no_empty_style_tags():
    from vmapbench.coverage_report import _cell

    assert _cell(None) == "-" and _cell("") == "-"
    assert "[]" not in _cell("native") and "native" in _cell("native")
    out = io.StringIO()
    Console(file=out, width=80).print(_cell(None))
    assert out.getvalue().strip() == "-"


def test_compliance_accepts_a_workload_name(capsys):
    assert main(["compliance", "rosenbrock_hessian"]) == 0
    assert "hessians.rosenbrock: compliant" in capsys.readouterr().out


def test_compliance_names_what_is_wrong_with_a_target():
    with pytest.raises(SystemExit, match="'mlp_jvp' has no function registered"):
        main(["compliance", "mlp_jvp"])
    with pytest.raises(SystemExit, match="unknown target 'nosuch'"):
        main(["compliance", "nosuch"])


def test_run_method_opacus_means_every_opacus_mode_the_workload_has() -> None:
    import workloads
    from vmapbench.commands.run import expand_method

    psg = workloads.get("psg_mlp")
    assert expand_method(psg, "opacus") == ["opacus_hooks", "opacus_ew", "opacus_functorch"]
    assert expand_method(psg, "opacus_ew") == ["opacus_ew"]
    lstm = workloads.get("nn_lstm")  # Opacus' hooks and functorch modes fail on nn.LSTM: only ew is listed
    assert expand_method(lstm, "opacus") == ["opacus_ew"]
    hessian = workloads.get("logreg_hessian")  # no Opacus method: the name stays, and is refused as unknown
    assert expand_method(hessian, "opacus") == ["opacus"]


def test_run_pays_the_one_time_imports_before_measuring_any_method(monkeypatch, capsys):
    """Issue 28.5: the warm-up (suite.probes.preload, given the chosen methods) runs before the
    first method's first call, whatever the order of -m; the output says what it paid."""
    import sys

    from suite import probes
    from workloads import get

    events: list[tuple] = []
    real_preload, workload = probes.preload, get("mlp_hvp")
    real_prepare = type(workload).prepare

    def preload(methods, device="cpu"):
        events.append(("warm-up", tuple(methods), device))
        return real_preload(methods, device)

    def prepare(self, method, state):
        events.append(("first call", method, "torch._dynamo" in sys.modules))
        return real_prepare(self, method, state)

    monkeypatch.setattr(probes, "preload", preload)
    monkeypatch.setattr(type(workload), "prepare", prepare)
    for order in (["torch_func", "engine"], ["engine", "torch_func"]):
        events.clear()
        assert main(["run", "mlp_hvp", "-m", ",".join(order), "--repeat", "1", "--warmup", "1", "--no-memory"]) == 0
        assert events == [("warm-up", tuple(order), "cpu"), *[("first call", m, True) for m in order]]
        out = capsys.readouterr().out
        assert "warm-up:" in out and "torch._dynamo" in out and "engine" in out.split("warm-up:")[1]


def test_warm_up_pays_only_what_the_methods_need():
    from suite.probes import preload

    assert preload(["loop", "torch_func"]) == ["torch._dynamo", "torch._inductor", "torch.func"]
    assert preload(["loop", "engine_traced"])[-1] == "engine"


@pytest.mark.parametrize("argv, listing", [
    (["/venv/lib/asv/benchmark.py", "discover", "suite", "out.json"], True),
    (["/venv/lib/asv/benchmark.py", "check", "suite"], True),
    (["/venv/lib/asv/benchmark.py", "run_server", "suite", "sock"], False),
    (["/venv/lib/asv/benchmark.py", "run", "suite", "id"], False),
    (["-m", "discover"], False),
])
def test_asv_listing_the_suite_warms_nothing(monkeypatch, argv, listing):
    """asv's `discover` and `check` import the suite and run no benchmark: the suite's warm-up
    (preload with no methods, at each benchmark module's import) is skipped there alone."""
    from suite import probes

    monkeypatch.setattr(sys, "argv", argv)
    assert probes.asv_lists_only() is listing
    if listing:
        assert probes.preload() == []


def test_run_verify_checks_the_engines_replays_and_fails_a_mismatch(monkeypatch, capsys):
    """`vmapbench run W --verify`: the engine's replays are shadow-verified (issue 25); a planted
    wrong replay is a failed method, with ReplayMismatchError named."""
    from engine import autotrace

    monkeypatch.setattr("vmapbench.commands.run.warm_up", lambda methods, device, console: None)
    args = ["run", "logreg_hessian", "-m", "engine", "--repeat", "2", "--warmup", "3", "--no-memory", "--verify"]
    assert main(args) == 0
    out = capsys.readouterr().out
    checked = int(out.split("verify: ")[1].split(" replays")[0])
    assert checked >= 2 and "no mismatch" in out

    real = autotrace.AutoTraced._shadow

    def planted(self, args, kwargs, fast, key):  # a replay that is off by a little
        out = real(self, args, kwargs, fast, key)
        raise autotrace.ReplayMismatchError(f"planted: {type(out).__name__}")

    monkeypatch.setattr(autotrace.AutoTraced, "_shadow", planted)
    assert main(args) != 0
    out = capsys.readouterr().out
    assert "ReplayMismatchError" in out and "a mismatch" in out
