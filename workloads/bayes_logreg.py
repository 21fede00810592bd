"""Bayesian regression: the use case where Jacobian overhead matters.

Synthetic data (N examples, D features) with a standard Normal prior on the weights:
- `logreg_hessian`: Hessian of the negative log posterior of logistic regression (the Laplace
  approximation's precision matrix; its inverse is the posterior covariance). Closed form
  X^T diag(p(1-p)) X + I / prior_scale^2.
- `logreg_per_example_grads`: per-example log-likelihood gradients (SGLD, influence functions).
  Closed form (y - p) x.
- `robust_reg_hessian`: Student-t (robust) linear regression with an unknown noise scale: Hessian
  of the negative log posterior w.r.t. (weights, log sigma), the shape of a PPL model.

Each torch function `f` has its JAX twin `f_jax` right below it; `<workload>_jax` builds the
workload's `jax` method from them.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from workloads.define import define
from workloads.methods import hessian_method, per_sample_grads_method
from workloads.peers import jax_methods
from workloads.peers.jax_methods import jax, jnp, with_jax

FAMILY = "bayes_logreg"
PRIOR_SCALE = 1.0
STUDENT_NU = 4.0


def logreg_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    """X ~ N(0, 1), labels drawn from a logistic model, and a point theta to evaluate at."""
    n, d = params["n"], params["d"]
    X = torch.randn(n, d, generator=gen)
    true_theta = torch.randn(d, generator=gen) / math.sqrt(d)
    y = torch.bernoulli(torch.sigmoid(X @ true_theta), generator=gen)
    theta = 0.1 * torch.randn(d, generator=gen)
    return {"X": X, "y": y, "theta": theta}


def neg_log_posterior(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = X @ theta
    nll = (F.softplus(logits) - y * logits).sum()
    return nll + 0.5 * (theta * theta).sum() / PRIOR_SCALE**2


def neg_log_posterior_jax(theta: Any, X: Any, y: Any) -> Any:
    logits = X @ theta
    nll = (jax.nn.softplus(logits) - y * logits).sum()
    return nll + 0.5 * (theta * theta).sum() / PRIOR_SCALE**2


def logreg_hessian_closed_form(X: torch.Tensor, y: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    eye = torch.eye(X.shape[1], dtype=X.dtype, device=X.device) / PRIOR_SCALE**2

    def hess(theta: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(X @ theta)
        return X.T @ ((p * (1 - p)).unsqueeze(1) * X) + eye
    return hess


def logreg_hessian_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    X, y = inputs["X"], inputs["y"]
    return hessian_method(
        method, lambda theta: neg_log_posterior(theta, X, y), inputs["theta"], logreg_hessian_closed_form(X, y)
    )


def logreg_hessian_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    return jax_methods.hessian(neg_log_posterior_jax, inputs["theta"], inputs["X"], inputs["y"])


LOGREG_HESSIAN_METHODS = ("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", "closed_form")

define(
    name="logreg_hessian",
    family=FAMILY,
    description="Hessian of a Bayesian logistic-regression log posterior (Laplace approximation)",
    grid={"n": [100, 1000, 10000], "d": [16, 64, 256]},
    methods=(*LOGREG_HESSIAN_METHODS, "jax"),
    make_inputs=logreg_data,
    make_method=with_jax(logreg_hessian_method, logreg_hessian_jax),
    quick=("n=1000,d=64",),
)


def log_likelihood(params: tuple[torch.Tensor, ...], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Bernoulli log-likelihood of one example (x: [D]) or per example of a batch (x: [N, D])."""
    (theta,) = params
    logit = x @ theta
    return y * logit - F.softplus(logit)


def log_likelihood_jax(params: tuple[Any, ...], x: Any, y: Any) -> Any:
    (theta,) = params
    logit = x @ theta
    return y * logit - jax.nn.softplus(logit)


def log_likelihood_grads_closed_form(params: tuple[torch.Tensor, ...], X: torch.Tensor, y: torch.Tensor):
    (theta,) = params
    return ((y - torch.sigmoid(X @ theta)).unsqueeze(1) * X,)


def logreg_grads_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    return per_sample_grads_method(
        method, log_likelihood, (inputs["theta"],), inputs["X"], inputs["y"], log_likelihood_grads_closed_form
    )


def logreg_per_example_grads_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    return jax_methods.per_sample_grads(log_likelihood_jax, (inputs["theta"],), inputs["X"], inputs["y"])


define(
    name="logreg_per_example_grads",
    family=FAMILY,
    description="Per-example log-likelihood gradients of logistic regression (SGLD, influence functions)",
    grid={"n": [64, 1024, 16384], "d": [16, 256]},
    methods=("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", "closed_form", "jax",
             "engine_chunked"),
    make_inputs=logreg_data,
    make_method=with_jax(logreg_grads_method, logreg_per_example_grads_jax),
    quick=("n=1024,d=16",),
    # functional_vectorize backpropagates N one-hot vectors at once: N x N floats (1 GB at N=16384).
    heavy=("n=16384,d=16", "n=16384,d=256"),
)


def robust_reg_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    """Linear data with Student-t noise (heavy tails, the reason for a robust likelihood)."""
    n, d = params["n"], params["d"]
    X = torch.randn(n, d, generator=gen)
    beta = torch.randn(d, generator=gen) / math.sqrt(d)
    chi2 = (torch.randn(n, int(STUDENT_NU), generator=gen) ** 2).sum(1)
    noise = torch.randn(n, generator=gen) / torch.sqrt(chi2 / STUDENT_NU)
    y = X @ beta + 0.5 * noise
    theta = torch.cat([0.1 * torch.randn(d, generator=gen), torch.tensor([math.log(0.5)])])
    return {"X": X, "y": y, "theta": theta}


def robust_neg_log_posterior(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """theta = (beta [D], log sigma); Student-t likelihood (nu fixed), N(0, 1) priors; constants dropped."""
    beta, log_sigma = theta[:-1], theta[-1]
    r = (y - X @ beta) * torch.exp(-log_sigma)
    nll = (0.5 * (STUDENT_NU + 1) * torch.log1p(r * r / STUDENT_NU)).sum() + y.shape[0] * log_sigma
    return nll + 0.5 * (beta * beta).sum() + 0.5 * log_sigma * log_sigma


def robust_neg_log_posterior_jax(theta: Any, X: Any, y: Any) -> Any:
    beta, log_sigma = theta[:-1], theta[-1]
    r = (y - X @ beta) * jnp.exp(-log_sigma)
    nll = (0.5 * (STUDENT_NU + 1) * jnp.log1p(r * r / STUDENT_NU)).sum() + y.shape[0] * log_sigma
    return nll + 0.5 * (beta * beta).sum() + 0.5 * log_sigma * log_sigma


def robust_reg_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    X, y = inputs["X"], inputs["y"]
    return hessian_method(method, lambda theta: robust_neg_log_posterior(theta, X, y), inputs["theta"])


def robust_reg_hessian_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    return jax_methods.hessian(robust_neg_log_posterior_jax, inputs["theta"], inputs["X"], inputs["y"])


define(
    name="robust_reg_hessian",
    family=FAMILY,
    description="Hessian of a Student-t robust regression log posterior w.r.t. (weights, log sigma)",
    grid={"n": [100, 1000, 10000], "d": [8, 64]},
    methods=("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", "jax"),
    make_inputs=robust_reg_data,
    make_method=with_jax(robust_reg_method, robust_reg_hessian_jax),
    quick=("n=1000,d=8",),
)
