"""The engine's CUDA-only code paths, run on a machine without a GPU.

CI has no GPU, and the CUDA tests (tests/test_workloads_cuda.py, `.ci/gpu-check`) run only where
one is lent. What those runs found is kept covered here:

- Efficient attention (`_scaled_dot_product_efficient_attention` and its backward: SDPA's kernel
  for float32 on CUDA) has no CPU kernel. The tests register a reference CPU kernel for both ops
  (softmax attention written out, with its hand-derived backward) for the test's duration, so the
  engine's fold rules run exactly as on CUDA, against a loop over the batch.
- The replay guard's conditions read off tensors on two devices (a model on CUDA whose
  torch.distributions checks also read a CPU scalar), shown with fake CUDA tensors.
- cuDNN's RNN kernel, which no rule batches: refused with an error naming it.
- The workloads' full float32 on CUDA (TF32 off for cuDNN and cuBLAS).
- The fused tier's CUDA graphs (engine.fused.CudaGraphed): copies in, one replay, copies out,
  with a stand-in for torch.cuda's capture that replays by calling the program again.
"""
from __future__ import annotations

import math
from typing import Iterator

import pytest
import torch

import engine
from engine.errors import VmapError
from loop_reference import loop

aten = torch.ops.aten


def _scores(q, k, bias, is_causal, scale):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    if bias is not None:
        s = s + bias
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), float("-inf"))
    return s, scale


BIASES: list[torch.Tensor] = []  # the biases the forward kernel was called with


