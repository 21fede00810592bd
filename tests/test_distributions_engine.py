"""torch.distributions as users write them (default validate_args) under the engine's transforms.

Every distribution class of torch.distributions gets a small log density of 4 unconstrained
parameters; its per-chain gradients (vmap of grad), per-chain Hessians (vmap of hessian), a
forward-over-reverse Hessian (jacfwd of grad) and the traced per-chain gradient are compared with
an explicit loop of plain autograd, with the engine's for-loop fallback forbidden. An invalid
parameter in one batch element must still raise the distribution's own ValueError, eagerly and
from a traced function (the check is a guard the replay evaluates).
"""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributions as D
import torch.func as tf
import torch.nn.functional as F

import engine

DT = torch.float64
_G = torch.Generator().manual_seed(0)


def _randn(*shape):
    return torch.randn(*shape, generator=_G, dtype=DT)


def _positive(*shape):
    return torch.rand(*shape, generator=_G, dtype=DT) + 0.5


def _unit(*shape):
    return torch.rand(*shape, generator=_G, dtype=DT) * 0.8 + 0.1


def _simplex(*shape):
    return F.softmax(_randn(*shape), -1)


def sp(x):
    """softplus + 0.1: an unconstrained parameter made positive."""
    return F.softplus(x) + 0.1


def _counts(*values):
    return torch.tensor(values, dtype=DT)


_CORR = torch.linalg.cholesky(torch.tensor([[1.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 1.0]], dtype=DT))
_TRIL = torch.tensor([[0.0, 0.0], [0.3, 0.0]], dtype=DT)

# name -> (distribution from 4 unconstrained parameters t, a value in its support)
CASES = {
    "Normal": (lambda t: D.Normal(t[:2], sp(t[2:])), _randn(2)),
    "StudentT": (lambda t: D.StudentT(sp(t[0]) + 1, t[1:3], sp(t[3])), _randn(2)),
    "Bernoulli": (lambda t: D.Bernoulli(logits=t), _counts(0, 1, 1, 0)),
    "BernoulliProbs": (lambda t: D.Bernoulli(probs=torch.sigmoid(t)), _counts(0, 1, 1, 0)),
    "Poisson": (lambda t: D.Poisson(t.exp()), _counts(0, 3, 1, 2)),
    "Gamma": (lambda t: D.Gamma(sp(t[:2]), sp(t[2:])), _positive(2)),
    "Beta": (lambda t: D.Beta(sp(t[:2]), sp(t[2:])), _unit(2)),
    "Laplace": (lambda t: D.Laplace(t[:2], sp(t[2:])), _randn(2)),
    "Cauchy": (lambda t: D.Cauchy(t[:2], sp(t[2:])), _randn(2)),
    "LogNormal": (lambda t: D.LogNormal(t[:2], sp(t[2:])), _positive(2)),
    "MultivariateNormal": (lambda t: D.MultivariateNormal(t[:2], scale_tril=torch.diag_embed(sp(t[2:])) + _TRIL * t[0]), _randn(3, 2)),
    "MultivariateNormalCovariance": (lambda t: D.MultivariateNormal(t[:2], covariance_matrix=torch.diag_embed(sp(t[2:])) + 0.1), _randn(3, 2)),
    "MultivariateNormalPrecision": (lambda t: D.MultivariateNormal(t[:2], precision_matrix=torch.diag_embed(sp(t[2:])) + 0.1), _randn(3, 2)),
    "LowRankMultivariateNormal": (lambda t: D.LowRankMultivariateNormal(t[:2], t[2:].reshape(2, 1), sp(t[:2])), _randn(3, 2)),
    "HalfNormal": (lambda t: D.HalfNormal(sp(t)), _positive(4)),
    "HalfCauchy": (lambda t: D.HalfCauchy(sp(t)), _positive(4)),
    "Exponential": (lambda t: D.Exponential(sp(t)), _positive(4)),
    "Uniform": (lambda t: D.Uniform(t[:2] - 3, t[2:] + 3), _unit(2) - 0.5),
    "Categorical": (lambda t: D.Categorical(logits=t), torch.tensor([0, 3, 1])),
    "CategoricalProbs": (lambda t: D.Categorical(probs=F.softmax(t, -1)), torch.tensor([0, 3, 1])),
    "Binomial": (lambda t: D.Binomial(5, logits=t), _counts(0, 5, 2, 3)),
    "Dirichlet": (lambda t: D.Dirichlet(sp(t)), _simplex(4)),
    "Chi2": (lambda t: D.Chi2(sp(t)), _positive(4)),
    "ContinuousBernoulli": (lambda t: D.ContinuousBernoulli(logits=t), _unit(4)),
    "FisherSnedecor": (lambda t: D.FisherSnedecor(sp(t[:2]), sp(t[2:])), _positive(2)),
    # float32: torch 2.13's GeneralizedPareto compares its concentration with a float32 zero
    "GeneralizedPareto": (lambda t: D.GeneralizedPareto(t[:2] * 0, sp(t[2:]), 0.1 * torch.tanh(t[:2])), _positive(2).float()),
    "Geometric": (lambda t: D.Geometric(logits=t), _counts(0, 2, 1, 4)),
    "Gumbel": (lambda t: D.Gumbel(t[:2], sp(t[2:])), _randn(2)),
    "Independent": (lambda t: D.Independent(D.Normal(t[:2], sp(t[2:])), 1), _randn(3, 2)),
    "InverseGamma": (lambda t: D.InverseGamma(sp(t[:2]), sp(t[2:])), _positive(2)),
    "Kumaraswamy": (lambda t: D.Kumaraswamy(sp(t[:2]), sp(t[2:])), _unit(2)),
    "LKJCholesky": (lambda t: D.LKJCholesky(3, sp(t[0]) + 0.5), _CORR),
    "LogisticNormal": (lambda t: D.LogisticNormal(t[:3], sp(t[1:])), _simplex(4)),
    "MixtureSameFamily": (lambda t: D.MixtureSameFamily(D.Categorical(logits=t[:2]), D.Normal(t[2:], sp(t[:2]))), _randn(3)),
    "Multinomial": (lambda t: D.Multinomial(6, logits=t), _counts(1, 2, 0, 3)),
    "NegativeBinomial": (lambda t: D.NegativeBinomial(sp(t[:2]), logits=t[2:]), _counts(0, 3)),
    "OneHotCategorical": (lambda t: D.OneHotCategorical(logits=t), torch.eye(4, dtype=DT)[[0, 2]]),
    "OneHotCategoricalStraightThrough": (lambda t: D.OneHotCategoricalStraightThrough(logits=t), torch.eye(4, dtype=DT)[[1, 3]]),
    "Pareto": (lambda t: D.Pareto(sp(t[:2]) * 0 + 0.1, sp(t[2:])), _positive(2)),
    "RelaxedBernoulli": (lambda t: D.RelaxedBernoulli(torch.tensor(0.7, dtype=t.dtype), logits=t), _unit(4)),
    "RelaxedOneHotCategorical": (lambda t: D.RelaxedOneHotCategorical(torch.tensor(0.7, dtype=t.dtype), logits=t), _simplex(4)),
    "TransformedDistribution": (lambda t: D.TransformedDistribution(D.Normal(t[:2], sp(t[2:])), [D.ExpTransform(), D.AffineTransform(1.0, 2.0)]), _positive(2) + 1.5),
    "VonMises": (lambda t: D.VonMises(t[:2], sp(t[2:])), _unit(2)),
    "Weibull": (lambda t: D.Weibull(sp(t[:2]), sp(t[2:])), _positive(2)),
    "Wishart": (lambda t: D.Wishart(torch.tensor(4.0, dtype=t.dtype) + sp(t[0]), scale_tril=torch.diag_embed(sp(t[1:3]))), torch.tensor([[2.0, 0.3], [0.3, 1.0]], dtype=DT)),
}

