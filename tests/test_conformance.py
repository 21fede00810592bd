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
def repr_of_batched_tensors_nested(m):  # printing inside vmap: torch.func's format and depths
    seen = []

    def show(t):
        seen.append(repr(t))
        return t

    m.vmap(m.vmap(show))(torch.arange(8.).reshape(2, 2, 2, 1))
    m.vmap(show, randomness="same")(torch.arange(6.).reshape(2, 3))
    m.vmap(m.vmap(show, in_dims=1), in_dims=2)(torch.arange(24.).reshape(2, 3, 4))  # an input shows the dim it was given
    return seen


@case
def repr_inside_grad_transforms(m):  # GradTrackingTensor levels, numbered with the vmaps around them
    seen = []

    def show(t):
        seen.append(repr(t))
        return (t * t).sum()

    m.grad(show)(torch.arange(3.))
    m.grad(m.grad(show))(torch.tensor(2.))
    m.vmap(m.grad(show), in_dims=1)(torch.arange(6.).reshape(3, 2))
    m.grad(lambda t: m.vmap(show)(t).sum())(torch.arange(6.).reshape(2, 3))
    m.jvp(show, (torch.arange(2.),), (torch.ones(2),))
    m.vjp(lambda t: show(t * 2), torch.arange(2.))
    seen.append(repr(torch.arange(2.).requires_grad_()))  # outside: PyTorch's own
    return seen


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


# jvp writes through a primal as torch.func's dual tensor does: the caller's tensor changes and
# the tangent follows the write (the caller's tangent itself is not compared: see engine.transforms)
@case
def jvp_copy_into_primal_writes_through(m):
    x, y = torch.randn(3), torch.randn(3)
    out, tangent = m.jvp(lambda a, b: a.copy_(b), (x, y), (torch.randn(3), torch.randn(3)))
    return out, tangent, x


@case
def jvp_mul_into_view_of_primal_under_vmap(m):
    x, xt = torch.randn(4, 2, 5), torch.randn(4, 2, 5)
    y, yt = torch.randn(5, 3, 2), torch.randn(5, 3, 2)

    def f(a, b):
        v = a[1:]
        v.mul_(b)
        return v, a

    out = m.vmap(lambda a, at, b, bt: m.jvp(f, (a, b), (at, bt)), in_dims=(2, 2, 0, 0))(x, xt, y, yt)
    return out, x


@case
def jvp_write_into_base_seen_by_earlier_view(m):
    x, xt = torch.randn(3, 4), torch.randn(3, 4)

    def f(a):
        row = a[0]
        a.mul_(2)
        return row

    return m.vmap(lambda a, at: m.jvp(f, (a,), (at,)), in_dims=1)(x, xt), x


# a write into an input an outer transform differentiates: torch.func refuses it; the engine
# computed the gradients after the write and returned wrong values, silently
def _write_into_tail(x, y):
    v = x[1:]
    v.mul_(y)
    return x.sin()


@case
def grad_of_grad_writing_into_its_input_refused(m):
    y = torch.randn(3)
    return m.grad(lambda a: m.grad(lambda b: _write_into_tail(b, y).sum())(a.clone()).sum())(torch.randn(4))


@case
def jvp_of_jvp_writing_into_its_primal_refused(m):
    y, t = torch.randn(3), torch.randn(4)
    inner = lambda a: m.jvp(lambda b: _write_into_tail(b, y), (a.clone(),), (t,))[1]  # noqa: E731
    return m.jvp(inner, (torch.randn(4),), (torch.ones(4),))


@case
def jvp_of_jvp_writing_into_a_clone(m):
    y, t = torch.randn(3), torch.randn(4)
    inner = lambda a: m.jvp(lambda b: _write_into_tail(b.clone(), y), (a,), (t,))[1]  # noqa: E731
    return m.jvp(inner, (torch.randn(4),), (torch.ones(4),))


# torch.func refuses making a leaf inside any transform, vmap alone included
@case
def requires_grad_inside_vmap_alone_refused(m):
    w = torch.randn(5, 3)
    return m.vmap(lambda xi: torch.autograd.grad(torch.tanh(xi @ w.detach().requires_grad_()).sum(), w)[0])(torch.randn(4, 5))


@case
def autograd_functional_vjp_inside_vmap_alone_refused(m):
    return m.vmap(lambda x: torch.autograd.functional.vjp(lambda t: t.sin().sum(), x))(torch.randn(5, 3))


@case
def retain_grad_inside_vmap_alone_refused(m):
    def f(x):
        y = x.sin()
        y.retain_grad()
        return y
    return m.vmap(f)(torch.randn(3, requires_grad=True))


@case
def jvp_integer_tangent_refused(m):
    return m.jvp(torch.sin, (torch.randn(3),), (torch.ones(3, dtype=torch.int64),))


@case
def linearize_tangent_of_another_dtype_refused(m):
    _, jvp_fn = m.linearize(torch.sin, torch.randn(3))
    return jvp_fn(torch.randn(3, dtype=torch.float64))


