"""Ops whose output size depends on the data, and range factories with tensor endpoints (issue #26):
engine.vmap equals a for-loop over the batch (bit for bit for the discrete ops), with no fallback
recorded, and raises, naming the sizes, where the elements' sizes differ."""
from __future__ import annotations

import itertools
from typing import Any, Callable

import pytest
import torch

import engine
from engine.errors import DataDependentError
from loop_reference import check, loop

NAN = float("nan")


def _loop(fn: Callable, in_dims: tuple, *args: Any) -> list:
    """Each element as its own tensor (a clone), results stacked."""
    return loop(fn, in_dims, *args, clone=True)


def _check(fn: Callable, in_dims: tuple, *args: Any, exact: bool = True) -> None:
    check(fn, in_dims, *args, exact=exact, clone=True)


def _layouts(x: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """x ([B, ...]) with its batch at 0, and stacked innermost (contiguous and as a view)."""
    if x.dim() == 1:
        return [(x, 0)]
    return [(x, 0), (x.movedim(0, -1).contiguous(), -1), (x.movedim(0, -1), -1)]


# rows with the same number of nonzeros / distinct values / runs, in different places
EQUAL_COUNTS = torch.tensor([[0., 1., 2., 0., 2., 2.], [3., 0., 0., 4., 3., 3.], [0., 0., 5., 6., 5., 6.]])


@pytest.mark.parametrize("fn", [torch.nonzero, torch.argwhere], ids=["nonzero", "argwhere"])
def test_nonzero_matches_loop(fn: Callable) -> None:
    for x in (EQUAL_COUNTS, EQUAL_COUNTS.reshape(3, 2, 3), torch.tensor([1., 2., 3.]), torch.zeros(3, 0)):
        for xin, d in _layouts(x):
            _check(fn, (d,), xin)


def test_masked_select_with_batched_mask_matches_loop() -> None:
    x = torch.randn(3, 2, 6)
    mask = EQUAL_COUNTS.reshape(3, 1, 6) != 0            # broadcast over x's first logical dim
    _check(torch.masked_select, (0, 0), x, mask)
    _check(torch.masked_select, (0, 0), x[:, 0, :4], mask.expand(3, 4, 6)[..., :4])  # mask larger than x
    _check(torch.masked_select, (None, 0), x[0], mask)   # only the mask batched
    _check(torch.masked_select, (-1, -1), x.movedim(0, -1).contiguous(), mask.movedim(0, -1))


UNIQUE_INPUTS = {
    "plain": EQUAL_COUNTS,
    "nan_distinct": torch.tensor([[3., NAN, 3., NAN], [1., NAN, NAN, 1.], [NAN, 2., NAN, 2.]]),
    "bool": torch.tensor([[True, False], [False, True], [True, False]]),
    "matrix": EQUAL_COUNTS.reshape(3, 3, 2),
    "empty": torch.zeros(3, 0),
}


@pytest.mark.parametrize("name", sorted(UNIQUE_INPUTS))
def test_unique_matches_loop(name: str) -> None:
    for sort, inverse, counts in itertools.product((True, False), repeat=3):
        def fn(t: torch.Tensor) -> Any:
            return torch.unique(t, sorted=sort, return_inverse=inverse, return_counts=counts)

        for xin, d in _layouts(UNIQUE_INPUTS[name]):
            _check(fn, (d,), xin)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unique_dim_matches_loop(dim: int) -> None:
    rows = torch.tensor([[1., 0.], [0., 1.], [1., 0.], [0., 0.]])
    x = torch.stack([rows, rows.flip(0), rows[[3, 3, 1, 0]]])  # 3 distinct rows each, 2 distinct columns
    for inverse, counts in itertools.product((True, False), repeat=2):
        def fn(t: torch.Tensor) -> Any:
            return torch.unique(t, return_inverse=inverse, return_counts=counts, dim=dim)

        for xin, d in _layouts(x):
            _check(fn, (d,), xin)


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_unique_consecutive_matches_loop(dim: int | None) -> None:
    x = torch.tensor([[[1., 2.], [1., 2.], [3., 4.]], [[0., 0.], [5., 5.], [5., 5.]], [[1., 1.], [2., 2.], [2., 2.]]])
    if dim == 1:
        x = x.transpose(1, 2)  # the same runs, of columns
    if dim is None:
        x = torch.tensor([[1., 1., 2., NAN, NAN], [3., 3., 4., 5., 6.], [0., 1., 1., 2., 3.]])
    for inverse, counts in itertools.product((True, False), repeat=2):
        def fn(t: torch.Tensor) -> Any:
            return torch.unique_consecutive(t, return_inverse=inverse, return_counts=counts, dim=dim)

        for xin, d in _layouts(x):
            _check(fn, (d,), xin)


DIFFERENT_COUNTS = {
    "nonzero": (torch.nonzero, torch.tensor([[0., 1.], [1., 1.]])),
    "masked_select": (lambda t: torch.masked_select(t, t > 0), torch.tensor([[0., 1.], [1., 1.]])),
    "unique": (torch.unique, torch.tensor([[1., 1.], [1., 2.]])),
    "unique_dim": (lambda t: torch.unique(t, dim=0), torch.tensor([[[1.], [1.]], [[1.], [2.]]])),
    "unique_consecutive": (torch.unique_consecutive, torch.tensor([[1., 2.], [1., 1.]])),
}


@pytest.mark.parametrize("name", sorted(DIFFERENT_COUNTS))
def test_different_sizes_per_element_raise(name: str) -> None:
    fn, x = DIFFERENT_COUNTS[name]
    with pytest.raises(DataDependentError, match=r"different sizes \(\d+, \d+\)"):
        engine.vmap(fn)(x)


def test_unique_dim_refuses_nan() -> None:
    """ATen sorts slices with `<`, which orders no NaN: there is no order to reproduce."""
    x = torch.tensor([[[1., NAN], [0., 1.]], [[0., 0.], [1., 1.]]])
    with pytest.raises(DataDependentError, match="NaN"):
        engine.vmap(lambda t: torch.unique(t, dim=0))(x)


SPACED = {
    "linspace": lambda s, e, n: torch.linspace(s, e, n),
    "linspace_f64": lambda s, e, n: torch.linspace(s, e, n, dtype=torch.float64),
    "linspace_number_end": lambda s, e, n: torch.linspace(s, -3, n),
    "linspace_number_start": lambda s, e, n: torch.linspace(-2.0, e, n),
    "logspace": lambda s, e, n: torch.logspace(s, e, n),
    "logspace_base": lambda s, e, n: torch.logspace(s, e, n, base=2.0),
}


@pytest.mark.parametrize("name", sorted(SPACED))
@pytest.mark.parametrize("steps", [0, 1, 2, 7, 50])
def test_range_factories_with_tensor_endpoints(name: str, steps: int) -> None:
    """ATen's formula over the batch: equal to the per-element op up to rounding (ATen's SIMD lanes
    round differently from its scalar tail), and both endpoints exact."""
    g = torch.Generator().manual_seed(steps)
    s, e = torch.randn(4, generator=g), torch.randn(4, generator=g) * 3
    fn = SPACED[name]
    _check(lambda a, b: fn(a, b, steps), (0, 0), s, e, exact=False)
    _check(lambda a, b: fn(a, b, steps), (0, None), s, e[0], exact=False)
    if steps >= 2 and name.startswith("linspace"):
        got, want = engine.vmap(lambda a, b: fn(a, b, steps))(s, e), _loop(lambda a, b: fn(a, b, steps), (0, 0), s, e)[0]
        assert torch.equal(got[:, [0, -1]], want[:, [0, -1]])


@pytest.mark.parametrize("steps", [1, 5])
def test_complex_range_factories_with_tensor_endpoints(steps: int) -> None:
    s = torch.tensor([0.5 + 1j, 1 - 0.5j, 0.2j])
    e = torch.tensor([1 + 0j, 2j, 3 + 1j])
    _check(lambda a, b: torch.logspace(a, b, steps), (0, 0), s, e, exact=False)
    _check(lambda a, b: torch.linspace(a, b, steps), (0, 0), s, e, exact=False)


def test_linspace_integer_dtype_takes_the_counted_loop() -> None:
    """Integer linspace truncates per SIMD lane in ATen: no batched formula reproduces it."""
    s = torch.tensor([0., 1., 2.])
    fn = lambda a: torch.linspace(a, 10, 7, dtype=torch.int64)  # noqa: E731
    with engine.fallback_policy("silent"), engine.record_fallbacks() as rec:
        got = engine.vmap(fn)(s)
    assert rec.counts
    assert torch.equal(got, torch.stack([fn(a) for a in s]))


def test_linspace_refuses_non_scalar_endpoints() -> None:
    with pytest.raises(RuntimeError, match="0-dimensional start and end"):
        engine.vmap(lambda a: torch.linspace(a, 1.0, 3))(torch.zeros(3, 2))


def test_as_strided_copy_with_interleaved_batch_matches_loop() -> None:
    """A copy need not alias: with the batch innermost each element is read as its own tensor."""
    x = torch.arange(3 * 16, dtype=torch.float32).reshape(3, 16)
    fns = [lambda t: torch.as_strided_copy(t, (2, 2, 2, 2), (1, 1, 1, 1)),
           lambda t: torch.as_strided_copy(t, (2, 1, 1, 2), (1, 7, 7, 1))]
    for fn in fns:
        _check(fn, (-1,), x.movedim(0, -1).contiguous())
    m = torch.randn(3, 3, 3)
    for d, xin in ((-1, m.movedim(0, -1).contiguous()), (1, m.movedim(0, 1).contiguous())):
        _check(lambda t: torch.as_strided_copy(t, (2, 2), (1, 2), 1), (d,), xin)
