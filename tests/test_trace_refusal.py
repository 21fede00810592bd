"""engine.trace refusing midway: the eager rerun that replaces the aborted recording must start from
the state before it, so writes the function made into its inputs or captured tensors before the
data-dependent read happen once, as in an eager call."""
import warnings

import pytest
import torch

import engine


SCALE = torch.tensor(3.0)


def _write_then_read(x):
    x.add_(1)
    scale = SCALE.item()  # a data-dependent read after the write: the trace refuses here
    return x * scale


@pytest.mark.parametrize("wrap", [lambda f: f, engine.vmap], ids=["plain", "vmap"])
def test_input_write_before_a_refused_read_happens_once(wrap):
    f = engine.trace(wrap(_write_then_read), fallback="eager")
    x = torch.zeros(3, 2)
    expected_x = x.clone()
    with warnings.catch_warnings(), engine.auto_tracing(False):
        warnings.simplefilter("ignore", engine.TraceFallbackWarning)
        for _ in range(3):
            want = wrap(_write_then_read)(expected_x)
            torch.testing.assert_close(f(x), want)
            torch.testing.assert_close(x, expected_x)


def test_captured_tensor_write_before_a_refused_read_happens_once():
    acc = torch.zeros(2)

    def f(x):
        acc.add_(1)
        return x * acc.sum().item()

    traced = engine.trace(f, fallback="eager")
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", engine.TraceFallbackWarning)
        for n in range(1, 4):
            torch.testing.assert_close(traced(x), x * 2.0 * n)
            torch.testing.assert_close(acc, torch.full((2,), float(n)))
