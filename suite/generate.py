"""Turn the workload registry into ASV classes: one class per workload and suite module.

A generated class subclasses a hand-written base (its setup and metric functions) and adds the
workload, its full parameter grid (size, method, device) and, per metric function, the asv
``skip_params`` of the grid points where that metric does not apply (`selection.METRICS`). A
metric function marked with `case_setup(workload, size, method, device)` gets it as its own asv
setup (run after the class's, in that metric's processes only).
Subclass names come from `selection.class_name`, so no workload is listed anywhere by hand.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

from workloads.base import Workload

from .selection import ALL_DEVICES, class_names, metrics_of, skipped_params


def _with_skips(func: Callable[..., Any], skips: list[tuple[str, str, str]], workload: Workload) -> Callable[..., Any]:
    @functools.wraps(func)  # keeps the source (asv versions a benchmark by it) and the `unit`
    def metric(self: Any, *params: Any) -> Any:
        return func(self, *params)

    metric.skip_params = skips  # type: ignore[attr-defined]
    case_setup = getattr(func, "case_setup", None)
    if case_setup is not None:
        # asv runs a benchmark function's own `setup` after its class's, in that metric's process
        # only: the case is built there, and not in the processes of the metrics that need none.
        def setup(size: str, method: str, device: str) -> None:
            case_setup(workload, size, method, device)

        metric.setup = setup  # type: ignore[attr-defined]
    return metric


def workload_classes(base: type, module: str, workloads: Iterable[Workload] | None = None) -> dict[str, type]:
    """class name -> ASV class deriving from `base`, for every registered workload (or those given)."""
    metrics = metrics_of(module)
    missing = [m.name for m in metrics if not callable(getattr(base, m.name, None))]
    if missing:
        raise TypeError(f"{base.__name__} lacks the metric functions {missing} that selection.METRICS lists for {module}")
    classes: dict[str, type] = {}
    for name, workload in class_names(workloads).items():
        namespace: dict[str, Any] = {
            "__module__": base.__module__,
            "__doc__": f"{workload.description} ({workload.family})",
            "workload": workload,
            "params": [list(workload.sizes), list(workload.methods), list(ALL_DEVICES)],
            "param_names": ["size", "method", "device"],
        }
        for metric in metrics:
            namespace[metric.name] = _with_skips(getattr(base, metric.name), skipped_params(workload, metric), workload)
        classes[name] = type(name, (base,), namespace)
    return classes
