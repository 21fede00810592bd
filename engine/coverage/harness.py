"""The conformance harness proper: batched inputs, bdim patterns, per-op classification.

For each sample of an op, every tensor leaf is turned into B=3 *different* copies (floating tensors
get relative noise; integer and bool tensors are repeated, which keeps index tensors valid). If the
noise breaks the op's domain (the loop reference raises or turns finite values non-finite), scaled
copies are used instead, which keep symmetry, positivity and definiteness. Every sample runs under
every pattern of PATTERNS: the batch dim at 0, at -1 and in the middle, each as a contiguous tensor
stacked there (at -1 the batch stride is 1) and as a non-contiguous view; an expanded (stride-0)
batch; only the first or the last tensor batched (at 0 or -1), the others not; out_dims=-1. A rule
that assumes one memory layout or one batch position fails one of them. Each op is time-boxed:
once its budget is spent no further sample starts.
"""
from __future__ import annotations

import contextlib
import random
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import engine

B = 3
STATUSES = ("native", "fallback", "mismatch", "error", "skip")
# Worst status wins when several samples/patterns disagree.
_RANK = {"native": 0, "fallback": 1, "error": 2, "mismatch": 3}
_TORCH_FALLBACK_TEXT = "There is a performance drop"


@dataclass
class OpResult:
    """Classification of one OpInfo entry, with the first failure's message for the report."""

    op: str
    family: str
    engine: str = "skip"
    torch_func: str = "skip"
    vjp_engine: str | None = None
    detail: dict[str, str] = field(default_factory=dict)
    fallback_ops: list[str] = field(default_factory=list)
    patterns: dict[str, dict[str, str]] = field(default_factory=dict)
    samples: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = {"op": self.op, "family": self.family, "engine": self.engine, "torch_func": self.torch_func}
        if self.vjp_engine is not None:
            d["vjp_engine"] = self.vjp_engine
        if self.detail:
            d["detail"] = self.detail
        if self.fallback_ops:
            d["fallback_ops"] = self.fallback_ops
        if self.patterns:
            d["patterns"] = self.patterns
        d["samples"] = self.samples
        d["seconds"] = round(self.seconds, 4)
        return d


def op_key(opinfo: Any) -> str:
    """The name an op has in the report and the expectations file: 'name' or 'name.variant'."""
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


def family_of(opinfo: Any) -> str:
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo

    name = opinfo.name
    for prefix, fam in (("linalg.", "linalg"), ("nn.functional.", "nn"), ("fft.", "fft"), ("special.", "special"), ("_refs", "refs")):
        if name.startswith(prefix):
            return fam
    if isinstance(opinfo, (UnaryUfuncInfo, BinaryUfuncInfo)):
        return "pointwise"
    if isinstance(opinfo, ReductionOpInfo):
        return "reduction"
    if name in {"cholesky", "cholesky_solve", "cholesky_inverse", "inverse", "det", "logdet", "slogdet", "pinverse",
                "matmul", "mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "mv", "dot", "vdot", "einsum", "inner",
                "outer", "kron", "tensordot", "chain_matmul", "lu", "lu_solve", "lu_unpack", "qr", "svd", "svd_lowrank",
                "pca_lowrank", "triangular_solve", "geqrf", "ormqr", "matrix_exp", "addr", "trace", "symeig", "cross"}:
        return "linalg"
    if name in {"index_select", "index_add", "index_copy", "index_fill", "index_put", "index_reduce", "gather",
                "scatter", "scatter_add", "scatter_reduce", "take", "take_along_dim", "put", "masked_fill",
                "masked_scatter", "masked_select", "__getitem__", "nonzero", "nonzero_static", "argwhere"}:
        return "indexing"
    return "misc"


def iter_opinfos(names: Iterable[str] | None = None) -> Iterator[Any]:
    """OpInfo entries that support float32 on CPU (optionally only those whose key is in `names`)."""
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = set(names) if names is not None else None
    for opinfo in op_db:
        if wanted is not None and op_key(opinfo) not in wanted:
            continue
        if torch.float32 not in opinfo.supported_dtypes("cpu"):
            continue
        yield opinfo


# ---------------------------------------------------------------------------------------------
# batched inputs