NAMES = list(CASES)


def _logp(name):
    make, value = CASES[name]
    return lambda t: make(t).log_prob(value).sum()


def _params(name, k=3, scale=0.5):
    dtype = CASES[name][1].dtype if CASES[name][1].is_floating_point() else DT
    return (torch.randn(k, 4, generator=torch.Generator().manual_seed(1), dtype=DT) * scale).to(dtype)


def _tol(t):
    return {"atol": 1e-9, "rtol": 1e-7} if t.dtype == torch.float64 else {"atol": 1e-4, "rtol": 1e-4}


def _loop_grad(f, T):
    out = []
    for t in T:
        t = t.clone().requires_grad_(True)
        out.append(torch.autograd.grad(f(t), t)[0])
    return torch.stack(out)


def _loop_hessian(f, T):
    return torch.stack([torch.autograd.functional.hessian(f, t) for t in T])


@pytest.fixture(autouse=True)
def _no_fallback():
    with engine.fallback_policy("error"):
        yield


def test_every_distribution_class_has_a_case():
    classes = {
        n for n in D.__all__
        if inspect.isclass(getattr(D, n)) and issubclass(getattr(D, n), D.Distribution)
        and n not in ("Distribution", "ExponentialFamily")
    }
    assert classes <= {n for n in CASES} | {n.removesuffix("Probs") for n in CASES}, classes - set(CASES)


@pytest.mark.parametrize("name", NAMES)
def test_vmap_grad_matches_loop(name):
    f, T = _logp(name), _params(name)
    torch.testing.assert_close(engine.vmap(engine.grad(f))(T), _loop_grad(f, T), **_tol(T))


@pytest.mark.parametrize("name", NAMES)
def test_vmap_hessian_matches_loop(name):
    f, T = _logp(name), _params(name, k=2)
    torch.testing.assert_close(engine.vmap(engine.hessian(f))(T), _loop_hessian(f, T), **_tol(T))


