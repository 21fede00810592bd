"""`vmapbench compliance`: run engine.check_compliance on workload functions (or any
`module:function` with random inputs of given shapes) through forward, backward and double backward.

A target is a registered workload's name (`vmapbench compliance psg_mlp`: the functions that
workload differentiates), a function name from `--list` (`hessians.rosenbrock`), or
`module:function --shapes 3x4,4`.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Any, Callable


def workload_functions() -> dict[str, tuple[Callable, tuple]]:
    """The differentiated functions of the registered workloads, on small seeded data."""
    import torch

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


# Workload name -> the functions above it differentiates (workloads without an entry have no
# standalone differentiated function here yet: naming one is an error that says so).
WORKLOAD_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "logreg_hessian": ("bayes_logreg.neg_log_posterior",),
    "logreg_per_example_grads": ("bayes_logreg.neg_log_posterior",),
    "compiled_logreg_hessian": ("bayes_logreg.neg_log_posterior",),
    "robust_reg_hessian": ("bayes_logreg.robust_neg_log_posterior",),
    "mlp_loss_hessian": ("hessians.mlp_loss",),
    "rosenbrock_hessian": ("hessians.rosenbrock",),
    "psg_mlp": ("per_sample_grads.mlp_loss",),
    "compiled_psg_mlp": ("per_sample_grads.mlp_loss",),
    "psg_cnn": ("per_sample_grads.cnn_loss",),
}


def expand(target: str, known: dict[str, tuple[Callable, tuple]]) -> list[str]:
    """The function names a target stands for: itself, or a workload's functions."""
    if target in known or ":" in target:
        return [target]
    if target in WORKLOAD_FUNCTIONS:
        return list(WORKLOAD_FUNCTIONS[target])
    from workloads.base import all_workloads

    registered = sorted(w.name for w in all_workloads())
    if target in registered:
        raise SystemExit(f"vmapbench compliance: workload {target!r} has no function registered for the check "
                         f"(vmapbench/commands/compliance.py WORKLOAD_FUNCTIONS); check its function as module:function "
                         f"--shapes ..., or one of the workloads {', '.join(sorted(WORKLOAD_FUNCTIONS))}")
    raise SystemExit(f"vmapbench compliance: unknown target {target!r}; give a workload "
                     f"({', '.join(sorted(WORKLOAD_FUNCTIONS))}), a function ({', '.join(known)}) or module:function")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*",
                        help="workload names or function names (default: every function; see --list), or module:function")
    parser.add_argument("--shapes", default=None, help="for module:function, argument shapes like '3x4,4' (random float32 inputs)")
    parser.add_argument("--forward-only", action="store_true", help="skip the backward and double-backward checks")
    parser.add_argument("--list", action="store_true", help="list the known functions and the workloads using them")


def _resolve(target: str, shapes: str | None) -> tuple[Callable, tuple]:
    import torch

    module, _, name = target.partition(":")
    fn: Any = getattr(importlib.import_module(module), name)
    if not shapes:
        raise SystemExit(f"vmapbench compliance: {target} needs --shapes (e.g. --shapes 3x4,4) to build inputs")
    args = tuple(torch.randn(*[int(s) for s in shape.split("x")]) for shape in shapes.split(","))
    return fn, args


def main(args: argparse.Namespace) -> int:
    from engine.compliance import check_compliance

    known = workload_functions()
    if args.list:
        for name in known:
            users = [w for w, fns in WORKLOAD_FUNCTIONS.items() if name in fns]
            print(f"{name}  (workloads: {', '.join(users) or '-'})")
        return 0
    targets = [t for target in args.targets for t in expand(target, known)] if args.targets else list(known)
    failed = 0
    for target in dict.fromkeys(targets):
        if target in known:
            fn, fargs = known[target]
        else:
            fn, fargs = _resolve(target, args.shapes)
        full = not args.forward_only
        report = check_compliance(fn, *fargs, backward=full, double_backward=full)
        print(f"{target}: {report}")
        failed += not report.ok
    return 1 if failed else 0
