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
    from workloads import bayes_logreg, hessians, per_sample_grads

    g = torch.Generator().manual_seed(0)
    lr = bayes_logreg.logreg_data({"n": 20, "d": 4}, g)
    rr = bayes_logreg.robust_reg_data({"n": 20, "d": 4}, g)
    mlp = hessians.mlp_data({"hidden": 8}, g)
    psg = per_sample_grads.mlp_data({"batch": 4}, g)
    cnn = per_sample_grads.cnn_data({"batch": 2}, g)
    return {
        "bayes_logreg.neg_log_posterior": (bayes_logreg.neg_log_posterior, (lr["theta"], lr["X"], lr["y"])),
        "bayes_logreg.robust_neg_log_posterior": (bayes_logreg.robust_neg_log_posterior, (rr["theta"], rr["X"], rr["y"])),
        "hessians.mlp_loss": (lambda t, X, y: hessians.mlp_loss(t, X, y, mlp["shapes"]), (mlp["theta"], mlp["X"], mlp["y"])),
        "hessians.rosenbrock": (hessians.rosenbrock, (torch.randn(8, generator=g),)),
        "per_sample_grads.mlp_loss": (lambda *a: per_sample_grads.mlp_loss(a[:4], a[4], a[5]).sum(), (*psg["params"], psg["x"], psg["y"])),
        "per_sample_grads.cnn_loss": (lambda *a: per_sample_grads.cnn_loss(a[:6], a[6], a[7]).sum(), (*cnn["params"], cnn["x"], cnn["y"])),
    }


@pytest.mark.parametrize("name", list(_workload_functions()))
def test_workload_functions_are_compliant(name):
    fn, args = _workload_functions()[name]
    rep = check_compliance(fn, *args, backward=True, double_backward=True)
    assert rep.ok, f"{name}:\n{rep}"
