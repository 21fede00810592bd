"""glibc malloc settings for the processes that time code (the gate's probes, peer_ratios).

On these VMs (free memory goes back to the host) every fresh page is a fault the host serves. With
glibc's defaults, blocks above a sliding threshold are mmapped and unmapped call by call and the
heap's top is trimmed back to the system, so which call paid for which pages decided its time: a
method's rounds split into a fast and a slow mode by which method ran before it, and an A/A
comparison moved as much as a regression would (docs/lab/2026-11-27-gate-calibration.md). These settings make
malloc keep what it was given: a fixed 32 MiB mmap threshold, no trim, a 64 MiB top pad. Every
method of a process gets them alike; they are read at process start, so a process sets them for a
child (`in_env`) or runs itself again with them (`reexec_with_tunables`).
"""
from __future__ import annotations

import os
import sys
from typing import MutableMapping

TUNABLES = ("glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296:"
            "glibc.malloc.top_pad=67108864")
VARIABLE = "GLIBC_TUNABLES"


def in_env(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """`env` with the tunables, unless it sets GLIBC_TUNABLES itself (set it empty to opt out)."""
    env.setdefault(VARIABLE, TUNABLES)
    return env


def reexec_with_tunables(what: str) -> None:
    """Run this process's command line again with the tunables, where the environment does not set
    GLIBC_TUNABLES (set it, even empty, to keep glibc's defaults); returns only where it does not
    re-run (the variable is set, or not Linux). `what` names the program in the one line said."""
    if VARIABLE in os.environ or not sys.platform.startswith("linux"):
        return
    print(f"{what}: running again with {VARIABLE}={TUNABLES} (malloc keeps its pages: see measuring/malloc.py; "
          f"set {VARIABLE}= to keep glibc's defaults)", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execve(sys.executable, sys.orig_argv, in_env(dict(os.environ)))
