"""The `jax` method's machinery: jax.jit of jax.vmap / grad / hessian / jacrev / jvp on jax.numpy models.

The builders mirror `workloads.methods` task by task (per-sample gradients, Hessian, batched
Hessian, Hessian-vector products, Jacobian, Jacobian-vector products, batched gradients, HMC
leapfrog trajectories, gradients of particle averages, the empirical NTK, ensembles, MAML's
meta-gradient), so the JAX program does what the torch.func one does. The models themselves, the
JAX twins, sit beside their torch models in each workload module (their jax.numpy layers in
`workloads.peers.jax_nn`); a workload adds the method with `with_jax(make_method, twin)`, `twin`
its builder `inputs -> measured call`. This module imports no workload.

The twins write `jax.nn.relu(...)`, `jnp.tanh(...)` as plain JAX code with `jax` and `jnp` imported
from here: stand-ins (`Deferred`) that look the real modules up when the twin runs, which is only
inside `compiled` (under jit, after `load_jax`). So importing the workload registry never imports
jax (its import is a large part of a process's start), and jax is always first imported by `load_jax`, which sets XLA's threads before.

Equal footing with the torch methods:
- Same data: the workload's torch tensors are converted once, when the method is built (not timed),
  and passed to the jitted function as arguments (never baked in as constants).
- Same dtype: float32 inputs run with JAX's 64-bit mode off; float64 inputs (the check's reference
  dtype) run inside `jax.enable_x64(True)`, entered per call, so it is never left on for another
  method's timing. Integer labels are int32 in 32-bit mode (what JAX has) and int64 in 64-bit mode.
- Same threads: XLA's CPU client sizes its intra-op pool (Eigen's matrix products and the loop
  fusions it splits) from `PJRT_NPROC` when the client is made, one thread per core otherwise.
  Before jax is imported we set `PJRT_NPROC` to torch's thread count, and at one thread also
  `XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`; a user's own `PJRT_NPROC` is kept, and where
  XLA's threads then differ from torch's the method refuses (NotImplementedError) instead of
  timing on unequal terms.
- Honest timing: the jitted call is followed by `block_until_ready` inside the measured call (JAX
  may dispatch asynchronously; on CPU we turn that off, `jax_cpu_enable_async_dispatch=False`, so
  the call runs on the caller's thread like torch's), and the outputs come back as torch tensors
  (zero-copy) in the structure the workload's check expects. jit compiles on the first call, which
  `Workload.prepare` times apart from the runs, like torch.compile's first call.
- CUDA: the method runs on a CUDA device only with a CUDA-enabled jaxlib; otherwise it is skipped.
"""
from __future__ import annotations

import os
import sys
import warnings
from types import ModuleType
from typing import Any, Callable, Sequence

import numpy
import torch
from torch.utils._pytree import tree_leaves

from engine import fused_xla
from workloads.methods import NTK_FORMULATIONS
from workloads.methods import leapfrog as trajectory
from workloads.peers.availability import PeerUnavailable

Fn = Callable[..., Any]
Thunk = Callable[[], Any]
MakeMethod = Callable[[str, dict[str, Any]], Thunk]

SINGLE_THREAD_FLAGS = ("--xla_cpu_multi_thread_eigen=false",)
_POOL = fused_xla.POOL_VARIABLES[0]
# The torch thread count XLA was configured for when jax was first imported through load_jax.
_configured_threads: int | None = None


