"""Recorded aten graphs as JAX functions: the rule table the fused tier's XLA backend compiles from.

`RULES` maps each aten overload to a function of JAX values with the overload's own argument
list (tensors as jax arrays, the rest as recorded). `lower(gm, meta)` turns a recorded graph
into a function of jax arrays; `meta` is every node's (shape, dtype) from one run of the replay
(`observe`), and each node's value is checked against it while JAX traces (a shape that differs
is an error; a dtype that differs, as torch's and JAX's promotion of Python numbers can, is cast
to torch's). An op without a rule raises `Unlowerable` naming it: the graph then stays with the
replay (or another backend). Random ops have no rule: a program must draw what the replay draws.
"""
from __future__ import annotations

import itertools
import math
import operator
from typing import Any, Callable

import torch
import torch.fx

__all__ = ["Broadcast", "RULES", "Unlowerable", "lower", "observe", "lowerable"]

aten = torch.ops.aten


class Unlowerable(ValueError):
    """A recorded graph holds something the XLA backend has no rule for."""


def _jax() -> tuple[Any, Any, Any]:
    import jax
    import jax.numpy as jnp
    from jax import lax

    return jax, jnp, lax


# torch dtypes and their numpy names (jax.numpy takes numpy dtypes)
_DTYPES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}


def np_dtype(dtype: torch.dtype) -> Any:
    import jax.numpy as jnp

    try:
        return jnp.dtype(_DTYPES[dtype])
    except KeyError:
        raise Unlowerable(f"the XLA backend has no dtype for {dtype}") from None


def _dims(dims: Any, ndim: int) -> tuple[int, ...]:
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return tuple(range(ndim))
    return tuple(d % ndim if ndim else 0 for d in dims)


def _dim(d: int, ndim: int) -> int:
    return d % ndim if ndim else 0


# ------------------------------------------------------------------------------------------------
# the rules, by family

RULES: dict[Any, Callable[..., Any]] = {}


def rule(*ops: Any) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for op in ops:
            RULES[op] = fn
        return fn

    return register


def _unary(op: Any, name: str) -> None:
    def run(x: Any) -> Any:
        _, jnp, _ = _jax()
        return getattr(jnp, name)(x)

    RULES[op] = run


for _op, _name in [
    (aten.exp.default, "exp"), (aten.log.default, "log"), (aten.log1p.default, "log1p"),
    (aten.expm1.default, "expm1"), (aten.sqrt.default, "sqrt"), (aten.tanh.default, "tanh"),
    (aten.sin.default, "sin"), (aten.cos.default, "cos"), (aten.abs.default, "abs"), (aten.neg.default, "negative"),
    (aten.floor.default, "floor"), (aten.ceil.default, "ceil"),
    (aten.logical_not.default, "logical_not"), (aten.isnan.default, "isnan"), (aten.isinf.default, "isinf"),
    (aten.exp2.default, "exp2"), (aten.log2.default, "log2"), (aten.reciprocal.default, "reciprocal"),
    (aten.square.default, "square"), (aten.log10.default, "log10"), (aten.tan.default, "tan"),
    (aten.asin.default, "arcsin"), (aten.acos.default, "arccos"), (aten.atan.default, "arctan"),
    (aten.sinh.default, "sinh"), (aten.cosh.default, "cosh"), (aten.trunc.default, "trunc"),
    (aten.round.default, "round"),
]:
    _unary(_op, _name)


@rule(aten.sign.default, aten.sgn.default)
def _sign(x: Any) -> Any:
    """torch's sign of a real tensor: 0 at NaN and at -0.0, where jnp.sign gives NaN and -0.0."""
    _, jnp, _ = _jax()
    if jnp.iscomplexobj(x):
        raise Unlowerable("sgn of a complex tensor")
    return jnp.where((x == 0) | jnp.isnan(x), jnp.zeros_like(x), jnp.sign(x))


@rule(aten.rsqrt.default)
def _rsqrt(x: Any) -> Any:
    _, _, lax = _jax()
    return lax.rsqrt(x)


@rule(aten.sigmoid.default)
def _sigmoid(x: Any) -> Any:
    jax, _, _ = _jax()
    return jax.nn.sigmoid(x)


@rule(aten.relu.default)
def _relu(x: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@rule(aten.erf.default)
def _erf(x: Any) -> Any:
    _, _, lax = _jax()
    return lax.erf(x)


@rule(aten.lgamma.default)
def _lgamma(x: Any) -> Any:
    _, _, lax = _jax()
    return lax.lgamma(x)


@rule(aten.digamma.default)
def _digamma(x: Any) -> Any:
    _, _, lax = _jax()
    return lax.digamma(x)


@rule(aten.softplus.default)
def _softplus(x: Any, beta: float = 1, threshold: float = 20) -> Any:
    _, jnp, _ = _jax()
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / beta)


@rule(aten.add.Tensor, aten.add.Scalar)
def _add(a: Any, b: Any, alpha: float = 1) -> Any:
    return a + (b if alpha == 1 else b * alpha)


@rule(aten.sub.Tensor, aten.sub.Scalar)
def _sub(a: Any, b: Any, alpha: float = 1) -> Any:
    return a - (b if alpha == 1 else b * alpha)


