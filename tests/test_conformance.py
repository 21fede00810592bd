"""Conformance with torch.func (issue #19): each case runs once with `torch.func` and once with
`engine` swapped in, from the same seed, and both must give equal results, or both raise and the
engine's exception is an instance of torch.func's (so `except RuntimeError` written against
torch.func still catches it). Cases are grouped as in the issue: silent wrong results first, then
crashes, missing checks, pytrees, argnums, the jvp API, in-place patterns and randomness.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.func as tf
from torch.utils._pytree import tree_flatten

import engine

Case = Callable[[Any], Any]
CASES: dict[str, Case] = {}


def case(fn: Case) -> Case:
    CASES[fn.__name__] = fn
    return fn


def _run(module: Any, fn: Case) -> tuple[str, Any]:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "ok", fn(module)
        except Exception as e:  # noqa: BLE001 - the comparison below is the assertion
            return "raise", e


def _same(a: Any, b: Any) -> bool:
    fa, sa = tree_flatten(a)
    fb, sb = tree_flatten(b)
    if sa != sb:
        return False
    for x, y in zip(fa, fb):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype
                    and torch.allclose(x, y, atol=1e-5, rtol=1e-5, equal_nan=True)):
                return False
        elif x != y:
            return False
    return True


# ---- silently wrong results ---------------------------------------------------------------------

@case
def no_grad_around_inner_grad(m):
    def h(x):
        with torch.no_grad():
            shift = m.grad(lambda x: 0.25 * x ** 4)(x)
        return x ** 3 - shift
    return m.grad(h)(torch.tensor(1.5, requires_grad=True))  # 6.75: the shift is a constant


@case
def grad_and_value_under_no_grad(m):
    x = torch.tensor(1.5, requires_grad=True)
    with torch.no_grad():
        g, v = m.grad_and_value(lambda x: x ** 3)(x)
    return g, v, g.requires_grad, v.requires_grad


@case
def vjp_under_no_grad(m):
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        out, fn = m.vjp(torch.sin, x)
        g = fn(torch.ones(3))
    return out, g[0], out.requires_grad, g[0].requires_grad


@case
def no_grad_inside_function(m):
    def f(x):
        with torch.no_grad():
            c = x ** 2
        return (c * x).sum()
    return m.grad(f)(torch.tensor([1.5, 2.0]))


@case
def grad_inside_inference_mode(m):
    x = torch.tensor([1.5, 2.0])
    with torch.inference_mode():
        return m.grad(lambda x: (x ** 3).sum())(x)


@case
def as_strided_with_storage_offset(m):
    return m.vmap(lambda t: t.as_strided((3, 2), (1, 3), 0))(torch.arange(12.).reshape(2, 2, 3))


@case
def as_strided_offset_per_sample(m):
    return m.vmap(lambda t: t.as_strided((2, 2), (1, 3), 1))(torch.arange(12.).reshape(2, 2, 3))


@case
def as_strided_past_the_sample(m):
    return m.vmap(lambda t: t.as_strided((7,), (1,), 0))(torch.arange(12.).reshape(2, 2, 3))


@case
def bmm_with_wrong_ranks(m):
    return m.vmap(torch.bmm, in_dims=(0, None))(torch.randn(7, 3, 3, 2), torch.randn(2, 2))


@case
def mm_with_wrong_ranks(m):
    return m.vmap(torch.mm, in_dims=(0, None))(torch.randn(7, 3, 3, 2), torch.randn(2, 2))


@case
def mv_with_wrong_ranks(m):
    return m.vmap(torch.mv)(torch.randn(3, 2, 2), torch.randn(3, 2, 2))


@case
def dot_with_wrong_ranks(m):
    return m.vmap(torch.dot)(torch.randn(3, 2, 2), torch.randn(3, 2))


@case
def normal_with_batched_mean_differs_per_sample(m):
    return m.vmap(lambda x: torch.normal(x, 1.0), randomness="different")(torch.zeros(4, 3))


@case
def flip_over_no_dims(m):
    return m.vmap(lambda x: x.flip([]))(torch.randn(3, 4))


@case
def fft_hfftn(m):
    return m.vmap(lambda x: torch.fft.hfftn(x, s=(4, 6)))(torch.randn(3, 4, 5, dtype=torch.complex64))


@case
def fft_hfft2_dims(m):
    return m.vmap(lambda x: torch.fft.hfft2(x, dim=(0, 1)))(torch.randn(3, 4, 5, dtype=torch.complex64))


@case
def max_pool2d_unbatched_input(m):
    return m.vmap(lambda x: torch.nn.functional.max_pool2d(x, 2, ceil_mode=True))(torch.randn(3, 2, 5, 5))


# ---- crashes on plain input ---------------------------------------------------------------------

@case
def jacrev_of_0dim(m):
    return m.jacrev(torch.sin)(torch.tensor(0.7))


@case
def jacfwd_of_0dim(m):
    return m.jacfwd(torch.sin)(torch.tensor(0.7))


@case
def hessian_of_0dim(m):
    return m.hessian(torch.sin)(torch.tensor(0.7))


# ---- missing checks -----------------------------------------------------------------------------

class _OldStyle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        return g


class _NoVmapRule(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        return g * ctx.saved_tensors[0].cos()


@case
def autograd_function_without_setup_context_under_vmap(m):
    return m.vmap(_OldStyle.apply)(torch.randn(3))


@case
def autograd_function_without_setup_context_under_grad(m):
    return m.grad(lambda x: _OldStyle.apply(x).sum())(torch.randn(3))


@case
def autograd_function_without_vmap_rule_under_vmap(m):
    return m.vmap(lambda x: _NoVmapRule.apply(x))(torch.randn(3))


@case
def autograd_function_with_setup_context_under_grad(m):
    return m.grad(lambda x: _NoVmapRule.apply(x).sum())(torch.randn(3))


@case
def requires_grad_inside_grad(m):
    return m.grad(lambda x: (x.detach().requires_grad_() * x).sum())(torch.randn(3))


@case
def retain_grad_inside_grad(m):
    return m.grad(lambda x: (x.retain_grad() or x).sum())(torch.randn(3))


@case
def autograd_functional_inside_grad(m):
    return m.grad(lambda x: torch.autograd.functional.jacobian(lambda y: y ** 2, x).sum())(torch.randn(3))


@case
def non_tensor_aux_in_grad(m):
    return m.grad(lambda x: (x.sum(), 1.0), has_aux=True)(torch.randn(3))


@case
def non_tensor_aux_in_vjp(m):
    return m.vjp(lambda x: (x, "label"), torch.randn(3), has_aux=True)[2]


@case
def has_aux_output_as_list(m):
    return m.grad(lambda x: [x.sum(), x], has_aux=True)(torch.randn(3))


@case
def copy_into_captured_tensor_under_grad(m):
    captured = torch.zeros(3)

    def f(x):
        captured.copy_(x)
        return (captured * x).sum()
    return m.grad(f)(torch.ones(3))


@case
def add_into_captured_tensor_under_jvp(m):
    captured = torch.zeros(3)

    def f(x):
        captured.add_(x)
        return x.sum()
    return m.jvp(f, (torch.ones(3),), (torch.ones(3),))


@case
def inplace_on_own_input_under_jacrev(m):
    return m.jacrev(lambda x: x.mul_(2).sin())(torch.randn(3))


@case
def inplace_on_fresh_buffer_under_grad(m):
    def f(x):
        buf = torch.zeros(3)
        buf.copy_(x)
        return (buf * x).sum()
    return m.grad(f)(torch.randn(3))


# ---- pytrees and out_dims -----------------------------------------------------------------------

@case
def vmap_dict_and_nested_outputs(m):
    return m.vmap(lambda x: {"a": x, "b": [x * 2, (x,)]})(torch.randn(2, 3))


@case
def jacrev_pytree_output(m):
    return m.jacrev(lambda x: {"a": x.sin(), "b": (x.cos().sum(),)})(torch.randn(3))


@case
def jacrev_empty_output(m):
    return m.jacrev(lambda x: x[:0])(torch.randn(3))


@case
def out_dims_negative(m):
    return m.vmap(lambda x: x, out_dims=-1)(torch.randn(2, 3))


@case
def out_dims_none_for_python_value(m):
    return m.vmap(lambda x: (x, 1), out_dims=(0, None))(torch.randn(2, 3))


@case
def out_dims_int_for_python_value(m):
    return m.vmap(lambda x: (x, 1))(torch.randn(2, 3))


# ---- argnums ------------------------------------------------------------------------------------

@case
def argnums_negative(m):
    return m.grad(lambda x, y: (x * y).sum(), argnums=-1)(torch.randn(3), torch.randn(3))


@case
def argnums_tuple_with_negative(m):
    return m.grad(lambda x, y: (x * y).sum(), argnums=(0, -1))(torch.randn(3), torch.randn(3))


@case
def argnums_list_refused(m):
    return m.grad(lambda x, y: (x * y).sum(), argnums=[0, 1])(torch.randn(3), torch.randn(3))


@case
def argnums_duplicates_refused(m):
    return m.grad(lambda x, y: (x * y).sum(), argnums=(0, 0))(torch.randn(3), torch.randn(3))


@case
def jacrev_argnums_negative(m):
    return m.jacrev(lambda x, y: x * y, argnums=-1)(torch.randn(3), torch.randn(3))


# ---- jvp API ------------------------------------------------------------------------------------

@case
def jvp_single_tensors_refused(m):
    return m.jvp(torch.sin, torch.randn(3), torch.randn(3))


@case
def jvp_strict_dependent(m):
    return m.jvp(torch.sin, (torch.randn(3),), (torch.randn(3),), strict=True)


@case
def jvp_strict_independent(m):
    return m.jvp(lambda x: torch.ones(3), (torch.randn(3),), (torch.randn(3),), strict=True)


@case
def jvp_tangent_of_wrong_shape(m):
    return m.jvp(torch.sin, (torch.randn(3),), (torch.randn(4),))


@case
def jvp_non_tensor_output(m):
    return m.jvp(lambda x: 1.0, (torch.randn(3),), (torch.randn(3),))


@case
def jvp_with_aux(m):
    return m.jvp(lambda x: (x.sin(), x.cos()), (torch.randn(3),), (torch.randn(3),), has_aux=True)


@case
def jvp_through_inplace_on_view(m):
    def f(x):
        y = x.clone()
        y[0].mul_(2)
        return y
    return m.jvp(f, (torch.randn(3),), (torch.ones(3),))


# ---- in-place patterns torch.func accepts -------------------------------------------------------

@case
def copy_into_new_empty(m):
    def f(x):
        out = x.new_empty(x.shape)
        out.copy_(x)
        return out
    return m.vmap(f)(torch.randn(2, 3))


@case
def copy_into_view_of_new_zeros(m):
    def f(x):
        out = x.new_zeros(2, 3)
        out[1].copy_(x)
        return out
    return m.vmap(f)(torch.randn(4, 3))


@case
def new_zeros_of_batched_then_add_(m):
    return m.vmap(lambda x, v: x.new_zeros(4).add_(v))(torch.randn(3, 4), torch.randn(3, 4))


@case
def new_zeros_of_unbatched_then_add_refused(m):
    y = torch.randn(4)
    return m.vmap(lambda v: y.new_zeros(4).add_(v))(torch.randn(3, 4))


# ---- randomness ---------------------------------------------------------------------------------

def _rand_case(name: str, fn: Callable[[Any], Any]) -> None:
    CASES[name] = fn


_Z = torch.zeros(4, 3)
for _r in ("different", "same"):
    _rand_case(f"randn_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.randn(3) + x, randomness=r)(_Z))
    _rand_case(f"randint_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.randint(0, 10, (3,)) + x, randomness=r)(_Z))
    _rand_case(f"randperm_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.randperm(3) + x, randomness=r)(_Z))
    _rand_case(f"rand_like_unbatched_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.rand_like(torch.zeros(3)) + x, randomness=r)(_Z))
    _rand_case(f"randn_like_batched_{_r}", lambda m, r=_r: m.vmap(torch.randn_like, randomness=r)(_Z))
    _rand_case(f"bernoulli_batched_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.bernoulli(x + 0.5), randomness=r)(_Z))
    _rand_case(f"bernoulli__batched_{_r}", lambda m, r=_r: m.vmap(lambda x: x.clone().bernoulli_(0.3), randomness=r)(_Z))
    _rand_case(f"normal__unbatched_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.zeros(3).normal_() + x, randomness=r)(_Z))
    _rand_case(f"poisson_batched_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.poisson(x + 1), randomness=r)(_Z))
    _rand_case(f"multinomial_batched_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.multinomial(x + 1, 2), randomness=r)(_Z))
    _rand_case(f"dropout_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.nn.functional.dropout(x + 1, 0.5), randomness=r)(_Z))
    _rand_case(f"nested_randn_{_r}", lambda m, r=_r: m.vmap(m.vmap(lambda x: torch.randn(2) + x, randomness=r),
                                                            randomness=r)(torch.zeros(3, 4, 2)))
_rand_case("nested_different_over_same", lambda m: m.vmap(m.vmap(lambda x: torch.randn(2) + x, randomness="same"),
                                                           randomness="different")(torch.zeros(3, 4, 2)))
_rand_case("randomness_error_mode", lambda m: m.vmap(lambda x: torch.randn(3) + x)(_Z))


# ---- the test over every case above ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_engine_conforms_to_torch_func(name: str) -> None:
    ref_kind, ref = _run(tf, CASES[name])
    got_kind, got = _run(engine, CASES[name])
    if ref_kind == "raise":
        assert got_kind == "raise", f"torch.func raises {type(ref).__name__}: {ref}; the engine returned {got!r}"
        assert isinstance(got, type(ref)), f"torch.func raises {type(ref).__name__}, the engine {type(got).__name__}: {got}"
    else:
        assert got_kind == "ok", f"torch.func returns {ref!r}; the engine raised {type(got).__name__}: {got}"
        assert _same(ref, got), f"torch.func: {ref!r}\nengine: {got!r}"



# ---- what the engine deliberately does beyond torch.func -----------------------------------------

def test_requires_grad_inside_vmap_alone_gives_per_example_gradients() -> None:
    """torch.func refuses requires_grad_() under vmap; the engine allows it when no grad transform
    runs, because autograd.grad inside engine.vmap is exact per example (the loop's result)."""
    w = torch.randn(5, 3)
    x = torch.randn(4, 5)

    def per_example(xi):
        wl = w.detach().requires_grad_()
        return torch.autograd.grad(torch.tanh(xi @ wl).sum(), wl)[0]

    assert torch.allclose(engine.vmap(per_example)(x), torch.stack([per_example(xi) for xi in x]), atol=1e-6)


def test_guards_are_lifted_after_the_transform() -> None:
    engine.grad(lambda x: x.sum())(torch.randn(3))
    t = torch.randn(2).requires_grad_()
    t.retain_grad()
    assert t.requires_grad


def test_transform_errors_are_runtime_errors() -> None:
    with pytest.raises(RuntimeError):
        engine.grad(torch.sin)(torch.randn(3))
    with pytest.raises(RuntimeError):
        engine.vmap(torch.add)(torch.randn(3), torch.randn(4))
    assert issubclass(engine.TransformError, ValueError) and issubclass(engine.VmapError, ValueError)


# ---- OpInfo ops torch.func batches natively ------------------------------------------------------

TORCH_FUNC_NATIVE = [
    "cdist", "combinations", "complex", "lu_unpack", "matrix_exp", "median", "nanmedian", "aminmax", "bucketize",
    "searchsorted", "unfold", "unfold_copy", "kron", "pinverse", "triangular_solve", "grid_sampler_3d",
    "_upsample_bilinear2d_aa", "linalg.householder_product", "linalg.lstsq", "linalg.solve", "linalg.solve_ex",
    "linalg.solve_triangular", "linalg.lu_solve", "linalg.pinv", "cholesky_solve", "cholesky_inverse", "polar",
    "as_strided", "as_strided_copy", "nn.functional.group_norm", "flip", "fft.hfft2", "fft.hfftn",
]
# where torch.func falls back to its loop and the engine batches natively
BEYOND_TORCH_FUNC = [
    "nn.functional.bilinear", "nonzero_static", "index_reduce.amax", "put", "masked_scatter", "ormqr",
    "nn.functional.pdist", "linalg.ldl_solve", "hash_tensor", "as_strided_scatter",
]


@pytest.mark.parametrize("op", TORCH_FUNC_NATIVE + BEYOND_TORCH_FUNC)
def test_op_batched_natively_and_correctly(op: str) -> None:
    from engine.coverage.harness import check_op, iter_opinfos

    (opinfo,) = [o for o in iter_opinfos([op]) if (f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name) == op]
    res = check_op(opinfo, torch_func=False)
    assert res.engine == "native", f"{op}: {res.engine} {res.detail} {res.fallback_ops}"
