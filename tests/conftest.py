"""Shared pytest fixtures: every test starts from the same global RNG state."""
from __future__ import annotations

import random

import pytest
import torch


@pytest.fixture(autouse=True)
def seeded() -> int:
    """Seed torch's and Python's global generators so random inputs repeat from run to run."""
    seed = 0
    torch.manual_seed(seed)
    random.seed(seed)
    return seed