# ---- view identity: a view op's result is a view of the input (`_base is x`) ---------------------

_VIEWS = {
    "diagonal": (lambda t: t.diagonal(), 0, 0),
    "transpose_in_dim_1": (lambda t: t.t(), 1, 0),
    "select_out_dim_1": (lambda t: t[0], 0, 1),
    "unbind": (lambda t: t.unbind(0), 0, 0),
    "split": (lambda t: t.split(2, 0), 0, 0),
    "chunk": (lambda t: t.chunk(2, 1), 2, 0),
    "view": (lambda t: t.view(-1), 0, 0),
    "reshape": (lambda t: t.reshape(2, 2, 4), 0, 0),
    "select": (lambda t: t.select(1, 1), 0, 0),
    "narrow": (lambda t: t.narrow(1, 1, 2), 0, 0),
    "getitem": (lambda t: t[1:3, ::2], 0, 0),
    "expand": (lambda t: t.expand(2, 4, 4), 0, 0),
    "permute_movedim": (lambda t: t.permute(1, 0).movedim(0, 1), 1, 1),
    "unflatten": (lambda t: t.unflatten(0, (2, 2)), 0, 0),
    "as_strided": (lambda t: t.as_strided((2, 2), (1, 2)), 0, 0),
    "unfold": (lambda t: t.unfold(0, 2, 1), 0, 0),
    "alias": (lambda t: torch.ops.aten.alias(t), 0, 0),
    "detach_is_not_a_view": (lambda t: t.detach(), 0, 0),
    "identity": (lambda t: t, 0, 0),
}


def _view_case(name: str, fn: Callable, in_dim: int, out_dim: int, requires_grad: bool) -> None:
    def run(m):
        x = torch.randn(3, 4, 4, requires_grad=requires_grad)
        out = m.vmap(fn, in_dims=in_dim, out_dims=out_dim)(x)
        outs = out if isinstance(out, tuple) else (out,)
        return [o._base is x for o in outs], [o is x for o in outs], out

    CASES[f"view_identity_{name}{'_requires_grad' if requires_grad else ''}"] = run


for _name, (_fn, _in, _out) in _VIEWS.items():
    _view_case(_name, _fn, _in, _out, False)
    _view_case(_name, _fn, _in, _out, True)


@case
def view_identity_write_through_view_bumps_the_input_version(m):
    x = torch.randn(3, 4)
    d = m.vmap(lambda t: t[1:])(x)
    before = x._version
    d.mul_(2)
    return x._version > before, x


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
    # an UNBATCHED input: torch.func still draws a mask per element under 'different'
    _rand_case(f"dropout_unbatched_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.nn.functional.dropout(torch.ones(3), 0.5) + x,
                                                              randomness=r)(_Z))
    _rand_case(f"dropout1d_unbatched_{_r}", lambda m, r=_r: m.vmap(
        lambda x: torch.nn.functional.dropout1d(torch.ones(2, 3), 0.5) + x[:2], randomness=r)(_Z))
    _rand_case(f"alpha_dropout_unbatched_{_r}", lambda m, r=_r: m.vmap(
        lambda x: torch.nn.functional.alpha_dropout(torch.ones(3), 0.5, training=True) + x, randomness=r)(_Z))
    _rand_case(f"feature_alpha_dropout_unbatched_{_r}", lambda m, r=_r: m.vmap(
        lambda x: torch.nn.functional.feature_alpha_dropout(torch.ones(2, 3), 0.5, training=True) + x[:2], randomness=r)(_Z))
    _rand_case(f"dropout_module_unbatched_{_r}", lambda m, r=_r: m.vmap(lambda x: torch.nn.Dropout(0.3)(torch.ones(3)) + x,
                                                                     randomness=r)(_Z))
_rand_case("dropout_unbatched_error_mode", lambda m: m.vmap(lambda x: torch.nn.functional.dropout(torch.ones(3), 0.5) + x)(_Z))
_rand_case("nested_different_over_same", lambda m: m.vmap(m.vmap(lambda x: torch.randn(2) + x, randomness="same"),
                                                           randomness="different")(torch.zeros(3, 4, 2)))
_rand_case("randomness_error_mode", lambda m: m.vmap(lambda x: torch.randn(3) + x)(_Z))
_rand_case("randn_out_in_error_mode_vmap_inside_same_refused", lambda m: m.vmap(m.vmap(
    lambda x: torch.randn(3, out=torch.zeros(3)) + x), randomness="same")(torch.zeros(2, 4, 3)))
