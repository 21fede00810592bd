"""Bayesian models written the way users write them: log joints built from `torch.distributions`.

Each model's log joint is a function of one unconstrained parameter vector, built from
`torch.distributions` objects with their default `validate_args` (the argument and support checks
run on every call, so a vmap engine must batch them), the way Pyro/NumPyro-style code reads:
- `logreg`: Bayesian logistic regression, Bernoulli(logits) likelihood, Normal(0, 1) prior.
- `robust`: robust linear regression, StudentT likelihood with a HalfNormal prior on its scale
  (sampled as log sigma, with the change-of-variables term).
- `poisson`: Poisson GLM with a log link.
- `eight_schools`: the hierarchical eight-schools model, non-centered (mu, log tau, eta[8]),
  HalfCauchy prior on tau.

The tasks, one workload each, with a `model` grid parameter so every model meets every task:
- `bayes_chain_grads`: gradient of the log joint at K MCMC chains' states (vmap(grad)).
- `bayes_hmc`: a full HMC leapfrog trajectory (`LEAPFROG_STEPS` steps) of K chains at once.
- `bayes_laplace_hessian`: Hessian of the negative log joint at one point (Laplace approximation).
- `bayes_elbo_grad`: gradient of a mean-field Gaussian ELBO over S reparameterized particles.

Every model also has its gradient and Hessian written out by hand and batched by hand (for
logistic regression, `bayes_logreg`'s closed-form Hessian): the `closed_form` method of each task,
the speed limit a vmap engine approaches.

Each log joint has its JAX twin `<name>_jax` right below it, the torch.distributions log densities
written out in jax.numpy (`*_log_prob_jax` below); `<task>_jax` builds each task's `jax` method.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributions as D

from workloads.bayes_logreg import logreg_hessian_closed_form
from workloads.define import define
from workloads.methods import batched_grad_method, hessian_method, leapfrog_method, particle_grad_method
from workloads.peers import jax_methods
from workloads.peers.jax_methods import jax, jnp, with_jax

FAMILY = "bayes_models"
N_OBS, N_FEATURES = 256, 16
STUDENT_NU = 4.0
# The eight-schools data (Rubin 1981): treatment effects and their standard errors.
SCHOOLS_Y = (28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0)
SCHOOLS_SIGMA = (15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0)
MU_SCALE, TAU_SCALE = 5.0, 5.0
LEAPFROG_STEPS = 10

Data = dict[str, torch.Tensor]
_LOG_2PI = math.log(2 * math.pi)


@dataclass(frozen=True)
class Model:
    """One model: its data, its log joint (torch.distributions), the log joint's JAX twin and its
    hand-written derivatives.

    `log_joint(theta, data)` takes one parameter vector (`log_joint_jax` the same in jax.numpy); `grad(thetas, data)` takes a [K, P] batch
    and returns the K gradients of the log joint; `neg_hessian(theta, data)` is the Hessian of the
    negative log joint at one point. `step_size` keeps a leapfrog trajectory stable (about 0.2 /
    sqrt of the largest curvature near the points drawn).
    """

    name: str
    make_data: Callable[[torch.Generator], Data]
    dim: int
    log_joint: Callable[[torch.Tensor, Data], torch.Tensor]
    log_joint_jax: Callable[[Any, dict[str, Any]], Any]
    grad: Callable[[torch.Tensor, Data], torch.Tensor]
    neg_hessian: Callable[[torch.Tensor, Data], torch.Tensor]
    step_size: float


def _regression_data(gen: torch.Generator, likelihood: str) -> Data:
    X = torch.randn(N_OBS, N_FEATURES, generator=gen) / math.sqrt(N_FEATURES)
    eta = X @ torch.randn(N_FEATURES, generator=gen)
    if likelihood == "bernoulli":
        y = torch.bernoulli(torch.sigmoid(eta), generator=gen)
    elif likelihood == "student_t":
        chi2 = (torch.randn(N_OBS, int(STUDENT_NU), generator=gen) ** 2).sum(1)
        y = eta + 0.5 * torch.randn(N_OBS, generator=gen) / torch.sqrt(chi2 / STUDENT_NU)
    elif likelihood == "poisson":
        y = torch.poisson(eta.exp(), generator=gen)
    else:
        raise ValueError(f"unknown likelihood {likelihood!r}; expected bernoulli, student_t or poisson")
    return {"X": X, "y": y}


# --- torch.distributions' log densities in jax.numpy (for the twins) ---------------------------

def normal_log_prob_jax(x: Any, loc: Any, scale: Any) -> Any:
    return -0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale) - 0.5 * _LOG_2PI


def half_normal_log_prob_jax(x: Any, scale: Any) -> Any:
    return math.log(2) + normal_log_prob_jax(x, 0.0, scale)


def half_cauchy_log_prob_jax(x: Any, scale: Any) -> Any:
    return math.log(2 / math.pi) - jnp.log(scale) - jnp.log1p((x / scale) ** 2)


def student_t_log_prob_jax(x: Any, df: float, loc: Any, scale: Any) -> Any:
    y = (x - loc) / scale
    z = jnp.log(scale) + 0.5 * math.log(df) + 0.5 * math.log(math.pi) + math.lgamma(0.5 * df) - math.lgamma(0.5 * (df + 1))
    return -0.5 * (df + 1) * jnp.log1p(y * y / df) - z


def bernoulli_logits_log_prob_jax(y: Any, logits: Any) -> Any:
    return y * logits - jax.nn.softplus(logits)


def poisson_log_prob_jax(k: Any, rate: Any) -> Any:
    return jax.scipy.special.xlogy(k, rate) - rate - jax.scipy.special.gammaln(k + 1)


# --- logistic regression ----------------------------------------------------------------------

def logreg_log_joint(theta: torch.Tensor, data: Data) -> torch.Tensor:
    prior = D.Normal(0.0, 1.0).log_prob(theta).sum()
    return prior + D.Bernoulli(logits=data["X"] @ theta).log_prob(data["y"]).sum()


def logreg_log_joint_jax(theta: Any, data: dict[str, Any]) -> Any:
    prior = normal_log_prob_jax(theta, 0.0, 1.0).sum()
    return prior + bernoulli_logits_log_prob_jax(data["y"], data["X"] @ theta).sum()


def logreg_grad(thetas: torch.Tensor, data: Data) -> torch.Tensor:
    X, y = data["X"], data["y"]
    return (y - torch.sigmoid(thetas @ X.T)) @ X - thetas


def logreg_neg_hessian(theta: torch.Tensor, data: Data) -> torch.Tensor:
    return logreg_hessian_closed_form(data["X"], data["y"])(theta)


# --- robust (Student-t) regression ------------------------------------------------------------

def robust_log_joint(theta: torch.Tensor, data: Data) -> torch.Tensor:
    beta, log_sigma = theta[:-1], theta[-1]
    sigma = log_sigma.exp()
    prior = D.Normal(0.0, 1.0).log_prob(beta).sum() + D.HalfNormal(1.0).log_prob(sigma) + log_sigma
    return prior + D.StudentT(STUDENT_NU, data["X"] @ beta, sigma).log_prob(data["y"]).sum()


def robust_log_joint_jax(theta: Any, data: dict[str, Any]) -> Any:
    beta, log_sigma = theta[:-1], theta[-1]
    sigma = jnp.exp(log_sigma)
    prior = normal_log_prob_jax(beta, 0.0, 1.0).sum() + half_normal_log_prob_jax(sigma, 1.0) + log_sigma
    return prior + student_t_log_prob_jax(data["y"], STUDENT_NU, data["X"] @ beta, sigma).sum()


def _robust_residuals(thetas: torch.Tensor, data: Data) -> tuple[torch.Tensor, ...]:
    """Standardized residuals r = (y - X beta) / sigma and the Student-t weights (nu+1)/(nu+r^2)."""
    beta, sigma = thetas[..., :-1], thetas[..., -1:].exp()
    r = (data["y"] - beta @ data["X"].T) / sigma
    return r, (STUDENT_NU + 1) / (STUDENT_NU + r * r), sigma


def robust_grad(thetas: torch.Tensor, data: Data) -> torch.Tensor:
    r, w, sigma = _robust_residuals(thetas, data)
    d_beta = (w * r / sigma) @ data["X"] - thetas[:, :-1]
    d_log_sigma = (w * r * r - 1).sum(1) - sigma[:, 0] ** 2 + 1
    return torch.cat([d_beta, d_log_sigma[:, None]], 1)


def robust_neg_hessian(theta: torch.Tensor, data: Data) -> torch.Tensor:
    # Per observation the log likelihood is g(r) - log sigma with g(r) = -(nu+1)/2 log(1 + r^2/nu):
    # Hessian = g''(r) grad(r) grad(r)^T + g'(r) hess(r), grad(r) = (-x/sigma, -r).
    r, w, sigma = _robust_residuals(theta, data)
    sigma = sigma[0]
    X, nu = data["X"], STUDENT_NU
    g1, g2 = -w * r, -(nu + 1) * (nu - r * r) / (nu + r * r) ** 2
    bb = (X.T * g2) @ X / sigma**2 - torch.eye(X.shape[1], dtype=X.dtype, device=X.device)
    bs = ((g2 * r + g1) @ X / sigma)[:, None]
    ss = (g2 * r * r + g1 * r).sum() - 2 * sigma**2
    return -torch.cat([torch.cat([bb, bs], 1), torch.cat([bs.T, ss.reshape(1, 1)], 1)], 0)


# --- Poisson GLM ------------------------------------------------------------------------------

def poisson_log_joint(theta: torch.Tensor, data: Data) -> torch.Tensor:
    prior = D.Normal(0.0, 1.0).log_prob(theta).sum()
    return prior + D.Poisson((data["X"] @ theta).exp()).log_prob(data["y"]).sum()


def poisson_log_joint_jax(theta: Any, data: dict[str, Any]) -> Any:
    prior = normal_log_prob_jax(theta, 0.0, 1.0).sum()
    return prior + poisson_log_prob_jax(data["y"], jnp.exp(data["X"] @ theta)).sum()


def poisson_grad(thetas: torch.Tensor, data: Data) -> torch.Tensor:
    X, y = data["X"], data["y"]
    return (y - (thetas @ X.T).exp()) @ X - thetas


def poisson_neg_hessian(theta: torch.Tensor, data: Data) -> torch.Tensor:
    X = data["X"]
    return (X.T * (X @ theta).exp()) @ X + torch.eye(X.shape[1], dtype=X.dtype, device=X.device)


# --- eight schools ----------------------------------------------------------------------------

def schools_data(gen: torch.Generator) -> Data:
    return {"y": torch.tensor(SCHOOLS_Y), "sigma": torch.tensor(SCHOOLS_SIGMA)}


def schools_log_joint(theta: torch.Tensor, data: Data) -> torch.Tensor:
    mu, log_tau, eta = theta[0], theta[1], theta[2:]
    tau = log_tau.exp()
    prior = D.Normal(0.0, MU_SCALE).log_prob(mu) + D.HalfCauchy(TAU_SCALE).log_prob(tau) + log_tau
    prior = prior + D.Normal(0.0, 1.0).log_prob(eta).sum()
    return prior + D.Normal(mu + tau * eta, data["sigma"]).log_prob(data["y"]).sum()


def schools_log_joint_jax(theta: Any, data: dict[str, Any]) -> Any:
    mu, log_tau, eta = theta[0], theta[1], theta[2:]
    tau = jnp.exp(log_tau)
    prior = (normal_log_prob_jax(mu, 0.0, MU_SCALE) + half_cauchy_log_prob_jax(tau, TAU_SCALE) + log_tau
             + normal_log_prob_jax(eta, 0.0, 1.0).sum())
    return prior + normal_log_prob_jax(data["y"], mu + tau * eta, data["sigma"]).sum()


def _schools_parts(thetas: torch.Tensor, data: Data) -> tuple[torch.Tensor, ...]:
    """mu, tau, eta, the likelihood's precisions a = 1/sigma^2 and scores e = a (y - mu - tau eta)."""
    mu, tau, eta = thetas[..., :1], thetas[..., 1:2].exp(), thetas[..., 2:]
    a = data["sigma"] ** -2
    return mu, tau, eta, a, a * (data["y"] - mu - tau * eta)