@rule(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(a: Any, b: Any, alpha: float = 1) -> Any:
    return b - (a if alpha == 1 else a * alpha)


@rule(aten.mul.Tensor, aten.mul.Scalar)
def _mul(a: Any, b: Any) -> Any:
    return a * b


@rule(aten.div.Tensor, aten.div.Scalar)
def _div(a: Any, b: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.true_divide(a, b)


@rule(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(a: Any, b: Any, rounding_mode: str | None = None) -> Any:
    _, jnp, _ = _jax()
    if rounding_mode is None:
        return jnp.true_divide(a, b)
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b)
    q = jnp.true_divide(a, b)
    return jnp.trunc(q).astype(q.dtype)


@rule(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(a: Any, b: Any) -> Any:
    _, jnp, lax = _jax()
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        if b == 2:
            return a * a
        if b == 1:
            return a
        if b == 0.5:
            return jnp.sqrt(a)
        if float(b).is_integer() and abs(b) <= 64:
            return lax.integer_pow(a, int(b))
    return jnp.power(a, b)


@rule(aten.maximum.default)
def _maximum(a: Any, b: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.maximum(a, b)


@rule(aten.minimum.default)
def _minimum(a: Any, b: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.minimum(a, b)


@rule(aten.clamp.default)
def _clamp(x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002 - aten's names
    _, jnp, _ = _jax()
    if min is not None:
        x = jnp.maximum(x, min)
    if max is not None:
        x = jnp.minimum(x, max)
    return x


@rule(aten.clamp_min.default)
def _clamp_min(x: Any, min: Any) -> Any:  # noqa: A002
    _, jnp, _ = _jax()
    return jnp.maximum(x, min)


@rule(aten.clamp_max.default)
def _clamp_max(x: Any, max: Any) -> Any:  # noqa: A002
    _, jnp, _ = _jax()
    return jnp.minimum(x, max)


@rule(aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)
def _where(c: Any, a: Any, b: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.where(c, a, b)


def _compare(op: Any, fn: Callable[[Any, Any], Any]) -> None:
    RULES[op] = fn


for _name, _fn in [("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt), ("le", operator.le),
                   ("gt", operator.gt), ("ge", operator.ge)]:
    _compare(getattr(aten, _name).Tensor, _fn)
    _compare(getattr(aten, _name).Scalar, _fn)


@rule(aten.logical_and.default)
def _logical_and(a: Any, b: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.logical_and(a, b)


@rule(aten.logical_or.default)
def _logical_or(a: Any, b: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.logical_or(a, b)


# --- reductions


@rule(aten.sum.dim_IntList)
def _sum_dim(x: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
    _, jnp, _ = _jax()
    return jnp.sum(x, axis=_dims(dim, x.ndim), keepdims=keepdim, dtype=None if dtype is None else np_dtype(dtype))


@rule(aten.sum.default)
def _sum(x: Any, dtype: Any = None) -> Any:
    _, jnp, _ = _jax()
    return jnp.sum(x, dtype=None if dtype is None else np_dtype(dtype))


@rule(aten.mean.dim)
def _mean_dim(x: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
    _, jnp, _ = _jax()
    return jnp.mean(x, axis=_dims(dim, x.ndim), keepdims=keepdim, dtype=None if dtype is None else np_dtype(dtype))


@rule(aten.mean.default)
def _mean(x: Any, dtype: Any = None) -> Any:
    _, jnp, _ = _jax()
    return jnp.mean(x, dtype=None if dtype is None else np_dtype(dtype))


@rule(aten.prod.default)
def _prod(x: Any, dtype: Any = None) -> Any:
    _, jnp, _ = _jax()
    return jnp.prod(x, dtype=None if dtype is None else np_dtype(dtype))


@rule(aten.prod.dim_int)
def _prod_dim(x: Any, dim: int, keepdim: bool = False, dtype: Any = None) -> Any:
    _, jnp, _ = _jax()
    return jnp.prod(x, axis=_dim(dim, x.ndim), keepdims=keepdim, dtype=None if dtype is None else np_dtype(dtype))


@rule(aten.amax.default)
def _amax(x: Any, dim: Any = (), keepdim: bool = False) -> Any:
    _, jnp, _ = _jax()
    return jnp.max(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@rule(aten.amin.default)
def _amin(x: Any, dim: Any = (), keepdim: bool = False) -> Any:
    _, jnp, _ = _jax()
    return jnp.min(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@rule(aten.logsumexp.default)
def _logsumexp(x: Any, dim: Any, keepdim: bool = False) -> Any:
    jax, _, _ = _jax()
    return jax.nn.logsumexp(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@rule(aten.all.default, aten._is_all_true.default)
def _all(x: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.all(x)


@rule(aten.any.default, aten._is_any_true.default)
def _any(x: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.any(x)


@rule(aten.all.dim)
def _all_dim(x: Any, dim: int, keepdim: bool = False) -> Any:
    _, jnp, _ = _jax()
    return jnp.all(x, axis=_dim(dim, x.ndim), keepdims=keepdim)


# --- linear algebra (full float precision: XLA's CPU default already is)


@rule(aten.mm.default, aten.bmm.default, aten.mv.default, aten.matmul.default, aten.dot.default)
def _matmul(a: Any, b: Any) -> Any:
    _, jnp, lax = _jax()
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


@rule(aten.addmm.default)
def _addmm(bias: Any, a: Any, b: Any, beta: float = 1, alpha: float = 1) -> Any:
    _, jnp, lax = _jax()
    prod = jnp.matmul(a, b, precision=lax.Precision.HIGHEST)
    return (bias if beta == 1 else bias * beta) + (prod if alpha == 1 else prod * alpha)


# --- views and layout (XLA values have no strides: a view is its values)


@rule(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def _reshape(x: Any, shape: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.reshape(x, tuple(shape))


@rule(aten.transpose.int)
def _transpose(x: Any, d0: int, d1: int) -> Any:
    _, jnp, _ = _jax()
    return jnp.swapaxes(x, _dim(d0, x.ndim), _dim(d1, x.ndim)) if x.ndim else x


@rule(aten.t.default)
def _t(x: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.transpose(x) if x.ndim == 2 else x


@rule(aten.permute.default)
def _permute(x: Any, dims: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.transpose(x, _dims(dims, x.ndim))


@rule(aten.expand.default)
def _expand(x: Any, size: Any, implicit: bool = False) -> Any:
    _, jnp, _ = _jax()
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@rule(aten.unsqueeze.default)
def _unsqueeze(x: Any, dim: int) -> Any:
    _, jnp, _ = _jax()
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@rule(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(x: Any, dims: Any = None) -> Any:
    _, jnp, _ = _jax()
    axes = tuple(d for d in _dims(dims, x.ndim) if x.ndim and x.shape[d] == 1)
    return jnp.squeeze(x, axes) if axes else x


def _slice_bounds(size: int, start: Any, end: Any) -> tuple[int, int]:
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end


@rule(aten.slice.Tensor)
def _slice(x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    _, _, lax = _jax()
    dim = _dim(dim, x.ndim)
    start, end = _slice_bounds(x.shape[dim], start, end)
    return lax.slice_in_dim(x, start, end, step, axis=dim)


@rule(aten.select.int)
def _select(x: Any, dim: int, index: int) -> Any:
    _, _, lax = _jax()
    dim = _dim(dim, x.ndim)
    return lax.index_in_dim(x, index % x.shape[dim], axis=dim, keepdims=False)


@rule(aten.slice_backward.default)
def _slice_backward(grad: Any, sizes: Any, dim: int, start: int, end: int, step: int) -> Any:
    _, jnp, _ = _jax()
    dim = _dim(dim, len(sizes))
    start, end = _slice_bounds(sizes[dim], start, end)
    index = [slice(None)] * len(sizes)
    index[dim] = slice(start, end, step)
    return jnp.zeros(tuple(sizes), grad.dtype).at[tuple(index)].set(grad)


@rule(aten.select_backward.default)
def _select_backward(grad: Any, sizes: Any, dim: int, index: int) -> Any:
    _, jnp, _ = _jax()
    dim = _dim(dim, len(sizes))
    at = [slice(None)] * len(sizes)
    at[dim] = index % sizes[dim]
    return jnp.zeros(tuple(sizes), grad.dtype).at[tuple(at)].set(grad)


@rule(aten.cat.default)
def _cat(tensors: Any, dim: int = 0) -> Any:
    _, jnp, _ = _jax()
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]  # torch skips empty 1-d inputs
    return jnp.concatenate(tensors, axis=_dim(dim, tensors[0].ndim))


@rule(aten.stack.default)
def _stack(tensors: Any, dim: int = 0) -> Any:
    _, jnp, _ = _jax()
    return jnp.stack(tensors, axis=dim % (tensors[0].ndim + 1))


@rule(aten.clone.default, aten.detach.default, aten.alias.default, aten.lift_fresh.default,
      aten.contiguous.default)
def _identity(x: Any, **_: Any) -> Any:
    return x


@rule(aten._to_copy.default)
def _to_copy(x: Any, dtype: Any = None, **_: Any) -> Any:
    return x if dtype is None else x.astype(np_dtype(dtype))


@rule(aten.copy.default)
def _copy(x: Any, src: Any, non_blocking: bool = False) -> Any:
    _, jnp, _ = _jax()
    return jnp.broadcast_to(src.astype(x.dtype), x.shape)


# --- factories (their dtype and shape come from the node's recorded value)


@rule(aten.new_empty.default, aten.new_zeros.default, aten.zeros.default, aten.empty.memory_format)
def _zeros(*args: Any, **kwargs: Any) -> Any:
    return _Factory(0)


@rule(aten.new_ones.default, aten.ones.default)
def _ones(*args: Any, **kwargs: Any) -> Any:
    return _Factory(1)


@rule(aten.full.default)
def _full(size: Any, value: Any, **_: Any) -> Any:
    return _Factory(value)


@rule(aten.new_full.default)
def _new_full(x: Any, size: Any, value: Any, **_: Any) -> Any:
    return _Factory(value)


@rule(aten.zeros_like.default, aten.empty_like.default)
def _zeros_like(x: Any, **_: Any) -> Any:
    return _Factory(0)


@rule(aten.ones_like.default)
def _ones_like(x: Any, **_: Any) -> Any:
    return _Factory(1)


@rule(aten.fill.Scalar)
def _fill(x: Any, value: Any) -> Any:
    return _Factory(value)


@rule(aten.fill.Tensor)
def _fill_tensor(x: Any, value: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.broadcast_to(value.astype(x.dtype), x.shape)


@rule(aten.full_like.default)
def _full_like(x: Any, value: Any, **_: Any) -> Any:
    return _Factory(value)


@rule(aten.scalar_tensor.default)
def _scalar_tensor(value: Any, **_: Any) -> Any:
    return _Factory(value)


class _Value:
    """A tensor's shape and dtype as `observe` recorded them."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: tuple, dtype: torch.dtype) -> None:
        self.shape, self.dtype = shape, dtype


class _Factory:
    """A filled tensor whose shape and dtype `lower` takes from the node's recorded value."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


# --- the backward formulas autograd records (torch's derivatives.yaml, written out)


@rule(aten.threshold_backward.default)
def _threshold_backward(grad: Any, x: Any, threshold: float) -> Any:
    _, jnp, _ = _jax()
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@rule(aten.tanh_backward.default)
def _tanh_backward(grad: Any, y: Any) -> Any:
    return grad * (1 - y * y)


@rule(aten.sigmoid_backward.default)
def _sigmoid_backward(grad: Any, y: Any) -> Any:
    return grad * ((1 - y) * y)


@rule(aten.softplus_backward.default)
def _softplus_backward(grad: Any, x: Any, beta: float, threshold: float) -> Any:
    _, jnp, _ = _jax()
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, grad, grad * z / (z + 1))


@rule(aten._softmax.default)
def _softmax(x: Any, dim: int, half_to_float: bool) -> Any:
    jax, _, _ = _jax()
    return jax.nn.softmax(x, axis=_dim(dim, x.ndim))


@rule(aten._log_softmax.default)
def _log_softmax(x: Any, dim: int, half_to_float: bool) -> Any:
    jax, _, _ = _jax()
    return jax.nn.log_softmax(x, axis=_dim(dim, x.ndim))


@rule(aten._softmax_backward_data.default)
def _softmax_backward(grad: Any, y: Any, dim: int, input_dtype: Any) -> Any:
    _, jnp, _ = _jax()
    d = _dim(dim, y.ndim)
    return y * (grad - jnp.sum(grad * y, axis=d, keepdims=True))


@rule(aten._log_softmax_backward_data.default)
def _log_softmax_backward(grad: Any, y: Any, dim: int, input_dtype: Any) -> Any:
    _, jnp, _ = _jax()
    d = _dim(dim, y.ndim)
    return grad - jnp.exp(y) * jnp.sum(grad, axis=d, keepdims=True)


@rule(aten.native_layer_norm.default)
def _layer_norm(x: Any, shape: Any, weight: Any, bias: Any, eps: float) -> Any:
    _, jnp, lax = _jax()
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


@rule(aten.native_layer_norm_backward.default)
def _layer_norm_backward(grad: Any, x: Any, shape: Any, mean: Any, rstd: Any, weight: Any, bias: Any,
                         mask: Any) -> Any:
    _, jnp, _ = _jax()
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    lead = tuple(range(x.ndim - len(shape)))
    n = math.prod(shape)
    xhat = (x - mean) * rstd
    g = grad if weight is None else grad * weight
    dx = rstd * (g - jnp.sum(g, axis=axes, keepdims=True) / n
                 - xhat * jnp.sum(g * xhat, axis=axes, keepdims=True) / n)
    dw = None if weight is None or not mask[1] else jnp.sum(grad * xhat, axis=lead)
    db = None if bias is None or not mask[2] else jnp.sum(grad, axis=lead)
    return (dx if mask[0] else None), dw, db


@rule(aten.nll_loss_forward.default)
def _nll_loss(x: Any, target: Any, weight: Any, reduction: int, ignore_index: int) -> Any:
    _, jnp, _ = _jax()
    if weight is not None:
        raise Unlowerable("nll_loss with class weights")
    batched = x.ndim == 2
    xs = x if batched else x[None]
    ts = target if batched else target[None]
    keep = ts != ignore_index
    safe = jnp.where(keep, ts, 0)
    picked = -jnp.take_along_axis(xs, safe[:, None], axis=1)[:, 0]
    picked = jnp.where(keep, picked, jnp.zeros((), x.dtype))
    total = jnp.sum(keep).astype(x.dtype)
    if reduction == 0:
        return (picked if batched else picked[0]), jnp.zeros((), x.dtype)
    if reduction == 1:
        return jnp.sum(picked) / total, total
    return jnp.sum(picked), total


@rule(aten.nll_loss_backward.default)
def _nll_loss_backward(grad: Any, x: Any, target: Any, weight: Any, reduction: int, ignore_index: int,
                       total_weight: Any) -> Any:
    _, jnp, _ = _jax()
    if weight is not None:
        raise Unlowerable("nll_loss with class weights")
    batched = x.ndim == 2
    ts = target if batched else target[None]
    keep = ts != ignore_index
    g = grad if reduction == 0 else jnp.broadcast_to(grad, ts.shape)
    if reduction == 1:
        g = g / total_weight
    g = jnp.where(keep, -g, jnp.zeros((), x.dtype))
    n, c = (x.shape[0], x.shape[1]) if batched else (1, x.shape[0])
    onehot = jnp.arange(c)[None, :] == jnp.where(keep, ts, 0)[:, None]
    out = jnp.where(onehot, g[:, None], jnp.zeros((), x.dtype))
    return out if batched else out[0]


@rule(aten.convolution.default)
def _convolution(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any, transposed: bool,
                 output_padding: Any, groups: int) -> Any:
    _, _, lax = _jax()
    if transposed:
        raise Unlowerable("a transposed convolution")
    nd = x.ndim - 2
    spatial = "DHW"[-nd:] if nd <= 3 else None
    if spatial is None:
        raise Unlowerable(f"a {nd}-d convolution")
    dn = ("NC" + spatial, "OI" + spatial, "NC" + spatial)
    out = lax.conv_general_dilated(x, w, tuple(stride), [(p, p) for p in padding], rhs_dilation=tuple(dilation),
                                   dimension_numbers=dn, feature_group_count=groups,
                                   precision=lax.Precision.HIGHEST)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * nd)
    return out


@rule(aten.convolution_backward.default)
def _convolution_backward(grad: Any, x: Any, w: Any, bias_sizes: Any, stride: Any, padding: Any, dilation: Any,
                          transposed: bool, output_padding: Any, groups: int, mask: Any) -> Any:
    jax, jnp, _ = _jax()
    dx = dw = None
    if mask[0] or (mask[1] and groups == 1):
        _, pullback = jax.vjp(lambda a, b: _convolution(a, b, None, stride, padding, dilation, transposed,
                                                        output_padding, groups), x, w)
        dx, dw = pullback(grad)
    if mask[1] and groups > 1:
        dw = _grouped_weight_grad(grad, x, w.shape, stride, padding, dilation, groups)
    db = jnp.sum(grad, axis=(0,) + tuple(range(2, grad.ndim))) if mask[2] else None
    return (dx if mask[0] else None), (dw if mask[1] else None), db


def _grouped_weight_grad(grad: Any, x: Any, w_shape: Any, stride: Any, padding: Any, dilation: Any,
                         groups: int) -> Any:
    """A grouped convolution's weight gradient as one contraction over strided slices of the input.

    The transpose of a grouped convolution with respect to its weight is a convolution with a
    batch group count, which XLA's CPU backend runs densely, one group at a time (two orders of
    magnitude slower at the group counts a vmapped per-sample weight gradient makes); the same sum
    written as an einsum over the kernel's offsets is an ordinary batched matrix product.
    """
    _, jnp, lax = _jax()
    n, c = x.shape[:2]
    out_sizes = grad.shape[2:]
    kernel = tuple(w_shape[2:])
    xp = jnp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    cols = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        start = [0, 0] + [o * d for o, d in zip(offset, dilation)]
        limit = [n, c] + [s + st * (m - 1) + 1 for s, st, m in zip(start[2:], stride, out_sizes)]
        cols.append(lax.slice(xp, start, limit, [1, 1] + list(stride)))
    patches = jnp.stack(cols, axis=2).reshape((n, groups, c // groups, len(cols), -1))
    g = grad.reshape((n, groups, grad.shape[1] // groups, -1))
    dw = jnp.einsum("ngot,ngikt->goik", g, patches, precision=lax.Precision.HIGHEST)
    return dw.reshape(tuple(w_shape))


# --- pooling


def _two(v: Any, default: Any = None) -> tuple[int, int]:
    """A 2-d pooling argument as (height, width): one number for both, or a pair (`default` where
    it is empty: max_pool2d's stride defaults to its kernel)."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return v, v
    if len(v) == 1:
        return int(v[0]), int(v[0])
    return int(v[0]), int(v[1])


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """Output length of a pooling window along one axis: torch's pooling_output_shape."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


@rule(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                             ceil_mode: bool = False) -> Any:
    """The window maxima and their flat indices into each input plane, as torch's CPU kernel picks
    them: the window read row by row, a value taken where it is greater than the maximum so far
    or NaN (so the first of equal maxima, the last NaN), starting from -inf at the window's first
    element inside the input. One strided slice per window element: pooling windows are small."""
    import numpy as np

    _, jnp, lax = _jax()
    if x.ndim not in (3, 4):
        raise Unlowerable(f"a {x.ndim}-d input to max_pool2d")
    (kh, kw), (ph, pw), (dh, dw) = _two(kernel_size), _two(padding), _two(dilation)
    sh, sw = _two(stride, kernel_size)
    height, width = x.shape[-2:]
    oh, ow = _pool_out(height, kh, sh, ph, dh, ceil_mode), _pool_out(width, kw, sw, pw, dw, ceil_mode)
    rows, cols = np.arange(oh) * sh - ph, np.arange(ow) * sw - pw  # each window's corner, input coordinates
    below = max(0, int(rows[-1]) + (kh - 1) * dh - (height - 1))
    right = max(0, int(cols[-1]) + (kw - 1) * dw - (width - 1))
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(ph, below), (pw, right)])
    lead = tuple(x.shape[:-2])

    def first_inside(corners: Any, d: int) -> Any:
        return corners + np.maximum(0, -(corners // d)) * d  # a window starting in the padding skips whole steps

    index = jnp.asarray(np.add.outer(first_inside(rows, dh) * width, first_inside(cols, dw)))
    best = jnp.full(lead + (oh, ow), -jnp.inf, x.dtype)
    index = jnp.broadcast_to(index, lead + (oh, ow))
    for i in range(kh):
        r = rows + i * dh
        inside_r = (r >= 0) & (r < height)
        for j in range(kw):
            c = cols + j * dw
            inside = np.outer(inside_r, (c >= 0) & (c < width))
            if not inside.any():
                continue
            start = (0,) * len(lead) + (i * dh, j * dw)
            limit = lead + (i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1)
            v = lax.slice(padded, start, limit, (1,) * len(lead) + (sh, sw))
            take = (v > best) | jnp.isnan(v)
            if not inside.all():
                take = take & jnp.asarray(inside)
            best = jnp.where(take, v, best)
            index = jnp.where(take, jnp.asarray(np.add.outer(r * width, c)), index)
    return best, index


@rule(aten.max_pool2d.default)
def _max_pool2d(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                ceil_mode: bool = False) -> Any:
    return _max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)[0]


@rule(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_with_indices_backward(grad: Any, x: Any, kernel_size: Any, stride: Any, padding: Any,
                                      dilation: Any, ceil_mode: bool, indices: Any) -> Any:
    """Each output's gradient added at its maximum's index (the forward's, as torch's kernel does)."""
    _, jnp, _ = _jax()
    planes = math.prod(x.shape[:-2])
    g, at = grad.reshape(planes, -1), indices.reshape(planes, -1)
    out = jnp.zeros((planes, x.shape[-2] * x.shape[-1]), grad.dtype)
    return out.at[jnp.arange(planes)[:, None], at].add(g).reshape(x.shape)


# --- indexing


def _index_tuple(x: Any, indices: Any) -> tuple:
    return tuple(slice(None) if i is None else i for i in indices)


@rule(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(x: Any, indices: Any) -> Any:
    return x[_index_tuple(x, indices)]


@rule(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(x: Any, indices: Any, values: Any, accumulate: bool = False) -> Any:
    at = x.at[_index_tuple(x, indices)]
    return at.add(values) if accumulate else at.set(values)


@rule(aten.gather.default)
def _gather(x: Any, dim: int, index: Any, sparse_grad: bool = False) -> Any:
    _, jnp, _ = _jax()
    return jnp.take_along_axis(x, index, axis=_dim(dim, x.ndim))


@rule(aten.scatter_add.default)
def _scatter_add(x: Any, dim: int, index: Any, src: Any) -> Any:
    _, jnp, _ = _jax()
    dim = _dim(dim, x.ndim)
    grid = jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij")
    grid[dim] = index
    return x.at[tuple(grid)].add(src[tuple(slice(0, n) for n in index.shape)])


@rule(aten.index_select.default)
def _index_select(x: Any, dim: int, index: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.take(x, index, axis=_dim(dim, x.ndim))


@rule(aten.embedding.default)
def _embedding(weight: Any, indices: Any, padding_idx: int = -1, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> Any:
    _, jnp, _ = _jax()
    return jnp.take(weight, indices, axis=0)


@rule(aten.embedding_dense_backward.default)
def _embedding_backward(grad: Any, indices: Any, num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> Any:
    _, jnp, _ = _jax()
    if scale_grad_by_freq:
        raise Unlowerable("embedding's scale_grad_by_freq")
    flat = indices.reshape(-1)
    g = grad.reshape((flat.shape[0], grad.shape[-1]))
    if padding_idx >= 0:
        g = jnp.where((flat == padding_idx)[:, None], jnp.zeros((), g.dtype), g)
    return jnp.zeros((num_weights, grad.shape[-1]), grad.dtype).at[flat].add(g)


@rule(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(x: Any, mask: Any, value: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.where(mask, jnp.asarray(value, x.dtype), x)


@rule(aten.diagonal.default)
def _diagonal(x: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    _, jnp, _ = _jax()
    return jnp.diagonal(x, offset, _dim(dim1, x.ndim), _dim(dim2, x.ndim))


@rule(aten.tril.default)
def _tril(x: Any, diagonal: int = 0) -> Any:
    _, jnp, _ = _jax()
    return jnp.tril(x, diagonal)


@rule(aten.triu.default)
def _triu(x: Any, diagonal: int = 0) -> Any:
    _, jnp, _ = _jax()
    return jnp.triu(x, diagonal)


@rule(aten.cumsum.default)
def _cumsum(x: Any, dim: int, dtype: Any = None) -> Any:
    _, jnp, _ = _jax()
    return jnp.cumsum(x, axis=_dim(dim, x.ndim), dtype=None if dtype is None else np_dtype(dtype))


@rule(aten.max.dim)
def _max_dim(x: Any, dim: int, keepdim: bool = False) -> Any:
    _, jnp, _ = _jax()
    d = _dim(dim, x.ndim)
    return jnp.max(x, axis=d, keepdims=keepdim), jnp.argmax(x, axis=d, keepdims=keepdim)


@rule(aten.argmax.default)
def _argmax(x: Any, dim: Any = None, keepdim: bool = False) -> Any:
    _, jnp, _ = _jax()
    return jnp.argmax(x, axis=None if dim is None else _dim(dim, x.ndim), keepdims=keepdim)


# --- more pointwise functions and their derivatives


@rule(aten.gelu.default)
def _gelu(x: Any, approximate: str = "none") -> Any:
    jax, _, _ = _jax()
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@rule(aten.gelu_backward.default)
def _gelu_backward(grad: Any, x: Any, approximate: str = "none") -> Any:
    jax, _, _ = _jax()
    _, pullback = jax.vjp(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), x)
    return pullback(grad)[0]


@rule(aten.silu.default)
def _silu(x: Any) -> Any:
    jax, _, _ = _jax()
    return x * jax.nn.sigmoid(x)


@rule(aten.silu_backward.default)
def _silu_backward(grad: Any, x: Any) -> Any:
    jax, _, _ = _jax()
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@rule(aten.elu.default)
def _elu(x: Any, alpha: float = 1, scale: float = 1, input_scale: float = 1) -> Any:
    _, jnp, _ = _jax()
    return jnp.where(x > 0, x * scale, (jnp.exp(x * input_scale) - 1) * alpha * scale)


@rule(aten.leaky_relu.default)
def _leaky_relu(x: Any, slope: float = 0.01) -> Any:
    _, jnp, _ = _jax()
    return jnp.where(x > 0, x, x * slope)


@rule(aten.leaky_relu_backward.default)
def _leaky_relu_backward(grad: Any, x: Any, slope: float, self_is_result: bool) -> Any:
    _, jnp, _ = _jax()
    return jnp.where(x > 0, grad, grad * slope)


@rule(aten.hardtanh.default)
def _hardtanh(x: Any, lo: float = -1, hi: float = 1) -> Any:
    _, jnp, _ = _jax()
    return jnp.clip(x, lo, hi)


@rule(aten.hardtanh_backward.default)
def _hardtanh_backward(grad: Any, x: Any, lo: float, hi: float) -> Any:
    _, jnp, _ = _jax()
    return jnp.where((x <= lo) | (x >= hi), jnp.zeros((), grad.dtype), grad)


@rule(aten.xlogy.Tensor)
def _xlogy(x: Any, y: Any) -> Any:
    jax, _, _ = _jax()
    return jax.scipy.special.xlogy(x, y)


@rule(aten.remainder.Tensor, aten.remainder.Scalar)
def _remainder(a: Any, b: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.remainder(a, b)


@rule(aten.atan2.default)
def _atan2(a: Any, b: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.arctan2(a, b)


@rule(aten.mse_loss.default)
def _mse_loss(x: Any, target: Any, reduction: int = 1) -> Any:
    _, jnp, _ = _jax()
    d = jnp.square(x - target)
    return d if reduction == 0 else (jnp.mean(d) if reduction == 1 else jnp.sum(d))


@rule(aten.mse_loss_backward.default)
def _mse_loss_backward(grad: Any, x: Any, target: Any, reduction: int) -> Any:
    scale = 2.0 / math.prod(x.shape) if reduction == 1 else 2.0
    return grad * scale * (x - target)


# ------------------------------------------------------------------------------------------------
# graphs


def _unwrap(node: torch.fx.Node) -> tuple[Any, tuple, dict]:
    """The op a node calls and its arguments (a grad-mode-pinned kernel, engine.trace's
    `_in_grad_mode(op, mode, *args)`, is the op itself: XLA has no grad mode)."""
    target, args = node.target, node.args
    if getattr(target, "__name__", None) == "_in_grad_mode" and getattr(target, "__module__", "") == "engine.trace":
        target, args = args[0], args[2:]
    return target, args, dict(node.kwargs)


def lowerable(gm: torch.fx.GraphModule) -> str | None:
    """None when every op of `gm` has a rule, else the first op that has none (by name)."""
    for node in gm.graph.nodes:
        if node.op == "call_function":
            target, _, _ = _unwrap(node)
            if target is operator.getitem:
                continue
            if target not in RULES:
                return str(target)
        elif node.op not in ("placeholder", "output"):
            return f"a {node.op} node"
    return None


def observe(gm: torch.fx.GraphModule, inputs: list) -> tuple[dict, Any]:
    """Every node's (shape, dtype) from one run of the graph on `inputs`, and its outputs."""
    meta: dict = {}

    class Watch(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            value = super().run_node(n)
            meta[n.name] = _describe(value)
            return value

    with torch.no_grad():
        outs = Watch(gm).run(*inputs)
    return meta, outs


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _Value(tuple(value.shape), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_describe(v) for v in value)
    return None


class Broadcast:
    """A value known to be `compact` broadcast to `shape`: the same rank, each dim of `compact`
    either `shape`'s or 1. Batching rules and torch.distributions' broadcast_all expand small
    tensors before elementwise work; `lower` keeps such a value compact through elementwise ops
    (each output element is the op of the inputs' elements at its index, whatever the layout),
    so an expensive op (lgamma, digamma, exp) runs once per distinct element rather than once per
    element of the expanded shape, and broadcasts it only where another op needs it whole."""

    __slots__ = ("compact", "shape")

    def __init__(self, compact: Any, shape: tuple) -> None:
        self.compact, self.shape = compact, shape

    def whole(self) -> Any:
        _, jnp, _ = _jax()
        return jnp.broadcast_to(self.compact, self.shape)


def _overloads(*names: str) -> frozenset:
    """Every overload of the named aten ops that has a rule."""
    return frozenset(op for name in names for op in (getattr(getattr(aten, name), o) for o in getattr(aten, name).overloads())
                     if op in RULES)


# Ops whose every output element is a function of the inputs' elements at its index alone (the
# rest of their arguments scalars): computed on Broadcast values' compact arrays.
ELEMENTWISE = _overloads(
    "exp", "log", "log1p", "expm1", "sqrt", "tanh", "sin", "cos", "abs", "neg", "floor", "ceil", "logical_not",
    "isnan", "isinf", "exp2", "log2", "reciprocal", "square", "log10", "tan", "asin", "acos", "atan", "sinh",
    "cosh", "trunc", "round", "sign", "sgn", "rsqrt", "sigmoid", "relu", "erf", "lgamma", "digamma", "softplus",
    "add", "sub", "rsub", "mul", "div", "pow", "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "where",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "threshold_backward", "tanh_backward",
    "sigmoid_backward", "softplus_backward", "gelu", "gelu_backward", "silu", "silu_backward", "elu",
    "leaky_relu", "leaky_relu_backward", "hardtanh", "hardtanh_backward", "xlogy", "remainder", "atan2",
    "clone", "alias", "detach",
)
# Reductions of a whole tensor to one truth value: the same over a Broadcast's compact array,
# where the broadcast shape is not empty.
WHOLE_TRUTH = frozenset({aten.all.default, aten._is_all_true.default, aten.any.default, aten._is_any_true.default})
# Elementwise ops whose every element costs a transcendental function. XLA's CPU fusion copies an
# elementwise producer, with the chain that feeds it, into each consumer's fusion; where one
# consumer is a check (a comparison reduced to one truth value: torch.distributions' argument
# checks, read beside the gradient's formulas of the same rates), the whole chain is computed
# twice. Such a value of at least SHARED_ELEMENTS elements is computed once, behind an
# optimization barrier, and read from memory by each consumer.
TRANSCENDENTAL = _overloads(
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "sigmoid", "erf", "lgamma", "digamma",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "softplus", "gelu", "silu", "elu",
    "xlogy",
)
SHARED_ELEMENTS = 1024
COMPARISONS = _overloads("eq", "ne", "lt", "le", "gt", "ge")


def _checked(gm: torch.fx.GraphModule) -> set:
    """The transcendental nodes read by a check and by something else (see TRANSCENDENTAL)."""
    checked = set()
    for node in gm.graph.nodes:
        if (node.op == "call_function" and _unwrap(node)[0] in COMPARISONS and node.users
                and all(_unwrap(u)[0] in WHOLE_TRUTH for u in node.users if u.op == "call_function")):
            checked.update(a for a in node.args if isinstance(a, torch.fx.Node) and len(a.users) > 1
                           and a.op == "call_function" and _unwrap(a)[0] in TRANSCENDENTAL)
    return checked


def lower(gm: torch.fx.GraphModule, meta: dict) -> Callable[..., tuple]:
    """A function of jax arrays (one per placeholder, in order; a placeholder may be passed as a
    Broadcast) computing `gm`'s outputs, as a tuple. Raises Unlowerable for an op without a rule,
    and while JAX traces it, for a value whose shape differs from the one recorded in `meta`
    (see `observe`)."""
    missing = lowerable(gm)
    if missing is not None:
        raise Unlowerable(f"the XLA backend has no rule for {missing}")
    nodes = list(gm.graph.nodes)
    checked = _checked(gm)

    def run(*args: Any) -> tuple:
        env: dict = {}
        it = iter(args)

        def value(x: Any) -> Any:
            if isinstance(x, torch.fx.Node):
                v = env[x]
                return v.whole() if isinstance(v, Broadcast) else v
            if isinstance(x, (list, tuple)):
                return type(x)(value(y) for y in x)
            if isinstance(x, dict):
                return {k: value(v) for k, v in x.items()}
            return x

        for node in nodes:
            if node.op == "placeholder":
                env[node] = next(it)
            elif node.op == "output":
                out = value(node.args[0])
                return tuple(out) if isinstance(out, (list, tuple)) else (out,)
            else:
                target, args_, kwargs = _unwrap(node)
                lazy = any(isinstance(env.get(a), Broadcast) for a in args_ if isinstance(a, torch.fx.Node))
                recorded = meta.get(node.name)
                if target is operator.getitem:
                    result = operator.getitem(*value(args_))
                elif target is aten.expand.default and isinstance(recorded, _Value):
                    result = _broadcast(_compact(env[args_[0]]), recorded)
                elif lazy and target in ELEMENTWISE and isinstance(recorded, _Value):
                    result = _broadcast(RULES[target](*_compact_operands(args_, env, recorded.shape), **value(kwargs)),
                                        recorded)
                elif target in ALL_TRUE and (bound := _bound_check(args_[0], env)) is not None:
                    result = bound
                elif lazy and target in WHOLE_TRUTH and len(args_) == 1 and _elements(env[args_[0]]):
                    result = RULES[target](_compact(env[args_[0]]))
                else:
                    result = RULES[target](*value(args_), **value(kwargs))
                env[node] = result if isinstance(result, Broadcast) else _conform(result, recorded, node)
                if node in checked:
                    env[node] = _computed_once(env[node])
        raise Unlowerable("the graph has no output node")

    return run


ALL_TRUE = frozenset({aten.all.default, aten._is_all_true.default})
# A bound on every element, `all(x >= s)`, is the bound on the elements' extreme, `min(x) >= s`:
# one reduction of the values, which XLA vectorizes and fuses with their producer, where a truth
# reduction of the comparison is split into reduce-windows of predicates. NaN agrees (an extreme
# over a NaN is NaN), and an empty tensor keeps the truth reduction (it has no extreme).
# comparison -> (the extreme of its left operand, the one of its right)
_EXTREMES = {"ge": ("min", "max"), "gt": ("min", "max"), "le": ("max", "min"), "lt": ("max", "min")}


def _bound_check(node: Any, env: dict) -> Any:
    """`all(node)` as one comparison of an extreme, where `node` compares a non-empty tensor with a
    number or a one-element value and nothing else reads it; else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or len(node.users) != 1:
        return None
    target, args_, kwargs = _unwrap(node)
    name = getattr(getattr(target, "overloadpacket", None), "__name__", None)
    if name not in _EXTREMES or kwargs or len(args_) != 2:
        return None
    _, jnp, _ = _jax()
    a, b = (env[x] if isinstance(x, torch.fx.Node) else x for x in args_)
    compare = getattr(operator, name)
    if _one(b) and _elements(a):
        return compare(getattr(jnp, _EXTREMES[name][0])(_compact(a)), _scalar(_compact(b)))
    if _one(a) and _elements(b):
        return compare(_scalar(_compact(a)), getattr(jnp, _EXTREMES[name][1])(_compact(b)))
    return None


def _compact(x: Any) -> Any:
    """A Broadcast's compact array, or the value itself."""
    return x.compact if isinstance(x, Broadcast) else x


def _elements(x: Any) -> int:
    """How many elements the value has as the graph sees it (a Broadcast: its shape's); 0 for a number."""
    return math.prod(x.shape) if isinstance(x, Broadcast) or hasattr(x, "shape") else 0


def _one(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) or _elements(x) == 1


def _scalar(x: Any) -> Any:
    _, jnp, _ = _jax()
    return jnp.reshape(x, ()) if hasattr(x, "shape") else x


def _computed_once(value: Any) -> Any:
    """`value` (an array or a Broadcast's compact array) behind an optimization barrier where it
    has SHARED_ELEMENTS elements or more (see TRANSCENDENTAL)."""
    _, _, lax = _jax()
    if isinstance(value, Broadcast):
        compact = value.compact
        return Broadcast(lax.optimization_barrier(compact), value.shape) if compact.size >= SHARED_ELEMENTS else value
    return lax.optimization_barrier(value) if getattr(value, "size", 0) >= SHARED_ELEMENTS else value


def _broadcast(compact: Any, recorded: "_Value") -> Any:
    """`compact` as the recorded value, in its dtype (see `_conform`): itself where it has the
    recorded shape, else a Broadcast of it (raised to that rank with leading dims of 1)."""
    _, jnp, _ = _jax()
    compact, shape = jnp.asarray(compact), recorded.shape
    want = np_dtype(recorded.dtype)
    if compact.dtype != want:
        compact = compact.astype(want)
    if tuple(compact.shape) == tuple(shape):
        return compact
    if compact.ndim < len(shape):
        compact = compact.reshape((1,) * (len(shape) - compact.ndim) + tuple(compact.shape))
    if compact.ndim != len(shape) or any(c not in (1, n) for c, n in zip(compact.shape, shape)):
        raise Unlowerable(f"a value of shape {tuple(compact.shape)} does not broadcast to {tuple(shape)}")
    return Broadcast(compact, tuple(shape))


def _compact_operands(args: tuple, env: dict, shape: tuple) -> list:
    """An elementwise op's arguments on compact arrays: each tensor argument that had the op's
    output shape in torch is given the common shape of the compact ones, so that a rule sees
    operands shaped alike wherever torch's were (its formula may rely on it, jax.vjp does)."""
    _, jnp, _ = _jax()
    seen = []  # per argument: (what the rule gets, its shape in torch where it is a tensor)
    for a in args:
        v = env[a] if isinstance(a, torch.fx.Node) else a
        seen.append((v.compact, v.shape) if isinstance(v, Broadcast)
                    else (v, getattr(v, "shape", None) if isinstance(a, torch.fx.Node) else None))
    common = jnp.broadcast_shapes(*(tuple(v.shape) for v, full in seen if full is not None))
    return [jnp.broadcast_to(v, common) if full is not None and tuple(full) == tuple(shape) and tuple(v.shape) != common
            else v for v, full in seen]


def _conform(result: Any, recorded: Any, node: torch.fx.Node) -> Any:
    """`result` with torch's dtype where JAX's promotion chose another; an error where its shape
    is not the recorded one."""
    if recorded is None:
        return result
    if isinstance(recorded, tuple):
        if not isinstance(result, (tuple, list)) or len(result) != len(recorded):
            raise Unlowerable(f"{node.target}: expected {len(recorded)} results")
        return tuple(_conform(r, m, node) if r is not None else None for r, m in zip(result, recorded))
    shape, dtype = recorded.shape, recorded.dtype
    _, jnp, _ = _jax()
    if isinstance(result, _Factory):
        return jnp.full(shape, result.value, np_dtype(dtype))
    if isinstance(result, (bool, int, float)):
        result = jnp.asarray(result)
    want = np_dtype(dtype)
    if result.dtype != want:
        result = result.astype(want)
    if tuple(result.shape) != shape:
        raise Unlowerable(f"{node.target} gave shape {tuple(result.shape)} where torch gave {shape}")
    return result

