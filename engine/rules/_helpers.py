"""Shared helpers of the rule families: batch dims always live at 0 (see engine._batched)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import torch


def lrank(x: torch.Tensor, d: Any) -> int:
    """Logical rank of an argument given its batch dim (0 or None)."""
    return x.dim() - (d is not None)


def norm_dim(dim: int, rank: int) -> int:
    """Normalize a logical dim (negative allowed); rank-0 tensors accept 0 and -1 like PyTorch."""
    r = max(rank, 1)
    if not -r <= dim < r:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-r}, {r - 1}], but got {dim})")
    return dim + r if dim < 0 else dim


def phys_dim(dim: int, rank: int) -> int:
    """The physical dim of logical `dim` of a batched tensor (batch at 0)."""
    return norm_dim(dim, rank) + 1


def broadcast_shapes(*shapes: Sequence[int]) -> torch.Size:
    """torch.broadcast_shapes by torch's C++ size inference (torch.broadcast_shapes imports the
    symbolic-shapes module, and sympy, at its first call in a process)."""
    out = torch.Size(())
    for shape in shapes:
        out = torch._C._infer_size(out, shape)
    return torch.Size(out)


def pad_batched(x: torch.Tensor, rank: int) -> torch.Tensor:
    """View a batched x (batch at 0) as [B, 1, ..., 1, *logical] with `rank` logical dims."""
    missing = rank - (x.dim() - 1)
    if missing <= 0:
        return x
    return x.view((x.shape[0],) + (1,) * missing + tuple(x.shape[1:]))


def require_matrices(x: torch.Tensor, d: Any, on_one_element: Any) -> None:
    """Raise unless each element of x is at least a matrix. A matrix kernel given a batch of vectors
    ([B, n] physically) would take it for one matrix and answer; `on_one_element()` runs the op on
    one element so the op raises its own error, as it does outside vmap (an empty batch has no
    element: the message below is raised, as every element's call would raise)."""
    if lrank(x, d) >= 2:
        return
    if d is None or x.shape[d] > 0:
        on_one_element()
    raise RuntimeError(f"expected each input to have at least 2 dimensions, got {lrank(x, d)}: this op "
                       f"takes matrices (or batches of them); vmap over a batch of matrices instead")


def leading_dims_flat(x: torch.Tensor, keep: int = 2) -> torch.Tensor:
    """x, or a contiguous copy of it when its leading dims (all but the last `keep`) cannot be merged
    by a view. Kernels that treat every leading dim as a batch dim (matrix_exp, the linalg family)
    `view` them into one; a batch dim that is physically innermost (an input stacked at dim -1 and
    moved to 0) makes that view fail where the same op on each element works."""
    if x.dim() <= keep + 1:
        return x
    lead = x.shape[:-keep]
    strides = x.stride()[:-keep]
    for i in range(len(lead) - 1):
        if lead[i] != 1 and lead[i + 1] != 1 and strides[i] != strides[i + 1] * lead[i + 1]:
            return x.contiguous()
    return x


def materialize(x: torch.Tensor, d: Any, size: int) -> torch.Tensor:
    """A batched view of x: unbatched arguments are expanded along a new dim 0."""
    if d is not None:
        return x
    return x.unsqueeze(0).expand((size,) + tuple(x.shape))


def batch_size(args: Sequence[Any], dims: Sequence[Any]) -> int:
    for a, d in zip(args, dims):
        if d == 0:
            return a.shape[0]
        if isinstance(d, list):
            for b, e in zip(a, d):
                if e == 0:
                    return b.shape[0]
    raise AssertionError("rule called without a batched argument")


def out_dims_like(out: Any, d: Any = 0) -> Any:
    if isinstance(out, (tuple, list)):
        return tuple(None if o is None else d for o in out)
    return d


def ops_of(*names: str) -> list[Any]:
    """aten OpOverloads from 'name.overload' strings, skipping those this torch build lacks."""
    found = []
    for n in names:
        base, _, overload = n.partition(".")
        packet = getattr(torch.ops.aten, base, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None:
            found.append(op)
    return found


_NO_BINDING = object()
_BINDINGS: dict[Any, Any] = {}


def python_binding(func: Any) -> Any:
    """The Python binding (`torch.sin`, `Tensor.mul_`) that runs the aten OpOverload `func` when called
    with the op's positional arguments and no keyword arguments, or None.

    Inside `__torch_dispatch__`, `OpOverload.__call__` (even its `_op`) parses the arguments against
    the schema in a slower boxed path; the binding's argument parser is faster per call (issue
    #18). It is the same op only when a call passes exactly the schema's positional arguments, so it
    is given only for ops none of whose positional arguments has a default (every call from the
    dispatcher then passes all of them, and the binding resolves them to an overload of the same name:
    for the pointwise ops it is used for, overloads of one name differ only in whether an operand is
    a Tensor or a Scalar, which the parser picks from the operand itself); in-place ops (`name_`)
    use the Tensor method. Only C bindings are taken (torch._C), never Python wrappers.
    """
    found = _BINDINGS.get(func, _NO_BINDING)
    if found is not _NO_BINDING:
        return found
    binding = None
    schema = getattr(func, "_schema", None)
    if schema is not None and func.namespace == "aten":
        positional = [a for a in schema.arguments if not a.kwarg_only]
        if positional and all(not a.has_default_value() for a in positional):
            name = schema.name.partition("::")[2]
            if name.endswith("_"):
                binding = getattr(torch._C.TensorBase, name, None)
            else:
                binding = getattr(torch._C._VariableFunctions, name, None) or getattr(torch._C._nn, name, None)
            if binding is not None and not callable(binding):
                binding = None
    _BINDINGS[func] = binding
    return binding


@lru_cache(maxsize=None)
def dim_binding(func: Any) -> Any:
    """The Python binding (`torch.mean`, `torch.cumsum`) that runs the aten op `func` when called as
    `binding(x, dim, *rest)`: `func`'s first argument a tensor, `dim` (an int or an int list) its
    second, `rest` the other positional arguments the dispatcher passed, none a tensor, and no
    keyword arguments; None when the op has no such binding or returns anything but one tensor.

    Unlike `python_binding` it allows positional arguments with defaults (a reduction's `keepdim`):
    the dispatcher then leaves a trailing default out, and the binding fills in the same one. That
    the binding resolves to `func` itself and not a sibling overload is checked for every op that
    gets one by tests/test_hot_path.py, which records the op the binding dispatches. Inside
    `__torch_dispatch__` the binding is cheaper than `OpOverload._op` (issue #18).
    """
    binding = None
    schema = func._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if (func.namespace == "aten" and len(positional) >= 2 and positional[1].name in ("dim", "dims")
            and len(schema.returns) == 1 and str(schema.returns[0].type) == "Tensor"
            and not schema.is_mutable and all("Tensor" not in str(a.type) for a in positional[1:])
            # a composite op (var.dim, argsort) decomposes inside its binding: the binding would
            # run a sibling (var.correction, sort), not the op
            and not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")):
        name = schema.name.partition("::")[2]
        binding = getattr(torch._C._VariableFunctions, name, None)
        if binding is not None and not callable(binding):
            binding = None
    return binding


def physical_rule(fn: Any) -> Any:
    """The rule of an op whose one tensor argument is its first, batched at dim 0 whenever the rule
    runs (view and shape ops): `fn(x, *args, **kwargs)` is the physical result, batched at 0.

    The rule keeps `fn` as its `physical`: the dispatch plan (engine._dispatch) calls it directly
    for a call without keyword arguments, skipping the level info, the in_dims list and the
    (output, out_dims) pair a rule builds and returns. A rule built otherwise may carry a
    `physical` of its own that answers NotImplemented for the calls it does not handle, which the
    plan then gives to the rule (engine.rules.reductions)."""

    def rule(info: Any, in_dims: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, int]:
        return fn(x, *args, **kwargs), 0

    rule.physical = fn  # type: ignore[attr-defined]
    rule.__name__ = getattr(fn, "__name__", "rule")
    rule.__doc__ = fn.__doc__
    return rule
