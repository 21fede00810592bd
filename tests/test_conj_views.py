"""Views that the engine's vmap makes copies (engine._view_copies): `x.conj()` and `_neg_view` of a
batched tensor, and a conjugate view given to vmap as an input. PyTorch's are views, so torch.func
and a per-example loop write through them; the engine's copies would not, silently. Every in-place
write that would show the difference raises (into the copy; into its base, a view of the base or
the caller's tensor while the copy lives; nested; under grad); out-of-place uses equal the loop;
once the copy is freed, the base may be written again. And `Tensor.view(dtype)`, which the
for-loop fallback answered with a stacked copy, is a view again (written through as the loop)."""
from __future__ import annotations

from typing import Callable

import pytest
import torch

import engine
from engine.errors import VmapError
from tests.loop_reference import loop


def _x(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, dtype=torch.complex64, generator=g)


# Each writes in place into the copy (`y`), or into the copy's base (`a`), after `y = view(a)`.
INTO_COPY: dict[str, Callable] = {
    "mul_": lambda a, y: y.mul_(1j),
    "add_ scalar": lambda a, y: y.add_(1),
    "copy_": lambda a, y: y.copy_(a),
    "zero_": lambda a, y: y.zero_(),
    "a view of the copy": lambda a, y: y[0].add_(1),
    "view_as_real of the copy": lambda a, y: torch.view_as_real(y).mul_(2),
    "resolve_conj of the copy": lambda a, y: y.resolve_conj().add_(1),
}
INTO_BASE: dict[str, Callable] = {
    "add_": lambda a, y: a.add_(1j),
    "mul_": lambda a, y: a.mul_(2),
    "copy_ from the copy": lambda a, y: a.copy_(y),
    "a view of the base": lambda a, y: a[0].add_(1j),
    "view_as_real of the base": lambda a, y: torch.view_as_real(a).mul_(2),
    "index_put_": lambda a, y: a.index_put_((torch.tensor([0]),), torch.tensor(1j, dtype=a.dtype)),
}
VIEWS: dict[str, Callable] = {"conj": torch.conj, "_neg_view": torch._neg_view}


def _writer(view: Callable, write: Callable) -> Callable:
    def f(a: torch.Tensor) -> torch.Tensor:
        y = view(a)
        write(a, y)
        return y

    return f


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("how", list(INTO_COPY))
def test_a_write_into_the_copy_raises(view: str, how: str) -> None:
    f = _writer(VIEWS[view], INTO_COPY[how])
    x = _x(3, 2)
    before = x.clone()
    with pytest.raises(VmapError, match=r"writes in place into the result of .*a copy under this vmap"):
        engine.vmap(f)(x)
    assert torch.equal(x, before)  # refused before writing anything


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("how", list(INTO_BASE))
def test_a_write_into_the_base_while_the_copy_lives_raises(view: str, how: str) -> None:
    f = _writer(VIEWS[view], INTO_BASE[how])
    with pytest.raises(VmapError, match=r"writes in place into a tensor whose .* is still alive"):
        engine.vmap(f)(_x(3, 2))


def test_a_write_into_the_callers_tensor_closed_over_raises() -> None:
    """The batched input's memory is the caller's tensor: writing that (unbatched) inside the
    function would leave the copy stale, where torch.func's view sees it."""
    x = _x(3, 2)

    def f(a: torch.Tensor) -> torch.Tensor:
        y = a.conj()
        x.add_(1)
        return y

    with pytest.raises(VmapError, match="still alive"):
        engine.vmap(f)(x)


@pytest.mark.parametrize("randomness", ["same", "different"])
def test_a_random_fill_of_the_callers_tensor_raises(randomness: str) -> None:
    """normal_ of an unbatched tensor takes VmapMode's path for random ops: checked there too."""
    x = _x(3, 2)

    def f(a: torch.Tensor) -> torch.Tensor:
        y = a.conj()
        x.normal_()
        return y

    with pytest.raises(VmapError, match="still alive"):
        engine.vmap(f, randomness=randomness)(x)


def test_a_conjugate_input_written_in_place_raises() -> None:
    """A conjugate view passed to vmap enters resolved (a copy): a write into it would not reach
    the viewed tensor, which torch.func writes through."""
    x = _x(3, 2)
    with pytest.raises(VmapError, match="conjugate/negative view passed to vmap"):
        engine.vmap(lambda a: a.mul_(2))(x.conj())


