"""Workload registry: importing this package registers every workload module.

Use `workloads.get(name)`, `workloads.all_workloads()`, `workloads.iter_cases(quick=True)`.
With VMAPBENCH_CUDA_STANDIN=1 importing it installs the CUDA stand-in (workloads.cuda_standin).
"""
from workloads import cuda_standin as _cuda_standin

_cuda_standin.install_if_requested()
from workloads.base import (  # noqa: F401,E402
    BASELINE,
    COMPILED_METHODS,
    ENGINE_METHODS,
    METHODS,
    PEER_METHODS,
    REFERENCE,
    Workload,
    all_workloads,
    families,
    get,
    iter_cases,
    parse_size_label,
    register,
    size_label,
)

# Workload modules (each calls register()); keep this list in one place.
from workloads import bayes_logreg, hessians, per_sample_grads, nn_models, bayes_models, tutorials, compiled  # noqa: E402,F401  (order = listing order)
