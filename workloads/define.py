"""`define()`: turn a workload's data builder and method builder into a registered `Workload`.

A workload module supplies two functions and `define` does the rest the same way for all:
- `make_inputs(params, generator) -> dict` builds the data (float32 CPU tensors, seeded);
- `make_method(method, inputs) -> callable` returns the measured zero-argument call
  (usually one of the builders in `workloads.methods`).

`setup` casts the inputs to the device and dtype; `run` calls the method (built once per state);
`check` compares methods against the loop run in float64 on the very same data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from workloads import cuda_standin
from workloads.base import BASELINE, COMPILED_METHODS, Workload, register, size_label

SEED = 0
# Normwise tolerance of a float32 method against the float64 loop: max|out - ref| <= tol * max|ref|.
DEFAULT_TOLERANCE = 1e-3

MakeInputs = Callable[[dict[str, Any], torch.Generator], dict[str, Any]]
MakeMethod = Callable[[str, dict[str, Any]], Callable[[], Any]]


def resolve_device(device: str) -> torch.device:
    """The torch device for `device`; NotImplementedError (ASV: skipped) when it is unavailable.
    Under the CUDA stand-in (workloads.cuda_standin) 'cuda' resolves to the CPU."""
    dev = torch.device(device)
    if cuda_standin.active() and dev.type == "cuda":
        return cuda_standin.tensor_device(dev)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise NotImplementedError(
            f"device {device!r} needs CUDA, but torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}); cuda cases are skipped here"
        )
    if dev.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"device {device!r} is not supported; use 'cpu' or 'cuda'")
    if dev.type == "cuda":
        full_float32()
    return dev


def full_float32() -> None:
    """float32 means float32 on CUDA too: TF32 off for cuDNN (its default is on, for convolutions
    and RNNs) and for cuBLAS. Every method then computes what it computes on CPU, so the methods
    compare like for like and each passes the float64-loop check at the float32 tolerance (with
    TF32's 10-bit mantissa, the CNN workloads' ReLU and max-pool kinks flip and even the loop
    differs from its float64 twin by 1-5%). The JAX peer is set to match (`load_jax`)."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def cast(value: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """Move tensors (recursively through tuples/lists/dicts) to `device`; floats also to `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype if value.is_floating_point() else value.dtype)
    if isinstance(value, (tuple, list)):
        return type(value)(cast(v, device, dtype) for v in value)
    if isinstance(value, dict):
        return {k: cast(v, device, dtype) for k, v in value.items()}
    return value


@dataclass
class CaseState:
    """What `setup` returns: the data of one size on one device, and the methods built on it."""

    workload: str
    params: dict[str, Any]
    device: str
    dtype: torch.dtype
    inputs: dict[str, Any]
    make_method: MakeMethod
    _fns: dict[str, Callable[[], Any]] = field(default_factory=dict, repr=False)
    _reference: Any = field(default=None, repr=False)

    @property
    def size(self) -> str:
        return size_label(self.params)

    def fn(self, method: str) -> Callable[[], Any]:
        """The measured call of `method`, built on first use and kept (so a trace/compile is kept)."""
        if method not in self._fns:
            self._fns[method] = self.make_method(method, self.inputs)
        return self._fns[method]


def _leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _leaves(v)]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in _leaves(value[k])]
    raise TypeError(f"a method returned {type(value).__name__}; expected tensors, or tuples/lists/dicts of them")


def assert_matches(out: Any, ref: Any, tolerance: float, what: str) -> None:
    """Raise AssertionError unless every tensor of `out` matches `ref` normwise within `tolerance`."""
    outs, refs = _leaves(out), _leaves(ref)
    if len(outs) != len(refs):
        raise AssertionError(f"{what}: returned {len(outs)} tensors, the float64 loop returned {len(refs)}")
    for i, (o, r) in enumerate(zip(outs, refs)):
        if tuple(o.shape) != tuple(r.shape):
            raise AssertionError(f"{what}: output {i} has shape {tuple(o.shape)}, the loop's is {tuple(r.shape)}")
        o64, r64 = o.detach().to("cpu", torch.float64), r.detach().to("cpu", torch.float64)
        if not torch.isfinite(o64).all():
            raise AssertionError(f"{what}: output {i} has non-finite values")
        scale = r64.abs().max().item() if r64.numel() else 0.0
        err = (o64 - r64).abs().max().item() if r64.numel() else 0.0
        if err > tolerance * max(scale, 1e-12):
            raise AssertionError(
                f"{what}: output {i} differs from the float64 loop by {err:.3g} "
                f"(max |ref| {scale:.3g}, allowed {tolerance:g} relative)"
            )


def define(
    *,
    name: str,
    family: str,
    description: str,
    grid: dict[str, list[Any]],
    methods: Sequence[str],
    make_inputs: MakeInputs,
    make_method: MakeMethod,
    quick: Iterable[str] = (),
    heavy: Iterable[str] = (),
    not_in_quick: Iterable[str] = (),
    tolerance: float = DEFAULT_TOLERANCE,
    devices: Sequence[str] = ("cpu", "cuda"),
    extra: Mapping[str, Any] | None = None,
) -> Workload:
    """Build and register a Workload whose setup/run/check follow the conventions above."""
    if BASELINE not in methods:
        raise ValueError(f"workload {name!r} needs the {BASELINE!r} method: check() compares against it in float64")

    def setup(params: dict[str, Any], device: str, dtype: torch.dtype = torch.float32) -> CaseState:
        dev = resolve_device(device)
        inputs = make_inputs(dict(params), torch.Generator().manual_seed(SEED))
        # the device asked for names the case (a stand-in's 'cuda' is measured as cuda: synchronised)
        label = str(torch.device(device)) if cuda_standin.active() else str(dev)
        return CaseState(name, dict(params), label, dtype, cast(inputs, dev, dtype), make_method)

    def run(method: str, state: CaseState) -> Any:
        return state.fn(method)()

    def check(state: CaseState, methods: Iterable[str] | None = None) -> None:
        """Every method (or those given) agrees with the loop run in float64 on the same data."""
        if state._reference is None:
            ref_state = setup(state.params, state.device, dtype=torch.float64)
            state._reference = ref_state.fn(BASELINE)()
        for method in workload.methods if methods is None else methods:
            if not workload.supports(method):
                raise ValueError(f"workload {name!r} has no method {method!r}; it has {', '.join(workload.methods)}")
            # A traced or compiled method records on its first call and replays afterwards: check both.
            calls = ("first call", "second call") if method == "engine_traced" or method in COMPILED_METHODS else ("",)
            for call in calls:
                what = f"{name} [{state.size}, {state.device}] {method}" + (f" ({call})" if call else "")
                assert_matches(state.fn(method)(), state._reference, tolerance, what)

    workload = Workload(
        name=name,
        family=family,
        description=description,
        grid=grid,
        methods=tuple(methods),
        setup=setup,
        run=run,
        check=check,
        devices=tuple(devices),
        quick=tuple(quick),
        heavy=tuple(heavy),
        not_in_quick=tuple(not_in_quick),
        extra=dict(extra or {}),
    )
    return register(workload)
