"""The fused tier (engine.fused): when a signature moves up, that calls never wait for its compile,
that the switch restores the replay path exactly, and (slow) that inductor's program agrees with
the replay and is found on disk by a later compile of the same graph."""
from __future__ import annotations

import threading

import pytest
import torch

import engine
from engine import fused, graph_passes
from engine._opmeta import call_signature, out_of_place_view
from engine.fused_worker import build_graph
from fused_stand_in import FAKE_SOURCE


def _double_plus_one(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


@pytest.fixture
def quick_tier(monkeypatch, tmp_path):
    """Move up after two replays, with an index of programs of this test only, and a compile
    that waits for the test's go before handing back FAKE_SOURCE."""
    monkeypatch.setattr(fused, "MIN_REPLAYS", 2)
    monkeypatch.setattr(fused, "COLD_COMPILE_S", 0.0)
    monkeypatch.setattr(fused, "BACKEND", "inductor")  # the stand-in is inductor's; XLA: test_fused_xla.py
    monkeypatch.setattr(fused, "INDEX", fused.GraphIndex(tmp_path))
    started, release = threading.Event(), threading.Event()

    def compile_after_release(job: fused.Job) -> str:
        started.set()
        if not release.wait(60):
            raise RuntimeError("the test never released the compile")
        return FAKE_SOURCE

    monkeypatch.setattr(fused._COMPILER, "_compile", compile_after_release)
    yield started, release
    release.set()
    fused.settle(60)


def _entry(traced: engine.trace) -> object:
    (entry,) = traced._cache.values()
    return entry


def test_a_call_while_the_compile_is_pending_replays_without_waiting(quick_tier):
    started, release = quick_tier
    traced = engine.trace(_double_plus_one)
    x = torch.randn(6)
    with engine.fused_tier(True):
        traced(x)  # the trace
        traced(x), traced(x)  # two replays: the signature moves up, its compile starts
        assert started.wait(30)
        out = traced(x)  # the compile is blocked until release: this call must not wait for it
        job = _entry(traced).promotion.job
        assert not job.done.is_set() and fused.pending() == 1
        assert traced.tiers()[0]["state"] == "pending" and _entry(traced).fused is None
        torch.testing.assert_close(out, x * 2 + 1, rtol=0, atol=0)
        release.set()
        assert engine.settle(30)
        assert traced.tiers()[0]["state"] == "fused"
        calls = _entry(traced).fused.call.__globals__["CALLS"]
        before = calls[0]
        torch.testing.assert_close(traced(x), x * 2 + 1, rtol=0, atol=0)
        assert calls[0] == before + 1  # the program answered


def test_switching_the_tier_off_restores_the_replay_path_exactly(quick_tier):
    _, release = quick_tier
    release.set()
    fn = engine.vmap(engine.grad(lambda w: (w.sin() * w).sum()))
    traced = engine.trace(_double_plus_one)
    x = torch.randn(5)
    with engine.fused_tier(True):
        for _ in range(4):
            traced(x)
        assert engine.settle(30)
    calls = _entry(traced).fused.call.__globals__["CALLS"]
    before = calls[0]
    with engine.fused_tier(False):
        out = traced(x)
        reference = _entry(traced).gm(*_entry(traced).inputs([x]))[0]
    assert calls[0] == before  # the program did not run
    assert torch.equal(out, reference)
    # off, nothing is counted and nothing is compiled
    other = engine.trace(fn)
    with engine.fused_tier(False):
        for _ in range(5):
            other(x.reshape(5, 1))
    assert other.tiers()[0]["state"] == "replay" and other.tiers()[0]["replays"] == 0


def test_force_compiles_at_the_first_replay_and_waits(quick_tier):
    _, release = quick_tier
    release.set()
    traced = engine.trace(_double_plus_one)
    x = torch.randn(3)
    with engine.fused_tier("force"):
        traced(x)
        traced(x)  # the first replay: compiles and waits
        assert traced.tiers()[0]["state"] == "fused"
        calls = _entry(traced).fused.call.__globals__["CALLS"]  # shared by the tests' identical programs
        before = calls[0]
        torch.testing.assert_close(traced(x), x * 2 + 1, rtol=0, atol=0)
        assert calls[0] == before + 1


def test_calls_that_build_an_autograd_graph_stay_on_the_replay(quick_tier):
    _, release = quick_tier
    release.set()
    traced = engine.trace(_double_plus_one)
    x = torch.randn(4, requires_grad=True)
    with engine.fused_tier("force"):
        traced(x)
        out = traced(x)
    assert traced.tiers()[0]["state"] == "ineligible" and fused.pending() == 0
    assert out.requires_grad  # the replay's autograd graph, as before


def test_a_program_refuses_inputs_of_other_strides():
    program = fused.FusedProgram(lambda args: ("ran",), ((1,),), "key", 0.0, "")
    assert program([torch.zeros(4)]) == ("ran",)
    assert program([torch.zeros(8)[::2]]) is None  # stride 2


def test_beside_the_same_fold_values_a_program_checks_only_the_live_inputs():
    """The fold vouches for its values and its sources while it returns the same values tuple:
    the checks then run on the `live` positions only, and any other tuple checks every input."""
    program = fused.FusedProgram(lambda args: ("ran",), ((1,), (1,), (1,)), "key", 0.0, "")
    live = (0,)
    proof = (torch.zeros(4),)
    assert program([torch.zeros(4), torch.zeros(4), proof[0]], proof, live) == ("ran",)
    assert program.proof is proof and program.live == live
    other_strides = torch.zeros(8)[::2]
    # the caller never pairs this proof with a vouched input of other strides: only live ones are read
    assert program([torch.zeros(4), other_strides, proof[0]], proof, live) == ("ran",)
    assert program([other_strides, torch.zeros(4), proof[0]], proof, live) is None  # a live input
    assert program([torch.zeros(4), other_strides, proof[0]], (proof[0],), live) is None  # another tuple: all
    assert program([torch.zeros(4), other_strides, proof[0]]) is None  # no proof: all


def test_a_fused_call_follows_its_captured_tensors_layout_and_contents(monkeypatch, tmp_path):
    """The fused program is specialised to its inputs' strides and alignment. A captured tensor the
    fold reads (W) or does not read (c) that gets other strides, an unaligned start or other bytes
    (through `.data`, which moves no version counter) must never reach the program unchecked:
    each call equals the eager result, and the stand-in program below refuses any input of another
    layout than it was compiled for."""
    monkeypatch.setattr(fused, "BACKEND", "inductor")  # its stand-in is an inductor program
    monkeypatch.setattr(fused, "INDEX", fused.GraphIndex(tmp_path))
    monkeypatch.setattr(fused, "TRIAL_CALLS", 0)  # the program from its first call (no trial against the replay)
    compiled: dict = {}
    calls = []

    def stand_in(job: fused.Job) -> str:
        compiled["strides"] = tuple(m[1] for m in job.meta)
        return "stand-in"

    def load(source: str):
        strides = compiled["strides"]

        def call(args):
            assert tuple(a.stride() for a in args) == strides and all(a.data_ptr() % 16 == 0 for a in args)
            outs = compiled["gm"](*args)
            args.clear()
            calls.append(1)
            return outs
        return call

    monkeypatch.setattr(fused._COMPILER, "_compile", stand_in)
    monkeypatch.setattr(fused, "load_program", load)
    W, c = torch.randn(4, 4), torch.randn(4)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x @ (W * 2) + x * c

    traced = engine.trace(f)
    x = torch.randn(3, 4)
    with engine.fused_tier("force"):
        traced(x)
        compiled["gm"] = _entry(traced).gm
        traced(x)  # the first replay compiles and waits
        assert traced.tiers()[0]["state"] == "fused"

        def check(program_ran: bool) -> None:
            before = len(calls)
            torch.testing.assert_close(traced(x), x @ (W * 2) + x * c, rtol=0, atol=0)
            assert len(calls) == before + program_ran

        check(True)
        check(True)
        assert _entry(traced).fused.proof is not None  # the second call checked the live inputs only
        strided = torch.empty(8)[::2]
        strided.copy_(c)
        c.data = strided  # other strides, same values, same version
        check(False)
        c.data = torch.randn(4)
        check(True)
        W.data = W.t().contiguous().t()  # read by the fold: its values are recomputed, all checked
        check(False)
        W.data = W.contiguous()
        check(True)
        buffer = torch.empty(17)
        buffer[1:].copy_(W.flatten())
        W.data = buffer[1:].view(4, 4)  # 4 bytes past an aligned start: copied to aligned memory
        check(True)
        W.data = torch.randn(4, 4)
        check(True)
        W.data.mul_(3)  # new bytes, the version counter of W unmoved
        check(True)


def test_a_misaligned_input_is_copied_to_aligned_memory_of_the_same_strides():
    seen = []

    def call(args):
        seen.extend((a.data_ptr() % 16, a.stride(), a.tolist()) for a in args)
        return (args[0] * 2,)

    program = fused.FusedProgram(call, ((5, 1),), "key", 0.0, "")
    base = torch.arange(12.0)
    x = base[1:11].view(2, 5)  # 4 bytes past an aligned start
    (out,) = program([x])
    assert seen == [(0, (5, 1), x.tolist())] and out.tolist() == (x * 2).tolist()
    expanded = fused.FusedProgram(call, ((0,),), "key", 0.0, "")
    assert expanded([torch.zeros(5)[1:2].expand(4)]) is None  # no copy has overlapping elements: replays


def test_an_output_viewing_a_copied_input_sends_the_call_back_to_the_replay():
    """The replay would return a view of the caller's tensor; a view of the copy would not write
    through, so that call replays and the program copies no more."""
    program = fused.FusedProgram(lambda args: (args[0][1:],), ((1,),), "key", 0.0, "")
    x = torch.zeros(6)[1:]
    assert program([x]) is None and not program.copies_ok
    assert program([x]) is None
    assert program([torch.zeros(5)])[0].shape == (4,)  # aligned inputs are not copied: still fused


def test_rosenbrock_hessian_runs_its_program_although_a_folded_constant_is_misaligned(monkeypatch, tmp_path):
    """Its graph feeds a folded slice of an identity matrix, which starts 4 bytes into its storage:
    the program was refused on every call (the replay ran) until misaligned inputs were copied."""
    monkeypatch.setattr(fused, "INDEX", fused.GraphIndex(tmp_path))
    from workloads.hessians import rosenbrock

    x = torch.randn(16, generator=torch.Generator().manual_seed(0))
    traced = engine.trace(engine.hessian(rosenbrock))
    calls = []
    with engine.fused_tier("force"):
        traced(x)
        traced(x)
        program = _entry(traced).fused
        assert isinstance(program, fused.Trial)  # its first calls: the program's first is this one
        program = program.program
        inner = program.call
        monkeypatch.setattr(program, "call", lambda args: calls.append(1) or inner(args))
        got = traced(x)
    assert calls == [1]
    torch.testing.assert_close(got, torch.func.hessian(rosenbrock)(x), rtol=1e-5, atol=1e-5)


def test_graphs_with_in_place_writes_are_not_candidates():
    def writes(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1)
        return y

    traced = engine.trace(writes)
    traced(torch.randn(3))
    assert traced.tiers()[0]["state"] is None or traced.tiers()[0]["state"] == "replay"
    gm = traced.graphs()[0]
    has_write = any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable for n in gm.graph.nodes)
    assert fused.candidate(gm) is (not has_write)


