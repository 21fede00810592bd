"""Composite-compliance checker: find the places where a function would break under vmap.

`check_compliance(fn, *args)` runs `fn` on tensors wrapped in a checking subclass that behaves like
the plain tensor but notes every operation that vmap cannot batch: Python-level access to values
(`.item()`, `bool(t)`, `.tolist()`, `.numpy()`, `data_ptr`), `out=` variants, in-place writes into a
tensor that does not derive from the inputs (under vmap it is unbatched, so each batch element
would write into the same memory), and metadata mutation (`resize_`, `set_`, in-place views on
inputs). With `backward=True` (and `double_backward=True`) the gradient computation runs on the
same wrapped tensors, so the ops autograd calls are checked too.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten

_VALUE_OPS = {aten._local_scalar_dense.default: ".item() / float() / int()", aten.is_nonzero.default: "bool(tensor)",
              aten.equal.default: "torch.equal"}
_VALUE_METHODS = {"item", "tolist", "numpy", "data_ptr", "__bool__", "__int__", "__float__", "__index__", "untyped_storage", "storage"}
_METADATA_OPS = {"resize_", "resize_as_", "set_", "as_strided_", "_resize_output_"}


@dataclass
class Issue:
    """One place `fn` would break under vmap."""

    op: str
    kind: str
    hint: str
    where: str = ""
    phase: str = "forward"

    def __str__(self) -> str:
        loc = f" at {self.where}" if self.where else ""
        return f"[{self.phase}] {self.kind}: {self.op}{loc} -> {self.hint}"


@dataclass
class ComplianceReport:
    """What check_compliance found; `ok` is True when nothing would break under vmap."""

    issues: list[Issue] = field(default_factory=list)
    ops_seen: int = 0

    @property
    def ok(self) -> bool:
        return not self.issues

    def __str__(self) -> str:
        if self.ok:
            return f"compliant ({self.ops_seen} ops checked)"
        lines = [f"{len(self.issues)} vmap compliance issue(s) in {self.ops_seen} ops:"]
        lines += [f"  {i}" for i in self.issues]
        return "\n".join(lines)


def _user_frame() -> str:
    """The innermost stack frame outside torch and this module: the line that made the call."""
    for fr in reversed(traceback.extract_stack()[:-2]):
        f = fr.filename.replace("\\", "/")
        if "/torch/" in f or f.endswith("engine/compliance.py") or "/_pytest/" in f:
            continue
        return f"{fr.filename}:{fr.lineno}"
    return ""


class _Checker:
    def __init__(self) -> None:
        self.report = ComplianceReport()
        self.phase = "forward"
        self._seen: set[tuple[str, str, str]] = set()

    def add(self, op: str, kind: str, hint: str) -> None:
        where = _user_frame()
        key = (op, kind, where + self.phase)
        if key in self._seen:
            return
        self._seen.add(key)
        self.report.issues.append(Issue(op, kind, hint, where, self.phase))


_ACTIVE: list[_Checker] = []


class CheckedTensor(torch.Tensor):
    """A tensor that derives from the checked function's inputs (under vmap: a batched tensor)."""

    _elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool = False):
        t = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=elem.device, requires_grad=requires_grad,
        )
        t._elem = elem
        return t

    def __repr__(self) -> str:
        return f"CheckedTensor({self._elem!r})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _VALUE_METHODS and _ACTIVE:
            hint = ("reads the tensor's memory address, which a batched tensor does not have; compare tensors with ops instead"
                    if name in ("data_ptr", "untyped_storage", "storage")
                    else "needs a Python value that differs per batch element; keep it a tensor (torch.where, masking) or move it out of the vmapped function")
            _ACTIVE[-1].add(f"Tensor.{name}", "data-dependent access", hint)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        checker = _ACTIVE[-1] if _ACTIVE else None
        if checker is not None:
            checker.report.ops_seen += 1
            _inspect(checker, func, args, kwargs)
        unwrap = lambda x: x._elem if isinstance(x, CheckedTensor) else x  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        schema = func._schema
        mutated = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
        if mutated and len(schema.returns) == 1 and schema.returns[0].alias_info is not None:
            first = args[mutated[0]] if mutated[0] < len(args) else kwargs.get(schema.arguments[mutated[0]].name)
            if isinstance(first, torch.Tensor):
                return first
        wrap = lambda x: CheckedTensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, CheckedTensor) else x  # noqa: E731
        return tree_map(wrap, out)