_rand_case("rrelu_eval_error_mode_refused", lambda m: m.vmap(lambda x: torch.rrelu(x - 0.5))(_Z))
# a random function's out= variant is refused in every mode, as torch.func refuses it: randn(out=)
# and rand(out=, generator=) reach the dispatch as a resize_ and an in-place draw into the out=
# tensor (the ops of `y.normal_()`, which 'same' accepts), so the refusal is made above them
for _r in ("different", "same"):
    _rand_case(f"randn_out_unbatched_{_r}_refused", lambda m, r=_r: m.vmap(
        lambda x: torch.randn(3, out=torch.zeros(3)) + x, randomness=r)(_Z))
    _rand_case(f"randn_out_batched_{_r}_refused", lambda m, r=_r: m.vmap(
        lambda x: torch.randn(3, out=x.clone()), randomness=r)(_Z))
    _rand_case(f"rand_out_with_generator_{_r}_refused", lambda m, r=_r: m.vmap(
        lambda x: torch.rand(3, out=torch.zeros(3), generator=torch.Generator().manual_seed(2)) + x, randomness=r)(_Z))
    _rand_case(f"normal_out_of_unbatched_{_r}_refused", lambda m, r=_r: m.vmap(
        lambda x: torch.normal(torch.zeros(3), torch.ones(3), out=torch.zeros(3)) + x, randomness=r)(_Z))
    # rrelu: torch.func has no rule and refuses it in every mode, eval mode (deterministic) included
    _rand_case(f"rrelu_eval_of_unbatched_{_r}_refused", lambda m, r=_r: m.vmap(
        lambda x: torch.rrelu(torch.linspace(-1, 1, 3)) + x, randomness=r)(_Z))
    _rand_case(f"rrelu_training_of_batched_{_r}_refused", lambda m, r=_r: m.vmap(
        lambda x: torch.nn.functional.rrelu(x - 0.5, training=True), randomness=r)(_Z))
    _rand_case(f"rrelu_inplace_of_batched_{_r}_refused", lambda m, r=_r: m.vmap(
        lambda x: torch.nn.functional.rrelu(x - 0.5, inplace=True), randomness=r)(_Z))
    _rand_case(f"rrelu_module_eval_{_r}_refused", lambda m, r=_r: m.vmap(
        torch.nn.RReLU().eval(), randomness=r)(_Z - 0.5))
    # the same in-place draw written as such stays accepted under 'same', as torch.func accepts it
    _rand_case(f"resize_then_normal__unbatched_{_r}", lambda m, r=_r: m.vmap(
        lambda x: torch.zeros(2).resize_(3).normal_() + x, randomness=r)(_Z))


# ---- batch dims anywhere, any layout (issue #26) --------------------------------------------------

def _stacked_last(*shape: int, b: int = 3, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """b different tensors of `shape` stacked at dim -1: contiguous, the batch dim's stride is 1."""
    g = torch.Generator().manual_seed(1)
    return torch.stack([torch.randn(*shape, generator=g, dtype=dtype) for _ in range(b)], dim=-1)


for _norm in ("backward", "ortho", "forward"):
    _rand_case(f"hfftn_{_norm}_batch_innermost", lambda m, n=_norm: m.vmap(
        lambda t: torch.fft.hfftn(t, norm=n), in_dims=-1)(_stacked_last(5, 6, 7)))
_rand_case("hfft2_batch_innermost", lambda m: m.vmap(torch.fft.hfft2, in_dims=-1)(_stacked_last(4, 5, 6)))
_rand_case("conj_view_then_add", lambda m: m.vmap(lambda t: t.conj() + 1)(_stacked_last(4, 5, dtype=torch.complex64)))
_rand_case("conj_view_then_sum_at_last", lambda m: m.vmap(lambda t: t.conj().sum(0), in_dims=-1)(
    _stacked_last(4, 5, dtype=torch.complex64)))
_rand_case("conj_bit_input", lambda m: m.vmap(lambda t: t * 2)(_stacked_last(4, 5, dtype=torch.complex64).conj()))
_rand_case("matrix_exp_batch_innermost", lambda m: m.vmap(torch.matrix_exp, in_dims=-1)(_stacked_last(5, 5, 5) / 5))
_rand_case("kron_one_batched_at_last", lambda m: m.vmap(torch.kron, in_dims=(-1, None))(_stacked_last(5, 5), torch.ones(3, 2)))
_rand_case("kron_batch_innermost_out_dim_last", lambda m: m.vmap(torch.kron, in_dims=-1, out_dims=-1)(
    _stacked_last(2, 3), _stacked_last(3, 2)))

_rand_case("addr_beta_zero_only_bias_batched", lambda m: m.vmap(
    lambda b: torch.addr(b, torch.ones(2), torch.ones(3), beta=0.0, alpha=0.5))(torch.full((4, 2, 3), float("nan"))))
_rand_case("addmm_beta_zero_only_bias_batched", lambda m: m.vmap(
    lambda b: torch.addmm(b, torch.ones(2, 5), torch.ones(5, 3), beta=0))(torch.randn(4, 2, 3)))
_rand_case("gather_of_0dim_inputs", lambda m: m.vmap(lambda t: torch.gather(t, 0, torch.tensor(0)))(torch.arange(4.0)))

# checks a batched call must keep (torch raises for each element; the engine did not)
_rand_case("out_into_unbatched_tensor_refused", lambda m: m.vmap(
    lambda t: torch.index_select(t, 0, torch.tensor([0, 1]), out=torch.zeros(2)))(torch.randn(3, 4)))
_rand_case("t_of_3d_elements_refused", lambda m: m.vmap(torch.t)(torch.randn(2, 3, 4, 5)))
_rand_case("unbind_of_0dim_elements_refused", lambda m: m.vmap(lambda t: t.unbind(0))(torch.randn(3)))
_rand_case("kthvalue_k_out_of_range_refused", lambda m: m.vmap(lambda t: torch.kthvalue(t, 5))(torch.randn(3)))
_rand_case("masked_scatter_non_bool_mask_refused", lambda m: m.vmap(torch.masked_scatter)(
    torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.uint8), torch.ones(2, 3)))