class Deferred:
    """Stands for module `name` (jax, jax.numpy) in the JAX twins: each attribute is looked up in
    the module when used. The module must already be imported (by `load_jax`, when a jax method is
    built); it is never imported from here, so XLA cannot start before its threads are set."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        module = sys.modules.get(self._name)
        if module is None:
            raise RuntimeError(
                f"{self._name}.{attr} used before jax was imported: a JAX twin runs only inside the jax "
                "method (build it with workloads.peers.jax_methods.with_jax or compiled, which call load_jax)"
            )
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<deferred module {self._name!r}>"


jax = Deferred("jax")
jnp = Deferred("jax.numpy")


def _single_thread_flags_set() -> bool:
    flags = os.environ.get("XLA_FLAGS", "").split()
    return all(f in flags for f in SINGLE_THREAD_FLAGS)


def _configure_xla_threads(threads: int) -> None:
    """Before jax's import: XLA's pool sized to torch's `threads` (the rule the fused tier follows
    too, so a process where either starts jax runs the other on the same pool) and, at one
    thread, Eigen kept off the pool."""
    if threads == 1 and not _single_thread_flags_set():
        old = os.environ.get("XLA_FLAGS", "").split()
        os.environ["XLA_FLAGS"] = " ".join([*old, *(f for f in SINGLE_THREAD_FLAGS if f not in old)])
    fused_xla.size_pool(threads)


def load_jax(device: str | torch.device = "cpu") -> ModuleType:
    """Import jax with XLA's CPU threads matching torch's (see the module docstring).

    PeerUnavailable (a NotImplementedError: a skip, with the reason) when jax is not installed,
    when it cannot use `device`, or when XLA cannot run on torch's thread count.
    """
    global _configured_threads
    threads = torch.get_num_threads()
    if "jax" not in sys.modules:
        _configure_xla_threads(threads)
        _configured_threads = threads
    try:
        import jax

        # Run each call on the calling thread, as torch does, rather than handing it to XLA's
        # dispatch thread and waiting for it: on a loaded machine the hand-off costs milliseconds.
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    except ImportError as exc:
        raise PeerUnavailable(
            f"the jax method needs the jax package, which does not import here ({exc}); "
            "install it with `pip install 'jax[cpu]'` or the project's [peers] extra"
        ) from None
    from workloads.cuda_standin import tensor_device

    dev = tensor_device(device)  # the CUDA stand-in's 'cuda' is the CPU, for jax too
    if dev.type == "cuda":
        try:
            jax.devices("cuda")
        except RuntimeError:
            raise PeerUnavailable(
                f"the jax method on CUDA needs a CUDA-enabled jaxlib; jax {jax.__version__} here only has "
                f"{sorted({d.platform for d in jax.devices()})} (install `jax[cuda12]`)"
            ) from None
        # XLA on GPUs multiplies float32 matrices (and convolves) in TF32 by default; the torch
        # methods run in full float32 there (workloads.define.full_float32), and so does this.
        jax.config.update("jax_default_matmul_precision", "highest")
        return jax
    single, pool = _single_thread_flags_set(), fused_xla.pool_threads()
    if threads == 1 and not single:
        raise PeerUnavailable(
            "torch runs on 1 thread but jax was imported before XLA_FLAGS could make XLA single-threaded; "
            f"set XLA_FLAGS='{' '.join(SINGLE_THREAD_FLAGS)}' {_POOL}=1 before starting Python"
        )
    if threads > 1 and single:
        raise PeerUnavailable(
            f"torch runs on {threads} threads but XLA was started single-threaded (XLA_FLAGS or an earlier "
            f"OMP_NUM_THREADS=1 import, configured for {_configured_threads}); run jax in a fresh process"
        )
    if pool != threads:
        raise PeerUnavailable(
            f"torch runs on {threads} thread(s) but XLA's CPU pool has {pool} ({_POOL}="
            f"{os.environ.get(_POOL, 'unset')}, {fused_xla.cores()} cores); set {_POOL}={threads} "
            "before starting Python (or leave it unset: the jax method sets it before importing jax)"
        )
    return jax


def _leaves(value: Any) -> list[torch.Tensor]:
    """The tensors in `value` (through tuples, lists and dicts; other leaves such as names skipped)."""
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _float_dtype(args: Sequence[Any]) -> torch.dtype:
    dtypes = {t.dtype for t in _leaves(args) if t.is_floating_point()}
    if len(dtypes) != 1 or not dtypes <= {torch.float32, torch.float64}:
        raise ValueError(f"the jax method needs float32 or float64 inputs of one dtype; got {sorted(map(str, dtypes))}")
    return dtypes.pop()


def _device(args: Sequence[Any]) -> torch.device:
    devices = {t.device for t in _leaves(args)}
    if len(devices) != 1:
        raise ValueError(f"the jax method needs all inputs on one device; got {sorted(map(str, devices))}")
    return devices.pop()


def _to_jax(jax: ModuleType, value: Any, x64: bool, jax_device: Any) -> Any:
    """Torch tensors (recursively through tuples/lists/dicts) as jax arrays on `jax_device`: a copy."""
    if isinstance(value, torch.Tensor):
        array = value.detach().cpu().numpy()
        if not x64 and array.dtype.itemsize == 8 and array.dtype.kind in "iu":
            array = array.astype(array.dtype.str.replace("8", "4"))  # int64 labels -> int32 (JAX's 32-bit mode)
        # A copy of its own: on CPU, device_put may alias the NumPy buffer, i.e. the torch tensor's memory.
        return jax.device_put(array.copy(), jax_device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_jax(jax, v, x64, jax_device) for v in value)
    if isinstance(value, dict):
        return {k: _to_jax(jax, v, x64, jax_device) for k, v in value.items()}
    return value


def _to_torch(value: Any) -> Any:
    """Jax arrays (recursively through tuples/lists/dicts) as torch tensors, zero-copy: through NumPy on
    CPU (cheaper than DLPack there), through DLPack on GPUs. The tensors share
    the result's fresh buffers, which nothing else holds (NumPy calls them read-only, hence the
    warning filter in `compiled`)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_to_torch(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_torch(v) for k, v in value.items()}
    if value.device.platform == "cpu":
        return torch.from_numpy(numpy.asarray(value))
    return torch.from_dlpack(value)


