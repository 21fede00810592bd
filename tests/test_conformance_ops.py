"""Ops batched per element (issue #19): engine.vmap must equal a for-loop over the batch, bit for bit
for the discrete ops (histogram bins), with no fallback recorded."""
from __future__ import annotations

import pytest
import torch

import engine
from loop_reference import check


def _data(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3
    x[0].fill_(1.25)  # a constant example: its range is widened (histc by 1, histogram by 0.5)
    return x


HISTC = {
    "data_range": lambda x: torch.histc(x, bins=7),
    "given_range": lambda x: torch.histc(x, bins=5, min=-2, max=3),
    "edge_values": lambda x: torch.histc(x.round(), bins=6, min=-3, max=3),
}


@pytest.mark.parametrize("name", sorted(HISTC))
def test_histc_matches_loop(name: str) -> None:
    check(HISTC[name], (0,), _data(4, 300))
    check(HISTC[name], (1,), _data(5, 4).T.contiguous().T)


HISTOGRAM = {
    "bin_count": lambda x, w, e: torch.histogram(x, bins=6),
    "range_weight_density": lambda x, w, e: torch.histogram(x, bins=4, range=(-1.0, 2.0), weight=w, density=True),
    "edges": lambda x, w, e: torch.histogram(x, bins=e, weight=w),
    "edges_density": lambda x, w, e: torch.histogram(x.round(), bins=e.round().sort().values, density=True),
}


@pytest.mark.parametrize("name", sorted(HISTOGRAM))
def test_histogram_matches_loop(name: str) -> None:
    x, w = _data(3, 40), torch.rand(40)
    e = torch.linspace(-3, 3, 5).repeat(3, 1) + torch.tensor([[0.0], [0.5], [-0.25]])
    check(HISTOGRAM[name], (0, None, 0), x, w, e, exact=name != "range_weight_density")
    check(HISTOGRAM[name], (0, None, None), x, w, e[0], exact=name != "range_weight_density")


def test_histograms_of_empty_examples_match_loop() -> None:
    """No values: the edges span the kernel's default range [0, 1], not a widened point."""
    x = torch.randn(3, 5, 0, 5)
    check(lambda t: torch.histogram(t, 1), (0,), x)
    check(lambda t: torch.histogramdd(t.reshape(0, 2), bins=[2, 3]), (0,), torch.randn(3, 0, 2))
    check(lambda t: torch.histc(t, bins=3), (0,), x)


def test_histogramdd_matches_loop() -> None:
    x = _data(3, 50, 2)
    edges = [torch.tensor([-3.0, 0.0, 1.0, 4.0]), torch.tensor([-1.0, 1.0])]
    check(lambda t: torch.histogramdd(t, bins=[3, 4]), (0,), x)
    check(lambda t: torch.histogramdd(t, bins=[2, 2], range=[-1.0, 1.0, 0.0, 2.0], density=True), (0,), x, exact=False)
    check(lambda t: torch.histogramdd(t, bins=edges), (0,), x)


@pytest.mark.parametrize("fmt", [torch.channels_last, torch.channels_last_3d])
def test_channels_last_copies_match_loop(fmt: torch.memory_format) -> None:
    x = _data(3, 2, 3, 4, 5, 2)[..., 0] if fmt is torch.channels_last else _data(3, 2, 3, 4, 5, 2)
    to = lambda t: t.to("cpu", torch.float64, memory_format=fmt)  # noqa: E731
    clone = lambda t: t.clone(memory_format=fmt)  # noqa: E731
    check(to, (0,), x)
    check(clone, (1,), x.movedim(0, 1))
    out = engine.vmap(clone)(x)
    assert all(o.is_contiguous(memory_format=fmt) for o in out)  # each example laid out channels-last


def test_channels_last_of_wrong_rank_raises_like_torch() -> None:
    with pytest.raises(RuntimeError, match="required rank 4"):
        engine.vmap(lambda t: t.clone(memory_format=torch.channels_last))(torch.randn(3, 4, 5))


@pytest.mark.parametrize("reduce", ["max", "mean", "min", "sum", "prod"])
def test_segment_reduce_matches_loop(reduce: str) -> None:
    x = _data(3, 5, 4)
    lengths, offsets = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 0, 1, 3, 5])
    check(lambda t: torch.segment_reduce(t, reduce, lengths=lengths, initial=1.5), (0,), x)
    check(lambda t: torch.segment_reduce(t, reduce, offsets=offsets), (2,), x.movedim(0, 2))
    rows = torch.tensor([[1, 3]] * 5)
    check(lambda t: torch.segment_reduce(t, reduce, lengths=rows, axis=1), (0,), x)


