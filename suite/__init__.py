"""vmapbench's ASV suite (asv.conf.json: benchmark_dir "suite").

Generated from the workload registry; see selection.py for profiles and naming, probes.py for the
measurements. Modules: bench_workloads (steady-state time and memory, ratios), bench_first_call
(compile time, engine fallbacks), bench_overhead (engine per-op overhead), bench_runtime (threads).

An installed package like the others, imported one way: `from suite import probes`. asv imports
this folder of the checkout by its own importer (whatever commit it installed), and the gate's
probe loads the gate checkout's copy under an alias (vmapbench/gate_probe.py: gate_suite); either
way its measuring/ is the checkout's too (`_own_measuring` below).
"""

import importlib.util as _util
import os as _os
import sys as _sys

# One tier per timing: the engine's fused tier (engine/fused.py) compiles a signature in the
# background once its replays pay for a compile, or loads a program of an earlier process from
# the on-disk index after a few replays, so a timing of the default path could switch tiers in the
# middle, and by what an earlier run left on disk. The suite (and the gate's probes, which import
# it) measures the eager and replay tiers; the fused tier's figures come from
# `python -m vmapbench.peer_ratios`, which settles its compiles first. VMAPBENCH_FUSED=1 (or force)
# in the environment overrides this.
# Guards likewise: automatic tracing's guards check in Python until those checks have cost what
# building their native check costs (engine.guardstate.NATIVE_IMPORT_S, a time), then build it, so
# a timing could switch in the middle; the suite times the settled (native) check.
# GUARDS_SET: whether this module set it (time-to-N points take it back: they measure guards as a
# user's process gets them).
GUARDS_SET = "VMAPBENCH_NATIVE_GUARDS" not in _os.environ
_os.environ.setdefault("VMAPBENCH_FUSED", "0")
_os.environ.setdefault("VMAPBENCH_NATIVE_GUARDS", "now")


def _own_measuring() -> None:
    """This checkout's measuring/ (beside suite/) imported as `measuring`, unless a `measuring` is
    imported already. asv imports the suite from the checkout and everything else from the commit
    it installed, and measures every commit with the current suite: the timer, like the rest of
    the measuring code, must be the checkout's too, and must be there at a commit from before it
    (the gate's probes load the gate checkout's suite, and with it the gate checkout's measuring/)."""
    if "measuring" in _sys.modules:
        return
    root = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "measuring")
    spec = _util.spec_from_file_location("measuring", _os.path.join(root, "__init__.py"),
                                         submodule_search_locations=[root])
    if spec is None or spec.loader is None:  # a copy of the suite without measuring/ beside it
        return
    package = _util.module_from_spec(spec)
    _sys.modules["measuring"] = package
    try:
        spec.loader.exec_module(package)
    except BaseException:
        del _sys.modules["measuring"]
        raise


_own_measuring()