def test_in_place_arithmetic_on_fresh_tensors_becomes_out_of_place():
    def mean_in_place(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.div_(3)  # a fresh tensor nothing else reads: the graph is functional after the pass
        return y + 1

    traced = engine.trace(mean_in_place)
    x = torch.randn(4)
    traced(x)
    gm = traced.graphs()[0]
    assert fused.candidate(gm)
    torch.testing.assert_close(traced(x), x * 2 / 3 + 1)


@pytest.mark.parametrize("write, expected", [
    (lambda y: y.pow_(3.0), lambda x: (x * 2) ** 3),  # pow_.Scalar: its twin is pow.Tensor_Scalar, not pow.Scalar
    (lambda y: y.pow_(torch.full((4,), 2.0)), lambda x: (x * 2) ** 2),
    (lambda y: y.double().float_power_(2.0), lambda x: (x * 2).double() ** 2),
    (lambda y: y.clamp_(min=0.5), lambda x: (x * 2).clamp(min=0.5)),
    (lambda y: y.polygamma_(1), lambda x: torch.polygamma(1, x * 2)),  # (no twin takes (self, n) in that order)
])
def test_in_place_arithmetic_replays_through_its_twin(write, expected):
    """Each in-place op's out-of-place twin takes its arguments in the same order: an overload of
    the same name may not (pow.Scalar takes a number and a tensor exponent)."""
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y = write(y)
        return y + 1

    traced = engine.trace(f)
    x = torch.rand(4) + 0.5
    for _ in range(3):
        torch.testing.assert_close(traced(x), expected(x) + 1)


def test_every_in_place_twin_takes_the_same_arguments():
    for name in torch._C._dispatch_get_all_op_names():
        base, _, overload = name.partition("::")[2].partition(".")
        op = getattr(getattr(torch.ops.aten, base, None), overload or "default", None) if name.startswith("aten::") else None
        if op is None or not op._schema.is_mutable:
            continue
        for twin in (graph_passes._out_of_place_op(op), out_of_place_view(op) if torch.Tag.inplace_view in op.tags else None):
            if twin is not None:  # (types in order, keyword-only names, defaults: a recorded call leaves those out)
                assert call_signature(twin) == call_signature(op), (op, twin)


def test_a_write_seen_through_a_view_stays_in_place():
    def through_view(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        v = y[:2]
        y.mul_(10)  # v sees it
        return v + 0

    traced = engine.trace(through_view)
    x = torch.randn(4)
    traced(x)
    assert not fused.candidate(traced.graphs()[0])
    torch.testing.assert_close(traced(x), x[:2] * 20)


def test_described_graph_rebuilds_to_the_same_computation():
    X = torch.randn(20, 4)

    def logp(w: torch.Tensor) -> torch.Tensor:
        return -torch.nn.functional.softplus(X @ w).sum() - 0.5 * (w * w).sum()

    traced = engine.trace(engine.vmap(engine.hessian(logp)))
    w = torch.randn(3, 4)
    traced(w)
    entry = _entry(traced)
    rebuilt = build_graph(fused.describe_graph(entry.gm))
    inputs = entry.inputs([w])
    for got, want in zip(rebuilt(*inputs), entry.gm(*inputs), strict=True):
        assert torch.equal(got, want)


def test_policy_and_switch_parsing():
    assert not fused.pays(fused.MIN_REPLAYS - 1, 1e9, 0.0)
    assert fused.pays(fused.MIN_REPLAYS, 2 * fused.COLD_COMPILE_S / fused.EXPECTED_SAVING, fused.COLD_COMPILE_S)
    assert not fused.pays(10 ** 6, 1.0, fused.COLD_COMPILE_S)
    assert [fused._mode_from(v) for v in ("0", "off", "FORCE", "1", "")] == ["off", "off", "force", "on", "on"]
    with pytest.raises(TypeError, match="True, False or 'force'"):
        with engine.fused_tier("yes"):
            pass
    with engine.fused_tier(False):
        assert fused.fused_mode() == "off"
        with engine.fused_tier("force"):
            assert fused.fused_mode() == "force"
        assert fused.fused_mode() == "off"


@pytest.mark.slow
def test_inductor_program_matches_the_replay_and_a_second_compile_loads_from_disk(monkeypatch, tmp_path):
    monkeypatch.setattr(fused, "INDEX", fused.GraphIndex(tmp_path))
    monkeypatch.setattr(fused, "BACKEND", "inductor")
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(50, 6, generator=g), (torch.rand(50, generator=g) > 0.5).float()

    def logp(w: torch.Tensor) -> torch.Tensor:
        z = X @ w
        return (y * z - torch.nn.functional.softplus(z)).sum() - 0.5 * (w * w).sum()

    fn = engine.vmap(engine.hessian(logp))
    w = torch.randn(4, 6, generator=g)
    # (Run first in its process, the first recording makes the engine's cached 0-d tensors of
    # Python scalars: they must be captured constants there too, else its graph and key differ
    # from the second's and the second compiles again.)
    first = engine.trace(fn)
    with engine.fused_tier("force"):
        first(w)
        first(w)
    state = first.tiers()[0]
    assert state["state"] == "fused", state
    assert not state["from_disk"]
    for seed in range(3):
        w2 = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
        with engine.fused_tier(False):
            replayed = first(w2)
        torch.testing.assert_close(first(w2), replayed, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(first(w2), torch.func.vmap(torch.func.hessian(logp))(w2), atol=1e-4, rtol=1e-4)
    second = engine.trace(fn)
    with engine.fused_tier("force"):
        second(w)
        second(w)
    assert second.tiers()[0]["state"] == "fused" and second.tiers()[0]["from_disk"]
    torch.testing.assert_close(second(w), first(w), atol=0, rtol=0)


@pytest.mark.slow
def test_distribution_checks_are_reductions_inside_the_program_and_still_fail(monkeypatch, tmp_path):
    """torch.distributions' argument checks end in `_is_all_true`, which inductor does not lower:
    the worker lowers it to `all`, so the program holds no aten call for it (nor a stored boolean
    operand), and a check that fails still sends the call to the eager run, which raises."""
    monkeypatch.setattr(fused, "INDEX", fused.GraphIndex(tmp_path))
    import torch.distributions as D

    def logp(loc: torch.Tensor) -> torch.Tensor:
        return D.Normal(loc, 1.0).log_prob(torch.zeros(5)).sum()

    traced = engine.trace(logp)
    loc = torch.randn(5)
    with engine.fused_tier("force"):
        traced(loc)
        traced(loc)
    (entry,) = traced._cache.values()
    assert traced.tiers()[0]["state"] == "fused", traced.tiers()
    assert "_is_all_true" in entry.gm.code  # the recorded graph checks loc
    assert "_is_all_true" not in entry.fused.source
    torch.testing.assert_close(traced(loc), logp(loc))
    with pytest.raises(ValueError, match="loc"):
        traced(torch.tensor([0.0, float("nan"), 0.0, 0.0, 0.0]))


def test_the_worker_splits_the_stacked_guard_into_one_expression_with_the_same_values():
    """split_stacked_all turns the replay guard's all(stack(conditions)) into all(c0) & all(c1) &
    ...: no stack left, and the same truth value for every combination of the conditions."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from engine.fused_worker import split_stacked_all

    aten = torch.ops.aten

    def guarded(x, b, c):
        return [x + 1, aten.all.default(aten.stack.default([(x > 0).all(), b, c]))]

    gm = make_fx(guarded)(torch.ones(3), torch.tensor(True), torch.tensor(True))
    split_stacked_all(gm)
    assert aten.stack.default not in {n.target for n in gm.graph.nodes}
    for x in (torch.ones(3), torch.tensor([1.0, -1.0, 1.0])):
        for b in (True, False):
            for c in (True, False):
                args = (x, torch.tensor(b), torch.tensor(c))
                got, want = gm(*args), guarded(*args)
                assert torch.equal(got[0], want[0]) and got[1].shape == () and bool(got[1]) == bool(want[1])


def test_a_kernel_pinned_to_its_grad_mode_is_carried_by_the_fused_tier():
    """nn.LSTM's oneDNN kernel is replayed in the grad mode it was recorded in (engine.trace's
    `_in_grad_mode` wrapper: the kernel rounds differently under no_grad, and a replay is bit for
    bit). The fused tier refused the wrapper, so no LSTM graph was ever fused (nn_lstm stayed on
    the replay tier); its program now calls the kernel itself, within the fused tier's tolerance."""
    from engine.trace import _signature

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 8, batch_first=True)
    params = {k: v.detach() for k, v in lstm.named_parameters()}

    def loss(p: dict, xi: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(lstm, p, (xi.unsqueeze(0),))[0].square().sum()

    traced = engine.trace(engine.vmap(engine.grad(loss), in_dims=(None, 0)))
    x = torch.randn(3, 5, 8)
    traced(params, x)
    entry = _entry(traced)
    assert any(getattr(n.target, "__name__", "") == "_in_grad_mode" for n in entry.gm.graph.nodes)
    rebuilt = build_graph(fused.describe_graph(entry.gm))
    inputs = entry.inputs(_signature((params, x), {})[1])
    with torch.no_grad():
        for got, want in zip(rebuilt(*inputs), entry.gm(*inputs), strict=True):
            torch.testing.assert_close(got, want)


class _Clock:
    """A stand-in for the `time` module the trial reads: its seconds move only when a stand-in
    call says it took some, so a verdict does not depend on how busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> object:  # the rest of `time` as it is (a compile thread's deadlines)
        import time

        return getattr(time, name)


class _Sleepy:
    """A stand-in program: the replay's outputs, taking `seconds` on `clock`."""

    def __init__(self, entry: object, seconds: float, clock: _Clock) -> None:
        self.entry, self.seconds, self.clock, self.calls = entry, seconds, clock, 0

    def __call__(self, inputs: list, *proof: object) -> object:  # (a fold's proof, see FusedProgram)
        self.calls += 1
        self.clock.now += self.seconds
        return self.entry.run(*inputs)


@pytest.mark.parametrize("slow", [True, False], ids=["slower_dropped", "faster_kept"])
def test_a_program_slower_than_the_replay_is_dropped_after_its_trial(slow, monkeypatch):
    """The tier's first calls of a CPU program alternate with the replay, timed; a program slower
    than the replay (inductor's layouts for large convolutions) is dropped and the signature keeps
    replaying, shown as 'slower' by tiers(); a faster one replaces the trial."""
    clock = _Clock()
    monkeypatch.setattr(fused, "time", clock)
    traced = engine.trace(_double_plus_one)
    x = torch.randn(4)
    traced(x)
    entry = _entry(traced)
    tier = fused.Tier(entry)
    tier.state = "fused"
    program = _Sleepy(entry, 0.02 if slow else 0.0, clock)
    entry.fused = fused.Trial(program, entry, tier)
    entry.run = _sleeping(entry.run, 0.0 if slow else 0.02, clock)
    with engine.fused_tier(True):
        for _ in range(2 * (fused.TRIAL_CALLS + 1)):
            torch.testing.assert_close(traced(x), _double_plus_one(x))
        assert program.calls == fused.TRIAL_CALLS + 1
        if slow:
            assert entry.fused is None and tier.state == "slower" and "replay is kept" in tier.error
            traced(x)
            assert program.calls == fused.TRIAL_CALLS + 1
        else:
            assert entry.fused is program and tier.state == "fused"
            traced(x)
            assert program.calls == fused.TRIAL_CALLS + 2


def test_a_trial_hands_the_fold_proof_to_its_program():
    """The trial stands in for the program while it times it: the fold's proof and the live
    positions reach the program, which checks beside them from then on (see FusedProgram)."""
    traced = engine.trace(_double_plus_one)
    x = torch.randn(4)
    traced(x)
    entry = _entry(traced)
    program = fused.FusedProgram(lambda args: ("ran",), ((1,),), "key", 0.0, "")
    trial = fused.Trial(program, entry, fused.Tier(entry))
    proof = (torch.zeros(4),)
    assert trial([torch.zeros(4)], proof, (0,)) == ("ran",)  # the trial's first call is the program's
    assert program.proof is proof


def _sleeping(run, seconds: float, clock: _Clock):
    def slept(*args):
        clock.now += seconds
        return run(*args)
    return slept


def test_a_program_refuses_inputs_of_other_sizes_dtype_or_device_with_the_same_strides():
    """A captured tensor or folded value can change its sizes or dtype between calls where the
    signature does not look (`t.data = t.view(torch.int32)`, `t.data = torch.randn(8)`): the
    program would read the memory as compiled, silently. Its full check compares them."""
    x = torch.randn(4)
    program = fused.FusedProgram(lambda args: [args[0] * 2], (x.stride(),), "k", 0.0, "",
                                 ((x.shape, x.dtype, x.device),))
    torch.testing.assert_close(program([x])[0], x * 2)
    assert program([x.view(torch.int32)]) is None
    assert program([torch.randn(8)]) is None  # same strides (1,), other sizes
    assert program([x.double()]) is None


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def _ends(pid: int, within_s: float = 60.0) -> bool:
    import time

    deadline = time.monotonic() + within_s
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _running(pid)


@pytest.mark.skipif(not hasattr(__import__("os"), "killpg") or not __import__("os").path.isdir("/proc"),
                    reason="POSIX process groups and /proc")
def test_the_compile_worker_ends_with_the_process_that_started_it():
    """A compile worker left running after its caller is gone would take a core from whatever
    runs next, for minutes, for a program no one stores: a process under
    fused_worker.exit_with_parent (the worker runs it first), busy, ends with the compilers it
    started once its parent dies without running exit handlers. The tier starts its worker
    leading its own process group."""
    import os
    import subprocess
    import sys

    busy = ("import subprocess, time\nfrom engine.fused_worker import exit_with_parent\nexit_with_parent(0.1)\n"
            "c = subprocess.Popen(['sleep', '600'])\nprint(c.pid, flush=True)\ntime.sleep(600)\n")
    parent = ("import os, subprocess, sys\n"
              f"w = subprocess.Popen([sys.executable, '-c', {busy!r}], stdout=subprocess.PIPE, text=True, "
              "start_new_session=True)\n"
              "print(w.pid, w.stdout.readline().strip(), flush=True)\nos._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=120, check=True)
    worker, child = map(int, out.stdout.split()[-2:])
    assert _ends(worker), f"the worker {worker} outlived its caller"
    assert _ends(child), f"the worker's compiler {child} outlived it"

    code = "import os\nfrom engine import fused\nw = fused._COMPILER._worker()\nprint(w.pid, os.getsid(w.pid), flush=True)\n"
    pid, session = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                           check=True).stdout.split()[-2:])
    assert session == pid, "the tier's worker does not lead its own process group"
    assert _ends(pid)
    assert "exit_with_parent()" in open(fused.__file__.replace("fused.py", "fused_worker.py")).read().split(
        'if __name__ == "__main__":')[1]


@pytest.mark.skipif(not hasattr(__import__("os"), "killpg") or not __import__("os").path.isdir("/proc"),
                    reason="POSIX process groups and /proc")
def test_at_exit_a_busy_worker_is_ended_with_its_children():
    """fused._end_worker (registered at exit) ends a worker still compiling, and what it runs."""
    import subprocess
    import sys

    code = "import subprocess, sys, time\nc = subprocess.Popen(['sleep', '120'])\nprint(c.pid, flush=True)\ntime.sleep(120)\n"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    child = int(process.stdout.readline())
    fused._end_worker(process)
    process.wait(30)
    assert _ends(child), "the worker's compiler outlived it"
    fused._end_worker(process)  # a second call, on a process gone: nothing
