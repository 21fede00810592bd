"""The replay contract: a replay rounds like its eager call on any CPU.

Two calls of one op round alike only where the kernel walks the same operands the same way, and
which kernel that is depends on the CPU. So the contract is checked on the ops, not on one
machine's bits: `OpLog` records every rounding op a call runs on plain tensors, with what its
operands hold and how they are laid out (sizes, strides, storage offset, dtype, scalars), and
`departures` lists the replay's ops that the eager call never ran on that data that way. Views,
copies, factories and ops with boolean or integer results cannot round, and are not compared.
Where no op departs, the values need only agree within the dtype's tolerance (a kernel may round
the same operands differently from call to call). Graph passes that change the arithmetic on
purpose (engine.graph_passes.ARITHMETIC_PASSES) name themselves on the recorded entry, and such a
replay is held to the tolerance alone, like the fused tier. See docs/design/replay-contract.md.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Hashable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten

from engine._modes import EngineMode, decompose
from engine.graph_passes import _BITS, SCALAR_TWINS, scalar_operand

__all__ = ["Numbering", "OpLog", "departures", "logs"]

aten = torch.ops.aten
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# Ops whose results are their operands' values rearranged or converted exactly, whatever the layout.
_EXACT = frozenset({
    aten.clone.default, aten.copy_.default, aten.copy.default, aten._to_copy.default, aten.detach.default,
    aten.alias.default, aten.lift_fresh.default, aten.lift_fresh_copy.default, aten.empty_like.default,
    aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.empty.memory_format,
    aten.zeros.default, aten.ones.default, aten.full.default, aten.scalar_tensor.default, aten.new_full.default,
    aten.expand_copy.default, aten.cat.default, aten.stack.default, aten.index_select.default,
    aten.gather.default, aten.index.Tensor, aten.slice_scatter.default, aten.select_scatter.default,
    aten.constant_pad_nd.default, aten.new_empty_strided.default, aten.new_zeros.default,
    aten.new_ones.default, aten.new_empty.default, aten.eye.default, aten.where.self,
    aten.fill.Scalar, aten.fill_.Scalar, aten.fill.Tensor, aten.fill_.Tensor, aten.zero_.default,
    aten.masked_fill.Scalar, aten.masked_fill_.Scalar, aten.index_put.default, aten.index_put_.default,
    aten.scatter.src, aten.scatter.value, aten.diag_embed.default, aten.diagonal_scatter.default,
    aten.as_strided_scatter.default, aten.repeat.default, aten.flip.default, aten.roll.default,
    aten.tril.default, aten.triu.default, aten.neg.default, aten.abs.default, aten.sign.default,
})
# Ops that read only their tensor operand's metadata (what they write does not depend on its values).
_SHAPE_ONLY = frozenset({
    aten.empty_like.default, aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
    aten.new_empty.default, aten.new_zeros.default, aten.new_ones.default, aten.new_full.default,
    aten.new_empty_strided.default,
})
_ROUNDING = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)


def _layout(t: torch.Tensor) -> tuple:
    """What decides how a kernel walks a tensor: sizes, strides (a size-1 dim's is irrelevant),
    storage offset, dtype, device, conjugate/negative bits."""
    strides = tuple(s if n != 1 else 0 for n, s in zip(t.shape, t.stride()))
    return (tuple(t.shape), strides, t.storage_offset(), t.dtype, t.device.type, t.is_conj(), t.is_neg())


def _name(func: Any) -> str:
    """In-place and out-of-place forms of an op round alike: both are keyed by the out-of-place name."""
    schema = func._schema
    base = schema.name.split("::")[-1]
    if _writes(func):
        base = base.rstrip("_")
    return f"{base}.{schema.overload_name or 'default'}"


def _writes(func: Any) -> bool:
    args = func._schema.arguments
    return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write


_SCALAR_NAMES = {_name(op): _name(twin) for op, twin in SCALAR_TWINS.items()}


def _scalar_key(func: Any, args: tuple) -> tuple | None:
    """`x op number` and `x op c`, c a 0-d tensor of x's dtype, as one key where the kernel reads
    the same operand: the number converted to x's dtype, as TensorIterator converts it (the form
    engine.graph_passes._scalars_as_tensors turns the first into). None for other calls."""
    twin = _SCALAR_NAMES.get(_name(func))  # (in-place forms too: x /= 2 rounds as x / 2)
    if twin is None or len(args) != 2:
        return None
    x, c = args
    if type(c) in _PLAIN and c.dim() == 0 and type(x) in _PLAIN and c.dtype == x.dtype and c.device == x.device:
        c = c.item()  # (exact: a float32 widens to a float64 exactly, and converts back to itself)
    elif type(c) is bool or type(c) not in (int, float):
        return None
    if not (type(x) in _PLAIN and scalar_operand(x, c) and x.device.type == "cpu"):
        return None
    with _disable_current_modes():
        value = torch.tensor(c, dtype=torch.int64 if type(c) is int else torch.float64).to(x.dtype)
        return twin, ("k", str(x.dtype), value.reshape(1).view(_BITS[value.element_size()]).item())


def _rounds(func: Any, out: list[torch.Tensor]) -> bool:
    """Whether the op computes floating-point values (not a copy, a rearrangement or a factory)."""
    if func in _EXACT or torch.Tag.view_copy in func.tags:
        return False
    return any(t.dtype in _ROUNDING for t in out)


_UNINITIALIZED = frozenset({
    aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default, aten.new_empty_strided.default,
    aten.empty_strided.default,
})
_COPIES = frozenset({
    aten.clone.default, aten._to_copy.default, aten.lift_fresh_copy.default, aten.alias_copy.default,
    aten.detach_copy.default,
})


# x * 1 and x / 1 (in place too) leave x's values as they are.
_TIMES_ONE = frozenset({
    aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar,
    aten.mul_.Tensor, aten.mul_.Scalar, aten.div_.Tensor, aten.div_.Scalar,
})


def _copied(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The tensor whose values the op writes unchanged (a copy, `x * 1`, `x / 1`, `x * ones`,
    `x / ones`, `x ** 1`), or None."""
    if func in _COPIES and kwargs.get("dtype") in (None, args[0].dtype):
        return args[0]
    if func is aten.copy_.default or func is aten.copy.default:
        src = args[1]
        return src if isinstance(src, torch.Tensor) and src.dtype == args[0].dtype and src.shape == args[0].shape else None
    if func in _TIMES_ONE and len(args) == 2:
        x, y = args
        if isinstance(x, torch.Tensor) and type(y) in (int, float) and y == 1 and x.is_floating_point():
            return x
    if func is aten.pow.Tensor_Scalar and type(args[1]) in (int, float) and args[1] == 1 and args[0].is_floating_point():
        return args[0]  # ATen copies the base for an exponent of 1
    if func in (aten.mul.Tensor, aten.div.Tensor) and len(args) == 2 and all(isinstance(a, torch.Tensor) for a in args):
        # x * or / a tensor of ones that neither broadcasts x nor promotes it (a number 1 made a
        # 0-d tensor by engine.graph_passes._scalars_as_tensors among them)
        for x, ones in (args, args[::-1]) if func is aten.mul.Tensor else (args,):
            if x.is_floating_point() and _all_ones(ones, x):
                return x
    return None