def compiled(build: Callable[[ModuleType], Fn], args: Sequence[Any]) -> Thunk:
    """The measured call of `jax.jit(build(jax))` on `args` (torch tensors, converted once here).

    `build(jax)` returns the function of the task (jax imported by then); it is jitted once and
    compiles on its first call. Each call runs in JAX's 32- or 64-bit mode per the inputs' dtype,
    waits for the result and returns torch tensors.
    """
    device = _device(args)
    jax = load_jax(device)
    x64 = _float_dtype(args) == torch.float64
    jax_device = jax.devices("cuda" if device.type == "cuda" else "cpu")[0]
    with jax.enable_x64(x64):
        jargs = _to_jax(jax, tuple(args), x64, jax_device)
    fn = jax.jit(build(jax))

    def run() -> Any:
        with jax.enable_x64(x64):
            out = jax.block_until_ready(fn(*jargs))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
            return _to_torch(out)

    def xla_memory() -> dict[str, int]:
        """XLA's compiled memory analysis of the program `run` calls, in bytes (measuring.memory.xla_memory)."""
        with jax.enable_x64(x64):
            stats = fn.lower(*jargs).compile().memory_analysis()
        if stats is None:
            raise ValueError("this XLA backend gives no compiled memory analysis")
        sizes = {"temp": stats.temp_size_in_bytes, "output": stats.output_size_in_bytes,
                 "argument": stats.argument_size_in_bytes, "alias": stats.alias_size_in_bytes}
        sizes = {k: int(v) for k, v in sizes.items()}
        sizes["total"] = sizes["temp"] + sizes["output"] + sizes["argument"] - sizes["alias"]
        return sizes

    run.xla_memory = xla_memory  # type: ignore[attr-defined]
    return run


def per_sample_grads(loss: Fn, params: Sequence[torch.Tensor], inputs: Any, targets: Any) -> Thunk:
    """jit(vmap(grad(loss), in_axes=(None, 0, 0))): a tuple of [B, *p.shape], like the torch builder.

    `loss(params, x, y)` is the jax.numpy loss of one example; `inputs` may be a tuple of tensors
    batched along dim 0 (vmap maps over every leaf)."""
    return compiled(lambda jax: jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)), (tuple(params), inputs, targets))


def hessian(f: Fn, x: torch.Tensor, *data: Any) -> Thunk:
    """jit(hessian(f)) at `x`; `f(x, *data)` is scalar and `data` are its constant arguments."""
    return compiled(lambda jax: jax.hessian(f), (x, *data))


def batched_hessian(f: Fn, points: torch.Tensor, *data: Any) -> Thunk:
    """jit(vmap(hessian(f))) over the rows of `points`."""
    axes = (0, *(None for _ in data))
    return compiled(lambda jax: jax.vmap(jax.hessian(f), in_axes=axes), (points, *data))