@pytest.mark.parametrize("name", NAMES)
def test_jacfwd_of_grad_and_jacrev_match_loop(name):
    f, T = _logp(name), _params(name, k=1)
    t = T[0]
    torch.testing.assert_close(engine.jacfwd(engine.grad(f))(t), _loop_hessian(f, T)[0], **_tol(T))
    torch.testing.assert_close(engine.jacrev(f)(t), _loop_grad(f, T)[0], **_tol(T))


@pytest.mark.parametrize("name", NAMES)
def test_traced_vmap_grad_matches_loop(name):
    f, T = _logp(name), _params(name)
    traced = engine.trace(engine.vmap(engine.grad(f)))
    traced(T)
    T2 = T * 0.8 + 0.1
    torch.testing.assert_close(traced(T2), _loop_grad(f, T2), **_tol(T))
    assert traced.cache_info().traces == 1


def test_issue_example_matches_torch_func():
    X, y = torch.randn(40, 3), torch.randn(40)

    def logp(t):
        lik = D.Normal(X @ t[:3], t[3].exp()).log_prob(y).sum()
        return lik + D.Normal(0.0, 1.0).log_prob(t).sum()

    chains = torch.randn(6, 4)
    expected = tf.vmap(tf.grad(logp))(chains)
    torch.testing.assert_close(engine.vmap(engine.grad(logp))(chains), expected)
    torch.testing.assert_close(engine.trace(engine.vmap(engine.grad(logp)))(chains), expected)


# (distribution, index of a parameter to make invalid, invalid value)
INVALID = [("Normal", 3, -1.0), ("Gamma", 2, -1.0), ("Dirichlet", 1, -1.0), ("StudentT", 3, -2.0)]


def _raw(name):
    """The same families with the parameters passed as given, so a bad one reaches validation."""
    return {
        "Normal": lambda t: D.Normal(t[:2], t[2:]),
        "Gamma": lambda t: D.Gamma(t[:2], t[2:]),
        "Dirichlet": lambda t: D.Dirichlet(t),
        "StudentT": lambda t: D.StudentT(t[0], t[1:3], t[3]),
    }[name]


@pytest.mark.parametrize("name, index, bad", INVALID)
def test_an_invalid_parameter_in_one_chain_raises_the_distributions_error(name, index, bad):
    make, value = _raw(name), CASES[name][1]
    f = lambda t: make(t).log_prob(value).sum()  # noqa: E731
    good = torch.rand(3, 4, dtype=DT) + 1.0
    invalid = good.clone()
    invalid[1, index] = bad
    message = f"distribution {name}"
    for transform in (engine.vmap(engine.grad(f)), engine.vmap(engine.hessian(f)), engine.vmap(engine.jacfwd(f))):
        transform(good)
        with pytest.raises(ValueError, match=message):
            transform(invalid)
    traced = engine.trace(engine.vmap(engine.grad(f)))
    torch.testing.assert_close(traced(good), _loop_grad(f, good))
    with pytest.raises(ValueError, match=message):
        traced(invalid)  # the replay's guard fails: the function runs eagerly and raises
    torch.testing.assert_close(traced(good * 1.5), _loop_grad(f, good * 1.5))
    assert traced.cache_info().traces == 1


def test_validate_args_stays_on_inside_the_engine():
    seen = []

    def f(t):
        d = D.Normal(t[:2], t[2:].exp())
        seen.append(d._validate_args)
        return d.log_prob(torch.zeros(2)).sum()

    engine.vmap(engine.grad(f))(torch.randn(3, 4))
    engine.trace(engine.vmap(engine.grad(f)))(torch.randn(3, 4))
    assert seen and all(seen)


def test_traced_function_still_refuses_a_number_read_off_a_tensor():
    f = lambda t: D.Normal(t[:2], t[2:].exp()).log_prob(torch.zeros(2)).sum() * float(t.sum())  # noqa: E731
    with pytest.raises(engine.UntraceableError, match="_local_scalar_dense"):
        engine.trace(engine.grad(f))(torch.randn(4))


@pytest.mark.slow
def test_compiled_log_density_gradient_keeps_the_validation_guard(monkeypatch):
    import os

    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.join(root, ".inductor-cache"))
    make, value = _raw("Normal"), CASES["Normal"][1]
    f = lambda t: make(t).log_prob(value).sum()  # noqa: E731
    compiled = engine.compile(engine.vmap(engine.grad(f)))
    good = torch.rand(4, 4, dtype=DT) + 1.0
    torch.testing.assert_close(compiled(good), _loop_grad(f, good))
    torch.testing.assert_close(compiled(good + 1), _loop_grad(f, good + 1))
    bad = good.clone()
    bad[2, 3] = -1.0
    with pytest.raises(ValueError, match="distribution Normal"):
        compiled(bad)
