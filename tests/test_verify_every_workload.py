"""Shadow verification over every workload (issue 25): `vmapbench run W -m engine --verify` for
each workload of the registry at its first quick size, in this process. Every replay of the
engine's automatic traces also runs its eager call and must equal it bit for bit; a mismatch is a
failed method and a non-zero exit (tests/test_cli_edges.py plants one and sees it fail). The
workloads are how users write code (torch.nn models, torch.distributions, functional_call,
Python loops around transforms), so this is the net under automatic tracing on real programs,
not only on the adversarial cases. Slow (every workload's set-up and first calls): CI runs it."""
from __future__ import annotations

import pytest

from vmapbench.cli import main
from workloads.base import all_workloads

ENGINE_WORKLOADS = sorted(w.name for w in all_workloads() if "engine" in w.methods)
# Workloads whose `engine` method automatic tracing runs eagerly (nothing replays, so nothing is
# verified), and why; every other workload must replay, and have its replays checked.
# (mlp_hvp left it when engine.vjp's vjp_fns became replayable: engine.autovjp.)
EAGER: dict[str, str] = {}


@pytest.mark.slow
@pytest.mark.parametrize("name", ENGINE_WORKLOADS)
def test_engine_replays_of_every_workload_equal_their_eager_calls(name, monkeypatch, capsys):
    monkeypatch.setattr("vmapbench.commands.run.warm_up", lambda methods, device, console: None)
    code = main(["run", name, "-m", "engine", "--repeat", "3", "--warmup", "4", "--no-memory", "--verify"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verify: " in out and "no mismatch" in out, out
    checked = int(out.split("verify: ")[1].split(" replays")[0])
    if name in EAGER:
        assert checked == 0, f"{name} replays now ({checked} checked): take it off EAGER"
    else:
        assert checked >= 3, f"{name}: only {checked} replays were verified\n{out}"
