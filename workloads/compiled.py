"""Compiled variants of representative cases: engine.compile vs torch.compile(torch.func) vs the loop.

Each reuses another family's data and method builders, so it measures the same computation as
its eager counterpart; the eager loop and torch_func stay in for the side-by-side ratios. `jax`
is jax.jit of the same transform on the eager workload's jax.numpy twin: the natural peer of
torch.compile, XLA compiling the whole batched program. The compile happens on the first call
(`Workload.prepare`, kept apart from the timed runs) and is the costliest first call of the
registry, hence few cases, small sizes, and only `compiled_logreg_hessian` in the quick
profile (its 2 compiled methods and the closed form; not its loop, torch_func and jax, which
logreg_hessian's quick case already times).

`loop_compiled` (torch.compile of the per-example loss, the loop staying in Python) appears only
for per-sample gradients: AOTAutograd does not support the double backward a Hessian loop needs.
"""
from __future__ import annotations

from workloads import bayes_logreg, hessians, per_sample_grads
from workloads.define import define
from workloads.peers.jax_methods import with_jax

FAMILY = "compiled"

define(
    name="compiled_logreg_hessian",
    family=FAMILY,
    description="logreg_hessian compiled: engine.compile vs torch.compile(torch.func.hessian)",
    grid={"n": [1000], "d": [16, 64]},
    methods=("loop", "torch_func", "closed_form", "engine_compiled", "torch_func_compiled", "jax"),
    make_inputs=bayes_logreg.logreg_data,
    make_method=with_jax(bayes_logreg.logreg_hessian_method, bayes_logreg.logreg_hessian_jax),
    quick=("n=1000,d=64",),
    # logreg_hessian's quick case (the same data and size) times the same loop, torch_func and jax
    # programs; the compiled methods' ratio tracks still run the loop and torch_func beside them.
    not_in_quick=("loop", "torch_func", "jax"),
)

define(
    name="compiled_psg_mlp",
    family=FAMILY,
    description="psg_mlp compiled: engine.compile vs torch.compile(vmap(grad)) vs a loop over a compiled loss",
    grid={"batch": [64]},
    methods=("loop", "torch_func", "closed_form", "loop_compiled", "engine_compiled", "torch_func_compiled", "jax"),
    make_inputs=per_sample_grads.mlp_data,
    make_method=with_jax(per_sample_grads.mlp_method, per_sample_grads.psg_mlp_jax),
)

define(
    name="compiled_mlp_jacobian",
    family=FAMILY,
    description="mlp_jacobian compiled: engine.compile vs torch.compile(torch.func.jacrev)",
    grid={"hidden": [32]},
    methods=("loop", "torch_func", "closed_form", "engine_compiled", "torch_func_compiled", "jax"),
    make_inputs=hessians.jacobian_data,
    make_method=with_jax(hessians.jacobian_mlp_method, hessians.mlp_jacobian_jax),
)