def _copies(x: torch.Tensor, how: str, gen: torch.Generator) -> torch.Tensor:
    """[B, *x.shape]: B copies of x with different values (floating) or the same (integer/bool)."""
    if not x.is_floating_point() and not x.is_complex():
        return torch.stack([x] * B)
    if how == "noise":
        scale = x.detach().abs().mean() if x.numel() else torch.tensor(1.0)
        scale = scale if float(scale) > 0 else torch.tensor(1.0)
        noise = torch.randn((B - 1,) + tuple(x.shape), generator=gen, dtype=torch.float64).to(x.dtype)
        return torch.cat([x.detach().unsqueeze(0), x.detach().unsqueeze(0) + 0.1 * scale * noise])
    factors = (1.0, 0.9, 0.8)
    return torch.stack([x.detach() * f for f in factors])


def _leaves(sample: Any) -> tuple[list, Any, dict]:
    args = (sample.input, *sample.args)
    flat, spec = tree_flatten(args)
    return flat, spec, sample.kwargs


def _element(flat: list, stacked: dict[int, torch.Tensor], i: int) -> list:
    """Batch element i as the loop sees it: each example its own tensor (a clone, not a slice of the
    stack), so storage-level ops (as_strided's storage_offset) see per-example storage as under vmap."""
    return [stacked[j][i].clone() if j in stacked else a for j, a in enumerate(flat)]


def _call(fn: Callable, flat: list, spec: Any, kwargs: dict) -> Any:
    return fn(*tree_unflatten(flat, spec), **kwargs)


def _finite_like(out: Any) -> bool:
    leaves, _ = tree_flatten(out)
    return all(torch.isfinite(t).all() for t in leaves if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()))


class _Skip(Exception):
    pass


def _loop_reference(fn: Callable, flat: list, spec: Any, kwargs: dict, stacked: dict) -> list:
    outs = []
    for i in range(B):
        outs.append(_call(fn, _element(flat, stacked, i), spec, kwargs))
    return outs


def _stack_outputs(outs: list) -> Any:
    leaves0, spec = tree_flatten(outs[0])
    per = [tree_flatten(o)[0] for o in outs]
    stacked = []
    for j, leaf in enumerate(leaves0):
        if not isinstance(leaf, torch.Tensor):
            raise _Skip(f"output leaf {j} is a {type(leaf).__name__}, not a tensor")
        try:
            stacked.append(torch.stack([p[j] for p in per]))
        except RuntimeError as exc:  # data-dependent output shapes: not expressible as one batched tensor
            raise _Skip(str(exc)) from None
    return stacked


