"""vmapbench's ASV suite (asv.conf.json: benchmark_dir "suite").

Generated from the workload registry; see selection.py for profiles and naming, probes.py for the
measurements. Modules: bench_workloads (steady-state time and memory, ratios), bench_first_call
(compile time, engine fallbacks), bench_overhead (engine per-op overhead), bench_runtime (threads).
"""

import os as _os

# One tier per timing: the engine's fused tier (engine/fused.py) compiles a signature in the
# background once its replays pay for a compile, or loads a program of an earlier process from
# the on-disk index after a few replays, so a timing of the default path could switch tiers in the
# middle, and by what an earlier run left on disk. The suite (and the gate's probes, which import
# it) measures the eager and replay tiers; the fused tier's figures come from
# `python -m vmapbench.peer_ratios`, which settles its compiles first. VMAPBENCH_FUSED=1 (or force)
# in the environment overrides this.
_os.environ.setdefault("VMAPBENCH_FUSED", "0")