# argument checks of vmap and vjp_fn (functorch's own tests, issue #26)
_X3, _Y3 = torch.arange(3.0), torch.arange(3.0) + 1
_rand_case("in_dims_top_level_list_refused", lambda m: m.vmap(torch.mul, [0, 0])(_X3, _Y3))
_rand_case("in_dims_list_for_a_list_argument_refused", lambda m: m.vmap(lambda z: z[0] + z[1], in_dims=[0, 0])([_X3, _Y3]))
_rand_case("in_dims_set_refused", lambda m: m.vmap(torch.mul, {0})(_X3, _Y3))
_rand_case("in_dims_nested_list_matches_a_list_argument", lambda m: m.vmap(lambda z: z[0] * z[1], in_dims=([0, None],))(
    [_X3, torch.tensor(2.0)]))
for _d in (3, -4):
    # the identity function returns its input untouched: the range is checked before that shortcut
    _rand_case(f"out_dims_{_d}_out_of_range_identity", lambda m, d=_d: m.vmap(lambda t: t, out_dims=d)(torch.ones(2, 3, 5)))
    _rand_case(f"out_dims_{_d}_out_of_range", lambda m, d=_d: m.vmap(lambda t: t * 2, out_dims=d)(torch.ones(2, 3, 5)))
_rand_case("out_dims_one_tuple_for_one_tensor", lambda m: m.vmap(lambda t: t, out_dims=(1,))(torch.randn(2, 3)))
_rand_case("out_dims_one_tuple_for_one_tensor_inplace", lambda m: m.vmap(torch.Tensor.acos_, out_dims=(1,))(torch.rand(2, 5)))
_rand_case("out_dims_list_for_tuple_outputs_refused", lambda m: m.vmap(lambda t: (t, t), out_dims=[0, 1])(torch.randn(2, 3)))
_rand_case("out_dims_list_for_list_outputs", lambda m: m.vmap(lambda t: [t, t * 2], out_dims=[0, 1])(torch.randn(2, 3)))
_rand_case("equal_of_batched_refused", lambda m: m.vmap(torch.equal)(torch.randn(2, 3), torch.randn(2, 3)))
_rand_case("out_into_batched_tensor_refused", lambda m: m.vmap(lambda a, b: torch.abs(a, out=b))(
    torch.randn(2, 3), torch.zeros(2, 3)))
_rand_case("out_resized_per_element_refused", lambda m: m.vmap(lambda a, b: torch.sum(a, 0, out=b))(
    torch.randn(2, 3, 4), torch.zeros(2, 3)))
for _fmt in ("channels_last", "channels_last_3d"):
    _rand_case(f"is_contiguous_{_fmt}_refused", lambda m, f=_fmt: m.vmap(
        lambda t: t * float(t.is_contiguous(memory_format=getattr(torch, f))))(torch.randn(3, 2, 7, 3)))
_rand_case("is_contiguous_batch_not_in_front", lambda m: m.vmap(
    m.vmap(lambda t: torch.tensor(float(t.is_contiguous())), in_dims=1))(torch.randn(3, 4, 5)))

# a decomposed op keeps the op's own argument checks (index_add's decomposition would broadcast)
_rand_case("index_add_source_of_wrong_shape_refused", lambda m: m.vmap(lambda i: torch.index_add(torch.zeros(3, 2), 0, i, torch.ones(2)))(
    torch.tensor([[0, 1], [1, 2]])))
_rand_case("index_add_batched_self_source_of_wrong_shape_refused", lambda m: m.vmap(
    lambda t, s: torch.index_add(t, 0, torch.tensor([0, 1]), s))(torch.zeros(2, 3, 2), torch.ones(2, 2)))
_rand_case("index_add_batched_index", lambda m: m.vmap(lambda i: torch.index_add(torch.zeros(3, 2), 0, i, torch.ones(2, 2)))(
    torch.tensor([[0, 1], [1, 2]])))