def test_the_viewed_tensor_of_a_conjugate_input_written_inside_raises() -> None:
    """vmap over `x.conj()`: torch.func's input is a view of `x`, so writing `x` inside the function
    changes it; the engine's resolved copy would not see the write."""
    x = _x(3, 2)

    def f(a: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return a * 2

    with pytest.raises(VmapError, match="still alive"):
        engine.vmap(f)(x.conj())


def test_the_error_names_the_op_the_view_and_the_fix() -> None:
    with pytest.raises(VmapError) as info:
        engine.vmap(_writer(torch.conj, INTO_COPY["mul_"]))(_x(3, 2))
    text = str(info.value)
    assert "mul_" in text and "conj()" in text and "conj_physical()" in text


@pytest.mark.parametrize("into", ["copy", "base"])
def test_nested_vmap_raises(into: str) -> None:
    f = _writer(torch.conj, INTO_COPY["mul_"] if into == "copy" else INTO_BASE["add_"])
    with pytest.raises(VmapError, match="a copy|still alive"):
        engine.vmap(engine.vmap(f))(_x(2, 3, 2))
    # the copy made at the outer level, written at the inner one
    def g(a: torch.Tensor) -> torch.Tensor:
        y = a.conj()
        engine.vmap(lambda r, s: (s if into == "copy" else r).mul_(2))(a, y)
        return y

    with pytest.raises(VmapError, match="a copy|still alive"):
        engine.vmap(g)(_x(2, 3, 2))


@pytest.mark.parametrize("into", ["copy", "base"])
@pytest.mark.parametrize("order", ["grad of vmap", "vmap of grad"])
def test_under_grad_raises(into: str, order: str) -> None:
    def f(r: torch.Tensor) -> torch.Tensor:
        a = r * (1 + 2j)
        y = a.conj()
        (y if into == "copy" else a).mul_(2)
        return (y * a).real.sum()

    r = torch.randn(3, 2)
    call = (lambda: engine.grad(lambda t: engine.vmap(f)(t).sum())(r)) if order == "grad of vmap" else \
        (lambda: engine.vmap(engine.grad(f))(r))
    with pytest.raises(VmapError, match="a copy|still alive"):
        call()


OUT_OF_PLACE: dict[str, Callable] = {
    "conj * x": lambda a: a.conj() * a,
    "sum of conj": lambda a: a.conj().sum(),
    "matmul": lambda a: a.conj() @ a,
    "conj of conj": lambda a: a.conj().conj() + 1,
    "resolve_conj": lambda a: a.conj().resolve_conj(),
    "neg_view + 1": lambda a: torch._neg_view(a) + 1,
    "conj, then the base written after the copy was freed": lambda a: (a.conj() * 2).sum() + a.add_(1).sum(),
    "a view of the conj": lambda a: a.conj()[0] * a[1],
    "conj_physical written": lambda a: a.conj_physical().mul_(1j),
}


@pytest.mark.parametrize("name", list(OUT_OF_PLACE))
def test_out_of_place_uses_equal_the_loop(name: str) -> None:
    f = OUT_OF_PLACE[name]
    x = _x(4, 3)
    got = engine.vmap(f)(x.clone())
    want = loop(f, (0,), x.clone())[0]
    # not bit for bit: a complex kernel reading a conjugate bit rounds apart from one on conj'd memory
    torch.testing.assert_close(got, want)


def test_a_write_after_the_copy_was_freed_is_allowed() -> None:
    def f(a: torch.Tensor) -> torch.Tensor:
        y = a.conj()
        s = (y * y).sum()
        del y
        a.mul_(1j)
        return s + a.sum()

    x = _x(4, 3)
    got_x, want_x = x.clone(), x.clone()
    got = engine.vmap(f)(got_x)
    want = loop(f, (0,), want_x)[0]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_x, want_x, atol=0, rtol=0)


def test_the_copy_made_by_an_earlier_vmap_does_not_block_writes_once_freed() -> None:
    x = _x(3, 2)
    y = engine.vmap(torch.conj)(x)
    with pytest.raises(VmapError, match="still alive"):
        engine.vmap(lambda a: a.add_(1))(x)
    del y
    engine.vmap(lambda a: a.add_(1))(x)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.int16])
def test_view_dtype_is_a_view_written_through_as_the_loop(dtype: torch.dtype) -> None:
    def f(a: torch.Tensor) -> torch.Tensor:
        v = a.view(dtype)
        v.add_(1)
        return a

    x = torch.randn(3, 4)
    got_x, want_x = x.clone(), x.clone()
    with engine.fallback_policy("error"):
        got = engine.vmap(f)(got_x)
    want = loop(f, (0,), want_x)[0]
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.equal(got_x.view(torch.int32), want_x.view(torch.int32))


def test_view_dtype_of_a_0dim_element_changing_size_raises_the_ops_error() -> None:
    with pytest.raises(RuntimeError, match="0"):
        engine.vmap(lambda a: a.view(torch.float64))(torch.randn(4))


def test_a_view_op_run_by_the_fallback_is_recorded_as_a_copy() -> None:
    """A view op without a rule is run per element and stacked (a copy): writes that would show it
    raise (view.dtype's rule removed for the test)."""
    from engine.rules._table import RULES

    op = torch.ops.aten.view.dtype
    rule = RULES.pop(op)
    try:
        def f(a: torch.Tensor) -> torch.Tensor:
            v = a.view(torch.int32)
            v.add_(1)
            return a

        with engine.fallback_policy("silent"), pytest.raises(VmapError, match="for-loop fallback"):
            engine.vmap(f)(torch.randn(3, 4))
    finally:
        RULES[op] = rule