def _all_ones(ones: torch.Tensor, x: torch.Tensor) -> bool:
    with _disable_current_modes():
        return (torch.result_type(x, ones) == x.dtype and torch.broadcast_shapes(x.shape, ones.shape) == x.shape
                and bool((ones == 1).all()))


def _whole(t: torch.Tensor) -> bool:
    """Whether `t` covers its whole storage, element for element (what was copied into it is all it holds)."""
    if t.storage_offset() or t.numel() * t.element_size() != t.untyped_storage().nbytes():
        return False
    expected = 1
    for size, stride in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _digest(t: torch.Tensor) -> bytes:
    """What a storage holds, as a digest of its bytes (a scalar made afresh by each eager call and
    the captured copy a replay reads hold the same data)."""
    with _disable_current_modes():
        storage = t.untyped_storage()
        if storage.device.type != "cpu":
            storage = storage.cpu()
        raw = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
        return hashlib.blake2b(raw.tobytes(), digest_size=16).digest()


def _storage(t: torch.Tensor) -> int | None:
    return t.untyped_storage().data_ptr() if t.layout == torch.strided and t.device.type != "meta" else None


class Numbering:
    """Value numbers shared by the logs of one comparison: equal numbers, equal data.

    A tensor's number is its storage's contents' number and its layout. Contents that no rounding
    op produced (the call's inputs, captured tensors, constants, and what views, copies and
    factories make of them) are numbered by a digest of their bytes: the same data however it was
    arranged. Contents a rounding op wrote, or an exact op made from such, are numbered by that op
    and its operands' numbers. So two logs agree on a rounding op only where it reads the same
    data the same way, whatever the machine's kernels round to."""

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}

    def __call__(self, key: Hashable) -> int:
        return self._ids.setdefault(key, len(self._ids))


