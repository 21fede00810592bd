"""engine/_compat.py: every shim resolves on the running torch, and behaves as the internal it stands
for. CI runs this file under the oldest and the newest supported torch (.ci/torch-versions)."""
from __future__ import annotations

import pytest
import torch

import engine
from engine import _compat


def test_the_running_torch_is_in_the_supported_range() -> None:
    oldest, newest = _compat.SUPPORTED
    assert oldest <= _compat.TORCH_VERSION <= newest, (
        f"torch {torch.__version__} is outside the range engine/_compat.py supports ({oldest}..{newest}); "
        f"install one of those releases exactly (the Makefile's TORCH_PIN)")


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001 - torch's signature
        pass

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return 2 * g

    generate_vmap_rule = True


def test_function_apply_runs_a_function_as_its_own_apply() -> None:
    x = torch.randn(3)
    assert torch.equal(_compat.function_apply(_Double, x), 2 * x)


def test_function_apply_owner_knows_a_bound_apply_and_nothing_else() -> None:
    bound = _compat._FUNCTION_APPLY.__get__(None, _Double)  # SomeFunction.apply, bound before the engine's check
    assert _compat.function_apply_owner(bound) is _Double
    assert _compat.function_apply_owner(_Double.forward) is None
    assert _compat.function_apply_owner(torch.sin) is None
    assert _compat.function_apply_owner(torch.randn(2).add) is None


def test_a_bound_apply_under_vmap_goes_through_the_engines_check() -> None:
    bound = _compat._FUNCTION_APPLY.__get__(None, _Double)
    x = torch.randn(4, 3)
    assert torch.equal(engine.vmap(bound)(x), 2 * x)

    class NoRule(_Double):
        generate_vmap_rule = False

    with pytest.raises(RuntimeError, match="generate_vmap_rule"):
        engine.vmap(_compat._FUNCTION_APPLY.__get__(None, NoRule))(x)
