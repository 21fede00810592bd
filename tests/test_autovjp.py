"""engine.vjp on the default path (engine.autovjp): `engine.vmap(vjp_fn)` written inline replays,
and never gives a result from another state than the vjp call's."""
from __future__ import annotations

from typing import Any

import pytest
import torch

import engine
from engine import autovjp
from engine.transforms import TransformError

CALLS = 8  # enough for the pullback and the forward to pass automatic tracing's first calls


@pytest.fixture(autouse=True)
def _not_verifying() -> Any:
    """These tests look at what is deferred, which shadow verification changes (it keeps the real
    vjp_fn beside it): they run with it off, and turn it on where it is the subject."""
    with engine.auto_tracing(True, verify=False):
        yield


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 5, generator=g), torch.randn(5, generator=g), torch.randn(4, 5, generator=g)


X, THETA, VECTORS = _data()


def loss(theta: torch.Tensor) -> torch.Tensor:
    return torch.tanh(X @ theta).pow(2).mean()


def hvps(theta: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    _, vjp_fn = engine.vjp(engine.grad(loss), theta)
    return engine.vmap(vjp_fn)(vectors)[0]


def _eager(fn: Any, *args: Any) -> Any:
    with engine.auto_tracing(False):
        return fn(*args)


def _agrees(replayed: Any, eager: Any) -> None:
    """A deferred vjp_fn's result against the eager one: the pullback recomputes the forward that
    the real vjp_fn saved (the same ops on the same data, not one dataflow), so the two agree
    within the dtype's tolerance (docs/design/replay-contract.md); on some CPUs a kernel rounds
    the same operands differently from call to call."""
    torch.testing.assert_close(replayed, eager)


def _pullback(vjp_fn: Any) -> Any:
    record = vjp_fn._vjp_record
    (auto,) = autovjp._pullbacks[record.key]
    return auto


def test_inline_hvp_loop_replays_and_equals_eager() -> None:
    ref = _eager(hvps, THETA, VECTORS)
    outs = [hvps(THETA, VECTORS) for _ in range(CALLS)]
    for out in outs:
        _agrees(out, ref)
    _, vjp_fn = engine.vjp(engine.grad(loss), THETA)
    assert vjp_fn._vjp_record.real is None  # deferred: no eager backward graph was built
    auto = _pullback(vjp_fn)
    hits = auto.traced._hits
    _agrees(engine.vmap(vjp_fn)(VECTORS)[0], ref)
    assert auto.traced._hits == hits + 1


def test_new_point_and_new_vectors_each_call() -> None:
    for i in range(CALLS):
        theta, vectors = THETA + i, VECTORS * (i + 1)
        _agrees(hvps(theta, vectors), _eager(hvps, theta, vectors))


def test_direct_call_of_a_deferred_vjp_fn_equals_eager() -> None:
    for _ in range(CALLS):
        hvps(THETA, VECTORS)
    _, vjp_fn = engine.vjp(engine.grad(loss), THETA)
    assert vjp_fn._vjp_record.real is None
    _, real = _eager(lambda t: engine.vjp(engine.grad(loss), t), THETA)
    _agrees(vjp_fn(VECTORS[0])[0], real(VECTORS[0])[0])


SCALE = 1.0


def scaled(theta: torch.Tensor) -> torch.Tensor:
    return (torch.sin(theta) * SCALE).pow(2).sum()


def test_global_rebound_between_vjp_and_its_vjp_fn_is_refused() -> None:
    global SCALE
    for _ in range(CALLS):
        _, fn = engine.vjp(engine.grad(scaled), THETA)
        engine.vmap(fn)(VECTORS)
    _, fn = engine.vjp(engine.grad(scaled), THETA)
    assert fn._vjp_record.real is None
    try:
        SCALE = 2.0
        with pytest.raises(TransformError, match="changed"):
            engine.vmap(fn)(VECTORS)
        with pytest.raises(TransformError, match="changed"):
            fn(VECTORS[0])
        # Changed before the vjp call: the new state's gradients.
        _, fn = engine.vjp(engine.grad(scaled), THETA)
        ref = _eager(lambda: engine.vmap(engine.vjp(engine.grad(scaled), THETA)[1])(VECTORS))
        _agrees(engine.vmap(fn)(VECTORS)[0], ref[0])
    finally:
        SCALE = 1.0


def test_in_place_write_into_a_primal_between_vjp_and_its_vjp_fn_is_refused() -> None:
    theta = THETA.clone()
    for _ in range(CALLS):
        hvps(theta, VECTORS)
    _, fn = engine.vjp(engine.grad(loss), theta)
    assert fn._vjp_record.real is None
    theta.add_(1.0)
    with pytest.raises(TransformError, match="in-place"):
        engine.vmap(fn)(VECTORS)


def test_in_place_write_into_a_captured_tensor_between_vjp_and_its_vjp_fn_is_refused() -> None:
    data = X.clone()

    def captured(theta: torch.Tensor) -> torch.Tensor:
        return torch.tanh(data @ theta).pow(2).mean()

    for _ in range(CALLS):
        _, fn = engine.vjp(engine.grad(captured), THETA)
        engine.vmap(fn)(VECTORS)
    _, fn = engine.vjp(engine.grad(captured), THETA)
    assert fn._vjp_record.real is None
    data.mul_(2.0)
    with pytest.raises(TransformError, match="changed"):
        engine.vmap(fn)(VECTORS)
    # Written between iterations, not inside one: every call gives the eager result.
    for i in range(CALLS):
        data.add_(0.5)
        got = engine.vmap(engine.vjp(engine.grad(captured), THETA)[1])(VECTORS)[0]
        _agrees(got, _eager(lambda: engine.vmap(engine.vjp(engine.grad(captured), THETA)[1])(VECTORS)[0]))


def test_random_forward_is_never_deferred() -> None:
    def noisy(theta: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(theta, 0.5) * theta.sin()

    for i in range(CALLS):
        torch.manual_seed(i)
        _, fn = engine.vjp(noisy, THETA)
        got = engine.vmap(fn)(VECTORS)[0]
        torch.manual_seed(i)
        ref = _eager(lambda: engine.vmap(engine.vjp(noisy, THETA)[1])(VECTORS)[0])
        assert fn._vjp_record.real is not None
        assert torch.equal(got, ref)


def test_vjp_inside_a_transform_is_the_eager_one() -> None:
    def inner(theta: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        _, fn = engine.vjp(engine.grad(loss), theta)
        assert not hasattr(fn, "_vjp_record")
        return fn(v)[0]

    got = engine.vmap(inner, in_dims=(None, 0))(THETA, VECTORS)
    assert torch.equal(got, _eager(hvps, THETA, VECTORS))


def test_primals_that_need_grad_keep_the_real_vjp_fn() -> None:
    theta = THETA.clone().requires_grad_()
    for _ in range(CALLS):
        out, fn = engine.vjp(loss, theta)
        engine.vmap(fn)(torch.ones(3))
    assert out.requires_grad and not hasattr(fn, "_vjp_record")
    (g,) = fn(torch.ones(()))
    assert g.requires_grad  # differentiable w.r.t. theta, as torch.func gives it


def test_shadow_verification_compares_deferred_results_with_the_real_vjp_fn() -> None:
    for _ in range(CALLS):
        hvps(THETA, VECTORS)
    checks = []
    real_compare = autovjp._compare
    with engine.auto_tracing(verify=True):
        for _ in range(3):
            _, fn = engine.vjp(engine.grad(loss), THETA)
            assert fn._vjp_record.real is not None  # kept beside the deferred one
            autovjp._compare = lambda record, out, ref, exact: checks.append(exact) or real_compare(record, out, ref, exact)
            try:
                engine.vmap(fn)(VECTORS)
            finally:
                autovjp._compare = real_compare
    assert checks == [False, False, False]  # compared, within the tolerance (see _agrees)


def test_vmap_options_and_a_stored_vmap_of_a_vjp_fn() -> None:
    vectors_last = VECTORS.t().contiguous()
    for _ in range(CALLS):
        _, fn = engine.vjp(engine.grad(loss), THETA)
        got = engine.vmap(fn, in_dims=1)(vectors_last)[0]
        # Another batch dim and layout than the eager reference's: the same sums, other kernels
        # (docs/design/replay-contract.md), so equal within float32's tolerance, not bit for bit.
        torch.testing.assert_close(got, _eager(hvps, THETA, VECTORS))
    _, fn = engine.vjp(engine.grad(loss), THETA)
    stored = engine.vmap(fn)
    torch.testing.assert_close(stored(VECTORS)[0], _eager(hvps, THETA, VECTORS))


def test_a_function_made_anew_at_each_call_pays_no_pullback_run() -> None:
    keys = []
    for _ in range(CALLS):
        _, fn = engine.vjp(lambda t: torch.tanh(X @ t), THETA)  # a new function each time
        keys.append(fn._vjp_record.key)
        engine.vmap(fn)(torch.ones(3, 16))
    autos = [a for k in keys for a in autovjp._pullbacks[k]]
    assert len(autos) == CALLS and all(a.eager_calls == 0 for a in autos)


def _deferred() -> Any:
    for _ in range(CALLS):
        hvps(THETA, VECTORS)
    _, fn = engine.vjp(engine.grad(loss), THETA)
    assert fn._vjp_record.real is None
    return fn


def test_a_deferred_vjp_fn_called_with_retain_graph_false_cannot_be_called_again() -> None:
    fn = _deferred()
    _, real = _eager(lambda t: engine.vjp(engine.grad(loss), t), THETA)
    _agrees(fn(VECTORS[0], retain_graph=False)[0], real(VECTORS[0], retain_graph=False)[0])
    with pytest.raises(RuntimeError, match="second time"):
        real(VECTORS[0])
    with pytest.raises(RuntimeError, match="second time"):
        fn(VECTORS[0])


def test_a_deferred_vjp_fn_under_autocast_or_inference_mode_is_refused() -> None:
    fn = _deferred()
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TransformError, match="autocast"):
        fn(VECTORS[0])
    with torch.inference_mode(), pytest.raises(TransformError, match="inference mode"):
        engine.vmap(fn)(VECTORS)
    _agrees(engine.vmap(fn)(VECTORS)[0], _eager(hvps, THETA, VECTORS))  # the modes left: it answers


def test_the_random_state_kept_around_a_warm_up_includes_cuda_generators_when_cuda_runs(monkeypatch) -> None:
    """The CUDA side of `_rng_state` (a CUDA path exercised on CPU): with CUDA running, every
    device's generator state is taken and put back, beside the CPU one."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: calls.append("get") or ["state0", "state1"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: calls.append(("set", tuple(states))))
    cpu = torch.get_rng_state()
    state = autovjp._rng_state()
    torch.rand(3)
    autovjp._set_rng_state(state)
    assert torch.equal(torch.get_rng_state(), cpu)
    assert calls == ["get", ("set", ("state0", "state1"))]


def test_a_pullback_that_cannot_replay_does_not_rerun_the_forward_beside_the_real_vjp_fn() -> None:
    """A vjp whose result is part of an outer autograd graph (a tensor it reads needs grad) keeps
    the real vjp_fn; its pullback's outputs need grad too, so it runs eagerly: after its tries it is
    not called again (each call would compute the forward a second time)."""
    weight = torch.randn(5, requires_grad=True)

    def weighted(theta: torch.Tensor) -> torch.Tensor:
        return torch.sin(theta * weight)

    autos = set()
    for _ in range(3 * CALLS):
        _, fn = engine.vjp(weighted, THETA)
        assert fn._vjp_record.real is not None
        engine.vmap(fn)(VECTORS)
        autos |= set(autovjp._pullbacks[fn._vjp_record.key])
    (auto,) = autos
    runs = auto.eager_calls
    for _ in range(CALLS):
        _, fn = engine.vjp(weighted, THETA)
        got = engine.vmap(fn)(VECTORS)[0]
    assert auto.eager_calls == runs
    ref = _eager(lambda: engine.vmap(engine.vjp(weighted, THETA)[1])(VECTORS)[0])
    assert torch.equal(got, ref) and got.requires_grad


def test_the_loop_replays_by_the_call_after_a_workloads_warm_up() -> None:
    """The suite measures a method after its first call and AUTO_TRACE_WARMUP more (workloads.base
    Workload.prepare); the gate counts instructions from there on: a vmap of vjp_fns must be at
    its steady state (deferred, the pullback replaying) by then, or a count would catch a
    recording. The pullback and the forward take their first calls together."""
    from workloads.base import AUTO_TRACE_WARMUP

    def fresh(theta: torch.Tensor) -> torch.Tensor:
        return torch.tanh(X @ theta).pow(3).mean()

    for _ in range(1 + AUTO_TRACE_WARMUP):
        engine.vmap(engine.vjp(engine.grad(fresh), THETA)[1])(VECTORS)
    _, fn = engine.vjp(engine.grad(fresh), THETA)
    assert fn._vjp_record.real is None
    auto = _pullback(fn)
    hits = auto.traced._hits
    engine.vmap(fn)(VECTORS)
    assert auto.traced._hits == hits + 1
