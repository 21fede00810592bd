"""The fused tier's compilers side by side on the graphs the default path records.

    vmapbench fused-backends                      # every quick workload's graphs, XLA against the replay
    vmapbench fused-backends mlp_hvp --backends xla,inductor   # inductor too (cold: seconds to minutes a graph)
    vmapbench fused-backends --fn mymodels:build  # a model the registry lacks (FUNCTION('engine') -> call)
    vmapbench fused-backends --backends xla,iree  # IREE, a candidate measured here only (pip install '.[compilers]')

Each workload runs in a fresh process (so every compile is cold: jax's import is reported apart,
inductor gets an empty cache folder): its `engine` method is called until each signature has
replayed, and every graph the tier would compile (engine.fused.REPLAY_WATCHERS) is measured:
compile seconds per backend, seconds per call of the replay and of each program (interleaved
rounds, measuring.timer), the program's largest difference from the replay relative to the
output's magnitude, and XLA's own memory figure for the program (temporaries and outputs).
IREE is measured as a candidate, not used by the tier: iree-turbine's export of the graph,
compiled for the llvm-cpu target of this host (float64 kept), run by IREE's synchronous CPU driver.
`--write` stores the rows as results/fused_backends/<machine>/<commit8>.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

BACKENDS = ("xla", "inductor", "iree")
# `python -m vmapbench.fused_backends --child SPEC`: one workload's process (_run_child).
CHILD_FLAG = "--child"
ROUNDS = 30


def _call_of(spec: dict[str, Any]) -> Callable[[], Any]:
    if spec.get("fn"):
        import importlib

        module, _, name = spec["fn"].partition(":")
        return getattr(importlib.import_module(module), name)("engine")
    import workloads

    w = workloads.get(spec["workload"])
    state = w.setup(w.params(spec["size"]), "cpu")
    return lambda: w.run("engine", state)


def _child(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """One process's rows: the graphs of one workload, each measured with each backend."""
    import torch

    torch.set_num_threads(spec["threads"])
    from engine import fused

    fused.MIN_REPLAYS = 1 << 30  # the tier only watches here; the backends are called below
    graphs: list[tuple[Any, list, int]] = []
    fused.REPLAY_WATCHERS.append(lambda gm, inputs, n: graphs.append((gm, [t.clone() for t in inputs], n)))
    call = _call_of(spec)
    for _ in range(8):  # eager, watched, recorded (twice where it branches), then replays
        call()
    jax_import = None
    if "xla" in spec["backends"]:
        start = time.perf_counter()
        from engine import fused_xla

        fused_xla._import_jax()
        jax_import = time.perf_counter() - start
    rows = []
    for i, (gm, inputs, arguments) in enumerate(graphs):
        rows.append(_measure(spec, i, gm, inputs, arguments, jax_import if i == 0 else None))
    return rows


def _measure(spec: dict[str, Any], index: int, gm: Any, inputs: list, arguments: int,
             jax_import: float | None) -> dict[str, Any]:
    import torch

    from measuring import timer

    row: dict[str, Any] = {"workload": spec.get("workload") or spec.get("fn"), "size": spec.get("size"),
                           "graph": index, "ops": sum(n.op == "call_function" for n in gm.graph.nodes),
                           "inputs": len(inputs), "jax_import_s": jax_import}
    with torch.no_grad():
        expected = gm.forward(*inputs)
    calls: dict[str, Callable[[], Any]] = {"replay": lambda: gm.forward(*inputs)}
    for backend in spec["backends"]:
        start = time.perf_counter()
        try:
            program = _compile(backend, gm, inputs, arguments)
        except Exception as exc:  # noqa: BLE001 - a refusal is a result of the table
            row[backend] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                            "compile_s": time.perf_counter() - start}
            continue
        row[backend] = {"compile_s": time.perf_counter() - start, "error": None,
                        "memory_bytes": getattr(program, "memory_bytes", None)}
        with torch.no_grad():
            got = program(list(inputs))
        row[backend]["difference"] = _difference(got, expected)
        row[backend]["agrees"] = row[backend]["difference"] <= _tolerance(expected)
        calls[backend] = lambda p=program: p(list(inputs))
    with torch.no_grad():
        samples = timer.rounds(calls, spec["rounds"], warmup_rounds=3, alternate=True)
    row["replay_s"] = _median(samples["replay"])
    for backend in spec["backends"]:
        if backend in samples:
            row[backend]["call_s"] = _median(samples[backend])
    return row


