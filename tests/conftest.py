"""Shared pytest fixtures: every test starts from the same global RNG state."""
from __future__ import annotations

import os
import random

# The fused tier (engine.fused) compiles a replayed signature in a worker process and switches to
# the program when ready; programs left on disk by an earlier run load after a few replays. Tests
# run on the replay tier, deterministically, unless the environment asks for another
# (VMAPBENCH_FUSED=force in CI's fused pass); tests/test_fused.py drives the tier itself.
os.environ.setdefault("VMAPBENCH_FUSED", "0")
from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def seeded() -> int:
    """Seed torch's and Python's global generators so random inputs repeat from run to run."""
    seed = 0
    torch.manual_seed(seed)
    random.seed(seed)
    return seed


@pytest.fixture(autouse=True)
def backend_flags_unfrozen() -> Iterator[None]:
    """Importing PyTorch's own test utilities (OpInfo's op_db, custom_op_db) calls
    `torch.backends.disable_global_flags()` for the whole process, after which setting e.g.
    `torch.backends.cudnn.deterministic` raises (Opacus' embedding grad sampler does). Each test
    starts with the flags as a user process has them, whatever was imported before it."""
    with getattr(torch.backends, "__allow_nonbracketed_mutation")():  # torch's own way to unfreeze them
        yield
