"""vmapbench's ASV suite (asv.conf.json: benchmark_dir "suite").

Generated from the workload registry; see selection.py for profiles and naming, probes.py for the
measurements. Modules: bench_workloads (steady-state time and memory, ratios), bench_first_call
(compile time, engine fallbacks), bench_overhead (engine per-op overhead), bench_runtime (threads).
"""