def schools_grad(thetas: torch.Tensor, data: Data) -> torch.Tensor:
    mu, tau, eta, _, e = _schools_parts(thetas, data)
    d_mu = -mu / MU_SCALE**2 + e.sum(1, keepdim=True)
    d_log_tau = -2 * tau**2 / (TAU_SCALE**2 + tau**2) + 1 + (e * tau * eta).sum(1, keepdim=True)
    return torch.cat([d_mu, d_log_tau, -eta + e * tau], 1)


def schools_neg_hessian(theta: torch.Tensor, data: Data) -> torch.Tensor:
    _, tau, eta, a, e = _schools_parts(theta, data)
    tau = tau[0]
    s2 = TAU_SCALE**2
    mm = -1 / MU_SCALE**2 - a.sum()
    mt = -(a * tau * eta).sum()
    tt = -2 * s2 * 2 * tau**2 / (s2 + tau**2) ** 2 + (tau * eta * e - a * tau**2 * eta**2).sum()
    me = -a * tau
    te = tau * e - a * tau**2 * eta
    ee = torch.diag(-1 - a * tau**2)
    top = torch.stack([torch.cat([mm.reshape(1), mt.reshape(1), me]), torch.cat([mt.reshape(1), tt.reshape(1), te])])
    return -torch.cat([top, torch.cat([me[:, None], te[:, None], ee], 1)], 0)


MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model("logreg", lambda gen: _regression_data(gen, "bernoulli"), N_FEATURES,
              logreg_log_joint, logreg_log_joint_jax, logreg_grad, logreg_neg_hessian, step_size=0.05),
        Model("robust", lambda gen: _regression_data(gen, "student_t"), N_FEATURES + 1,
              robust_log_joint, robust_log_joint_jax, robust_grad, robust_neg_hessian, step_size=0.01),
        Model("poisson", lambda gen: _regression_data(gen, "poisson"), N_FEATURES,
              poisson_log_joint, poisson_log_joint_jax, poisson_grad, poisson_neg_hessian, step_size=0.02),
        Model("eight_schools", schools_data, len(SCHOOLS_Y) + 2,
              schools_log_joint, schools_log_joint_jax, schools_grad, schools_neg_hessian, step_size=0.1),
    )
}
MODEL_NAMES = list(MODELS)


def model_of(inputs: dict[str, Any]) -> tuple[Model, Data]:
    return MODELS[inputs["model"]], inputs["data"]


def model_data(params: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    """The model's data and, per task, the points to evaluate at (all drawn from `gen`)."""
    name = params["model"]
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the Bayesian models are {', '.join(MODEL_NAMES)}")
    model = MODELS[name]
    inputs: dict[str, Any] = {"model": name, "data": model.make_data(gen)}
    if "chains" in params:
        inputs["points"] = 0.5 * torch.randn(params["chains"], model.dim, generator=gen)
        inputs["momenta"] = torch.randn(params["chains"], model.dim, generator=gen)
    elif "particles" in params:
        loc, log_scale = 0.3 * torch.randn(model.dim, generator=gen), torch.full((model.dim,), -1.0)
        inputs["variational"] = torch.cat([loc, log_scale])
        inputs["noise"] = torch.randn(params["particles"], model.dim, generator=gen)
    else:
        inputs["point"] = 0.5 * torch.randn(model.dim, generator=gen)
    return inputs


def _log_joint(model: Model, data: Data) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda theta: model.log_joint(theta, data)


def chain_grads_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    model, data = model_of(inputs)
    return batched_grad_method(method, _log_joint(model, data), inputs["points"], lambda q: model.grad(q, data))


def chain_grads_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    model, data = model_of(inputs)
    return jax_methods.batched_grad(model.log_joint_jax, inputs["points"], data)


def hmc_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    model, data = model_of(inputs)
    return leapfrog_method(method, _log_joint(model, data), inputs["points"], inputs["momenta"],
                           model.step_size, LEAPFROG_STEPS, lambda q: model.grad(q, data))


def hmc_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    model, data = model_of(inputs)
    return jax_methods.leapfrog(model.log_joint_jax, inputs["points"], inputs["momenta"], model.step_size,
                                LEAPFROG_STEPS, data)


def laplace_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    model, data = model_of(inputs)
    return hessian_method(method, lambda theta: -model.log_joint(theta, data), inputs["point"],
                          lambda theta: model.neg_hessian(theta, data))


def laplace_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    model, data = model_of(inputs)
    return jax_methods.hessian(lambda theta, data: -model.log_joint_jax(theta, data), inputs["point"], data)


def elbo_method(method: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    """Mean-field Gaussian guide q = Normal(loc, exp(log_scale)); each particle's ELBO term is
    log p(z) - log q(z) at z = loc + scale * noise (the reparameterization trick)."""
    model, data = model_of(inputs)
    dim = model.dim

    def elbo_term(variational: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        loc, scale = variational[:dim], variational[dim:].exp()
        guide = D.Normal(loc, scale)
        z = loc + scale * noise
        return model.log_joint(z, data) - guide.log_prob(z).sum()

    def closed_form(variational: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        # d/dloc = E[grad log p(z)]; d/dlog_scale = E[grad log p(z) * scale * noise] + 1 (the
        # entropy's; the path derivative of log q(z) vanishes).
        loc, scale = variational[:dim], variational[dim:].exp()
        g = model.grad(loc + scale * noise, data)
        return torch.cat([g.mean(0), (g * noise).mean(0) * scale + 1])
    return particle_grad_method(method, elbo_term, inputs["variational"], inputs["noise"], closed_form)


def elbo_jax(inputs: dict[str, Any]) -> Callable[[], Any]:
    """elbo_method's twin: the guide's log density written out (normal_log_prob_jax)."""
    model, data = model_of(inputs)
    dim = model.dim

    def elbo_term(variational: Any, noise: Any, data: dict[str, Any]) -> Any:
        loc, scale = variational[:dim], jnp.exp(variational[dim:])
        z = loc + scale * noise
        return model.log_joint_jax(z, data) - normal_log_prob_jax(z, loc, scale).sum()
    return jax_methods.particle_grad(elbo_term, inputs["variational"], inputs["noise"], data)


BAYES_METHODS = ("loop", "engine", "engine_traced", "torch_func", "closed_form", "jax")


def define_task(name: str, description: str, batch: dict[str, list[int]], make_method: Callable[..., Any],
                twin: Callable[[dict[str, Any]], Callable[[], Any]], quick: str | None,
                methods: tuple[str, ...] = BAYES_METHODS) -> None:
    """Register one task over every model (`model` grid parameter) and the batch sizes of `batch`,
    `twin` its jax method; `quick` names its size in `make bench`'s quick profile (None: not in it)."""
    define(name=name, family=FAMILY, description=description, grid={"model": MODEL_NAMES, **batch},
           methods=methods, make_inputs=model_data, make_method=with_jax(make_method, twin),
           quick=(quick,) if quick else ())


define_task(
    "bayes_chain_grads",
    "Gradient of a torch.distributions log joint at K MCMC chains' states (vmap(grad)); "
    f"models: {', '.join(MODEL_NAMES)}",
    {"chains": [16, 128, 1024]}, chain_grads_method, chain_grads_jax, quick="model=logreg,chains=128",
)
define_task(
    "bayes_hmc",
    f"HMC: one {LEAPFROG_STEPS}-step leapfrog trajectory of K chains at once (each step a vmap(grad) of a "
    "torch.distributions log joint); returns the final positions and momenta",
    # Out of the quick profile (10 min budget): its loop is the slowest of the quick cases.
    {"chains": [8, 64, 1024]}, hmc_method, hmc_jax, quick=None,
)
define_task(
    "bayes_laplace_hessian",
    "Laplace approximation: Hessian of a torch.distributions negative log joint at one point",
    {}, laplace_method, laplace_jax, quick=None,  # the quick profile keeps two tasks (10 min budget)
    methods=("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", "closed_form", "jax"),
)
define_task(
    "bayes_elbo_grad",
    "SVI: gradient of a mean-field Gaussian ELBO averaged over S reparameterized particles "
    "(grad of a vmap over particles of a torch.distributions log joint)",
    {"particles": [16, 64, 1024]}, elbo_method, elbo_jax, quick=None,
)
