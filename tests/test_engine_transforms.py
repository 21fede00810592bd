"""Vectorized autograd: the engine's transforms against torch.func, explicit loops and closed forms."""
from __future__ import annotations

import pytest
import torch
import torch.func as tf
import torch.nn.functional as F
from torch.func import functional_call

import engine
from engine import TransformError


def close(a, b, atol=1e-4):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], atol) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(close(x, y, atol) for x, y in zip(a, b))
    return type(a) is torch.Tensor and a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=1e-4)


@pytest.fixture(autouse=True)
def _strict():
    with engine.fallback_policy("error"):
        yield


X = torch.randn(40, 5, generator=torch.Generator().manual_seed(0))


def square(x):  # R^5 -> R^5
    return torch.tanh(x) * x.sum()


def wide(x):  # R^5 -> R^2
    return torch.stack([x.sin().sum(), (x * x).sum()])


def tall(x):  # R^2 -> R^6
    return torch.cat([x.exp(), x.sin(), x * x[0]])


@pytest.mark.parametrize("f,n", [(square, 5), (wide, 5), (tall, 2)])
def test_jacobians_against_torch_func_and_loop(f, n):
    x = torch.randn(n)
    ref = tf.jacrev(f)(x)
    assert close(engine.jacrev(f)(x), ref)
    assert close(engine.jacfwd(f)(x), ref)
    assert close(engine.functional.jacobian(f, x, vectorize=True), ref)
    assert close(engine.functional.jacobian(f, x, vectorize=False), ref)
    assert close(engine.functional.jacobian(f, x, vectorize=True, strategy="forward-mode"), ref)
    # the seed example: Jacobian by vmap over vjp with basis vectors
    out, vjp_fn = engine.vjp(f, x)
    rows = engine.vmap(vjp_fn)(torch.eye(out.numel()))[0]
    assert close(rows, ref)


def test_jacrev_argnums_has_aux_pytrees_and_chunks():
    a, b = torch.randn(3), torch.randn(4)

    def f(a, b):
        return {"o": torch.outer(a, b).sin(), "s": (a.sum() * b)}, a.detach() * 0 + 1

    jac, aux = engine.jacrev(f, argnums=(0, 1), has_aux=True)(a, b)
    ref, ref_aux = tf.jacrev(f, argnums=(0, 1), has_aux=True)(a, b)
    assert close(jac["o"], ref["o"]) and close(jac["s"], ref["s"]) and close(aux, ref_aux)
    for chunk in (1, 2, 5):
        assert close(engine.jacrev(lambda x: square(x), chunk_size=chunk)(a.repeat(2)[:5]), tf.jacrev(square)(a.repeat(2)[:5]))


def logistic_problem(n=200, d=8):
    g = torch.Generator().manual_seed(1)
    Xd = torch.randn(n, d, generator=g)
    y = (torch.rand(n, generator=g) < 0.5).float()

    def log_posterior(w):
        z = Xd @ w
        return (y * z - F.softplus(z)).sum() - 0.5 * (w * w).sum()

    return Xd, y, log_posterior


def test_logistic_posterior_hessian_matches_closed_form():
    Xd, y, logp = logistic_problem()
    w = torch.randn(Xd.shape[1]) * 0.1
    p = torch.sigmoid(Xd @ w)
    closed = -(Xd.T * (p * (1 - p))) @ Xd - torch.eye(Xd.shape[1])
    assert close(engine.hessian(logp)(w), closed, atol=1e-3)
    assert close(engine.functional.hessian(logp, w, vectorize=True), closed, atol=1e-3)
    assert close(engine.functional.hessian(logp, w, vectorize=False), closed, atol=1e-3)
    assert close(engine.functional.hessian(logp, w, vectorize=True, outer_jacobian_strategy="forward-mode"), closed, atol=1e-3)
    assert close(engine.jacfwd(engine.jacrev(logp))(w), closed, atol=1e-3)


def test_functional_structure_matches_torch():
    def f(a, b):
        return a * b.sum(), a.exp()

    a, b = torch.randn(3), torch.randn(2)
    ours = engine.functional.jacobian(f, (a, b), vectorize=True)
    ref = torch.autograd.functional.jacobian(f, (a, b), vectorize=True)
    assert close(ours, ref)
    h = engine.functional.hessian(lambda a, b: (a.sin() * b.sum()).sum(), (a, b), vectorize=True)
    href = torch.autograd.functional.hessian(lambda a, b: (a.sin() * b.sum()).sum(), (a, b), vectorize=True)
    assert close(h, href)
    with pytest.raises(RuntimeError, match="independent"):
        engine.functional.jacobian(lambda a, b: a * 2, (a, b), strict=True, vectorize=True)


