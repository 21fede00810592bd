"""What the regression gate and the asv suite count under valgrind's callgrind (measuring.counts).

Instruction counts are ~10x native uninstrumented and ~50x counted, so only a few cases are
counted: the per-op chain and COUNTED_WORKLOADS, per family one or two cheap workloads whose engine
calls go through every path (vmap over grad, hessian, jvp, torch.nn modules, torch.distributions,
the tutorials' functional_call), so that a slowdown of one transform or of one family's engine
calls moves a count. One list for both, so `make continuous` and asv's history count the same.
"""
from __future__ import annotations

COUNTED_WORKLOADS: tuple[str, ...] = (
    "logreg_per_example_grads", "psg_mlp", "rosenbrock_hessian", "quadratic_hessian", "mlp_hvp", "mlp_jacobian",
    "mlp_jvp", "nn_ffnn", "nn_logreg", "nn_embedding", "bayes_laplace_hessian", "tutorial_maml",
)
# Counted per workload: the engine as users get it (its automatic trace's replay where proven) and
# eager; engine_traced replays the same kind of graph as `engine` and would cost a third more
# valgrind time (the per-op chain's engine_traced count keeps engine.trace's replay counted).
COUNT_METHODS: tuple[str, ...] = ("engine", "engine_eager")
# Counted calls per case: the samples of one count signal.
COUNT_REPEATS = 2