def test_resize_matches_loop_and_refuses_growth() -> None:
    x = _data(3, 4, 5)
    check(lambda t: t.clone().resize_(2, 3), (2,), x.movedim(0, 2))
    check(lambda t: t.clone().resize_as_(torch.ones(5, 2)), (0,), x)
    with pytest.raises(RuntimeError, match="uninitialized"):
        engine.vmap(lambda t: t.clone().resize_(30))(x)


def _ctc_inputs(B: int = 3, T: int = 12, N: int = 4, C: int = 6, S: int = 5):
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(B, T, N, C, generator=g).log_softmax(-1)
    targets = torch.randint(1, C, (B, N, S), generator=g)
    il = torch.tensor([[12, 10, 12, 7], [11, 12, 9, 12], [12, 8, 12, 12]])
    tl = torch.tensor([[5, 3, 1, 4], [2, 5, 0, 3], [4, 4, 2, 1]])
    return lp, targets, il, tl


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_ctc_loss_forward_matches_loop(reduction: str) -> None:
    lp, targets, il, tl = _ctc_inputs()
    F = torch.nn.functional
    check(lambda a, t, i, l: F.ctc_loss(a, t, i, l, reduction=reduction), (0, 0, 0, 0), lp, targets, il, tl)
    check(lambda a, t: F.ctc_loss(a, t, il[0], tl[0], reduction=reduction, zero_infinity=True), (1, None),
           lp.movedim(0, 1), targets[0])
    flat = torch.stack([torch.cat([targets[b, n, :tl[0, n]] for n in range(4)]) for b in range(3)])
    check(lambda a, t: F.ctc_loss(a, t, il[0].tolist(), tl[0].tolist(), reduction=reduction), (0, 0), lp, flat)


def test_ctc_loss_backward_matches_loop() -> None:
    lp, targets, il, tl = _ctc_inputs()

    def loss(a, t, i, l):
        return torch.nn.functional.ctc_loss(a.log_softmax(-1), t, i, l, reduction="sum")

    got = engine.vmap(engine.grad(loss))(lp, targets, il, tl)
    want = torch.stack([torch.func.grad(loss)(*(x[b] for x in (lp, targets, il, tl))) for b in range(3)])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    with engine.fallback_policy("silent"), engine.record_fallbacks() as rec:
        engine.vmap(engine.grad(loss))(lp, targets, il, tl)
    assert not rec.counts, f"fell back: {dict(rec.counts)}"


def test_traced_histograms_never_bake_data() -> None:
    """A data-dependent range is read with .item(), which engine.trace refuses; a fixed range replays."""
    x1, x2 = _data(3, 20), _data(3, 20, seed=1) * 5 + 3
    fixed = lambda t: torch.histc(t, bins=5, min=-1, max=2)  # noqa: E731
    traced = engine.trace(engine.vmap(fixed))
    traced(x1)
    assert torch.equal(traced(x2), torch.stack([fixed(t) for t in x2]))
    with pytest.raises(engine.UntraceableError):
        engine.trace(engine.vmap(lambda t: torch.histc(t, bins=5)))(x1)


INPLACE_BY_TWIN = {
    "copysign_": lambda a, b: a.clone().copysign_(b),
    "mish_": lambda a, b: torch.nn.functional.mish(a.clone(), inplace=True),
    "threshold_": lambda a, b: torch.nn.functional.threshold(a.clone(), 0.1, 2.0, inplace=True),
    "index_fill_": lambda a, b: a.clone().index_fill_(1, torch.tensor([1, 2]), 5.0),
    "scatter_reduce_": lambda a, b: a.clone().scatter_reduce_(1, torch.tensor([[1, 0, 1, 2]]).expand(2, 4), b, "amax"),
}