def _prepare(opinfo: Any, sample: Any, gen: torch.Generator) -> tuple[list, Any, dict, dict, list] | None:
    """Batched copies of a sample's tensors plus the loop reference, or None if unusable."""
    flat, spec, kwargs = _leaves(sample)
    tensor_idx = [j for j, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    if not tensor_idx or any(flat[j].layout != torch.strided for j in tensor_idx):
        return None  # no tensor to batch, or sparse/nested layouts the batched tensor does not model
    fn = opinfo.op
    try:
        base_finite = _finite_like(_call(fn, flat, spec, kwargs))
    except Exception:  # noqa: BLE001 - a sample the op itself rejects is not usable
        return None
    for how in ("noise", "scale"):
        stacked = {j: _copies(flat[j], how, gen) for j in tensor_idx}
        try:
            outs = _loop_reference(fn, flat, spec, kwargs, stacked)
        except Exception:  # noqa: BLE001 - the copies left the op's domain: try gentler copies
            continue
        if base_finite and not all(_finite_like(o) for o in outs):
            continue
        try:
            expected = _stack_outputs(outs)
        except _Skip:
            return None
        return flat, spec, kwargs, stacked, expected
    return None


@dataclass(frozen=True)
class Pattern:
    """How the B copies of a sample's tensors enter vmap.

    `where`: the batch dim's position in each batched input, 0, -1 or "mid" (the middle dim);
    `layout`: "stack" (a contiguous tensor stacked there: at -1 the batch stride is 1), "view" (the
    dim-0 stack moved there, a non-contiguous view) or "expand" (copy 0 expanded, stride 0);
    `only`: None batches every tensor leaf, "first" / "last" only that tensor leaf (the others take
    copy 0, unbatched); `out_dim`: vmap's out_dims.
    """

    name: str
    where: Any = 0
    layout: str = "stack"
    only: str | None = None
    out_dim: int = 0


PATTERNS = (
    Pattern("0"),
    Pattern("-1", where=-1),
    Pattern("-1.view", where=-1, layout="view"),
    Pattern("mid", where="mid"),
    Pattern("mid.view", where="mid", layout="view"),
    Pattern("expand", layout="expand"),
    Pattern("first", only="first"),
    Pattern("first-1", where=-1, only="first"),
    Pattern("last-1", where=-1, only="last"),
    Pattern("out-1", out_dim=-1),
)
PATTERN_NAMES = tuple(p.name for p in PATTERNS)


def _patterns(n_tensors: int) -> list[Pattern]:
    """The patterns worth running: with one tensor leaf, the only-one patterns repeat others."""
    if n_tensors > 1:
        return list(PATTERNS)
    return [p for p in PATTERNS if p.only is None]


def _batched_leaves(stacked: dict, pattern: Pattern) -> list[int]:
    idx = sorted(stacked)
    if pattern.only == "first":
        return idx[:1]
    if pattern.only == "last":
        return idx[-1:]
    return idx


def _in_dim(s: torch.Tensor, where: Any) -> int:
    """The batch dim of a stacked [B, *shape] tensor under `where` (the middle of its dims for "mid")."""
    if where == "mid":
        return s.dim() // 2
    return 0 if where == 0 or s.dim() == 1 else where


def _place(s: torch.Tensor, pattern: Pattern) -> tuple[torch.Tensor, int]:
    """The stacked copies s ([B, *shape]) laid out as `pattern` asks, and their in_dim."""
    if pattern.layout == "expand":
        return s[0].unsqueeze(0).expand(s.shape), 0
    d = _in_dim(s, pattern.where)
    if d == 0:
        return s, 0
    moved = s.movedim(0, d)
    return (moved if pattern.layout == "view" else moved.contiguous()), d


def _run_pattern(vmap_impl: Callable, fn: Callable, flat: list, spec: Any, kwargs: dict, stacked: dict, pattern: Pattern) -> Any:
    idx = _batched_leaves(stacked, pattern)
    batched, dims = [], []
    for j in idx:
        t, d = _place(stacked[j], pattern)
        batched.append(t)
        dims.append(d)
    # Unbatched leaves take the first copy (equal to the original sample) so the reference holds.
    fixed = [stacked[j][0] if j in stacked else a for j, a in enumerate(flat)]

    def f(*bs):
        leaves = list(fixed)
        for j, b in zip(idx, bs):
            leaves[j] = b
        return _call(fn, leaves, spec, kwargs)

    return vmap_impl(f, in_dims=tuple(dims), out_dims=pattern.out_dim)(*batched)


def _reference(fn: Callable, flat: list, spec: Any, kwargs: dict, stacked: dict, pattern: Pattern, cache: dict) -> list:
    """The for-loop answer for a pattern, stacked at `pattern.out_dim` (cached per batched set)."""
    idx = tuple(_batched_leaves(stacked, pattern))
    key = (idx, pattern.layout == "expand")
    if key not in cache:
        if key[1]:
            use = {j: stacked[j][:1].expand(stacked[j].shape) for j in idx}
        else:
            use = {j: stacked[j] for j in idx}
        fixed = [stacked[j][0] if j in stacked and j not in use else a for j, a in enumerate(flat)]
        cache[key] = _stack_outputs(_loop_reference(fn, fixed, spec, kwargs, use))
    expected = cache[key]
    if pattern.out_dim == 0:
        return expected
    return [e.movedim(0, pattern.out_dim) for e in expected]


def _compare(actual: Any, expected: list) -> str | None:
    leaves, _ = tree_flatten(actual)
    if len(leaves) != len(expected):
        return f"{len(leaves)} outputs, expected {len(expected)}"
    for j, (a, e) in enumerate(zip(leaves, expected)):
        if not isinstance(a, torch.Tensor):
            return f"output {j} is a {type(a).__name__}"
        if a.shape != e.shape:
            return f"output {j}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        if a.dtype != e.dtype:
            return f"output {j}: dtype {a.dtype}, expected {e.dtype}"
        try:
            torch.testing.assert_close(a, e, equal_nan=True, atol=1e-4, rtol=1e-4, check_stride=False)
        except AssertionError as exc:
            return f"output {j}: {str(exc).splitlines()[0]}"
    return None


# ---------------------------------------------------------------------------------------------
# one vmap implementation on one op


def _engine_vmap(f: Callable, in_dims: Any, out_dims: Any = 0) -> Callable:
    return engine.vmap(f, in_dims=in_dims, out_dims=out_dims)


def _torch_vmap(f: Callable, in_dims: Any, out_dims: Any = 0) -> Callable:
    return torch.func.vmap(f, in_dims=in_dims, out_dims=out_dims)


def _run_engine(fn, flat, spec, kwargs, stacked, pattern, fallbacks: set) -> Any:
    with engine.fallback_policy("silent"), engine.record_fallbacks() as rec:
        out = _run_pattern(_engine_vmap, fn, flat, spec, kwargs, stacked, pattern)
    fallbacks.update(rec.counts)
    return out, bool(rec.counts)


def _run_torch(fn, flat, spec, kwargs, stacked, pattern, fallbacks: set) -> Any:
    torch._C._debug_only_display_vmap_fallback_warnings(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = _run_pattern(_torch_vmap, fn, flat, spec, kwargs, stacked, pattern)
    finally:
        torch._C._debug_only_display_vmap_fallback_warnings(False)
    looped = [w for w in caught if _TORCH_FALLBACK_TEXT in str(w.message)]
    for w in looped:
        fallbacks.add(str(w.message).split("for ")[1].split(".")[0] if "for " in str(w.message) else "?")
    return out, bool(looped)


def _is_random(opinfo: Any, sample: Any) -> bool:
    flat, spec, kwargs = _leaves(sample)
    try:
        _seed(0)
        a = _call(opinfo.op, flat, spec, kwargs)
        _seed(1)
        b = _call(opinfo.op, flat, spec, kwargs)
    except Exception:  # noqa: BLE001
        return False
    la, lb = tree_flatten(a)[0], tree_flatten(b)[0]
    try:
        return any(isinstance(x, torch.Tensor) and not torch.equal(x, y) and not (x.isnan().any()) for x, y in zip(la, lb))
    except Exception:  # noqa: BLE001
        return False


def _vjp_check(opinfo: Any, sample: Any, gen: torch.Generator) -> str:
    """vmap over engine.vjp with batched cotangents, against a loop of torch.autograd.grad."""
    flat, spec, kwargs = _leaves(sample)
    diff_idx = [j for j, a in enumerate(flat) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if not diff_idx:
        return "skip"
    fixed = [a.detach() if isinstance(a, torch.Tensor) else a for a in flat]

    def f(*prims):
        leaves = list(fixed)
        for j, p in zip(diff_idx, prims):
            leaves[j] = p
        out = _call(opinfo.op, leaves, spec, kwargs)
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.is_floating_point()]
        return tuple(outs)

    prims = [fixed[j].clone() for j in diff_idx]
    try:
        ref_out = f(*[p.clone().requires_grad_() for p in prims])
    except Exception:  # noqa: BLE001
        return "skip"
    if not ref_out or not all(o.requires_grad for o in ref_out):
        return "skip"
    cots = [torch.randn((B,) + tuple(o.shape), generator=gen, dtype=torch.float64).to(o.dtype) for o in ref_out]
    try:
        expected = []
        for i in range(B):
            ps = [p.clone().requires_grad_() for p in prims]
            outs = f(*ps)
            gs = torch.autograd.grad(outs, ps, [c[i] for c in cots], allow_unused=True)
            expected.append([torch.zeros_like(p) if g is None else g for p, g in zip(ps, gs)])
        expected = [torch.stack([e[k] for e in expected]) for k in range(len(prims))]
    except Exception:  # noqa: BLE001
        return "skip"
    try:
        with engine.fallback_policy("silent"), engine.record_fallbacks() as rec:
            _, vjp_fn = engine.vjp(f, *prims)
            got = engine.vmap(lambda *c: vjp_fn(tuple(c)))(*cots)
    except Exception:  # noqa: BLE001
        return "error"
    got = [torch.zeros_like(e) if g is None else g for g, e in zip(got, expected)]
    if _compare(got, expected) is not None:
        return "mismatch"
    return "fallback" if rec.counts else "native"


def _unittest_fn_on_stack() -> Callable | None:
    """torch's `common_utils.extract_test_fn` without `inspect.stack()`: the same frames and the
    same test for a unittest method, but no source lines read. inspect's lookup scans every
    loaded module for each frame of code without a file (pytest-xdist's workers run under such
    frames), which made sampling an op's inputs several times slower there."""
    import sys
    import unittest

    frame = sys._getframe(1)
    while frame is not None:
        self_val = frame.f_locals.get("self")
        if isinstance(self_val, unittest.TestCase):
            *_, cls_name, test_name = self_val.id().rsplit(".", 2)
            if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                return getattr(self_val, test_name).__func__
        frame = frame.f_back
    return None


def _seed(seed: int) -> None:
    """Seed the cpu generator, the only one the samples (all on cpu) draw from. torch.manual_seed
    also queues a seeding of every accelerator not yet initialized, each with the caller's
    formatted stack: a cost per call that grows with the stack's depth."""
    torch.default_generator.manual_seed(seed)


def _cpu_set_rng_seed(seed: int | None = None) -> None:
    """torch's `common_utils.set_rng_seed` (seeded before each OpInfo sample) on the cpu generator."""
    from torch.testing._internal import common_utils

    seed = common_utils.SEED if seed is None else seed
    _seed(seed)
    random.seed(seed)
    if common_utils.TEST_NUMPY:
        import numpy

        numpy.random.seed(seed)


def _cpu_wrapper_set_seed(op: Callable, *args: Any, **kwargs: Any) -> Any:
    """torch's `wrapper_set_seed` (OpInfo's random ops run under it) for cpu tensors: the op at
    seed 42, the cpu generator's state restored after."""
    from torch.utils._mode_utils import no_dispatch

    with no_dispatch(), torch._C._DisableFuncTorch():  # as torch's freeze_rng_state reads it
        state = torch.get_rng_state()
    try:
        _seed(42)
        return op(*args, **kwargs)
    finally:
        with no_dispatch(), torch._C._DisableFuncTorch():
            torch.set_rng_state(state)


# (module, name, replacement): torch's test helpers as OpInfo samples and runs cpu ops here, the
# same frames, seeds and states, without the per-call stack walks of the originals.
_CPU_HELPERS = (
    ("torch.testing._internal.common_utils", "extract_test_fn", _unittest_fn_on_stack),
    ("torch.testing._internal.opinfo.core", "extract_test_fn", _unittest_fn_on_stack),  # imported by name
    ("torch.testing._internal.common_utils", "set_rng_seed", _cpu_set_rng_seed),
    ("torch.testing._internal.common_methods_invocations", "wrapper_set_seed", _cpu_wrapper_set_seed),
)


@contextlib.contextmanager
def _cpu_test_helpers() -> Iterator[None]:
    """torch's test helpers swapped for _CPU_HELPERS' while an op is checked (its samples are
    drawn lazily, inside the check), in those of their modules already imported (the op's own)."""
    import sys

    swapped = []
    for module_name, name, replacement in _CPU_HELPERS:
        module = sys.modules.get(module_name)
        before = getattr(module, name, None)
        if before is not None:
            swapped.append((module, name, before))
            setattr(module, name, replacement)
    try:
        yield
    finally:
        for module, name, before in reversed(swapped):
            setattr(module, name, before)


def _samples(opinfo: Any) -> Iterator[Any]:
    return iter(opinfo.sample_inputs("cpu", torch.float32, requires_grad=False))


def check_op(opinfo: Any, *, samples: int | None = None, time_box: float | None = 2.0, torch_func: bool = True,
             vjp: bool = False, seed: int = 0) -> OpResult:
    """Classify one OpInfo entry under engine.vmap (and torch.func.vmap as a reference).

    Every sample (or the first `samples`) runs under every pattern of PATTERNS; once `time_box`
    seconds are spent on the op, no further sample starts (the first usable one always runs
    whole). The op's status is its worst over samples and patterns; `res.patterns` keeps the worst
    per pattern."""
    with _cpu_test_helpers():
        return _check_op(opinfo, samples, time_box, torch_func, vjp, seed)


def _check_op(opinfo: Any, samples: int | None, time_box: float | None, torch_func: bool, vjp: bool,
              seed: int) -> OpResult:
    t0 = time.perf_counter()
    res = OpResult(op_key(opinfo), family_of(opinfo))
    gen = torch.Generator().manual_seed(seed)
    _seed(seed)
    if "empty" in opinfo.name:
        # Uninitialized memory: values differ run to run, so there is nothing to compare.
        res.detail["skip"] = "returns uninitialized memory"
        return res
    try:
        it = _samples(opinfo)
        first = next(it, None)
    except Exception as exc:  # noqa: BLE001
        res.detail["skip"] = f"sample_inputs failed: {exc}"
        return res
    if first is None:
        res.detail["skip"] = "no samples"
        return res
    if _is_random(opinfo, first):
        res.detail["skip"] = "random op (results differ per call)"
        return res
    impls = {"engine": _run_engine}
    if torch_func:
        impls["torch_func"] = _run_torch
    status = {k: None for k in impls}
    per_pattern: dict[str, dict[str, str]] = {}
    fallbacks: dict[str, set] = {k: set() for k in impls}
    used = seen = 0

    def all_samples() -> Iterator[Any]:
        yield first
        try:
            yield from it
        except Exception:  # noqa: BLE001 - a sample generator that fails part way: keep what it gave
            return

    for sample in all_samples():
        if samples is not None and seen >= samples:
            break
        if used and time_box is not None and time.perf_counter() - t0 > time_box:
            res.detail["time_box"] = f"stopped after {seen} samples ({time_box} s per op)"
            break
        seen += 1
        prep = _prepare(opinfo, sample, gen)
        if prep is None:
            continue
        used += 1
        flat, spec, kwargs, stacked, expected = prep
        cache = {(tuple(sorted(stacked)), False): expected}
        for pattern in _patterns(len(stacked)):
            try:
                exp = _reference(opinfo.op, flat, spec, kwargs, stacked, pattern, cache)
            except Exception:  # noqa: BLE001 - no loop answer (the op rejects this mix): nothing to compare
                continue
            for name, runner in impls.items():
                try:
                    out, looped = runner(opinfo.op, flat, spec, kwargs, stacked, pattern, fallbacks[name])
                    why = _compare(out, exp)
                    st = "mismatch" if why is not None else ("fallback" if looped else "native")
                except Exception as exc:  # noqa: BLE001 - recorded as the op's error status
                    st, why = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
                cell = per_pattern.setdefault(pattern.name, {})
                if name not in cell or _RANK[st] > _RANK[cell[name]]:
                    cell[name] = st
                if status[name] is None or _RANK[st] > _RANK[status[name]]:
                    status[name] = st
                    if why:
                        res.detail[name] = f"[{pattern.name}] {why}"[:300]
    res.samples = used
    if used == 0:
        res.detail["skip"] = "no sample usable for batching"
        res.seconds = time.perf_counter() - t0
        return res
    if "RandomnessError" in res.detail.get("engine", ""):
        # A random op has no for-loop reference to compare with: both columns skip it.
        res.detail = {"skip": "random op (vmap raises under randomness='error')"}
        res.seconds = time.perf_counter() - t0
        return res
    res.engine = status["engine"] or "skip"
    if torch_func:
        res.torch_func = status["torch_func"] or "skip"
    res.patterns = per_pattern
    res.fallback_ops = sorted(fallbacks["engine"])
    if vjp and opinfo.supports_autograd:
        try:
            res.vjp_engine = _vjp_check(opinfo, first, gen)
        except Exception:  # noqa: BLE001
            res.vjp_engine = "error"
    res.seconds = time.perf_counter() - t0
    return res


def run_harness(
    names: Iterable[str] | None = None,
    *,
    samples: int | None = None,
    time_box: float | None = 2.0,
    torch_func: bool = True,
    vjp: bool = False,
    progress: Callable[[OpResult], None] | None = None,
) -> list[OpResult]:
    """Run check_op over op_db (or the named subset); warnings from ops are silenced."""
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for opinfo in iter_opinfos(names):
            r = check_op(opinfo, samples=samples, time_box=time_box, torch_func=torch_func, vjp=vjp)
            results.append(r)
            if progress is not None:
                progress(r)
    return results
