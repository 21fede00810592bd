"""The replay contract (engine.replay_contract, docs/design/replay-contract.md): a replay runs its
eager call's rounding ops on the same data laid out the same way, checked on the op logs rather
than on one CPU's bits; shadow verification allows a difference in rounding alone and nothing else."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

import engine
from engine import autotrace, graph_passes, timed_choices
from engine.autotrace import autotraced_state
from engine.errors import ReplayMismatchError
from engine.graph_passes import ARITHMETIC_PASSES
from engine.replay_contract import departures, logs

CALLS = 5  # first call, watched call, recording call, then replays


def _departures(replay, eager) -> list[str]:
    r, e = logs()
    with r:
        replay()
    with e:
        eager()
    return [r.describe(k) for k in departures(r, e)]


def test_the_same_data_however_it_was_made_is_no_departure():
    a, w = torch.randn(8, 5), torch.randn(5, 3)
    scale = torch.tensor(2.0)
    assert _departures(lambda: (a * scale) @ w, lambda: (a * torch.tensor(2.0)) @ w) == []  # a fresh equal scalar
    assert _departures(lambda: a.clone() @ w, lambda: a @ w) == []  # a copy read back as written
    assert _departures(lambda: (a * 1) @ w, lambda: a @ w) == []  # x * 1
    assert _departures(lambda: torch.eye(5) @ w, lambda: torch.zeros(5, 5).fill_diagonal_(1.0) @ w) == []
    b = torch.randn(8, 5)
    assert _departures(lambda: a.sin() + b, lambda: (a.sin() + b, a.cos())) == []  # the replay may run fewer ops


def test_another_layout_kernel_or_order_of_the_same_sums_is_a_departure():
    a, w = torch.randn(8, 5), torch.randn(5, 3)
    found = _departures(lambda: a @ w.t().contiguous().t(), lambda: a @ w)
    assert found and "mm" in found[0] and "strides [1, 5]" in found[0], found
    x, y, z = torch.randn(4), torch.randn(4), torch.randn(4)
    assert _departures(lambda: (x + y) + z, lambda: x + (y + z))  # re-associated
    batch = torch.randn(6, 8, 5)
    assert _departures(lambda: (batch.reshape(48, 5) @ w).reshape(6, 8, 3),
                       lambda: torch.bmm(batch, w.expand(6, 5, 3)))  # the folded broadcast matmul


def test_other_values_are_departures():
    x = torch.randn(4, 3)
    assert _departures(lambda: x * 3.0, lambda: x * 2.0)  # a stale Python scalar
    old, new = torch.randn(3), torch.randn(3)
    assert _departures(lambda: x * old, lambda: x * new)  # a stale captured tensor
    same = old.clone()
    assert _departures(lambda: x * old, lambda: x * same) == []  # equal contents are the same data


def test_a_number_and_the_tensor_the_kernel_converts_it_to_are_the_same_operand():
    x, y = torch.randn(4, 3), torch.randn(4, 3, dtype=torch.float64)
    f32 = lambda v: torch.tensor(v, dtype=torch.float64).float()  # noqa: E731 (TensorIterator's cast)
    assert _departures(lambda: x * f32(0.1), lambda: x * 0.1) == []
    assert _departures(lambda: y / torch.tensor(3.0, dtype=torch.float64), lambda: y / 3) == []
    assert _departures(lambda: torch.add(x, f32(2.0), alpha=3), lambda: torch.add(x, 2, alpha=3)) == []
    assert _departures(lambda: (x / f32(1.0)) @ x.t(), lambda: x.clone().div_(1) @ x.t()) == []  # x / 1: a copy
    assert _departures(lambda: x < f32(0.5), lambda: x < 0.5) == []
    found = _departures(lambda: x * torch.tensor(0.1, dtype=torch.float32), lambda: x * 0.2)
    assert found and "a float32 number" in found[0], found  # another value is still another operand
    assert _departures(lambda: y * torch.tensor(0.1, dtype=torch.float32), lambda: y * 0.1)  # float32's 0.1, widened


def _replayed(f, *args):
    with engine.auto_tracing(True):
        for _ in range(CALLS):
            f(*args)
    return autotraced_state(f)


def test_a_pass_that_changes_the_arithmetic_names_itself_on_the_entry(monkeypatch):
    # mm_operand_layout times the matmul's layouts on this machine: pinned to "keep", so that the
    # rewrites named are the same on every machine, however busy
    monkeypatch.setattr(graph_passes, "_faster_layouts", lambda a, b, options: (False, False))
    X = torch.randn(20, 5)

    def loss(t):
        return torch.nn.functional.logsigmoid(X @ t).sum()

    h = engine.hessian(loss)
    state = _replayed(h, torch.randn(5))
    (entry,) = state.traced._cache.values()
    assert entry.rewrites == ("fold_identity_mm",)  # the one-hot basis's matmul, dropped
    assert set(entry.rewrites) <= set(ARITHMETIC_PASSES)
    t = torch.randn(5)
    with engine.auto_tracing(verify=True):  # compared within tolerance: the dropped mm is named, not a departure
        torch.testing.assert_close(h(t), torch.func.hessian(loss)(t))


def test_dropping_the_identity_matmul_keeps_the_layout_the_eager_call_had():
    # hessian's one-hot basis meets W1.T (a transposed captured weight) in a matmul whose product
    # is contiguous; W1.T in its place would make the broadcast multiply after it, and every
    # pointwise op after that, compute in W1.T's layout, and the reshape feeding the last matmul copy.
    g = torch.Generator().manual_seed(0)
    W1, b1, w2 = torch.randn(16, 3, generator=g), torch.randn(16, generator=g), torch.randn(16, generator=g)

    def u(x):
        return torch.tanh(W1 @ x + b1) @ w2

    f = engine.vmap(engine.hessian(u))
    points = torch.randn(8, 3, generator=g)
    state = _replayed(f, points)
    (entry,) = state.traced._cache.values()
    assert "fold_identity_mm" in entry.rewrites

    class Layouts(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            recorded = n.meta.get("val")
            if n.op == "call_function" and isinstance(out, torch.Tensor) and isinstance(recorded, torch.Tensor):
                assert out.stride() == recorded.stride(), f"{n.format_node()}: {out.stride()} != {recorded.stride()}"
            return out

    with torch.no_grad():
        Layouts(entry.gm).run(*entry.inputs([points]))
    torch.testing.assert_close(f(points), torch.func.vmap(torch.func.hessian(u))(points))


def _skinny_product():
    # under vmap, a [64] row times a row-major [64, 3] weight becomes one [768, 64] @ [64, 3] mm
    g = torch.Generator().manual_seed(0)
    W, x = torch.randn(64, 3, generator=g), torch.randn(768, 64, generator=g)
    return W, x, (lambda row: torch.tanh(row) @ W)


def test_a_captured_matmul_operand_takes_the_layout_its_matmul_runs_faster_in(monkeypatch):
    asked = []

    def faster(a, b, options):  # the timing, decided here: the weight column-major
        asked.append(options)
        return (False, True) if (False, True) in options else (False, False)

    monkeypatch.setattr(graph_passes, "_faster_layouts", faster)
    W, x, u = _skinny_product()
    f = engine.vmap(u)
    state = _replayed(f, x)
    (entry,) = state.traced._cache.values()
    assert asked == [[(False, True)]]  # the weight is captured, the rows are not
    assert "mm_operand_layout" in entry.rewrites
    assert any(v.shape == (64, 3) and v.stride() == (1, 64) for v in entry.fold.values())  # copied once, by the fold
    with engine.auto_tracing(verify=True):  # held to the tolerance: the pass names itself
        torch.testing.assert_close(f(x), torch.func.vmap(u)(x))
    W.mul_(-2)  # the copy follows the captured weight's contents
    torch.testing.assert_close(f(x), torch.func.vmap(u)(x))


def test_layouts_stay_where_the_other_is_not_faster_or_the_operand_needs_grad(monkeypatch):
    asked = []
    monkeypatch.setattr(graph_passes, "_faster_layouts", lambda a, b, options: asked.append(options) or (False, False))
    W, x, u = _skinny_product()
    f = engine.vmap(u)
    (entry,) = _replayed(f, x).traced._cache.values()
    assert asked and "mm_operand_layout" not in entry.rewrites
    assert all(v.stride() != (1, 64) for v in (entry.fold.values() if entry.fold else ()))
    asked.clear()
    W.requires_grad_()  # (the fold would recompute a copy of it on every call)
    g = engine.vmap(u)
    with torch.no_grad():
        (entry,) = _replayed(g, x).traced._cache.values()
        torch.testing.assert_close(g(x), x.tanh() @ W)
    assert asked == [] and "mm_operand_layout" not in entry.rewrites


def test_the_layout_choice_is_timed_once_per_pair_of_layouts(monkeypatch):
    a = torch.empty(768, 64, device="meta")
    b = torch.empty(64, 3, device="meta")
    monkeypatch.setattr(timed_choices, "TABLE", {})
    first = graph_passes._faster_layouts(a, b, [(False, True)])
    assert first in ((False, False), (False, True))
    (key,) = timed_choices.TABLE
    timed_choices.TABLE[key] = (True, True)  # what the next ask gets: the kept choice, not a new timing
    assert graph_passes._faster_layouts(a, b, [(False, True)]) == (True, True)


def test_a_flat_vectors_gradient_is_one_cat_with_the_eager_calls_bits():
    # the gradient of a vector cut into parts is a sum of zero-padded parts (slice_backward);
    # a cat of the parts plus 0.0 gives its bits, -0.0 made +0.0 as the adds make it, and a
    # range no part reads (7:8) stays zero.
    c = torch.tensor([-0.0, 1.0, -2.0])

    def f(theta):
        return (theta[:3] * c).sum() + theta[3:7].sin().sum() + theta[8:].exp().sum()

    g = engine.grad(f)
    theta = torch.randn(11)
    state = _replayed(g, theta)
    (entry,) = state.traced._cache.values()
    assert "slice_sums_to_cat" in entry.rewrites
    assert not any(n.target is torch.ops.aten.slice_backward.default for n in entry.gm.graph.nodes)
    with engine.auto_tracing(False):
        eager = g(theta)
    got = g(theta)
    assert torch.equal(got, eager) and torch.equal(got.signbit(), eager.signbit())
    assert not got[0].signbit() and got[7] == 0


def test_overlapping_parts_of_a_gradient_still_add_up():
    def f(theta):
        return (theta[:-1] * theta[1:]).sum() + theta[2:].sum()  # overlapping ranges: a sum, not a cat

    g = engine.grad(f)
    theta = torch.randn(9)
    state = _replayed(g, theta)
    (entry,) = state.traced._cache.values()
    assert "slice_sums_to_cat" not in entry.rewrites
    got = g(theta)
    with engine.auto_tracing(False):
        assert torch.equal(got, g(theta))


def test_numbers_become_tensors_made_once_and_replays_keep_the_eager_bits():
    w = torch.randn(5)

    def f(x):
        return ((x * 2.5 - 1) / 3 > 0.25).float() * x - 0.5 + (x + w) * 0.1 + w * 3  # (w * 3: the fold's)

    g = engine.vmap(f)
    x = torch.randn(7, 5)
    with engine.auto_tracing(verify=True):  # (each replay's ops checked against its eager call's)
        state = _replayed(g, x)
        got = g(x)
    (entry,) = state.traced._cache.values()
    assert entry.fold is not None and not entry.rewrites
    assert not [n for n in entry.gm.graph.nodes if n.target in graph_passes.SCALAR_TWINS
                and type(n.args[1]) in (int, float)], entry.gm.code
    assert all(n.users for n in entry.gm.graph.nodes if n.op == "placeholder" and n.name.startswith("number_"))
    # what the fold computes once keeps its number (a 0-d tensor there would be one more source to watch)
    assert [n for n in entry.fold.gm.graph.nodes if n.op == "call_function" and n.args[1:] == (3,)], entry.fold.gm.code
    with engine.auto_tracing(False):
        assert torch.equal(got, g(x))
    w.data = w.double()  # a captured tensor's new dtype: the guard fails, the next call is right
    with engine.auto_tracing(False):
        want = g(x)
    assert want.dtype == torch.float64 and torch.equal(g(x), want)


def test_a_number_beside_a_captured_tensor_follows_its_new_dtype_under_engine_trace():
    # engine.trace has no guard on captured tensors' dtypes: its replays follow them, so a number
    # whose operand depends on one stays a number there
    w = torch.randn(5)
    traced = engine.trace(lambda x: (x + w) * 0.1)
    x = torch.randn(5)
    for _ in range(3):
        traced(x)
    w.data = w.double()
    got, want = traced(x), (x + w) * 0.1
    assert got.dtype == want.dtype == torch.float64 and torch.equal(got, want)


def test_strides_are_part_of_a_signature():
    def f(x):
        return (x @ x.t()).sum(0)

    traced = engine.trace(f)
    x = torch.randn(6, 6)
    xt = x.t()
    for _ in range(3):
        traced(x)
        traced(xt)
    assert traced.cache_info().traces == 2
    assert torch.equal(traced(xt), f(xt)) and torch.equal(traced(x), f(x))


def _nudged(state, amount: float) -> None:
    """Make the trace's replays differ from the eager call by `amount` at one element, outside the
    op log: what a kernel rounding differently from call to call looks like to verification."""
    real_call = state.traced._call

    def call(*args, **kwargs):
        out = real_call(*args, **kwargs)
        with _disable_current_modes(), torch.no_grad():
            out = out.clone()
            out[0, 0] += amount
        return out

    state.traced._call = call


@pytest.mark.parametrize("amount, raises", [(2e-7, False), (1e-2, True)])
def test_verification_allows_rounding_alone(amount, raises):
    def scaled(t):
        return torch.sin(t) * 2

    f = engine.vmap(scaled)
    x = torch.randn(4, 3)
    state = _replayed(f, x)
    _nudged(state, amount)
    before = autotrace.rounding_only
    with engine.auto_tracing(verify=True):
        if raises:
            with pytest.raises(ReplayMismatchError, match=r"scaled.*index \(0, 0\)"):
                f(x)
        else:
            f(x)
            assert autotrace.rounding_only == before + 1
