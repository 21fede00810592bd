"""Instructions of the engine methods' steady-state calls under valgrind's callgrind: the gate's count signals in asv.

Two asv processes of one commit time a ratio far apart on a shared machine; the instructions a
call executes barely move (docs/design/gate.md). So this is the figure asv's own comparison (`asv continuous`, judged by
vmapbench.asv_verdict) can trust across processes, as `make continuous` does.

- track_instructions(workload, method): a child process under valgrind (measuring.counts) builds
  the workload at the gate's size (its first quick size, else its first) on cpu, makes the method's
  first call and a few steady ones uninstrumented, then counts the steady call COUNT_REPEATS times;
  those counts are the samples. Workloads and methods are the gate's (measuring.counted), this
  checkout's, as the rest of the measuring code.

Skipped (asv: n/a) without valgrind, cc or callgrind.h. Not in `make bench`'s selection (selection.OPT_IN_MODULES): each point runs under valgrind.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from measuring import counts as _counts
from measuring.counted import COUNT_METHODS, COUNT_REPEATS, COUNTED_WORKLOADS
from measuring.sizes import default_size

from . import probes, selection

CHILD_TIMEOUT_S = 900
# The child: set up and first-call uninstrumented, then count the steady call COUNT_REPEATS times.
# Its measuring.counts is this suite's (by its file, stdlib only): the installed commit may have none.
CHILD = """
import gc, importlib.util, sys
import torch
torch.set_num_threads(1)
from workloads.base import get
library, name, size, method, repeats, counts_file = sys.argv[1:7]
spec = importlib.util.spec_from_file_location("counts", counts_file)
counts = sys.modules["counts"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(counts)
workload = get(name)
state = workload.setup(workload.params(size), "cpu")
workload.prepare(method, state)
for _ in range(3):
    workload.run(method, state)
requests = counts.Requests(library)
if not requests.on_valgrind:
    raise SystemExit("not running under valgrind")
gc.collect()
gc.freeze()
requests.instrument(True)
workload.run(method, state)  # translated with instrumentation on before it is counted
for rep in range(int(repeats)):
    with requests.region(f"rep{rep}"):
        workload.run(method, state)
requests.instrument(False)
"""


def count_instructions(name: str, method: str) -> list[int]:
    """Instructions of COUNT_REPEATS steady-state calls of `method` on workload `name`, one child
    process under valgrind; RuntimeError with the child's output when it fails."""
    from workloads.base import get

    size = default_size(get(name))
    with tempfile.TemporaryDirectory(prefix="vmapbench-counts-") as folder:
        out = Path(folder)
        library = _counts.build_requests(out / "lib")
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0", VMAPBENCH_FUSED="0",
                   VMAPBENCH_NATIVE_GUARDS="now")
        try:
            from measuring import malloc

            malloc.in_env(env)
        except ImportError:
            pass
        # -P and a folder of its own: the working folder is not on the child's path, so it counts the
        # installed commit's engine, never a checkout it happens to be started in.
        proc = subprocess.run([*_counts.command(out), sys.executable, "-P", "-c", CHILD, str(library), name, size,
                               method, str(COUNT_REPEATS), _counts.__file__], cwd=out, env=env, capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S)
        got = _counts.read_dumps(out)
        values = [got.get(f"rep{rep}") for rep in range(COUNT_REPEATS)]
        if proc.returncode != 0 or None in values:
            raise RuntimeError(f"counting {name} {size} {method} under valgrind failed (exit {proc.returncode}): "
                               f"{(proc.stdout + proc.stderr).strip()[-1500:]}")
        return [int(v) for v in values]  # type: ignore[arg-type]


class Instructions:
    """The gate's count signals: one point per (workload, method)."""

    params = [list(COUNTED_WORKLOADS), list(COUNT_METHODS)]
    param_names = ["workload", "method"]
    version = selection.SUITE_VERSION
    timeout = float(CHILD_TIMEOUT_S)
    rounds = 1
    repeat = 1
    number = 1

    def setup(self, workload: str, method: str) -> None:
        probes.pin_threads()
        why = _counts.available()
        if why is not None:
            raise NotImplementedError(why)
        probes.require_method(method)
        from workloads.base import get

        w = get(workload)
        if not getattr(w, "supports", lambda m: m in w.methods)(method):
            raise NotImplementedError(f"{workload} has no method {method}")

    def track_instructions(self, workload: str, method: str) -> dict[str, Any]:
        return {"samples": count_instructions(workload, method), "number": 1}

    track_instructions.unit = "instructions"  # type: ignore[attr-defined]
