"""Synthetic ASV results (format version 2) for the dashboard's tests and its build-speed benchmark.

The numbers are made up but shaped like vmapbench's: a loop baseline, faster vectorized methods,
a closed form far ahead, memory growing with size, a CUDA device on one machine, a chunk_size
sweep, and one injected engine regression so the history view has something to flag. Output is
deterministic for a given seed.

    python -m dashboards.synthetic OUT_DIR [--commits N] [--machines M] [--seed S]

writes OUT_DIR/benchmarks.json, OUT_DIR/<machine>/machine.json and one result file per commit and
machine (so `--commits 500 --machines 2` gives 1000 result files).
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

# Relative time of each method against the loop (1.0), roughly the ratios of ANCHORS.md.
METHOD_FACTOR = {
    "loop": 1.0, "engine": 0.42, "engine_traced": 0.2, "engine_compiled": 0.07,
    "torch_func": 0.38, "torch_func_compiled": 0.05, "loop_compiled": 0.6,
    "functional_vectorize": 0.45, "closed_form": 0.007,
    # Peers (#17): roughly the ratios issue 17 measured on psg_mlp.
    "jax": 0.2, "opacus_hooks": 0.6, "opacus_ew": 0.3, "opacus_functorch": 0.8, "backpack": 0.33,
    "engine_chunked": 0.55,
}
# Relative time and memory of a method not listed above (a new peer the dashboard must still show).
OTHER_FACTOR, OTHER_MEMORY = 0.5, 2.0
MEMORY_FACTOR = {
    "loop": 1.0, "engine": 3.0, "engine_traced": 2.6, "engine_compiled": 2.0, "torch_func": 2.8,
    "torch_func_compiled": 1.8, "loop_compiled": 1.1, "functional_vectorize": 3.2, "closed_form": 0.5,
    "jax": 2.0, "opacus_hooks": 1.5, "opacus_ew": 2.5, "opacus_functorch": 3.0, "backpack": 2.2,
    "engine_chunked": 1.2,
}
ENV_NAME = "existing-py_work_main_.venv_bin_python"


@dataclass(frozen=True)
class SyntheticWorkload:
    name: str
    sizes: tuple[str, ...]
    methods: tuple[str, ...]
    # 'param': a suite class with a 'workload' parameter; 'class': one class per workload.
    style: str = "param"


DEFAULT_WORKLOADS: tuple[SyntheticWorkload, ...] = (
    SyntheticWorkload("bayes_logreg_hessian", ("n=250,d=16", "n=1000,d=64", "n=4000,d=64"),
                      ("loop", "engine", "engine_traced", "torch_func", "torch_func_compiled",
                       "functional_vectorize", "closed_form")),
    SyntheticWorkload("per_sample_grad_mlp", ("batch=16", "batch=64", "batch=256"),
                      ("loop", "engine", "engine_traced", "torch_func", "closed_form"), style="class"),
    SyntheticWorkload("jacobian_chunked", ("n=512,chunk_size=8", "n=512,chunk_size=64",
                                           "n=512,chunk_size=512"),
                      ("loop", "engine", "torch_func")),
)
# The bigger set of the build-speed benchmark: about the real suite's shape (a dozen workloads,
# one class each, ~100 benchmarks and ~4000 values per result file, most of them skipped).
BENCH_WORKLOADS: tuple[SyntheticWorkload, ...] = DEFAULT_WORKLOADS + tuple(
    SyntheticWorkload(name, sizes, methods, style="class") for name, sizes, methods in (
        ("jacobian_mlp", ("batch=8", "batch=32", "batch=128"),
         ("loop", "engine", "engine_traced", "torch_func", "functional_vectorize")),
        ("hvp_rosenbrock", ("d=8", "d=128", "d=1024"), ("loop", "engine", "torch_func", "closed_form")),
        ("ensemble_grad", ("models=8,batch=64", "models=32,batch=64"),
         ("loop", "engine", "engine_compiled", "torch_func", "torch_func_compiled")),
        ("robust_reg_hessian", ("n=100,d=8", "n=100,d=64", "n=1000,d=8", "n=1000,d=64"),
         ("loop", "engine", "engine_traced", "torch_func", "closed_form")),
        ("psg_cnn", ("batch=8", "batch=64", "batch=256"), ("loop", "engine", "torch_func", "engine_traced")),
        ("psg_attention", ("batch=8", "batch=64", "batch=256"),
         ("loop", "engine", "engine_traced", "torch_func", "closed_form")),
        ("pinn_batched_hessian", ("points=16", "points=256", "points=4096"),
         ("loop", "engine", "torch_func", "functional_vectorize", "closed_form")),
        ("quadratic_hessian", ("d=8", "d=128", "d=1024"),
         ("loop", "engine", "engine_traced", "torch_func", "functional_vectorize", "closed_form")),
        ("mlp_hvp", ("hidden=32,k=8", "hidden=32,k=128", "hidden=128,k=8", "hidden=128,k=128"),
         ("loop", "engine", "torch_func", "functional_vectorize")),
    ))
MACHINES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cpu-box", ("cpu",)),
    ("gpu-box", ("cpu", "cuda")),
)


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _size_scale(size: str) -> float:
    scale = 1.0
    for part in size.split(","):
        key, _, value = part.partition("=")
        if key != "chunk_size":
            scale *= float(value)
    return scale


def _benchmark_layout(workloads: Sequence[SyntheticWorkload], devices: Sequence[str]) -> dict[str, dict]:
    """benchmark name -> (params, param_names, type, unit, workload filter)."""
    metrics = [
        ("time_run", "time", "seconds"), ("peakmem_run", "peakmem", "bytes"),
        ("track_rss_delta_bytes", "track", "bytes"), ("track_cuda_peak_bytes", "track", "bytes"),
        ("track_alloc_peak_bytes", "track", "bytes"), ("track_xla_memory_bytes", "track", "bytes"),
        ("track_fallbacks", "track", "calls"), ("track_speedup_vs_loop", "track", "x"),
        ("track_ratio_vs_torch_func", "track", "x"),
    ]
    layout: dict[str, dict] = {}
    shared = [w for w in workloads if w.style == "param"]
    groups: list[tuple[str, list[SyntheticWorkload], list[str]]] = []
    if shared:
        groups.append(("bench_workloads.Workloads", shared, ["workload", "size", "method", "device"]))
    for w in workloads:
        if w.style == "class":
            groups.append((f"bench_workloads.{_class_name(w.name)}", [w], ["size", "method", "device"]))
    for prefix, members, names in groups:
        sizes = sorted({s for w in members for s in w.sizes}, key=lambda s: (_size_scale(s), s))
        methods = [m for m in METHOD_FACTOR if any(m in w.methods for w in members)]
        methods += sorted({m for w in members for m in w.methods} - set(methods))
        values = {"workload": [w.name for w in members], "size": sizes, "method": methods,
                  "device": list(devices)}
        params = [[repr(v) for v in values[n]] for n in names]
        for attr, kind, unit in metrics:
            layout[f"{prefix}.{attr}"] = {
                "params": params, "param_names": names, "type": kind, "unit": unit,
                "members": {w.name: w for w in members},
            }
    # Benchmarks outside the workload grid, as the real suite has them: a parameterless record of
    # the run (no workload, no method) and a microbenchmark with methods but no workload parameter.
    layout["bench_runtime.track_torch_num_threads"] = {
        "params": [], "param_names": [], "type": "track", "unit": "threads", "members": {},
        "static": lambda p, devices: 2.0}
    layout["bench_overhead.PerOpOverhead.time_chain"] = {
        "params": [["'native'", "'engine'"], [repr(d) for d in devices]], "param_names": ["method", "device"],
        "type": "time", "unit": "seconds", "members": {},
        "static": lambda p, devices: (1e-3 if p["method"] == "native" else 4e-3) if p["device"] in devices else math.nan}
    return layout


def _base_value(attr: str, w: SyntheticWorkload, size: str, method: str, device: str,
                slowdown: float) -> float:
    """The noise-free value of one case (NaN: asv's mark of a case skipped in setup)."""
    if method not in w.methods or size not in w.sizes:
        return math.nan
    scale = _size_scale(size)
    chunk = dict(p.split("=") for p in size.split(",")).get("chunk_size")
    gpu = device == "cuda"
    base = 2e-7 * scale ** 0.9 * (0.5 if gpu and method == "loop" else 0.08 if gpu else 1.0)
    factor = METHOD_FACTOR.get(method, OTHER_FACTOR) * (slowdown if method.startswith("engine") else 1.0)
    if chunk is not None and method != "loop":
        factor *= 1.0 + 8.0 / float(chunk)
    mem = 4096.0 * scale * MEMORY_FACTOR.get(method, OTHER_MEMORY) * (float(chunk) / 64 if chunk else 1.0)
    if attr == "time_run":
        return max(base * factor, 2e-6)
    if attr == "peakmem_run":
        return 350e6 + mem
    if attr == "track_rss_delta_bytes":
        return mem if not gpu else 1e6
    if attr == "track_cuda_peak_bytes":
        return mem if gpu else math.nan
    if attr == "track_alloc_peak_bytes":
        return mem if not gpu and method != "jax" else math.nan
    if attr == "track_xla_memory_bytes":
        return 1.1 * mem if method == "jax" else math.nan
    if attr == "track_fallbacks":
        return float(1 + (len(size) % 3)) if method.startswith("engine") else 0.0
    if attr == "track_speedup_vs_loop":
        return 1.0 / factor if method != "loop" else 1.0
    if attr == "track_ratio_vs_torch_func":
        return factor / METHOD_FACTOR["torch_func"] if method.startswith("engine") else math.nan
    raise KeyError(attr)


ROUND_TRACKS = ("track_speedup_vs_loop", "track_ratio_vs_torch_func")


def _nulls(values: list[float]) -> list[float | None]:
    """NaN -> None, as asv writes statistics of a skipped case."""
    return [None if v != v else v for v in values]


def write_results(out_dir: str | Path, *, commits: int = 3, machines: int = 2, seed: int = 0,
                  workloads: Sequence[SyntheticWorkload] = DEFAULT_WORKLOADS,
                  regression_at: int | None = None, samples: bool = True,
                  extras: bool = True, noise: float = 0.02, env_name: str = ENV_NAME,
                  time_scale: float = 1.0, date_offset_ms: int = 0,
                  machine_root: str | Path | None = None) -> list[Path]:
    """Write a synthetic ASV results tree; returns the result files written.

    The first machine runs the quick profile (the middle size of each workload, cpu only), the
    second the full grid on cpu and cuda. `regression_at` is the commit index from which the
    engine methods of the first workload are 1.5x slower (default: two thirds of the way, when
    there are at least 3 commits). `extras` also writes a coverage report
    (coverage/engine.json) and one profile folder (profiles/...). `noise` is the relative spread
    of every value around its level (uniform): at 2% no two commits differ by the 5% a
    regression needs, so the injected one is the only one. `env_name`, `time_scale` (every time
    multiplied by it), `date_offset_ms` and `machine_root` (where the machine folders go, default
    `out_dir`; e.g. out_dir/continuous) write a second asv env or a continuous run beside the first.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if regression_at is None and commits >= 3:
        regression_at = max(1, (2 * commits) // 3)
    hashes = [hashlib.sha1(f"{seed}-{i}".encode()).hexdigest() for i in range(commits)]
    t0 = 1_767_225_600_000  # 2026-01-01T00:00Z in ms, as asv stores dates
    all_devices = sorted({d for _, devs in MACHINES[:machines] for d in devs})
    layout = _benchmark_layout(workloads, all_devices)
    benchmarks: dict[str, Any] = {}
    for name, spec in layout.items():
        entry = {"code": f"# synthetic {name}", "name": name, "param_names": spec["param_names"],
                 "params": spec["params"], "timeout": 120.0, "type": spec["type"],
                 "unit": spec["unit"], "version": hashlib.sha1(name.encode()).hexdigest()}
        if spec["type"] == "time":
            entry.update({"number": 0, "repeat": 0, "min_run_count": 2, "rounds": 2,
                          "sample_time": 0.01, "warmup_time": -1})
        benchmarks[name] = entry
    benchmarks["version"] = 2
    (out / "benchmarks.json").write_text(json.dumps(benchmarks, indent=1, sort_keys=True))
    columns = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a",
               "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_number", "stats_repeat",
               "samples", "profile"]

    written = []
    for m_index, (machine, devices) in enumerate(MACHINES[:machines]):
        mdir = Path(machine_root or out) / machine
        mdir.mkdir(parents=True, exist_ok=True)
        info = {"arch": "x86_64", "cpu": "Synthetic CPU @ 2.0GHz", "machine": machine,
                "num_cpu": "2" if m_index == 0 else "16", "os": "Linux 6.1.0", "ram": "8GB",
                "version": 1}
        (mdir / "machine.json").write_text(json.dumps(info, indent=4, sort_keys=True))
        quick = m_index == 0
        # Noise-free values per benchmark, without and with the injected regression.
        bases: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, spec in layout.items():
            attr = name.rsplit(".", 1)[1]
            both = []
            for slowdown in (1.0, 1.5):
                row = []
                for combo in itertools.product(*spec["params"]):
                    p = dict(zip(spec["param_names"], (ast.literal_eval(v) for v in combo)))
                    if "static" in spec:
                        row.append(spec["static"](p, devices))
                        continue
                    w = spec["members"][p.get("workload", next(iter(spec["members"])))]
                    skipped = p["device"] not in devices or (quick and p["size"] != w.sizes[len(w.sizes) // 2])
                    wslow = slowdown if w is workloads[0] else 1.0
                    row.append(math.nan if skipped else _base_value(attr, w, p["size"], p["method"],
                                                                      p["device"], wslow))
                both.append(np.array(row))
            bases[name] = (both[0], both[1])
        for c_index, commit in enumerate(hashes):
            slow = regression_at is not None and c_index >= regression_at
            date = t0 + c_index * 3_600_000 * 6 + date_offset_ms
            results = {}
            for name, spec in layout.items():
                base = bases[name][1 if slow else 0]
                noisy = not (name.endswith("track_fallbacks") or name.startswith("bench_runtime."))
                v = base * rng.uniform(1 - noise, 1 + noise, base.shape) if noisy else base
                if spec["type"] == "time" and time_scale != 1.0:
                    v = v * time_scale
                row: list[Any] = [v.tolist(), spec["params"], benchmarks[name]["version"],
                                  date + 3_600_000, round(float(rng.uniform(1, 5)), 3)]
                # The suite's in-process ratios are recorded round by round, as asv records a
                # timing's samples (suite.workload_pass): stats and samples like a time's.
                rounds = samples and quick and name.rsplit(".", 1)[1] in ROUND_TRACKS
                if spec["type"] == "time" or rounds:
                    for factor in (0.97, 1.04, 0.99, 1.02):
                        row.append(_nulls((v * factor).tolist()))
                    number, repeat = (1.0, 7.0) if rounds else (10.0, 10.0)
                    row.append(_nulls(np.where(np.isnan(v), np.nan, number).tolist()))
                    row.append(_nulls(np.where(np.isnan(v), np.nan, repeat).tolist()))
                    if samples and quick:  # a ratio's rounds centred on it: asv stores their median
                        steps = (-2, -1, 0, 1, 2) if rounds else (-1, 0, 1, 2)
                        row.append([None if x != x else [x * (1 + 0.01 * k) for k in steps]
                                    for x in v.tolist()])
                results[name] = row
            data = {
                "commit_hash": commit, "env_name": env_name, "date": date,
                "params": {**{k: v for k, v in info.items() if k != "version"}, "python": "3.11",
                           "torch": "2.13.0"},
                "python": "3.11", "requirements": {"torch": "2.13.0"},
                "env_vars": {"OMP_NUM_THREADS": "2"}, "result_columns": columns,
                "results": results, "durations": {"<build>": 1.5}, "version": 2,
            }
            path = mdir / f"{commit[:8]}-{env_name}.json"
            path.write_text(json.dumps(data))
            written.append(path)
    if extras:
        _write_extras(out, workloads)
    return written


def _write_extras(out: Path, workloads: Sequence[SyntheticWorkload]) -> None:
    families = {"pointwise": ["add", "mul", "sin", "exp", "where", "clamp"],
                "reduction": ["sum", "mean", "amax", "logsumexp"],
                "linalg": ["matmul", "linalg.solve", "linalg.eigh"],
                "indexing": ["index_select", "take", "put", "isin"]}
    ops = []
    for family, names in families.items():
        for i, op in enumerate(names):
            engine = "native" if i % 4 else ("fallback" if family != "linalg" else "error")
            torch_func = "fallback" if op in ("take", "put", "isin") else "native"
            if op == "linalg.eigh":
                engine, torch_func = "mismatch", "native"
            ops.append({"op": op, "family": family, "engine": engine, "torch_func": torch_func})
    summary: dict[str, dict[str, int]] = {}
    for side in ("engine", "torch_func"):
        summary[side] = {}
        for op in ops:
            summary[side][op[side]] = summary[side].get(op[side], 0) + 1
    cov = out / "coverage"
    cov.mkdir(exist_ok=True)
    (cov / "engine.json").write_text(json.dumps(
        {"torch_version": "2.13.0", "dtype": "float32", "device": "cpu", "ops": ops,
         "summary": summary}, indent=1))
    prof = out / "profiles" / f"{workloads[0].name}-engine-cpu"
    prof.mkdir(parents=True, exist_ok=True)
    (prof / "summary.json").write_text(json.dumps(
        {"workload": workloads[0].name, "method": "engine", "device": "cpu",
         "size": workloads[0].sizes[0], "wall_ms": 12.5, "top_ops": ["aten::mm", "aten::mul"]}))
    (prof / "py-spy.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>')


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="results folder to write (created)")
    parser.add_argument("--commits", type=int, default=3)
    parser.add_argument("--machines", type=int, default=2, choices=range(1, len(MACHINES) + 1))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bench", action="store_true", help="the larger workload set of the speed benchmark")
    args = parser.parse_args(argv)
    files = write_results(args.out, commits=args.commits, machines=args.machines, seed=args.seed,
                          workloads=BENCH_WORKLOADS if args.bench else DEFAULT_WORKLOADS)
    print(f"wrote {len(files)} result files under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
