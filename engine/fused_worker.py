"""The fused tier's compile worker: a separate process that turns recorded aten graphs into
inductor programs (engine.fused starts it; run as a script, it imports torch only).

Why a process and not a thread: inductor's compile is seconds of Python, and a replay in the
calling process releases the GIL at every op; with a compile thread holding it, each op would wait
up to the interpreter's switch interval (`sys.getswitchinterval()`) to get it back, so "keep replaying while it compiles"
would stall as badly as blocking. In a process the compile costs the caller nothing but a core.

Protocol (stdin/stdout, each message a 4-byte big-endian length then a pickle):
request  (job id, graph description from engine.fused.describe_graph, input metadata, config patches)
reply    (job id, "ok", generated module source, seconds) or (job id, "error", message, seconds).
The compiled kernels land in inductor's on-disk caches (TORCHINDUCTOR_CACHE_DIR, shared with the
caller), so the caller's import of the module source finds them there instead of compiling again.
"""
from __future__ import annotations

import operator
import os
import pickle
import signal
import struct
import sys
import threading
import time
import traceback
from typing import Any, BinaryIO


def read_message(stream: BinaryIO) -> Any:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return pickle.loads(stream.read(size))


def write_message(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def encode(x: Any, index: dict) -> Any:
    """A node argument as plain picklable data: node references become ("n", position)."""
    if x.__class__.__name__ == "Node" and x in index:
        return ("n", index[x])
    if isinstance(x, list):
        return ("l", [encode(y, index) for y in x])
    if isinstance(x, tuple):
        return ("t", tuple(encode(y, index) for y in x))
    if isinstance(x, dict):
        return ("d", {k: encode(v, index) for k, v in x.items()})
    return ("v", x)


def decode(x: Any, nodes: list) -> Any:
    tag, value = x
    if tag == "n":
        return nodes[value]
    if tag == "l":
        return [decode(y, nodes) for y in value]
    if tag == "t":
        return tuple(decode(y, nodes) for y in value)
    if tag == "d":
        return {k: decode(v, nodes) for k, v in value.items()}
    return value


def _target(name: str) -> Any:
    import torch

    if name == "getitem":
        return operator.getitem
    namespace, rest = name.split("::")
    op, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), op)
    return getattr(packet, overload or "default")


def build_graph(description: list) -> Any:
    """The torch.fx.GraphModule a description (engine.fused.describe_graph) stands for."""
    import torch
    import torch.fx

    graph = torch.fx.Graph()
    nodes: list = []

    for kind, target, args, kwargs in description:
        if kind == "placeholder":
            nodes.append(graph.placeholder(target))
        elif kind == "output":
            graph.output(decode(args, nodes))
            nodes.append(None)
        else:
            nodes.append(graph.call_function(_target(target), decode(args, nodes), decode(kwargs, nodes)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


# What this worker does to a graph before inductor sees it, beyond inductor's own decompositions;
# engine.fused.graph_key includes it, so a program compiled under an older lowering is not loaded.
LOWERING = 3


def decompositions() -> dict:
    """Inductor's decomposition table, plus the checks' reductions as reductions inductor fuses:
    `_is_all_true(b)` (what torch.distributions' argument and support checks end in: the graph's
    guard) -> `all(b)`, `_is_any_true(b)` -> `any(b)`. Inductor has no lowering for the two, so left
    alone each is an aten call from the program's Python that forces its boolean operand to be
    stored in full (a masked store the CPU code generator writes element by element); as
    reductions the comparison is computed inside the reduction's loop and never stored. Both ops
    take only boolean tensors and return a 0-d boolean tensor, as all/any do on them."""
    import torch
    from torch._inductor.decomposition import select_decomp_table

    aten = torch.ops.aten
    table = dict(select_decomp_table())
    table[aten._is_all_true.default] = aten.all.default
    table[aten._is_any_true.default] = aten.any.default
    return table


def split_stacked_all(gm: Any) -> None:
    """`all(stack([c0, c1, ...]))` -> `all(c0) & all(c1) & ...`, in place: the replay's guard
    (engine.trace's conditions, 0-d booleans, some of them folded inputs) as one pointwise
    expression inductor fuses into a kernel, instead of a stacked buffer written through one alias
    per condition from the program's Python. Exact for any operands stack takes (equal shapes):
    both are true when every element of every operand is nonzero."""
    import torch

    aten = torch.ops.aten
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.all.default or len(node.args) != 1 or node.kwargs:
            continue
        stack = node.args[0]
        if (getattr(stack, "target", None) is not aten.stack.default or len(stack.users) != 1 or stack.kwargs
                or (len(stack.args) > 1 and stack.args[1] != 0) or not stack.args[0]):
            continue
        with graph.inserting_before(node):
            parts = [graph.call_function(aten.all.default, (c,)) for c in stack.args[0]]
            value = parts[0]
            for part in parts[1:]:
                value = graph.call_function(aten.logical_and.default, (value, part))
        node.replace_all_uses_with(value)
        graph.erase_node(node)
        graph.erase_node(stack)
    gm.recompile()


def compile_description(description: list, inputs_meta: list, patches: dict) -> str:
    """Inductor's generated module source for the described graph, compiled for inputs of the
    given (shape, stride, dtype, device); kernels are written to the on-disk caches."""
    import torch
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = build_graph(description)
    split_stacked_all(gm)
    inputs = [torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_()
              for shape, stride, dtype, device in inputs_meta]
    with torch.no_grad():
        decomposed = make_fx(gm, decomposition_table=decompositions(), tracing_mode="fake")(*inputs)
    if any(n.op == "get_attr" for n in decomposed.graph.nodes):
        raise RuntimeError("the decomposed graph holds tensor constants, which a directly loaded program cannot feed")
    with config.patch(patches), torch.no_grad():
        compiled = compile_fx_inner(decomposed, inputs)
    return compiled.source_code


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    while True:
        request = read_message(stdin)
        if request is None:
            return
        job, description, inputs_meta, patches = request
        start = time.perf_counter()
        try:
            source = compile_description(description, inputs_meta, patches)
        except Exception as exc:  # noqa: BLE001 - sent back: the caller keeps replaying
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            write_message(stdout, (job, "error", detail[:2000], time.perf_counter() - start))
            continue
        write_message(stdout, (job, "ok", source, time.perf_counter() - start))


def exit_with_parent(poll_s: float = 0.5) -> None:
    """End this worker, and the compilers it started, once the process that started it is gone
    (a compile outliving its caller would take a core from whatever runs next, for up to minutes,
    and its program would reach no one: the caller stores it). A daemon thread polls the parent
    id; the worker leads its own process group (the caller starts it so), killed whole."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        if hasattr(os, "killpg") and os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


if __name__ == "__main__":
    exit_with_parent()
    import torch

    torch.set_num_threads(1)
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything inductor prints must not corrupt the message stream
    serve(sys.stdin.buffer, out)
