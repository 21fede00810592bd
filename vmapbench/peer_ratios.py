"""Our engine against the peers, per workload, side by side in one process.

    python -m vmapbench.peer_ratios                       # every workload with a jax method
    python -m vmapbench.peer_ratios -w psg_mlp -w nn_lstm --rounds 25
    python -m vmapbench.peer_ratios --family per_sample_grads --write
    python -m vmapbench.peer_ratios --ours default -w bayes_hmc   # the default path (engine), not engine.trace
    python -m vmapbench.peer_ratios --device cuda --ours default  # on a GPU (fused programs as CUDA graphs)

For each workload that lists `jax` (or those named with `-w`), at its first quick size (else its
smallest; `--size` with one workload), the engine's replayed path (`engine_traced`, or
`engine_compiled` where the workload has no traced method: the compiled family), torch.func and
every peer the workload lists (jax, opacus_*, backpack) are built, called once (trace, compile or
jit happens there, untimed), checked against the float64 loop, and then timed interleaved: each
round times a batch of calls of every method in turn, alternating the order
(`suite.probes.interleaved_samples`), so a load burst on a shared machine hits all of them alike.
The table gives each method's median per call and the ratios the closing note of issue #17 asks
for: ours / jax and ours / the best (fastest by median) peer, plus both against torch.func. A
ratio is the median over the rounds of the ratio within each round (whose calls ran moments
apart); against the peers its interquartile range follows, the noise of that figure.

Equal footing is the methods' own (workloads.peers.jax_methods): same data and dtype (float32),
the same thread count for torch and XLA (`--threads`, default 1, set before jax is imported).
A peer whose package is missing is reported as skipped with the reason; a method that fails its
check or raises is reported as failed and left out of the ratios, never timed.
`--device cuda` runs every method on the GPU (jax needs a CUDA jaxlib there); a batch of calls is
timed up to the device's last result (torch.cuda.synchronize; jax blocks until ready).
`--write` stores the rows as results/peer_ratios/<machine>/<commit8>.json (VMAPBENCH_RESULTS_DIR
in place of results/). The tier column says what ours' settled call ran (`steady_tier`): eager,
replay, fused, or cuda graph.
It runs with glibc's malloc keeping its pages (measuring/malloc.py: it runs itself again with
GLIBC_TUNABLES set where the environment does not set it; set it empty to keep glibc's defaults):
page faults served by the VM's host made rounds bimodal, the method timed before deciding.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from measuring import malloc, stats
from measuring.sizes import default_size
from measuring.timer import first_call_seconds
from vmapbench.commands.options import add_device

PEERS: tuple[str, ...] = ("jax", "opacus_hooks", "opacus_ew", "opacus_functorch", "backpack")
# The engine's replayed path: the first of these the workload lists.
OURS: tuple[str, ...] = ("engine_traced", "engine_compiled")
# `--ours default`: the engine as a user gets it (automatic tracing: replays where proven, else
# eager), its fused tier forced in after the calls automatic tracing needs before it records.
DEFAULT_PATH = "engine"
REFERENCE = "torch_func"
# Our replayed graph with the fused tier off, timed beside the settled default path (the fused
# program where the tier compiled one): what the tier buys, in the same rounds.
REPLAY = "ours_replay"
DEFAULT_ROUNDS = 15
DEFAULT_BUDGET_S = 4.0


@dataclass
class Row:
    """One workload at one size: seconds per call of each timed method in every interleaved round
    (lists aligned by round), and why the others were not timed."""

    workload: str
    size: str
    ours: str
    samples: dict[str, list[float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    # Seconds of the first call of a freshly built method, cold (nothing cached: ours' trace plus
    # the fused compile, jax.jit's trace and XLA compile) and warm (a second build in the same
    # process: ours loads the program from the on-disk index, jax finds what its caches hold).
    first_call: dict[str, dict[str, float]] = field(default_factory=dict)
    fused_state: str | None = None  # the fused tier's state of ours after settling (fused, failed: why, ...)
    tier: str | None = None  # what ours' settled call ran: eager, replay, fused, cuda graph (steady_tier)
    device: str = "cpu"

    def break_even(self, method: str) -> float:
        """Calls after which `method` (cold first call, then steady calls) has cost less in total
        than as many torch.func calls; inf when its steady call is not faster; NaN if unmeasured."""
        first = self.first_call.get(method, {}).get("cold")
        seconds = self.seconds
        if first is None or method not in seconds or REFERENCE not in seconds:
            return math.nan
        steady, reference = seconds[method], seconds[REFERENCE]
        if steady >= reference:
            return math.inf
        return max(1.0, math.ceil((first - steady) / (reference - steady)))

    @property
    def seconds(self) -> dict[str, float]:
        """Median seconds per call of each timed method."""
        return {m: stats.median(s) for m, s in self.samples.items()}

    @property
    def best_peer(self) -> str | None:
        seconds = self.seconds
        timed = [p for p in PEERS if p in seconds]
        return min(timed, key=seconds.__getitem__) if timed else None

    def round_ratios(self, method: str | None, over: str | None) -> list[float]:
        """method's time / over's time in each round (the two ran moments apart); [] when either
        was not timed."""
        if method not in self.samples or over not in self.samples:
            return []
        return [a / b for a, b in zip(self.samples[method], self.samples[over], strict=True)]

    def ratio(self, method: str | None, over: str | None) -> float:
        """Median over the rounds of method / over; NaN when either was not timed."""
        ratios = self.round_ratios(method, over)
        return stats.median(ratios) if ratios else math.nan

    def quartiles(self, method: str | None, over: str | None) -> tuple[float, float]:
        """The first and third quartiles of the per-round ratios (their spread: the noise)."""
        ratios = self.round_ratios(method, over)
        if not ratios:
            return math.nan, math.nan
        q1, _, q3 = stats.quartiles(ratios, method="inclusive")
        return q1, q3


def ours_of(workload: Any, default_path: bool = False) -> str:
    """The engine's replayed method of `workload`: engine_traced, else engine_compiled; with
    `default_path`, `engine` (automatic tracing) where the workload has it."""
    if default_path and DEFAULT_PATH in workload.methods:
        return DEFAULT_PATH
    for method in OURS:
        if method in workload.methods:
            return method
    raise ValueError(f"workload {workload.name!r} has none of {OURS}; it has {', '.join(workload.methods)}")


def selected_workloads(names: Sequence[str] | None, family: str | None) -> list[Any]:
    """The named workloads (each must have our replayed path and a peer), else every one with `jax`."""
    import workloads

    if names:
        chosen = [workloads.get(n) for n in names]
        for w in chosen:
            if not any(m in w.methods for m in OURS) or not any(p in w.methods for p in PEERS):
                raise SystemExit(f"peer_ratios: workload {w.name!r} needs one of {OURS} and a peer method "
                                 f"({', '.join(PEERS)}); it has {', '.join(w.methods)}")
    else:
        chosen = [w for w in workloads.all_workloads() if "jax" in w.methods and any(m in w.methods for m in OURS)]
    return [w for w in chosen if family is None or w.family == family]


def jax_unavailable(device: str = "cpu") -> str | None:
    """Why the jax method cannot run in this process on `device` (None when it can)."""
    from workloads.peers.jax_methods import load_jax

    try:
        load_jax(device)
    except NotImplementedError as exc:
        return str(exc)
    return None


def measure_workload(workload: Any, size: str, rounds: int, budget_s: float,
                     jax_reason: str | None = None, fused: bool = True, default_path: bool = False,
                     device: str = "cpu") -> Row:
    """Build, first-call and check every contender of `workload` at `size`, then time them interleaved.

    With `fused` (the default) ours' first build forces the fused tier's compile (what the default
    path reaches after enough calls) and its timings run after `engine.settle()`; without it the
    whole measurement runs with the fused tier off (ours is the replay)."""
    import engine

    if not fused:
        with engine.fused_tier(False):
            return measure_workload(workload, size, rounds, budget_s, jax_reason, fused=True,
                                    default_path=default_path, device=device)
    from engine import autotrace
    from suite import probes
    from workloads.peers import PeerUnavailable

    ours = ours_of(workload, default_path)
    row = Row(workload.name, size, ours, device=device)
    params = workload.params(size)
    state = workload.setup(params, device)
    calls: dict[str, Callable[[], Any]] = {}
    for method in (ours, REFERENCE, *PEERS):
        if method not in workload.methods:
            continue
        if method == "jax" and jax_reason is not None:
            row.skipped[method] = jax_reason
            continue
        try:
            if method in (ours, "jax"):
                from engine import fused

                seen = len(fused.HISTORY)
                cold = _first_call(workload, method, state, device)
                if method == ours:
                    row.fused_state = _fused_state(fused.HISTORY[seen:])
                warm = _first_call(workload, method, workload.setup(params, device), device)
                row.first_call[method] = {"cold": cold, "warm": warm}
            workload.check(state, [method])  # builds it, first call (trace/compile/jit), float64 loop check
        except PeerUnavailable as exc:
            row.skipped[method] = str(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - reported in the row, never timed
            row.failed[method] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            continue
        calls[method] = functools.partial(workload.run, method, state)
    if ours in calls and engine.fused.fused_mode() != "off":
        calls[REPLAY] = functools.partial(_replayed, workload, ours, state)
    engine.settle()  # nothing compiles while the timings run
    if ours in calls and engine.fused.fused_mode() != "off":
        # The program's trial against the replay (engine.fused.Trial) ends before the timings.
        slower = len(engine.fused.DROPPED)
        for _ in range(engine.fused.TRIAL_LENGTH):
            calls[ours]()
        if len(engine.fused.DROPPED) > slower:
            row.fused_state = f"{row.fused_state}, slower than the replay: replay kept"
    if ours == DEFAULT_PATH and ours in calls:
        eager = _eager_reason(list(autotrace._shared_autos.values()), calls[ours])
        if eager is not None:
            row.fused_state = eager
    if ours in calls:
        row.tier = steady_tier(calls[ours])
    if calls:
        row.samples = probes.interleaved_samples(calls, device, rounds=rounds, budget_s=budget_s)
    return row


def _first_call(workload: Any, method: str, state: Any, device: str = "cpu") -> float:
    """Seconds until `method`, freshly built on `state`, runs at its steady tier: its first call,
    and for ours the second, which with the fused tier forced compiles (or loads) its program."""
    import engine
    from workloads.base import AUTO_TRACE_WARMUP

    def to_steady() -> None:
        workload.run(method, state)
        if method == DEFAULT_PATH:  # seen, verified, recorded: the next call is the first replay
            for _ in range(AUTO_TRACE_WARMUP):
                workload.run(method, state)
        if method in (*OURS, DEFAULT_PATH) and engine.fused.fused_mode() != "off":
            with engine.fused_tier("force"):
                workload.run(method, state)
            engine.settle()

    return first_call_seconds(to_steady, device)


def _eager_reason(autos: list[Any], call: Callable[[], Any]) -> str | None:
    """Why the default path's settled call runs eagerly (None when one more call replays): of the
    automatic tracing states (`autos`), those that `call` ran either replayed or ran eagerly, for
    a reason (a function found impure) or none (nothing recorded it could replay). The tier
    column must not say "replay" for eager calls (on a lent GPU, torch 2.11 on Python 3.12 made
    every function impure there)."""
    before = [(a.traced._hits, a.eager_calls) for a in autos]
    call()
    if any(a.traced._hits > hits for a, (hits, _) in zip(autos, before)):
        return None
    reasons = [a.impure for a, (_, eager) in zip(autos, before) if a.eager_calls > eager and a.impure is not None]
    return f"eager: {reasons[0][:200]}" if reasons else "eager: no replay (automatic tracing recorded nothing it could replay)"


def steady_tier(call: Callable[[], Any]) -> str:
    """Which tier served one call of `call`: 'cuda graph' (a fused program replayed as one CUDA
    graph), 'fused' (a fused program), 'replay' (the recorded graph op by op), or 'eager' (no
    recorded graph ran); several, joined by '+', when its traced functions ran on different tiers."""
    from engine import fused
    from engine.trace import Entry

    ran: list[Any] = []
    plain_call = Entry.call

    def recording(entry: Any, flat: Any) -> Any:
        ran.append(entry)
        return plain_call(entry, flat)

    Entry.call = recording  # type: ignore[method-assign]
    try:
        call()
    finally:
        Entry.call = plain_call  # type: ignore[method-assign]
    tiers: list[str] = []
    for entry in ran:
        program = entry.fused if fused.fused_mode() != "off" else None
        if program is None:
            tier = "replay"
        elif isinstance(program, fused.CudaGraphed) and not program.plain and program.graph is not None:
            tier = "cuda graph"
        else:
            tier = "fused"
        if tier not in tiers:
            tiers.append(tier)
    return "+".join(tiers) if tiers else "eager"


def _replayed(workload: Any, method: str, state: Any) -> Any:
    import engine

    with engine.fused_tier(False):
        return workload.run(method, state)


def _fused_state(jobs: list[dict[str, Any]]) -> str:
    """What the fused tier did for ours' first build: 'compiled' or 'from disk' (the cold figure
    then includes no compile: clear TORCHINDUCTOR_CACHE_DIR for a cold one), 'failed: why', or
    'replay' when no graph of it could be fused (in-place writes, autograd outputs)."""
    if not jobs:
        return "replay"
    failed = [j for j in jobs if j["error"]]
    if failed:
        return f"failed: {failed[0]['error'][:160]}"
    return "from disk" if all(j["from_disk"] for j in jobs) else "compiled"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3g} ms"


def _x(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _x_spread(row: Row, method: str | None, over: str | None) -> str:
    """The median ratio with its interquartile range over the rounds, e.g. '0.64 (0.58-0.71)'."""
    ratio = row.ratio(method, over)
    if math.isnan(ratio):
        return "-"
    q1, q3 = row.quartiles(method, over)
    return f"{ratio:.2f} ({q1:.2f}-{q3:.2f})"


def markdown(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (docs/results/peers.md renders it from a stored run).
    Ratios are medians over the rounds of the per-round ratio; against the peers, with their
    interquartile range in parentheses."""
    lines = [
        "| workload | size | ours | ours ms | torch.func ms | jax ms | ours / jax | best peer | ours / best peer "
        "| ours / torch.func | best peer / torch.func |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        best = r.best_peer
        lines.append(
            f"| {r.workload} | {r.size} | {r.ours} | {_ms(r.seconds.get(r.ours))} | {_ms(r.seconds.get(REFERENCE))} "
            f"| {_ms(r.seconds.get('jax'))} | {_x_spread(r, r.ours, 'jax')} | {best or '(none ran)'} "
            f"| {_x_spread(r, r.ours, best)} | {_x(r.ratio(r.ours, REFERENCE))} | {_x(r.ratio(best, REFERENCE))} |"
        )
    return "\n".join(lines)


def compile_markdown(rows: Sequence[Row]) -> str:
    """Compile cost on the record: per workload, ours and jax.jit's cold and warm first call, the
    steady call, and the break-even number of calls against torch.func."""
    lines = [
        "| workload | ours replay ms | ours steady ms | ours tier | ours cold first s | ours warm first s "
        "| ours break-even calls | jax steady ms | jax cold first s | jax warm first s | jax break-even calls |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def first(r: Row, m: str, which: str) -> str:
        v = r.first_call.get(m, {}).get(which)
        return "-" if v is None else f"{v:.2f}"

    def calls(v: float) -> str:
        return "-" if math.isnan(v) else "never" if math.isinf(v) else f"{v:.0f}"

    for r in rows:
        sec = r.seconds
        lines.append(
            f"| {r.workload} | {_ms(sec.get(REPLAY))} | {_ms(sec.get(r.ours))} | {_tier_cell(r)} "
            f"| {first(r, r.ours, 'cold')} | {first(r, r.ours, 'warm')} | {calls(r.break_even(r.ours))} "
            f"| {_ms(sec.get('jax'))} | {first(r, 'jax', 'cold')} | {first(r, 'jax', 'warm')} "
            f"| {calls(r.break_even('jax'))} |"
        )
    return "\n".join(lines)


def _tier_cell(row: Row) -> str:
    """The tier ours' settled call ran, with the fused tier's state (compiled, from disk, why eager)."""
    if row.tier is None or row.tier == "eager" and (row.fused_state or "").startswith("eager"):
        return row.fused_state or row.tier or "-"
    return f"{row.tier} ({row.fused_state})" if row.fused_state and row.fused_state != row.tier else row.tier


def notes(rows: Sequence[Row]) -> list[str]:
    """One line per method that was skipped or failed."""
    out = []
    for r in rows:
        out += [f"{r.workload} [{r.size}] {m} skipped: {why}" for m, why in r.skipped.items()]
        out += [f"{r.workload} [{r.size}] {m} FAILED: {why}" for m, why in r.failed.items()]
    return out


def write(rows: Sequence[Row], threads: int, device: str = "cpu") -> Path:
    """results/peer_ratios/<machine>/<commit8>.json under the repository root."""
    from vmapbench.bench import cpu_model, git, machine_name, repo_root, results_dir, software_facts

    root = repo_root()
    machine, commit = machine_name(), git(root, "rev-parse", "HEAD")
    path = results_dir(root) / "peer_ratios" / machine / f"{commit[:8]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    written = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    document = {"machine": machine, "cpu": cpu_model(), "cores": os.cpu_count(), "commit": commit,
                "written_at": written, "torch": torch.__version__, "threads": threads, "device": device,
                "software": software_facts(root),
                "glibc_tunables": os.environ.get(malloc.VARIABLE),
                "rows": [{**asdict(r), "seconds": r.seconds, "best_peer": r.best_peer,
                          "break_even": {m: r.break_even(m) for m in r.first_call}} for r in rows]}
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def overhead(rounds: int, budget_s: float) -> dict[str, list[float]]:
    """Per-call cost of an empty-ish program (`x + 1` on 8 floats), interleaved: what each way of
    running a recorded graph adds on top of its one kernel. torch eager is one aten call from
    Python; replay is engine.trace's graph op by op; fused is the fused tier's program through
    TracedFunction (signature, checks); program is inductor's generated `call` alone; artifact is
    standalone_compile's (AOTAutograd's runtime wrapper); jax.jit is XLA's, result ready."""
    import engine
    from engine.trace import compile_with_inductor
    from suite import probes

    x = torch.randn(8)
    replay, fused_fn = engine.trace(lambda t: t + 1), engine.trace(lambda t: t + 1)
    replay(x)
    with engine.fused_tier("force"):
        fused_fn(x), fused_fn(x)
    engine.settle()
    (entry,) = fused_fn._cache.values()
    if entry.fused is None:
        raise RuntimeError(f"the fused tier did not compile the empty-ish graph: {fused_fn.tiers()}")
    program = entry.fused.call
    artifact = compile_with_inductor(entry.gm, [x], {})
    calls: dict[str, Callable[[], Any]] = {
        "torch eager": lambda: x + 1,
        "replay": lambda: _replay_off(replay, x),
        "fused": lambda: fused_fn(x),
        "program": lambda: program([x]),
        "artifact": lambda: artifact(x),
    }
    if jax_unavailable() is None:
        import jax
        import jax.numpy as jnp

        jitted, xj = jax.jit(lambda t: t + 1), jnp.ones(8, dtype=jnp.float32)
        jitted(xj).block_until_ready()
        calls["jax.jit"] = lambda: jitted(xj).block_until_ready()
    return probes.interleaved_samples(calls, "cpu", rounds=rounds, budget_s=budget_s)


def _replay_off(fn: Callable[[Any], Any], x: Any) -> Any:
    import engine

    with engine.fused_tier(False):
        return fn(x)


def overhead_markdown(samples: dict[str, list[float]]) -> str:
    """Median microseconds per call, with each round's ratio to jax.jit (median, interquartile range)."""
    lines = ["| path | us per call | / jax.jit |", "| --- | --- | --- |"]
    for name, values in samples.items():
        spread = "-"
        if "jax.jit" in samples:
            ratios = [a / b for a, b in zip(values, samples["jax.jit"], strict=True)]
            q1, median, q3 = stats.quartiles(ratios, method="inclusive")
            spread = f"{median:.2f} ({q1:.2f}-{q3:.2f})"
        lines.append(f"| {name} | {stats.median(values) * 1e6:.2f} | {spread} |")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-w", "--workload", action="append", dest="workloads", metavar="W",
                        help="workload (repeatable); default: every workload with a jax method")
    parser.add_argument("--family", help="only workloads of this family")
    parser.add_argument("--size", help="size label (with exactly one -w); default: first quick size, else smallest")
    parser.add_argument("--threads", type=int, default=1, help="torch and XLA intra-op threads (default 1)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help=f"interleaved rounds (default {DEFAULT_ROUNDS})")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"timing budget per workload in seconds; rounds shrink to fit, never below 3 "
                             f"(default {DEFAULT_BUDGET_S})")
    parser.add_argument("--overhead", action="store_true",
                        help="only the per-call overhead of an empty-ish program: replay, fused, jax.jit, ...")
    parser.add_argument("--no-fused", action="store_true",
                        help="measure with the fused tier off (ours is the replayed graph; no compiles)")
    parser.add_argument("--ours", choices=("traced", "default"), default="traced",
                        help="our method: 'traced' (engine_traced: an explicit engine.trace, the default) or "
                             "'default' (engine: the default path, automatic tracing, where it replays and eager "
                             "where it does not); both with the fused tier forced in and settled")
    add_device(parser, help="where every method runs (default cpu); cuda needs a GPU, and jax a CUDA jaxlib")
    parser.add_argument("--write", action="store_true", help="store the rows under results/peer_ratios/")


