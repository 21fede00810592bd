"""Shared pytest fixtures: every test starts from the same global RNG state."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

# The fused tier (engine.fused) compiles a replayed signature in a worker process and switches to
# the program when ready; programs left on disk by an earlier run load after a few replays. Tests
# run on the replay tier, deterministically, unless the environment asks for another
# (VMAPBENCH_FUSED=force in CI's fused pass); tests/test_fused.py drives the tier itself.
os.environ.setdefault("VMAPBENCH_FUSED", "0")
# pytest keeps its assertion-rewritten test modules in __pycache__ (git-ignored) unless bytecode
# writing is off (PYTHONDONTWRITEBYTECODE, as on CI's machines): then each worker of each run
# rewrote every test file again, seconds of its collection. As the Makefile compiles the project's
# modules for the same reason, the test processes write the tests' own (their children still follow
# the environment).
sys.dont_write_bytecode = False
from typing import Callable, Iterator

import pytest

# torch is imported where it is used: xdist's controller process loads this file too, and runs no
# test (importing torch there would delay the workers' start by its import time).


def _share_cores_between_workers() -> None:
    """Under pytest-xdist (`make test`), each worker's intra-op threads: the cores divided among
    the workers, so that they do not spin for each other's cores (docs/lab: the test workers'
    note); XLA's pool sized to match before anything imports jax (at one thread, with Eigen off
    it, as the jax method requires). Children started by tests inherit the same settings."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return
    import torch

    from engine import fused_xla

    threads = max(1, fused_xla.cores() // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    fused_xla._configure_threads()


_share_cores_between_workers()


def _accelerators_initialized() -> bool:
    import torch

    return any(getattr(torch, name).is_initialized() for name in ("cuda", "xpu", "mtia") if hasattr(torch, name))


_SEED = 0
_queued = [False]  # whether torch.manual_seed(_SEED) has queued the accelerators' seeding


@pytest.fixture(autouse=True)
def seeded() -> int:
    """Seed torch's and Python's global generators so random inputs repeat from run to run.

    torch.manual_seed also queues, for each accelerator not yet initialized, a seeding with the
    caller's formatted stack (a few ms under pytest's deep stacks, at every test). The seed is
    always the same and a queued seeding runs when the accelerator starts, so one queued seeding
    serves every test until then; after it, every test seeds every device."""
    import torch

    if not _queued[0] or _accelerators_initialized():
        torch.manual_seed(_SEED)
        _queued[0] = True
    else:
        torch.default_generator.manual_seed(_SEED)
    random.seed(_SEED)
    return _SEED


@pytest.fixture(autouse=True)
def backend_flags_unfrozen() -> Iterator[None]:
    """Importing PyTorch's own test utilities (OpInfo's op_db, custom_op_db) calls
    `torch.backends.disable_global_flags()` for the whole process, after which setting e.g.
    `torch.backends.cudnn.deterministic` raises (Opacus' embedding grad sampler does). Each test
    starts with the flags as a user process has them, whatever was imported before it."""
    import torch

    with getattr(torch.backends, "__allow_nonbracketed_mutation")():  # torch's own way to unfreeze them
        yield


@pytest.fixture
def native_guards_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards build their native check at once (engine.guardstate.NATIVE_GUARDS="now"), as they
    do in any process that has imported Dynamo: for tests of that check and the memo built on it,
    which would otherwise depend on whether an earlier test imported Dynamo."""
    from engine import guardstate

    monkeypatch.setattr(guardstate, "NATIVE_GUARDS", "now")


@pytest.fixture
def run_in_tree() -> Callable[[Path, str], subprocess.CompletedProcess]:
    """Runs Python code in a fresh interpreter with `tree` (e.g. a gate-extracted, planted copy of
    the project) first on its path and as its folder."""
    def run(tree: Path, code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                              capture_output=True, text=True, timeout=300)
    return run


_POOL_COUNT = """
import os
import torch
torch.set_num_threads(1)
{start}
jax.jit(lambda x: x * 2 + 1)(jax.numpy.ones((256, 256))).block_until_ready()
print(sum("XLAEigen" in open(f"/proc/self/task/{{t}}/comm").read() for t in os.listdir("/proc/self/task")))
"""


@pytest.fixture
def xla_pool_in_child(run_in_tree: Callable[[Path, str], subprocess.CompletedProcess]) -> Callable[[str], int]:
    """The threads of XLA's intra-op pool in a fresh interpreter of this tree, torch on one thread,
    after `start` (code that imports jax its own way and binds `jax`) and one jitted call."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("counts threads through Linux's /proc")
    root = Path(__file__).resolve().parents[1]

    def count(start: str) -> int:
        done = run_in_tree(root, _POOL_COUNT.format(start=start))
        done.check_returncode()
        return int(done.stdout.split()[-1])
    return count