# masked_fill with a batched value its self's dtype cannot hold
_rand_case("masked_fill_batched_complex_value_into_real_refused", lambda m: m.vmap(lambda t, v: t.masked_fill(t == 0, v))(
    torch.zeros(2, 2), torch.tensor([1 + 1j, 2 + 0j])))
_rand_case("masked_fill_batched_value_that_fits", lambda m: m.vmap(lambda t, v: t.masked_fill(t == 0, v))(
    torch.zeros(3, 2, dtype=torch.uint8), torch.tensor([1.0, 2.0, 255.0])))
# a matrix op over an empty batch of vectors: no element to ask, still refused
for _name, _op in (("qr", torch.linalg.qr), ("svdvals", torch.linalg.svdvals), ("svd", torch.linalg.svd), ("pinv", torch.linalg.pinv)):
    _rand_case(f"{_name}_of_an_empty_batch_of_vectors_refused", lambda m, f=_op: m.vmap(f)(torch.empty(0, 0)))

# linalg outputs and operands with batch dims of their own
_rand_case("lu_unpack_of_an_empty_batch_of_matrices", lambda m: m.vmap(torch.lu_unpack)(
    torch.randn(2, 0, 3, 5), torch.ones(2, 0, 3, dtype=torch.int32)))
_SPD = torch.randn(4, 2, 3, 3)
_SPD = _SPD @ _SPD.mT + 3 * torch.eye(3)
_rand_case("ldl_solve_element_batch_beside_an_unbatched_rhs", lambda m: m.vmap(
    lambda ld, p: torch.linalg.ldl_solve(ld, p, torch.ones(3, 2)))(*torch.linalg.ldl_factor(_SPD)))
_rand_case("ldl_solve_rhs_batched_at_last", lambda m: m.vmap(
    lambda ld, p, b: torch.linalg.ldl_solve(ld, p, b), in_dims=(None, None, -1))(*torch.linalg.ldl_factor(_SPD[0]), torch.randn(3, 2, 4)))

_NZ = torch.ops.aten._new_zeros_with_same_feature_meta.default
_rand_case("new_zeros_with_same_feature_meta_self_batched", lambda m: m.vmap(lambda a, b: _NZ(a, b, self_num_batch_dims=1),
                                                                           in_dims=(0, None))(torch.randn(3, 4, 5), torch.randn(2, 3)))
_rand_case("new_zeros_with_same_feature_meta_other_batched", lambda m: m.vmap(lambda a, b: _NZ(a, b), in_dims=(None, -1))(
    torch.randn(5), torch.randn(2, 3, 4)))


def _vjp_fn_call(m: Any, cotangents: Any, *flags: Any) -> Any:
    _, fn = m.vjp(lambda x: (x.sin(), (x.cos(), x * 2)), torch.linspace(-1, 1, 3))
    return fn(cotangents, *flags)


_C3 = torch.ones(3)
_rand_case("vjp_fn_cotangents_nested_otherwise_refused", lambda m: _vjp_fn_call(m, ((_C3, (_C3, _C3)),)))
_rand_case("vjp_fn_cotangents_flat_refused", lambda m: _vjp_fn_call(m, (_C3, _C3, _C3)))
_rand_case("vjp_fn_cotangents_as_the_outputs", lambda m: _vjp_fn_call(m, (_C3, (_C3 * 2, _C3 * 3))))
_rand_case("vjp_fn_positional_retain_and_create_graph", lambda m: _vjp_fn_call(m, (_C3, (_C3, _C3)), True, True)[0].requires_grad)

_rand_case("masked_fill_batched_value_not_0dim_refused", lambda m: m.vmap(
    lambda t, v: t.masked_fill(t > 0, v))(torch.randn(3, 2, 2), torch.randn(3, 1)))
_rand_case("masked_fill_batched_0dim_value", lambda m: m.vmap(
    lambda t, v: t.masked_fill(t > 0, v))(torch.randn(3, 2, 2), torch.randn(3)))

# random draws equal to torch.func's under the same seed, and refusals where torch.func refuses
_IMG_LAST = torch.ones(3, 2, 5, 4)
_STD = torch.rand(2, 20) + 0.5  # >= 16 values: the normal kernel then fills in blocks, not one by one
for _fill in ("cauchy_", "geometric_", "log_normal_", "random_", "exponential_"):
    _args = (0.5,) if _fill == "geometric_" else ()
    _rand_case(f"{_fill}_batch_at_last_different", lambda m, f=_fill, a=_args: m.vmap(
        lambda t: getattr(t, f)(*a), in_dims=-1, randomness="different")(_IMG_LAST.clone()))
    _rand_case(f"{_fill}_generator_same", lambda m, f=_fill, a=_args: m.vmap(
        lambda t: getattr(t, f)(*a, generator=torch.Generator().manual_seed(3)), randomness="same")(_Z.clone()))
_rand_case("normal_unbatched_std_different", lambda m: m.vmap(
    lambda x: torch.normal(0.0, _STD) + x[0], randomness="different")(_Z))