def main(args: argparse.Namespace) -> int:
    if args.size is not None and len(args.workloads or ()) != 1:
        raise SystemExit("peer_ratios: --size needs exactly one -w WORKLOAD")
    import workloads  # noqa: F401 - installs the CUDA stand-in where VMAPBENCH_CUDA_STANDIN asks for it

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("peer_ratios: --device cuda, but torch sees no CUDA device here")
    torch.set_num_threads(args.threads)  # before jax is imported: load_jax matches XLA's threads to it
    if args.overhead:
        print(f"torch {torch.__version__}, {args.threads} thread(s): x + 1 on 8 float32, interleaved rounds")
        print(overhead_markdown(overhead(args.rounds, args.budget_s)))
        return 0
    chosen = selected_workloads(args.workloads, args.family)
    if not chosen:
        raise SystemExit("peer_ratios: no workload selected")
    jax_reason = jax_unavailable(args.device)
    rows = []
    for w in chosen:
        size = args.size or default_size(w)
        print(f"{w.name} [{size}] ...", file=sys.stderr, flush=True)
        rows.append(measure_workload(w, size, args.rounds, args.budget_s, jax_reason, fused=not args.no_fused,
                                     default_path=args.ours == "default", device=args.device))
    print(f"torch {torch.__version__}, {args.threads} thread(s), float32, {args.device}; interleaved rounds (up to "
          f"{args.rounds}, {args.budget_s:g} s per workload): median per call, ratios median of the per-round "
          "ratios (interquartile range); every method checked against the float64 loop first")
    print(markdown(rows))
    print()
    print(compile_markdown(rows))
    for line in notes(rows):
        print(line)
    if args.write:
        print(f"wrote {write(rows, args.threads, args.device)}")
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m vmapbench.peer_ratios", description=__doc__.splitlines()[0])
    configure(parser)
    arguments = parser.parse_args()
    malloc.reexec_with_tunables("peer_ratios")  # the command line only: a caller's process is its own
    sys.exit(main(arguments))
