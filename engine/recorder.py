"""Record what a function computes as an FX graph of aten ops, on real tensors.

`record(fn, inputs)` runs `fn` once for real under a TorchDispatchMode that appends every aten op
it sees (the backward passes and the batching rules' ops included) to an FX graph: the graph
make_fx's real tracing mode records, without its tracer. make_fx imports inductor's config (and
with it Dynamo) and torch's symbolic-shape module (sympy) at its first use, most of a second of a
process's first recording; this imports nothing.

What the graph holds, as make_fx's does (except that a composite op reaching the mode is
decomposed by its C++ kernel, as an eager call runs it; make_fx prefers torch's Python one):
- one placeholder per input, in order; tensors the function reads without taking them (closed-over
  weights, tensors made without an op) become `get_attr` constants holding the live objects;
- each op's node in the order the ops ran; an in-place op's result is its own node, and later uses
  of the written tensor read that node; tuple results are read through `operator.getitem` nodes;
- a fresh constant (`torch.tensor(...)` inside the function) is copied where it is lifted
  (`aten.lift_fresh` is recorded as `aten.lift_fresh_copy`), so a replay that writes into it does
  not write into the recording's tensor;
- `meta["val"]`: a tensor on the meta device with the value's sizes, strides and dtype, and
  `meta["device"]` its real device (shape inference for engine.graph_passes).

Ops on tensor subclasses are left to the subclass (the mode declines them; the plain-tensor ops the
subclass runs are recorded). An argument a graph cannot hold as a literal (a torch.Generator) is
an attribute too (`_opaque_obj0` ...), the object itself. An op that reads a tensor's value
(`.item()`) raises DataDependentError: a graph would freeze the value (engine.trace's guard mode,
above this one, turns the reads it sees into guards or refuses them first).
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils.weak import WeakIdKeyDictionary

from engine._modes import EngineMode, decompose
from engine.errors import DataDependentError

__all__ = ["record"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_LITERALS = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


def _meta_val(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided:
            return None
        try:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        except (RuntimeError, NotImplementedError):  # a dtype the meta device does not make
            return None
    if isinstance(value, (tuple, list)):
        return type(value)(_meta_val(v) for v in value)
    return value


def _set_meta(node: torch.fx.Node, value: Any) -> None:
    node.meta["val"] = _meta_val(value)
    if isinstance(value, torch.Tensor):
        node.meta["device"] = value.device


def _has_subclass(values: Any) -> bool:
    """Whether a tensor subclass is among an aten op's arguments (tensors, or lists of them: the
    deepest an op's schema nests them). A loop, not a pytree flatten: this runs at every recorded
    op, under the purity watch's profiler when automatic tracing records."""
    for x in values:
        if isinstance(x, torch.Tensor):
            if type(x) not in _PLAIN:
                return True
        elif type(x) in (list, tuple):
            for v in x:
                if isinstance(v, torch.Tensor) and type(v) not in _PLAIN:
                    return True
    return False


class _Recorder(EngineMode):
    """The mode that appends each op it runs to `graph` (see the module docstring)."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        super().__init__()
        self.graph = graph
        self.nodes: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> the node that holds it now
        self.constants: dict[str, Any] = {}  # attribute name -> the tensor or object it holds
        self._names: dict[int, str] = {}  # id of a held object -> its name (held: the ids stay its)

    def node_of(self, t: torch.Tensor) -> torch.fx.Node:
        node = self.nodes.get(t)
        if node is None:
            node = self._attribute(t, "_tensor_constant")
            _set_meta(node, t)
            self.nodes[t] = node
        return node

    def _attribute(self, x: Any, prefix: str) -> torch.fx.Node:
        """A get_attr node of an attribute holding `x` itself (one attribute per object)."""
        name = self._names.get(id(x))
        if name is None:
            name = self._names[id(x)] = f"{prefix}{sum(n.startswith(prefix) for n in self.constants)}"
            self.constants[name] = x
        return self.graph.get_attr(name)

    def _arg(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return self.node_of(x)
        if isinstance(x, (list, tuple)):
            return type(x)(self._arg(v) for v in x) if type(x) in (list, tuple) else [self._arg(v) for v in x]
        if isinstance(x, _LITERALS):
            return x
        return self._attribute(x, "_opaque_obj")  # a non-literal argument (a torch.Generator)

    def _track(self, value: Any, node: torch.fx.Node) -> None:
        _set_meta(node, value)
        if isinstance(value, torch.Tensor):
            self.nodes[value] = node
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                if isinstance(v, (torch.Tensor, tuple, list)):
                    self._track(v, self.graph.call_function(operator.getitem, (node, i)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _has_subclass(args) or (kwargs and _has_subclass(kwargs.values())):
            return NotImplemented  # the subclass runs the op; the plain ops it runs come back here
        if func in _VALUE_READS:
            # engine.trace's guard mode, above this one, turns reads of tensor values into guards or
            # refuses them; one that reaches the recorder (from inside a composite op) would freeze
            # the value it read into the graph.
            raise DataDependentError(
                f"{func.name()} read a tensor's value while it was being recorded, which a recorded graph "
                f"would freeze. Pass fallback='eager' to run this function without tracing."
            )
        # A composite op is recorded as the ops it decomposes into (engine._modes.decompose).
        out = decompose(self, func, args, kwargs)
        if out is not NotImplemented:
            return out
        target = aten_lift_fresh_copy if func is aten_lift_fresh else func
        # Arguments first: an in-place op's input is the node before the write.
        node_args = self._arg(args)
        node_kwargs = {k: self._arg(v) for k, v in kwargs.items()}
        out = target(*args, **kwargs)
        node = self.graph.create_node("call_function", target, tuple(node_args), node_kwargs,
                                      name=target.overloadpacket.__name__)
        self._track(out, node)
        return out


_VALUE_READS = frozenset({torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default,
                          torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default})
aten_lift_fresh = torch.ops.aten.lift_fresh.default
aten_lift_fresh_copy = torch.ops.aten.lift_fresh_copy.default


def record(fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """Run `fn(*inputs)` (plain tensors in, a list of tensors out) and return its recorded graph.

    The graph module's forward takes tensors like `inputs` and returns the list `fn` returned;
    the tensors it read from outside are its attributes (`_tensor_constant0` ...), the live objects.
    """
    graph = torch.fx.Graph()
    mode = _Recorder(graph)
    for i, t in enumerate(inputs):
        node = graph.placeholder(f"arg{i}")
        mode._track(t, node)
    with mode:
        outs = fn(*inputs)
    graph.output([mode.node_of(o) for o in outs])
    # Its code is generated when first needed (engine.trace: once, after the passes that rewrite
    # the graph, each of which would otherwise regenerate code that nothing runs).
    return _LazyGraphModule(mode.constants, graph)
