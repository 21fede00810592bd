"""Composite-compliance checker: it flags each construct vmap cannot batch, and the workloads'
functions (forward, backward, double backward) come out clean."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import engine
from engine.compliance import check_compliance


def _kinds(report):
    return {i.kind for i in report.issues}


def test_clean_function_is_compliant_through_double_backward():
    rep = check_compliance(lambda x, w: torch.tanh(x @ w).pow(2).sum(), torch.randn(3, 4), torch.randn(4, 2),
                           backward=True, double_backward=True)
    assert rep.ok, str(rep)
    assert rep.ops_seen > 5


@pytest.mark.parametrize(
    "fn, kind, op",
    [
        (lambda x: x.sum().item() * x, "data-dependent access", "item"),
        (lambda x: x * 2 if x.sum() > 0 else x, "data-dependent access", "__bool__"),
        (lambda x: x * x.data_ptr() % 2, "data-dependent access", "data_ptr"),
        (lambda x: torch.sin(x, out=torch.empty(3)), "out= variant", "sin"),
        (lambda x: torch.zeros(3).add_(x), "in-place write into an unbatched tensor", "add_"),
        (lambda x: x.clone().unsqueeze_(0), "metadata mutation", "unsqueeze_"),
        (lambda x: x.clone().resize_(6), "metadata mutation", "resize_"),
    ],
    ids=["item", "bool", "data_ptr", "out", "inplace_unbatched", "inplace_view", "resize"],
)
def test_flags_each_construct(fn, kind, op):
    rep = check_compliance(fn, torch.randn(3))
    assert kind in _kinds(rep), str(rep)
    issue = next(i for i in rep.issues if i.kind == kind)
    assert op in issue.op and issue.hint and "test_compliance.py" in issue.where


def test_in_place_into_derived_tensor_is_fine():
    rep = check_compliance(lambda x: torch.zeros_like(x).add_(x).mul_(2), torch.randn(3))
    assert rep.ok, str(rep)


def test_backward_issue_is_reported_in_backward_phase():
    class LeakyGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * float(g.sum())  # reads a value: breaks vmap over the backward pass

    rep = check_compliance(lambda x: LeakyGrad.apply(x).sum(), torch.randn(3), backward=True)
    assert any(i.phase == "backward" and i.kind == "data-dependent access" for i in rep.issues), str(rep)


def test_checker_agrees_with_vmap():
    """What the checker flags really fails under engine.vmap, and what it passes really runs."""
    bad = lambda x: torch.zeros(3).add_(x)  # noqa: E731
    good = lambda x: torch.zeros(3).add(x)  # noqa: E731
    assert not check_compliance(bad, torch.randn(3)).ok
    with pytest.raises(Exception):
        engine.vmap(bad)(torch.randn(2, 3))
    assert check_compliance(good, torch.randn(3)).ok
    engine.vmap(good)(torch.randn(2, 3))


def _workload_functions():
    from vmapbench.commands.compliance import workload_functions

    return workload_functions()


@pytest.mark.parametrize("name", list(_workload_functions()))
def test_workload_functions_are_compliant(name):
    fn, args = _workload_functions()[name]
    rep = check_compliance(fn, *args, backward=True, double_backward=True)
    assert rep.ok, f"{name}:\n{rep}"


def test_cli_reports_and_exit_code(capsys):
    from vmapbench.cli import main

    assert main(["compliance", "hessians.rosenbrock"]) == 0
    assert "compliant" in capsys.readouterr().out
    assert main(["compliance", "--list"]) == 0