_rand_case("bernoulli__same_batched_probability_refused", lambda m: m.vmap(
    lambda t, p: t.bernoulli_(p), randomness="same")(_Z.clone(), torch.rand(4, 3)))
# a matrix op over a batch of vectors: physically one matrix, so only a check refuses it
for _name, _op in (("eig", torch.linalg.eig), ("eigvalsh", torch.linalg.eigvalsh), ("svdvals", torch.linalg.svdvals),
                   ("qr", torch.linalg.qr), ("lu", torch.linalg.lu), ("ldl_factor", torch.linalg.ldl_factor),
                   ("pinv", torch.linalg.pinv), ("matrix_exp", torch.linalg.matrix_exp), ("cholesky_inverse", torch.cholesky_inverse),
                   ("solve", lambda a: torch.linalg.solve(a, torch.ones(4))),
                   ("lstsq", lambda a: torch.linalg.lstsq(a, torch.ones(4, 1))),
                   ("solve_triangular", lambda a: torch.linalg.solve_triangular(a, torch.ones(4, 1), upper=True))):
    _rand_case(f"{_name}_of_vectors_refused", lambda m, f=_op: m.vmap(f)(torch.eye(4) + 1))
_rand_case("jacfwd_random_error_mode_refused", lambda m: m.jacfwd(torch.bernoulli)(torch.rand(3, 4)))
_rand_case("jacfwd_random_same", lambda m: m.jacfwd(torch.bernoulli, randomness="same")(torch.rand(3, 4)))


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

def test_autograd_grad_inside_vmap_alone_gives_per_example_gradients() -> None:
    """What the engine does beyond torch.func: autograd.grad inside engine.vmap with respect to a
    tensor made to require grad outside is exact per example (the loop's result). Making the leaf
    inside (requires_grad_) is refused, as torch.func refuses it (the cases above)."""
    w = torch.randn(5, 3).requires_grad_()
    x = torch.randn(4, 5)

    def per_example(xi):
        return torch.autograd.grad(torch.tanh(xi @ w).sum(), w)[0]

    assert torch.allclose(engine.vmap(per_example)(x), torch.stack([per_example(xi) for xi in x]), atol=1e-6)


def test_masked_fill_with_a_batched_value_that_overflows_is_refused_as_the_loop_refuses() -> None:
    """The loop raises on the element whose value does not fit uint8; the engine raises too. torch.func
    raised up to torch 2.13 and from 2.14 on returns the value wrapped around, so the loop, not
    torch.func, is the bar here."""
    t, v = torch.zeros(3, 2, dtype=torch.uint8), torch.tensor([1.0, 2.0, 300.0])
    with pytest.raises(RuntimeError, match="overflow"):
        [ti.masked_fill(ti == 0, vi) for ti, vi in zip(t, v)]
    with pytest.raises(RuntimeError, match="overflow"):
        engine.vmap(lambda ti, vi: ti.masked_fill(ti == 0, vi))(t, v)


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


_aten = torch.ops.aten
_SHARED_STATS_CALLS = {
    "native_batch_norm": lambda x, rm, rv, m: _aten.native_batch_norm(x, None, None, rm, rv, True, m, 1e-5),
    "_native_batch_norm_legit": lambda x, rm, rv, m: _aten._native_batch_norm_legit(x, None, None, rm, rv, True, m, 1e-5),
    "_batch_norm_with_update": lambda x, rm, rv, m: _aten._batch_norm_with_update(x, torch.ones(3, dtype=x.dtype), None, rm, rv, m, 1e-5),
    "F.batch_norm": lambda x, rm, rv, m: torch.nn.functional.batch_norm(x, rm, rv, training=True, momentum=m),
    "F.instance_norm": lambda x, rm, rv, m: torch.nn.functional.instance_norm(x, rm, rv, use_input_stats=True, momentum=m),
}


@pytest.mark.parametrize("momentum", [0.1, 0.0, 1.0])
@pytest.mark.parametrize("name", sorted(_SHARED_STATS_CALLS))
def test_batch_norm_training_with_shared_running_stats_matches_the_loop(name: str, momentum: float) -> None:
    """torch.func refuses a batched input with unbatched running statistics in training mode; the
    loop updates them once per example in turn, and the engine gives exactly that (outputs and
    buffers; with momentum 0.1 a second write of the closed form would show in the buffers)."""
    fn = _SHARED_STATS_CALLS[name]
    x = torch.randn(4, 5, 3, 6, dtype=torch.float64)
    rm0, rv0 = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5
    rm_loop, rv_loop = rm0.clone(), rv0.clone()
    want = [fn(xi, rm_loop, rv_loop, momentum) for xi in x]
    rm, rv = rm0.clone(), rv0.clone()
    with engine.fallback_policy("error"):
        got = engine.vmap(lambda xi: fn(xi, rm, rv, momentum))(x)
    for j, g in enumerate(got if isinstance(got, tuple) else (got,)):
        w = torch.stack([(o if isinstance(o, tuple) else (o,))[j] for o in want])
        torch.testing.assert_close(g, w, msg=f"{name}: output {j}")
    torch.testing.assert_close(rm, rm_loop, msg=f"{name}: running_mean")
    torch.testing.assert_close(rv, rv_loop, msg=f"{name}: running_var (unbiased variance per example)")


