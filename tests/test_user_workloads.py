"""The workloads written the way users write them (torch.distributions models, torch.func tutorials):
every grid point beyond the first, at the smallest batch, agrees with the float64 loop in every
method, with engine fallbacks forbidden (tests/test_workloads.py covers each workload's first size).

The Bayesian models also have hand-written derivatives (the closed forms); they are checked here
against autograd directly, since a closed form that is wrong would make `closed_form` fail only
as a whole.
"""
from __future__ import annotations

import pytest
import torch

import workloads
from workloads import COMPILED_METHODS, bayes_models
from peer_skips import skip_unless_installed

FAMILIES = ("bayes_models", "torch_func_tutorials")


def smallest_sizes_beyond_first(w: workloads.Workload) -> list[str]:
    """Each combination of the non-numeric grid values (models, formulations, tasks), with every
    numeric parameter at its smallest value; the workload's first size is left to test_workloads."""
    out = []
    for size in w.sizes[1:]:
        params = w.params(size)
        if all(not isinstance(v, int) or v == min(w.grid[k]) for k, v in params.items()):
            out.append(size)
    return out


def _cases() -> list:
    cases = []
    for family in FAMILIES:
        for w in workloads.all_workloads(family):
            for size in smallest_sizes_beyond_first(w):
                for method in w.methods:
                    if method in COMPILED_METHODS:
                        continue
                    cases.append(pytest.param(w.name, size, method, id=f"{w.name}[{size}]-{method}"))
    return cases


_states: dict[tuple[str, str], object] = {}


@pytest.mark.parametrize("name,size,method", _cases())
def test_method_matches_float64_loop_without_fallback(name: str, size: str, method: str) -> None:
    import engine

    skip_unless_installed(method)
    w = workloads.get(name)
    if (name, size) not in _states:
        _states[name, size] = w.setup(w.params(size), "cpu")
    with engine.fallback_policy("error"):
        w.check(_states[name, size], [method])


def test_every_model_and_task_is_in_the_grid() -> None:
    tasks = workloads.all_workloads("bayes_models")
    assert {w.name for w in tasks} == {"bayes_chain_grads", "bayes_hmc", "bayes_laplace_hessian", "bayes_elbo_grad"}
    for w in tasks:
        assert w.grid["model"] == list(bayes_models.MODELS), w.name
    # make bench's 10-minute budget keeps a few of these in the quick profile: each of another model
    quick_models = [workloads.get(w.name).params(s)["model"] for w in tasks for s in w.quick]
    assert quick_models and len(quick_models) == len(set(quick_models)), quick_models
    assert all(any(w.quick for w in workloads.all_workloads(f)) for f in FAMILIES), "a quick workload per family"


@pytest.mark.parametrize("model", list(bayes_models.MODELS))
def test_closed_form_derivatives_match_autograd(model: str) -> None:
    m = bayes_models.MODELS[model]
    data = {k: v.double() for k, v in m.make_data(torch.Generator().manual_seed(1)).items()}
    points = 0.5 * torch.randn(3, m.dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grads = torch.stack([torch.func.grad(m.log_joint)(p, data) for p in points])
    torch.testing.assert_close(m.grad(points, data), grads)
    hessian = torch.func.hessian(lambda t: -m.log_joint(t, data))(points[0])
    torch.testing.assert_close(m.neg_hessian(points[0], data), hessian)


def test_log_joints_validate_their_arguments() -> None:
    """The models keep torch.distributions' default validation: a bad value raises, not NaN."""
    m = bayes_models.MODELS["poisson"]
    data = m.make_data(torch.Generator().manual_seed(0))
    data["y"] = data["y"] - 0.5  # not counts
    with pytest.raises(ValueError, match="Poisson"):
        m.log_joint(torch.zeros(m.dim), data)