def hvp(f: Fn, x: torch.Tensor, vectors: torch.Tensor, *data: Any) -> Thunk:
    """Hessian of `f` at `x` times each row of `vectors`: vmap over the vjp of the gradient
    (reverse-over-reverse, as the torch builder does)."""
    def build(jax: ModuleType) -> Fn:
        def hvps(x: Any, vectors: Any, *data: Any) -> Any:
            _, vjp_fn = jax.vjp(lambda x: jax.grad(f)(x, *data), x)
            return jax.vmap(vjp_fn)(vectors)[0]
        return hvps
    return compiled(build, (x, vectors, *data))


def jacobian(f: Fn, x: torch.Tensor, *data: Any, chunk_size: int | None = None) -> Thunk:
    """Reverse-mode Jacobian of `f(x, *data)` w.r.t. `x`: jit(jacrev(f)), or with `chunk_size`
    the vjp of each basis row under `lax.map(batch_size=chunk_size)` (JAX's way to bound memory,
    the counterpart of torch.func.jacrev's chunk_size)."""
    def build(jax: ModuleType) -> Fn:
        if chunk_size is None:
            return jax.jacrev(f)

        def jac(x: Any, *data: Any) -> Any:
            out, vjp_fn = jax.vjp(lambda x: f(x, *data), x)
            basis = jax.numpy.eye(out.size, dtype=out.dtype).reshape(out.size, *out.shape)
            rows = jax.lax.map(lambda v: vjp_fn(v)[0], basis, batch_size=chunk_size)
            return rows.reshape(out.shape + x.shape)
        return jac
    return compiled(build, (x, *data))


def jvp(f: Fn, x: torch.Tensor, tangents: torch.Tensor, *data: Any) -> Thunk:
    """J(x) @ t for each row t of `tangents`: vmap of forward-mode jvp."""
    def build(jax: ModuleType) -> Fn:
        def jvps(x: Any, tangents: Any, *data: Any) -> Any:
            return jax.vmap(lambda t: jax.jvp(lambda x: f(x, *data), (x,), (t,))[1])(tangents)
        return jvps
    return compiled(build, (x, tangents, *data))


def batched_grad(f: Fn, points: torch.Tensor, *data: Any) -> Thunk:
    """jit(vmap(grad(f))) over the rows of `points` (e.g. a log density at K chains' states)."""
    axes = (0, *(None for _ in data))
    return compiled(lambda jax: jax.vmap(jax.grad(f), in_axes=axes), (points, *data))


def leapfrog(log_density: Fn, positions: torch.Tensor, momenta: torch.Tensor, step_size: float, steps: int,
             *data: Any) -> Thunk:
    """Final (positions, momenta) of a leapfrog trajectory of every chain: the steps of
    `workloads.methods.leapfrog` (unrolled under jit), each gradient a vmap(grad) over the chains."""
    def build(jax: ModuleType) -> Fn:
        def run(q: Any, p: Any, *data: Any) -> Any:
            grads = jax.vmap(jax.grad(log_density), in_axes=(0, *(None for _ in data)))
            return trajectory(lambda x: grads(x, *data), q, p, step_size, steps)
        return run
    return compiled(build, (positions, momenta, *data))


def particle_grad(f: Fn, phi: torch.Tensor, particles: torch.Tensor, *data: Any) -> Thunk:
    """Gradient w.r.t. `phi` of the mean of `f(phi, particle, *data)` over the rows of `particles`
    (grad of a vmap, like the torch builder)."""
    def build(jax: ModuleType) -> Fn:
        def average(phi: Any, particles: Any, *data: Any) -> Any:
            return jax.vmap(f, in_axes=(None, 0, *(None for _ in data)))(phi, particles, *data).mean()
        return jax.grad(average)
    return compiled(build, (phi, particles, *data))