def mlp_setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, t = torch.randn(6, 12), torch.randn(6, 4)

    def loss(p, xi, ti):
        return ((functional_call(model, p, (xi,)) - ti) ** 2).mean()

    return model, params, x, t, loss


def test_per_sample_grads_mlp_vs_loop_and_torch_func():
    model, params, x, t, loss = mlp_setup()
    ours = engine.vmap(engine.grad(loss), in_dims=(None, 0, 0))(params, x, t)
    ref = tf.vmap(tf.grad(loss), in_dims=(None, 0, 0))(params, x, t)
    assert close(ours, ref)
    for i in range(x.shape[0]):
        p = {k: v.clone().requires_grad_() for k, v in params.items()}
        gs = torch.autograd.grad(loss(p, x[i], t[i]), list(p.values()))
        assert all(torch.allclose(ours[k][i], g, atol=1e-5) for k, g in zip(p, gs))


def test_per_sample_grads_through_autograd_grad_inside_vmap():
    w = torch.randn(5, 3).requires_grad_()  # made outside: requires_grad_() inside vmap is refused, as in torch.func

    def grad_sample(xi):
        return torch.autograd.grad(torch.tanh(xi @ w).sum(), w)[0]

    x = torch.randn(7, 5)
    ours = engine.vmap(grad_sample)(x)
    ref = torch.stack([grad_sample(x[i]) for i in range(7)])
    assert close(ours, ref)