@pytest.mark.parametrize("name", sorted(INPLACE_BY_TWIN))
def test_inplace_op_without_rule_runs_its_out_of_place_rule(name: str) -> None:
    """An in-place op whose out-of-place twin has a rule is batched as twin + copy_, with no loop,
    for a batch at 0 and for one stacked innermost."""
    x, y = _data(3, 2, 4), _data(3, 2, 4, seed=1)
    exact = name != "mish_"  # a transcendental: the vectorized and scalar kernels differ in the last bit
    check(INPLACE_BY_TWIN[name], (0, 0), x, y, exact=exact)
    check(INPLACE_BY_TWIN[name], (-1, -1), x.movedim(0, -1).contiguous(), y.movedim(0, -1).contiguous(), exact=exact)


def test_inplace_twin_keeps_the_in_place_dtype_check() -> None:
    with pytest.raises(RuntimeError, match="can't be cast"):
        engine.vmap(lambda a: a.clone().copysign_(torch.tensor(-1.0)))(torch.arange(12).reshape(3, 4))


SOFTMAX_BACKWARD = {
    "log": lambda g, y: torch.ops.aten._log_softmax_backward_data(g, y, -1, g.dtype),
    "plain": lambda g, y: torch.ops.aten._softmax_backward_data(g, y, y.dim() - 1, g.dtype),
    "log_dim0": lambda g, y: torch.ops.aten._log_softmax_backward_data(g, y, 0, g.dtype),
}


@pytest.mark.parametrize("name", sorted(SOFTMAX_BACKWARD))
@pytest.mark.parametrize("classes", [1, 4, 7, 8, 33])
@pytest.mark.parametrize("in_dims", [(0, 0), (0, None), (None, 0), (1, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_backwards_match_loop(name: str, classes: int, in_dims: tuple, dtype: torch.dtype) -> None:
    """The softmax backwards under vmap, short last dims (a formula on float32) and long, against
    the loop, either argument unbatched."""
    g = torch.Generator().manual_seed(classes)
    grad = torch.randn(5, 6, classes, generator=g, dtype=dtype)
    out = torch.randn(5, 6, classes, generator=g, dtype=dtype).log_softmax(-1)
    if name == "plain":
        out = out.exp()
    grad = grad if in_dims[0] != 1 else grad.movedim(0, 1).contiguous()
    grad, out = (grad[0] if in_dims[0] is None else grad), (out[0] if in_dims[1] is None else out)
    check(SOFTMAX_BACKWARD[name], in_dims, grad, out, exact=False)


SHARED_INDEX_PUT = {
    # (x's shape, the indices, the values' shape per example): indices the batch shares
    "column": ((4, 8), lambda: [None, torch.tensor([3, 0, 3, 7, 1])], (4, 5)),
    "leading": ((6, 3), lambda: [torch.tensor([5, 1, 5])], (3, 3)),
    "adjacent_pair": ((3, 4, 5), lambda: [None, torch.tensor([0, 3, 3]), torch.tensor([4, 4, 1])], (3, 3)),
    "not_adjacent": ((3, 4, 6), lambda: [torch.tensor([0, 2, 2]), None, torch.tensor([1, 5, 1])], (3, 4)),
    "broadcast_values": ((5, 4), lambda: [torch.tensor([[1], [3]]), torch.tensor([0, 2, 2])], (1, 3)),
}


@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("name", sorted(SHARED_INDEX_PUT))
def test_index_put_with_shared_indices_matches_loop(name: str, accumulate: bool) -> None:
    """index_put whose indices are the same for every example (an index's backward under vmap):
    x batched or not, values batched or not."""
    shape, indices, vshape = SHARED_INDEX_PUT[name]
    g = torch.Generator().manual_seed(len(name))
    x, v = torch.randn(3, *shape, generator=g), torch.randn(3, *vshape, generator=g)

    def put(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.index_put.default(x, indices(), v, accumulate)

    for in_dims in [(0, 0), (0, None), (None, 0)]:
        check(put, in_dims, x if in_dims[0] == 0 else x[0], v if in_dims[1] == 0 else v[0], exact=accumulate is False)