def _inspect(checker: _Checker, func: Any, args: tuple, kwargs: dict) -> None:
    name = func.name().split("::")[-1]
    if func in _VALUE_OPS:
        checker.add(name, "data-dependent access", f"{_VALUE_OPS[func]} needs a per-element Python value; use tensor ops (torch.where) instead")
        return
    schema = func._schema
    if any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        checker.add(name, "out= variant", "writes into a preallocated out= tensor of fixed shape; call the functional op and use its result")
        return
    base = schema.name.split("::")[-1]
    if base in _METADATA_OPS or torch.Tag.inplace_view in func.tags:
        target = args[0] if args else None
        if isinstance(target, CheckedTensor) or base in ("set_",):
            checker.add(name, "metadata mutation", "changes shape/strides/storage in place; under vmap the batch dim is hidden, use the out-of-place op (reshape, unsqueeze, ...)")
            return
    positional = list(schema.arguments)
    for i, a in enumerate(positional):
        if a.alias_info is None or not a.alias_info.is_write or a.kwarg_only:
            continue
        target = args[i] if i < len(args) else kwargs.get(a.name)
        if not isinstance(target, torch.Tensor) or isinstance(target, CheckedTensor):
            continue
        if any(isinstance(x, CheckedTensor) for x in tree_flatten((args, kwargs))[0]):
            checker.add(
                name, "in-place write into an unbatched tensor",
                f"argument {a.name!r} does not derive from the inputs (under vmap it is not batched) but receives a value that does; "
                f"use the out-of-place op (x = x.{base.rstrip('_')}(...)) or build the tensor from the inputs (e.g. torch.zeros_like(input))",
            )


def _wrap_inputs(args: tuple, requires_grad: bool) -> tuple:
    def wrap(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, CheckedTensor):
            rg = requires_grad and (x.is_floating_point() or x.is_complex())
            return CheckedTensor(x.detach(), requires_grad=rg)
        return x

    return tree_map(wrap, args)


def check_compliance(fn: Callable, *args: Any, backward: bool = False, double_backward: bool = False) -> ComplianceReport:
    """Run `fn(*args)` under the checking subclass; report every construct vmap cannot batch.

    `backward=True` also checks the vector-Jacobian product of the outputs (what grad/vjp/jacrev run
    inside vmap); `double_backward=True` checks the gradient of that gradient as well (Hessians).
    Errors that `fn` itself raises propagate unchanged.
    """
    checker = _Checker()
    grad_needed = backward or double_backward
    wrapped = _wrap_inputs(args, grad_needed)
    _ACTIVE.append(checker)
    try:
        out = fn(*wrapped)
        if grad_needed:
            inputs = [x for x in tree_flatten(wrapped)[0] if isinstance(x, torch.Tensor) and x.requires_grad]
            outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
            if inputs and outs:
                checker.phase = "backward"
                cots = [CheckedTensor(torch.ones_like(o._elem if isinstance(o, CheckedTensor) else o)) for o in outs]
                grads = torch.autograd.grad(outs, inputs, cots, create_graph=double_backward, allow_unused=True)
                if double_backward:
                    checker.phase = "double-backward"
                    gs = [g for g in grads if g is not None and g.requires_grad]
                    if gs:
                        torch.autograd.grad([g.sum() for g in gs], inputs, allow_unused=True)
    finally:
        _ACTIVE.remove(checker)
    return checker.report