def test_per_sample_grads_cnn():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 3 * 3, 5))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    ours = engine.vmap(engine.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    ref = tf.vmap(tf.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    assert close(ours, ref)


def test_compositions():
    x = torch.randn(4, 3)
    f = lambda v: (v.sin() * v).sum()  # noqa: E731
    # vmap of grad, grad of vmap, vmap of vmap of grad
    assert close(engine.vmap(engine.grad(f))(x), tf.vmap(tf.grad(f))(x))
    assert close(engine.grad(lambda m: engine.vmap(f)(m).sum())(x), tf.grad(lambda m: tf.vmap(f)(m).sum())(x))
    xx = torch.randn(2, 4, 3)
    assert close(engine.vmap(engine.vmap(engine.grad(f)))(xx), tf.vmap(tf.vmap(tf.grad(f)))(xx))
    # jacrev of jacrev (scalar inner), vmap of jacrev, hessian of a function that calls vmap inside
    assert close(engine.jacrev(engine.jacrev(f))(x[0]), tf.jacrev(tf.jacrev(f))(x[0]))
    xs = torch.randn(3, 5)
    assert close(engine.vmap(engine.jacrev(square))(xs), tf.vmap(tf.jacrev(square))(xs))
    g = lambda v: engine.vmap(lambda r: (r * v).sin().sum())(X[:6]).sum()  # noqa: E731
    gref = lambda v: tf.vmap(lambda r: (r * v).sin().sum())(X[:6]).sum()  # noqa: E731
    assert close(engine.hessian(g)(x[0, :5].repeat(2)[:5]), tf.hessian(gref)(x[0, :5].repeat(2)[:5]))
    # autograd outside the engine over its outputs
    w = torch.randn(5, requires_grad=True)
    (gw,) = torch.autograd.grad(engine.grad(lambda v: (v * w).sin().sum())(torch.randn(5)).sum(), (w,))
    assert gw.shape == (5,) and type(gw) is torch.Tensor


def test_jvp_linearize_against_torch_func():
    x, v = torch.randn(5), torch.randn(5)
    out, jv = engine.jvp(square, (x,), (v,))
    rout, rjv = tf.jvp(square, (x,), (v,))
    assert close(out, rout) and close(jv, rjv)
    out, fn = engine.linearize(square, x)
    for _ in range(3):
        t = torch.randn(5)
        assert close(fn(t), tf.jvp(square, (x,), (t,))[1])
    # vmap over jvp_fn: batched tangents
    ts = torch.randn(4, 5)
    assert close(engine.vmap(fn)(ts), torch.stack([tf.jvp(square, (x,), (t,))[1] for t in ts]))


def test_zero_fallbacks_on_workload_ops():
    """Forward, backward and double backward of everything the workloads need, fallback disabled."""
    torch.manual_seed(0)
    q, k = torch.randn(4, 6, 8), torch.randn(4, 6, 8)
    img = torch.randn(3, 2, 8, 8)
    w_conv = torch.randn(3, 2, 3, 3)
    labels = torch.randint(0, 8, (6,))

    def terms(x):
        h = F.linear(x, torch.ones(8, 8) * 0.1)
        acts = torch.relu(h).sum() + torch.tanh(h).sum() + F.gelu(h).sum() + F.softplus(h).sum()
        ls = F.log_softmax(h, -1).sum() + F.cross_entropy(h, labels)
        bce = F.binary_cross_entropy_with_logits(h, torch.sigmoid(h.detach()))
        ln = F.layer_norm(h, (8,)).pow(2).sum()
        att = (torch.softmax(h @ h.transpose(-1, -2), -1) @ h).sum()
        st = (torch.lgamma(h.abs() + 1) + torch.log1p(h.square() / 3)).sum()
        return acts + ls + bce + ln + att + st + (h @ h.transpose(-1, -2)).mean()

    def conv_terms(im):
        o = F.conv2d(im.unsqueeze(0), w_conv, padding=1)
        return F.max_pool2d(o, 2).pow(2).sum()

    # vmap(grad) is per-sample backward; hessian is double backward; both with the fallback off
    engine.vmap(engine.grad(terms))(q)
    engine.vmap(engine.grad(conv_terms))(img)
    engine.hessian(lambda v: terms(v.reshape(6, 8)))(q[0].reshape(-1)[:48].clone())
    engine.vmap(engine.hessian(lambda v: conv_terms(v.reshape(2, 8, 8)).sum()), chunk_size=2)(img.reshape(3, -1)[:2])


# ---- errors -----------------------------------------------------------------------------------------

def test_errors():
    x = torch.randn(3)
    with pytest.raises(TransformError, match="Expected f\\(\\*args\\) to return a scalar Tensor"):
        engine.grad(torch.sin)(x)
    with pytest.raises(TransformError, match="argnums=2, but only 1 positional inputs"):
        engine.grad(lambda a: a.sum(), argnums=2)(x)
    with pytest.raises(TransformError, match="argnums"):
        engine.jacrev(torch.sin, argnums=(0, 0))(x)
    with pytest.raises(TransformError, match="has_aux=True.*tuple"):
        engine.grad(lambda a: a.sum(), has_aux=True)(x)
    with pytest.raises(TransformError, match="has_aux=True"):
        engine.grad(lambda a: (a.sum(), 1, 2), has_aux=True)(x)
    with pytest.raises(TransformError, match="Expected primals to be a tuple"):
        engine.jvp(torch.sin, x, x)


@pytest.mark.parametrize("outer,inner", [
    ("jacrev", "jacrev"), ("jacfwd", "jacrev"), ("jacrev", "jacfwd"), ("jacfwd", "jacfwd"),
])
def test_second_derivatives_of_vector_functions(outer, inner):
    """Differentiating the backward graph of a finished vector-valued vmap: gradients leaving the
    inner vmap's level are summed on the edge where they leave it (engine._gradsum)."""
    torch.manual_seed(0)
    W = torch.randn(3, 4)
    f = lambda v: torch.tanh(W @ v) * v.sum()  # noqa: E731
    x = torch.randn(4)
    ours = getattr(engine, outer)(getattr(engine, inner)(f))(x)
    ref = getattr(tf, outer)(getattr(tf, inner)(f))(x)
    assert type(ours) is torch.Tensor and close(ours, ref)
    assert close(engine.jacrev(engine.jacrev(square))(x), tf.jacrev(tf.jacrev(square))(x))


def test_third_derivatives_and_vmap_over_them():
    torch.manual_seed(0)
    f = lambda v: v.sin() * v.sum()  # noqa: E731
    x, xs = torch.randn(3), torch.randn(2, 3)
    assert close(engine.jacrev(engine.jacrev(engine.jacrev(f)))(x), tf.jacrev(tf.jacrev(tf.jacrev(f)))(x))
    assert close(engine.vmap(engine.jacrev(engine.jacrev(f)))(xs), tf.vmap(tf.jacrev(tf.jacrev(f)))(xs))
    assert close(engine.jacrev(engine.hessian(lambda v: (v.sin() * v).sum()))(x),
                 tf.jacrev(tf.hessian(lambda v: (v.sin() * v).sum()))(x))


def test_closed_over_weight_gets_summed_gradient_outside_vmap():
    """Plain autograd after vmap returned: a weight shared by every batch element gets the sum of the
    per-example gradients, also when it reaches the weight along a batched and an unbatched path."""
    torch.manual_seed(0)
    w = torch.randn(4, requires_grad=True)
    X = torch.randn(5, 4)
    f = lambda r: (r * w).sin().sum() + (w * w).sum()  # noqa: E731
    (ours,) = torch.autograd.grad(engine.vmap(f)(X).sum() + w.sum(), w)
    (ref,) = torch.autograd.grad(torch.vmap(f)(X).sum() + w.sum(), w)
    assert type(ours) is torch.Tensor and close(ours, ref)
    # second order through the same path
    (g1,) = torch.autograd.grad(engine.vmap(f)(X).sum(), w, create_graph=True)
    (h_ours,) = torch.autograd.grad(g1.pow(2).sum(), w)
    (g2,) = torch.autograd.grad(torch.vmap(f)(X).sum(), w, create_graph=True)
    (h_ref,) = torch.autograd.grad(g2.pow(2).sum(), w)
    assert close(h_ours, h_ref)


def test_gradient_of_per_sample_gradient_norms_wrt_shared_params():
    """Per-sample gradients of parameters that require grad, then autograd over their norms (a
    gradient penalty): the second backward runs after the vmap returned, through nodes that mix the
    per-example batch with the shared parameters."""
    torch.manual_seed(0)
    W, b = torch.randn(3, 5, requires_grad=True), torch.randn(3, requires_grad=True)
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))

    def loss(p, xi, yi):
        return F.cross_entropy(torch.tanh(xi @ p[0].T + p[1]).unsqueeze(0), yi.unsqueeze(0))

    def penalty(m):
        g = m.vmap(m.grad(loss), in_dims=(None, 0, 0))((W, b), x, y)
        return sum(t.pow(2).sum() for t in g)

    ours = torch.autograd.grad(penalty(engine), (W, b))
    ref = torch.autograd.grad(penalty(tf), (W, b))
    assert all(type(t) is torch.Tensor for t in ours) and close(ours, ref)


