"""Peer methods (Opacus, BackPACK) and the torch.nn per-sample-gradient workloads.

Correctness of every listed peer method against the float64 loop is in test_workloads.py (the
registry lists them like any method); here: a missing peer package is a skip with a reason (in
the builder, the CLI and the ASV setup), a peer that cannot express a model says so instead of
returning something, and the nn workloads' inputs are exportable as named state dicts.
"""
from __future__ import annotations

import sys

import pytest
import torch

import workloads
from vmapbench import cli
from workloads import nn_models, peers
from peer_skips import skip_unless_installed
from workloads.base import PEER_METHODS

# The modules to hide to make each peer method's package look uninstalled.
PEER_PACKAGES = {
    "opacus_hooks": ("opacus", "opacus.grad_sample"),
    "opacus_ew": ("opacus", "opacus.grad_sample"),
    "opacus_functorch": ("opacus", "opacus.grad_sample"),
    "backpack": ("backpack", "backpack.extensions"),
}


def hide(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """Make the peer package of `method` unimportable (as if it were not installed)."""
    for name in PEER_PACKAGES[method]:
        monkeypatch.setitem(sys.modules, name, None)


def test_every_peer_method_is_covered_here() -> None:
    assert set(PEER_PACKAGES) == PEER_METHODS


def test_peers_apply_to_the_nn_workloads_and_the_functional_ones() -> None:
    where = {m: {w.name for w in workloads.all_workloads() if m in w.methods} for m in PEER_METHODS}
    assert {"psg_mlp", "nn_ffnn", "nn_mnist_cnn", "nn_embedding"} <= where["opacus_ew"]
    assert "nn_transformer" not in set().union(*where.values())  # no peer expresses nn.MultiheadAttention
    assert "nn_groupnorm_resnet" not in where["backpack"]


@pytest.mark.parametrize("method", sorted(PEER_PACKAGES))
@pytest.mark.parametrize("name", ["psg_mlp", "nn_ffnn"])
def test_missing_peer_package_raises_not_implemented(name: str, method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, method)
    w = workloads.get(name)
    state = w.setup(w.params(w.sizes[0]), "cpu")
    with pytest.raises(peers.PeerUnavailable, match=rf"{method}.*cannot be imported.*pip install -e '\.\[peers\]'"):
        w.run(method, state)


def test_missing_peer_is_a_skip_in_the_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    hide(monkeypatch, "opacus_ew")
    argv = ["run", "psg_mlp", "--size", "batch=8", "-m", "loop,opacus_ew", "--repeat", "1", "--warmup", "1",
            "--no-memory"]
    assert cli.main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "opacus_ew skipped:" in out and "pip install -e '.[peers]'" in out and "failed" not in out


def test_missing_peer_is_a_skip_in_the_asv_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    from suite import probes

    hide(monkeypatch, "backpack")
    w = workloads.get("psg_mlp")
    with pytest.raises(NotImplementedError, match="backpack"):  # ASV reports NotImplementedError in setup as skipped
        probes.setup_case(w, "batch=8", "backpack", "cpu")
    probes.setup_case(w, "batch=8", "opacus_ew", "cpu")  # only the missing one is skipped


@pytest.mark.parametrize(
    "method,model,layer",
    [("backpack", nn_models.GroupNormResNet, "gn1.weight"), ("opacus_hooks", nn_models.TransformerNet, None)],
)
def test_a_peer_that_cannot_express_a_model_raises(method: str, model: type[torch.nn.Module], layer: str | None) -> None:
    """Why those pairs are not listed: the peer raises; it never returns partial gradients."""
    gen = torch.Generator().manual_seed(0)
    module = nn_models.build_module(model, nn_models.init_params(model(), gen))
    shape = (4, 3, 16, 16) if model is nn_models.GroupNormResNet else (4, nn_models.TOKENS, nn_models.WIDTH)
    x, y = torch.randn(shape, generator=gen), torch.randint(10, (4,), generator=gen)
    with pytest.raises(Exception, match=layer or "") as info:
        peers.per_sample_grads(method, module, torch.nn.functional.cross_entropy, x, y)()
    assert not isinstance(info.value, NotImplementedError)


def test_module_holding_rejects_a_mismatched_model() -> None:
    from workloads import per_sample_grads

    with pytest.raises(ValueError, match="parameters of shapes"):
        peers.module_holding(per_sample_grads.mlp_module, (torch.zeros(3, 3),))


@pytest.mark.parametrize("name", [w.name for w in workloads.all_workloads() if w.name.startswith("nn_")])
def test_nn_inputs_are_a_named_state_dict(name: str) -> None:
    """What the JAX peer exports: params in named_parameters() order, same names as the module's."""
    w = workloads.get(name)
    state = w.setup(w.params(w.sizes[0]), "cpu")
    params = state.inputs["params"]
    model = w.extra["model"]
    assert list(params) == [n for n, _ in model().named_parameters()]
    grads = w.run("torch_func", state)
    batch = state.inputs["x"].shape[0]
    assert [tuple(g.shape) for g in grads] == [(batch, *p.shape) for p in params.values()]


def _jax_points() -> list[tuple[str, str, str, str]]:
    """(suite module, workload, size, metric) of every suite metric that applies to the jax method
    on cpu, at the smallest size of the two workloads that cover them all (the compiled family
    has jax's compile time)."""
    from suite import selection

    out = []
    for name in ("logreg_hessian", "compiled_logreg_hessian"):
        w = workloads.get(name)
        for metric in selection.METRICS:
            if metric.applies(w, "jax", "cpu"):
                out.append((metric.module, name, w.sizes[0], metric.name))
    return out


def _asv_calls(module: str, workload: str, size: str, metric: str) -> None:
    """What asv runs for one point: the class's setup, the metric's own setup, then the metric."""
    import importlib

    from suite import selection

    cls = getattr(importlib.import_module(f"suite.{module}"), selection.class_name(workloads.get(workload)))
    case, params = cls(), (size, "jax", "cpu")
    case.setup(*params)
    own = getattr(getattr(cls, metric), "setup", None)
    if own is not None:
        own(*params)
    getattr(case, metric)(*params)


@pytest.fixture
def fresh_suite_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """No case prepared or pass measured by an earlier test: each point builds what it needs."""
    from suite import bench_workloads, workload_pass

    monkeypatch.setenv("VMAPBENCH_PROFILE", "full")
    monkeypatch.setenv("VMAPBENCH_DEVICES", "cpu")
    monkeypatch.delenv(workload_pass.PASS_DIR_ENV, raising=False)
    monkeypatch.setattr(workload_pass, "_PASSES", {})
    monkeypatch.setattr(bench_workloads, "_PREPARED", {})


@pytest.mark.parametrize("module,workload,size,metric", _jax_points())
def test_missing_jax_is_a_skip_in_every_suite_metric(module: str, workload: str, size: str, metric: str,
                                                     monkeypatch: pytest.MonkeyPatch, fresh_suite_caches: None) -> None:
    """asv's environment without jax: every jax point is n/a with the reason (NotImplementedError
    from setup or the body), never a failed benchmark."""
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` raises ImportError, find_spec finds nothing
    with pytest.raises(NotImplementedError, match="'jax' package.*pip install -e '\\.\\[peers\\]'"):
        _asv_calls(module, workload, size, metric)


@pytest.mark.parametrize("module,workload,size,metric", _jax_points())
def test_jax_that_cannot_run_here_is_a_skip_in_every_suite_metric(module: str, workload: str, size: str, metric: str,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  fresh_suite_caches: None) -> None:
    """jax installed but refusing at its first call (e.g. XLA cannot match torch's threads): a skip
    from the first call, in the metric's own setup or in the case's pass."""
    from workloads.peers import jax_methods

    skip_unless_installed("jax")  # (without jax, the test above covers these points)

    def refuse(device: object = "cpu") -> None:
        raise peers.PeerUnavailable("XLA cannot run on torch's thread count here (test)")

    monkeypatch.setattr(jax_methods, "load_jax", refuse)
    with pytest.raises(NotImplementedError, match="XLA cannot run on torch's thread count here"):
        _asv_calls(module, workload, size, metric)
