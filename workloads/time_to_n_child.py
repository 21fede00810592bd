"""One time-to-N curve, measured in the fresh process that runs this file (see workloads.time_to_n).

    python workloads/time_to_n_child.py '<spec as JSON>'

Only the standard library is imported before the first clock reading, so the process's own start
(interpreter, torch, the registry or the user's module, jax) is on the record. The spec names the
workload and size (or a `module:function` factory), the method, the N points, the budget and the
file to write. That file gets one JSON line per event as it happens (`start`, one `point` per
recorded N, `end`), so a curve killed by the parent's timeout still keeps the points it reached.
The budget stops a curve only after its first `min_calls` calls (default 1), so a caller that
needs N calls gets them on any machine.
With `first_calls` K in the spec, each of the first K calls also gets a `call` event: its own
seconds and the modules it imported (what a lazy import costs a call; the sys.modules snapshots
around those calls are inside the timed span, so K stays 0 for the published curves).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

# CLOCK_MONOTONIC is one clock for every process of the machine: the parent's launch time and
# these readings subtract.
_ENTERED = time.monotonic()
# Run by its file (workloads.time_to_n.CHILD: no package __init__ before the clock), so its folder
# heads sys.path; the working folder takes its place, as under `python -m` (a --fn MODULE is found there).
sys.path[0] = os.getcwd()


def _write(out: Any, **event: Any) -> None:
    out.write(json.dumps(event) + "\n")
    out.flush()


def _cache_entries(folder: str | None) -> int | None:
    """Files under the inductor cache folder at this moment (None: no folder set)."""
    if not folder:
        return None
    return sum(len(files) for _, _, files in os.walk(folder))


def _build(spec: dict[str, Any]) -> tuple[Callable[[], Any], Callable[[], str | None], str, float]:
    """Import what the method needs, build its data and its call; (call, check, device, imported
    at). `check` runs after the curve and says what is wrong (None: agrees with the float64 loop,
    or nothing to check against)."""
    import torch

    torch.set_num_threads(int(spec["threads"]))  # before jax: load_jax matches XLA's threads to it
    method = spec["method"]
    _require_backend(method)
    if spec.get("factory"):
        import importlib

        module_name, _, attr = spec["factory"].partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        imported = time.monotonic()
        call = factory(method)
        if not callable(call):
            raise TypeError(f"{spec['factory']}({method!r}) returned {type(call).__name__}, not a "
                            "zero-argument callable (the measured call)")
        return call, lambda: None, spec.get("device", "cpu"), imported
    import workloads

    workload = workloads.get(spec["workload"])
    imported = time.monotonic()
    state = workload.setup(workload.params(spec["size"]), spec.get("device", "cpu"))
    build = getattr(state, "fn", None)
    call = build(method) if build is not None else (lambda: workload.run(method, state))

    def check() -> str | None:
        try:
            workload.check(state, [method])
        except AssertionError as exc:
            return str(exc).splitlines()[0][:300]
        return None

    return call, (check if spec.get("check", True) else (lambda: None)), str(getattr(state, "device", "cpu")), imported


def imported_groups(names: set[str]) -> list[str]:
    """Newly imported modules, by package: their first dotted component, the first two for torch's
    own (`torch._dynamo`, `torch.fx`), sorted."""
    groups = {".".join(n.split(".")[:2]) if n.startswith("torch.") else n.split(".")[0] for n in names}
    return sorted(groups)


def _require_backend(method: str) -> None:
    """NotImplementedError (the curve is skipped, with the reason) where the engine is asked for
    the fused tier's XLA backend (VMAPBENCH_FUSED_BACKEND=xla) and XLA cannot run here: the tier
    would compile with inductor instead, and the curve would not be the one asked for."""
    if method.startswith("engine") and os.environ.get("VMAPBENCH_FUSED_BACKEND", "").strip().lower() == "xla":
        from engine import fused_xla

        why = fused_xla.available()
        if why is not None:
            raise NotImplementedError(f"the fused tier's XLA backend cannot run here: {why}")


def main(spec: dict[str, Any]) -> int:
    launched = float(spec["launched"])
    ns = sorted(int(n) for n in spec["ns"])
    record = set(int(n) for n in spec["record"]) | set(ns)
    budget = float(spec["max_seconds"])
    min_calls = int(spec.get("min_calls") or 1)
    with open(spec["out"], "a", encoding="utf-8") as out:
        cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        _write(out, event="start", pid=os.getpid(), entered_s=_ENTERED - launched, cache_dir=cache,
               cache_entries=_cache_entries(cache))
        try:
            call, check, device, imported = _build(spec)
            sync: Callable[[], None] = lambda: None  # noqa: E731
            if device.startswith("cuda"):
                import torch

                sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
        except NotImplementedError as exc:  # a missing package or device: skipped, not failed
            _write(out, event="end", status="skipped", note=str(exc).splitlines()[0][:300])
            return 0
        built = time.monotonic()
        calls, note, status = 0, None, "done"
        watched = int(spec.get("first_calls") or 0)
        first = time.monotonic()
        try:
            for n in range(1, ns[-1] + 1):
                modules = set(sys.modules) if n <= watched else None
                started = time.monotonic()
                call()
                sync()
                now = time.monotonic()
                calls = n
                if modules is not None:
                    new = set(sys.modules) - modules
                    _write(out, event="call", n=n, s=now - started, modules=len(new), imported=imported_groups(new))
                    now = time.monotonic()
                stopping = now - first > budget and min_calls <= n < ns[-1]
                if n in record or stopping:  # the last call made ends the curve's line
                    _write(out, event="point", n=n, s=now - first)
                if stopping:
                    note = (f"stopped after {n} calls: {now - first:.1f} s of calls exceeded the budget of "
                            f"{budget:g} s (--max-seconds)")
                    status = "budget"
                    break
        except Exception as exc:  # noqa: BLE001 - the curve says what broke, the parent goes on
            status, note = "failed", f"call {calls + 1} raised {type(exc).__name__}: {exc}".splitlines()[0][:300]
        problem = check() if status != "failed" else None
        if problem is not None:
            status, note = "wrong", f"disagrees with the float64 loop: {problem}"
        _write(out, event="end", status=status, note=note, calls=calls, imported_s=imported - launched,
               built_s=built - launched, first_call_at_s=first - launched,
               cache_entries_after=_cache_entries(cache))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