def _compile(backend: str, gm: Any, inputs: list, arguments: int) -> Callable[[list], Any]:
    if backend == "xla":
        from engine import fused_xla

        return fused_xla.compile_graph(gm, inputs, arguments)
    if backend == "iree":
        return _iree_program(gm, inputs)
    from engine import fused

    program = fused.compile_now(gm, inputs, {})
    return lambda args: program(args)


def _iree_program(gm: Any, inputs: list) -> Callable[[list], Any]:
    """The graph exported by iree-turbine and compiled by IREE for this host's CPU, in process."""
    import torch

    try:
        import iree.runtime as rt
        import iree.turbine.aot as aot
    except ImportError as exc:
        raise RuntimeError(f"iree-turbine is not installed ({exc}; pip install '.[compilers]')") from exc

    class Graph(torch.nn.Module):  # torch.export takes a module returning a tuple
        def forward(self, *args: Any) -> tuple:
            out = gm.forward(*args)
            return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    exported = aot.export(Graph(), args=tuple(t.detach() for t in inputs))
    exported.session.set_flags("--iree-input-demote-f64-to-f32=false", "--iree-input-demote-i64-to-i32=false",
                               "--iree-llvmcpu-target-cpu=host")
    with tempfile.TemporaryFile("w+") as log:  # IREE prints its diagnostics on fd 2: keep the first error
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            binary = exported.compile(save_to=None, target_backends=("llvm-cpu",))
        except RuntimeError as exc:
            log.seek(0)
            first = next((line.split("error: ", 1)[1] for line in log if "error: " in line), str(exc))
            raise RuntimeError(first.strip()) from exc
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    config = rt.Config("local-sync")
    module = rt.VmModule.copy_buffer(config.vm_instance, binary.map_memory())
    main = rt.SystemContext(vm_modules=[module], config=config).modules.module["main"]

    def call(args: list) -> list:
        outs = main(*[t.detach().numpy() for t in args])
        return [torch.from_numpy(o.to_host()) for o in (outs if isinstance(outs, (list, tuple)) else [outs])]

    return call


def _difference(got: Any, expected: Any) -> float:
    import torch

    expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    worst = 0.0
    for g, e in zip(got, expected):
        if e.dtype.is_floating_point:
            scale = float(e.abs().max()) if e.numel() else 0.0
            worst = max(worst, float((g - e).abs().max()) / max(scale, 1e-30) if e.numel() else 0.0)
        elif not torch.equal(g, e):
            worst = float("inf")
    return worst


def _tolerance(expected: Any) -> float:
    """The largest difference relative to the output's magnitude that the fused tier accepts
    (engine.fused_xla.TOLERANCE's absolute term, the loosest over the outputs' dtypes)."""
    from engine.fused_xla import TOLERANCE

    outs = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    return max((TOLERANCE.get(e.dtype, (0.0, 0.0))[0] for e in outs), default=0.0)


def _median(xs: list[float]) -> float:
    from measuring import stats

    return stats.median(xs)


def _run_child(spec: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "VMAPBENCH_FUSED": "1"}
    with tempfile.TemporaryDirectory(prefix="vmapbench-inductor-") as cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache  # cold: no program or kernel of an earlier run
        proc = subprocess.run([sys.executable, "-m", "vmapbench.fused_backends", CHILD_FLAG, json.dumps(spec)],
                              env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return [{"workload": spec.get("workload") or spec.get("fn"), "size": spec.get("size"), "graph": None,
                 "error": f"the measuring process exited {proc.returncode}: {tail[0]}"}]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict[str, Any]], backends: list[str]) -> str:
    """The rows as a markdown table (measuring.compilers' cells), the per-backend summary last."""
    from measuring import compilers

    lines = ["| " + " | ".join(compilers.head(backends)) + " |", "|" + " --- |" * len(compilers.head(backends))]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in compilers.cells(r, backends)) + " |")
    if any(r.get("graph") is not None for r in rows):
        lines.append("| " + " | ".join(compilers.summary_cells(rows, backends)) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # one workload's process (CHILD_FLAG); the command is `vmapbench fused-backends`
    if sys.argv[1:2] != [CHILD_FLAG] or len(sys.argv) != 3:
        sys.exit(f"usage: python -m vmapbench.fused_backends {CHILD_FLAG} SPEC (a process of `vmapbench fused-backends`)")
    print(json.dumps(_child(json.loads(sys.argv[2]))))