def _reference_forward(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    assert dropout_p == 0
    if attn_bias is not None:
        BIASES.append(attn_bias)
    s, _ = _scores(q, k, attn_bias, is_causal, scale)
    lse = torch.logsumexp(s, -1)
    out = torch.softmax(s, -1) @ v
    return out, (lse if compute_log_sumexp else q.new_empty(0)), q.new_empty(0), q.new_empty(0)


def _reference_backward(grad_out, q, k, v, attn_bias, out, lse, seed, offset, dropout_p, grad_input_mask,
                        is_causal=False, *, scale=None):
    s, scale = _scores(q, k, attn_bias, is_causal, scale)
    p = torch.exp(s - lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ grad_out
    dp = grad_out @ v.transpose(-2, -1)
    ds = p * (dp - (grad_out * out).sum(-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv, None


@pytest.fixture
def efficient_attention_on_cpu() -> Iterator[None]:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_scaled_dot_product_efficient_attention", _reference_forward, "CPU")
    lib.impl("_scaled_dot_product_efficient_attention_backward", _reference_backward, "CPU")
    try:
        yield
    finally:
        lib._destroy()


def attention(q, k, v, bias=None, is_causal=False):
    return aten._scaled_dot_product_efficient_attention.default(q, k, v, bias, True, 0.0, is_causal)[0]


@pytest.mark.parametrize("in_dims", [(0, 0, 0), (-1, -1, -1), (0, None, None), (None, 2, None)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_efficient_attention_forward_matches_a_loop(efficient_attention_on_cpu, in_dims, is_causal) -> None:
    g = torch.Generator().manual_seed(0)
    N, H, L, S, E, B = 2, 3, 4, 4, 8, 5

    def make(shape, d):
        x = torch.randn(shape, generator=g)
        return x if d is None else torch.stack([torch.randn(shape, generator=g) for _ in range(B)], d)

    q, k, v = make((N, H, L, E), in_dims[0]), make((N, H, S, E), in_dims[1]), make((N, H, S, E), in_dims[2])
    f = lambda q, k, v: attention(q, k, v, is_causal=is_causal)  # noqa: E731
    got = engine.vmap(f, in_dims=in_dims)(q, k, v)
    torch.testing.assert_close(got, loop(f, in_dims, q, k, v)[0])


@pytest.mark.parametrize("bias_shape,batched", [((4, 5), False), ((2, 1, 4, 5), False), ((1, 4, 5), True),
                                                ((2, 3, 4, 16), True)])
def test_efficient_attention_bias_is_broadcast_and_aligned(efficient_attention_on_cpu, bias_shape, batched) -> None:
    g = torch.Generator().manual_seed(1)
    B, N, H, L, E = 3, 2, 3, 4, 8
    S = bias_shape[-1]
    q = torch.randn(B, N, H, L, E, generator=g)
    k, v = torch.randn(B, N, H, S, E, generator=g), torch.randn(B, N, H, S, E, generator=g)
    bias = torch.randn(((B,) if batched else ()) + bias_shape, generator=g)
    in_dims = (0, 0, 0, 0 if batched else None)
    BIASES.clear()
    got = engine.vmap(attention, in_dims=in_dims)(q, k, v, bias)
    # One folded call, with a bias whose rows start 16-element aligned, as the CUDA kernel needs.
    assert [tuple(b.shape) for b in BIASES] == [(B * N, H, L, S)]
    assert BIASES[0].stride(-2) % 16 == 0
    torch.testing.assert_close(got, loop(attention, in_dims, q, k, v, bias)[0])


def test_efficient_attention_per_sample_gradients_match_a_loop(efficient_attention_on_cpu) -> None:
    """vmap over grad: the backward op runs batched (one folded kernel call), each element gets its
    own gradient with respect to the shared weights."""
    g = torch.Generator().manual_seed(2)
    N, H, L, E, B = 2, 2, 4, 8, 6
    w = torch.randn(E, E, generator=g)
    x = torch.randn(B, N, H, L, E, generator=g)

    def loss(w, x):
        h = x @ w
        return attention(h, h, h, is_causal=True).square().sum()

    got = engine.vmap(engine.grad(loss), in_dims=(None, 0))(w, x)
    want = torch.stack([torch.func.grad(loss)(w, x[i]) for i in range(B)])
    torch.testing.assert_close(got, want)


def test_efficient_attention_mask_gradient_is_refused(efficient_attention_on_cpu) -> None:
    q = torch.randn(3, 1, 1, 4, 8)
    bias = torch.zeros(4, 4, requires_grad=True)

    def loss(bias, q):
        return attention(q, q, q, bias).sum()

    with pytest.raises(VmapError, match="attn_mask"):
        engine.vmap(engine.grad(loss), in_dims=(None, 0))(bias, q)


def test_efficient_attention_without_dropout_is_not_random(efficient_attention_on_cpu) -> None:
    """Tagged random for its dropout_p; with dropout_p=0 it draws nothing, so randomness='error' lets it through."""
    q = torch.randn(2, 1, 1, 4, 8)
    engine.vmap(lambda q: attention(q, q, q), randomness="error")(q)
    f = lambda q: aten._scaled_dot_product_efficient_attention.default(q, q, q, None, True, 0.5)[0]  # noqa: E731
    with pytest.raises(engine.errors.RandomnessError):
        engine.vmap(f, randomness="error")(q)


def test_guard_conditions_on_two_devices_meet_on_the_cpu() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from engine.trace import _DataGuard

    tracer = _DataGuard.__new__(_DataGuard)
    with FakeTensorMode():
        tracer.conditions = [torch.ones((), dtype=torch.bool, device="cuda"), torch.ones((), dtype=torch.bool),
                             torch.zeros((), dtype=torch.bool, device="cuda")]
        held = tracer.all_hold()
        assert held.shape == () and held.device.type == "cpu" and held.dtype == torch.bool
        tracer.conditions = tracer.conditions[:1] * 2
        assert tracer.all_hold().device.type == "cuda"  # one device: reduced where the conditions live


def test_cudnn_rnn_is_refused_naming_the_kernel() -> None:
    """nn.LSTM on CUDA runs cuDNN's fused kernel, which has no batching rule (torch.func fails there too)."""
    x, hx = torch.randn(3, 2, 5, 4), torch.zeros(1, 2, 4)
    with pytest.raises(VmapError, match="_cudnn_rnn"):
        engine.vmap(lambda x: aten._cudnn_rnn.default(x, [], 1, None, hx, None, 2, 4, 0, 1, True, 0.0, False, False,
                                                       [], None))(x)


def test_workloads_run_cuda_in_full_float32() -> None:
    from workloads.define import full_float32

    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        full_float32()
        assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


# ------------------------------------------------------------------------------------------------
# the fused tier's CUDA graphs


class _ReplayByCalling:
    """Stands in for torch.cuda's capture: the 'graph' reruns the function on the same buffers and
    writes its results into the outputs of the capture, as a graph replay writes into its pool."""

    captures = 0

    @classmethod
    def capture(cls, fn):
        cls.captures += 1
        outs = fn()

        class Graph:
            replays = 0

            def replay(self):
                Graph.replays += 1
                for o, n in zip(outs, fn()):
                    o.copy_(n)

        return Graph(), outs


class _Refuses:
    @staticmethod
    def capture(fn):
        raise RuntimeError("operation not permitted when stream is capturing")


def _graphed(fn, example, capturer):
    from engine import fused

    calls = []

    def call(args):
        calls.append(1)
        return [fn(*args)]

    program = fused.FusedProgram(call, tuple(t.stride() for t in example), "key", 0.0, "",
                                 tuple((t.shape, t.dtype, t.device) for t in example))
    graphed = fused.CudaGraphed(program)
    graphed.capturer = capturer
    return graphed, calls


def test_a_cuda_graphed_program_copies_in_replays_and_copies_out(monkeypatch):
    monkeypatch.setattr(_ReplayByCalling, "captures", 0)
    x = torch.randn(4, 3)
    graphed, _ = _graphed(lambda a: a.sin() * 2, [x], _ReplayByCalling)
    first = graphed([x])
    assert _ReplayByCalling.captures == 1 and graphed.graph is not None
    torch.testing.assert_close(first[0], x.sin() * 2)
    for seed in range(3):
        y = torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))
        out = graphed([y])
        torch.testing.assert_close(out[0], y.sin() * 2)
        assert out[0].data_ptr() != graphed.outs[0].data_ptr()  # a copy: the next replay overwrites the buffer
    kept = out[0].clone()
    graphed([x])
    torch.testing.assert_close(out[0], kept)  # an earlier result is not overwritten by a later call
    assert _ReplayByCalling.captures == 1


def test_a_cuda_graphed_program_leaves_other_layouts_and_autograd_to_the_program():
    x = torch.randn(4, 3)
    graphed, calls = _graphed(lambda a: a * 3, [x], _ReplayByCalling)
    graphed([x])
    replays_before = len(calls)
    other = torch.randn(3, 4).t()  # same shape, other strides: the program's own checks refuse it
    assert graphed([other]) is None
    assert graphed([x.double()]) is None  # other dtype, same strides: not converted into the buffers
    assert graphed([torch.randn(1, 3).expand(4, 3).contiguous().view(torch.int32)]) is None
    with torch.enable_grad():
        assert graphed([x.clone().requires_grad_()]) is None
    assert len(calls) == replays_before


def test_a_program_that_cannot_be_captured_runs_as_it_is():
    x = torch.randn(5)
    graphed, calls = _graphed(lambda a: a + 1, [x], _Refuses)
    torch.testing.assert_close(graphed([x])[0], x + 1)
    assert graphed.plain and graphed.graph is None
    torch.testing.assert_close(graphed([x * 2])[0], x * 2 + 1)


def test_a_program_returning_a_view_of_its_input_is_not_graphed():
    """A replay's copy of the output would not be the view of the caller's input the program
    returns: such a program is left as it is."""
    x = torch.randn(2, 3)
    graphed, _ = _graphed(lambda a: a.t(), [x], _ReplayByCalling)
    out = graphed([x])
    assert graphed.plain
    assert out[0]._base is x or out[0].data_ptr() == x.data_ptr()


def test_which_programs_are_graphed():
    from engine import fused

    noisy = torch.fx.GraphModule({}, torch.fx.Graph())
    node = noisy.graph.placeholder("a")
    noisy.graph.output(noisy.graph.call_function(aten.rand_like.default, (node,)))
    noisy.recompile()
    cuda = [((4, 3), (3, 1), torch.float32, torch.device("cuda", 0))]
    traced = engine.trace(lambda a: a * 2)
    traced(torch.randn(4, 3))
    (entry,) = traced._cache.values()
    assert fused.graphable(cuda, entry.gm)
    assert not fused.graphable(cuda, noisy)  # a random op
    assert not fused.graphable([((4, 3), (3, 1), torch.float32, torch.device("cpu"))], entry.gm)
    assert not fused.graphable(cuda + [((1 << 25,), (1,), torch.float32, torch.device("cuda", 0))], entry.gm)
    assert not fused.graphable(cuda, None)