@pytest.mark.parametrize("name", sorted(_SHARED_STATS_CALLS))
def test_batch_norm_training_with_expanded_running_stats_matches_the_loop(name: str) -> None:
    """Running statistics batched by an expand (stride 0) are one memory: a loop over their
    elements (views of it) updates it once per example in turn, and the engine gives exactly that
    (torch.func updates a copy and drops it; the kernel alone refuses the overlapping write).
    instance_norm writes its statistics back with a `copy_` into the expanded tensor, which stays
    refused (an error, never a wrong buffer)."""
    fn = _SHARED_STATS_CALLS[name]
    x = torch.randn(4, 5, 3, 6, dtype=torch.float64)
    rm0, rv0 = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5
    rm_loop, rv_loop = rm0.clone().expand(4, 3), rv0.clone().expand(4, 3)
    want = [fn(x[i], rm_loop[i], rv_loop[i], 0.1) for i in range(4)]
    rm, rv = rm0.clone().expand(4, 3), rv0.clone().expand(4, 3)
    if name == "F.instance_norm":
        with pytest.raises(RuntimeError, match="single memory location"):
            engine.vmap(lambda xi, a, b: fn(xi, a, b, 0.1))(x, rm, rv)
        return
    with engine.fallback_policy("error"):
        got = engine.vmap(lambda xi, a, b: fn(xi, a, b, 0.1))(x, rm, rv)
    for j, g in enumerate(got if isinstance(got, tuple) else (got,)):
        w = torch.stack([(o if isinstance(o, tuple) else (o,))[j] for o in want])
        torch.testing.assert_close(g, w, msg=f"{name}: output {j}")
    torch.testing.assert_close(rm, rm_loop, msg=f"{name}: running_mean")
    torch.testing.assert_close(rv, rv_loop, msg=f"{name}: running_var")


def test_batch_norm_module_in_training_under_vmap_updates_its_buffers_as_the_loop() -> None:
    bn, loop_bn = torch.nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    x = torch.randn(4, 2, 3, 5, 5)
    want = torch.stack([loop_bn(xi) for xi in x])
    with engine.fallback_policy("error"):
        got = engine.vmap(bn)(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(bn.running_mean, loop_bn.running_mean)
    torch.testing.assert_close(bn.running_var, loop_bn.running_var)


def test_narrow_with_a_tensor_start_reads_it_when_every_element_agrees() -> None:
    x = torch.randn(3, 6, 4)
    same = torch.tensor([2, 2, 2])
    want = torch.stack([xi.narrow(0, s, 3) for xi, s in zip(x, same)])
    torch.testing.assert_close(engine.vmap(lambda xi, s: xi.narrow(0, s, 3))(x, same), want)
    with pytest.raises(RuntimeError, match="differs per batch element"):
        engine.vmap(lambda xi, s: xi.narrow(0, s, 3))(x, torch.tensor([0, 1, 2]))


def test_inplace_draw_into_a_fresh_empty_tensor_draws_per_element_under_different() -> None:
    """torch.func refuses `torch.empty_like(x).uniform_()` on an unbatched x under 'different'; in the
    loop each iteration fills its own fresh tensor, which the engine does (one draw over [B, ...])."""
    x = torch.zeros(5)
    torch.manual_seed(3)
    got = engine.vmap(lambda z: torch.empty_like(x).uniform_() + z, randomness="different")(torch.zeros(4, 1))
    torch.manual_seed(3)
    torch.testing.assert_close(got, torch.empty(4, 5).uniform_())
    with pytest.raises(RuntimeError, match="inplace randomness on an unbatched tensor"):
        engine.vmap(lambda z: torch.ones(5).uniform_() + z, randomness="different")(torch.zeros(4, 1))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.complex64])
def test_jvp_tangent_of_another_dtype_is_refused(dtype: torch.dtype) -> None:
    """torch.func.jvp carries such a tangent in its own dtype (float64 through sin of a float32 primal,
    float16 through a reshape but float32 through sin); the engine's reverse-mode jvp cannot, so it
    refuses with an error that is both a RuntimeError and a ValueError."""
    with pytest.raises(RuntimeError, match="tangent 0 has dtype"):
        engine.jvp(torch.sin, (torch.randn(3),), (torch.randn(3).to(dtype),))
    with pytest.raises(ValueError):
        engine.jvp(torch.sin, (torch.randn(3),), (torch.randn(3).to(dtype),))


# ---- OpInfo ops torch.func batches natively ------------------------------------------------------