@pytest.mark.parametrize("body", ["last_op_mixed", "sin_sum_exp"])
def test_raw_autograd_over_vmap_outputs_first_and_second_order(body):
    """torch.autograd.grad (not an engine transform) over a vmap's outputs, with inputs and a
    closed-over weight requiring grad; also when the level's only mixed op is its last one."""
    def run(vm):
        torch.manual_seed(0)
        X, w, V = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True), torch.randn(4, 3)
        f = (lambda r: r * 0 + w.exp()) if body == "last_op_mixed" else (lambda r: (r * w).sin() * r.sum() + w.exp())
        gX, gw = torch.autograd.grad(vm(f)(X), (X, w), V, create_graph=True)
        return (gX, gw, *torch.autograd.grad((gX ** 2).sum() + (gw ** 2).sum(), (X, w), allow_unused=True, materialize_grads=True))

    ours, ref = run(engine.vmap), run(tf.vmap)
    assert all(type(t) is torch.Tensor for t in ours) and close(ours, ref)


@pytest.mark.parametrize("case", ["closure_in_both_levels", "inner_closes_over_outer_value", "outer_unmapped_arg"])
def test_raw_autograd_over_nested_vmaps_first_and_second_order(case):
    def run(vm):
        torch.manual_seed(0)
        X, w, Y = torch.randn(2, 3, 4, requires_grad=True), torch.randn(4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
        if case == "closure_in_both_levels":
            y = vm(lambda xr: vm(lambda x: (x * w).tanh() + w)(xr))(X)
        elif case == "inner_closes_over_outer_value":
            y = vm(lambda xr: vm(lambda x, yy: x * xr.sum() + yy * w)(xr, Y))(X)
        else:
            y = vm(lambda xr, yy: vm(lambda x: x.sin() * yy.sum(0))(xr), in_dims=(0, None))(X, Y)
        gs = torch.autograd.grad(y, (X, w, Y), torch.ones_like(y) * 0.5, create_graph=True, allow_unused=True,
                                 materialize_grads=True)
        hs = torch.autograd.grad(sum((g ** 2).sum() for g in gs), (X, w, Y), allow_unused=True, materialize_grads=True)
        return gs + hs

    ours, ref = run(engine.vmap), run(tf.vmap)
    assert all(type(t) is torch.Tensor for t in ours)
    assert all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(ours, ref))


def test_nodes_made_by_a_backward_pass_after_vmap_are_hooked_when_it_returns():
    """A create_graph backward through a finished vmap makes nodes that mix the dead level with a
    plain weight; they are hooked by the time torch.autograd.grad returns (not at some later op),
    so differentiating them again never depends on what runs next."""
    from engine import _gradsum

    torch.manual_seed(0)
    X, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    V = torch.randn(4, 3)
    (gX,) = torch.autograd.grad(engine.vmap(lambda r: r * w)(X), (X,), V, create_graph=True)
    assert not _gradsum._last and not _gradsum._urgent
    (h,) = torch.autograd.grad(gX.sum(), w)
    (gX_ref,) = torch.autograd.grad(tf.vmap(lambda r: r * w)(X), (X,), V, create_graph=True)
    (h_ref,) = torch.autograd.grad(gX_ref.sum(), w)
    assert type(h) is torch.Tensor and close(h, h_ref)