def ntk(f: Fn, params: dict[str, torch.Tensor], x1: torch.Tensor, x2: torch.Tensor, formulation: str) -> Thunk:
    """Empirical NTK [N, M, O, O] of `f(params, x) -> [O]` (one example) between the rows of x1
    and x2, by either of `workloads.methods.ntk_method`'s formulations: "jacobian" contracts the
    per-example Jacobians of vmap(jacrev(f)) parameter by parameter; "jvp_vjp" pushes each output
    basis vector through a vjp at x1[n] and a jvp at x2[m], never building a Jacobian."""
    if formulation not in NTK_FORMULATIONS:
        raise ValueError(f"unknown NTK formulation {formulation!r}; expected one of {NTK_FORMULATIONS}")

    def build(jax: ModuleType) -> Fn:
        jnp = jax.numpy

        def by_jacobians(params: Any, x1: Any, x2: Any) -> Any:
            per_example = jax.vmap(jax.jacrev(f), (None, 0))
            jac1, jac2 = per_example(params, x1), per_example(params, x2)
            blocks = [jnp.einsum("Naf,Mbf->NMab", jac1[k].reshape(*jac1[k].shape[:2], -1),
                                 jac2[k].reshape(*jac2[k].shape[:2], -1)) for k in params]
            return jnp.stack(blocks).sum(0)

        def by_products(params: Any, x1: Any, x2: Any) -> Any:
            def ntk_pair(a: Any, b: Any) -> Any:
                out, vjp_fn = jax.vjp(lambda p: f(p, a), params)

                def column(vec: Any) -> Any:
                    return jax.jvp(lambda p: f(p, b), (params,), vjp_fn(vec))[1]
                basis = jnp.eye(out.size, dtype=out.dtype).reshape(out.size, *out.shape)
                return jax.vmap(column)(basis)
            return jax.vmap(jax.vmap(ntk_pair, (None, 0)), (0, None))(x1, x2)
        return by_jacobians if formulation == "jacobian" else by_products
    return compiled(build, (params, x1, x2))


def ensemble(f: Fn, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor | None = None) -> Thunk:
    """An ensemble with stacked parameters (`params[k][i]`: model i's) on its own inputs x[i]:
    jit(vmap(f)) of the predictions f(params_i, x_i) without `y`, jit(vmap(grad(f))) of each
    model's loss gradients (a dict of [M, *shape]) with it, like `workloads.methods.ensemble_method`."""
    if y is None:
        return compiled(lambda jax: jax.vmap(f), (params, x))
    return compiled(lambda jax: jax.vmap(jax.grad(f)), (params, x, y))


def meta_grad(loss: Fn, params: dict[str, torch.Tensor], support: tuple[torch.Tensor, torch.Tensor],
              query: tuple[torch.Tensor, torch.Tensor], inner_lr: float) -> Thunk:
    """MAML's meta-gradient, as `workloads.methods.meta_grad_method`: grad w.r.t. `params` of the
    mean over tasks (a vmap) of loss(params - inner_lr * grad loss(params, support_t), query_t)."""
    (xs, ys), (xq, yq) = support, query

    def build(jax: ModuleType) -> Fn:
        def task_loss(params: Any, xs: Any, ys: Any, xq: Any, yq: Any) -> Any:
            grads = jax.grad(loss)(params, xs, ys)
            return loss(jax.tree.map(lambda p, g: p - inner_lr * g, params, grads), xq, yq)

        def meta_loss(params: Any, xs: Any, ys: Any, xq: Any, yq: Any) -> Any:
            return jax.vmap(task_loss, in_axes=(None, 0, 0, 0, 0))(params, xs, ys, xq, yq).mean()
        return jax.grad(meta_loss)
    return compiled(build, (params, xs, ys, xq, yq))


def with_jax(make_method: MakeMethod, twin: Callable[[dict[str, Any]], Thunk]) -> MakeMethod:
    """`make_method` with the `jax` method added: `twin(inputs)`, the workload's JAX twin, builds it.

    jax is imported (by `load_jax`) only when the method is built, so listing or running other
    methods never pays for it, and a missing jax only skips this method.
    """
    def make(method: str, inputs: dict[str, Any]) -> Thunk:
        if method != "jax":
            return make_method(method, inputs)
        load_jax(_device([v for v in inputs.values() if isinstance(v, (torch.Tensor, tuple, list))]))
        return twin(inputs)
    return make