TORCH_FUNC_NATIVE = [
    "cdist", "combinations", "complex", "lu_unpack", "matrix_exp", "median", "nanmedian", "aminmax", "bucketize",
    "searchsorted", "unfold", "unfold_copy", "kron", "pinverse", "triangular_solve", "grid_sampler_3d",
    "_upsample_bilinear2d_aa", "linalg.householder_product", "linalg.lstsq", "linalg.solve", "linalg.solve_ex",
    "linalg.solve_triangular", "linalg.lu_solve", "linalg.pinv", "cholesky_solve", "cholesky_inverse", "polar",
    "as_strided", "as_strided_copy", "nn.functional.group_norm", "flip", "fft.hfft2", "fft.hfftn",
    "linspace.tensor_overload", "logspace.tensor_overload",
]
# where torch.func falls back to its loop and the engine batches natively
BEYOND_TORCH_FUNC = [
    "nn.functional.bilinear", "nonzero_static", "index_reduce.amax", "put", "masked_scatter", "ormqr",
    "nn.functional.pdist", "linalg.ldl_solve", "hash_tensor", "as_strided_scatter", "nn.functional.embedding_bag",
    # where torch.func raises: training-mode batch norm with unbatched running statistics, narrow's tensor start
    "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update", "nn.functional.batch_norm",
    "nn.functional.instance_norm", "narrow",
    # where torch.func raises (or loops): outputs sized by the data, which the elements' data agree on
    "argwhere", "masked_select", "unique", "unique_consecutive",  # (nonzero: no pinned sample agrees)
]


# ops that raise (never answer wrongly) under some batch-dim layouts of the harness, and why
LAYOUT_ERRORS = {
    "as_strided": "strides of a batch dim that is not outermost in memory are refused (torch.func answers wrongly)",
}


@pytest.mark.parametrize("op", TORCH_FUNC_NATIVE + BEYOND_TORCH_FUNC)
def test_op_batched_natively_and_correctly(op: str) -> None:
    from engine.coverage.expectations import PINNED
    from engine.coverage.harness import check_op, iter_opinfos

    (opinfo,) = [o for o in iter_opinfos([op]) if (f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name) == op]
    res = check_op(opinfo, torch_func=False, **PINNED)
    assert res.patterns.get("0", {}).get("engine") == "native", f"{op}: {res.patterns} {res.detail} {res.fallback_ops}"
    if op in LAYOUT_ERRORS:
        wrong = {p: c["engine"] for p, c in res.patterns.items() if c["engine"] not in ("native", "error")}
        assert not wrong, f"{op}: {wrong} {res.detail}"
    else:
        assert res.engine == "native", f"{op}: {res.engine} {res.detail} {res.fallback_ops}"


def test_jvp_write_into_a_primal_after_an_op_saved_it_is_refused() -> None:
    """torch.func computes each tangent as the op runs, so `z = x * y; x.copy_(y)` under jvp is
    exact there. The engine differentiates the recorded graph afterwards, when the value `mul`
    saved is gone: it raises (naming the primal and the fix) rather than differentiate the wrong
    value."""
    def f(x, y):
        z = x * y
        x.copy_(y)
        return z, x

    with pytest.raises(engine.TransformError, match="wrote in place into primal 0.*clone"):
        engine.jvp(f, (torch.randn(3), torch.randn(3)), (torch.randn(3), torch.randn(3)))


@pytest.mark.parametrize("transform", ["grad", "jvp", "vjp"])
def test_engine_transform_inside_torch_func_functionalize_raises(transform: str) -> None:
    """torch.func.functionalize wraps its inputs in functional tensors on which autograd records
    nothing at that level: a leaf the engine made there would differentiate to zeros (measured when
    the refusal was lifted for a try), so the refusal of requires_grad_() stays, and no zero comes
    back silently. torch.func's own transforms run inside functionalize."""
    x, t = torch.randn(2, 3), torch.randn(2, 3)
    calls = {
        "grad": lambda x: engine.grad(lambda a: a.sin().sum())(x),
        "jvp": lambda x: engine.jvp(torch.sin, (x,), (t,)),
        "vjp": lambda x: engine.vjp(torch.sin, x)[1](t),
    }
    with pytest.raises(RuntimeError, match="requires_grad_"):
        tf.functionalize(calls[transform])(x)


def test_nested_jacfwd_writing_into_its_input_is_refused() -> None:
    """torch.func's nested dual tensors take the write; the engine's inner jvp differentiates after
    it, so it refuses (TransformError, naming the input and the fix) rather than miss the write."""
    y = torch.randn(3)
    with pytest.raises(engine.TransformError, match="wrote in place into input 0.*clone"):
        engine.jacfwd(engine.jacfwd(lambda x: _write_into_tail(x, y)))(torch.randn(4))
    x = torch.randn(4)
    got = engine.jacfwd(engine.jacfwd(lambda t: _write_into_tail(t.clone(), y)))(x)
    torch.testing.assert_close(got, tf.jacfwd(tf.jacfwd(lambda t: _write_into_tail(t.clone(), y)))(x))
