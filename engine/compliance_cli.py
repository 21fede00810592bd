"""`vmapbench compliance`: run engine.check_compliance on workload functions (or any
`module:function` with random inputs of given shapes) through forward, backward and double backward."""
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


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*", help="workload function names (default: all; see --list) or module:function")
    parser.add_argument("--shapes", default=None, help="for module:function, argument shapes like '3x4,4' (random float32 inputs)")
    parser.add_argument("--forward-only", action="store_true", help="skip the backward and double-backward checks")
    parser.add_argument("--list", action="store_true", help="list the known workload functions")


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
        print("\n".join(known))
        return 0
    targets = args.targets or list(known)
    failed = 0
    for target in targets:
        if target in known:
            fn, fargs = known[target]
        elif ":" in target:
            fn, fargs = _resolve(target, args.shapes)
        else:
            print(f"vmapbench compliance: unknown target {target!r}; known: {', '.join(known)} (or module:function)")
            return 2
        full = not args.forward_only
        report = check_compliance(fn, *fargs, backward=full, double_backward=full)
        print(f"{target}: {report}")
        failed += not report.ok
    return 1 if failed else 0