@pytest.mark.parametrize("outer", ["grad", "jacrev"])
def test_grad_of_vmap_over_a_closure_on_the_grad_input(outer):
    """The grad's own input, made just before the vmap starts with no autograd node in between,
    is an outer tensor of the level (its per-example gradients are summed), as in torch.func
    (MAML's inner loop has this shape)."""
    W, X = torch.randn(3), torch.randn(4, 3)

    def f(mod):
        return lambda w: mod.vmap(lambda x: (w * x).sum())(X).sum()

    got = getattr(engine, outer)(f(engine))(W)
    want = getattr(torch.func, outer)(f(torch.func))(W)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, X.sum(0))


def test_transforms_under_inference_mode_return_normal_tensors_as_torch_func():
    """grad/vjp called inside torch.inference_mode(): the output was detached in inference mode, which
    a batched output (made by a vmap inside) cannot be ('Cannot set version_counter for inference
    tensor'). torch.func answers with normal (non-inference) tensors."""
    loss = lambda w: (w.sin() * w).sum()  # noqa: E731
    x = torch.randn(3, 4)
    with torch.inference_mode():
        got = engine.vmap(engine.grad(loss))(x)
        want = torch.func.vmap(torch.func.grad(loss))(x)
        g, v = engine.vmap(engine.grad_and_value(loss))(x)
        out, _ = engine.vjp(engine.vmap(torch.sin), x)
    torch.testing.assert_close(got, want)
    assert got.is_inference() == want.is_inference() == False  # noqa: E712
    assert not v.is_inference() and not out.is_inference()
    torch.testing.assert_close(v, (x.sin() * x).sum(1))


def _no_grad_patterns(vjp):
    h = lambda x: x ** 2  # noqa: E731
    x = torch.tensor(3.14, requires_grad=True)
    out, fn = vjp(h, x)
    with torch.no_grad():
        y, = fn(torch.tensor(1.0))
    first = (y.requires_grad, out.requires_grad, torch.autograd.grad(out, x)[0])
    with torch.no_grad():
        out, fn = vjp(h, x)
    y, = fn(torch.tensor(1.0))
    second = (out.requires_grad, y.requires_grad, torch.autograd.grad(y, x)[0] if y.requires_grad else None)
    return first, second


def test_vjp_fn_follows_the_grad_mode_of_its_own_call_as_torch_func():
    """vjp_fn under no_grad gives constant gradients (it kept a graph); vjp under no_grad with vjp_fn
    called outside it gives gradients that depend on the primals (they were cut off)."""
    got, want = _no_grad_patterns(engine.vjp), _no_grad_patterns(torch.func.vjp)
    assert got[0][:2] == want[0][:2] == (False, True)
    assert got[1][:2] == want[1][:2] == (False, True)
    torch.testing.assert_close(got[0][2], want[0][2])
    torch.testing.assert_close(got[1][2], want[1][2])


def test_default_path_records_a_backward_that_makes_zero_tensors():
    """l1_loss's double backward makes ZeroTensors (`_efficientzerotensor`), which have no storage
    to read: the recording must not ask for their data pointer."""
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(6, 6, generator=g), torch.randn(6, generator=g)

    def f(v):
        return F.l1_loss(torch.tanh(v @ w.T), v * 0.5, reduction="none").sum()

    hess = engine.hessian(f)
    ref = tf.hessian(f)(x)
    for _ in range(4):  # seen, verified, recorded, replayed
        assert close(hess(x), ref)


def test_default_path_with_a_torch_func_wrapper_left_in_reach():
    """A torch.func wrapper can outlive its transform in state the function reads (an nn.RNN's
    `_flat_weights` after torch.func's functional_call): the default path must not ask it for a
    storage of its own, which it has not."""
    leaked = []

    def keep(v):
        leaked.append(v)
        return v.sum()

    tf.grad(keep)(torch.randn(3))
    state = {"last": leaked[0]}
    w = torch.randn(3, generator=torch.Generator().manual_seed(6))

    def loss(x):
        assert state["last"] is not None
        return (w * x).sin().sum()

    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(7))
    f = engine.vmap(engine.grad(loss))
    ref = tf.vmap(tf.grad(loss))(x)
    for _ in range(4):  # seen, verified, recorded, replayed
        assert close(f(x), ref)