class OpLog(EngineMode):
    """Records the rounding ops a call runs on plain tensors, each with its operands' numbers.

    Tensor subclasses (the engine's batched tensor) are let through to their own dispatch, which
    runs the plain ops this mode then sees, and composite ops are decomposed: the level engine.recorder
    records a trace at."""

    def __init__(self, numbering: Numbering) -> None:
        super().__init__()
        self.number = numbering
        self.ops: Counter = Counter()
        # storage address -> (the number of what it holds, whether no rounding op produced it, and
        # for a copy the copied tensor's number and the layout that reads it back)
        self._contents: dict[int, tuple[tuple[int, bool, tuple | None], StorageWeakRef]] = {}
        self._described: dict[int, str] = {}  # operand number -> its layout, for messages

    def _data(self, t: torch.Tensor) -> tuple[int, bool, tuple | None]:
        ptr = _storage(t)
        if ptr is None:
            return self.number(("other", t.layout, tuple(t.shape), t.dtype)), False, None
        held = self._contents.get(ptr)
        if held is None or held[1].expired():  # memory no logged op wrote: an input, a captured or a fresh constant
            return self._hold(t, (self.number(("data", _digest(t))), True, None))
        return held[0]

    def _hold(self, t: torch.Tensor, contents: tuple[int, bool, tuple | None]) -> tuple[int, bool, tuple | None]:
        # (with a weak reference to the storage: memory freed during the call may be reused by a
        # tensor made without a logged op, which must not inherit what the freed one held)
        storage = t.untyped_storage()
        self._contents[storage.data_ptr()] = (contents, StorageWeakRef(storage))
        return contents

    def _tensor(self, t: torch.Tensor) -> int:
        contents, _, copied = self._data(t)
        layout = _layout(t)
        if copied is not None and copied[1] == layout:  # a copy read back as it was written: the original
            return copied[0]
        n = self.number(("tensor", contents, layout))
        self._described.setdefault(n, _describe_layout(layout))
        return n

    def _operand(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return ("t", self._tensor(x))
        if isinstance(x, float):
            return ("f", x.hex())
        if isinstance(x, (list, tuple)):
            return tuple(self._operand(y) for y in x)
        if isinstance(x, (int, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)):
            return x
        return type(x).__name__

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(t not in _PLAIN for t in types):
            return NotImplemented
        # A composite op is logged as the ops it decomposes into, as engine.recorder records it.
        out = decompose(self, func, args, kwargs)
        if out is not NotImplemented:
            return out
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        scalar = _scalar_key(func, args)
        name, logged = (_name(func), tuple(self._operand(a) for a in args)) if scalar is None \
            else (scalar[0], (self._operand(args[0]), scalar[1]))
        operands = (name, logged, tuple((k, self._operand(v)) for k, v in sorted(kwargs.items())))
        pure = func in _SHAPE_ONLY or all(self._data(t)[1] for t in tensors)
        read = {_storage(t) for t in tensors}
        source = _copied(func, args, kwargs)
        copied = None if source is None else self._tensor(source)
        image = None if source is None or not _whole(source) else (self._data(source), _layout(source))
        out = func(*args, **kwargs)
        results = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        # An output over an input's memory is a view or alias of it (`view`, `_unsafe_view`), and
        # `squeeze_` changes a layout in place: the contents keep their number, only a layout is
        # new. Anything else the op wrote, in place or fresh, holds what the op computed.
        if torch.Tag.inplace_view in func.tags or (not _writes(func) and any(_storage(t) in read for t in results)):
            return out
        if source is not None and _writes(func) and source is args[0]:  # x *= 1: nothing changed
            return out
        rounds = source is None and _rounds(func, results)
        if rounds:
            self.ops[operands] += 1
        key = self.number(operands)
        for i, t in enumerate(results):
            ptr = _storage(t)
            if ptr is None:
                continue
            if func in _UNINITIALIZED:
                self._hold(t, (self.number(("uninitialized",)), True, None))
            elif image is not None and image[1] == _layout(t):  # byte for byte the source's storage
                self._hold(t, image[0])
            elif copied is not None and _whole(t):  # (of pure data too: `x[:-1] ** 1` reads as x[:-1])
                layout = _layout(t)
                self._hold(t, (self.number(("copy", copied, layout)), pure, (copied, layout)))
            elif pure and not rounds:
                self._hold(t, (self.number(("data", _digest(t))), True, None))
            else:
                self._hold(t, (self.number((key, i)), False, None))
        return out

    def describe(self, key: tuple) -> str:
        name, args, kwargs = key

        def text(x: Any) -> str:
            if isinstance(x, tuple) and len(x) == 2 and x[0] == "t":
                return self._described.get(x[1], "a tensor")
            if isinstance(x, tuple) and len(x) == 2 and x[0] == "f":
                return repr(float.fromhex(x[1]))
            if isinstance(x, tuple) and len(x) == 3 and x[0] == "k":  # (_scalar_key)
                return f"a {x[1].replace('torch.', '')} number"
            if isinstance(x, tuple):
                return "[" + ", ".join(text(y) for y in x) + "]"
            return repr(x)

        parts = [text(a) for a in args] + [f"{k}={text(v)}" for k, v in kwargs]
        return f"aten.{name}({', '.join(parts)})"


def _describe_layout(layout: tuple) -> str:
    shape, strides, offset, dtype = layout[:4]
    return f"{str(dtype).replace('torch.', '')}{list(shape)} strides {list(strides)}" + (f" offset {offset}" if offset else "")


def logs() -> tuple[OpLog, OpLog]:
    """A replay's log and its eager call's, numbered alike."""
    numbering = Numbering()
    return OpLog(numbering), OpLog(numbering)


def departures(replay: OpLog, eager: OpLog) -> list[tuple]:
    """The replay's rounding ops that its eager call never ran on the same data the same way (a
    replay may run fewer: repeated ops computed once, captured values folded)."""
    return [key for key in replay.ops if key not in eager.ops]
